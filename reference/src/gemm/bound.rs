//! The a-priori per-element error bound of a grouped GEMM.
//!
//! ## Derivation
//! An element `y = Σ_{i=1..n} a_i·b_i` (for fwd `n = K`, dgrad `n = N`, wgrad `n = size_g`) is
//! computed by an implementation that declares a [`Precision`]: inputs already in `input`
//! format (no input rounding: moecheck generates representable values), products and sums in
//! the accumulator format with unit roundoff `u_acc` and smallest subnormal `η_acc`, result
//! rounded once to `output` (`u_out`, `η_out`).
//!
//! 1. **Accumulation, any order.** Whatever the summation order (sequential, pairwise, split-K,
//!    a tensor-core tree), each product is rounded once and passes through at most `n - 1`
//!    additions, so ([Higham 2002, §3.1, eq. 3.5]) the accumulated `ŝ` satisfies
//!    `|ŝ - y| <= γ_d·Σ|a_i b_i| + d·η_acc` with `γ_d = d·u_acc / (1 - d·u_acc)` and the depth
//!    `d = n`. A blocked accumulator (partial sums over `B` consecutive products, then the
//!    partials summed) has depth `d = min(n, B) + ceil(n/B) - 1`. The `d·η_acc` term bounds
//!    underflow (each rounding adds at most `η_acc/2` beyond the relative error) and is only
//!    present when some product is non-zero.
//! 2. **Output rounding.** `|fl_out(ŝ) - ŝ| <= u_out·|ŝ| + η_out/2`, and `|ŝ| <= |y| + |ŝ - y|`.
//! 3. **The reference's own error.** moecheck's `y_ref` is an f64 GEMM, so
//!    `|y_ref - y| <= γ(n, 2^-53)·Σ|a_i b_i|`, which enters twice (once for `y` against `y_ref`,
//!    once through `u_out·|y|`). This holds for any summation order in which each product meets
//!    at most `n` roundings: [`crate::engine`] (FMA chains over `K` blocks of
//!    [`crate::engine::KC`], depth `min(n, KC) + ceil(n/KC) - 1 <= n`) and any dgemm in
//!    another order qualify, and products of f32-valued inputs cannot
//!    underflow in f64, so no absolute term is needed.
//!
//! Together, with `S = Σ|a_i b_i|` and `γ_ref = γ(n, 2^-53)`:
//!
//! `|ŷ - y_ref| <= (γ_d·(1 + u_out) + γ_ref·(2 + u_out))·S + u_out·|y_ref| + η_out/2 + [S > 0]·d·η_acc·(1 + u_out)`
//!
//! The bound grows with `S`, so any `S' >= S` in its place gives a bound too. The kernel's
//! magnitudes are such an `S'` where the CPU has AVX-512 (operands rounded up to bf16, summed in
//! f32, then scaled up by their own worst rounding: at most about `2γ(n + 1, 2^-23)` above `S`,
//! see `reference/src/engine/bf16mag.rs`), and `S` summed in f64 elsewhere (within `γ(n, 2^-53)` of it, far
//! below the bound's own coefficients).
//!
//! Where every product is zero (`S = 0`: K = 0, an empty expert's `drhs`, a tail row) the bound
//! is `η_out/2`, below the smallest non-zero output value, so only an exact 0 passes. When
//! `d·u_acc >= 1` the bound is infinite and the report says the check is vacuous.
//!
//! The bound grows with the depth and with `u_acc`, so declaring a lower-precision accumulator
//! than the implementation really uses only loosens the check; declaring a higher one is how
//! moecheck catches an accumulator that is not what it claims.

use serde::{Deserialize, Serialize};

use crate::format::Format;

/// How an implementation accumulates a dot product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accumulator {
    /// The format partial sums (and products) are held in.
    pub format: Format,
    /// `Some(B)`: partial sums over `B` consecutive products, then the partials are summed (a
    /// K-blocked kernel). `None`: any order, depth `n`.
    pub block: Option<usize>,
}

impl Accumulator {
    /// Any-order accumulation in `format`.
    pub const fn any_order(format: Format) -> Accumulator {
        Accumulator {
            format,
            block: None,
        }
    }

    /// The reduction depth `d` for a dot product of length `n` (see the module docs).
    pub fn depth(&self, n: usize) -> usize {
        match self.block {
            _ if n == 0 => 0,
            None => n,
            Some(b) => {
                let b = b.max(1);
                (n.min(b) + n.div_ceil(b) - 1).min(n)
            }
        }
    }
}

/// The precision an implementation declares: what its inputs are, how it accumulates, and
/// what it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Precision {
    pub input: Format,
    pub accumulator: Accumulator,
    pub output: Format,
}

/// `γ(d, u)`, the rounding-error constant of `d` roundings ([`crate::format::gamma`]).
pub use crate::format::gamma;

