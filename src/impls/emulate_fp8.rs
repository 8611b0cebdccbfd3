//! `emulate` for FP8: a CPU model of an FP8 grouped-GEMM kernel that quantises its float32
//! inputs per the recipe, with optional injected bugs.
//!
//! The model quantises each operand itself (amax per scope, `scale = fp8_max/amax` with TE's
//! guards, `fl32(x·scale)` cast to FP8 with round-to-nearest-even and saturation), builds the
//! column-wise copies for wgrad as transposes sharing `scale_inv`, then per output element
//! sums the exact f32 products `qa·qb` in order under the accumulation model
//! ([`moecheck_reference::fp8::AccumModel::dot`]), multiplies by `sinv_a` then `sinv_b` in f32, and rounds once to the
//! output format. Tail rows of `out`/`dlhs` and `drhs` of empty experts are exact zeros.
//!
//! A model, never a GPU result. [`Fp8Bug`] injects one realistic FP8 defect; `moecheck
//! selftest`'s FP8 section checks that the FP8 properties catch every one.

use moecheck_reference::format::{decode_fp8, encode_fp8, round_to, ulp, Format, Overflow};
use moecheck_reference::fp8::{
    amax, compute_scale, fp8_max, rhs_rows, scale_inv, ColumnWise, Fp8GemmCase, Fp8GroupedGemm,
    Fp8Operands, Quantized, Scope,
};
use moecheck_reference::gemm::{GemmOutputs, Passes};
use moecheck_reference::op::RunError;
use ndarray::{s, Array2, Array3, ArrayView2};

/// A defect that can be injected into [`EmulateFp8`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Bug {
    /// `scale_inv` is stored compacted over non-empty groups but read by group index (TE
    /// v2.8's grouped FFI layout): every group after an empty one gets a later group's scale.
    ScaleInvNotAdvanced,
    /// Each scope's amax is taken from the next scope (the last keeps its own).
    AmaxFromNeighbour,
    /// `scale = amax / fp8_max`.
    InvertedScale,
    /// No guard for `amax = 0`: `scale = fp8_max / 0 = inf`, and `0 · inf = NaN`.
    ZeroAmaxInfScale,
    /// The FP8 cast truncates toward zero instead of rounding to nearest even.
    Truncation,
    /// `dout` is quantised to E4M3 (with E4M3's max) instead of the recipe's format.
    E4m3Gradients,
    /// The column-wise copies for wgrad are re-quantised with their own per-column scale.
    ColwiseOwnScale,
}

impl Fp8Bug {
    pub const ALL: [Fp8Bug; 7] = [
        Fp8Bug::ScaleInvNotAdvanced,
        Fp8Bug::AmaxFromNeighbour,
        Fp8Bug::InvertedScale,
        Fp8Bug::ZeroAmaxInfScale,
        Fp8Bug::Truncation,
        Fp8Bug::E4m3Gradients,
        Fp8Bug::ColwiseOwnScale,
    ];

    /// The kebab-case name used in `--inject`.
    pub fn name(self) -> &'static str {
        match self {
            Fp8Bug::ScaleInvNotAdvanced => "fp8-scale-inv-not-advanced",
            Fp8Bug::AmaxFromNeighbour => "fp8-amax-from-neighbour",
            Fp8Bug::InvertedScale => "fp8-inverted-scale",
            Fp8Bug::ZeroAmaxInfScale => "fp8-zero-amax-inf-scale",
            Fp8Bug::Truncation => "fp8-truncation",
            Fp8Bug::E4m3Gradients => "fp8-e4m3-gradients",
            Fp8Bug::ColwiseOwnScale => "fp8-colwise-own-scale",
        }
    }

    /// One line on what the defect does.
    pub fn description(self) -> &'static str {
        match self {
            Fp8Bug::ScaleInvNotAdvanced => {
                "scale_inv compacted over non-empty groups, read by group index"
            }
            Fp8Bug::AmaxFromNeighbour => "each group's amax is taken from the next group",
            Fp8Bug::InvertedScale => "scale = amax / fp8_max",
            Fp8Bug::ZeroAmaxInfScale => "amax = 0 gives scale = inf and NaN",
            Fp8Bug::Truncation => "FP8 cast truncates instead of rounding to nearest even",
            Fp8Bug::E4m3Gradients => "dout quantised to E4M3 instead of E5M2",
            Fp8Bug::ColwiseOwnScale => "column-wise copies quantised with their own scales",
        }
    }
}

