//! `moecheck curves diff`: is TEST's curve the same as BASE's, within a margin that is
//! justified by the loss scale, seed-to-seed noise and logging precision?
//!
//! The criterion (docs/curves.md gives the reasons):
//! 1. Align the runs on the steps both logged (a step logged twice — a restart — keeps its last
//!    value). A non-finite TEST value where BASE is finite is an immediate FAIL.
//! 2. Skip the first `ceil(warmup_frac · n)` common steps.
//! 3. Split the rest, from the end, into `m` non-overlapping windows of `W` steps and average
//!    the paired gap `test − base` in each: `g_1..g_m` (averaging tames step-to-step noise and
//!    autocorrelation).
//! 4. `δ = max(rel · |mean base loss|, k · σ_seed, 2 · logging precision)` where `σ_seed` is the
//!    RMS of the windowed gaps between BASE and a second baseline seed, when one is given, and
//!    the logging precision is the upper median, over the compared steps, of each pair's
//!    coarser quantum `max(q_base, q_test)` (warm-up steps do not enter it, and one value
//!    printed coarser than the rest does not loosen the whole comparison).
//! 5. `CI = mean(g) ± t_{L, m−1} · sd(g)/√m`; tail = mean of the last `ceil(tail_frac · m)`
//!    windows, ± `t_{L, m−2} · s_res/√m_tail` (each at level `L = 1 − (1 − conf)/2`, so the
//!    two together are a `conf` joint statement), with `s_res` the residual sd of a line fitted
//!    to `g`; drifting = the fitted slope is significant (|b|/se > `t_{conf, m−2}`) and moves
//!    the gap by more than `drift_frac · δ` over the compared steps.
//! 6. FAIL when CI lies outside ±δ or the tail's interval lies beyond δ; PASS when CI lies
//!    inside ±δ, the tail's interval inside ±δ and the gap is not drifting; otherwise
//!    INCONCLUSIVE, with a concrete suggestion.
//!
//! Steps 1–5 are computed here, step 6 in [`crate::decide`]; [`crate::render`] prints the
//! report that results.

use std::collections::BTreeMap;

use crate::decide::decide;
use crate::stats::{
    bootstrap_median_ratio, mad_outliers, mean, median, sd, slope, t_two_sided, upper_median,
};
use crate::{Curve, CurveError, Metric};

pub use crate::report::{
    interval_level, Alignment, Criterion, CurvesReport, Diff, GapStats, InputSummary, Margin,
    Throughput, Verdict, MIN_WINDOWS, TARGET_WINDOWS,
};

/// One metric of one log, one value per step.
#[derive(Debug, Clone)]
pub struct Series {
    pub values: BTreeMap<u64, f64>,
    /// The quantum of each value kept in `values`.
    pub quanta: BTreeMap<u64, f64>,
    /// Steps logged more than once (the last value is kept).
    pub duplicate_steps: Vec<u64>,
    /// Times the step number went backwards (a restart from a checkpoint).
    pub restarts: usize,
    /// [`Curve::precision`]: the median quantum over the whole log.
    pub precision: f64,
}

impl Series {
    pub fn of(curve: &Curve, metric: Metric) -> Result<Series, CurveError> {
        let samples = curve
            .metrics
            .get(&metric)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| CurveError::NoMetric {
                path: curve.path.clone(),
                metric: metric.name(),
                format: curve.format,
                found: curve.metrics_found().join(", "),
            })?;
        let mut values = BTreeMap::new();
        let mut quanta = BTreeMap::new();
        let mut duplicate_steps = Vec::new();
        let mut restarts = 0;
        let mut last: Option<u64> = None;
        for s in samples {
            if last.is_some_and(|l| s.step < l) {
                restarts += 1;
            }
            if values.insert(s.step, s.value).is_some() {
                duplicate_steps.push(s.step);
            }
            quanta.insert(s.step, s.quantum);
            last = Some(s.step);
        }
        duplicate_steps.sort_unstable();
        duplicate_steps.dedup();
        Ok(Series {
            values,
            quanta,
            duplicate_steps,
            restarts,
            precision: curve.precision(metric),
        })
    }
}

impl Series {
    /// The upper median of this log's quanta at `steps` (its precision over the whole log
    /// when `steps` is empty).
    pub fn precision_at(&self, steps: &[u64]) -> f64 {
        let q: Vec<f64> = steps
            .iter()
            .filter_map(|s| self.quanta.get(s))
            .copied()
            .collect();
        if q.is_empty() {
            self.precision
        } else {
            upper_median(&q)
        }
    }
}

