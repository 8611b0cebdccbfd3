//! `--dtype fp8 --impl cuda`: kernels/fp8.cu as an implementation of [`Fp8Gemm`].
//!
//! Per case: quantise `lhs` (per group or tensor), `rhs` (per expert or tensor, viewed as
//! `(G·K, N)`) and `dout` on the device with the recipe ([`super::fp8::quantize`]), make the
//! per-group column-wise copies of `lhs` and `dout` for wgrad
//! ([`super::fp8::transpose_groups`]), then one [`super::fp8::fp8_grouped_gemm`] per pass with
//! one `scale_inv` per group (a tensor scale repeated `G` times, [`super::fp8_host::per_group`]).
//! The f32 outputs are rounded once to `out_dtype` on the host. Declared accumulation: exact
//! f32 ([`super::fp8_host::ACCUMULATION`]); only the recipe of
//! [`super::fp8_host::supports`] runs (checked before the run, naming the flag: exit 2).
//! Without a device the run fails with "no CUDA device".

use moecheck_reference::format::{round_to, Overflow};
use moecheck_reference::fp8::{
    fp8_precision, ColumnWise, Fp8Gemm, Fp8GemmCase, Fp8Operands, Quantized as RefQuantized,
};
use moecheck_reference::gemm::{GemmOutputs, Pass, Passes, Precision};
use moecheck_reference::op::{Implementation, RunError};
use ndarray::{Array2, Array3};

use super::device::CudaError;
use super::fp8::{fp8_grouped_gemm, quantize, transpose_groups, Quantized};
use super::fp8_host::{columnwise, per_group, rhs_bounds, row_bounds, supports};

/// The FP8 grouped GEMM of kernels/fp8.cu on device 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaFp8;

struct DevOperands {
    lhs: Quantized,
    rhs: Quantized,
    dout: Option<Quantized>,
    lhs_col: Vec<u8>,
    dout_col: Option<Vec<u8>>,
}

fn drv(e: String) -> CudaError {
    CudaError::Driver(e)
}

impl CudaFp8 {
    fn quantize_all(&self, case: &Fp8GemmCase, passes: Passes) -> Result<DevOperands, CudaError> {
        supports(&case.recipe).map_err(drv)?;
        let g = &case.gemm;
        let r = &case.recipe;
        let (k, n) = (g.k(), g.n());
        let off = g.offsets();
        let flat2 = |a: &Array2<f32>| a.iter().copied().collect::<Vec<f32>>();
        let lhs = quantize(
            &flat2(&g.lhs),
            &row_bounds(r.lhs.scope, &off, k),
            r.lhs.format,
        )?;
        let rhs_flat: Vec<f32> = g.rhs.f32().iter().copied().collect();
        let rhs = quantize(
            &rhs_flat,
            &rhs_bounds(r.rhs.scope, g.groups(), k, n),
            r.rhs.format,
        )?;
        let dout = match (&g.dout, passes.needs_dout()) {
            (Some(d), true) => Some(quantize(
                &flat2(d),
                &row_bounds(r.dout.scope, &off, n),
                r.dout.format,
            )?),
            (None, true) => return Err(drv("dout is missing".into())),
            _ => None,
        };
        // A zero-width operand has no bytes to copy.
        let copy = |q: &[u8], cols: usize| {
            if cols == 0 {
                Ok(Vec::new())
            } else {
                transpose_groups(q, cols, &g.group_sizes)
            }
        };
        let lhs_col = copy(&lhs.q, k)?;
        let dout_col = match &dout {
            Some(d) => Some(copy(&d.q, n)?),
            None => None,
        };
        Ok(DevOperands {
            lhs,
            rhs,
            dout,
            lhs_col,
            dout_col,
        })
    }

