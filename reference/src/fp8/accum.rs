//! Accumulation models of an FP8 GEMM: exact f32, and Hopper's limited-precision "fast
//! accumulation" with and without promotion to f32.
//!
//! The products `qa·qb` of two FP8 values are exact in f32 (at most 4 × 4 significant bits,
//! magnitudes `>= 2^-32`), so all error comes from the sums.
//!
//! * [`AccumModel::Exact`]: every partial sum is an f32 (round to nearest even). Any order,
//!   depth `n`: `|ŝ - s| <= γ(n, 2^-24)·Σ|qa·qb|` ([Higham 2002, §3.1]).
//! * [`AccumModel::Fast`]: the DeepSeek-V3 technical report (§3.3.2) measured that Hopper's
//!   FP8 tensor-core accumulation retains about 14 bits. Model: after every addition (done in
//!   f32) the partial sum is truncated toward zero to [`FAST_BITS`] significant bits. One step
//!   has relative error `<= u_fast = 2^(1-14) + 2^-24 + 2^(-13-24)`, so
//!   `|ŝ - s| <= γ(n, u_fast)·Σ|qa·qb|`, vacuous from `n = 8189` (`1/u_fast ≈ 8188.0`).
//! * [`AccumModel::FastPromote`]: the same inside chunks of [`PROMOTE_INTERVAL`] = `N_C` = 128
//!   products (DeepSeek-V3: promotion to CUDA-core f32 registers every 4 WGMMAs), each chunk's
//!   partial added to an f32 accumulator: `(1 + γ(min(n, N_C), u_fast))·(1 + γ(⌈n/N_C⌉, 2^-24)) - 1`.
//!
//! [`AccumModel::dot`] is the emulation; [`AccumModel::coefficient`] the bound's coefficient of
//! `Σ|qa·qb|`; the test `error_grows_with_k` shows both against K.

use serde::{Deserialize, Serialize};

use crate::gemm::bound::gamma;

/// Significant bits the fast accumulator keeps (DeepSeek-V3: "around 14 bits").
pub const FAST_BITS: u32 = 14;
/// `N_C`: products per chunk before promotion to f32 (DeepSeek-V3: 128).
pub const PROMOTE_INTERVAL: usize = 128;

/// How the sum of FP8 products is accumulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccumModel {
    /// f32 partial sums, round to nearest even.
    #[default]
    Exact,
    /// Partial sums truncated to [`FAST_BITS`] significant bits after every addition.
    Fast,
    /// [`AccumModel::Fast`] within chunks of [`PROMOTE_INTERVAL`], chunks summed in f32.
    FastPromote,
}

impl AccumModel {
    pub const ALL: [AccumModel; 3] = [AccumModel::Exact, AccumModel::Fast, AccumModel::FastPromote];

