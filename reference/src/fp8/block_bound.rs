//! The per-element bound of an FP8 GEMM pass with block scales ([`BlockBound`]).
//!
//! ## What the kernel does
//! Along the contraction (length `n`), the left operand's scale changes every `Ca` elements
//! and the right one's every `Cb` (`None`: constant), both grids starting at 0 (for wgrad, at
//! the group's first row). The contraction splits into `nb` **segments** on which both scales
//! are constant (the union of both grids' boundaries; DeepGEMM's `BLOCK_K = 128` meets a
//! `1 × 128` lhs and a `128 × 128` rhs in 128-long segments). Per segment `b` of length
//! `L_b <= L = min(Ca, Cb, n)`, with `s_b = Σ qa·qb` (each product exact in f32):
//!
//! 1. `ŝ_b`: the products summed in f32 from 0, in any order: `|ŝ_b − s_b| <= γ(L, u)·S_b`,
//!    `u = 2^-24`, `S_b = Σ|qa·qb|`.
//! 2. `t_b = ŝ_b · sa_b · sb_b` with two f32 roundings in any order (or one, when the two
//!    scales are multiplied first and fused into the next step): `t_b = ŝ_b·sa_b·sb_b·(1+θ_b)`,
//!    `|θ_b| <= γ2 = γ(2, u)`.
//! 3. The `t_b` summed into an f32 accumulator (`acc += t_b`, or DeepGEMM's
//!    `final_accum += scale · accum` as an FMA: at most `nb` roundings):
//!    `acc = Σ t_b (1+φ_b)`, `|φ_b| <= γ(nb, u)`.
//! 4. One rounding to the output format: `|ŷ − acc| <= u_out·|acc| + η_out/2`.
//!
//! With `y = Σ sa_b sb_b s_b` and `S = Σ sa_b sb_b S_b = Σ|x̂a·x̂b|` (the reference's
//! magnitude): `acc − y = Σ sa_b sb_b [(ŝ_b − s_b)(1+θ_b)(1+φ_b) + s_b((1+θ_b)(1+φ_b) − 1)]`, so
//!
//! `|acc − y| <= c·S`, `c = (1 + γ(L, u))·(1 + γ2)·(1 + γ(nb, u)) − 1`,
//!
//! and with the output rounding and the f64 reference's own error (`γ_ref = γ(n, 2^-53)`, as
//! [`super::Fp8Bound`]):
//!
//! `|ŷ − y_ref| <= (c·(1 + u_out) + 3·γ_ref)·S + u_out·|y_ref| + η_out/2 + [S>0]·2·nb·η_f32·(1 + γ(nb, u))·(1 + u_out)`.
//!
//! Unlike [`super::Fp8Bound`], the scaling roundings multiply `S`, not `|y|`: each segment is
//! scaled before the segments are added. The last term covers each segment's two scaling
//! multiplications underflowing (`η_f32 = 2^-149`; an MX scale of a tiny block may be an f32
//! subnormal). With no block scale on either side (`nb = 1`, `L = n`) the bound is the
//! per-scope kernel's with `γ2` moved onto `S`: never tighter than [`super::Fp8Bound`].
//! Fast accumulation (`--accum fast|fast-promote`) with block scales is refused
//! ([`super::Fp8Recipe::block_refusal`]).

use crate::format::{gamma, Format};
use crate::gemm::bound::ErrorBound;

/// The bound of one pass of a block-scaled FP8 GEMM (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockBound {
    pub output: Format,
    /// The block lengths along the contraction: (left operand, right operand).
    pub blocks: (Option<usize>, Option<usize>),
}

impl BlockBound {
    /// `(nb, L)`: how many segments a contraction of `n` splits into and the longest one
    /// (`(0, 0)` for `n = 0`).
    ///
    /// ```
    /// use moecheck_reference::fp8::block_bound::BlockBound;
    /// // 1x128 lhs against 128x128 rhs blocks, K = 300: 128 + 128 + 44.
    /// assert_eq!(BlockBound::segments(300, (Some(128), Some(128))), (3, 128));
    /// // 32 against 48: boundaries at 32, 48, 64, 96: 0..32..48..64..96..100.
    /// assert_eq!(BlockBound::segments(100, (Some(32), Some(48))), (5, 32));
    /// ```
    pub fn segments(n: usize, blocks: (Option<usize>, Option<usize>)) -> (usize, usize) {
        if n == 0 {
            return (0, 0);
        }
        let cut = |i: usize, c: Option<usize>| c.is_some_and(|c| i.is_multiple_of(c));
        let (mut count, mut longest, mut start) = (1, 0, 0);
        for i in 1..n {
            if cut(i, blocks.0) || cut(i, blocks.1) {
                count += 1;
                longest = longest.max(i - start);
                start = i;
            }
        }
        (count, longest.max(n - start))
    }

