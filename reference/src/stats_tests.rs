//! Tests of the element-by-element statistics.

use super::*;

fn judge(pairs: &[(f64, f64)]) -> ElementStats<usize> {
    let mut acc = StatsAcc::new(Format::F32);
    for (i, &(got, want)) in pairs.iter().enumerate() {
        acc.push(|| i, got, want, 1e-3);
    }
    acc.finish()
}

#[test]
fn non_finite_references_are_matched_exactly() {
    let inf = f64::INFINITY;
    let ok = judge(&[(f64::NAN, f64::NAN), (inf, inf), (-inf, -inf), (1.0, 1.0)]);
    assert!(ok.passed(), "{ok:?}");
    assert_eq!((ok.exact_non_finite, ok.nan, ok.inf), (3, 1, 2));
    assert_eq!(ok.calc_diff, 0.0);
    for (got, want) in [
        (0.0, f64::NAN),
        (inf, f64::NAN),
        (f64::NAN, inf),
        (-inf, inf),
        (f32::MAX as f64, inf),
        (f64::NAN, 1.0),
        (inf, 1.0),
    ] {
        let s = judge(&[(got, want)]);
        assert_eq!(s.failed, 1, "got {got}, want {want}: {s:?}");
        assert_eq!(s.exact_non_finite, 0);
    }
}

/// Round-to-nearest into f16 overflows at 65520 (= max 65504 + ulp(max)/2): an infinity
/// of the reference's sign passes where the reference plus its bound, less the bound's
/// output rounding, reaches it, and nowhere else; a format without infinities passes none.
#[test]
fn an_overflowing_output_may_be_infinite() {
    let one = |out: Format, got: f64, want: f64, bound: f64| {
        let mut acc = StatsAcc::new(out);
        acc.push(|| 0usize, got, want, bound);
        acc.finish()
    };
    let inf = f64::INFINITY;
    // u_out·|want| is the bound's output rounding: 65520/2048 = 31.99…
    for (got, want, bound) in [
        (inf, 65519.0, 40.0),
        (-inf, -7e4, 1.0),
        (inf, 65520.0, 65520.0 / 2048.0),
    ] {
        let s = one(Format::F16, got, want, bound);
        assert!(s.passed(), "got {got}, want {want}, bound {bound}: {s:?}");
        assert_eq!((s.overflowed, s.inf), (1, 1));
        assert_eq!((s.max_abs_err, s.calc_diff), (0.0, 0.0), "{s:?}");
    }
    for (out, got, want, bound) in [
        // 65500 + its output rounding (32, one ulp) correctly rounds to 65504, not inf.
        (Format::F16, inf, 65500.0, 32.0),
        (Format::F16, inf, 65519.0, 0.5),
        (Format::F16, inf, -7e4, 1.0),
        (Format::F16, -inf, 7e4, 1.0),
        (Format::F32, inf, 7e4, 1.0),
        (Format::E4m3, inf, 1e3, 1.0),
    ] {
        let s = one(out, got, want, bound);
        assert_eq!(
            (s.failed, s.overflowed),
            (1, 0),
            "{out:?} got {got}, want {want}: {s:?}"
        );
    }
}

