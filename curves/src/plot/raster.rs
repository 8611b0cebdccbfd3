//! A small rasteriser onto an indexed-colour canvas: filled rectangles, thick lines (a square
//! brush stamped along the segment every half pixel), dots, and text in the public-domain
//! 8×8 bitmap font shipped by the `font8x8` crate (bit 0 of each row byte is the leftmost pixel).

use super::shape::{Anchor, Colour, Shape};

pub struct Canvas {
    w: u32,
    h: u32,
    px: Vec<u8>,
}

impl Canvas {
    pub fn new(w: u32, h: u32) -> Canvas {
        Canvas {
            w,
            h,
            px: vec![Colour::White as u8; (w * h) as usize],
        }
    }

    /// Row-major palette indices, `w · h` of them.
    pub fn pixels(&self) -> &[u8] {
        &self.px
    }

    fn set(&mut self, x: i64, y: i64, c: Colour) {
        if x >= 0 && y >= 0 && (x as u32) < self.w && (y as u32) < self.h {
            self.px[(y as u32 * self.w + x as u32) as usize] = c as u8;
        }
    }

    fn fill(&mut self, x: f64, y: f64, w: f64, h: f64, c: Colour) {
        let (x0, y0) = (x.round() as i64, y.round() as i64);
        let (x1, y1) = ((x + w).round() as i64, (y + h).round() as i64);
        for yy in y0..y1 {
            for xx in x0..x1 {
                self.set(xx, yy, c);
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
        let n = ((b.0 - a.0).abs().max((b.1 - a.1).abs()) * 2.0)
            .ceil()
            .max(1.0) as usize;
        for i in 0..=n {
            let t = i as f64 / n as f64;
            self.stamp(a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1), width, c);
        }
    }

    fn text(&mut self, x: f64, y: f64, text: &str, c: Colour, anchor: Anchor, scale: u32) {
        let s = scale.max(1) as i64;
        let adv = 7 * s; // 8-pixel cells, drawn one column narrower to read as text
        let width = adv * text.chars().count() as i64;
        let x0 = match anchor {
            Anchor::Start => x.round() as i64,
            Anchor::Middle => x.round() as i64 - width / 2,
            Anchor::End => x.round() as i64 - width,
        };
        let top = y.round() as i64 - 7 * s;
        for (i, ch) in text.chars().enumerate() {
            let code = if (ch as u32) < 128 {
                ch as usize
            } else {
                '?' as usize
            };
            let glyph = font8x8::legacy::BASIC_LEGACY[code];
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        for dy in 0..s {
                            for dx in 0..s {
                                self.set(
                                    x0 + i as i64 * adv + col * s + dx,
                                    top + row as i64 * s + dy,
                                    c,
                                );
                            }
                        }
                    }
                }
            }
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
                scale,
            } => self.text(*x, *y, text, *colour, *anchor, *scale),
        }
    }
}
