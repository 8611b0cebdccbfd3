use super::*;
use rand::{Rng, SeedableRng};

#[test]
fn truncation_keeps_bits() {
    assert_eq!(
        truncate_bits(1.0 + 2f32.powi(-13), 14),
        1.0 + 2f32.powi(-13)
    );
    assert_eq!(truncate_bits(1.0 + 2f32.powi(-14), 14), 1.0);
    assert_eq!(truncate_bits(-1.999_999_9, 14), -(2.0 - 2f32.powi(-13)));
}

/// How the error grows with K under each model: FP8-like products of one sign (so the
/// errors do not cancel). Every model stays inside its bound; the fast accumulator's
/// relative error grows with K while promotion every 128 keeps it near the error of one
/// chunk, and exact f32 stays orders of magnitude below both.
#[test]
fn error_grows_with_k() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let ks = [128usize, 512, 2048, 8192];
    let mut rel = vec![[0.0f64; 3]; ks.len()];
    for (row, &k) in ks.iter().enumerate() {
        // Products of two E4M3 values in [1, 448): exact in f32.
        let e4 = |rng: &mut rand_chacha::ChaCha8Rng| {
            crate::format::round_to(
                rng.random_range(1.0..448.0),
                crate::format::Format::E4m3,
                crate::format::Overflow::Saturate,
            )
        };
        let prods: Vec<f32> = (0..k)
            .map(|_| (e4(&mut rng) * e4(&mut rng)) as f32)
            .collect();
        let exact: f64 = prods.iter().map(|p| *p as f64).sum();
        for (j, m) in AccumModel::ALL.into_iter().enumerate() {
            let got = m.dot(k, |i| prods[i]) as f64;
            let err = (got - exact).abs();
            assert!(err <= m.coefficient(k) * exact, "{m} K={k}: {err} > bound");
            rel[row][j] = err / exact;
        }
    }
    eprintln!("K       exact       fast        fast-promote   (relative error of Σ)");
    for (row, k) in ks.iter().enumerate() {
        eprintln!(
            "{k:<7} {:.3e}   {:.3e}   {:.3e}",
            rel[row][0], rel[row][1], rel[row][2]
        );
    }
    let (first, last) = (&rel[0], &rel[ks.len() - 1]);
    // Fast: grows by at least 16x from K=128 to K=8192 (truncation drift is ~linear).
    assert!(last[1] > 16.0 * first[1], "{rel:?}");
    // Promotion: at K=8192 at least 8x better than fast.
    assert!(last[2] * 8.0 < last[1], "{rel:?}");
    // Exact f32: far below both.
    assert!(last[0] * 100.0 < last[2], "{rel:?}");
}

