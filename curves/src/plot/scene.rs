//! The parity plot's layout: both curves (top panel), the gap TEST − BASE with its window
//! means and the ±δ band (bottom panel), the warm-up and the diverging windows shaded, the
//! first NaN/Inf of TEST marked, the legend and the verdict (`legend.rs`) — as a list of
//! [`Shape`]s.

use super::legend::{legend, Band};
use super::panel::{curve, padded, Panel};
use super::shape::{Anchor, Colour, Shape};
use super::text::{advance, SIZE_TEXT};
use crate::report::Diff;

/// Size of the plot in pixels.
pub const WIDTH: u32 = 960;
pub const HEIGHT: u32 = 680;

/// `v` with 4 decimals, or in scientific notation where that would be long or show nothing.
fn compact(v: f64) -> String {
    if v == 0.0 || (1e-4..1e6).contains(&v.abs()) {
        format!("{v:.4}")
    } else {
        format!("{v:.3e}")
    }
}

/// The shapes of the plot of `d`, back to front, on a `WIDTH × HEIGHT` canvas. No two texts
/// overlap and every text lies inside the canvas (`curves/tests/plot.rs` checks it).
pub fn scene(d: &Diff) -> Vec<Shape> {
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
    // Diverging windows (a FAIL wherever they lie), shaded in both panels.
    for w in &r.diverging_windows {
        for p in [&top, &bottom] {
            let (a, b) = (p.px(w.steps[0] as f64), p.px(w.steps[1] as f64));
            out.push(Shape::Rect {
                x: a.min(b) - 1.0,
                y: p.top,
                w: (b - a).abs() + 2.0,
                h: p.h,
                fill: Colour::Diverging,
            });
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
        WIDTH as f64,
    );
    bottom.frame(
        &mut out,
        &format!("gap TEST − BASE, band ±δ = {}", compact(delta)),
        "y: TEST − BASE (bold: window means)",
        WIDTH as f64,
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
        let right = x + 8.0 + advance(&label, SIZE_TEXT) <= top.left + top.w;
        out.push(Shape::Text {
            x: if right { x + 6.0 } else { x - 6.0 },
            y: top.top + 16.0,
            text: label,
            colour: Colour::Fail,
            anchor: if right { Anchor::Start } else { Anchor::End },
            size: SIZE_TEXT,
        });
    }
    legend(
        r,
        &Band {
            left: top.left,
            right: top.left + top.w,
            rows: [22.0, 40.0],
        },
        &mut out,
    );
    out.push(Shape::Text {
        x: 510.0,
        y: HEIGHT as f64 - 14.0,
        text: if r.diverging_windows.is_empty() {
            "step (grey: warm-up, not compared)".into()
        } else {
            "step (grey: warm-up, not compared; red: diverging windows)".into()
        },
        colour: Colour::Black,
        anchor: Anchor::Middle,
        size: SIZE_TEXT,
    });
    out
}
