//! The readable table of `moecheck curves diff`: the inputs, alignment, δ, the gap statistics,
//! throughput, notes, and the verdict with its reasons and suggestion.

use std::fmt::Write as _;

use crate::report::{percent, CurvesReport};

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

/// The readable report, as `moecheck curves diff` prints it without `--json`.
pub fn text(r: &CurvesReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "moecheck curves diff — metric: {}", r.metric);
    let inputs = [("BASE", &r.base), ("TEST", &r.test)]
        .into_iter()
        .chain(r.baseline2.iter().map(|b| ("BASE2", b)));
    for (name, i) in inputs {
        {
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
        let seed = m.seed_term.map_or("no baseline seed".to_string(), |x| {
            format!("k·σ_seed {x:.4}")
        });
        row(
            &mut s,
            "δ",
            format!(
                "{:.4}  set by {} [rel {:.4}; {seed}; 2·precision {:.4}]",
                m.delta, m.set_by, m.rel_term, m.precision_term
            ),
        );
        if let Some(x) = &r.sigma_seed {
            row(
                &mut s,
                "σ_seed",
                format!(
                    "{:.4}  {} CI [{:.4}, {:.4}], {:.1} dof ({} baseline(s) × {:.1} effective of {} windows; lag-1 {:.2})",
                    x.value,
                    percent(x.level),
                    x.interval[0],
                    x.interval[1],
                    x.dof,
                    x.baselines,
                    x.effective_windows,
                    x.windows,
                    x.lag1
                ),
            );
            row(
                &mut s,
                "δ_fail",
                format!(
                    "{:.4}  (k · σ_seed's upper limit {:.4}: a FAIL must clear it)",
                    m.delta_fail,
                    m.seed_term_upper.unwrap_or(0.0)
                ),
            );
        }
        row(
            &mut s,
            "mean gap (TEST − BASE)",
            format!(
                "{:+.4}  {} CI [{:+.4}, {:+.4}]",
                g.mean,
                percent(g.level),
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
    for w in &r.diverging_windows {
        row(
            &mut s,
            "diverging window",
            format!(
                "steps {}–{}: gap {:+.4}, CI [{:+.4}, {:+.4}]",
                w.steps[0], w.steps[1], w.gap, w.interval[0], w.interval[1]
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
    let _ = writeln!(s, "verdict: {}", r.verdict.label());
    for why in &r.reasons {
        let _ = writeln!(s, "  because {why}");
    }
    if let Some(sug) = &r.suggestion {
        let _ = writeln!(s, "  suggestion: {sug}");
    }
    s
}