/// Known answers for the running form and the worst-case coefficient, written from the module
/// documentation with literal constants (`u32 = 2^-24`, `u_fast = 2^-13 + 2^-24 + 2^-37`,
/// k-block `b = 32`, `N_C = 128`), not by calling [`gamma`]: a change to any term of any
/// model fails here.
#[test]
fn coefficient_known_answers() {
    let close = |got: f64, want: f64| {
        assert!(
            (got - want).abs() <= 1e-13 * want.abs(),
            "got {got:e}, want {want:e}"
        )
    };
    let u32_ = 2f64.powi(-24);
    let u_fast = 2f64.powi(-13) + 2f64.powi(-24) + 2f64.powi(-37);
    assert_eq!(AccumModel::fast_step_roundoff(), u_fast);
    let g = |n: f64, u: f64| n * u / (1.0 - n * u);
    for n in [0usize, 1, 2, 16, 31, 32, 33, 128, 129, 300, 4096, 7168] {
        let nf = n as f64;
        let inner = nf.min(32.0).max(1.0) - 1.0;
        close(AccumModel::Exact.coefficient(n), g(nf, u32_));
        assert_eq!(AccumModel::Exact.running(n).r, 0.0);
        // Fast: J = ⌈n/32⌉ additions, (1 + γ(J, u_fast))·(γ(b' - 1, u32)·S + u_fast·R).
        let j = (nf / 32.0).ceil();
        let run = AccumModel::Fast.running(n);
        close(run.s, (1.0 + g(j, u_fast)) * g(inner, u32_));
        close(run.r, (1.0 + g(j, u_fast)) * u_fast);
        assert_eq!(run.steps as f64, j);
        close(AccumModel::Fast.coefficient(n), run.s + run.r * j);
        // FastPromote: J_c = ⌈min(n, 128)/32⌉ per chunk, nc = ⌈n/128⌉ chunks.
        let jc = (nf.min(128.0) / 32.0).ceil();
        let nc = (nf / 128.0).ceil();
        let grow = (1.0 + g(nc, u32_)) * (1.0 + g(jc, u_fast));
        let run = AccumModel::FastPromote.running(n);
        close(run.s, grow * g(inner, u32_) + g(nc, u32_));
        close(run.r, grow * u_fast);
        close(AccumModel::FastPromote.coefficient(n), run.s + run.r * jc);
    }
    // The covering bound (13 bits, k-blocks of 4: u_c = 2^-12 + 2^-24 + 2^-36), in S and the
    // nominal R: (1 + γ(J_c, u_c))·((γ(b_c - 1, u32) + 8·u_c)·S + 8·u_c·R), J_c = ⌈n/4⌉.
    let u_c = 2f64.powi(-12) + 2f64.powi(-24) + 2f64.powi(-36);
    for n in [1usize, 3, 4, 5, 32, 128, 129, 7168] {
        let nf = n as f64;
        let jc = (nf / 4.0).ceil();
        let inner = g(nf.min(4.0) - 1.0, u32_);
        let c = AccumModel::Fast.covering(n);
        close(c.r, (1.0 + g(jc, u_c)) * 8.0 * u_c);
        close(c.s, (1.0 + g(jc, u_c)) * (inner + 8.0 * u_c));
        let jn = (nf / 32.0).ceil();
        close(AccumModel::Fast.covering_coefficient(n), c.s + c.r * jn);
        let jcc = (nf.min(128.0) / 4.0).ceil();
        let nc = (nf / 128.0).ceil();
        let grow = (1.0 + g(nc, u32_)) * (1.0 + g(jcc, u_c));
        let p = AccumModel::FastPromote.covering(n);
        close(p.r, grow * 8.0 * u_c);
        close(p.s, grow * (inner + 8.0 * u_c) + g(nc, u32_));
    }
    // At K = 7168 the covering R coefficient is about 28 times the nominal one.
    let ratio = AccumModel::Fast.covering(7168).r / AccumModel::Fast.running(7168).r;
    assert!(ratio > 25.0 && ratio < 30.0, "{ratio}");
    // Worked numbers: K = 16 is one addition, (1 + γ(1, u_fast))·(γ(15, u32) + u_fast);
    // K = 7168 is 224 of them, (1 + γ(224, u_fast))·(γ(31, u32) + 224·u_fast), about 2.8% of
    // Σ|p|: more than |Σ p| for products of random signs (about Σ|p|/√K ≈ 1.2%), which is
    // why the worst case admits zero there and the running form is judged instead.
    close(AccumModel::Fast.coefficient(16), 0.0001230390216381386);
    close(AccumModel::Fast.coefficient(7168), 0.028128464109497587);
    // The accumulator cannot resolve 8189 additions (J·u_fast >= 1): n = 8188·32 is the last
    // finite worst case.
    assert!(AccumModel::Fast.coefficient(8188 * 32).is_finite());
    assert!(AccumModel::Fast.coefficient(8188 * 32 + 1).is_infinite());
    assert!(AccumModel::FastPromote.coefficient(1 << 24).is_finite());
}