/// The bound for all elements that share one reduction length `n` (one pass of one case).
///
/// ```
/// use moecheck_reference::format::Format;
/// use moecheck_reference::gemm::{Accumulator, ErrorBound, Precision};
/// let p = Precision {
///     input: Format::Bf16,
///     accumulator: Accumulator::any_order(Format::F32),
///     output: Format::F32,
/// };
/// let b = ErrorBound::new(&p, 1024);
/// // S = Σ|ab| = 1000, y = 10: about 1024·2^-24·1000 + 2^-24·10 ≈ 6.1e-2.
/// let t = b.at(1000.0, 10.0);
/// assert!(t > 6.1e-2 && t < 6.2e-2);
/// assert!(b.at(0.0, 0.0) < 1e-44); // exact zero demanded where every product is zero
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorBound {
    /// Coefficient of `S = Σ|a·b|`.
    pub coeff_magnitude: f64,
    /// Coefficient of `|y_ref|` (`u_out`).
    pub coeff_value: f64,
    /// Constant term (`η_out/2`).
    pub floor: f64,
    /// Underflow term, added when `S > 0`.
    pub underflow: f64,
    /// The reduction depth used.
    pub depth: usize,
}

impl ErrorBound {
    /// The bound for dot products of length `n` under `precision`.
    pub fn new(precision: &Precision, n: usize) -> ErrorBound {
        let acc = precision.accumulator.format.info();
        let out = precision.output.info();
        let d = precision.accumulator.depth(n);
        let u_out = out.unit_roundoff();
        let g_acc = gamma(d, acc.unit_roundoff());
        let g_ref = gamma(n, Format::F64.info().unit_roundoff());
        ErrorBound {
            coeff_magnitude: g_acc * (1.0 + u_out) + g_ref * (2.0 + u_out),
            coeff_value: u_out,
            floor: out.min_subnormal() / 2.0,
            underflow: d as f64 * acc.min_subnormal() * (1.0 + u_out),
            depth: d,
        }
    }

    /// The bound on `|ŷ - y_ref|` for an element with magnitude `S = Σ|a·b|` and reference
    /// value `y_ref`.
    ///
    /// `S = 0` means every product is exactly 0 (an empty sum: `K = 0`, a tail row, an empty
    /// expert's `drhs`, or all-zero operands), so the exact result is 0 and every correct
    /// accumulation in any format returns exactly ±0: the bound is 0, and a value as small as
    /// 1e-50 written in a float64 output file fails.
    #[inline]
    pub fn at(&self, magnitude: f64, value: f64) -> f64 {
        self.linear().at(magnitude, value)
    }

    /// The bound as the statistics compute it for a row at a time ([`crate::stats`]).
    pub(crate) fn linear(&self) -> crate::stats::Linear {
        crate::stats::Linear {
            value: self.coeff_value,
            floor: self.floor,
            magnitude: self.coeff_magnitude,
            underflow: self.underflow,
        }
    }

