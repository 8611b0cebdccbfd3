//! The `--json` document of `moecheck curves diff` ([`CurvesReport`]) and everything in it:
//! the [`Criterion`] and its constants, the inputs, the alignment, the margin δ, the windowed
//! gap statistics and the throughput. Plain data: [`crate::diff`] fills it in,
//! [`crate::decide`] sets its verdict, [`crate::render`] prints it.

use serde::Serialize;

/// Every threshold of the criterion, with the defaults documented in docs/curves.md.
#[derive(Debug, Clone, Serialize)]
pub struct Criterion {
    pub warmup_frac: f64,
    /// Steps per window; `None` picks `max(1, n_eval / 10)`.
    pub window_steps: Option<usize>,
    pub rel: f64,
    pub k_seed: f64,
    pub confidence: f64,
    pub tail_frac: f64,
    pub drift_frac: f64,
    pub exact: bool,
}

impl Default for Criterion {
    fn default() -> Self {
        Criterion {
            warmup_frac: 0.1,
            window_steps: None,
            rel: 0.001,
            k_seed: 3.0,
            confidence: 0.95,
            tail_frac: 0.2,
            drift_frac: 0.5,
            exact: false,
        }
    }
}

/// Windows needed for an interval, a slope and its residual spread.
pub const MIN_WINDOWS: usize = 3;
/// Windows `--window` aims for when not given.
pub const TARGET_WINDOWS: usize = 10;

/// Statements that can raise a FAIL without a baseline seed: the mean gap's interval, the
/// tail gap's, and the family of per-window intervals.
pub const FAIL_STATEMENTS: usize = 3;

/// A level as a percentage with at most three decimals and no trailing zeros: `98.333%`,
/// `98.75%`, `97.5%`.
pub fn percent(level: f64) -> String {
    let s = format!("{:.3}", level * 100.0);
    format!("{}%", s.trim_end_matches('0').trim_end_matches('.'))
}

/// Level of each of the `shares` statements that can raise a FAIL, for a joint confidence
/// `conf` (Bonferroni: each takes `(1 − conf)/shares` of the error rate). `shares` is
/// [`FAIL_STATEMENTS`], plus one for σ_seed's upper limit when baselines are given.
pub fn interval_level(conf: f64, shares: usize) -> f64 {
    1.0 - (1.0 - conf) / shares as f64
}

#[derive(Debug, Clone, Serialize)]
pub struct InputSummary {
    pub path: String,
    pub format: String,
    pub metrics_found: Vec<&'static str>,
    pub steps: usize,
    pub logging_precision: f64,
    pub duplicate_steps: Vec<u64>,
    pub restarts: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Alignment {
    pub common_steps: usize,
    pub only_in_base: Vec<u64>,
    pub only_in_test: Vec<u64>,
    /// Steps dropped because BASE is not finite there.
    pub base_nonfinite_steps: Vec<u64>,
    pub warmup_steps: usize,
    pub steps_compared: usize,
    pub first_compared_step: Option<u64>,
    pub last_compared_step: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Margin {
    /// `max(rel_term, seed_term, precision_term)`: the band a PASS must lie inside.
    pub delta: f64,
    /// Which term set δ: `"rel"`, `"seed"` or `"precision"`.
    pub set_by: &'static str,
    /// δ with σ_seed at its upper confidence limit (`k · sigma_seed.interval[1]`): the band a
    /// FAIL must lie outside, so that seed noise underestimated from few seeds raises no FAIL.
    /// Equal to `delta` without baselines.
    pub delta_fail: f64,
    pub mean_base: f64,
    pub rel_term: f64,
    /// `k · σ_seed` (point estimate).
    pub seed_term: Option<f64>,
    /// `k ·` σ_seed's upper confidence limit.
    pub seed_term_upper: Option<f64>,
    pub precision_term: f64,
}

/// The seed-to-seed noise σ_seed: the standard deviation of the windowed gap between two runs
/// of the same code that differ only in their seed, estimated from BASE and every baseline.
#[derive(Debug, Clone, Serialize)]
pub struct SigmaSeed {
    pub value: f64,
    /// Two-sided chi-square interval `[value·√(dof/χ²_{1−a/2}), value·√(dof/χ²_{a/2})]` at
    /// `level`, whose upper end is a one-sided `1 − a/2` limit (one FAIL statement's share).
    pub interval: [f64; 2],
    pub level: f64,
    /// Degrees of freedom: `baselines · effective_windows`.
    pub dof: f64,
    pub baselines: usize,
    /// Windows in which some baseline was finite.
    pub windows: usize,
    /// Lag-1 autocorrelation of the seed gaps from one window to the next (pooled over runs).
    pub lag1: f64,
    /// What the windows are worth as independent draws: `windows · (1 − lag1)/(1 + lag1)`,
    /// at least 1.
    pub effective_windows: f64,
}

/// A window whose gap lies outside ±`delta_fail` with confidence (its interval, at the
/// Bonferroni level of [`GapStats::window_level`], does not reach the band).
#[derive(Debug, Clone, Serialize)]
pub struct DivergingWindow {
    /// First and last step of the window.
    pub steps: [u64; 2],
    /// Mean gap TEST − BASE over the window.
    pub gap: f64,
    pub interval: [f64; 2],
}

#[derive(Debug, Clone, Serialize)]
pub struct GapStats {
    pub window_steps: usize,
    pub windows: usize,
    /// Level of the mean-gap and tail-gap intervals ([`interval_level`]).
    pub level: f64,
    /// Level of each window's interval: `1 − (1 − level)/windows` (Bonferroni over windows).
    pub window_level: f64,
    /// Lag-1 autocorrelation of the per-step gaps about their window means (pooled); each
    /// window's interval counts its steps as `W (1 − ρ)/(1 + ρ)` independent ones.
    pub step_lag1: f64,
    pub mean: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub max_abs: f64,
    pub max_abs_step: u64,
    pub tail_windows: usize,
    pub tail_mean: f64,
    pub tail_half_width: f64,
    pub slope_per_step: f64,
    pub slope_t: f64,
    pub drift_over_compared_steps: f64,
    pub drifting: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub base_median_step_time_s: f64,
    pub test_median_step_time_s: f64,
    /// `base median / test median`: above 1 means TEST is faster.
    pub speedup: f64,
    pub speedup_ci: [f64; 2],
    pub base_outlier_steps: Vec<u64>,
    pub test_outlier_steps: Vec<u64>,
    pub steps_used: usize,
    pub outlier_rule: &'static str,
}

/// The outcome of the criterion; the exit status of `moecheck curves diff` is 0, 1 or 3.
/// Serialised in lowercase (`"pass"`), printed in uppercase (`verdict: PASS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    Inconclusive,
}

impl Verdict {
    /// The name as the JSON report writes it: `pass`, `fail`, `inconclusive`.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Inconclusive => "inconclusive",
        }
    }

    /// The name as the table and the plot print it: `PASS`, `FAIL`, `INCONCLUSIVE`.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Inconclusive => "INCONCLUSIVE",
        }
    }
}

