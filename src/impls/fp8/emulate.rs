//! `emulate` for FP8: a CPU model of an FP8 grouped-GEMM kernel that quantises its float32
//! inputs per the recipe, with optional injected bugs.
//!
//! The model quantises each operand itself (amax per scope, `scale = fp8_max/amax` with TE's
//! guards, `fl32(x·scale)` cast to FP8 with round-to-nearest-even and saturation), builds the
//! column-wise copies for wgrad as transposes sharing `scale_inv`, then per output element
//! sums the exact f32 products `qa·qb` in order under the accumulation model
//! ([`moecheck_reference::fp8::AccumModel::dot`]), multiplies by `sinv_a` then `sinv_b` in
//! f32, and rounds once to the output format. Tail rows of `out`/`dlhs` and `drhs` of empty experts are exact zeros.
//!
//! How it quantises (and where the planted defects act) is [`super::operand`]. A model, never
//! a GPU result. [`Fp8Bug`] injects one realistic FP8 defect; `moecheck
//! selftest`'s FP8 section checks that the FP8 properties catch every one.

use moecheck_reference::format::{round_to, Overflow};
use moecheck_reference::fp8::{fp8_precision, Fp8Gemm, Fp8GemmCase, Fp8Operands};
use moecheck_reference::gemm::{GemmOutputs, Passes, Precision};
use moecheck_reference::op::{Implementation, RunError};
use ndarray::{Array2, Array3};

use super::bug::Fp8Bug;
use crate::impls::model_name;

/// The CPU model of an FP8 grouped-GEMM kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EmulateFp8 {
    pub inject: Option<Fp8Bug>,
}

impl EmulateFp8 {
    pub fn with_bug(bug: Option<Fp8Bug>) -> EmulateFp8 {
        EmulateFp8 { inject: bug }
    }

    pub(super) fn has(&self, b: Fp8Bug) -> bool {
        self.inject == Some(b)
    }
}

impl Implementation<Fp8Gemm> for EmulateFp8 {
    fn name(&self) -> String {
        model_name(self.inject)
    }

    fn is_model(&self) -> bool {
        true
    }

    /// The recipe's: the model accumulates as the recipe declares.
    fn precision(&self, case: &Fp8GemmCase) -> Precision {
        fp8_precision(case)
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

    fn internals(&self, case: &Fp8GemmCase, passes: Passes) -> Option<Fp8Operands> {
        Some(self.operands_of(case, passes).into_reference())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moecheck_reference::format::Format;
    use moecheck_reference::fp8::{AccumModel, Fp8Recipe};
    use moecheck_reference::gemm::{GroupedGemmCase, Pass, TailContract};
    use moecheck_reference::op::{verify, Verdict};
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
    /// accumulation model; and a planted bug still fails at that length. Fast accumulation's
    /// worst-case bound at this length admits an all-zero output in fwd and dgrad, so there
    /// every element is inside it but the verdict is INCONCLUSIVE, never a pass.
    #[test]
    fn recipe_exact_at_4096_in_every_pass() {
        for pass in Pass::ALL {
            for acc in AccumModel::ALL {
                let case = long_case(pass, acc);
                let v = verify(&EmulateFp8::default(), &case, Passes::only(pass)).verdict;
                if acc == AccumModel::Fast && pass != Pass::Wgrad {
                    assert!(
                        matches!(v, Verdict::Inconclusive { .. }),
                        "{pass} {acc}: {:?}",
                        v.failure()
                    );
                    continue;
                }
                assert!(v.passed(), "{pass} {acc}: {:?}", v.failure());
            }
            let case = long_case(pass, AccumModel::Exact);
            let bug = EmulateFp8::with_bug(Some(Fp8Bug::ScaleInvNotAdvanced));
            let v = verify(&bug, &case, Passes::only(pass)).verdict;
            assert!(
                matches!(v, Verdict::Fail { .. }),
                "{pass}: the compacted scale_inv was not caught: {v:?}"
            );
        }
    }
}
