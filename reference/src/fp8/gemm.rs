//! The FP8 grouped GEMM: the recipe-exact reference and its bound (the case and its recipe
//! are [`super::case`]).
//!
//! ## The passes
//! * fwd:   `out_g  = lhs_g (fmt_lhs, per group)  · rhs_g (fmt_rhs, per expert)`
//! * dgrad: `dlhs_g = dout_g (fmt_dout, per group) · rhs_gᵀ` (the same rhs bytes, transposed)
//! * wgrad: `drhs_g = lhs_gᵀ · dout_g`, both from the **column-wise** copies: the transposes of
//!   the row-wise bytes with the same `scale_inv` ([`super::scaling::ColumnWise`]).
//!
//! Every output element is `(Σ qa·qb) · sinv_a · sinv_b` with one `(sinv_a, sinv_b)` pair per
//! element (scales are constant over a group's rows and an expert's weight). Defaults follow
//! Transformer Engine's HYBRID format: E4M3 for `lhs` and `rhs`, E5M2 for `dout`.
//!
//! ## Recipe-exact reference
//! moecheck quantises the float32 inputs per the recipe ([`quantize_operands`]) and computes
//! the grouped GEMM of the exact dequantised values `decode(q)·scale_inv` in f64
//! ([`fp8_reference`]). An implementation that follows the recipe differs from it only by its
//! accumulation and the final scaling and rounding.
//!
//! ## The bound ([`Fp8Bound`])
//! With `S = Σ|x̂a·x̂b| = sinv_a·sinv_b·Σ|qa·qb|`, `y` the exact value, `c_acc(n)` the
//! accumulation model's coefficient ([`AccumModel::coefficient`]), `γ2 = γ(2, 2^-24)` for the
//! two f32 scaling multiplications (any order), `u_out`/`η_out` of the output format and
//! `γ_ref = γ(n, 2^-53)` the f64 reference's own error:
//!
//! `|ŷ - y_ref| <= (c_acc·(1+γ2)·(1+u_out) + 3·γ_ref)·S + (u_out + γ2·(1+u_out))·|y_ref| + η_out/2 + [S>0]·2·η_f32·(1+u_out)`
//!
//! Under a fast accumulator `c_acc·S` is replaced by the running form `c_s·S + c_r·R`
//! ([`super::accum`], [`super::running`]: `R` the magnitudes of the partial sums the
//! accumulator holds), which keeps its teeth where the worst case `c_acc·S` admits zero.
//!
//! The `η_f32` term covers the scaling multiplications underflowing (a `scale_inv` near the
//! bottom of f32); it assumes the intermediate `acc·sinv_a` is not both subnormal and then
//! multiplied by a huge `sinv_b`, which no generator produces.

use ndarray::Array3;

use super::accum::{AccumModel, AccumVariant};
use super::case::Fp8GemmCase;
use super::running::{running_magnitudes, Dequantised};
use super::scaling::{quantize_rows, quantize_rows_with_scales, ColumnWise, Quantized, Scope};
use crate::format::Format;
use crate::gemm::bound::{gamma, ErrorBound};
use crate::gemm::Weights;
use crate::gemm::{grouped_dgrad, grouped_fwd, grouped_wgrad, WideOutputs};
use crate::gemm::{Passes, ReferenceResult};
use crate::Error;

/// The quantised operands as the recipe defines them.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Operands {
    /// `(M, K)` row-wise.
    pub lhs: Quantized,
    /// `(G·K, N)`: expert `g` is rows `g·K..(g+1)·K`.
    pub rhs: Quantized,
    /// `(M, N)` row-wise (when a backward pass is asked).
    pub dout: Option<Quantized>,
    /// `(K, M)`: the column-wise copy of `lhs` (wgrad).
    pub lhs_col: ColumnWise,
    /// `(N, M)`: the column-wise copy of `dout` (wgrad).
    pub dout_col: Option<ColumnWise>,
}

impl Fp8Operands {
    /// No operands (what a run checked in shards keeps for the whole case).
    pub fn empty() -> Fp8Operands {
        let none = || Quantized {
            format: Format::E4m3,
            overflow: crate::format::Overflow::Saturate,
            q: ndarray::Array2::zeros((0, 0)),
            offsets: vec![0],
            amax: Vec::new(),
            scale: Vec::new(),
            scale_inv: Vec::new(),
        };
        Fp8Operands {
            lhs: none(),
            rhs: none(),
            dout: None,
            lhs_col: none().columnwise(),
            dout_col: None,
        }
    }
}