    /// `exact`, `fast`, `fast-promote`.
    pub fn name(self) -> &'static str {
        match self {
            AccumModel::Exact => "exact",
            AccumModel::Fast => "fast",
            AccumModel::FastPromote => "fast-promote",
        }
    }

    pub fn parse(s: &str) -> Option<AccumModel> {
        AccumModel::ALL.into_iter().find(|m| m.name() == s.trim())
    }

    /// The relative error of one fast-accumulation step (f32 addition, then truncation).
    pub fn fast_step_roundoff() -> f64 {
        let t = 2f64.powi(1 - FAST_BITS as i32);
        let u32_ = 2f64.powi(-24);
        t + u32_ + t * u32_
    }

    /// The coefficient `c` with `|ŝ - s| <= c·Σ|qa·qb|` for `n` products (module docs).
    pub fn coefficient(self, n: usize) -> f64 {
        let u32_ = 2f64.powi(-24);
        match self {
            AccumModel::Exact => gamma(n, u32_),
            AccumModel::Fast => gamma(n, Self::fast_step_roundoff()),
            AccumModel::FastPromote => {
                let inner = gamma(n.min(PROMOTE_INTERVAL), Self::fast_step_roundoff());
                let outer = gamma(n.div_ceil(PROMOTE_INTERVAL), u32_);
                (1.0 + inner) * (1.0 + outer) - 1.0
            }
        }
    }

    /// The emulated sum of `n` products `p(i)`, `i = 0..n` in order.
    ///
    /// ```
    /// use moecheck_reference::fp8::AccumModel;
    /// // 1 + 2^-14 is not representable with 14 bits: the fast accumulator drops it.
    /// let p = |i: usize| if i == 0 { 1.0 } else { 2f32.powi(-14) };
    /// assert_eq!(AccumModel::Fast.dot(2, p), 1.0);
    /// assert_eq!(AccumModel::Exact.dot(2, p), 1.0 + 2f32.powi(-14));
    /// ```
    pub fn dot(self, n: usize, p: impl Fn(usize) -> f32) -> f32 {
        self.dot_variant(AccumVariant::NOMINAL, n, p)
    }

    /// [`AccumModel::dot`] for another plausible accumulator ([`AccumVariant`]): the fast
    /// accumulator keeps `variant.bits` bits, and adds the f32 sums of `variant.block`
    /// consecutive products at a time. [`AccumModel::Exact`] ignores `bits`.
    ///
    /// ```
    /// use moecheck_reference::fp8::{AccumModel, AccumVariant};
    /// let p = |i: usize| if i == 0 { 1.0 } else { 2f32.powi(-14) };
    /// // With 15 bits the accumulator keeps the second product; summed in a block of 2 first,
    /// // so does a 14-bit one (1 + 2^-14 is truncated, but only once, after the block).
    /// assert_eq!(AccumModel::Fast.dot_variant(AccumVariant { bits: 15, block: 1 }, 2, p), 1.0 + 2f32.powi(-14));
    /// assert_eq!(AccumModel::Fast.dot_variant(AccumVariant { bits: 14, block: 2 }, 2, p), 1.0);
    /// ```
    pub fn dot_variant(self, variant: AccumVariant, n: usize, p: impl Fn(usize) -> f32) -> f32 {
        let AccumVariant { bits, block } = variant;
        let block = block.max(1);
        // The truncating accumulator over products `lo..hi`, fed `block` products at a time.
        let fast = |lo: usize, hi: usize| {
            let mut acc = 0.0f32;
            let mut i = lo;
            while i < hi {
                let end = (i + block).min(hi);
                let part = (i..end).fold(0.0f32, |a, j| a + p(j));
                acc = truncate_bits(acc + part, bits);
                i = end;
            }
            acc
        };
        match self {
            AccumModel::Exact => (0..n).fold(0.0f32, |acc, i| acc + p(i)),
            AccumModel::Fast => fast(0, n),
            AccumModel::FastPromote => {
                let mut acc = 0.0f32;
                let mut start = 0;
                while start < n {
                    let end = (start + PROMOTE_INTERVAL).min(n);
                    acc += fast(start, end);
                    start = end;
                }
                acc
            }
        }
    }
}

impl AccumModel {
    /// Every `Σ_i a[i]·b[i·cols + c]` for `c < cols` (`i < a.len()`, `b` row-major with `cols`
    /// columns) under this model and `variant`, handed to `sink(c, sum)` in increasing `c`:
    /// [`ROW_LANES`] columns at a time through [`AccumModel::dot_lanes`], the last ones
    /// through [`AccumModel::dot_variant`]; each sum has the bits `dot_variant` gives it.
    ///
    /// # Panics
    /// If `b` is shorter than `a.len()·cols`.
    pub fn row_sums(
        self,
        variant: AccumVariant,
        a: &[f32],
        b: &[f32],
        cols: usize,
        mut sink: impl FnMut(usize, f32),
    ) {
        let depth = a.len();
        assert!(b.len() >= depth * cols, "row_sums: b is too short");
        let mut c = 0;
        while c + ROW_LANES <= cols {
            let sums = self.dot_lanes::<ROW_LANES>(variant, depth, |i| {
                let bi: &[f32; ROW_LANES] = b[i * cols + c..][..ROW_LANES]
                    .try_into()
                    .expect("ROW_LANES elements");
                bi.map(|x| a[i] * x)
            });
            for (l, sum) in sums.into_iter().enumerate() {
                sink(c + l, sum);
            }
            c += ROW_LANES;
        }
        for c in c..cols {
            sink(
                c,
                self.dot_variant(variant, depth, |i| a[i] * b[i * cols + c]),
            );
        }
    }

