//! How the FP8 CPU model quantises its operands, defects included: amax per scope, the
//! scale with TE's guards, `fl32(x·scale)` cast to FP8, the `scale_inv` each scope is read
//! with, and the column-wise copies for wgrad (the row-wise bytes sharing `scale_inv`).

use moecheck_reference::format::{decode_fp8, encode_fp8, ulp, Format, Overflow};
use moecheck_reference::fp8::bulk::{decode_all, quantize_scopes, scope_amaxes};
use moecheck_reference::fp8::{
    amax, compute_scale, fp8_max, rhs_rows, scale_inv, ColumnWise, Fp8GemmCase, Fp8Operands,
    Quantized, Scope, ScopeKind,
};
use moecheck_reference::gemm::Passes;
use moecheck_reference::par::zip_rows;
use ndarray::{s, Array2, ArrayView2};

use super::bug::Fp8Bug;
use super::emulate::EmulateFp8;

/// One operand as the kernel sees it: bytes, the `scale_inv` it reads for each scope, and
/// per-(scope, column) `scale_inv` for a column-wise copy quantised on its own.
pub(super) struct KernelOperand {
    q: Array2<u8>,
    /// `q` decoded (exact in f32), so the inner loops do not decode.
    vals: Array2<f32>,
    format: Format,
    offsets: Vec<usize>,
    /// `scale_inv` read for scope `i` (after any layout bug).
    read_sinv: Vec<f32>,
    /// `[scope][column]` when the copy has per-column scales (the `ColwiseOwnScale` bug).
    col_sinv: Option<Vec<Vec<f32>>>,
    quantized: Quantized,
}

impl KernelOperand {
    fn scope_of(&self, r: usize) -> Option<usize> {
        (0..self.read_sinv.len()).find(|&i| self.offsets[i] <= r && r < self.offsets[i + 1])
    }
    #[cfg(test)]
    pub(super) fn value(&self, r: usize, c: usize) -> f32 {
        self.vals[(r, c)]
    }
    /// Every decoded value, row-major.
    pub(super) fn values(&self) -> &Array2<f32> {
        &self.vals
    }
    pub(super) fn sinv(&self, r: usize, c: usize) -> f32 {
        let i = self.scope_of(r).unwrap_or(0);
        match &self.col_sinv {
            Some(cs) => cs[i][c],
            None => self.read_sinv[i],
        }
    }
}

impl EmulateFp8 {
    fn cast(&self, v: f32, format: Format, overflow: Overflow) -> u8 {
        if self.has(Fp8Bug::Truncation) && v.is_finite() {
            let q = ulp(v as f64, format);
            return encode_fp8((v as f64 / q).trunc() * q, format, overflow);
        }
        encode_fp8(v as f64, format, overflow)
    }

    fn scale_of(&self, a: Option<f32>, format: Format) -> f32 {
        match a {
            None => 1.0,
            Some(a) if self.has(Fp8Bug::InvertedScale) && a > 0.0 && a.is_finite() => {
                a / fp8_max(format)
            }
            Some(_) if self.has(Fp8Bug::InvertedScale) => 1.0,
            Some(a) if self.has(Fp8Bug::ZeroAmaxInfScale) && a == 0.0 => fp8_max(format) / a,
            Some(a) => compute_scale(a, format, 0),
        }
    }

    /// Quantises `x` over `scope` (or with `given` scales), with the injected defects.
    fn quantize(
        &self,
        x: ArrayView2<f32>,
        scope: &Scope,
        format: Format,
        overflow: Overflow,
        given: Option<&Vec<f32>>,
        group_layout: bool,
    ) -> KernelOperand {
        let off = scope.offsets(x.nrows());
        let scopes = off.len() - 1;
        let mut amaxes = scope_amaxes(x, &off);
        if self.has(Fp8Bug::AmaxFromNeighbour) {
            for i in 0..scopes.saturating_sub(1) {
                if amaxes[i].is_some() {
                    amaxes[i] = amaxes[i + 1].or(amaxes[i]);
                }
            }
        }
        let scales: Vec<f32> = match given {
            Some(g) => g.clone(),
            None => amaxes.iter().map(|a| self.scale_of(*a, format)).collect(),
        };
        let q = if self.has(Fp8Bug::Truncation) {
            let mut q = Array2::<u8>::zeros(x.dim());
            for i in 0..scopes {
                let sc = scales[i];
                let rows = s![off[i]..off[i + 1], ..];
                zip_rows(q.slice_mut(rows), x.slice(rows), |mut q, x| {
                    q.zip_mut_with(&x, |b, &v| *b = self.cast(v * sc, format, overflow))
                });
            }
            q
        } else {
            // The recipe's cast (what `cast` does without the bug), on every core.
            quantize_scopes(x, &off, &scales, format, overflow)
        };
        let sinv: Vec<f32> = scales.iter().map(|s| scale_inv(*s)).collect();
        let read_sinv = if self.has(Fp8Bug::ScaleInvNotAdvanced) && group_layout {
            let compact: Vec<f32> = (0..scopes)
                .filter(|&i| off[i + 1] > off[i])
                .map(|i| sinv[i])
                .collect();
            (0..scopes)
                .map(|i| compact.get(i).or(compact.last()).copied().unwrap_or(1.0))
                .collect()
        } else {
            sinv.clone()
        };
        let quantized = Quantized {
            format,
            overflow,
            q: q.clone(),
            offsets: off.clone(),
            amax: amaxes.iter().map(|a| a.unwrap_or(0.0)).collect(),
            scale: scales,
            scale_inv: read_sinv.clone(),
        };
        KernelOperand {
            vals: decode_all(&q, format, |v| v as f32),
            q,
            format,
            offsets: off,
            read_sinv,
            col_sinv: None,
            quantized,
        }
    }