/// The logging precision of the comparison: the upper median, over the compared steps, of the
/// coarser quantum of each pair (0 when nothing is compared).
pub fn pair_precision(eval: &[(u64, f64, f64)], bs: &Series, ts: &Series) -> f64 {
    let q: Vec<f64> = eval
        .iter()
        .map(|p| {
            let at = |s: &Series| s.quanta.get(&p.0).copied().unwrap_or(0.0);
            at(bs).max(at(ts))
        })
        .collect();
    if q.is_empty() {
        0.0
    } else {
        upper_median(&q)
    }
}

impl InputSummary {
    /// `compared`: the steps the criterion compares, whose quanta give `logging_precision`.
    pub fn new(curve: &Curve, s: &Series, compared: &[u64]) -> InputSummary {
        InputSummary {
            path: curve.path.display().to_string(),
            format: curve.format.name().to_string(),
            metrics_found: curve.metrics_found(),
            steps: s.values.len(),
            logging_precision: s.precision_at(compared),
            duplicate_steps: s.duplicate_steps.clone(),
            restarts: s.restarts,
        }
    }
}

/// Compares `test` against `base` (and `base2`, a second baseline seed) on `metric`.
pub fn diff(
    base: &Curve,
    test: &Curve,
    base2: Option<&Curve>,
    metric: Metric,
    c: &Criterion,
) -> Result<Diff, CurveError> {
    let bs = Series::of(base, metric)?;
    let ts = Series::of(test, metric)?;
    let b2s = base2.map(|b| Series::of(b, metric)).transpose()?;
    let only = |a: &Series, b: &Series| -> Vec<u64> {
        a.values
            .keys()
            .filter(|s| !b.values.contains_key(s))
            .copied()
            .collect()
    };
    let pairs: Vec<(u64, f64, f64)> = bs
        .values
        .iter()
        .filter_map(|(s, b)| ts.values.get(s).map(|t| (*s, *b, *t)))
        .collect();
    if pairs.is_empty() {
        return Err(CurveError::Unrecognised {
            path: test.path.clone(),
            reason: format!("no step in common with {}", base.path.display()),
        });
    }
    let base_nonfinite: Vec<u64> = pairs
        .iter()
        .filter(|p| !p.1.is_finite())
        .map(|p| p.0)
        .collect();
    let test_nonfinite: Vec<u64> = pairs
        .iter()
        .filter(|p| p.1.is_finite() && !p.2.is_finite())
        .map(|p| p.0)
        .collect();
    let finite: Vec<(u64, f64, f64)> = pairs
        .iter()
        .copied()
        .filter(|p| p.1.is_finite() && p.2.is_finite())
        .collect();
    let warmup = ((c.warmup_frac * finite.len() as f64).ceil() as usize).min(finite.len());
    let eval = &finite[warmup..];
    let compared: Vec<u64> = eval.iter().map(|p| p.0).collect();
    let mut notes = Vec::new();
    for (name, curve) in [("BASE", Some(base)), ("TEST", Some(test)), ("BASE2", base2)] {
        for w in curve.map(|c| c.warnings.as_slice()).unwrap_or_default() {
            notes.push(format!("{name}: {w}"));
        }
    }
    for (name, s) in [("BASE", &bs), ("TEST", &ts)] {
        if !s.duplicate_steps.is_empty() {
            notes.push(format!(
                "{name} logs {} step(s) more than once ({} restart(s)); the last value of each is used",
                s.duplicate_steps.len(),
                s.restarts
            ));
        }
    }
    let alignment = Alignment {
        common_steps: pairs.len(),
        only_in_base: only(&bs, &ts),
        only_in_test: only(&ts, &bs),
        base_nonfinite_steps: base_nonfinite,
        warmup_steps: warmup,
        steps_compared: eval.len(),
        first_compared_step: eval.first().map(|p| p.0),
        last_compared_step: eval.last().map(|p| p.0),
    };
    if !alignment.only_in_base.is_empty() || !alignment.only_in_test.is_empty() {
        notes.push(format!(
            "steps differ: {} only in BASE, {} only in TEST; only the {} common steps are compared",
            alignment.only_in_base.len(),
            alignment.only_in_test.len(),
            alignment.common_steps
        ));
    }
    let mut report = CurvesReport {
        verdict: Verdict::Inconclusive,
        reasons: Vec::new(),
        suggestion: None,
        notes,
        metric: metric.name(),
        base: InputSummary::new(base, &bs, &compared),
        test: InputSummary::new(test, &ts, &compared),
        baseline2: base2
            .zip(b2s.as_ref())
            .map(|(c, s)| InputSummary::new(c, s, &compared)),
        criterion: c.clone(),
        alignment,
        test_nonfinite_steps: test_nonfinite.clone(),
        first_exact_mismatch_step: None,
        margin: None,
        gap: None,
        throughput: throughput(base, test, c),
    };
    let (margin, gap) = windowed(eval, &bs, &ts, b2s.as_ref(), c);
    report.margin = margin;
    report.gap = gap;
    decide(&mut report, &pairs, c);
    Ok(Diff { report, pairs })
}