/// The `--json` document of `moecheck curves diff`.
#[derive(Debug, Clone, Serialize)]
pub struct CurvesReport {
    pub verdict: Verdict,
    pub reasons: Vec<String>,
    pub suggestion: Option<String>,
    pub notes: Vec<String>,
    pub metric: &'static str,
    pub base: InputSummary,
    pub test: InputSummary,
    /// Every `--baseline2` (BASE rerun with another seed), in the order given.
    pub baseline2: Vec<InputSummary>,
    pub criterion: Criterion,
    pub alignment: Alignment,
    /// Steps where TEST is NaN/Inf and BASE is finite.
    pub test_nonfinite_steps: Vec<u64>,
    pub first_exact_mismatch_step: Option<u64>,
    pub margin: Option<Margin>,
    /// Present when baselines were given and some window holds their values.
    pub sigma_seed: Option<SigmaSeed>,
    pub gap: Option<GapStats>,
    /// Windows whose gap lies outside ±δ_fail with confidence (a FAIL, even if the curves
    /// meet again).
    pub diverging_windows: Vec<DivergingWindow>,
    pub throughput: Option<Throughput>,
}

/// The report, and what the plot needs besides it: every common step `(step, base, test)`
/// in step order, non-finite values included.
#[derive(Debug, Clone)]
pub struct Diff {
    pub report: CurvesReport,
    pub pairs: Vec<(u64, f64, f64)>,
}

#[cfg(test)]
mod tests {
    use super::{percent, Verdict};

    #[test]
    fn percent_trims_trailing_zeros() {
        assert_eq!(percent(1.0 - 0.05 / 3.0), "98.333%");
        assert_eq!(percent(0.9875), "98.75%");
        assert_eq!(percent(0.975), "97.5%");
        assert_eq!(percent(0.95), "95%");
    }

    /// The JSON report writes the verdict in lowercase and the table prints it in uppercase,
    /// as they did when the verdict was a string.
    #[test]
    fn verdict_serialises_lowercase_and_prints_uppercase() {
        for v in [Verdict::Pass, Verdict::Fail, Verdict::Inconclusive] {
            assert_eq!(serde_json::to_value(v).unwrap(), v.name());
            assert_eq!(v.label(), v.name().to_uppercase());
        }
        assert_eq!(Verdict::Inconclusive.name(), "inconclusive");
    }
}
