//! `moecheck curves diff`: is TEST's curve the same as BASE's, within a margin that is
//! justified by the loss scale, seed-to-seed noise and logging precision?
//!
//! The criterion (docs/curves.md gives it as a statistician would read it):
//! 1. Align the runs on the steps both logged (a step logged twice — a restart — keeps its last
//!    value). A non-finite TEST value where BASE is finite is an immediate FAIL; steps where
//!    BASE is not finite are not compared, and a PASS is withheld while there are any.
//! 2. Skip the first `ceil(warmup_frac · n)` common steps.
//! 3. Split the rest, from the end, into `m` non-overlapping windows of `W` steps and average
//!    the paired gap `test − base` in each: `g_1..g_m`.
//! 4. `δ = max(rel · |mean base loss|, k · σ_seed, 2 · logging precision)`, σ_seed from BASE
//!    and every baseline seed with its chi-square interval ([`crate::seed`]); `δ_fail` is δ
//!    with σ_seed at its upper limit.
//! 5. The mean gap's interval, the tail gap's, each window's, and the drift
//!    ([`crate::gap`], which also states the error budget).
//! 6. FAIL when the mean gap's, the tail's or any window's interval lies outside ±δ_fail;
//!    PASS when the mean and tail intervals lie inside ±δ, the gap does not drift and BASE is
//!    finite throughout; otherwise INCONCLUSIVE, with a concrete suggestion ([`crate::decide`]).
//!
//! [`crate::render`] prints the report that results.

use crate::decide::decide;
use crate::gap::windowed;
use crate::stats::{bootstrap_median_ratio, mad_outliers, median};
use crate::{Curve, CurveError, Metric};

pub use crate::series::{pair_precision, Series};

pub use crate::report::{
    interval_level, Alignment, Criterion, CurvesReport, Diff, DivergingWindow, GapStats,
    InputSummary, Margin, SigmaSeed, Throughput, Verdict, FAIL_STATEMENTS, MIN_WINDOWS,
    TARGET_WINDOWS,
};

/// Compares `test` against `base` on `metric`; `baselines` are BASE rerun with other seeds
/// (`--baseline2`, any number), whose spread gives σ_seed.
pub fn diff(
    base: &Curve,
    test: &Curve,
    baselines: &[Curve],
    metric: Metric,
    c: &Criterion,
) -> Result<Diff, CurveError> {
    let bs = Series::of(base, metric)?;
    let ts = Series::of(test, metric)?;
    let b2s = baselines
        .iter()
        .map(|b| Series::of(b, metric))
        .collect::<Result<Vec<_>, _>>()?;
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
    let named = [("BASE", base), ("TEST", test)]
        .into_iter()
        .chain(baselines.iter().map(|b| ("BASE2", b)));
    for (name, curve) in named {
        for w in &curve.warnings {
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
        baseline2: baselines
            .iter()
            .zip(&b2s)
            .map(|(c, s)| InputSummary::new(c, s, &compared))
            .collect(),
        criterion: c.clone(),
        alignment,
        test_nonfinite_steps: test_nonfinite.clone(),
        first_exact_mismatch_step: None,
        margin: None,
        sigma_seed: None,
        gap: None,
        diverging_windows: Vec::new(),
        throughput: throughput(base, test, c),
    };
    let w = windowed(eval, &bs, &ts, &b2s, c);
    report.margin = w.margin;
    report.sigma_seed = w.sigma_seed;
    report.gap = w.gap;
    decide(&mut report, &w.windows, &pairs, c);
    Ok(Diff { report, pairs })
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