    /// [`AccumModel::dot_variant`] for `L` independent sums at once: lane `l` of the result is
    /// `dot_variant(variant, n, |i| p(i)[l])` bit for bit. The same operations run in the
    /// same order, lane by lane, in plain loops the compiler turns into vector instructions
    /// (the model check's time goes here: one truncating addition per product, per variant).
    pub fn dot_lanes<const L: usize>(
        self,
        variant: AccumVariant,
        n: usize,
        p: impl Fn(usize) -> [f32; L],
    ) -> [f32; L] {
        let AccumVariant { bits, block } = variant;
        let block = block.max(1);
        let add = |mut a: [f32; L], b: [f32; L]| {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
            a
        };
        let fast = |lo: usize, hi: usize| {
            let mut acc = [0.0f32; L];
            let mut i = lo;
            while i < hi {
                let end = (i + block).min(hi);
                let part = (i..end).fold([0.0f32; L], |a, j| add(a, p(j)));
                for (x, y) in acc.iter_mut().zip(part) {
                    *x = truncate_bits(*x + y, bits);
                }
                i = end;
            }
            acc
        };
        match self {
            AccumModel::Exact => (0..n).fold([0.0f32; L], |acc, i| add(acc, p(i))),
            AccumModel::Fast => fast(0, n),
            AccumModel::FastPromote => {
                let mut acc = [0.0f32; L];
                let mut start = 0;
                while start < n {
                    let end = (start + PROMOTE_INTERVAL).min(n);
                    acc = add(acc, fast(start, end));
                    start = end;
                }
                acc
            }
        }
    }
}

/// Output columns [`AccumModel::row_sums`] computes at once.
pub const ROW_LANES: usize = 16;

/// One plausible fast accumulator: how many significant bits it keeps and how many
/// consecutive products it sums (in f32) before each addition into it. The model's nominal
/// accumulator ([`AccumVariant::NOMINAL`]) keeps [`FAST_BITS`] and adds every product on its
/// own; the hardware's exact behaviour is not published, which is what
/// [`AccumVariant::SPREAD`] stands for (see `super::model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AccumVariant {
    pub bits: u32,
    pub block: usize,
}

impl AccumVariant {
    /// [`FAST_BITS`] bits, one product at a time: what [`AccumModel::dot`] emulates.
    pub const NOMINAL: AccumVariant = AccumVariant {
        bits: FAST_BITS,
        block: 1,
    };
    /// The accumulators the model-based check measures the nominal one against: a bit fewer,
    /// a bit more, and the products of one FP8 MMA instruction (K = 32) summed before they
    /// reach the accumulator.
    pub const SPREAD: [AccumVariant; 3] = [
        AccumVariant {
            bits: FAST_BITS - 1,
            block: 1,
        },
        AccumVariant {
            bits: FAST_BITS + 1,
            block: 1,
        },
        AccumVariant {
            bits: FAST_BITS,
            block: 32,
        },
    ];
}