impl std::fmt::Display for Fp8Bug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Fp8Bug {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Fp8Bug::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Fp8Bug::ALL.iter().map(|b| b.name()).collect();
                format!(
                    "unknown FP8 bug '{s}' (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}

/// The CPU model of an FP8 grouped-GEMM kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EmulateFp8 {
    pub inject: Option<Fp8Bug>,
}

/// One operand as the kernel sees it: bytes, the `scale_inv` it reads for each scope, and
/// per-(scope, column) `scale_inv` for a column-wise copy quantised on its own.
struct KernelOperand {
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
    fn value(&self, r: usize, c: usize) -> f32 {
        self.vals[(r, c)]
    }
    fn sinv(&self, r: usize, c: usize) -> f32 {
        let i = self.scope_of(r).unwrap_or(0);
        match &self.col_sinv {
            Some(cs) => cs[i][c],
            None => self.read_sinv[i],
        }
    }
}

impl EmulateFp8 {
    pub fn with_bug(bug: Option<Fp8Bug>) -> EmulateFp8 {
        EmulateFp8 { inject: bug }
    }

    fn has(&self, b: Fp8Bug) -> bool {
        self.inject == Some(b)
    }

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
        let mut amaxes: Vec<Option<f32>> = (0..scopes)
            .map(|i| amax(x.slice(s![off[i]..off[i + 1], ..]).iter().copied()))
            .collect();
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
        let mut q = Array2::<u8>::zeros(x.dim());
        for i in 0..scopes {
            let sc = scales[i];
            for r in off[i]..off[i + 1] {
                for c in 0..x.ncols() {
                    q[(r, c)] = self.cast(x[(r, c)] * sc, format, overflow);
                }
            }
        }
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
            vals: q.mapv(|b| decode_fp8(b, format) as f32),
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

