//! A panel of the plot: maps data to pixels, draws its frame, grid, round ticks and title, and
//! draws curves through it (broken at non-finite values).

use super::shape::{Anchor, Colour, Shape};

/// Ticks at 1, 2 or 5 × 10^k covering `[lo, hi]`, about `n` of them, with the decimals to print.
pub fn ticks(lo: f64, hi: f64, n: usize) -> (Vec<f64>, usize) {
    let span = (hi - lo).abs().max(f64::MIN_POSITIVE);
    let raw = span / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|f| f * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    ((first..=last).map(|i| i as f64 * step).collect(), decimals)
}

/// A panel: maps data to pixels and draws its frame, grid, ticks and title.
pub(super) struct Panel {
    pub(super) left: f64,
    pub(super) top: f64,
    pub(super) w: f64,
    pub(super) h: f64,
    pub(super) x: (f64, f64),
    pub(super) y: (f64, f64),
}

impl Panel {
    pub(super) fn px(&self, x: f64) -> f64 {
        self.left + (x - self.x.0) / (self.x.1 - self.x.0) * self.w
    }
    pub(super) fn py(&self, y: f64) -> f64 {
        self.top + self.h - (y - self.y.0) / (self.y.1 - self.y.0) * self.h
    }
    pub(super) fn frame(&self, out: &mut Vec<Shape>, title: &str, ylabel: &str) {
        let (yt, yd) = ticks(self.y.0, self.y.1, 5);
        for v in yt {
            let y = self.py(v);
            out.push(Shape::Line {
                x1: self.left,
                y1: y,
                x2: self.left + self.w,
                y2: y,
                colour: Colour::Grid,
                width: 1.0,
            });
            out.push(Shape::Text {
                x: self.left - 6.0,
                y: y + 4.0,
                text: format!("{v:.yd$}"),
                colour: Colour::Black,
                anchor: Anchor::End,
                scale: 1,
            });
        }
        let (xt, xd) = ticks(self.x.0, self.x.1, 8);
        for v in xt {
            let x = self.px(v);
            out.push(Shape::Line {
                x1: x,
                y1: self.top + self.h,
                x2: x,
                y2: self.top + self.h + 5.0,
                colour: Colour::Black,
                width: 1.0,
            });
            out.push(Shape::Text {
                x,
                y: self.top + self.h + 18.0,
                text: format!("{v:.xd$}"),
                colour: Colour::Black,
                anchor: Anchor::Middle,
                scale: 1,
            });
        }
        let (l, t, r, b) = (self.left, self.top, self.left + self.w, self.top + self.h);
        out.push(Shape::Polyline {
            points: vec![(l, t), (r, t), (r, b), (l, b), (l, t)],
            colour: Colour::Black,
            width: 1.0,
        });
        out.push(Shape::Text {
            x: l,
            y: t - 10.0,
            text: title.to_string(),
            colour: Colour::Black,
            anchor: Anchor::Start,
            scale: 2,
        });
        out.push(Shape::Text {
            x: r,
            y: t - 10.0,
            text: ylabel.to_string(),
            colour: Colour::Black,
            anchor: Anchor::End,
            scale: 1,
        });
    }
}

pub(super) fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if !(lo.is_finite() && hi.is_finite()) {
        return (0.0, 1.0);
    }
    let pad = if hi > lo {
        0.06 * (hi - lo)
    } else {
        0.5 * lo.abs().max(1e-3)
    };
    (lo - pad, hi + pad)
}

/// Polylines through finite points, broken at non-finite ones.
pub(super) fn curve(
    panel: &Panel,
    pts: impl Iterator<Item = (f64, f64)>,
    colour: Colour,
    width: f64,
    out: &mut Vec<Shape>,
) {
    let mut run = Vec::new();
    for (x, y) in pts {
        if y.is_finite() {
            run.push((panel.px(x), panel.py(y.clamp(panel.y.0, panel.y.1))));
        } else if !run.is_empty() {
            out.push(Shape::Polyline {
                points: std::mem::take(&mut run),
                colour,
                width,
            });
        }
    }
    if run.len() == 1 {
        out.push(Shape::Dot {
            x: run[0].0,
            y: run[0].1,
            r: 2.0,
            colour,
        });
    } else if !run.is_empty() {
        out.push(Shape::Polyline {
            points: run,
            colour,
            width,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        let (t, d) = ticks(0.0, 14.0, 8);
        assert_eq!(t, vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]);
        assert_eq!(d, 0);
        // The gap panel of the seed logs: steps of 0.1, printed with one decimal.
        let (t, d) = ticks(-0.26, 0.07, 5);
        assert_eq!(d, 1);
        assert_eq!(t.len(), 3);
        assert!((t[0] + 0.2).abs() < 1e-12 && t[2].abs() < 1e-12);
        let (t, d) = ticks(8.0, 8.3, 5);
        assert_eq!(d, 1);
        assert!((3..=4).contains(&t.len()) && (t[1] - 8.1).abs() < 1e-12);
    }
}