/// Margin and windowed gap statistics over the compared steps (None when there are none).
fn windowed(
    eval: &[(u64, f64, f64)],
    bs: &Series,
    ts: &Series,
    b2s: Option<&Series>,
    c: &Criterion,
) -> (Option<Margin>, Option<GapStats>) {
    if eval.is_empty() {
        return (None, None);
    }
    let w = c
        .window_steps
        .unwrap_or((eval.len() / TARGET_WINDOWS).max(1))
        .max(1);
    let m = eval.len() / w;
    // Windows aligned to the end, so the last window holds the last steps.
    let windows: Vec<&[(u64, f64, f64)]> = eval[eval.len() - m * w..].chunks(w).collect();
    let g: Vec<f64> = windows
        .iter()
        .map(|win| mean(&win.iter().map(|p| p.2 - p.1).collect::<Vec<_>>()))
        .collect();
    let x: Vec<f64> = windows
        .iter()
        .map(|win| mean(&win.iter().map(|p| p.0 as f64).collect::<Vec<_>>()))
        .collect();
    let mean_base = mean(&eval.iter().map(|p| p.1).collect::<Vec<_>>());
    let sigma_seed = b2s.and_then(|b2| {
        let h: Vec<f64> = windows
            .iter()
            .filter_map(|win| {
                let d: Vec<f64> = win
                    .iter()
                    .filter_map(|p| {
                        b2.values
                            .get(&p.0)
                            .filter(|v| v.is_finite())
                            .map(|v| v - p.1)
                    })
                    .collect();
                (!d.is_empty()).then(|| mean(&d))
            })
            .collect();
        (!h.is_empty()).then(|| (h.iter().map(|v| v * v).sum::<f64>() / h.len() as f64).sqrt())
    });
    let precision = pair_precision(eval, bs, ts);
    let rel_term = c.rel * mean_base.abs();
    let seed_term = sigma_seed.map(|s| c.k_seed * s);
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
    let margin = Margin {
        delta,
        set_by,
        mean_base,
        rel_term,
        sigma_seed,
        seed_term,
        precision_term,
    };
    let (max_abs_step, max_abs) = eval
        .iter()
        .map(|p| (p.0, (p.2 - p.1).abs()))
        .fold((eval[0].0, 0.0), |acc, v| if v.1 > acc.1 { v } else { acc });
    let gm = if m > 0 { mean(&g) } else { f64::NAN };
    // Two intervals decide FAIL (mean and tail): each is taken at 1 − (1 − conf)/2 so that
    // together they raise a false FAIL with probability at most 1 − conf (Bonferroni).
    let level = interval_level(c.confidence);
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
    (Some(margin), Some(gap))
}

/// Median step times excluding warm-up and MAD outliers, and the speed-up with a bootstrap
/// interval; None unless both logs have step times on common steps.
fn throughput(base: &Curve, test: &Curve, c: &Criterion) -> Option<Throughput> {
    let bs = Series::of(base, Metric::StepTimeS).ok()?;
    let ts = Series::of(test, Metric::StepTimeS).ok()?;
    let common: Vec<(u64, f64, f64)> = bs
        .values
        .iter()
        .filter_map(|(s, b)| ts.values.get(s).map(|t| (*s, *b, *t)))
        .filter(|p| p.1.is_finite() && p.2.is_finite() && p.1 > 0.0 && p.2 > 0.0)
        .collect();
    let warmup = (c.warmup_frac * common.len() as f64).ceil() as usize;
    let used = common.get(warmup..)?;
    if used.len() < 2 {
        return None;
    }
    let keep = |sel: fn(&(u64, f64, f64)) -> f64| -> (Vec<f64>, Vec<u64>) {
        let v: Vec<f64> = used.iter().map(sel).collect();
        let out = mad_outliers(&v);
        let kept = (0..v.len())
            .filter(|i| !out.contains(i))
            .map(|i| v[i])
            .collect();
        (kept, out.iter().map(|&i| used[i].0).collect())
    };
    let (bk, bo) = keep(|p| p.1);
    let (tk, to) = keep(|p| p.2);
    let (bm, tm) = (median(&bk), median(&tk));
    let (lo, hi) = bootstrap_median_ratio(&bk, &tk, c.confidence, 2000, 0);
    Some(Throughput {
        base_median_step_time_s: bm,
        test_median_step_time_s: tm,
        speedup: bm / tm,
        speedup_ci: [lo, hi],
        base_outlier_steps: bo,
        test_outlier_steps: to,
        steps_used: used.len(),
        outlier_rule: "modified z-score 0.6745·|x − median|/MAD > 3.5, per run",
    })
}