    /// Whether the bound is infinite (the accumulator cannot resolve a sum this long).
    pub fn is_vacuous(&self) -> bool {
        !self.coeff_magnitude.is_finite()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_of_blocked_accumulation() {
        let a = Accumulator {
            format: Format::F32,
            block: Some(128),
        };
        assert_eq!(a.depth(0), 0);
        assert_eq!(a.depth(100), 100);
        assert_eq!(a.depth(128), 128);
        assert_eq!(a.depth(129), 129);
        assert_eq!(a.depth(1024), 128 + 8 - 1);
        assert_eq!(Accumulator::any_order(Format::F32).depth(1024), 1024);
    }

    #[test]
    fn bound_grows_with_depth_and_roundoff() {
        let p = |acc| Precision {
            input: Format::Bf16,
            accumulator: Accumulator::any_order(acc),
            output: Format::F32,
        };
        let b16 = ErrorBound::new(&p(Format::F32), 16).at(1.0, 0.0);
        let b1k = ErrorBound::new(&p(Format::F32), 1024).at(1.0, 0.0);
        let bbf = ErrorBound::new(&p(Format::Bf16), 16).at(1.0, 0.0);
        assert!(b1k > 60.0 * b16, "{b1k} vs {b16}");
        assert!(bbf > 60_000.0 * b16);
        assert!(ErrorBound::new(&p(Format::Bf16), 300).is_vacuous());
    }

    /// Known answers, computed by hand from the formulas in the module documentation
    /// (`γ(n, u) = n·u / (1 - n·u)`): they pin every term (γ's formula, the output rounding
    /// `u_out·|y|`, the floor, the underflow term), so weakening any of them fails here.
    #[test]
    fn known_answers() {
        let p = |acc| Precision {
            input: Format::Bf16,
            accumulator: Accumulator::any_order(acc),
            output: Format::F32,
        };
        let close = |got: f64, want: f64| {
            assert!(
                (got - want).abs() <= 1e-15 * want,
                "got {got:e}, want {want:e}"
            )
        };
        // γ(16, 2^-24) = 16·2^-24 / (1 - 16·2^-24).
        let pow2 = crate::format::pow2;
        close(gamma(16, pow2(-24)), 9.536752259018191e-7);
        assert_eq!(gamma(256, pow2(-8)), f64::INFINITY);
        // f32 accumulator, K = 16, S = 1, y = 0.5:
        // γ(16, 2^-24)(1 + 2^-24) + γ(16, 2^-53)(2 + 2^-24) + 2^-24·0.5 + 2^-150 + 16·2^-149(1 + 2^-24).
        close(
            ErrorBound::new(&p(Format::F32), 16).at(1.0, 0.5),
            9.834776086857014e-7,
        );
        // bf16 accumulator, K = 16, S = 1, y = 0: γ(16, 2^-8) dominates; the underflow term
        // is 16·2^-133.
        close(
            ErrorBound::new(&p(Format::Bf16), 16).at(1.0, 0.0),
            0.0666666706403132,
        );
        // S = 0: an empty sum is exactly 0 in every format.
        for acc in [Format::F32, Format::Bf16, Format::F16] {
            assert_eq!(ErrorBound::new(&p(acc), 16).at(0.0, 0.0), 0.0);
            assert_eq!(ErrorBound::new(&p(acc), 0).at(0.0, 0.0), 0.0);
        }
        assert!(!ErrorBound::new(&p(Format::F32), 16).is_vacuous());
    }

    /// Each field of [`ErrorBound`] on its own, where the known answers above cannot see a term
    /// next to a much larger one: with an f64 accumulator `γ_d = γ_ref`, so the coefficient is
    /// `γ_ref·((1 + u_out) + (2 + u_out))`; the floor and the underflow term are exact powers
    /// of two times `(1 + u_out)`; and [`ErrorBound::at`] adds its four terms.
    #[test]
    fn known_answers_per_term() {
        let prec = |acc, out| Precision {
            input: Format::Bf16,
            accumulator: Accumulator::any_order(acc),
            output: out,
        };
        let u_out = 2f64.powi(-8); // bf16
        let g_ref = 16.0 * 2f64.powi(-53) / (1.0 - 16.0 * 2f64.powi(-53));
        let b = ErrorBound::new(&prec(Format::F64, Format::Bf16), 16);
        let want = g_ref * (1.0 + u_out) + g_ref * (2.0 + u_out);
        assert!(
            (b.coeff_magnitude - want).abs() <= 1e-15 * want,
            "{} vs {want}",
            b.coeff_magnitude
        );
        assert_eq!(b.coeff_value, u_out);
        assert_eq!(b.floor, 2f64.powi(-134)); // η_bf16 / 2 = 2^-133 / 2
        assert_eq!(b.depth, 16);
        // f32 accumulator, bf16 output: 16·2^-149·(1 + 2^-8), exact.
        let b = ErrorBound::new(&prec(Format::F32, Format::Bf16), 16);
        assert_eq!(b.underflow, 16.0 * 2f64.powi(-149) * (1.0 + u_out));
        // A blocked accumulator's depth enters γ and the underflow term.
        let blocked = Precision {
            accumulator: Accumulator {
                format: Format::F32,
                block: Some(4),
            },
            ..prec(Format::F32, Format::Bf16)
        };
        let b = ErrorBound::new(&blocked, 16); // d = 4 + 4 - 1 = 7
        assert_eq!(b.depth, 7);
        assert_eq!(b.underflow, 7.0 * 2f64.powi(-149) * (1.0 + u_out));
        let g7 = 7.0 * 2f64.powi(-24) / (1.0 - 7.0 * 2f64.powi(-24));
        let want = g7 * (1.0 + u_out) + g_ref * (2.0 + u_out);
        assert!((b.coeff_magnitude - want).abs() <= 1e-15 * want);
        // at(S, y) = coeff_value·|y| + floor + coeff_magnitude·S + underflow for S > 0.
        let b = ErrorBound {
            coeff_magnitude: 1.0,
            coeff_value: 2.0,
            floor: 4.0,
            underflow: 8.0,
            depth: 0,
        };
        assert_eq!(b.at(16.0, -32.0), 2.0 * 32.0 + 4.0 + 16.0 + 8.0);
        assert_eq!(b.at(0.0, -32.0), 0.0);
        assert!(!b.is_vacuous());
        let vacuous = ErrorBound {
            coeff_magnitude: f64::INFINITY,
            ..b
        };
        assert!(vacuous.is_vacuous());
        // γ at the edge: d·u = 1 exactly is infinite (so would 1/(1 - 1) be: a `>` guard would
        // agree with `>=` there; cargo-mutants does not generate that equivalent change).
        assert_eq!(gamma(0, 0.5), 0.0);
        assert_eq!(gamma(1, 0.5), 1.0);
        assert_eq!(gamma(3, 0.25), 3.0);
        assert_eq!(gamma(4, 0.25), f64::INFINITY);
        assert_eq!(gamma(5, 0.25), f64::INFINITY);
    }
}
