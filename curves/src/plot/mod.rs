//! The parity plot: both curves (top), the gap TEST − BASE with its window means and the ±δ
//! band (bottom), the warm-up shaded. One scene is drawn two ways: as SVG text (`svg.rs`), or
//! rasterised with the embedded 8×8 bitmap font of the `font8x8` crate and written as an
//! indexed-colour PNG by our own encoder (`png.rs`) — no system font or image library.
//!
//! `scene.rs` lays the plot out as shapes (`shape.rs`) in panels (`panel.rs`); nothing there
//! knows how it will be drawn.

mod panel;
mod png;
mod raster;
mod scene;
mod shape;
mod svg;

use std::path::Path;

use crate::report::Diff;
use crate::CurveError;

pub use panel::ticks;
pub use png::{crc32, encode_indexed as encode_png};
pub use raster::Canvas;
pub use scene::{HEIGHT, WIDTH};
pub use shape::{Anchor, Colour, Shape, PALETTE};

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
    let scene = scene::scene(d);
    match kind {
        Kind::Svg => svg::render(&scene, WIDTH, HEIGHT).into_bytes(),
        Kind::Png => {
            let mut c = Canvas::new(WIDTH, HEIGHT);
            for s in &scene {
                c.draw(s);
            }
            png::encode_indexed(WIDTH, HEIGHT, &PALETTE, c.pixels())
        }
    }
}