    /// The copy wgrad reads: the row-wise operand itself (shared bytes and `scale_inv`), or
    /// under `ColwiseOwnScale` a re-quantisation with one scale per (scope, column).
    fn colwise(&self, x: ArrayView2<f32>, row: KernelOperand, overflow: Overflow) -> KernelOperand {
        if !self.has(Fp8Bug::ColwiseOwnScale) {
            return row;
        }
        let off = row.offsets.clone();
        let mut q = row.q.clone();
        let mut col_sinv = Vec::new();
        for i in 0..off.len() - 1 {
            let mut per_col = Vec::new();
            for c in 0..x.ncols() {
                let a = amax(x.slice(s![off[i]..off[i + 1], c]).iter().copied());
                let sc = a.map_or(1.0, |a| compute_scale(a, row.format, 0));
                for r in off[i]..off[i + 1] {
                    q[(r, c)] = self.cast(x[(r, c)] * sc, row.format, overflow);
                }
                per_col.push(scale_inv(sc));
            }
            col_sinv.push(per_col);
        }
        let mut quantized = row.quantized.clone();
        quantized.q = q.clone();
        quantized.scale_inv = col_sinv
            .iter()
            .map(|c| c.first().copied().unwrap_or(1.0))
            .collect();
        KernelOperand {
            vals: q.mapv(|b| decode_fp8(b, row.format) as f32),
            q,
            col_sinv: Some(col_sinv),
            quantized,
            ..row
        }
    }

    pub(super) fn operands_of(&self, case: &Fp8GemmCase, passes: Passes) -> Ops {
        let r = &case.recipe;
        let ov = r.overflow();
        let given = case.given_scales.as_ref();
        let lhs_group = r.lhs.scope == ScopeKind::Group;
        let lhs = self.quantize(
            case.gemm.lhs.view(),
            &case.row_scope(r.lhs.scope),
            r.lhs.format,
            ov,
            given.map(|g| &g.lhs),
            lhs_group,
        );
        let rhs = self.quantize(
            rhs_rows(&case.gemm.rhs).view(),
            &case.rhs_scope(),
            r.rhs.format,
            ov,
            given.map(|g| &g.rhs),
            false,
        );
        let dfmt = if self.has(Fp8Bug::E4m3Gradients) {
            Format::E4m3
        } else {
            r.dout.format
        };
        let dout_group = r.dout.scope == ScopeKind::Group;
        let dout = match (&case.gemm.dout, passes.needs_dout()) {
            (Some(d), true) => Some(self.quantize(
                d.view(),
                &case.row_scope(r.dout.scope),
                dfmt,
                ov,
                given.map(|g| &g.dout),
                dout_group,
            )),
            _ => None,
        };
        let lhs_col = self.colwise(case.gemm.lhs.view(), self.requant_row(&lhs), ov);
        let dout_col = match (&case.gemm.dout, &dout) {
            (Some(d), Some(op)) => Some(self.colwise(d.view(), self.requant_row(op), ov)),
            _ => None,
        };
        Ops {
            lhs,
            rhs,
            dout,
            lhs_col,
            dout_col,
        }
    }

    /// A second handle on a row-wise operand (the column-wise copy starts from its bytes).
    fn requant_row(&self, op: &KernelOperand) -> KernelOperand {
        KernelOperand {
            q: op.q.clone(),
            vals: op.vals.clone(),
            format: op.format,
            offsets: op.offsets.clone(),
            read_sinv: op.read_sinv.clone(),
            col_sinv: None,
            quantized: op.quantized.clone(),
        }
    }
}

/// Every operand as the model's kernel reads it.
pub(super) struct Ops {
    pub(super) lhs: KernelOperand,
    pub(super) rhs: KernelOperand,
    pub(super) dout: Option<KernelOperand>,
    pub(super) lhs_col: KernelOperand,
    pub(super) dout_col: Option<KernelOperand>,
}

impl Ops {
    /// The operands in the reference's layout, with the `scale_inv` each scope was read with.
    pub(super) fn into_reference(self) -> Fp8Operands {
        let ops = self;
        let col = |op: &KernelOperand| ColumnWise {
            qt: op.q.t().to_owned(),
            offsets: op.offsets.clone(),
            scale_inv: op.quantized.scale_inv.clone(),
        };
        Fp8Operands {
            lhs_col: col(&ops.lhs_col),
            dout_col: ops.dout_col.as_ref().map(col),
            lhs: ops.lhs.quantized,
            rhs: ops.rhs.quantized,
            dout: ops.dout.map(|d| d.quantized),
        }
    }
}
