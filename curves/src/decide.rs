//! The verdict of `moecheck curves diff` from the windowed statistics (step 6 of the criterion
//! in [`crate::diff`]): PASS, FAIL or INCONCLUSIVE, with the reasons and a suggestion.
//!
//! * **FAIL** needs evidence beyond what the noise could plausibly be: the mean gap's interval,
//!   the tail gap's, or some window's interval lies wholly outside ±δ_fail — δ with σ_seed at
//!   its upper confidence limit, so that seed noise underestimated from few seeds never makes
//!   two runs of the same code FAIL. A diverging window is a FAIL even when the curves meet
//!   again; the report names its steps.
//! * **PASS** needs the mean and tail intervals inside ±δ, no drift, and BASE finite at every
//!   common step (a half-NaN BASE was never compared there).
//! * **INCONCLUSIVE** otherwise, saying what would decide: more compared steps, more seeds
//!   (`n more seeds would decide` where the gap lies between δ and δ_fail), a longer run.

use crate::gap::{describe, outside};
use crate::report::{percent, Criterion, CurvesReport, DivergingWindow, Verdict, MIN_WINDOWS};
use crate::seed::seeds_to_decide;

/// `3, 7, 50–99`: sorted steps with runs of consecutive ones collapsed (at most 6 runs named).
pub fn ranges(steps: &[u64]) -> String {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &s in steps {
        match runs.last_mut() {
            Some(r) if r.1 + 1 == s => r.1 = s,
            _ => runs.push((s, s)),
        }
    }
    let mut parts: Vec<String> = runs
        .iter()
        .take(6)
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}–{b}")
            }
        })
        .collect();
    if runs.len() > 6 {
        parts.push(format!("… ({} runs)", runs.len()));
    }
    parts.join(", ")
}

/// Why BASE's non-finite steps keep the verdict from PASS, or None when it has none.
fn base_nonfinite_reason(r: &CurvesReport, pairs: &[(u64, f64, f64)]) -> Option<String> {
    let bad = &r.alignment.base_nonfinite_steps;
    if bad.is_empty() {
        return None;
    }
    let test_too = pairs
        .iter()
        .filter(|p| !p.1.is_finite() && !p.2.is_finite())
        .count();
    let both = if test_too == bad.len() {
        "; TEST is NaN/Inf there too: both runs diverged".to_string()
    } else if test_too > 0 {
        format!("; TEST is finite at {} of them", bad.len() - test_too)
    } else {
        "; TEST is finite there".into()
    };
    Some(format!(
        "BASE is NaN/Inf at steps {} ({} of the {} common steps{both}): those steps were never compared",
        ranges(bad),
        bad.len(),
        r.alignment.common_steps
    ))
}