/// The emulation on small hand-worked sums: truncation after every addition, the blocks of
/// a variant, and promotion every 128 products.
#[test]
fn dot_known_answers() {
    let tz = AccumRounding::TowardZero;
    let v = |bits, block| AccumVariant {
        bits,
        block,
        rounding: tz,
    };
    let tiny = 2f32.powi(-14);
    // 1, then three products of 2^-14: one at a time each is truncated away by a 14-bit
    // accumulator; the nominal one sums its k-block first: 1 + 3·2^-14 keeps 1 + 2^-13.
    let p = |i: usize| if i == 0 { 1.0 } else { tiny };
    assert_eq!(AccumModel::Fast.dot_variant(v(14, 1), 4, p), 1.0);
    assert_eq!(AccumModel::Fast.dot(4, p), 1.0 + 2.0 * tiny);
    assert_eq!(AccumModel::Exact.dot(4, p), 1.0 + 3.0 * tiny);
    assert_eq!(AccumModel::Fast.dot(0, p), 0.0);
    assert_eq!(AccumModel::Exact.dot(0, p), 0.0);
    // 15 bits keep each 2^-14.
    assert_eq!(
        AccumModel::Fast.dot_variant(v(15, 1), 4, p),
        1.0 + 3.0 * tiny
    );
    // Blocks of 2: [1 + 2^-14] truncated to 1, then [2^-14 + 2^-14] = 2^-13 kept.
    assert_eq!(
        AccumModel::Fast.dot_variant(v(14, 2), 4, p),
        1.0 + 2.0 * tiny
    );
    // A block of 3 over 4 products: [1 + 2·2^-14] = 1 + 2^-13 kept, then 2^-14 dropped.
    assert_eq!(
        AccumModel::Fast.dot_variant(v(14, 3), 4, p),
        1.0 + 2.0 * tiny
    );
    // Block 0 is read as 1.
    assert_eq!(AccumModel::Fast.dot_variant(v(14, 0), 4, p), 1.0);
    // Exact ignores the bits.
    assert_eq!(
        AccumModel::Exact.dot_variant(v(8, 1), 4, p),
        1.0 + 3.0 * tiny
    );
    // To nearest (quantum 2^-13): 1 + 3·2^-14 = 1 + 1.5·2^-13 is a tie, to the even 1 + 2^-12.
    let near = AccumVariant {
        rounding: AccumRounding::NearestEven,
        ..AccumVariant::NOMINAL
    };
    assert_eq!(AccumModel::Fast.dot_variant(near, 4, p), 1.0 + 4.0 * tiny);
    // Past 32 products a new k-block starts: 1 then 35 products of 2^-14 sum to
    // [1 + 31·2^-14] -> 1 + 15·2^-13 (truncated), then [4·2^-14] = 2^-12 added exactly.
    assert_eq!(
        AccumModel::Fast.dot(36, p),
        1.0 + 15.0 * 2.0 * tiny + 4.0 * tiny
    );
    // Promotion: 1 at the start of each chunk of 128, then 2^-14 products. One product at a
    // time every 2^-14 after a 1 is dropped, with promotion or not: 3.
    let q = |i: usize| if i.is_multiple_of(128) { 1.0 } else { tiny };
    assert_eq!(AccumModel::Fast.dot_variant(v(14, 1), 300, q), 3.0);
    assert_eq!(AccumModel::FastPromote.dot_variant(v(14, 1), 300, q), 3.0);
    // The nominal accumulator (k-blocks of 32; `t` = 2^-14, quantum 2t in [1, 2), 4t in
    // [2, 4)): 1 + 31t -> 1 + 30t, three blocks of 32t -> 1 + 126t; 1 + 31t more gives
    // 2 + 157t -> 2 + 156t, three blocks -> 2 + 252t; 1 + 31t -> 3 + 283t -> 3 + 280t; the
    // last 12t -> 3 + 292t. With promotion each chunk starts from 0: 1 + 126t twice, then
    // 1 + 31t -> 1 + 30t and 12t: 1 + 42t, summed in f32: 3 + 294t. Exact: 3 + 297t.
    assert_eq!(AccumModel::Fast.dot(300, q), 3.0 + 292.0 * tiny);
    assert_eq!(AccumModel::FastPromote.dot(300, q), 3.0 + 294.0 * tiny);
    assert_eq!(AccumModel::Exact.dot(300, q), 3.0 + 297.0 * tiny);
    // Products in chunk order small first, one at a time: 127 · 2^-14 accumulate exactly
    // (below 2^-7 the accumulator has room), then 1 at the end of the chunk.
    let r = |i: usize| if i % 128 == 127 { 1.0 } else { tiny };
    let chunk = 127.0 * tiny; // exact: 127 needs 7 bits
    assert_eq!(
        AccumModel::FastPromote.dot_variant(v(14, 1), 256, r),
        2.0 * super::truncate_bits(chunk + 1.0, 14)
    );
    assert_eq!(
        AccumModel::FastPromote.dot_variant(v(14, 1), 130, r),
        super::truncate_bits(chunk + 1.0, 14) + 2.0 * tiny
    );
}