    fn run_on(&self, case: &Fp8GemmCase, passes: Passes) -> Result<GemmOutputs, CudaError> {
        let ops = self.quantize_all(case, passes)?;
        let g = &case.gemm;
        let (m, k, n, gc) = (g.m(), g.k(), g.n(), g.groups());
        let lhs_s = per_group(&ops.lhs.scale_inv, gc).map_err(drv)?;
        let rhs_s = per_group(&ops.rhs.scale_inv, gc).map_err(drv)?;
        let dout_s = match &ops.dout {
            Some(d) => Some(per_group(&d.scale_inv, gc).map_err(drv)?),
            None => None,
        };
        // Held in f32: an f32 rounded to the output format is an f32 value.
        let round = |v: Vec<f32>| -> Vec<f32> {
            v.into_iter()
                .map(|x| round_to(x as f64, g.out_dtype, Overflow::Ieee) as f32)
                .collect()
        };
        let shape = |e: ndarray::ShapeError| drv(e.to_string());
        let mut res = GemmOutputs::default();
        for pass in passes.iter() {
            let missing = || drv("dout is missing".into());
            let v = match pass {
                Pass::Fwd => fp8_grouped_gemm(
                    pass,
                    &ops.lhs.q,
                    &ops.rhs.q,
                    &lhs_s,
                    &rhs_s,
                    &g.group_sizes,
                    m,
                    k,
                    n,
                )?,
                Pass::Dgrad => {
                    let d = ops.dout.as_ref().ok_or_else(missing)?;
                    let ds = dout_s.as_ref().ok_or_else(missing)?;
                    fp8_grouped_gemm(pass, &d.q, &ops.rhs.q, ds, &rhs_s, &g.group_sizes, m, k, n)?
                }
                Pass::Wgrad => {
                    let dc = ops.dout_col.as_ref().ok_or_else(missing)?;
                    let ds = dout_s.as_ref().ok_or_else(missing)?;
                    fp8_grouped_gemm(pass, &ops.lhs_col, dc, &lhs_s, ds, &g.group_sizes, m, k, n)?
                }
            };
            let v = round(v);
            match pass {
                Pass::Fwd => {
                    res.out = Some(Array2::from_shape_vec((m, n), v).map_err(shape)?.into())
                }
                Pass::Dgrad => {
                    res.dlhs = Some(Array2::from_shape_vec((m, k), v).map_err(shape)?.into())
                }
                Pass::Wgrad => {
                    res.drhs = Some(Array3::from_shape_vec((gc, k, n), v).map_err(shape)?.into())
                }
            }
        }
        Ok(res)
    }
}

/// The device's quantised bytes and scales in the reference's layout.
fn to_reference(
    q: &Quantized,
    rows: usize,
    cols: usize,
    scope_offsets: Vec<usize>,
    case: &Fp8GemmCase,
    format: moecheck_reference::format::Format,
) -> Option<RefQuantized> {
    Some(RefQuantized {
        format,
        overflow: case.recipe.overflow(),
        q: Array2::from_shape_vec((rows, cols), q.q.clone()).ok()?,
        offsets: scope_offsets,
        amax: q.amax.clone(),
        scale: q.scale.clone(),
        scale_inv: q.scale_inv.clone(),
    })
}

impl Implementation<Fp8Gemm> for CudaFp8 {
    fn name(&self) -> String {
        "cuda".into()
    }
    fn is_model(&self) -> bool {
        false
    }
    /// The recipe's, which [`Implementation::supports`] holds to the kernels' own
    /// accumulation.
    fn precision(&self, case: &Fp8GemmCase) -> Precision {
        fp8_precision(case)
    }
    /// The recipe the kernels implement; the reason names the flag that asks for another.
    fn supports(&self, case: &Fp8GemmCase, _: Passes) -> Result<(), String> {
        supports(&case.recipe)
    }
    fn run(&self, case: &Fp8GemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        self.run_on(case, passes)
            .map_err(|e| RunError::new(e.to_string()))
    }
    fn internals(&self, case: &Fp8GemmCase, passes: Passes) -> Option<Fp8Operands> {
        let ops = self.quantize_all(case, passes).ok()?;
        let g = &case.gemm;
        let (m, k, n) = (g.m(), g.k(), g.n());
        let r = &case.recipe;
        let lhs_off = case.row_scope(r.lhs.scope).offsets(m);
        let lhs = to_reference(&ops.lhs, m, k, lhs_off.clone(), case, r.lhs.format)?;
        let rhs_off = case.rhs_scope().offsets(g.groups() * k);
        let rhs = to_reference(&ops.rhs, g.groups() * k, n, rhs_off, case, r.rhs.format)?;
        let col =
            |bytes: &[u8], cols: usize, off: Vec<usize>, sinv: Vec<f32>| -> Option<ColumnWise> {
                columnwise(bytes, m, cols, &g.group_sizes, off, sinv).ok()
            };
        let lhs_col = col(&ops.lhs_col, k, lhs_off, ops.lhs.scale_inv.clone())?;
        let (dout, dout_col) = match (&ops.dout, &ops.dout_col) {
            (Some(d), Some(dc)) => {
                let off = case.row_scope(r.dout.scope).offsets(m);
                (
                    Some(to_reference(d, m, n, off.clone(), case, r.dout.format)?),
                    Some(col(dc, n, off, d.scale_inv.clone())?),
                )
            }
            _ => (None, None),
        };
        Some(Fp8Operands {
            lhs,
            rhs,
            dout,
            lhs_col,
            dout_col,
        })
    }
}