impl std::fmt::Display for AccumModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `x` truncated toward zero to `bits` significant bits (normal f32; subnormals keep the
/// same absolute quantum as the smallest normal binade; NaN and ±inf unchanged).
#[inline]
pub fn truncate_bits(x: f32, bits: u32) -> f32 {
    if !x.is_finite() || bits >= 24 {
        return x;
    }
    let drop = 24 - bits;
    f32::from_bits(x.to_bits() & !((1u32 << drop) - 1))
}

#[cfg(test)]
mod tests {
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

    /// Known answers for the coefficient, written from the module documentation with literal
    /// constants (`u32 = 2^-24`, `u_fast = 2^-13 + 2^-24 + 2^-37`, `N_C = 128`), not by calling
    /// [`gamma`]: a change to any term of any model fails here.
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
        for n in [0usize, 1, 2, 16, 128, 129, 300, 4096] {
            let nf = n as f64;
            close(AccumModel::Exact.coefficient(n), g(nf, u32_));
            close(AccumModel::Fast.coefficient(n), g(nf, u_fast));
        }
        // Fast with K = 16: 16·u_fast / (1 - 16·u_fast), about 1.958e-3.
        close(AccumModel::Fast.coefficient(16), 1.9579046907622208e-3);
        // The fast accumulator cannot resolve 8189 products: n·u_fast >= 1 from there on.
        assert_eq!(AccumModel::Fast.coefficient(8188), g(8188.0, u_fast));
        assert!(AccumModel::Fast.coefficient(8188).is_finite());
        assert!(AccumModel::Fast.coefficient(8189).is_infinite());
        // FastPromote: (1 + γ(min(n, 128), u_fast))·(1 + γ(ceil(n/128), u32)) - 1.
        let promote =
            |inner: f64, outer: f64| (1.0 + g(inner, u_fast)) * (1.0 + g(outer, u32_)) - 1.0;
        close(AccumModel::FastPromote.coefficient(0), 0.0);
        close(AccumModel::FastPromote.coefficient(1), promote(1.0, 1.0));
        close(
            AccumModel::FastPromote.coefficient(100),
            promote(100.0, 1.0),
        );
        close(
            AccumModel::FastPromote.coefficient(128),
            promote(128.0, 1.0),
        );
        close(
            AccumModel::FastPromote.coefficient(129),
            promote(128.0, 2.0),
        );
        close(
            AccumModel::FastPromote.coefficient(300),
            promote(128.0, 3.0),
        );
        close(
            AccumModel::FastPromote.coefficient(8192),
            promote(128.0, 64.0),
        );
    }

    /// The emulation on small hand-worked sums: truncation after every addition, the blocks of
    /// a variant, and promotion every 128 products.
    #[test]
    fn dot_known_answers() {
        let tiny = 2f32.powi(-14);
        // 1, then three products of 2^-14: each is truncated away by a 14-bit accumulator.
        let p = |i: usize| if i == 0 { 1.0 } else { tiny };
        assert_eq!(AccumModel::Fast.dot(4, p), 1.0);
        assert_eq!(AccumModel::Exact.dot(4, p), 1.0 + 3.0 * tiny);
        assert_eq!(AccumModel::Fast.dot(0, p), 0.0);
        assert_eq!(AccumModel::Exact.dot(0, p), 0.0);
        // 15 bits keep each 2^-14.
        let v15 = AccumVariant { bits: 15, block: 1 };
        assert_eq!(AccumModel::Fast.dot_variant(v15, 4, p), 1.0 + 3.0 * tiny);
        // Blocks of 2: [1 + 2^-14] truncated to 1, then [2^-14 + 2^-14] = 2^-13 kept.
        let b2 = AccumVariant { bits: 14, block: 2 };
        assert_eq!(AccumModel::Fast.dot_variant(b2, 4, p), 1.0 + 2.0 * tiny);
        // A block of 3 over 4 products: [1 + 2·2^-14] = 1 + 2^-13 kept, then 2^-14 dropped.
        let b3 = AccumVariant { bits: 14, block: 3 };
        assert_eq!(AccumModel::Fast.dot_variant(b3, 4, p), 1.0 + 2.0 * tiny);
        // Block 0 is read as 1.
        let b0 = AccumVariant { bits: 14, block: 0 };
        assert_eq!(AccumModel::Fast.dot_variant(b0, 4, p), 1.0);
        // Exact ignores the bits.
        let v8 = AccumVariant { bits: 8, block: 1 };
        assert_eq!(AccumModel::Exact.dot_variant(v8, 4, p), 1.0 + 3.0 * tiny);
        // Promotion: 1 at the start of each chunk of 128, then 2^-14 products. Without
        // promotion all of them after the first are dropped; with it every chunk starts from
        // 0, so chunk 1 (products 128..256) keeps its own 1 + 127·2^-14 = 1 + 0.00775…
        // truncated to 14 bits per addition: each 2^-14 added to 1 is dropped again.
        let q = |i: usize| if i.is_multiple_of(128) { 1.0 } else { tiny };
        assert_eq!(AccumModel::Fast.dot(300, q), 3.0);
        assert_eq!(AccumModel::FastPromote.dot(300, q), 3.0);
        // Products in chunk order small first: 127 · 2^-14 accumulate exactly (below 2^-7 the
        // accumulator has room), then 1 at the end of the chunk.
        let r = |i: usize| if i % 128 == 127 { 1.0 } else { tiny };
        let chunk = 127.0 * tiny; // exact: 127 needs 7 bits
        assert_eq!(
            AccumModel::FastPromote.dot(256, r),
            2.0 * super::truncate_bits(chunk + 1.0, 14)
        );
        assert_eq!(
            AccumModel::FastPromote.dot(130, r),
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
    /// bits, one product at a time), one bit fewer, one bit more, and blocks of one FP8 MMA
    /// instruction (K = 32).
    #[test]
    fn variants_are_the_documented_ones() {
        let v = |bits, block| AccumVariant { bits, block };
        assert_eq!(AccumVariant::NOMINAL, v(14, 1));
        assert_eq!(AccumVariant::SPREAD, [v(13, 1), v(15, 1), v(14, 32)]);
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
        assert!(AccumModel::Fast.coefficient(8192).is_infinite());
        assert!(AccumModel::FastPromote.coefficient(8192) < 0.02);
        assert!(AccumModel::Exact.coefficient(4096) < 3e-4);
        assert_eq!(
            AccumModel::parse("fast-promote"),
            Some(AccumModel::FastPromote)
        );
    }
}