#[test]
fn truncation_edges() {
    // 24 bits or more: unchanged; non-finite values unchanged.
    let x = 1.0 + 2f32.powi(-23);
    assert_eq!(truncate_bits(x, 24), x);
    assert_eq!(truncate_bits(x, 30), x);
    assert_eq!(truncate_bits(x, 23), 1.0);
    assert_eq!(truncate_bits(f32::INFINITY, 14), f32::INFINITY);
    assert_eq!(truncate_bits(f32::NEG_INFINITY, 14), f32::NEG_INFINITY);
    assert!(truncate_bits(f32::NAN, 14).is_nan());
    // 1.5 + 2^-10 + 2^-20 keeps 1.5 + 2^-10 with 14 bits, 1.5 with 2 bits.
    let y = 1.5 + 2f32.powi(-10) + 2f32.powi(-20);
    assert_eq!(truncate_bits(y, 14), 1.5 + 2f32.powi(-10));
    assert_eq!(truncate_bits(y, 2), 1.5);
    assert_eq!(truncate_bits(-y, 1), -1.0);
}

/// The accumulators the model-based check compares, as documented: the nominal one (14
/// bits, k-blocks of 32), one bit fewer, one bit more, and k-blocks of 16; and the covering
/// bound's least accurate one (13 bits, k-blocks of 4).
#[test]
fn variants_are_the_documented_ones() {
    let v = |bits, block| AccumVariant {
        bits,
        block,
        rounding: AccumRounding::TowardZero,
    };
    assert_eq!(AccumVariant::NOMINAL, v(14, 32));
    assert_eq!(AccumVariant::SPREAD, [v(13, 32), v(15, 32), v(14, 16)]);
    assert_eq!(AccumVariant::COVER, v(13, 4));
    // One addition's relative error: truncation to 14 bits after an f32 addition, or
    // rounding to nearest.
    assert_eq!(
        AccumVariant::NOMINAL.step_roundoff(),
        2f64.powi(-13) + 2f64.powi(-24) + 2f64.powi(-37)
    );
    let near = AccumVariant {
        rounding: AccumRounding::NearestEven,
        ..AccumVariant::NOMINAL
    };
    assert_eq!(
        near.step_roundoff(),
        2f64.powi(-14) + 2f64.powi(-24) + 2f64.powi(-38)
    );
}

/// Rounding to nearest, ties to even, by bits: below, at and above the half quantum, a
/// carry into the exponent, and values it leaves alone.
#[test]
fn nearest_rounding() {
    let q = 2f32.powi(-13); // 14 significant bits at [1, 2)
    assert_eq!(nearest_bits(1.0 + 0.25 * q, 14), 1.0);
    assert_eq!(nearest_bits(1.0 + 0.5 * q, 14), 1.0); // tie, 1.0 is even
    assert_eq!(nearest_bits(1.0 + 1.5 * q, 14), 1.0 + 2.0 * q); // tie, to even
    assert_eq!(nearest_bits(1.0 + 0.75 * q, 14), 1.0 + q);
    assert_eq!(nearest_bits(-(1.0 + 0.75 * q), 14), -(1.0 + q));
    assert_eq!(nearest_bits(2.0 - 0.5 * q, 14), 2.0); // carries into the exponent
    assert_eq!(nearest_bits(1.0 + q, 14), 1.0 + q);
    assert_eq!(nearest_bits(f32::INFINITY, 14), f32::INFINITY);
    assert!(nearest_bits(f32::NAN, 14).is_nan());
    let x = 1.0 + 2f32.powi(-23);
    assert_eq!(nearest_bits(x, 24), x);
}

#[test]
fn names_round_trip() {
    for m in AccumModel::ALL {
        assert_eq!(AccumModel::parse(m.name()), Some(m));
        assert_eq!(AccumModel::parse(&format!(" {m} ")), Some(m));
    }
    assert_eq!(AccumModel::Exact.name(), "exact");
    assert_eq!(AccumModel::Fast.to_string(), "fast");
    assert_eq!(AccumModel::parse("fast_promote"), None);
}

#[test]
fn coefficients() {
    // Worst cases at K = 8192: k-blocks of 32 keep the fast accumulator's finite (256
    // additions, about 3.1%); promotion every 128 keeps it near one chunk's.
    assert!(AccumModel::Fast.coefficient(8192) < 0.035);
    assert!(AccumModel::FastPromote.coefficient(8192) < 6e-4);
    assert!(AccumModel::Exact.coefficient(4096) < 3e-4);
    assert_eq!(
        AccumModel::parse("fast-promote"),
        Some(AccumModel::FastPromote)
    );
}
