//! The verdict of `moecheck curves diff` from the windowed statistics (step 6 of the criterion
//! in [`crate::diff`]): PASS, FAIL or INCONCLUSIVE, with the reasons and a suggestion.

use crate::report::{interval_level, Criterion, CurvesReport, Verdict, MIN_WINDOWS};

/// Sets `verdict`, `reasons` and `suggestion` of `r` (see [`crate::diff`] for the rule).
pub fn decide(r: &mut CurvesReport, pairs: &[(u64, f64, f64)], c: &Criterion) {
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
    let (Some(m), Some(g)) = (r.margin.clone(), r.gap.clone()) else {
        r.verdict = Verdict::Inconclusive;
        r.reasons
            .push("no steps left to compare after the warm-up".into());
        r.suggestion = Some("log more steps, or lower --warmup".into());
        return;
    };
    let d = m.delta;
    if g.windows < MIN_WINDOWS {
        r.verdict = Verdict::Inconclusive;
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
    let ci = format!("[{:+.4}, {:+.4}]", g.ci_low, g.ci_high);
    // Each interval's level (the pair is a joint `confidence` statement).
    let conf = interval_level(c.confidence) * 100.0;
    let tail = format!("{:+.4} ± {:.4}", g.tail_mean, g.tail_half_width);
    if g.ci_low > d || g.ci_high < -d {
        r.reasons.push(format!(
            "the {conf}% interval of the mean gap {ci} lies outside ±δ = ±{d:.4}"
        ));
    }
    if g.tail_mean.abs() - g.tail_half_width > d {
        r.reasons.push(format!(
            "the tail gap {tail} (last {} window(s)) exceeds δ = {d:.4}",
            g.tail_windows
        ));
    }
    if !r.reasons.is_empty() {
        r.verdict = Verdict::Fail;
        if m.sigma_seed.is_none() {
            r.notes.push(
                "no --baseline2: δ holds no seed-to-seed noise; a second baseline seed tells whether a gap this size is ordinary run-to-run variation".into(),
            );
        }
        return;
    }
    let ci_inside = -d <= g.ci_low && g.ci_high <= d;
    let tail_inside = g.tail_mean.abs() + g.tail_half_width <= d;
    if ci_inside && tail_inside && !g.drifting {
        r.verdict = Verdict::Pass;
        r.reasons.push(format!(
            "the {conf}% interval of the mean gap {ci} and the tail gap {tail} lie inside ±δ = ±{d:.4}, and the gap does not drift"
        ));
        return;
    }
    r.verdict = Verdict::Inconclusive;
    let mut advice = Vec::new();
    if !ci_inside {
        r.reasons.push(format!(
            "the {conf}% interval of the mean gap {ci} straddles ±δ = ±{d:.4}"
        ));
        let half = 0.5 * (g.ci_high - g.ci_low);
        let room = d - g.mean.abs();
        // The half width shrinks as 1/√(steps) at a fixed window size.
        let now = g.windows * g.window_steps;
        if room.abs() > 0.0 {
            let steps = ((half / room.abs()).powi(2) * now as f64).ceil() as u64;
            let outcome = if room > 0.0 {
                "fit inside ±δ (PASS)"
            } else {
                "clear ±δ (FAIL)"
            };
            advice.push(format!(
                "if the gap stays as it is, about {steps} compared steps (now {now}) would narrow the interval enough to {outcome}"
            ));
        }
    }
    if !tail_inside {
        r.reasons
            .push(format!("the tail gap {tail} straddles δ = {d:.4}"));
    }
    if g.drifting {
        r.reasons.push(format!(
            "the gap drifts by {:+.4} over the compared steps ({:+.2e} per step, t = {:.1})",
            g.drift_over_compared_steps, g.slope_per_step, g.slope_t
        ));
        advice.push("run longer to see whether the drift leaves ±δ".into());
    }
    if m.sigma_seed.is_none() {
        advice.push(
            "give --baseline2 (BASE rerun with another seed) so that δ reflects seed-to-seed noise"
                .into(),
        );
    }
    if advice.is_empty() {
        advice.push("log more steps".into());
    }
    r.suggestion = Some(advice.join("; "));
}