    fn operands_of(&self, case: &Fp8GemmCase, passes: Passes) -> Ops {
        let r = &case.recipe;
        let ov = r.overflow();
        let given = case.given_scales.as_ref();
        let lhs_group = r.lhs.scope == moecheck_reference::fp8::ScopeKind::Group;
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
        let dout_group = r.dout.scope == moecheck_reference::fp8::ScopeKind::Group;
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

struct Ops {
    lhs: KernelOperand,
    rhs: KernelOperand,
    dout: Option<KernelOperand>,
    lhs_col: KernelOperand,
    dout_col: Option<KernelOperand>,
}

impl Fp8GroupedGemm for EmulateFp8 {
    fn name(&self) -> String {
        match self.inject {
            None => "emulate".into(),
            Some(b) => format!("emulate[inject={}]", b.name()),
        }
    }

    fn is_model(&self) -> bool {
        true
    }

    fn run(&self, case: &Fp8GemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        let ops = self.operands_of(case, passes);
        let g = &case.gemm;
        let (m, k, n, gc) = (g.m(), g.k(), g.n(), g.groups());
        let off = g.offsets();
        let acc = case.recipe.accumulation;
        let out_fmt = g.out_dtype;
        let fin = |sum: f32, sa: f32, sb: f32| {
            round_to(((sum * sa) * sb) as f64, out_fmt, Overflow::Ieee)
        };
        let mut res = GemmOutputs::default();
        if passes.fwd {
            let mut out = Array2::<f64>::zeros((m, n));
            for e in 0..gc {
                for r in off[e]..off[e + 1] {
                    for c in 0..n {
                        let sum = acc.dot(k, |i| ops.lhs.value(r, i) * ops.rhs.value(e * k + i, c));
                        out[(r, c)] = fin(sum, ops.lhs.sinv(r, 0), ops.rhs.sinv(e * k, c));
                    }
                }
            }
            res.out = Some(out);
        }
        if let Some(d) = &ops.dout {
            if passes.dgrad {
                let mut dlhs = Array2::<f64>::zeros((m, k));
                for e in 0..gc {
                    for r in off[e]..off[e + 1] {
                        for c in 0..k {
                            let sum = acc.dot(n, |j| d.value(r, j) * ops.rhs.value(e * k + c, j));
                            dlhs[(r, c)] = fin(sum, d.sinv(r, 0), ops.rhs.sinv(e * k + c, 0));
                        }
                    }
                }
                res.dlhs = Some(dlhs);
            }
            if passes.wgrad {
                let dc = ops.dout_col.as_ref().expect("dout column-wise copy");
                let mut drhs = Array3::<f64>::zeros((gc, k, n));
                for e in 0..gc {
                    let (lo, hi) = (off[e], off[e + 1]);
                    for a in 0..k {
                        for b in 0..n {
                            let sum = acc.dot(hi - lo, |i| {
                                ops.lhs_col.value(lo + i, a) * dc.value(lo + i, b)
                            });
                            if hi > lo {
                                drhs[(e, a, b)] = fin(sum, ops.lhs_col.sinv(lo, a), dc.sinv(lo, b));
                            }
                        }
                    }
                }
                res.drhs = Some(drhs);
            }
        } else if passes.needs_dout() {
            return Err(RunError("dout is missing".into()));
        }
        Ok(res)
    }

    fn operands(&self, case: &Fp8GemmCase, passes: Passes) -> Option<Fp8Operands> {
        let ops = self.operands_of(case, passes);
        let col = |op: &KernelOperand| ColumnWise {
            qt: op.q.t().to_owned(),
            offsets: op.offsets.clone(),
            scale_inv: op.quantized.scale_inv.clone(),
        };
        Some(Fp8Operands {
            lhs_col: col(&ops.lhs_col),
            dout_col: ops.dout_col.as_ref().map(col),
            lhs: ops.lhs.quantized,
            rhs: ops.rhs.quantized,
            dout: ops.dout.map(|d| d.quantized),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moecheck_reference::fp8::{verify_fp8, AccumModel, Fp8Recipe};
    use moecheck_reference::gemm::{GroupedGemmCase, Pass, TailContract};
    use rand::{Rng, SeedableRng};

    /// A case whose reduction for `pass` is 4096 long: K for fwd, N for dgrad, one group of
    /// 4096 rows for wgrad. Groups: an empty one first (the compacted-scale trap), magnitudes
    /// per group and per expert spread over 2^±12, a dropped tail row.
    fn long_case(pass: Pass, accumulation: AccumModel) -> Fp8GemmCase {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4096);
        let (sizes, k, n) = match pass {
            Pass::Fwd => (vec![0, 5, 3], 4096, 6),
            Pass::Dgrad => (vec![0, 5, 3], 6, 4096),
            Pass::Wgrad => (vec![0, 4096, 3], 5, 4),
        };
        let m = sizes.iter().sum::<usize>() + 1;
        let mut value = |e: i32| (rng.random_range(-1.0f64..1.0) * 2f64.powi(e)) as f32;
        let exps = [-12, 7, 3];
        let off = moecheck_reference::gemm::case::offsets(&sizes);
        let grp = |r: usize| (0..3).find(|&g| off[g] <= r && r < off[g + 1]).unwrap_or(0);
        let lhs = Array2::from_shape_fn((m, k), |(r, _)| value(exps[grp(r)]));
        let rhs = Array3::from_shape_fn((3, k, n), |(e, _, _)| value(-exps[e]));
        let dout = Array2::from_shape_fn((m, n), |(r, _)| value(exps[2 - grp(r)]));
        Fp8GemmCase {
            gemm: GroupedGemmCase {
                lhs,
                rhs,
                group_sizes: sizes,
                dout: Some(dout),
                dtype: Format::F32,
                out_dtype: Format::F32,
                tail: TailContract::Zero,
            },
            recipe: Fp8Recipe {
                accumulation,
                ..Fp8Recipe::default()
            },
            given_scales: None,
        }
    }

    /// Done-when: recipe-exact at reduction length 4096 in every pass, under every
    /// accumulation model; and a planted bug still fails at that length.
    #[test]
    fn recipe_exact_at_4096_in_every_pass() {
        for pass in Pass::ALL {
            for acc in AccumModel::ALL {
                let case = long_case(pass, acc);
                let v = verify_fp8(&EmulateFp8::default(), &case, Passes::only(pass)).unwrap();
                assert!(v.passed(), "{pass} {acc}: {:?}", v.failure());
            }
            let case = long_case(pass, AccumModel::Exact);
            let bug = EmulateFp8::with_bug(Some(Fp8Bug::ScaleInvNotAdvanced));
            let v = verify_fp8(&bug, &case, Passes::only(pass)).unwrap();
            assert!(
                !v.passed(),
                "{pass}: the compacted scale_inv was not caught"
            );
        }
    }

    #[test]
    fn bug_names_round_trip() {
        for b in Fp8Bug::ALL {
            assert_eq!(b.name().parse::<Fp8Bug>(), Ok(b));
        }
        assert!("nope"
            .parse::<Fp8Bug>()
            .unwrap_err()
            .contains("fp8-truncation"));
    }
}
