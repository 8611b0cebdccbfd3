//! Steps 3–5 of the criterion ([`crate::diff`]): the windowed paired gap over the compared
//! steps, the margin δ (and δ_fail, with σ_seed at its upper limit), the mean-gap, tail and
//! per-window intervals, the drift, and the windows that diverge.
//!
//! **Error budget.** A FAIL can be raised by the mean gap's interval, the tail gap's, and the
//! family of per-window intervals, and — with baselines — only if σ_seed is not larger than
//! its upper limit: `s` = 3 or 4 statements. Each takes `α/s` of `α = 1 − confidence`
//! (Bonferroni), so noise alone raises a FAIL with probability at most `α`. Within the window
//! family, each of the `m` windows takes `α/(s·m)`.

use crate::report::{
    interval_level, Criterion, DivergingWindow, GapStats, Margin, SigmaSeed, FAIL_STATEMENTS,
    TARGET_WINDOWS,
};
use crate::seed::sigma_seed;
use crate::series::{pair_precision, Series};
use crate::stats::{effective_count, lag1_about_zero, mean, sd, slope, t_two_sided};

/// Everything the windowed statistics give; all None / empty when nothing is compared.
#[derive(Debug, Default)]
pub struct Windowed {
    pub margin: Option<Margin>,
    pub sigma_seed: Option<SigmaSeed>,
    pub gap: Option<GapStats>,
    /// Every window's gap and interval, in step order.
    pub windows: Vec<DivergingWindow>,
}

/// The per-window intervals of `windows` at `level` each (before the Bonferroni split over
/// the windows), and the pooled lag-1 autocorrelation of the steps' gaps about their window
/// means. A window of one step has no spread to go by: its interval is unbounded.
fn window_intervals(windows: &[&[(u64, f64, f64)]], level: f64) -> (Vec<DivergingWindow>, f64) {
    let gaps: Vec<Vec<f64>> = windows
        .iter()
        .map(|w| w.iter().map(|p| p.2 - p.1).collect())
        .collect();
    let resid: Vec<Vec<f64>> = gaps
        .iter()
        .map(|g| {
            let m = mean(g);
            g.iter().map(|v| v - m).collect()
        })
        .collect();
    let rho = lag1_about_zero(&resid);
    let per_window = 1.0 - (1.0 - level) / windows.len().max(1) as f64;
    let out = windows
        .iter()
        .zip(&gaps)
        .map(|(w, g)| {
            let gm = mean(g);
            let half = if g.len() >= 2 {
                let n_eff = effective_count(g.len(), rho);
                let dof = (n_eff - 1.0).max(1.0);
                t_two_sided(per_window, dof) * sd(g) / n_eff.sqrt()
            } else {
                f64::INFINITY
            };
            DivergingWindow {
                steps: [w[0].0, w[w.len() - 1].0],
                gap: gm,
                interval: [gm - half, gm + half],
            }
        })
        .collect();
    (out, rho)
}

