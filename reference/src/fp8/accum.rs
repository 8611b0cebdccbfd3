//! Accumulation models of an FP8 GEMM: exact f32, and Hopper's limited-precision "fast
//! accumulation" with and without promotion to f32.
//!
//! The products `qa·qb` of two FP8 values are exact in f32 (at most 4 × 4 significant bits,
//! magnitudes `>= 2^-32`), so all error comes from the sums.
//!
//! * [`AccumModel::Exact`]: every partial sum is an f32 (round to nearest even). Any order,
//!   depth `n`: `|ŝ - s| <= γ(n, 2^-24)·Σ|qa·qb|` ([Higham 2002, §3.1]).
//! * [`AccumModel::Fast`]: Hopper's FP8 tensor-core accumulator, modelled as
//!   [`AccumVariant::NOMINAL`] — the one place its parameters live: one MMA instruction's
//!   k-block of [`FAST_K_BLOCK`] = 32 products is summed (in f32 here) and added into an
//!   accumulator that keeps [`FAST_BITS`] = 14 significant bits (e8m13), truncating toward
//!   zero. Sources: the DeepSeek-V3 technical report (§3.3.2: "around 14 bits", about 2%
//!   worst relative error at K = 4096 on H800) and NVIDIA/PyTorch write-ups (an e8m13
//!   accumulator: the low 10 bits of an FP8 GEMM's f32 output carry nothing). The k-block
//!   granularity is what the wgmma instruction for 8-bit types does (K = 32 per instruction);
//!   the model has not been checked against a GPU yet.
//! * [`AccumModel::FastPromote`]: the same inside chunks of [`PROMOTE_INTERVAL`] = `N_C` = 128
//!   products (DeepSeek-V3: promotion to CUDA-core f32 registers every 4 WGMMAs), each chunk's
//!   partial added to an f32 accumulator.
//!
//! ## The bound in running form ([`AccumModel::running`])
//! Let the accumulator add blocks `j = 1..J` (`J = ⌈n/b⌉`, `b` the k-block), `S_j` the exact
//! partial sum after block `j`, `B_j` block `j`'s exact sum and `β_j = γ(b - 1, 2^-24)·Σ_block|p|`
//! the error of summing it in f32. Each addition is an f32 addition followed by the
//! accumulator's rounding, relative error at most `u_f` ([`AccumVariant::step_roundoff`]:
//! `2^(1-bits) + 2^-24 + 2^(1-bits)·2^-24` truncating, `2^-bits + …` to nearest). With
//! `e_j` the accumulator's error after block `j`,
//! `|e_j| <= (1 + u_f)·(|e_{j-1}| + β_j) + u_f·|S_j|`, so
//!
//! `|ŝ - s| <= (1 + γ(J, u_f))·(γ(b - 1, 2^-24)·S + u_f·R)`,  `S = Σ|p|`, `R = Σ_j |S_j|`.
//!
//! `R` is the sum of the magnitudes of the partial sums the accumulator holds: for products
//! of random signs it grows like `J^1.5` while the worst case `R <= J·S` grows like `J·S`,
//! which is why the worst-case coefficient ([`AccumModel::coefficient`], `R` replaced by
//! `J·S`) admits an all-zero output from K ≈ 4096 while the running form keeps its teeth
//! (`super::running` computes `R` from the recipe-exact operands). Under promotion each chunk
//! starts from 0 (its own `S_j`), and the `⌈n/N_C⌉` chunk sums are added in f32:
//! `(1 + γ(nc, 2^-24))·(1 + γ(J_c, u_f))·(γ(b-1, 2^-24)·S + u_f·R) + γ(nc, 2^-24)·S`, `J_c` the
//! blocks in one chunk.
//!
//! ## The covering bound ([`AccumModel::covering`])
//! The model's parameters are public measurements, not checked on a GPU here; DeepSeek-V3's
//! ~2% at K = 4096 is nearer an accumulator of k-blocks of 4 than of 32. A correct kernel on
//! such hardware must not FAIL, so the comparison has a second, covering bound for every
//! accumulator of [`AccumVariant::COVER`] or better (at least 13 bits, k-blocks of at least 4
//! that divide 32, in increasing k), written with the same `S` and nominal `R`: inside a
//! k-block `j` of 32, every partial sum is at most `|S_{j-1}| + A_j` (`A_j` the block's
//! `Σ|p|`), so the 8 partial sums of a 4-block accumulator there add to at most
//! `8·(|S_{j-1}| + A_j)`, and over the blocks `R_4 <= 8·(R + S)`. With `u_c` the covering
//! variant's step roundoff and `J_c = ⌈n/4⌉` its additions:
//! `|ŝ - s| <= (1 + γ(J_c, u_c))·((γ(3, 2^-24) + 8·u_c)·S + 8·u_c·R)` (per chunk under
//! promotion, as above). An element beyond the nominal bound but within this one is
//! INCONCLUSIVE, beyond it a FAIL (`super::compare`).
//!
//! [`AccumModel::dot`] is the emulation; the test `error_grows_with_k` shows it against K.

use serde::{Deserialize, Serialize};

