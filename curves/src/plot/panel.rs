//! A panel of the plot: maps data to pixels, draws its frame, grid, round ticks (labelled so
//! that no two labels overlap) and title, and draws curves through it (broken at non-finite
//! values).

use super::shape::{Anchor, Colour, Rect, Shape};
use super::text::{advance, bounds, elide, SIZE_TEXT, SIZE_TITLE};

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
    /// Grid, ticks, frame, `title` (left) and `ylabel` (right, shortened if it would reach
    /// the title) above the panel. Tick labels never overlap (fewer x ticks are drawn when
    /// long labels would) and stay within `0..canvas_width`.
    pub(super) fn frame(&self, out: &mut Vec<Shape>, title: &str, ylabel: &str, canvas_width: f64) {
        let (yt, yd) = ticks(self.y.0, self.y.1, 5);
        for (v, label) in yt.iter().zip(labels_within(&yt, yd, self.left - 8.0)) {
            let y = self.py(*v);
            out.push(Shape::Line {
                x1: self.left,
                y1: y,
                x2: self.left + self.w,
                y2: y,
                colour: Colour::Grid,
                width: 1.0,
            });
            out.push(text(
                self.left - 6.0,
                y + 4.0,
                label,
                Anchor::End,
                SIZE_TEXT,
            ));
        }
        let y = self.top + self.h + 18.0;
        for (x, at, label) in self.x_labels(y, canvas_width) {
            out.push(Shape::Line {
                x1: x,
                y1: self.top + self.h,
                x2: x,
                y2: self.top + self.h + 5.0,
                colour: Colour::Black,
                width: 1.0,
            });
            out.push(text(at, y, label, Anchor::Middle, SIZE_TEXT));
        }
        let (l, t, r, b) = (self.left, self.top, self.left + self.w, self.top + self.h);
        out.push(Shape::Polyline {
            points: vec![(l, t), (r, t), (r, b), (l, b), (l, t)],
            colour: Colour::Black,
            width: 1.0,
        });
        let title = elide(title, SIZE_TITLE, self.w - 2.0);
        let title_box = bounds(l, t - 10.0, &title, Anchor::Start, SIZE_TITLE);
        out.push(text(l, t - 10.0, title, Anchor::Start, SIZE_TITLE));
        let room = r - title_box.x1 - 16.0;
        let ylabel = elide(ylabel, SIZE_TEXT, room);
        out.push(text(r, t - 10.0, ylabel, Anchor::End, SIZE_TEXT));
    }

    /// The x ticks `(tick x, label x, label)`: about 8, fewer when neighbouring labels (on
    /// baseline `y`) would come closer than 8 pixels. A label that would leave the canvas is
    /// shifted inwards from its tick.
    fn x_labels(&self, y: f64, canvas_width: f64) -> Vec<(f64, f64, String)> {
        let mut best = Vec::new();
        for n in (1..=8).rev() {
            let (xt, xd) = ticks(self.x.0, self.x.1, n);
            best = xt
                .iter()
                .map(|v| self.px(*v))
                .zip(labels(&xt, xd))
                .map(|(x, l)| {
                    let half = 0.5 * advance(&l, SIZE_TEXT) + 1.0;
                    (x, x.clamp(half, (canvas_width - half).max(half)), l)
                })
                .collect();
            let boxes: Vec<Rect> = best
                .iter()
                .map(|(_, at, l)| bounds(*at, y, l, Anchor::Middle, SIZE_TEXT))
                .collect();
            let apart = boxes.windows(2).all(|w| w[0].x1 + 8.0 <= w[1].x0);
            let fits = boxes.iter().map(|b| b.x1 - b.x0 + 8.0).sum::<f64>() <= canvas_width;
            if apart && fits {
                break;
            }
        }
        best
    }
}

fn text(x: f64, y: f64, text: String, anchor: Anchor, size: f64) -> Shape {
    Shape::Text {
        x,
        y,
        text,
        colour: Colour::Black,
        anchor,
        size,
    }
}

/// Tick labels: fixed-point with `decimals` while short, otherwise scientific with the mantissa
/// digits that tell neighbouring ticks apart (`1.000000000004e15`), so a label is never
/// hundreds of digits wide.
pub fn labels(ticks: &[f64], decimals: usize) -> Vec<String> {
    labels_within(ticks, decimals, f64::INFINITY)
}

/// [`labels`] no wider than `width` pixels where fewer mantissa digits allow it (then
/// neighbouring labels may read alike: a span far below the values' magnitude).
fn labels_within(ticks: &[f64], decimals: usize, width: f64) -> Vec<String> {
    let widest = |l: &[String]| l.iter().map(|s| advance(s, SIZE_TEXT)).fold(0.0, f64::max);
    let top = ticks.iter().fold(0f64, |m, v| m.max(v.abs()));
    if decimals <= 5 && top < 1e7 {
        let fixed: Vec<String> = ticks.iter().map(|v| format!("{v:.decimals$}")).collect();
        if widest(&fixed) <= width {
            return fixed;
        }
    }
    let step = match ticks {
        [a, b, ..] => (b - a).abs(),
        _ => top,
    };
    let natural = (top.log10().floor() - step.log10().floor()).clamp(0.0, 15.0);
    let natural = if natural.is_finite() {
        natural as usize
    } else {
        0
    };
    let sci =
        |digits: usize| -> Vec<String> { ticks.iter().map(|v| format!("{v:.digits$e}")).collect() };
    (0..=natural)
        .rev()
        .map(sci)
        .find(|l| widest(l) <= width)
        .unwrap_or_else(|| sci(0))
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

    #[test]
    fn labels_are_short_at_any_magnitude() {
        assert_eq!(labels(&[0.0, 0.5, 1.0], 1), ["0.0", "0.5", "1.0"]);
        // Steps near 10^15: distinct labels, 17 characters at most.
        let (t, d) = ticks(1.0e15, 1.0e15 + 4000.0, 5);
        let l = labels(&t, d);
        assert!(l.iter().all(|s| s.len() <= 17), "{l:?}");
        assert_eq!(
            l.len(),
            l.iter().collect::<std::collections::BTreeSet<_>>().len()
        );
        // Held to a width, they give up digits.
        assert!(labels_within(&t, d, 40.0)
            .iter()
            .all(|s| advance(s, SIZE_TEXT) <= 40.0));
        let (t, d) = ticks(-1e300, 1e300, 5);
        assert!(
            labels(&t, d).iter().all(|s| s.len() <= 8),
            "{:?}",
            labels(&t, d)
        );
        let (t, d) = ticks(1e-9, 5e-9, 4);
        assert!(
            labels(&t, d).iter().all(|s| s.len() <= 8),
            "{:?}",
            labels(&t, d)
        );
    }
}
