//! The parity plot: both curves (top), the gap TEST − BASE with its window means and the ±δ
//! band (bottom), the warm-up shaded, a legend and the verdict. One scene is drawn two ways:
//! as SVG text (`svg.rs`), or onto a pixmap (`raster.rs`: shapes anti-aliased by the
//! `tiny-skia` crate, text blended in from `ab_glyph`'s coverage) written as an RGB PNG by the
//! `png` crate (`png_file.rs`). Text is DejaVu Sans, embedded (`curves/assets/`) and measured
//! and rasterised by `ab_glyph` (`text.rs`) — no system font.
//!
//! `scene.rs` lays the plot out as shapes (`shape.rs`) in panels (`panel.rs`), with the legend
//! and verdict in `legend.rs`; every text's box comes from the font's own metrics, so the
//! layout can place texts where they cannot collide. Nothing there knows how it will be drawn.

mod legend;
mod panel;
mod png_file;
mod raster;
mod scene;
mod shape;
mod svg;
mod text;

use std::path::Path;

use crate::report::Diff;
use crate::CurveError;

pub use panel::{labels as tick_labels, ticks};
pub use png_file::encode_rgb as encode_png;
pub use raster::Canvas;
pub use scene::{scene, HEIGHT, WIDTH};
pub use shape::{Anchor, Colour, Rect, Shape, PALETTE};
pub use text::{advance as text_advance, box_of as text_box, FONT};

/// Output kind, from the file extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Svg,
    Png,
}

impl Kind {
    pub fn of(path: &Path) -> Result<Kind, CurveError> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("svg") => Ok(Kind::Svg),
            Some("png") => Ok(Kind::Png),
            _ => Err(CurveError::PlotExtension {
                path: path.to_path_buf(),
            }),
        }
    }
}

/// Renders the plot of `d` as SVG or PNG bytes.
pub fn render(d: &Diff, kind: Kind) -> Vec<u8> {
    let scene = scene(d);
    match kind {
        Kind::Svg => svg::render(&scene, WIDTH, HEIGHT).into_bytes(),
        Kind::Png => {
            let mut c = Canvas::new(WIDTH, HEIGHT);
            for s in &scene {
                c.draw(s);
            }
            png_file::encode_rgb(WIDTH, HEIGHT, &c.pixels())
        }
    }
}