/// `rhs (G, K, N)` viewed as `(G·K, N)`.
pub fn rhs_rows(rhs: &Weights) -> ndarray::Array2<f32> {
    let (g, k, n) = rhs.dim();
    if let Weights::Bf16(w) = rhs {
        if let Ok(w) = w.view().into_shape_with_order((g * k, n)) {
            // Widened on every core, into memory first touched there.
            let mut a = ndarray::Array2::<f32>::zeros((g * k, n));
            crate::par::zip_rows(a.view_mut(), w, |mut a, w| {
                a.zip_mut_with(&w, |a, w| *a = w.to_f32())
            });
            return a;
        }
    }
    // One copy (the widened array when held in bf16, a clone otherwise).
    let a = rhs.f32().into_owned();
    let a = if a.is_standard_layout() {
        a
    } else {
        a.as_standard_layout().into_owned()
    };
    a.into_shape_with_order((g * k, n)).expect("contiguous")
}

/// Quantises every operand exactly per the recipe (current scaling, or the given scales).
pub fn quantize_operands(case: &Fp8GemmCase, passes: Passes) -> Fp8Operands {
    let r = &case.recipe;
    let ov = r.overflow();
    let given = case.given_scales.as_ref();
    let q = |x: ndarray::ArrayView2<f32>, scope: &Scope, fmt: Format, s: Option<&Vec<f32>>| match s
    {
        Some(s) => quantize_rows_with_scales(x, scope, s, fmt, ov),
        None => quantize_rows(x, scope, fmt, ov),
    };
    let lhs = q(
        case.gemm.lhs.view(),
        &case.row_scope(r.lhs.scope),
        r.lhs.format,
        given.map(|g| &g.lhs),
    );
    let rhs = q(
        rhs_rows(&case.gemm.rhs).view(),
        &case.rhs_scope(),
        r.rhs.format,
        given.map(|g| &g.rhs),
    );
    let dout = match (&case.gemm.dout, passes.needs_dout()) {
        (Some(d), true) => Some(q(
            d.view(),
            &case.row_scope(r.dout.scope),
            r.dout.format,
            given.map(|g| &g.dout),
        )),
        _ => None,
    };
    Fp8Operands {
        lhs_col: lhs.columnwise(),
        dout_col: dout.as_ref().map(Quantized::columnwise),
        lhs,
        rhs,
        dout,
    }
}

/// The recipe-exact reference: the f64 grouped GEMM of the dequantised operands, with the
/// magnitudes the bound scales with: `S = Σ|x̂a·x̂b|` under exact accumulation, the effective
/// magnitude `k_s·S + k_r·R` of the running form under a fast one ([`super::running`], judged
/// with [`Fp8Bound::judged`]). wgrad reads the column-wise copies.
pub fn fp8_reference(case: &Fp8GemmCase, passes: Passes) -> Result<ReferenceResult, Error> {
    case.validate(passes)?;
    let ops = quantize_operands(case, passes);
    Ok(reference_from_operands(case, &ops, passes))
}

/// [`fp8_reference`] from already quantised operands.
pub fn reference_from_operands(
    case: &Fp8GemmCase,
    ops: &Fp8Operands,
    passes: Passes,
) -> ReferenceResult {
    reference_and_cover(case, ops, passes).0
}