/// The chunked judge gives what judging element by element gives, statistic for
/// statistic and worst element included, over runs that cross chunk edges and hold NaN,
/// ±inf, overflowing differences, zero and infinite bounds, ties and exact matches.
#[test]
fn push_slice_is_push_element_by_element() {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..200 {
        let len = (next() % 300) as usize;
        let special = round % 3 != 0;
        let pick = |r: u64, v: f64| match r % 40 {
            0 if special => f64::NAN,
            1 if special => f64::INFINITY,
            2 if special => f64::NEG_INFINITY,
            3 => 1e308,
            4 => -1e308,
            5 => 0.0,
            _ => v,
        };
        let (mut got, mut want, mut bound) = (vec![], vec![], vec![]);
        for _ in 0..len {
            let w = (next() % 2001) as f64 / 100.0 - 10.0;
            let g = w + ((next() % 21) as f64 - 10.0) * 1e-3;
            want.push(pick(next(), w));
            got.push(pick(next(), g));
            bound.push(match next() % 10 {
                0 => 0.0,
                1 => f64::INFINITY,
                2 => 5e-3,
                _ => (next() % 100) as f64 * 1e-4,
            });
        }
        for out in [Format::F32, Format::Bf16, Format::F64] {
            let mut one = StatsAcc::new(out);
            for i in 0..len {
                one.push(|| i, got[i], want[i], bound[i]);
            }
            let mut chunked = StatsAcc::new(out);
            // Split in two calls, the second starting mid-chunk.
            let cut = len / 3;
            chunked.push_slice(|i| i, &got[..cut], &want[..cut], &bound[..cut]);
            chunked.push_slice(|i| cut + i, &got[cut..], &want[cut..], &bound[cut..]);
            // Debug text: NaN statistics are not equal to themselves.
            assert_eq!(
                format!("{:?}", one.finish()),
                format!("{:?}", chunked.finish()),
                "round {round}, {out}"
            );
        }
    }
}

/// The inverse ulp is exactly `1 / ulp` for every format it applies to, over normal,
/// subnormal, zero, huge and over-`max` values.
#[test]
fn inverse_ulp_is_one_over_ulp() {
    let mut values = vec![
        0.0, -0.0, 1.0, 3.0, 1e-45, 1e-40, 1e-10, 448.0, 500.0, 1e38, 1e300,
    ];
    values.extend((0..2000).map(|i| (i as f64 * 0.37).sin() * 10f64.powi(i % 90 - 45)));
    // f64 subnormals and the smallest normal f64.
    values.extend([5e-324, 1e-310, f64::MIN_POSITIVE]);
    for f in [
        Format::F32,
        Format::Bf16,
        Format::F16,
        Format::E4m3,
        Format::E5m2,
    ] {
        let inv = InverseUlp::of(f).expect("a representable inverse");
        // Each format's edges: its smallest normal and the values either side, its max and
        // the value above it.
        let info = f.info();
        let normal = 2f64.powi(info.emin);
        let edges = [
            normal,
            normal.next_down(),
            normal.next_up(),
            info.max,
            info.max.next_up(),
        ];
        for &x in values.iter().chain(&edges) {
            assert_eq!(inv.at(x), 1.0 / ulp(x, f), "{f} at {x}");
        }
    }
    assert!(InverseUlp::of(Format::F64).is_none());
}

/// Zeros pushed in one step give what pushing them one by one gives: into a fresh
/// accumulator (the first becomes the worst element), after other elements (nothing but the
/// counts changes, `calc_diff` included), with −0 on either side.
#[test]
fn push_zeros_is_push_of_each_zero() {
    let got = [0.0, -0.0, 0.0, -0.0, 0.0];
    let want = [-0.0, 0.0, 0.0, -0.0, 0.0];
    let before: [(f64, f64, f64); 4] = [
        (1.0, 1.5, 1.0),
        (-2.0, -2.0, 0.0),
        (3.0, 2.0, 0.5),
        (0.25, 0.0, 0.1),
    ];
    for prefix in [0, 1, 4] {
        for out in [Format::F32, Format::Bf16] {
            let (mut one, mut zeros) = (StatsAcc::new(out), StatsAcc::new(out));
            for (i, &(g, w, b)) in before[..prefix].iter().enumerate() {
                one.push(|| i, g, w, b);
                zeros.push(|| i, g, w, b);
            }
            for i in 0..got.len() {
                one.push(|| prefix + i, got[i], want[i], 0.0);
            }
            zeros.push_zeros(|i| prefix + i, &got, &want);
            zeros.push_zeros(|i| i, &[], &[]);
            assert_eq!(
                format!("{:?}", one.finish()),
                format!("{:?}", zeros.finish()),
                "{prefix} before, {out}"
            );
        }
    }
}
