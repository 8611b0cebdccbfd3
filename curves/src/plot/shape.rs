//! What a plot is made of: the palette, boxes, and the shapes (rectangles, lines, polylines,
//! dots, text) in pixel coordinates, which `svg.rs` writes as SVG and `raster.rs` draws onto a
//! canvas. Knows nothing of curves or fonts.

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
    /// A window whose gap lies outside ±δ_fail with confidence.
    Diverging = 11,
}

pub const PALETTE: [[u8; 3]; 12] = [
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
    [250, 212, 212],
];

impl Colour {
    pub fn hex(self) -> String {
        let [r, g, b] = PALETTE[self as usize];
        format!("#{r:02x}{g:02x}{b:02x}")
    }
}

/// An axis-aligned box in pixels (y down): `x0 ≤ x1`, `y0 ≤ y1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rect {
    pub x0: f64,
    pub y0: f64,
    pub x1: f64,
    pub y1: f64,
}

impl Rect {
    /// The two boxes share interior points (touching edges do not count).
    pub fn overlaps(&self, o: &Rect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }

    /// `self` lies within `outer`, edges included.
    pub fn inside(&self, outer: &Rect) -> bool {
        self.x0 >= outer.x0 && self.y0 >= outer.y0 && self.x1 <= outer.x1 && self.y1 <= outer.y1
    }
}

/// Where a text's `x` is: its start, middle or end.
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
    /// Text whose baseline-start (or middle/end) is at `(x, y)`, at an em `size` in pixels;
    /// `text::bounds` gives the box it covers.
    Text {
        x: f64,
        y: f64,
        text: String,
        colour: Colour,
        anchor: Anchor,
        size: f64,
    },
}
