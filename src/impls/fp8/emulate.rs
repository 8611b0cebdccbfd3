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
//! Under exact accumulation every product `qa·qb` is exact in f32, so each element's sum in
//! order from +0 is one fused multiply-add chain: the blocked kernel's `chained_gemm` computes
//! it for a whole expert at once (the same bits as the element-by-element sum, a test), and
//! the scaling is applied after.
//!
//! How it quantises (and where the planted defects act) is [`super::operand`]. A model, never
//! a GPU result. [`Fp8Bug`] injects one realistic FP8 defect; `moecheck
//! selftest`'s FP8 section checks that the FP8 properties catch every one.

use moecheck_reference::format::{round_to, Format, Overflow};
use moecheck_reference::fp8::{fp8_precision, Fp8Gemm, Fp8GemmCase, Fp8Operands};
use moecheck_reference::fp8::{AccumModel, AccumVariant};
use moecheck_reference::gemm::stream::by_group_rows;
use moecheck_reference::gemm::{GemmOutputs, Passes, Precision};
use moecheck_reference::op::{Implementation, RunError};
use moecheck_reference::par::map_by_cost;
use ndarray::{s, Array2, Array3, ArrayViewMut2};

use super::bug::Fp8Bug;
use crate::impls::gemm::blocked::chained_gemm;
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

    /// Each expert is quantised and computed on its own, so a shard's outputs are its
    /// experts' in the whole case; except under the planted bugs that read beyond a group:
    /// `fp8-scale-inv-not-advanced` counts the empty groups before it,
    /// `fp8-amax-from-neighbour` reads the next group (which may be in the next shard), and
    /// `fp8-colwise-own-scale` takes each column's amax over its scope, every row of the case
    /// under a tensor scope.
    fn shardable(&self) -> bool {
        !(self.has(Fp8Bug::ScaleInvNotAdvanced)
            || self.has(Fp8Bug::AmaxFromNeighbour)
            || self.has(Fp8Bug::ColwiseOwnScale)
            || self.has(Fp8Bug::BlockCrossesGroup)
            || self.has(Fp8Bug::BlockScalesTransposed))
    }

    /// The recipe's: the model accumulates as the recipe declares.
    fn precision(&self, case: &Fp8GemmCase) -> Precision {
        fp8_precision(case)
    }

    /// Experts in parallel. Exact accumulation through the blocked kernel's chained sums
    /// (module docs); the fast accumulators each output row through [`AccumModel::row_sums`]
    /// (the model's sum of each element, a row's columns at a time).
    fn run(&self, case: &Fp8GemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        if case.recipe.has_block_scope() {
            return self.run_blocks(case, passes); // super::block_emulate
        }
        let ops = self.operands_of(case, passes);
        let g = &case.gemm;
        let (m, k, n, gc) = (g.m(), g.k(), g.n(), g.groups());
        let off = g.offsets();
        let acc = case.recipe.accumulation;
        let fin = |sum: f32, sa: f32, sb: f32| finish(g.out_dtype, sum, sa, sb);
        let nominal = AccumVariant::NOMINAL;
        // Each expert's products (every pass has K·N per row), the cost experts run in
        // parallel by.
        let work = |e: usize| ((off[e + 1] - off[e]) * k * n).max(1);
        // Expert e's K × N weight, row-major.
        let weight = |e: usize| ops.rhs.values().slice(s![e * k..(e + 1) * k, ..]);
        // Exact accumulation is one f32 sum per element from +0 in order, each product exact:
        // the chained kernel's sum (module docs), scaled after.
        let exact = acc == AccumModel::Exact;
        let mut res = GemmOutputs::default();
        if passes.fwd {
            let mut out = Array2::<f32>::zeros((m, n));
            by_group_rows(out.view_mut(), &off, work, |e, mut dst| {
                if exact {
                    let r0 = off[e];
                    let a = ops.lhs.values().slice(s![r0..r0 + dst.nrows(), ..]);
                    chained_gemm(a, weight(e), dst.view_mut());
                    let sa: Vec<f32> = (r0..r0 + dst.nrows()).map(|r| ops.lhs.sinv(r, 0)).collect();
                    let sb: Vec<f32> = (0..n).map(|c| ops.rhs.sinv(e * k, c)).collect();
                    scale(dst, &sa, &sb, fin);
                    return;
                }
                let w = weight(e).as_standard_layout().into_owned();
                let w = w.as_slice().expect("standard layout");
                for (i, mut row) in dst.outer_iter_mut().enumerate() {
                    let r = off[e] + i;
                    let a = ops.lhs.values().row(r).to_vec();
                    let sa = ops.lhs.sinv(r, 0);
                    acc.row_sums(nominal, &a, w, n, |c, sum| {
                        row[c] = fin(sum, sa, ops.rhs.sinv(e * k, c));
                    });
                }
            });
            res.out = Some(out.into());
        }
        if let Some(d) = &ops.dout {
            if passes.dgrad {
                let mut dlhs = Array2::<f32>::zeros((m, k));
                by_group_rows(dlhs.view_mut(), &off, work, |e, mut dst| {
                    if exact {
                        let r0 = off[e];
                        let a = d.values().slice(s![r0..r0 + dst.nrows(), ..]);
                        chained_gemm(a, weight(e).t(), dst.view_mut());
                        let sa: Vec<f32> = (r0..r0 + dst.nrows()).map(|r| d.sinv(r, 0)).collect();
                        let sb: Vec<f32> = (0..k).map(|c| ops.rhs.sinv(e * k + c, 0)).collect();
                        scale(dst, &sa, &sb, fin);
                        return;
                    }
                    // rhs_eᵀ (N × K): a row's K outputs are contiguous columns.
                    let wt = weight(e).t().as_standard_layout().into_owned();
                    let wt = wt.as_slice().expect("standard layout");
                    for (i, mut row) in dst.outer_iter_mut().enumerate() {
                        let r = off[e] + i;
                        let a = d.values().row(r).to_vec();
                        let sa = d.sinv(r, 0);
                        acc.row_sums(nominal, &a, wt, k, |c, sum| {
                            row[c] = fin(sum, sa, ops.rhs.sinv(e * k + c, 0));
                        });
                    }
                });
                res.dlhs = Some(dlhs.into());
            }
            if passes.wgrad {
                let dc = ops.dout_col.as_ref().expect("dout column-wise copy");
                let lc = &ops.lhs_col;
                let mut drhs = Array3::<f32>::zeros((gc, k, n));
                let experts: Vec<_> = drhs.outer_iter_mut().enumerate().collect();
                map_by_cost(
                    experts,
                    |(e, _)| work(*e),
                    |(e, mut dst)| {
                        let (lo, hi) = (off[e], off[e + 1]);
                        if hi == lo {
                            return; // an empty expert's gradient is exactly 0
                        }
                        if exact {
                            let a = lc.values().slice(s![lo..hi, ..]);
                            let b = dc.values().slice(s![lo..hi, ..]);
                            chained_gemm(a.t(), b, dst.view_mut());
                            let sa: Vec<f32> = (0..k).map(|a| lc.sinv(lo, a)).collect();
                            let sb: Vec<f32> = (0..n).map(|b| dc.sinv(lo, b)).collect();
                            scale(dst, &sa, &sb, fin);
                            return;
                        }
                        // The group's tokens of dout (rows × N): its N outputs are contiguous.
                        let grads = dc
                            .values()
                            .slice(s![lo..hi, ..])
                            .as_standard_layout()
                            .into_owned();
                        let grads = grads.as_slice().expect("standard layout");
                        for (a, mut row) in dst.outer_iter_mut().enumerate() {
                            let left = lc.values().slice(s![lo..hi, a]).to_vec();
                            let sa = lc.sinv(lo, a);
                            acc.row_sums(nominal, &left, grads, n, |b, sum| {
                                row[b] = fin(sum, sa, dc.sinv(lo, b));
                            });
                        }
                    },
                );
                res.drhs = Some(drhs.into());
            }
        } else if passes.needs_dout() {
            return Err(RunError::new("dout is missing"));
        }
        Ok(res)
    }

    /// The operands it used; none under block scopes (as the reference's).
    fn internals(&self, case: &Fp8GemmCase, passes: Passes) -> Option<Fp8Operands> {
        if case.recipe.has_block_scope() {
            return None;
        }
        Some(self.operands_of(case, passes).into_reference())
    }
}

