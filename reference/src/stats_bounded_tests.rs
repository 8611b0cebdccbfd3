//! [`StatsAcc::push_bounded`] against [`StatsAcc::push`] element by element.

use super::*;
use crate::format::Format;

/// A bound of the grouped GEMM's shape: `2^-8·|want| + 2^-20 + 2^-12·aux + 2^-30`.
const BOUND: Linear = Linear {
    value: 1.0 / 256.0,
    floor: 1.0 / 1048576.0,
    magnitude: 1.0 / 4096.0,
    underflow: 1.0 / 1073741824.0,
};

/// Rows of `n` elements from a small generator: references over many binades with exact
/// zeros, magnitudes at least as large with zeros where the reference is 0, outputs within
/// the bound, a little outside it, or exactly right, and the `specials` written over them.
fn row(n: usize, seed: u64, specials: &[(usize, f64, f64, f64)]) -> [Vec<f64>; 3] {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 1_000_000) as f64 / 1e6
    };
    let (mut got, mut want, mut aux) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for i in 0..n {
        let w = if i % 13 == 0 {
            0.0
        } else {
            (next() - 0.5) * 2f64.powi((i % 9) as i32 * 3 - 12)
        };
        let m = if w == 0.0 {
            0.0
        } else {
            w.abs() * (1.0 + next())
        };
        let b = BOUND.at(m, w);
        let g = match i % 5 {
            0 => w,
            1 => w + b * 1.5, // fails
            _ => w + b * (next() - 0.5),
        };
        (got[i], want[i], aux[i]) = (f64::from(g as f32), w, m);
    }
    for &(i, g, w, m) in specials {
        (got[i], want[i], aux[i]) = (g, w, m);
    }
    [got, want, aux]
}

/// Everything `push_bounded` reports, judged element by element.
fn by_elements(
    out: Format,
    before: usize,
    [got, want, aux]: &[Vec<f64>; 3],
) -> (String, u64, usize) {
    let mut acc = StatsAcc::new(out);
    for i in 0..before {
        acc.push(|| usize::MAX - i, 0.25, 0.25 + i as f64 * 1e-9, 1e-3);
    }
    let mut teeth = 0.5f64;
    let mut nonzero = 0;
    for i in 0..got.len() {
        let b = BOUND.at(aux[i], want[i]);
        teeth = teeth.max(zero_ratio(want[i], b));
        nonzero += usize::from(got[i].is_finite() && got[i] != 0.0);
        acc.push(|| i, got[i], want[i], b);
    }
    (format!("{:?}", acc.finish()), teeth.to_bits(), nonzero)
}

/// The same through `push_bounded`, the outputs held in `G`, in two calls cut at `cut`.
fn swept<G: Held>(
    out: Format,
    before: usize,
    [got, want, aux]: &[Vec<f64>; 3],
    hold: impl Fn(f64) -> G,
    cut: usize,
) -> (String, u64, usize) {
    let mut acc = StatsAcc::new(out);
    for i in 0..before {
        acc.push(|| usize::MAX - i, 0.25, 0.25 + i as f64 * 1e-9, 1e-3);
    }
    let got: Vec<G> = got.iter().map(|&g| hold(g)).collect();
    let first = acc.push_bounded(|i| i, &got[..cut], &want[..cut], &aux[..cut], BOUND, 0.5);
    let second = acc.push_bounded(
        |i| cut + i,
        &got[cut..],
        &want[cut..],
        &aux[cut..],
        BOUND,
        first.teeth,
    );
    let s = acc.finish();
    (
        format!("{s:?}"),
        second.teeth.to_bits(),
        first.nonzero + second.nonzero,
    )
}

/// Bit for bit what judging element by element gives: the statistics (worst element, the
/// lanes of `calc_diff`'s sums after a run of elements that is not a multiple of eight), the
/// teeth and the non-zero outputs; for f32 and f64 outputs (the vector sweep, and the passes
/// for a format without inverse ULPs), rows whose length is not a multiple of eight, and
/// chunks holding a NaN, an infinite output, an infinite reference, a vacuous (infinite)
/// bound, a NaN bound (the worst: its ratio is +inf) or a zero magnitude.
#[test]
fn a_sweep_is_judging_element_by_element() {
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    let plain: &[(usize, f64, f64, f64)] = &[];
    let specials: &[(usize, f64, f64, f64)] = &[
        (70, nan, 1.0, 1.0),
        (140, inf, 2.0, 2.0),
        (150, 3.0, inf, 3.0),
        (170, 0.5, 0.5, inf),
        (171, 0.75, 0.5, inf),
        (300, 0.5, 0.25, nan),
        (190, 1.0, 0.0, 0.0),
    ];
    for (n, cut) in [(203, 67), (64, 64), (8, 3), (0, 0), (333, 200)] {
        for (what, sp) in [("plain", plain), ("special", specials)] {
            let sp: Vec<_> = sp.iter().copied().filter(|s| s.0 < n).collect();
            let r = row(n, n as u64 + 1, &sp);
            for before in [0, 3] {
                for out in [Format::F32, Format::Bf16, Format::F64] {
                    let want = by_elements(out, before, &r);
                    let got64 = swept(out, before, &r, |x| x, cut);
                    assert_eq!(got64, want, "{what} n={n} before={before} {out} f64");
                    let r32 = [
                        r[0].iter().map(|&g| f64::from(g as f32)).collect(),
                        r[1].clone(),
                        r[2].clone(),
                    ];
                    let got32 = swept(out, before, &r32, |x| x as f32, cut);
                    assert_eq!(
                        got32,
                        by_elements(out, before, &r32),
                        "{what} n={n} {out} f32"
                    );
                }
            }
        }
    }
}

