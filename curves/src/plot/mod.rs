//! The parity plot: both curves (top), the gap TEST − BASE with its window means and the ±δ
//! band (bottom), the warm-up shaded. One scene is drawn two ways: as SVG text (`svg.rs`), or
//! rasterised with the embedded 8×8 bitmap font of the `font8x8` crate and written as an
//! indexed-colour PNG by our own encoder (`png.rs`) — no system font or image library.

mod png;
mod raster;
mod svg;

use std::path::Path;

use crate::diff::{Diff, Verdict};
use crate::CurveError;

pub use png::{crc32, encode_indexed as encode_png};
pub use raster::Canvas;

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

pub const WIDTH: u32 = 960;
pub const HEIGHT: u32 = 680;

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
            png::encode_indexed(WIDTH, HEIGHT, &PALETTE, c.pixels())
        }
    }
}

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
struct Panel {
    left: f64,
    top: f64,
    w: f64,
    h: f64,
    x: (f64, f64),
    y: (f64, f64),
}

impl Panel {
    fn px(&self, x: f64) -> f64 {
        self.left + (x - self.x.0) / (self.x.1 - self.x.0) * self.w
    }
    fn py(&self, y: f64) -> f64 {
        self.top + self.h - (y - self.y.0) / (self.y.1 - self.y.0) * self.h
    }
    fn frame(&self, out: &mut Vec<Shape>, title: &str, ylabel: &str) {
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

fn padded(lo: f64, hi: f64) -> (f64, f64) {
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
fn curve(
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

fn file_name(p: &str) -> &str {
    Path::new(p)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(p)
}

fn scene(d: &Diff) -> Vec<Shape> {
    let r = &d.report;
    let mut out = vec![Shape::Rect {
        x: 0.0,
        y: 0.0,
        w: WIDTH as f64,
        h: HEIGHT as f64,
        fill: Colour::White,
    }];
    let steps: Vec<f64> = d.pairs.iter().map(|p| p.0 as f64).collect();
    let (x0, x1) = (steps[0], *steps.last().unwrap());
    let xr = if x1 > x0 {
        (x0, x1)
    } else {
        (x0 - 1.0, x0 + 1.0)
    };
    let finite = |v: f64| v.is_finite();
    let vals: Vec<f64> = d
        .pairs
        .iter()
        .flat_map(|p| [p.1, p.2])
        .filter(|v| finite(*v))
        .collect();
    let top = Panel {
        left: 90.0,
        top: 70.0,
        w: 840.0,
        h: 300.0,
        x: xr,
        y: padded(
            vals.iter().copied().fold(f64::INFINITY, f64::min),
            vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ),
    };
    let delta = r.margin.as_ref().map_or(0.0, |m| m.delta);
    let gaps: Vec<f64> = d
        .pairs
        .iter()
        .map(|p| p.2 - p.1)
        .filter(|v| finite(*v))
        .collect();
    let glo = gaps.iter().copied().fold(-delta, f64::min);
    let ghi = gaps.iter().copied().fold(delta, f64::max);
    let bottom = Panel {
        left: 90.0,
        top: 440.0,
        w: 840.0,
        h: 180.0,
        x: xr,
        y: padded(glo, ghi),
    };
    // Warm-up shading in both panels.
    if let Some(first) = r.alignment.first_compared_step {
        for p in [&top, &bottom] {
            let x = p.px(first as f64);
            if x > p.left {
                out.push(Shape::Rect {
                    x: p.left,
                    y: p.top,
                    w: x - p.left,
                    h: p.h,
                    fill: Colour::Warmup,
                });
            }
        }
    }
    let band_top = bottom.py(delta.min(bottom.y.1));
    let band_bottom = bottom.py((-delta).max(bottom.y.0));
    out.push(Shape::Rect {
        x: bottom.left,
        y: band_top,
        w: bottom.w,
        h: band_bottom - band_top,
        fill: Colour::Band,
    });
    top.frame(
        &mut out,
        &format!("{}: BASE vs TEST", r.metric),
        &format!("y: {}", r.metric),
    );
    bottom.frame(
        &mut out,
        &format!("gap TEST - BASE, band +/-delta = {delta:.4}"),
        "y: TEST - BASE (bold: window means)",
    );
    let zero = bottom.py(0.0);
    out.push(Shape::Line {
        x1: bottom.left,
        y1: zero,
        x2: bottom.left + bottom.w,
        y2: zero,
        colour: Colour::Black,
        width: 1.0,
    });
    curve(
        &top,
        d.pairs.iter().map(|p| (p.0 as f64, p.1)),
        Colour::Base,
        2.0,
        &mut out,
    );
    curve(
        &top,
        d.pairs.iter().map(|p| (p.0 as f64, p.2)),
        Colour::Test,
        1.0,
        &mut out,
    );
    curve(
        &bottom,
        d.pairs.iter().map(|p| (p.0 as f64, p.2 - p.1)),
        Colour::Gap,
        1.0,
        &mut out,
    );
    for p in &d.pairs {
        let g = p.2 - p.1;
        if g.is_finite() && d.pairs.len() <= 200 {
            out.push(Shape::Dot {
                x: bottom.px(p.0 as f64),
                y: bottom.py(g.clamp(bottom.y.0, bottom.y.1)),
                r: 2.5,
                colour: Colour::Window,
            });
        }
    }
    // Window means of the gap, as the criterion sees them (only when windows hold > 1 step).
    if let Some(g) = r
        .gap
        .as_ref()
        .filter(|g| g.window_steps > 1 && g.windows > 0)
    {
        let finite: Vec<&(u64, f64, f64)> = d
            .pairs
            .iter()
            .filter(|p| p.1.is_finite() && p.2.is_finite())
            .skip(r.alignment.warmup_steps)
            .collect();
        let used = &finite[finite.len() - g.windows * g.window_steps..];
        let means: Vec<(f64, f64)> = used
            .chunks(g.window_steps)
            .map(|w| {
                let n = w.len() as f64;
                (
                    w.iter().map(|p| p.0 as f64).sum::<f64>() / n,
                    w.iter().map(|p| p.2 - p.1).sum::<f64>() / n,
                )
            })
            .collect();
        curve(
            &bottom,
            means.iter().copied(),
            Colour::Window,
            3.0,
            &mut out,
        );
        for (x, y) in means {
            out.push(Shape::Dot {
                x: bottom.px(x),
                y: bottom.py(y.clamp(bottom.y.0, bottom.y.1)),
                r: 4.0,
                colour: Colour::Window,
            });
        }
    }
    // The first step where TEST is NaN/Inf and BASE is finite.
    if let Some(&step) = r.test_nonfinite_steps.first() {
        let x = top.px(step as f64);
        out.push(Shape::Line {
            x1: x,
            y1: top.top,
            x2: x,
            y2: top.top + top.h,
            colour: Colour::Fail,
            width: 2.0,
        });
        let label = format!("TEST NaN/Inf from step {step}");
        let right = x + 8.0 + 7.0 * label.len() as f64 <= top.left + top.w;
        out.push(Shape::Text {
            x: if right { x + 6.0 } else { x - 6.0 },
            y: top.top + 16.0,
            text: label,
            colour: Colour::Fail,
            anchor: if right { Anchor::Start } else { Anchor::End },
            scale: 1,
        });
    }
    // Legend and verdict.
    let legend_y = 24.0;
    out.push(Shape::Rect {
        x: 90.0,
        y: legend_y - 8.0,
        w: 16.0,
        h: 4.0,
        fill: Colour::Base,
    });
    out.push(Shape::Text {
        x: 112.0,
        y: legend_y,
        text: format!("BASE {}", file_name(&r.base.path)),
        colour: Colour::Black,
        anchor: Anchor::Start,
        scale: 1,
    });
    out.push(Shape::Rect {
        x: 420.0,
        y: legend_y - 8.0,
        w: 16.0,
        h: 4.0,
        fill: Colour::Test,
    });
    out.push(Shape::Text {
        x: 442.0,
        y: legend_y,
        text: format!("TEST {}", file_name(&r.test.path)),
        colour: Colour::Black,
        anchor: Anchor::Start,
        scale: 1,
    });
    let vcol = match r.verdict {
        Verdict::Pass => Colour::Pass,
        Verdict::Fail => Colour::Fail,
        Verdict::Inconclusive => Colour::Black,
    };
    out.push(Shape::Text {
        x: 930.0,
        y: legend_y + 4.0,
        text: r.verdict.label().to_string(),
        colour: vcol,
        anchor: Anchor::End,
        scale: 2,
    });
    out.push(Shape::Text {
        x: 510.0,
        y: HEIGHT as f64 - 14.0,
        text: "step (grey: warm-up, not compared)".into(),
        colour: Colour::Black,
        anchor: Anchor::Middle,
        scale: 1,
    });
    out
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
