//! σ_seed, the seed-to-seed noise of the windowed gap, from BASE and its baselines (BASE rerun
//! with other seeds), with the uncertainty that few seeds leave.
//!
//! In window `i` the runs of the same code — BASE and the `n` baselines — have the mean values
//! `x_{0,i}, …, x_{n,i}` (taken relative to BASE's, so `x_{0,i} = 0`). Their sample variance
//! `s_i² = Σ_j (x_{j,i} − x̄_i)² / n` estimates the variance `σ_run²` of one run about the
//! code's expected curve; pooled over the windows it gives
//!
//! `σ_seed = √(2 · mean_i s_i²)`,
//!
//! the standard deviation of the gap *between two runs* — what TEST − BASE is when TEST is the
//! same code with another seed. With one baseline this is the RMS of the windowed
//! BASE2 − BASE gap, as before.
//!
//! **Degrees of freedom.** Each window gives `n` degrees of freedom, but a seed's effect is
//! persistent: a run that starts lower tends to stay lower, so neighbouring windows repeat
//! much of the same draw. The windows are counted as `m_eff = m (1 − ρ)/(1 + ρ)` independent
//! ones (at least 1), `ρ` the lag-1 autocorrelation of the runs' deviations `x_{j,i} − x̄_i`
//! from window to window, taken about zero and pooled over the runs (a constant offset, one
//! draw, gives `ρ ≈ 1`). `dof = n · m_eff`: one baseline whose gap to BASE is one smooth
//! offset is worth about one degree of freedom, and the interval says so.
//!
//! **Interval.** For normal gaps `dof · σ̂² / σ² ~ χ²_dof`, so `σ` lies in
//! `[σ̂ √(dof/χ²_{1−a/2}), σ̂ √(dof/χ²_{a/2})]` with confidence `1 − a`. With one degree of
//! freedom at 95% that is `[0.45 σ̂, 31.9 σ̂]`.

use crate::report::SigmaSeed;
use crate::series::Series;
use crate::stats::{chi2_quantile, effective_count, lag1_about_zero, mean, sd_interval};

/// σ_seed over `windows` (each a slice of compared `(step, base, test)`) from `baselines`;
/// `share` is the error rate of its upper limit (the interval is two-sided at `1 − 2·share`).
/// None without baselines or when no window holds a finite baseline value.
pub fn sigma_seed(
    windows: &[&[(u64, f64, f64)]],
    baselines: &[Series],
    share: f64,
) -> Option<SigmaSeed> {
    if baselines.is_empty() {
        return None;
    }
    // Per window: each baseline's mean of (BASE2 − BASE) over the window's steps where it is
    // finite, or None where it has none.
    let x: Vec<Vec<Option<f64>>> = windows
        .iter()
        .map(|win| {
            baselines
                .iter()
                .map(|b| {
                    let d: Vec<f64> = win
                        .iter()
                        .filter_map(|p| {
                            b.values
                                .get(&p.0)
                                .filter(|v| v.is_finite())
                                .map(|v| v - p.1)
                        })
                        .collect();
                    (!d.is_empty()).then(|| mean(&d))
                })
                .collect()
        })
        .collect();
    let (mut ss, mut df) = (0.0, 0usize);
    // Deviations from the window's mean, per run (BASE first), for the autocorrelation; a
    // window where a baseline is missing breaks that run's series with a 0.
    let mut dev: Vec<Vec<f64>> = vec![Vec::new(); baselines.len() + 1];
    let mut used = 0;
    for row in &x {
        let vals: Vec<f64> = std::iter::once(0.0)
            .chain(row.iter().flatten().copied())
            .collect();
        if vals.len() < 2 {
            continue;
        }
        used += 1;
        let xbar = mean(&vals);
        ss += vals.iter().map(|v| (v - xbar).powi(2)).sum::<f64>();
        df += vals.len() - 1;
        dev[0].push(-xbar);
        for (j, v) in row.iter().enumerate() {
            dev[j + 1].push(v.map_or(0.0, |v| v - xbar));
        }
    }
    if df == 0 {
        return None;
    }
    let value = (2.0 * ss / df as f64).sqrt();
    let lag1 = lag1_about_zero(&dev);
    let effective_windows = effective_count(used, lag1);
    let dof = baselines.len() as f64 * effective_windows;
    let level = 1.0 - 2.0 * share;
    Some(SigmaSeed {
        value,
        interval: sd_interval(value, dof, level),
        level,
        dof,
        baselines: baselines.len(),
        windows: used,
        lag1,
        effective_windows,
    })
}

/// The upper `1 − share` confidence limit of σ estimated as `s` with `dof` degrees of freedom:
/// `s √(dof / χ²_{share, dof})`.
pub fn upper_limit(s: f64, dof: f64, share: f64) -> f64 {
    s * (dof / chi2_quantile(share, dof)).sqrt()
}