/// Every sum of `dst` scaled and rounded by `fin` with its row's `sa` and column's `sb`.
fn scale(mut dst: ArrayViewMut2<f32>, sa: &[f32], sb: &[f32], fin: impl Fn(f32, f32, f32) -> f32) {
    for (mut row, &a) in dst.outer_iter_mut().zip(sa) {
        for (v, &b) in row.iter_mut().zip(sb) {
            *v = fin(*v, a, b);
        }
    }
}

/// `fl_out(fl32(fl32(sum · sa) · sb))`: an FP8 GEMM's f32 sum scaled by the two `scale_inv`
/// in the recipe's order and rounded once to the output format.
pub(super) fn finish(out: Format, sum: f32, sa: f32, sb: f32) -> f32 {
    // An f32 rounded to the output format (f32 or narrower, or f64) is an f32 value: the
    // outputs are held in f32.
    let v = (sum * sa) * sb;
    if out == Format::F32 {
        return v; // already an f32
    }
    round_to(v as f64, out, Overflow::Ieee) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use moecheck_reference::fp8::Fp8Recipe;
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
                rhs: rhs.into(),
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
    /// accumulation model, with teeth (fast accumulation through the running form of its
    /// bound, whose worst case would admit an all-zero output here); and a planted bug still
    /// fails at that length.
    #[test]
    fn recipe_exact_at_4096_in_every_pass() {
        for pass in Pass::ALL {
            for acc in AccumModel::ALL {
                let case = long_case(pass, acc);
                let v = verify(&EmulateFp8::default(), &case, Passes::only(pass)).verdict;
                assert!(matches!(v, Verdict::Pass(_)), "{pass} {acc}: {v:?}");
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

    /// The emulation one element at a time, as it was before it ran experts in parallel and a
    /// row's columns together: the oracle of `rows_in_lanes_are_the_element_by_element_model`.
    fn run_scalar(em: &EmulateFp8, case: &Fp8GemmCase, passes: Passes) -> GemmOutputs {
        let ops = em.operands_of(case, passes);
        let g = &case.gemm;
        let (m, k, n, gc) = (g.m(), g.k(), g.n(), g.groups());
        let off = g.offsets();
        let acc = case.recipe.accumulation;
        let fin = |sum: f32, sa: f32, sb: f32| finish(g.out_dtype, sum, sa, sb);
        let mut res = GemmOutputs::default();
        if passes.fwd {
            let mut out = Array2::<f32>::zeros((m, n));
            for e in 0..gc {
                for r in off[e]..off[e + 1] {
                    for c in 0..n {
                        let sum = acc.dot(k, |i| ops.lhs.value(r, i) * ops.rhs.value(e * k + i, c));
                        out[(r, c)] = fin(sum, ops.lhs.sinv(r, 0), ops.rhs.sinv(e * k, c));
                    }
                }
            }
            res.out = Some(out.into());
        }
        if let Some(d) = &ops.dout {
            if passes.dgrad {
                let mut dlhs = Array2::<f32>::zeros((m, k));
                for e in 0..gc {
                    for r in off[e]..off[e + 1] {
                        for c in 0..k {
                            let sum = acc.dot(n, |j| d.value(r, j) * ops.rhs.value(e * k + c, j));
                            dlhs[(r, c)] = fin(sum, d.sinv(r, 0), ops.rhs.sinv(e * k + c, 0));
                        }
                    }
                }
                res.dlhs = Some(dlhs.into());
            }
            if passes.wgrad {
                let dc = ops.dout_col.as_ref().expect("dout column-wise copy");
                let mut drhs = Array3::<f32>::zeros((gc, k, n));
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
                res.drhs = Some(drhs.into());
            }
        } else if passes.needs_dout() {
            panic!("dout is missing");
        }
        res
    }

    /// The emulation gives the element-by-element model's bits, for the clean model and every
    /// planted bug, under every accumulation model, in every pass: an empty first expert,
    /// experts of one row and of more rows than the lanes, column counts with a remainder, a
    /// dropped tail row, values over 2^±12.
    #[test]
    fn rows_in_lanes_are_the_element_by_element_model() {
        use crate::impls::PlantedBug;
        for acc in AccumModel::ALL {
            for pass in [Pass::Fwd, Pass::Wgrad] {
                let mut case = long_case(pass, acc);
                // Shorter reductions and wider outputs than long_case's, so lanes are used.
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
                let (sizes, k, n) = (vec![0, 1, 21, 0, 18], 35, 37);
                let m = 41;
                let mut v = |len: usize, e: i32| -> Vec<f32> {
                    (0..len)
                        .map(|_| (rng.random_range(-1.0f64..1.0) * 2f64.powi(e)) as f32)
                        .collect()
                };
                let g = &mut case.gemm;
                g.lhs = Array2::from_shape_vec((m, k), v(m * k, 9)).unwrap();
                g.rhs = Array3::from_shape_vec((5, k, n), v(5 * k * n, -7))
                    .unwrap()
                    .into();
                g.dout = Some(Array2::from_shape_vec((m, n), v(m * n, 12)).unwrap());
                g.group_sizes = sizes;
                let bugs = std::iter::once(None).chain(Fp8Bug::ALL.iter().copied().map(Some));
                for bug in bugs {
                    let em = EmulateFp8::with_bug(bug);
                    let bits = |o: GemmOutputs| {
                        let f = |a: Option<ndarray::ArrayD<f64>>| a.map(|a| a.mapv(f64::to_bits));
                        (
                            f(o.out.map(|a| a.into_f64().into_dyn())),
                            f(o.dlhs.map(|a| a.into_f64().into_dyn())),
                            f(o.drhs.map(|a| a.into_f64().into_dyn())),
                        )
                    };
                    let got = bits(em.run(&case, Passes::ALL).unwrap());
                    assert!(got.0.is_some() && got.1.is_some() && got.2.is_some());
                    assert_eq!(
                        got,
                        bits(run_scalar(&em, &case, Passes::ALL)),
                        "{acc} {bug:?}"
                    );
                }
            }
        }
    }
}