/// The windowed statistics over `eval`, the compared `(step, base, test)` in step order.
pub fn windowed(
    eval: &[(u64, f64, f64)],
    bs: &Series,
    ts: &Series,
    baselines: &[Series],
    c: &Criterion,
) -> Windowed {
    if eval.is_empty() {
        return Windowed::default();
    }
    let w = c
        .window_steps
        .unwrap_or((eval.len() / TARGET_WINDOWS).max(1))
        .max(1);
    let m = eval.len() / w;
    // Windows aligned to the end, so the last window holds the last steps.
    let windows: Vec<&[(u64, f64, f64)]> = eval[eval.len() - m * w..].chunks(w).collect();
    let shares = FAIL_STATEMENTS + usize::from(!baselines.is_empty());
    let share = (1.0 - c.confidence) / shares as f64;
    let level = interval_level(c.confidence, shares);
    let (window_gaps, step_lag1) = window_intervals(&windows, level);
    let g: Vec<f64> = window_gaps.iter().map(|x| x.gap).collect();
    let x: Vec<f64> = windows
        .iter()
        .map(|win| mean(&win.iter().map(|p| p.0 as f64).collect::<Vec<_>>()))
        .collect();
    let mean_base = mean(&eval.iter().map(|p| p.1).collect::<Vec<_>>());
    let sigma = sigma_seed(&windows, baselines, share);
    let precision = pair_precision(eval, bs, ts);
    let rel_term = c.rel * mean_base.abs();
    let seed_term = sigma.as_ref().map(|s| c.k_seed * s.value);
    let seed_term_upper = sigma.as_ref().map(|s| c.k_seed * s.interval[1]);
    let precision_term = 2.0 * precision;
    let mut delta = rel_term;
    let mut set_by = "rel";
    if let Some(s) = seed_term.filter(|s| *s > delta) {
        delta = s;
        set_by = "seed";
    }
    if precision_term > delta {
        delta = precision_term;
        set_by = "precision";
    }
    let delta_fail = delta.max(seed_term_upper.unwrap_or(0.0));
    let margin = Margin {
        delta,
        set_by,
        delta_fail,
        mean_base,
        rel_term,
        seed_term,
        seed_term_upper,
        precision_term,
    };
    let (max_abs_step, max_abs) = eval
        .iter()
        .map(|p| (p.0, (p.2 - p.1).abs()))
        .fold((eval[0].0, 0.0), |acc, v| if v.1 > acc.1 { v } else { acc });
    let gm = if m > 0 { mean(&g) } else { f64::NAN };
    let half = if m >= 2 {
        t_two_sided(level, (m - 1) as f64) * sd(&g) / (m as f64).sqrt()
    } else {
        f64::INFINITY
    };
    let (b, se_b, s_res) = slope(&x, &g);
    let t2 = if m >= 3 {
        t_two_sided(c.confidence, (m - 2) as f64)
    } else {
        f64::INFINITY
    };
    let slope_t = if se_b > 0.0 {
        b / se_b
    } else if b == 0.0 {
        0.0
    } else {
        f64::INFINITY * b.signum()
    };
    let span = x.last().zip(x.first()).map_or(0.0, |(l, f)| l - f);
    let drift = b * span;
    let drifting = m >= 3 && slope_t.abs() > t2 && drift.abs() > c.drift_frac * delta;
    let tail_windows = ((c.tail_frac * m as f64).ceil() as usize).clamp(1.min(m), m);
    let tail_mean = if m > 0 {
        mean(&g[m - tail_windows..])
    } else {
        f64::NAN
    };
    let tail_half_width = if m >= 3 {
        t_two_sided(level, (m - 2) as f64) * s_res / (tail_windows as f64).sqrt()
    } else {
        f64::INFINITY
    };
    let gap = GapStats {
        window_steps: w,
        windows: m,
        level,
        window_level: 1.0 - (1.0 - level) / m.max(1) as f64,
        step_lag1,
        mean: gm,
        ci_low: gm - half,
        ci_high: gm + half,
        max_abs,
        max_abs_step,
        tail_windows,
        tail_mean,
        tail_half_width,
        slope_per_step: b,
        slope_t,
        drift_over_compared_steps: drift,
        drifting,
    };
    Windowed {
        margin: Some(margin),
        sigma_seed: sigma,
        gap: Some(gap),
        windows: window_gaps,
    }
}

/// The windows whose interval lies wholly outside `±band`.
pub fn outside(windows: &[DivergingWindow], band: f64) -> Vec<DivergingWindow> {
    windows
        .iter()
        .filter(|w| w.interval[0] > band || w.interval[1] < -band)
        .cloned()
        .collect()
}

/// `steps a–b (gap up to +x.xxxx)` for each run of adjacent windows (adjacent in `all`, every
/// window in step order) among `picked`, at most `limit` runs named.
pub fn describe(all: &[DivergingWindow], picked: &[DivergingWindow], limit: usize) -> String {
    // (index in `all` of the run's last window, first step, last step, largest |gap|)
    let mut runs: Vec<(usize, u64, u64, f64)> = Vec::new();
    for w in picked {
        let i = all
            .iter()
            .position(|a| a.steps == w.steps)
            .unwrap_or(usize::MAX);
        match runs.last_mut() {
            Some(r) if i != usize::MAX && r.0 + 1 == i => {
                r.0 = i;
                r.2 = w.steps[1];
                if w.gap.abs() > r.3.abs() {
                    r.3 = w.gap;
                }
            }
            _ => runs.push((i, w.steps[0], w.steps[1], w.gap)),
        }
    }
    let named: Vec<String> = runs
        .iter()
        .take(limit)
        .map(|(_, a, b, g)| format!("steps {a}–{b} (gap up to {g:+.4})"))
        .collect();
    let more = runs.len().saturating_sub(limit);
    if more > 0 {
        format!("{} and {more} more", named.join(", "))
    } else {
        named.join(", ")
    }
}