use crate::gemm::bound::gamma;

/// Significant bits the fast accumulator keeps (e8m13; DeepSeek-V3: "around 14 bits").
pub const FAST_BITS: u32 = 14;
/// Products one FP8 MMA instruction sums before they reach the fast accumulator.
pub const FAST_K_BLOCK: usize = 32;
/// `N_C`: products per chunk before promotion to f32 (DeepSeek-V3: 128).
pub const PROMOTE_INTERVAL: usize = 128;

/// How the sum of FP8 products is accumulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccumModel {
    /// f32 partial sums, round to nearest even.
    #[default]
    Exact,
    /// [`AccumVariant::NOMINAL`]: k-blocks of 32 into a 14-bit truncating accumulator.
    Fast,
    /// [`AccumModel::Fast`] within chunks of [`PROMOTE_INTERVAL`], chunks summed in f32.
    FastPromote,
}

/// The two coefficients of the running-form bound `|ŝ - s| <= s·S + r·R` (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Running {
    /// Coefficient of `S = Σ|p|`.
    pub s: f64,
    /// Coefficient of `R = Σ_j |S_j|`, the magnitudes of the accumulator's partial sums.
    pub r: f64,
    /// Additions into the fast accumulator per element (per chunk under promotion): the
    /// worst case `R <= steps·S`.
    pub steps: usize,
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

    /// The relative error of one addition into the nominal fast accumulator.
    pub fn fast_step_roundoff() -> f64 {
        AccumVariant::NOMINAL.step_roundoff()
    }

    /// The partial sums' span for `n` products: the chunk under promotion, all of them
    /// otherwise ([`AccumModel::Exact`] has no fast accumulator: `n`).
    pub fn chunk(self, n: usize) -> usize {
        match self {
            AccumModel::FastPromote => PROMOTE_INTERVAL,
            _ => n.max(1),
        }
    }

    /// The running-form coefficients for `n` products (module docs). [`AccumModel::Exact`]
    /// has `r = 0`: its bound needs no partial sums.
    pub fn running(self, n: usize) -> Running {
        let u32_ = 2f64.powi(-24);
        let v = AccumVariant::NOMINAL;
        let u = v.step_roundoff();
        let block_sum = gamma(n.min(v.block).saturating_sub(1), u32_);
        match self {
            AccumModel::Exact => Running {
                s: gamma(n, u32_),
                r: 0.0,
                steps: 0,
            },
            AccumModel::Fast => {
                let steps = n.div_ceil(v.block);
                let grow = 1.0 + gamma(steps, u);
                Running {
                    s: grow * block_sum,
                    r: grow * u,
                    steps,
                }
            }
            AccumModel::FastPromote => {
                let steps = n.min(PROMOTE_INTERVAL).div_ceil(v.block);
                let outer = gamma(n.div_ceil(PROMOTE_INTERVAL), u32_);
                let grow = (1.0 + outer) * (1.0 + gamma(steps, u));
                Running {
                    s: grow * block_sum + outer,
                    r: grow * u,
                    steps,
                }
            }
        }
    }

    /// The covering bound's coefficients for `n` products, in `S` and the *nominal* `R`
    /// (module docs, "The covering bound"); `r = 0` for [`AccumModel::Exact`].
    pub fn covering(self, n: usize) -> Running {
        let u32_ = 2f64.powi(-24);
        let (v, c) = (AccumVariant::NOMINAL, AccumVariant::COVER);
        let per = (v.block / c.block) as f64;
        let u = c.step_roundoff();
        let block_sum = gamma(n.min(c.block).saturating_sub(1), u32_);
        let (steps, outer) = match self {
            AccumModel::Exact => return self.running(n),
            AccumModel::Fast => (n.div_ceil(c.block), 0.0),
            AccumModel::FastPromote => (
                n.min(PROMOTE_INTERVAL).div_ceil(c.block),
                gamma(n.div_ceil(PROMOTE_INTERVAL), u32_),
            ),
        };
        let grow = (1.0 + outer) * (1.0 + gamma(steps, u));
        Running {
            s: grow * (block_sum + per * u) + outer,
            r: grow * per * u,
            steps,
        }
    }

    /// The covering bound's worst case in `Σ|qa·qb|` alone (the nominal `R <= steps·S`): what
    /// fast verification judges a fast accumulator with.
    pub fn covering_coefficient(self, n: usize) -> f64 {
        let c = self.covering(n);
        c.s + c.r * self.running(n).steps as f64
    }

    /// The worst-case coefficient `c` with `|ŝ - s| <= c·Σ|qa·qb|` for `n` products: the
    /// running form with `R <= steps·S` (module docs). What fast verification and the
    /// unquantised comparison use, where `R` is not computed.
    pub fn coefficient(self, n: usize) -> f64 {
        let r = self.running(n);
        r.s + r.r * r.steps as f64
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
    /// use moecheck_reference::fp8::{AccumModel, AccumRounding, AccumVariant};
    /// let p = |i: usize| if i == 0 { 1.0 } else { 2f32.powi(-14) };
    /// let one_at_a_time = |bits| AccumVariant { bits, block: 1, rounding: AccumRounding::TowardZero };
    /// // With 15 bits the accumulator keeps the second product, with 14 it drops it (summed
    /// // in a block first or not: 1 + 2^-14 is truncated either way).
    /// assert_eq!(AccumModel::Fast.dot_variant(one_at_a_time(15), 2, p), 1.0 + 2f32.powi(-14));
    /// assert_eq!(AccumModel::Fast.dot_variant(AccumVariant::NOMINAL, 2, p), 1.0);
    /// // Three products of 2^-14 after the 1: one at a time each is dropped; in one block they
    /// // add up to 3·2^-14 first, and 1 + 3·2^-14 keeps 1 + 2^-13.
    /// let q = |i: usize| if i == 0 { 1.0 } else { 2f32.powi(-14) };
    /// assert_eq!(AccumModel::Fast.dot_variant(one_at_a_time(14), 4, q), 1.0);
    /// assert_eq!(AccumModel::Fast.dot(4, q), 1.0 + 2f32.powi(-13));
    /// ```
    pub fn dot_variant(self, variant: AccumVariant, n: usize, p: impl Fn(usize) -> f32) -> f32 {
        let block = variant.block.max(1);
        // The truncating accumulator over products `lo..hi`, fed `block` products at a time.
        let fast = |lo: usize, hi: usize| {
            let mut acc = 0.0f32;
            let mut i = lo;
            while i < hi {
                let end = (i + block).min(hi);
                let part = (i..end).fold(0.0f32, |a, j| a + p(j));
                acc = variant.round(acc + part);
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
        let block = variant.block.max(1);
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
                    *x = variant.round(*x + y);
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

/// How a fast accumulator rounds after each addition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccumRounding {
    /// Toward zero (the low bits dropped): what the public measurements describe.
    TowardZero,
    /// To nearest, ties to even.
    NearestEven,
}

/// One fast accumulator: the significant bits it keeps, how many consecutive products it
/// sums (in f32) before each addition into it, and how it rounds after each addition.
/// [`AccumVariant::NOMINAL`] is the model ([`AccumModel::Fast`]); the hardware's exact
/// behaviour is not published, which is what [`AccumVariant::SPREAD`] stands for (see
/// `super::model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AccumVariant {
    pub bits: u32,
    pub block: usize,
    pub rounding: AccumRounding,
}

impl AccumVariant {
    /// The model: [`FAST_BITS`] bits, k-blocks of [`FAST_K_BLOCK`], truncation.
    pub const NOMINAL: AccumVariant = AccumVariant {
        bits: FAST_BITS,
        block: FAST_K_BLOCK,
        rounding: AccumRounding::TowardZero,
    };
    /// The least accurate accumulator the covering bound admits: 13 bits, k-blocks of 4.
    pub const COVER: AccumVariant = AccumVariant {
        bits: FAST_BITS - 1,
        block: 4,
        rounding: AccumRounding::TowardZero,
    };
    /// The accumulators the model-based check measures the nominal one against: a bit fewer,
    /// a bit more, and half an instruction's k-block.
    pub const SPREAD: [AccumVariant; 3] = [
        AccumVariant {
            bits: FAST_BITS - 1,
            ..AccumVariant::NOMINAL
        },
        AccumVariant {
            bits: FAST_BITS + 1,
            ..AccumVariant::NOMINAL
        },
        AccumVariant {
            block: FAST_K_BLOCK / 2,
            ..AccumVariant::NOMINAL
        },
    ];

    /// The relative error of one addition: an f32 addition (`2^-24`) then this rounding
    /// (`2^(1-bits)` toward zero, `2^-bits` to nearest).
    pub fn step_roundoff(self) -> f64 {
        let t = match self.rounding {
            AccumRounding::TowardZero => 2f64.powi(1 - self.bits as i32),
            AccumRounding::NearestEven => 2f64.powi(-(self.bits as i32)),
        };
        let u32_ = 2f64.powi(-24);
        t + u32_ + t * u32_
    }

    /// `x` rounded to this accumulator's bits.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self.rounding {
            AccumRounding::TowardZero => truncate_bits(x, self.bits),
            AccumRounding::NearestEven => nearest_bits(x, self.bits),
        }
    }
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

/// `x` rounded to nearest (ties to even) to `bits` significant bits (normal f32; NaN and ±inf
/// unchanged; a value that rounds past the largest f32 becomes ±inf).
#[inline]
pub fn nearest_bits(x: f32, bits: u32) -> f32 {
    if !x.is_finite() || bits >= 24 || bits == 0 {
        return x;
    }
    let drop = 24 - bits;
    let b = x.to_bits();
    let rem = b & ((1u32 << drop) - 1);
    let half = 1u32 << (drop - 1);
    let kept = b & !((1u32 << drop) - 1);
    let up = rem > half || (rem == half && (kept >> drop) & 1 == 1);
    // Sign-magnitude: adding one quantum to the magnitude bits carries into the exponent.
    f32::from_bits(if up { kept + (1u32 << drop) } else { kept })
}

#[cfg(test)]
#[path = "accum_tests.rs"]
mod tests;