/// How many more baselines would make the FAIL band `max(floor, k · upper limit of σ_seed)`
/// narrower than `evidence` (the smallest |gap| the intervals vouch for), if σ_seed stayed at
/// its estimate and each new seed brought as many effective windows as the given ones. None
/// when even 1000 more would not (the gap is within the seed noise itself).
pub fn seeds_to_decide(
    s: &SigmaSeed,
    k: f64,
    floor: f64,
    evidence: f64,
    share: f64,
) -> Option<usize> {
    if floor >= evidence {
        return None;
    }
    (1..=1000).find(|more| {
        let dof = (s.baselines + more) as f64 * s.effective_windows;
        k * upper_limit(s.value, dof, share) < evidence
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn series(values: &[(u64, f64)]) -> Series {
        Series {
            values: values.iter().copied().collect(),
            quanta: BTreeMap::new(),
            duplicate_steps: Vec::new(),
            restarts: 0,
            precision: 0.0,
        }
    }

    /// Two windows of two steps, BASE at 0; baselines offset by hand-picked amounts.
    #[test]
    fn sigma_seed_by_hand() {
        let eval = [(0, 0.0, 0.0), (1, 0.0, 0.0), (2, 0.0, 0.0), (3, 0.0, 0.0)];
        let windows: Vec<&[(u64, f64, f64)]> = eval.chunks(2).collect();
        // One baseline 0.1 above, then 0.1 below: σ_seed is its RMS, 0.1; the deviations
        // ±0.05 alternate (lag-1 −1, read as 0), so both windows count: dof 2.
        let b = series(&[(0, 0.1), (1, 0.1), (2, -0.1), (3, -0.1)]);
        let s = sigma_seed(&windows, &[b], 0.0125).unwrap();
        assert!((s.value - 0.1).abs() < 1e-15);
        assert_eq!((s.lag1, s.effective_windows, s.dof), (0.0, 2.0, 2.0));
        // Two baselines at +0.1 and +0.3 in both windows: the three runs 0, 0.1, 0.3 deviate
        // from their mean 2/15 by −2/15, −1/30, 1/6, squares summing to 42/900 = 14/300 over
        // 2 degrees of freedom, so σ_seed² = 2 · 7/300. A constant offset is one draw per run:
        // lag-1 1/2 over two windows, which are worth 2·(1/2)/(3/2) = 2/3, clamped to 1.
        let b1 = series(&[(0, 0.1), (1, 0.1), (2, 0.1), (3, 0.1)]);
        let b2 = series(&[(0, 0.3), (1, 0.3), (2, 0.3), (3, 0.3)]);
        let s = sigma_seed(&windows, &[b1, b2], 0.0125).unwrap();
        assert!(
            (s.value - (14.0f64 / 300.0).sqrt()).abs() < 1e-15,
            "{}",
            s.value
        );
        // (a·a)/(a² + a²) in f64: one rounding of each product and sum.
        assert!((s.lag1 - 0.5).abs() < 4.0 * f64::EPSILON, "{}", s.lag1);
        assert_eq!(s.effective_windows, 1.0);
        assert_eq!(s.dof, 2.0);
        // Two degrees of freedom: χ²_{0.0125} = −2 ln(1 − 0.0125) exactly.
        let chi = -2.0 * (1.0f64 - 0.0125).ln();
        assert!((s.interval[1] - s.value * (2.0 / chi).sqrt()).abs() < 1e-9);
        assert_eq!(s.level, 0.975);
        assert!(sigma_seed(&windows, &[], 0.0125).is_none());
    }

    #[test]
    fn more_seeds_narrow_the_upper_limit() {
        let s = SigmaSeed {
            value: 0.01,
            interval: [0.0, 0.0],
            level: 0.975,
            dof: 1.0,
            baselines: 1,
            windows: 10,
            lag1: 0.9,
            effective_windows: 1.0,
        };
        // One degree of freedom: the upper 98.75% limit is 0.01·√(1/χ²_{0.0125,1}) =
        // 0.01·√(1/0.00024546) = 0.638. A gap of 0.1 needs 3·limit < 0.1, i.e.
        // √(n/χ²_{0.0125,n}) < 3.333: n = 4 gives √(4/0.33421) = 3.4595, n = 5 gives
        // √(5/0.61087) = 2.8609 (quantiles from scipy.stats.chi2.ppf), so 4 more seeds.
        assert!((upper_limit(0.01, 1.0, 0.0125) - 0.638_28).abs() < 1e-5);
        assert!((upper_limit(0.01, 4.0, 0.0125) - 0.034_595).abs() < 1e-6);
        assert!((upper_limit(0.01, 5.0, 0.0125) - 0.028_609).abs() < 1e-6);
        assert_eq!(seeds_to_decide(&s, 3.0, 0.002, 0.1, 0.0125), Some(4));
        assert_eq!(seeds_to_decide(&s, 3.0, 0.2, 0.1, 0.0125), None);
        assert_eq!(seeds_to_decide(&s, 3.0, 0.002, 0.02, 0.0125), None);
    }
}