/// [`reference_from_operands`] and, under a fast accumulator, the covering bound's effective
/// magnitudes ([`Fp8Bound::covering`]: accumulators down to 13 bits and k-blocks of 4), judged
/// with the same [`Fp8Bound::judged`].
pub fn reference_and_cover(
    case: &Fp8GemmCase,
    ops: &Fp8Operands,
    passes: Passes,
) -> (ReferenceResult, Option<WideOutputs>) {
    let off = case.gemm.offsets();
    let (g, k, n) = case.gemm.rhs.dim();
    let lhs = ops.lhs.dequantize();
    let rhs = ops
        .rhs
        .dequantize()
        .into_shape_with_order((g, k, n))
        .expect("G·K rows");
    let dout = ops.dout.as_ref().map(Quantized::dequantize);
    // wgrad's operands: the column-wise copies, transposed back to (M, ·).
    let col = |c: &ColumnWise, fmt: Format| {
        let mut out = ndarray::Array2::<f64>::zeros((c.qt.ncols(), c.qt.nrows()));
        for i in 0..c.scale_inv.len() {
            for r in c.offsets[i]..c.offsets[i + 1] {
                for j in 0..c.qt.nrows() {
                    out[(r, j)] =
                        super::recipe::dequantize_value(c.qt[(j, r)], c.scale_inv[i], fmt);
                }
            }
        }
        out
    };
    let lhs_w = col(&ops.lhs_col, ops.lhs.format);
    let dout_w = ops
        .dout_col
        .as_ref()
        .zip(ops.dout.as_ref())
        .map(|(c, d)| col(c, d.format));
    let run = |lhs: &ndarray::Array2<f64>,
               rhs: &Array3<f64>,
               dout: Option<&ndarray::Array2<f64>>,
               lhs_w: &ndarray::Array2<f64>,
               dout_w: Option<&ndarray::Array2<f64>>| WideOutputs {
        out: passes
            .fwd
            .then(|| grouped_fwd(lhs.view(), rhs.view(), &off)),
        dlhs: match (passes.dgrad, dout) {
            (true, Some(d)) => Some(grouped_dgrad(d.view(), rhs.view(), &off)),
            _ => None,
        },
        drhs: match (passes.wgrad, dout_w) {
            (true, Some(d)) => Some(grouped_wgrad(lhs_w.view(), d.view(), &off)),
            _ => None,
        },
    };
    let abs = |a: &ndarray::Array2<f64>| a.mapv(f64::abs);
    let value = run(&lhs, &rhs, dout.as_ref(), &lhs_w, dout_w.as_ref());
    let mut magnitude = run(
        &abs(&lhs),
        &rhs.mapv(f64::abs),
        dout.as_ref().map(abs).as_ref(),
        &abs(&lhs_w),
        dout_w.as_ref().map(abs).as_ref(),
    );
    let accumulation = case.recipe.accumulation;
    if accumulation != AccumModel::Exact {
        // The running form (super::running): the magnitude becomes k_s·S + k_r·R.
        let deq = Dequantised {
            lhs: lhs.view(),
            rhs: rhs.view(),
            dout: dout.as_ref().map(|d| d.view()),
            lhs_w: lhs_w.view(),
            dout_w: dout_w.as_ref().map(|d| d.view()),
        };
        let running = running_magnitudes(accumulation, &deq, &off, passes);
        let bound = Fp8Bound {
            accumulation,
            output: case.gemm.out_dtype,
        };
        let mut cover = magnitude.clone();
        for (m, coefficients) in [
            (
                &mut magnitude,
                Fp8Bound::effective as fn(&Fp8Bound, usize) -> (f64, f64),
            ),
            (&mut cover, Fp8Bound::covering),
        ] {
            let fold = |s: &mut ndarray::ArrayViewMut2<f64>, r: ndarray::ArrayView2<f64>, n| {
                let (ks, kr) = coefficients(&bound, n);
                s.zip_mut_with(&r, |s, r| *s = effective_magnitude(ks, kr, *s, *r));
            };
            if let (Some(s), Some(r)) = (m.out.as_mut(), running.out.as_ref()) {
                fold(&mut s.view_mut(), r.view(), k);
            }
            if let (Some(s), Some(r)) = (m.dlhs.as_mut(), running.dlhs.as_ref()) {
                fold(&mut s.view_mut(), r.view(), n);
            }
            if let (Some(s), Some(r)) = (m.drhs.as_mut(), running.drhs.as_ref()) {
                for e in 0..g {
                    let mut se = s.index_axis_mut(ndarray::Axis(0), e);
                    fold(
                        &mut se,
                        r.index_axis(ndarray::Axis(0), e),
                        off[e + 1] - off[e],
                    );
                }
            }
        }
        return (ReferenceResult { value, magnitude }, Some(cover));
    }
    (ReferenceResult { value, magnitude }, None)
}

/// `k_s·S + k_r·R` rounded up by a few f64 ulps; exactly 0 where `S = 0` (no products), and
/// `S` itself where a coefficient is infinite (the bound is vacuous there).
fn effective_magnitude(ks: f64, kr: f64, s: f64, r: f64) -> f64 {
    if s == 0.0 {
        0.0
    } else if !(ks.is_finite() && kr.is_finite()) {
        s
    } else {
        (ks * s + kr * r) * (1.0 + 4.0 * f64::EPSILON)
    }
}

/// The recipe-exact bound of an FP8 GEMM (module docs), for an accumulation model and an
/// output format.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8Bound {
    pub accumulation: AccumModel,
    pub output: Format,
}

