//! A small rasteriser onto an RGB canvas: filled rectangles, thick lines (a square brush
//! stamped along the segment every half pixel), dots, and anti-aliased text (the glyph
//! coverage of [`rasterise`] blended over what is already there).

use super::shape::{Colour, Shape, PALETTE};
use super::text::rasterise;

pub struct Canvas {
    w: u32,
    h: u32,
    px: Vec<[u8; 3]>,
}

impl Canvas {
    pub fn new(w: u32, h: u32) -> Canvas {
        Canvas {
            w,
            h,
            px: vec![PALETTE[Colour::White as usize]; (w * h) as usize],
        }
    }

    /// Row-major RGB pixels, `w · h` of them.
    pub fn pixels(&self) -> &[[u8; 3]] {
        &self.px
    }

    /// Mixes `c` into pixel `(x, y)` with weight `alpha` in `[0, 1]` (1: replaces it).
    fn blend(&mut self, x: i64, y: i64, c: Colour, alpha: f32) {
        if x >= 0 && y >= 0 && (x as u32) < self.w && (y as u32) < self.h {
            let p = &mut self.px[(y as u32 * self.w + x as u32) as usize];
            let a = alpha.clamp(0.0, 1.0);
            for (dst, src) in p.iter_mut().zip(PALETTE[c as usize]) {
                *dst = (*dst as f32 * (1.0 - a) + src as f32 * a).round() as u8;
            }
        }
    }

    fn set(&mut self, x: i64, y: i64, c: Colour) {
        if x >= 0 && y >= 0 && (x as u32) < self.w && (y as u32) < self.h {
            self.px[(y as u32 * self.w + x as u32) as usize] = PALETTE[c as usize];
        }
    }

    fn fill(&mut self, x: f64, y: f64, w: f64, h: f64, c: Colour) {
        let clip = |v: f64, hi: u32| v.round().clamp(0.0, hi as f64) as usize;
        let (x0, y0) = (clip(x, self.w), clip(y, self.h));
        let (x1, y1) = (clip(x + w, self.w), clip(y + h, self.h));
        let w = self.w as usize;
        for yy in y0..y1 {
            if x0 < x1 {
                self.px[yy * w + x0..yy * w + x1].fill(PALETTE[c as usize]);
            }
        }
    }

    fn stamp(&mut self, x: f64, y: f64, width: f64, c: Colour) {
        let r = ((width - 1.0) / 2.0).max(0.0);
        let (x0, x1) = ((x - r).round() as i64, (x + r).round() as i64);
        let (y0, y1) = ((y - r).round() as i64, (y + r).round() as i64);
        for yy in y0..=y1 {
            for xx in x0..=x1 {
                self.set(xx, yy, c);
            }
        }
    }

    fn line(&mut self, a: (f64, f64), b: (f64, f64), width: f64, c: Colour) {
        // At most a few stamps per pixel of the canvas: a segment far outside it (a value
        // clamped nowhere) must not take forever.
        let limit = 4.0 * (self.w + self.h) as f64;
        let n = ((b.0 - a.0).abs().max((b.1 - a.1).abs()) * 2.0)
            .ceil()
            .max(1.0)
            .min(limit) as usize;
        for i in 0..=n {
            let t = i as f64 / n as f64;
            self.stamp(a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1), width, c);
        }
    }

    pub fn draw(&mut self, shape: &Shape) {
        match shape {
            Shape::Rect { x, y, w, h, fill } => self.fill(*x, *y, *w, *h, *fill),
            Shape::Line {
                x1,
                y1,
                x2,
                y2,
                colour,
                width,
            } => self.line((*x1, *y1), (*x2, *y2), *width, *colour),
            Shape::Polyline {
                points,
                colour,
                width,
            } => {
                for pair in points.windows(2) {
                    self.line(pair[0], pair[1], *width, *colour);
                }
            }
            Shape::Dot { x, y, r, colour } => {
                let ri = r.ceil() as i64;
                for dy in -ri..=ri {
                    for dx in -ri..=ri {
                        if ((dx * dx + dy * dy) as f64) <= r * r {
                            self.set(x.round() as i64 + dx, y.round() as i64 + dy, *colour);
                        }
                    }
                }
            }
            Shape::Text {
                x,
                y,
                text,
                colour,
                anchor,
                size,
            } => rasterise((*x, *y), text, *anchor, *size, |px, py, a| {
                self.blend(px, py, *colour, a)
            }),
        }
    }
}
