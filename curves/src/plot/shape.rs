//! What a plot is made of: the palette and the shapes (rectangles, lines, polylines, dots,
//! text) in pixel coordinates, which `svg.rs` writes as SVG and `raster.rs` draws onto a
//! canvas. Knows nothing of curves.

/// The palette: index into [`PALETTE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    White = 0,
    Black = 1,
    Grid = 2,
    Warmup = 3,
    Base = 4,
    Test = 5,
    Band = 6,
    Gap = 7,
    Window = 8,
    Fail = 9,
    Pass = 10,
}

pub const PALETTE: [[u8; 3]; 11] = [
    [255, 255, 255],
    [20, 20, 20],
    [225, 225, 225],
    [238, 238, 238],
    [31, 119, 180],
    [255, 127, 14],
    [200, 235, 200],
    [170, 120, 200],
    [90, 30, 130],
    [200, 30, 30],
    [30, 140, 30],
];

impl Colour {
    pub fn hex(self) -> String {
        let [r, g, b] = PALETTE[self as usize];
        format!("#{r:02x}{g:02x}{b:02x}")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

/// What the renderers draw, in pixel coordinates (y down).
#[derive(Debug, Clone)]
pub enum Shape {
    Rect {
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        fill: Colour,
    },
    Line {
        x1: f64,
        y1: f64,
        x2: f64,
        y2: f64,
        colour: Colour,
        width: f64,
    },
    Polyline {
        points: Vec<(f64, f64)>,
        colour: Colour,
        width: f64,
    },
    Dot {
        x: f64,
        y: f64,
        r: f64,
        colour: Colour,
    },
    /// Text whose baseline-left (or middle/end) is at `(x, y)`; `scale` 1 is 8-pixel glyphs.
    Text {
        x: f64,
        y: f64,
        text: String,
        colour: Colour,
        anchor: Anchor,
        scale: u32,
    },
}
