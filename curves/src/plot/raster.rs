//! The scene drawn onto a `tiny-skia` pixmap: rectangles filled, lines and polylines stroked
//! at their width (round joins), dots filled as circles, all anti-aliased by `tiny-skia`; text
//! is the glyph coverage of [`rasterise`] (`ab_glyph`, the embedded font) blended over what is
//! already there.
//!
//! Lines and dots are drawn half a pixel down and right, so that a point at integer `(x, y)`
//! is the centre of pixel `(x, y)` (the frame, at integer coordinates, covers whole pixels),
//! and a horizontal or vertical line is moved by at most half a pixel to cover whole pixels:
//! grid lines and ticks stay crisp rather than two pale rows. Rectangles' edges lie on pixel
//! boundaries. Every coordinate is held within a canvas' size of the canvas — where the scene
//! never goes, but a degenerate range might — because beyond `f32`'s range it would be
//! infinite, and `tiny-skia` draws no path with an infinite point (and has panicked on paths
//! reaching far outside, its issue 167).

use tiny_skia::{FillRule, LineCap, LineJoin, Paint, PathBuilder, Pixmap, Rect, Stroke, Transform};

use super::shape::{Colour, Shape, PALETTE};
use super::text::rasterise;

/// An opaque RGB image the shapes of a scene are drawn onto, back to front.
pub struct Canvas {
    pixmap: Pixmap,
}

fn paint(c: Colour) -> Paint<'static> {
    let [r, g, b] = PALETTE[c as usize];
    let mut p = Paint::default();
    p.set_color_rgba8(r, g, b, 255);
    p
}

/// From pixel boundaries to pixel centres (lines and dots).
fn centres() -> Transform {
    Transform::from_translate(0.5, 0.5)
}

impl Canvas {
    /// A white `w × h` canvas.
    ///
    /// # Panics
    /// If `w` or `h` is 0 (the plot has a fixed, non-zero size).
    pub fn new(w: u32, h: u32) -> Canvas {
        let mut pixmap = Pixmap::new(w, h).expect("a canvas of non-zero size");
        let [r, g, b] = PALETTE[Colour::White as usize];
        pixmap.fill(tiny_skia::Color::from_rgba8(r, g, b, 255));
        Canvas { pixmap }
    }

    /// Row-major RGB pixels, `w · h` of them. Every colour is opaque on an opaque
    /// background, so the pixmap's premultiplied RGBA is RGB and an alpha of 255.
    pub fn pixels(&self) -> Vec<[u8; 3]> {
        self.pixmap
            .data()
            .chunks_exact(4)
            .map(|p| [p[0], p[1], p[2]])
            .collect()
    }

    /// `(x, y)` held within a canvas' size of the canvas (NaN stays NaN: not drawn).
    fn point(&self, (x, y): (f64, f64)) -> (f32, f32) {
        let hold = |v: f64, n: u32| v.clamp(-(n as f64), 2.0 * n as f64) as f32;
        (hold(x, self.pixmap.width()), hold(y, self.pixmap.height()))
    }

    /// Strokes the polyline through `points` (`cap` at its ends, joins round).
    fn stroke(&mut self, points: &[(f64, f64)], width: f64, c: Colour, cap: LineCap) {
        let mut pb = PathBuilder::new();
        for (i, p) in points.iter().enumerate() {
            let (x, y) = self.point(*p);
            if i == 0 {
                pb.move_to(x, y);
            } else {
                pb.line_to(x, y);
            }
        }
        let stroke = Stroke {
            width: width as f32,
            line_cap: cap,
            line_join: LineJoin::Round,
            ..Stroke::default()
        };
        if let Some(path) = pb.finish() {
            self.pixmap
                .stroke_path(&path, &paint(c), &stroke, centres(), None);
        }
    }