/// Sets `verdict`, `reasons`, `suggestion` and `diverging_windows` of `r`; `windows` holds
/// every window's gap and interval (see the module doc for the rule).
pub fn decide(
    r: &mut CurvesReport,
    windows: &[DivergingWindow],
    pairs: &[(u64, f64, f64)],
    c: &Criterion,
) {
    if let Some(&first) = r.test_nonfinite_steps.first() {
        r.verdict = Verdict::Fail;
        r.reasons.push(format!(
            "TEST is NaN/Inf at step {first} ({} step(s) in all) where BASE is finite",
            r.test_nonfinite_steps.len()
        ));
        return;
    }
    if c.exact {
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        match pairs.iter().find(|p| !same(p.1, p.2)) {
            Some(&(step, b, t)) => {
                let n = pairs.iter().filter(|p| !same(p.1, p.2)).count();
                r.verdict = Verdict::Fail;
                r.first_exact_mismatch_step = Some(step);
                r.reasons.push(format!(
                    "exact: {n} of {} common steps differ; first at step {step}: BASE {b}, TEST {t}",
                    pairs.len()
                ));
            }
            None => {
                r.verdict = Verdict::Pass;
                r.reasons.push(format!(
                    "exact: all {} common steps are identical as logged (at the log's precision)",
                    pairs.len()
                ));
            }
        }
        return;
    }
    let base_bad = base_nonfinite_reason(r, pairs);
    let (Some(m), Some(g)) = (r.margin.clone(), r.gap.clone()) else {
        r.verdict = Verdict::Inconclusive;
        match base_bad {
            Some(why) => {
                r.reasons.push(why);
                r.reasons.push(format!(
                    "no step where BASE is finite is left to compare after the warm-up: BASE diverged from step {}",
                    r.alignment.base_nonfinite_steps[0]
                ));
                r.suggestion = Some(
                    "a curve must stay finite to be compared: rerun BASE so that it does not diverge (a lower learning rate, or fewer steps)".into(),
                );
            }
            None => {
                r.reasons
                    .push("no steps left to compare after the warm-up".into());
                r.suggestion = Some("log more steps, or lower --warmup".into());
            }
        }
        return;
    };
    if g.windows < MIN_WINDOWS {
        r.verdict = Verdict::Inconclusive;
        r.reasons.extend(base_bad);
        r.reasons.push(format!(
            "only {} window(s) of {} step(s) after the warm-up; the criterion needs {MIN_WINDOWS}",
            g.windows, g.window_steps
        ));
        // n common steps leave n − ceil(warmup·n) to compare; 3 windows need 3·W of them.
        let need = (MIN_WINDOWS * g.window_steps) as f64;
        let mut total = (need / (1.0 - c.warmup_frac)).ceil() as usize;
        while total - ((c.warmup_frac * total as f64).ceil() as usize) < need as usize {
            total += 1;
        }
        r.suggestion = Some(format!(
            "log at least {total} common steps (now {}), or use a smaller --window",
            r.alignment.common_steps
        ));
        return;
    }
    let (d, df) = (m.delta, m.delta_fail);
    let ci = format!("[{:+.4}, {:+.4}]", g.ci_low, g.ci_high);
    let conf = percent(g.level);
    let tail = format!("{:+.4} ± {:.4}", g.tail_mean, g.tail_half_width);
    let band = if df > d {
        format!("±δ_fail = ±{df:.4} (δ with σ_seed at its upper limit)")
    } else {
        format!("±δ = ±{d:.4}")
    };
    if g.ci_low > df || g.ci_high < -df {
        r.reasons.push(format!(
            "the {conf} interval of the mean gap {ci} lies outside {band}"
        ));
    }
    if g.tail_mean.abs() - g.tail_half_width > df {
        r.reasons.push(format!(
            "the tail gap {tail} (last {} window(s)) lies outside {band}",
            g.tail_windows
        ));
    }
    let diverging = outside(windows, df);
    if !diverging.is_empty() {
        r.reasons.push(format!(
            "the gap lies outside {band} in {} of {} windows ({} interval each): {}",
            diverging.len(),
            g.windows,
            percent(g.window_level),
            describe(windows, &diverging, 4)
        ));
    }
    r.diverging_windows = diverging;
    if !r.reasons.is_empty() {
        r.verdict = Verdict::Fail;
        r.notes.extend(base_bad);
        if r.sigma_seed.is_none() {
            r.notes.push(
                "no --baseline2: δ holds no seed-to-seed noise; baseline seeds tell whether a gap this size is ordinary run-to-run variation".into(),
            );
        }
        return;
    }
    let ci_inside = -d <= g.ci_low && g.ci_high <= d;
    let tail_inside = g.tail_mean.abs() + g.tail_half_width <= d;
    if ci_inside && tail_inside && !g.drifting && base_bad.is_none() {
        r.verdict = Verdict::Pass;
        r.reasons.push(format!(
            "the {conf} interval of the mean gap {ci} and the tail gap {tail} lie inside ±δ = ±{d:.4}, and the gap does not drift"
        ));
        return;
    }
    r.verdict = Verdict::Inconclusive;
    let mut advice = Vec::new();
    if let Some(why) = base_bad {
        r.reasons.push(why);
        advice.push("rerun BASE so that it stays finite over the whole run".into());
    }
    // What the intervals vouch for: the smallest |gap| each one that lies outside ±δ allows.
    let mut evidence: f64 = 0.0;
    if !ci_inside {
        let outside_d = g.ci_low > d || g.ci_high < -d;
        if outside_d {
            evidence = evidence.max(g.ci_low.abs().min(g.ci_high.abs()));
            r.reasons.push(format!(
                "the {conf} interval of the mean gap {ci} lies outside ±δ = ±{d:.4} but not outside {band}: seed noise estimated from so few seeds could be this large"
            ));
        } else {
            r.reasons.push(format!(
                "the {conf} interval of the mean gap {ci} straddles ±δ = ±{d:.4}"
            ));
            let half = 0.5 * (g.ci_high - g.ci_low);
            // Narrowing decides only against the band the mean would have to clear: ±δ for a
            // PASS, ±δ_fail for a FAIL (between the two, only more seeds decide).
            let (room, outcome) = if g.mean.abs() <= d {
                (d - g.mean.abs(), "fit inside ±δ (PASS)")
            } else {
                (g.mean.abs() - df, "clear ±δ_fail (FAIL)")
            };
            // The half width shrinks as 1/√(steps) at a fixed window size.
            let now = g.windows * g.window_steps;
            if room > 0.0 {
                let steps = ((half / room).powi(2) * now as f64).ceil() as u64;
                advice.push(format!(
                    "if the gap stays as it is, about {steps} compared steps (now {now}) would narrow the interval enough to {outcome}"
                ));
            }
        }
    }
    if !tail_inside {
        let beyond = g.tail_mean.abs() - g.tail_half_width;
        if beyond > d {
            evidence = evidence.max(beyond);
        }
        r.reasons
            .push(format!("the tail gap {tail} is not inside ±δ = ±{d:.4}"));
    }
    let beyond_d = outside(windows, d);
    if !beyond_d.is_empty() {
        for w in &beyond_d {
            evidence = evidence.max(w.interval[0].abs().min(w.interval[1].abs()));
        }
        r.reasons.push(format!(
            "the gap lies outside ±δ = ±{d:.4} but not outside ±δ_fail = ±{df:.4} in {} window(s): {}",
            beyond_d.len(),
            describe(windows, &beyond_d, 4)
        ));
    }
    if g.drifting {
        r.reasons.push(format!(
            "the gap drifts by {:+.4} over the compared steps ({:+.2e} per step, t = {:.1})",
            g.drift_over_compared_steps, g.slope_per_step, g.slope_t
        ));
        advice.push("run longer to see whether the drift leaves ±δ".into());
    }
    match &r.sigma_seed {
        Some(s) if evidence > d => {
            let share = (1.0 - s.level) / 2.0;
            let floor = m.rel_term.max(m.precision_term);
            match seeds_to_decide(s, c.k_seed, floor, evidence, share) {
                Some(n) => advice.push(format!(
                    "{n} more seed(s) would decide: σ_seed = {:.4} rests on {:.1} degree(s) of freedom (its {} interval [{:.4}, {:.4}]); with {n} more --baseline2 run(s), if σ_seed stays near its estimate, a gap this size would FAIL",
                    s.value, s.dof, percent(s.level), s.interval[0], s.interval[1]
                )),
                None => advice.push("the gap is within the seed noise's estimate itself: more seeds would not make it a FAIL".into()),
            }
        }
        Some(_) => {}
        None => advice.push(
            "give --baseline2 (BASE rerun with another seed; repeat it for several) so that δ reflects seed-to-seed noise"
                .into(),
        ),
    }
    if advice.is_empty() {
        advice.push("log more steps".into());
    }
    r.suggestion = Some(advice.join("; "));
}