/// The rows above do judge: some elements fail, the worst is found, and the teeth are finite.
#[test]
fn the_rows_have_failures_and_teeth() {
    let r = row(203, 204, &[]);
    let mut acc = StatsAcc::new(Format::F32);
    let swept = acc.push_bounded(|i| i, &r[0], &r[1], &r[2], BOUND, 0.0);
    let s = acc.finish();
    assert!(s.failed > 0 && s.failed < 203, "{s:?}");
    assert!(s.max_bound_ratio > 1.0 && s.worst.is_some());
    assert!(swept.teeth > 1.0 && swept.teeth.is_finite());
    assert!(swept.nonzero > 150);
}

/// A vacuous bound (an accumulator that cannot resolve the sum: an infinite coefficient) has
/// teeth of the smallest normal, not 0: zeros would pass, by no margin anyone should rely on.
#[test]
fn a_vacuous_bound_has_the_smallest_teeth() {
    let vacuous = Linear {
        magnitude: f64::INFINITY,
        ..BOUND
    };
    let r = row(40, 41, &[]);
    let mut acc = StatsAcc::new(Format::F32);
    let swept = acc.push_bounded(|i| i, &r[0], &r[1], &r[2], vacuous, 0.0);
    let by_rule = r[1]
        .iter()
        .zip(&r[2])
        .map(|(&w, &m)| zero_ratio(w, vacuous.at(m, w)))
        .fold(0.0f64, f64::max);
    assert_eq!(by_rule, f64::MIN_POSITIVE);
    assert_eq!(swept.teeth, by_rule);
    assert_eq!(
        acc.finish().failed,
        0,
        "every error is within an infinite bound"
    );
}

/// The worst element is the one element by element judging finds, where nothing but it could
/// beat the worst so far: a ratio one ULP above the worst of an earlier chunk, a NaN bound
/// (ratio +inf) after a huge finite ratio, a run where every output is exact (the first
/// element is the worst, with ratio 0), a ratio of 1 whose bound times the worst so far
/// underflows (rounding a subnormal product up by far more than a relative margin would
/// cover), and a bound of -inf (ratio +inf) after exact elements. The bound here is the
/// magnitude itself, so ratios are set exactly.
#[test]
fn the_worst_is_found_however_close() {
    let bound = Linear {
        value: 0.0,
        floor: 0.0,
        magnitude: 1.0,
        underflow: 0.0,
    };
    let tiny = f64::from_bits(1); // 2^-1074
    let runs: [&[(usize, f64, f64, f64)]; 5] = [
        &[(3, 2.0, 1.0, 4.0), (130, 2.0, 1.0, 4.0 - 2f64.powi(-50))],
        &[(3, 1e6 + 1.0, 1.0, 1.0), (200, 1.5, 1.0, f64::NAN)],
        &[],
        &[(3, 1.75, 1.0, 1.0), (100, 0.0, tiny, tiny)],
        &[(100, 2.0, 1.0, f64::NEG_INFINITY)],
    ];
    for (r, specials) in runs.iter().enumerate() {
        let (mut got, mut want, mut aux) = (vec![1.0; 256], vec![1.0; 256], vec![1.0; 256]);
        for &(i, g, w, x) in specials.iter() {
            (got[i], want[i], aux[i]) = (g, w, x);
        }
        let mut one = StatsAcc::new(Format::F32);
        for i in 0..256 {
            one.push(|| i, got[i], want[i], bound.at(aux[i], want[i]));
        }
        let one = one.finish();
        let mut swept = StatsAcc::new(Format::F32);
        swept.push_bounded(|i| i, &got, &want, &aux, bound, 0.0);
        let swept = swept.finish();
        let worst = [130, 200, 0, 100, 100][r];
        assert_eq!(one.worst.as_ref().map(|w| w.at), Some(worst), "run {r}");
        assert_eq!(format!("{swept:?}"), format!("{one:?}"), "run {r}");
    }
}