    /// Mixes `c` into pixel `(x, y)` with weight `alpha` in `[0, 1]` (1: replaces it).
    fn blend(&mut self, x: i64, y: i64, c: Colour, alpha: f32) {
        let (w, h) = (self.pixmap.width(), self.pixmap.height());
        if x >= 0 && y >= 0 && (x as u32) < w && (y as u32) < h {
            let i = 4 * (y as usize * w as usize + x as usize);
            let p = &mut self.pixmap.data_mut()[i..i + 3];
            let a = alpha.clamp(0.0, 1.0);
            for (dst, src) in p.iter_mut().zip(PALETTE[c as usize]) {
                *dst = (*dst as f32 * (1.0 - a) + src as f32 * a).round() as u8;
            }
        }
    }

    pub fn draw(&mut self, shape: &Shape) {
        match shape {
            Shape::Rect { x, y, w, h, fill } => {
                let (x0, y0) = self.point((*x, *y));
                let (x1, y1) = self.point((x + w, y + h));
                if let Some(r) = Rect::from_ltrb(x0, y0, x1, y1) {
                    self.pixmap
                        .fill_rect(r, &paint(*fill), Transform::identity(), None);
                }
            }
            Shape::Line {
                x1,
                y1,
                x2,
                y2,
                colour,
                width,
            } => {
                // A horizontal or vertical line (grid, ticks, the zero line, the NaN marker) is
                // moved by at most half a pixel across itself to cover whole pixels: crisp.
                let snap = |c: f64| (c + 0.5 - width / 2.0).round() + width / 2.0 - 0.5;
                let (mut a, mut b) = ((*x1, *y1), (*x2, *y2));
                if x1 == x2 {
                    (a.0, b.0) = (snap(*x1), snap(*x2));
                }
                if y1 == y2 {
                    (a.1, b.1) = (snap(*y1), snap(*y2));
                }
                self.stroke(&[a, b], *width, *colour, LineCap::Square)
            }
            Shape::Polyline {
                points,
                colour,
                width,
            } => self.stroke(points, *width, *colour, LineCap::Round),
            Shape::Dot { x, y, r, colour } => {
                let (cx, cy) = self.point((*x, *y));
                if let Some(path) = PathBuilder::from_circle(cx, cy, *r as f32) {
                    self.pixmap.fill_path(
                        &path,
                        &paint(*colour),
                        FillRule::Winding,
                        centres(),
                        None,
                    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::shape::Anchor;

    const WHITE: [u8; 3] = PALETTE[Colour::White as usize];

    fn at(c: &Canvas, x: u32, y: u32) -> [u8; 3] {
        c.pixels()[(y * c.pixmap.width() + x) as usize]
    }

    fn rgb(c: Colour) -> [u8; 3] {
        PALETTE[c as usize]
    }

    /// Each shape covers the pixels it should, in its colour: rectangles to their edges,
    /// horizontal and vertical lines whole pixels wide (crisp), dots round their centre pixel,
    /// slanted lines anti-aliased, text where its glyphs are.
    #[test]
    fn shapes_land_on_their_pixels() {
        let mut c = Canvas::new(40, 30);
        assert!(c.pixels().iter().all(|p| *p == WHITE));
        c.draw(&Shape::Rect {
            x: 2.0,
            y: 3.0,
            w: 5.0,
            h: 4.0,
            fill: Colour::Base,
        });
        assert_eq!(
            (at(&c, 2, 3), at(&c, 6, 6)),
            (rgb(Colour::Base), rgb(Colour::Base))
        );
        assert_eq!(
            (at(&c, 7, 3), at(&c, 2, 7), at(&c, 1, 3)),
            (WHITE, WHITE, WHITE)
        );
        // 1 pixel wide at y 10.3: row 10 alone.
        c.draw(&Shape::Line {
            x1: 10.0,
            y1: 10.3,
            x2: 30.0,
            y2: 10.3,
            colour: Colour::Black,
            width: 1.0,
        });
        assert_eq!(at(&c, 15, 10), rgb(Colour::Black));
        assert_eq!((at(&c, 15, 9), at(&c, 15, 11)), (WHITE, WHITE));
        // 2 pixels wide at x 20.2: columns 20 and 21.
        c.draw(&Shape::Line {
            x1: 20.2,
            y1: 12.0,
            x2: 20.2,
            y2: 28.0,
            colour: Colour::Fail,
            width: 2.0,
        });
        assert_eq!(
            (at(&c, 20, 20), at(&c, 21, 20)),
            (rgb(Colour::Fail), rgb(Colour::Fail))
        );
        assert_eq!((at(&c, 19, 20), at(&c, 22, 20)), (WHITE, WHITE));
        c.draw(&Shape::Dot {
            x: 10.0,
            y: 20.0,
            r: 2.5,
            colour: Colour::Window,
        });
        assert_eq!(at(&c, 10, 20), rgb(Colour::Window));
        assert_eq!((at(&c, 10, 24), at(&c, 14, 20)), (WHITE, WHITE));
        // A slanted 1-pixel line: full colour nowhere off its axis, shades of it along it.
        let mut s = Canvas::new(40, 30);
        s.draw(&Shape::Polyline {
            points: vec![(0.0, 0.0), (39.0, 13.0)],
            colour: Colour::Black,
            width: 1.0,
        });
        let shades = s
            .pixels()
            .iter()
            .filter(|p| **p != WHITE && p[0] > 40)
            .count();
        assert!(shades > 20, "{shades} anti-aliased pixels");
        assert_eq!(at(&s, 20, 20), WHITE);
        // Text: glyph coverage blended over the canvas, dark inside `H`, nothing past it.
        let mut t = Canvas::new(20, 20);
        t.draw(&Shape::Text {
            x: 2.0,
            y: 14.0,
            text: "H".into(),
            colour: Colour::Black,
            anchor: Anchor::Start,
            size: 12.0,
        });
        assert!(t.pixels().iter().any(|p| p[0] < 60), "the stems of `H`");
        assert!((0..20).all(|x| at(&t, x, 16) == WHITE && at(&t, 15, x) == WHITE));
    }

    /// A point far outside the canvas (a degenerate range) neither panics in `tiny-skia` nor
    /// hides what lies on the canvas; NaN draws nothing.
    #[test]
    fn far_and_non_finite_points_draw_what_is_on_the_canvas() {
        let mut c = Canvas::new(40, 30);
        c.draw(&Shape::Line {
            x1: 10.0,
            y1: 10.0,
            x2: 10.0,
            y2: -6.9e8,
            colour: Colour::Black,
            width: 1.0,
        });
        assert_eq!(at(&c, 10, 5), rgb(Colour::Black));
        c.draw(&Shape::Polyline {
            points: vec![(5.0, 20.0), (1e300, 20.0)],
            colour: Colour::Gap,
            width: 1.0,
        });
        assert_eq!(at(&c, 35, 20), rgb(Colour::Gap));
        c.draw(&Shape::Rect {
            x: -1e300,
            y: 25.0,
            w: f64::INFINITY,
            h: 1e9,
            fill: Colour::Band,
        });
        assert_eq!(
            (at(&c, 0, 29), at(&c, 39, 25)),
            (rgb(Colour::Band), rgb(Colour::Band))
        );
        let before = c.pixels();
        c.draw(&Shape::Polyline {
            points: vec![(1.0, 1.0), (f64::NAN, 5.0), (30.0, 1.0)],
            colour: Colour::Fail,
            width: 3.0,
        });
        c.draw(&Shape::Dot {
            x: f64::NAN,
            y: 3.0,
            r: 4.0,
            colour: Colour::Fail,
        });
        c.draw(&Shape::Dot {
            x: 1e308,
            y: -1e308,
            r: 4.0,
            colour: Colour::Fail,
        });
        assert!(c.pixels() == before, "nothing drawn");
    }
}
