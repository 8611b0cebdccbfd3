//! The small statistics the curve criterion needs, written plainly in f64: mean, sample
//! standard deviation, median, MAD outlier rejection, Student-t and chi-square quantiles, the
//! confidence interval of a standard deviation, lag-1 autocorrelation and the effective count
//! it leaves, least-squares slope, and a seeded percentile bootstrap.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Arithmetic mean; NaN for an empty slice.
pub fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

/// Sample standard deviation (divisor `n - 1`); 0 for fewer than two values.
pub fn sd(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return 0.0;
    }
    let m = mean(x);
    (x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (x.len() - 1) as f64).sqrt()
}

/// Median (mean of the two middle values for even lengths); NaN for an empty slice.
pub fn median(x: &[f64]) -> f64 {
    if x.is_empty() {
        return f64::NAN;
    }
    let mut v = x.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// The upper median: the middle value of the sorted slice, the larger of the two middle ones
/// for an even length (so a tie between two values goes to the larger); NaN for an empty
/// slice. Always one of the values, unlike [`median`].
pub fn upper_median(x: &[f64]) -> f64 {
    let mut v = x.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Threshold of the modified z-score above which a value is an outlier (Iglewicz and Hoaglin,
/// 1993): `|0.6745 (x - median) / MAD| > 3.5`.
pub const MAD_Z_LIMIT: f64 = 3.5;

/// Indices of outliers by the modified z-score `0.6745 |x - median| / MAD > 3.5`, where MAD is
/// the median absolute deviation. When MAD is 0 (half the values identical), any value that
/// differs from the median by more than 1e-9 relative is an outlier.
pub fn mad_outliers(x: &[f64]) -> Vec<usize> {
    let med = median(x);
    let dev: Vec<f64> = x.iter().map(|v| (v - med).abs()).collect();
    let mad = median(&dev);
    (0..x.len())
        .filter(|&i| {
            if mad > 0.0 {
                0.6745 * dev[i] / mad > MAD_Z_LIMIT
            } else {
                dev[i] > 1e-9 * med.abs()
            }
        })
        .collect()
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, n = 9; relative error below 1e-13).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let mut a = C[0];
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularised incomplete beta `I_x(a, b)` by its continued fraction (modified Lentz).
fn inc_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - inc_beta(1.0 - x, b, a);
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp() / a;
    let tiny = 1e-300;
    let (mut c, mut d) = (1.0, 1.0 - (a + b) * x / (a + 1.0));
    d = 1.0 / if d.abs() < tiny { tiny } else { d };
    let mut f = d;
    for m in 1..300 {
        let m = m as f64;
        for num in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + num * d;
            d = 1.0 / if d.abs() < tiny { tiny } else { d };
            c = 1.0 + num / c;
            if c.abs() < tiny {
                c = tiny;
            }
            f *= c * d;
        }
        if (c * d - 1.0).abs() < 1e-15 {
            break;
        }
    }
    front * f
}

/// Student-t CDF with `df` degrees of freedom: `1 - I_{df/(df+t²)}(df/2, 1/2) / 2` for t ≥ 0.
pub fn t_cdf(t: f64, df: f64) -> f64 {
    let tail = 0.5 * inc_beta(df / (df + t * t), 0.5 * df, 0.5);
    if t >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// The two-sided critical value `t` with `P(|T| ≤ t) = confidence` (bisection on [`t_cdf`],
/// in a bracket doubled until it holds the value: Bonferroni levels over many windows with one
/// degree of freedom reach past 10⁴). `t_two_sided(0.95, 10.0) ≈ 2.228`.
pub fn t_two_sided(confidence: f64, df: f64) -> f64 {
    let target = 0.5 + 0.5 * confidence;
    let (mut lo, mut hi) = (0.0, 1.0);
    while t_cdf(hi, df) < target && hi < 1e300 {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t_cdf(mid, df) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// Regularised lower incomplete gamma `P(a, x)`: its series for `x < a + 1`, else one minus
/// the continued fraction of `Q(a, x)` (modified Lentz), as in Numerical Recipes §6.2.
fn lower_gamma_p(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    let front = (a * x.ln() - x - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..1000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        return (sum * front).min(1.0);
    }
    let tiny = 1e-300;
    let mut b = x + 1.0 - a;
    let mut c = 1.0 / tiny;
    let mut d = 1.0 / b;
    let mut h = d;
    for i in 1..1000 {
        let an = -(i as f64) * (i as f64 - a);
        b += 2.0;
        d = an * d + b;
        d = 1.0 / if d.abs() < tiny { tiny } else { d };
        c = b + an / c;
        if c.abs() < tiny {
            c = tiny;
        }
        h *= d * c;
        if (d * c - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (1.0 - front * h).max(0.0)
}

/// Chi-square CDF with `dof` (> 0, not necessarily whole) degrees of freedom:
/// `P(dof/2, x/2)`.
pub fn chi2_cdf(x: f64, dof: f64) -> f64 {
    lower_gamma_p(0.5 * dof, 0.5 * x)
}

/// The chi-square quantile: the `x` with `chi2_cdf(x, dof) = p` (bisection on a log scale, so
/// the tiny lower quantiles of one degree of freedom are as exact as the large ones).
/// `chi2_quantile(0.025, 1.0) ≈ 0.000982`, `chi2_quantile(0.975, 1.0) ≈ 5.024`.
pub fn chi2_quantile(p: f64, dof: f64) -> f64 {
    let (mut lo, mut hi) = (1e-300f64.ln(), (1e4 + 100.0 * dof).ln());
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if chi2_cdf(mid.exp(), dof) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (0.5 * (lo + hi)).exp()
}

/// The confidence interval of a standard deviation estimated as `s` with `dof` degrees of
/// freedom, at two-sided `level`: `[s·√(dof/χ²_{1−a/2}), s·√(dof/χ²_{a/2})]` with
/// `a = 1 − level` (the variance estimate is `σ²·χ²_dof/dof` for normal data).
pub fn sd_interval(s: f64, dof: f64, level: f64) -> [f64; 2] {
    let a = 1.0 - level;
    [
        s * (dof / chi2_quantile(1.0 - a / 2.0, dof)).sqrt(),
        s * (dof / chi2_quantile(a / 2.0, dof)).sqrt(),
    ]
}

/// Lag-1 autocorrelation of series that have mean zero by construction, pooled over the
/// series and taken about zero (not about their sample mean, so a constant series counts as
/// fully correlated): `Σ e_i e_{i+1} / Σ e_i²`, clamped to `[0, 1]` (a negative estimate is
/// read as none); 0 when every value is 0.
pub fn lag1_about_zero(series: &[Vec<f64>]) -> f64 {
    let num: f64 = series
        .iter()
        .flat_map(|e| e.windows(2).map(|w| w[0] * w[1]))
        .sum();
    let den: f64 = series.iter().flatten().map(|v| v * v).sum();
    if den > 0.0 {
        (num / den).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// The number of independent values that `n` values of an AR(1) series with lag-1
/// autocorrelation `rho` are worth for the variance of their mean or of their scale:
/// `n (1 − ρ)/(1 + ρ)` (Bretherton et al. 1999, eq. 31), between 1 and `n`.
pub fn effective_count(n: usize, rho: f64) -> f64 {
    (n as f64 * (1.0 - rho) / (1.0 + rho)).clamp(1.0_f64.min(n as f64), n as f64)
}

/// Least-squares line `y = a + b x`: returns `(b, se_b, residual_sd)` with the usual
/// `n - 2` divisor. For fewer than three points `se_b` and `residual_sd` are 0.
pub fn slope(x: &[f64], y: &[f64]) -> (f64, f64, f64) {
    let n = x.len();
    let (mx, my) = (mean(x), mean(y));
    let sxx: f64 = x.iter().map(|v| (v - mx).powi(2)).sum();
    if n < 2 || sxx == 0.0 {
        return (0.0, 0.0, 0.0);
    }
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let b = sxy / sxx;
    let a = my - b * mx;
    if n < 3 {
        return (b, 0.0, 0.0);
    }
    let rss: f64 = x
        .iter()
        .zip(y)
        .map(|(xi, yi)| (yi - a - b * xi).powi(2))
        .sum();
    let s = (rss / (n - 2) as f64).sqrt();
    (b, s / sxx.sqrt(), s)
}

/// Percentile bootstrap interval (`confidence`, e.g. 0.95) of `median(base) / median(test)`,
/// resampling each slice independently `resamples` times with a ChaCha8 generator seeded by
/// `seed` (so the interval is reproducible).
pub fn bootstrap_median_ratio(
    base: &[f64],
    test: &[f64],
    confidence: f64,
    resamples: usize,
    seed: u64,
) -> (f64, f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let draw = |x: &[f64], rng: &mut ChaCha8Rng| -> f64 {
        let r: Vec<f64> = (0..x.len())
            .map(|_| x[rng.random_range(0..x.len())])
            .collect();
        median(&r)
    };
    let mut ratios: Vec<f64> = (0..resamples)
        .map(|_| draw(base, &mut rng) / draw(test, &mut rng))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let q = |p: f64| ratios[((p * (resamples - 1) as f64).round() as usize).min(resamples - 1)];
    let alpha = 1.0 - confidence;
    (q(alpha / 2.0), q(1.0 - alpha / 2.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_match_tables() {
        // Two-sided 95% critical values from any t table.
        for (df, want) in [
            (1.0, 12.706),
            (2.0, 4.303),
            (10.0, 2.228),
            (30.0, 2.042),
            (1e7, 1.960),
        ] {
            let got = t_two_sided(0.95, df);
            assert!((got - want).abs() < 1e-3, "df {df}: {got} vs {want}");
        }
        assert!((t_two_sided(0.99, 5.0) - 4.032).abs() < 1e-3);
        // One degree of freedom is the Cauchy law: t = tan(π·c/2) exactly. c = 0.99999 is the
        // per-window level of 1250 windows with baselines (1 − 0.05/(4·1250)): t ≈ 63662,
        // past the old bracket's 10⁴.
        let want = (std::f64::consts::FRAC_PI_2 * 0.99999).tan();
        let got = t_two_sided(0.99999, 1.0);
        assert!((got / want - 1.0).abs() < 1e-9, "{got} vs {want}");
        assert!(got > 6.3e4);
    }

    #[test]
    fn median_mean_sd() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(mean(&[1.0, 2.0, 3.0]), 2.0);
        assert!((sd(&[1.0, 2.0, 3.0, 4.0]) - 1.290_994_448_735_805_6).abs() < 1e-15);
    }

    #[test]
    fn mad_finds_the_spikes_of_the_seed_log() {
        // Step times of the seed's native run, steps 2..14: spikes at steps 4 and 7.
        let t = [
            3.240, 3.268, 5.791, 3.231, 3.232, 10.892, 3.214, 3.228, 3.242, 3.226, 3.218, 3.235,
            3.237,
        ];
        assert_eq!(mad_outliers(&t), vec![2, 5]);
    }

    #[test]
    fn slope_of_a_line_is_exact() {
        let x = [0.0, 1.0, 2.0, 3.0];
        let y = [1.0, 3.0, 5.0, 7.0];
        let (b, se, s) = slope(&x, &y);
        assert_eq!(b, 2.0);
        assert!(se.abs() < 1e-12 && s.abs() < 1e-12);
    }

    #[test]
    fn bootstrap_interval_contains_the_point_estimate_and_is_reproducible() {
        let a: Vec<f64> = (0..20).map(|i| 3.2 + 0.01 * (i % 5) as f64).collect();
        let b: Vec<f64> = (0..20).map(|i| 3.1 + 0.01 * (i % 4) as f64).collect();
        let (lo, hi) = bootstrap_median_ratio(&a, &b, 0.95, 500, 7);
        let point = median(&a) / median(&b);
        assert!(lo <= point && point <= hi, "{lo} {point} {hi}");
        assert_eq!((lo, hi), bootstrap_median_ratio(&a, &b, 0.95, 500, 7));
    }

    /// Chi-square quantiles as tabulated (Abramowitz and Stegun 26.4), here to the digits of
    /// `scipy.stats.chi2.ppf`, to a relative 1e-9 (the bisection's 200 halvings on a log scale
    /// leave far less; the incomplete gamma's series and fraction stop at 1e-16),
    /// and the interval of an sd: one degree of freedom leaves an upper limit about 32 times
    /// the estimate at 95% (`√(1/0.000982)`), the figure issue 41 quotes as "about 30".
    #[test]
    fn chi_square_quantiles_match_tables() {
        for (p, dof, want) in [
            (0.025, 1.0, 0.000_982_069_117_175_255_5),
            (0.975, 1.0, 5.023_886_187_314_888),
            (0.025, 2.0, 0.050_635_615_968_579_75),
            (0.975, 2.0, 7.377_758_908_227_871),
            (0.05, 10.0, 3.940_299_136_119_060_5),
            (0.95, 10.0, 18.307_038_053_275_146),
            (0.5, 30.0, 29.336_031_516_661_585),
        ] {
            let got = chi2_quantile(p, dof);
            assert!(
                (got / want - 1.0).abs() < 1e-9,
                "p {p} dof {dof}: {got} vs {want}"
            );
        }
        // With 2 degrees of freedom the CDF is exactly 1 − exp(−x/2).
        for x in [0.01, 0.7, 3.0, 12.0] {
            assert!((chi2_cdf(x, 2.0) - (1.0 - (-x / 2.0f64).exp())).abs() < 1e-14);
        }
        let [lo, hi] = sd_interval(1.0, 1.0, 0.95);
        assert!((hi - (1.0 / 0.000_982_07f64).sqrt()).abs() < 1e-3, "{hi}");
        assert!((lo - (1.0 / 5.023_886f64).sqrt()).abs() < 1e-6, "{lo}");
    }

    #[test]
    fn lag1_and_effective_count_by_hand() {
        // A constant series is one value; an alternating one is read as uncorrelated.
        assert_eq!(lag1_about_zero(&[vec![2.0; 5]]), 0.8);
        assert_eq!(lag1_about_zero(&[vec![1.0, -1.0, 1.0, -1.0]]), 0.0);
        // (1·2 + 2·3) / (1 + 4 + 9) = 8/14, pooled with a zero series.
        let r = lag1_about_zero(&[vec![1.0, 2.0, 3.0], vec![0.0, 0.0]]);
        assert_eq!(r, 8.0 / 14.0);
        assert_eq!(effective_count(10, 0.0), 10.0);
        assert_eq!(effective_count(10, 0.5), 10.0 / 3.0);
        assert_eq!(effective_count(10, 0.99), 1.0);
    }
}
