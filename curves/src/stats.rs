//! The small statistics the curve criterion needs, written plainly in f64: mean, sample
//! standard deviation, median, MAD outlier rejection, Student-t quantiles, least-squares slope,
//! and a seeded percentile bootstrap.

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

/// The two-sided critical value `t` with `P(|T| ≤ t) = confidence` (bisection on [`t_cdf`]).
/// `t_two_sided(0.95, 10.0) ≈ 2.228`.
pub fn t_two_sided(confidence: f64, df: f64) -> f64 {
    let target = 0.5 + 0.5 * confidence;
    let (mut lo, mut hi) = (0.0, 1.0e4);
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
}