    /// The per-element bound for contraction length `n` (module docs).
    ///
    /// ```
    /// use moecheck_reference::fp8::block_bound::BlockBound;
    /// use moecheck_reference::format::Format;
    /// let b = BlockBound { output: Format::F32, blocks: (Some(128), Some(128)) }.at_len(7168);
    /// // 56 segments of 128: about (128 + 2 + 56)·2^-24 of Σ|a·b|
    /// assert!(b.coeff_magnitude > 1.10e-5 && b.coeff_magnitude < 1.12e-5);
    /// ```
    pub fn at_len(&self, n: usize) -> ErrorBound {
        let out = self.output.info();
        let u_out = out.unit_roundoff();
        let u = 2f64.powi(-24);
        let (nb, l) = Self::segments(n, self.blocks);
        let (c, underflow) = if n == 0 {
            (0.0, 0.0)
        } else {
            let g_nb = gamma(nb, u);
            let c = (1.0 + gamma(l, u)) * (1.0 + gamma(2, u)) * (1.0 + g_nb) - 1.0;
            let eta = Format::F32.info().min_subnormal();
            (c, 2.0 * nb as f64 * eta * (1.0 + g_nb) * (1.0 + u_out))
        };
        ErrorBound {
            coeff_magnitude: c * (1.0 + u_out) + 3.0 * gamma(n, 2f64.powi(-53)),
            coeff_value: u_out,
            floor: out.min_subnormal() / 2.0,
            underflow,
            depth: n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64) {
        assert!(
            (got - want).abs() <= 1e-13 * want.abs(),
            "got {got:e}, want {want:e}"
        );
    }

    #[test]
    fn segments_are_the_union_of_both_grids() {
        assert_eq!(BlockBound::segments(0, (Some(128), Some(128))), (0, 0));
        assert_eq!(BlockBound::segments(5, (None, None)), (1, 5));
        assert_eq!(BlockBound::segments(129, (Some(128), None)), (2, 128));
        assert_eq!(BlockBound::segments(127, (None, Some(128))), (1, 127));
        assert_eq!(BlockBound::segments(256, (Some(128), Some(32))), (8, 32));
        assert_eq!(BlockBound::segments(33, (Some(32), Some(32))), (2, 32));
        assert_eq!(BlockBound::segments(10, (Some(4), Some(6))), (4, 4)); // 0 4 6 8 | 10
    }

    /// Known answers with literal constants: every term of the module docs written out
    /// (`γ(n, u) = n·u / (1 − n·u)`, `u = 2^-24`, `η_f32 = 2^-149`), so a change to any
    /// coefficient fails here.
    #[test]
    fn bound_known_answers() {
        let g = |n: f64, u: f64| n * u / (1.0 - n * u);
        let u = 2f64.powi(-24);
        let g2 = g(2.0, u);
        // (output, u_out, η_out)
        for (output, u_out, eta_out) in [
            (Format::F32, 2f64.powi(-24), 2f64.powi(-149)),
            (Format::Bf16, 2f64.powi(-8), 2f64.powi(-133)),
        ] {
            // (n, blocks, nb, L): DeepGEMM's K = 7168, a K tail, MX's 32, a short wgrad group.
            for (n, blocks, nb, l) in [
                (7168usize, (Some(128), Some(128)), 56.0, 128.0),
                (300, (Some(128), Some(128)), 3.0, 128.0),
                (100, (Some(32), Some(32)), 4.0, 32.0),
                (20, (Some(32), Some(32)), 1.0, 20.0),
                (200, (Some(128), None), 2.0, 128.0),
            ] {
                let b = BlockBound { output, blocks }.at_len(n);
                let c = (1.0 + g(l, u)) * (1.0 + g2) * (1.0 + g(nb, u)) - 1.0;
                let want = c * (1.0 + u_out) + 3.0 * g(n as f64, 2f64.powi(-53));
                close(b.coeff_magnitude, want);
                assert_eq!(b.coeff_value, u_out);
                assert_eq!(b.floor, eta_out / 2.0);
                close(
                    b.underflow,
                    2.0 * nb * 2f64.powi(-149) * (1.0 + g(nb, u)) * (1.0 + u_out),
                );
                assert_eq!(b.depth, n);
            }
        }
        // Worked numbers (f32 output, S = 1, y = 0.5), computed from the formula in exact
        // rational arithmetic; the f64 `(…) − 1` of `c` cancels about 11 digits' worth of
        // 2^-53, hence 1e-9 here.
        let near = |got: f64, want: f64| {
            assert!(
                (got - want).abs() <= 1e-9 * want,
                "got {got:e}, want {want:e}"
            )
        };
        // DeepGEMM K = 7168: c = (1+γ(128))(1+γ(2))(1+γ(56)) − 1.
        let b = BlockBound {
            output: Format::F32,
            blocks: (Some(128), Some(128)),
        }
        .at_len(7168);
        near(b.at(1.0, 0.5), 1.11163654360486e-5);
        // MX, K = 100: segments 32, 32, 32, 4.
        let b = BlockBound {
            output: Format::F32,
            blocks: (Some(32), Some(32)),
        }
        .at_len(100);
        near(b.at(1.0, 0.5), 2.2947834117468845e-6);
        // No products: an exact 0 is demanded.
        let b0 = BlockBound {
            output: Format::F32,
            blocks: (Some(128), Some(128)),
        }
        .at_len(0);
        assert_eq!(b0.coeff_magnitude, 0.0);
        assert_eq!(b0.at(0.0, 0.0), 0.0);
    }
}
