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
//! The `η_f32` term covers the scaling multiplications underflowing (a `scale_inv` near the
//! bottom of f32); it assumes the intermediate `acc·sinv_a` is not both subnormal and then
//! multiplied by a huge `sinv_b`, which no generator produces.

use ndarray::Array3;

use super::accum::AccumModel;
use super::case::Fp8GemmCase;
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
/// magnitudes `Σ|x̂a·x̂b|` the bound scales with. wgrad reads the column-wise copies.
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
    let magnitude = run(
        &abs(&lhs),
        &rhs.mapv(f64::abs),
        dout.as_ref().map(abs).as_ref(),
        &abs(&lhs_w),
        dout_w.as_ref().map(abs).as_ref(),
    );
    ReferenceResult { value, magnitude }
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
        let out = self.output.info();
        let u_out = out.unit_roundoff();
        let g2 = gamma(2, 2f64.powi(-24));
        let c_acc = self.accumulation.coefficient(n);
        let g_ref = gamma(n, 2f64.powi(-53));
        ErrorBound {
            coeff_magnitude: c_acc * (1.0 + g2) * (1.0 + u_out) + 3.0 * g_ref,
            coeff_value: u_out + g2 * (1.0 + u_out),
            floor: out.min_subnormal() / 2.0,
            underflow: 2.0 * Format::F32.info().min_subnormal() * (1.0 + u_out),
            depth: n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp8::Fp8Recipe;
    use crate::gemm::GroupedGemmCase;
    use ndarray::{array, Array2};

    fn case() -> Fp8GemmCase {
        // Two groups (rows 0-1, row 2), row 3 dropped; experts of very different magnitude.
        let lhs = array![[1.0f32, 2.0], [3.0, -4.0], [0.001, 0.002], [9.0, 9.0]];
        let rhs = Array3::from_shape_vec((2, 2, 1), vec![1.0, -1.0, 1000.0, 3000.0]).unwrap();
        let dout = array![[1.0f32], [0.5], [-2.0], [7.0]];
        Fp8GemmCase {
            gemm: GroupedGemmCase {
                lhs,
                rhs: rhs.into(),
                group_sizes: vec![2, 1],
                dout: Some(dout),
                dtype: Format::F32,
                out_dtype: Format::F32,
                tail: Default::default(),
            },
            recipe: Fp8Recipe::default(),
            given_scales: None,
        }
    }

    /// Known answers for [`Fp8Bound::at_len`], every term written from the module
    /// documentation with literal constants (`γ(n, u) = n·u / (1 - n·u)`, `γ2 = γ(2, 2^-24)`,
    /// `u_out`, `η_out` and `η_f32 = 2^-149`), for each accumulation model and output format:
    /// a change to any coefficient fails here.
    #[test]
    fn bound_known_answers() {
        let close = |got: f64, want: f64| {
            assert!(
                (got - want).abs() <= 1e-13 * want.abs(),
                "got {got:e}, want {want:e}"
            )
        };
        let g = |n: f64, u: f64| n * u / (1.0 - n * u);
        let u32_ = 2f64.powi(-24);
        let u_fast = 2f64.powi(-13) + 2f64.powi(-24) + 2f64.powi(-37);
        let g2 = 2.0 * u32_ / (1.0 - 2.0 * u32_);
        // (output, u_out, η_out)
        let outputs = [
            (Format::F32, 2f64.powi(-24), 2f64.powi(-149)),
            (Format::Bf16, 2f64.powi(-8), 2f64.powi(-133)),
            (Format::F16, 2f64.powi(-11), 2f64.powi(-24)),
        ];
        for (output, u_out, eta_out) in outputs {
            for n in [1usize, 16, 200] {
                let nf = n as f64;
                let c = [
                    (AccumModel::Exact, g(nf, u32_)),
                    (AccumModel::Fast, g(nf, u_fast)),
                    (
                        AccumModel::FastPromote,
                        (1.0 + g(nf.min(128.0), u_fast)) * (1.0 + g(n.div_ceil(128) as f64, u32_))
                            - 1.0,
                    ),
                ];
                for (accumulation, c_acc) in c {
                    let b = Fp8Bound {
                        accumulation,
                        output,
                    }
                    .at_len(n);
                    let what = format!("{accumulation} -> {output}, n = {n}");
                    let want = c_acc * (1.0 + g2) * (1.0 + u_out) + 3.0 * g(nf, 2f64.powi(-53));
                    assert!(
                        (b.coeff_magnitude - want).abs() <= 1e-13 * want,
                        "{what}: {} vs {want}",
                        b.coeff_magnitude
                    );
                    close(b.coeff_value, u_out + g2 * (1.0 + u_out));
                    assert_eq!(b.floor, eta_out / 2.0, "{what}");
                    assert_eq!(b.underflow, 2.0 * 2f64.powi(-149) * (1.0 + u_out), "{what}");
                    assert_eq!(b.depth, n, "{what}");
                }
            }
        }
        // One worked number: exact f32 accumulation, f32 output, K = 16, S = 1, y = 0.5:
        // γ(16, 2^-24)(1 + γ2)(1 + 2^-24) + 3γ(16, 2^-53) + (2^-24 + γ2(1 + 2^-24))·0.5
        //   + 2^-150 + 2·2^-149(1 + 2^-24) = 1.0430823795825574e-6.
        let b = Fp8Bound {
            accumulation: AccumModel::Exact,
            output: Format::F32,
        }
        .at_len(16);
        close(b.at(1.0, 0.5), 1.0430823795825574e-6);
        // No products (n = 0): no accumulation error, and an exact 0 is demanded.
        let b0 = Fp8Bound {
            accumulation: AccumModel::Exact,
            output: Format::F32,
        }
        .at_len(0);
        assert_eq!(b0.coeff_magnitude, 0.0);
        assert_eq!(b0.at(0.0, 0.0), 0.0);
    }

    #[test]
    fn reference_is_gemm_of_dequantised_values() {
        let c = case();
        let r = fp8_reference(&c, Passes::ALL).unwrap();
        let ops = quantize_operands(&c, Passes::ALL);
        assert_eq!(ops.lhs.scale, vec![112.0, 448.0 / 0.002]);
        assert_eq!(ops.rhs.scale, vec![448.0, 448.0 / 3000.0]);
        assert_eq!(ops.dout.as_ref().unwrap().scale, vec![57344.0, 28672.0]);
        let x = ops.lhs.dequantize();
        let out = r.value.out.unwrap();
        // Group 1 (row 2) uses expert 1; the small values round-trip within E4M3 precision.
        let w = ops.rhs.dequantize();
        assert_eq!(out[(2, 0)], x[(2, 0)] * w[(2, 0)] + x[(2, 1)] * w[(3, 0)]);
        assert_eq!(out.row(3).to_vec(), vec![0.0]);
        let drhs = r.value.drhs.unwrap();
        let d = ops.dout.unwrap().dequantize();
        assert_eq!(drhs[(1, 0, 0)], x[(2, 0)] * d[(2, 0)]);
        // dgrad: row 2 (group 1) against expert 1's rows of rhs, N = 1.
        let dlhs = r.value.dlhs.unwrap();
        assert_eq!(dlhs[(2, 0)], d[(2, 0)] * w[(2, 0)]);
        assert_eq!(dlhs[(2, 1)], d[(2, 0)] * w[(3, 0)]);
        assert_eq!(dlhs.row(3).to_vec(), vec![0.0, 0.0]);
        assert!(r.magnitude.out.unwrap().iter().all(|v| *v >= 0.0));
        let _ = Array2::<f64>::zeros((1, 1));
    }
}