impl Fp8Bound {
    /// The per-element bound for reduction length `n`.
    ///
    /// ```
    /// use moecheck_reference::fp8::{AccumModel, Fp8Bound};
    /// use moecheck_reference::format::Format;
    /// let b = Fp8Bound { accumulation: AccumModel::Exact, output: Format::F32 }.at_len(4096);
    /// // about 4096·2^-24 of Σ|a·b| plus 3 f32 roundings of |y|
    /// assert!(b.at(1.0, 1.0) < 2.5e-4 + 2e-7 && b.at(1.0, 1.0) > 2.4e-4);
    /// ```
    pub fn at_len(&self, n: usize) -> ErrorBound {
        self.at_len_with(n, self.accumulation.coefficient(n))
    }

    /// [`Fp8Bound::at_len`] with the covering accumulator's worst case
    /// ([`AccumModel::covering_coefficient`]): fast verification's bound, which must not fail
    /// an accumulator the covering bound admits.
    pub fn covering_at_len(&self, n: usize) -> ErrorBound {
        self.at_len_with(n, self.accumulation.covering_coefficient(n))
    }

    fn at_len_with(&self, n: usize, c_acc: f64) -> ErrorBound {
        let out = self.output.info();
        let u_out = out.unit_roundoff();
        let g2 = gamma(2, 2f64.powi(-24));
        let g_ref = gamma(n, 2f64.powi(-53));
        ErrorBound {
            coeff_magnitude: c_acc * (1.0 + g2) * (1.0 + u_out) + 3.0 * g_ref,
            coeff_value: u_out + g2 * (1.0 + u_out),
            floor: out.min_subnormal() / 2.0,
            underflow: 2.0 * Format::F32.info().min_subnormal() * (1.0 + u_out),
            depth: n,
        }
    }

    /// Whether the judged bound is the running form (a fast accumulator, [`super::running`]).
    pub fn is_running(&self) -> bool {
        self.accumulation != AccumModel::Exact
    }

    /// The coefficients `(k_s, k_r)` of the effective magnitude `M = k_s·S + k_r·R̂` for
    /// reduction length `n` (the running form, [`super::running`]): the accumulation's
    /// running coefficients times the scaling and output roundings, the f64 reference's own
    /// error, and the error of the computed `R̂`.
    pub fn effective(&self, n: usize) -> (f64, f64) {
        self.effective_of(n, self.accumulation.running(n))
    }

    /// [`Fp8Bound::effective`] for the covering bound ([`AccumModel::covering`]): the same
    /// terms around the covering accumulator's coefficients (in `S` and the nominal `R`).
    pub fn covering(&self, n: usize) -> (f64, f64) {
        self.effective_of(n, self.accumulation.covering(n))
    }

    fn effective_of(&self, n: usize, run: super::accum::Running) -> (f64, f64) {
        let u_out = self.output.info().unit_roundoff();
        let g2 = gamma(2, 2f64.powi(-24));
        let u64_ = 2f64.powi(-53);
        let scale = (1.0 + g2) * (1.0 + u_out);
        // Partial sums held over all chunks: at most ⌈n/b⌉ + ⌈n/N_C⌉.
        let terms =
            n.div_ceil(AccumVariant::NOMINAL.block) + n.div_ceil(self.accumulation.chunk(n).max(1));
        let kr = run.r * scale;
        (
            run.s * scale + 3.0 * gamma(n, u64_) + kr * terms as f64 * gamma(n + 1, u64_),
            kr * (1.0 + gamma(terms, u64_)),
        )
    }

    /// The bound judged against the effective magnitude `M` (it stands where `S` stands):
    /// [`Fp8Bound::at_len`] with the magnitude's coefficient 1 (infinite where the running
    /// coefficients are).
    pub fn on_effective(&self, n: usize) -> ErrorBound {
        let (ks, kr) = self.effective(n);
        ErrorBound {
            coeff_magnitude: if ks.is_finite() && kr.is_finite() {
                1.0
            } else {
                f64::INFINITY
            },
            ..self.at_len(n)
        }
    }

    /// The per-element bound the comparison judges with: [`Fp8Bound::on_effective`] under a
    /// fast accumulator (the reference then carries `M`), [`Fp8Bound::at_len`] otherwise.
    pub fn judged(&self, n: usize) -> ErrorBound {
        if self.is_running() {
            self.on_effective(n)
        } else {
            self.at_len(n)
        }
    }
}

#[cfg(test)]
#[path = "gemm_tests.rs"]
mod tests;
