//! The verdict of `moecheck curves diff` from the windowed statistics, and the readable table.

use std::fmt::Write as _;

use super::diff::{Criterion, CurvesReport, MIN_WINDOWS};

/// Sets `verdict`, `reasons` and `suggestion` of `r` (see [`super::diff`] for the rule).
pub fn decide(r: &mut CurvesReport, pairs: &[(u64, f64, f64)], c: &Criterion) {
    if let Some(&first) = r.test_nonfinite_steps.first() {
        r.verdict = "fail";
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
                r.verdict = "fail";
                r.first_exact_mismatch_step = Some(step);
                r.reasons.push(format!(
                    "exact: {n} of {} common steps differ; first at step {step}: BASE {b}, TEST {t}",
                    pairs.len()
                ));
            }
            None => {
                r.verdict = "pass";
                r.reasons.push(format!(
                    "exact: all {} common steps are identical as logged (at the log's precision)",
                    pairs.len()
                ));
            }
        }
        return;
    }
    let (Some(m), Some(g)) = (r.margin.clone(), r.gap.clone()) else {
        r.verdict = "inconclusive";
        r.reasons
            .push("no steps left to compare after the warm-up".into());
        r.suggestion = Some("log more steps, or lower --warmup".into());
        return;
    };
    let d = m.delta;
    if g.windows < MIN_WINDOWS {
        r.verdict = "inconclusive";
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
    let conf = super::diff::interval_level(c.confidence) * 100.0;
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
        r.verdict = "fail";
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
        r.verdict = "pass";
        r.reasons.push(format!(
            "the {conf}% interval of the mean gap {ci} and the tail gap {tail} lie inside ±δ = ±{d:.4}, and the gap does not drift"
        ));
        return;
    }
    r.verdict = "inconclusive";
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

fn fmt_steps(steps: &[u64]) -> String {
    match steps.len() {
        0 => "none".into(),
        n if n <= 8 => steps
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        n => format!(
            "{} … ({n} steps)",
            steps[..6]
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The readable report.
pub fn render(r: &CurvesReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "moecheck curves diff — metric: {}", r.metric);
    for (name, i) in [
        ("BASE", Some(&r.base)),
        ("TEST", Some(&r.test)),
        ("BASE2", r.baseline2.as_ref()),
    ] {
        if let Some(i) = i {
            let _ = writeln!(
                s,
                "  {name:<5} {} ({}; {} steps; logging precision {:.1e}; metrics: {})",
                i.path,
                i.format,
                i.steps,
                i.logging_precision,
                i.metrics_found.join(", ")
            );
        }
    }
    let a = &r.alignment;
    let _ = writeln!(s);
    let row = |s: &mut String, k: &str, v: String| {
        let _ = writeln!(s, "  {k:<28} {v}");
    };
    row(&mut s, "common steps", a.common_steps.to_string());
    row(
        &mut s,
        "only in BASE / only in TEST",
        format!(
            "{} / {}",
            fmt_steps(&a.only_in_base),
            fmt_steps(&a.only_in_test)
        ),
    );
    if !a.base_nonfinite_steps.is_empty() {
        row(
            &mut s,
            "BASE not finite (dropped)",
            fmt_steps(&a.base_nonfinite_steps),
        );
    }
    if !r.test_nonfinite_steps.is_empty() {
        row(
            &mut s,
            "TEST NaN/Inf (BASE finite)",
            fmt_steps(&r.test_nonfinite_steps),
        );
    }
    let range = match (a.first_compared_step, a.last_compared_step) {
        (Some(f), Some(l)) => format!(
            "{} (steps {f}..={l}; warm-up {} skipped)",
            a.steps_compared, a.warmup_steps
        ),
        _ => format!("0 (warm-up {} skipped)", a.warmup_steps),
    };
    row(&mut s, "steps compared", range);
    if let (Some(m), Some(g)) = (&r.margin, &r.gap) {
        row(
            &mut s,
            "windows",
            format!("{} of {} step(s)", g.windows, g.window_steps),
        );
        row(&mut s, "mean BASE value", format!("{:.4}", m.mean_base));
        let seed = m.sigma_seed.map_or("no second seed".to_string(), |x| {
            format!("{:.4} (σ_seed {x:.4})", m.seed_term.unwrap_or(0.0))
        });
        row(
            &mut s,
            "δ",
            format!(
                "{:.4}  set by {} [rel {:.4}; seed {seed}; 2·precision {:.4}]",
                m.delta, m.set_by, m.rel_term, m.precision_term
            ),
        );
        row(
            &mut s,
            "mean gap (TEST − BASE)",
            format!(
                "{:+.4}  {}% CI [{:+.4}, {:+.4}]",
                g.mean,
                super::diff::interval_level(r.criterion.confidence) * 100.0,
                g.ci_low,
                g.ci_high
            ),
        );
        row(
            &mut s,
            "max |gap|",
            format!("{:.4} at step {}", g.max_abs, g.max_abs_step),
        );
        row(
            &mut s,
            "tail gap",
            format!(
                "{:+.4} ± {:.4} (last {} window(s))",
                g.tail_mean, g.tail_half_width, g.tail_windows
            ),
        );
        row(
            &mut s,
            "drift",
            format!(
                "{:+.4} over the compared steps (t = {:.1}){}",
                g.drift_over_compared_steps,
                g.slope_t,
                if g.drifting { ", drifting" } else { "" }
            ),
        );
    }
    if let Some(step) = r.first_exact_mismatch_step {
        row(&mut s, "first exact mismatch", format!("step {step}"));
    }
    if let Some(t) = &r.throughput {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  throughput ({} steps after warm-up; outliers: {})",
            t.steps_used, t.outlier_rule
        );
        row(
            &mut s,
            "median step time BASE",
            format!(
                "{:.4} s (outliers at steps {})",
                t.base_median_step_time_s,
                fmt_steps(&t.base_outlier_steps)
            ),
        );
        row(
            &mut s,
            "median step time TEST",
            format!(
                "{:.4} s (outliers at steps {})",
                t.test_median_step_time_s,
                fmt_steps(&t.test_outlier_steps)
            ),
        );
        row(
            &mut s,
            "speed-up (BASE/TEST)",
            format!(
                "{:.3}x  {:.0}% CI [{:.3}, {:.3}]",
                t.speedup,
                r.criterion.confidence * 100.0,
                t.speedup_ci[0],
                t.speedup_ci[1]
            ),
        );
    }
    let _ = writeln!(s);
    for n in &r.notes {
        let _ = writeln!(s, "  note: {n}");
    }
    let _ = writeln!(s, "verdict: {}", r.verdict.to_uppercase());
    for why in &r.reasons {
        let _ = writeln!(s, "  because {why}");
    }
    if let Some(sug) = &r.suggestion {
        let _ = writeln!(s, "  suggestion: {sug}");
    }
    s
}
