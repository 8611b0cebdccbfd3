//! The model-based check of fast FP8 accumulation: teeth where even the running-form bound
//! has none.
//!
//! ## Why
//! Under [`AccumModel::Fast`] the per-element bound is the running form
//! ([`super::running`]), which scales with the magnitudes of the partial sums the accumulator
//! holds. Where sums cancel hard (the partial sums climb far above the final value) it can
//! still be looser than the values, and the comparison would be INCONCLUSIVE. There this check
//! runs: it can turn INCONCLUSIVE into FAIL, never into PASS. (Before the running form it ran
//! on every fast-accumulation pass from K ≈ 4096; at K = 7168 it failed the all-zero output
//! and `fp8-amax-from-neighbour` but left `fp8-inverted-scale` and the correct model
//! INCONCLUSIVE. The running form now fails all three and passes the model.)
//!
//! ## What it checks
//! The accumulation model's own output for the same quantised operands (the recipe's, which
//! the per-element comparison already pinned), [`AccumVariant::NOMINAL`]: 14 bits, k-blocks
//! of 32. How far real hardware may be from that model is not published, so the check
//! measures how far *other plausible accumulators* are from it ([`AccumVariant::SPREAD`]:
//! 13 and 15 bits, and k-blocks of 16 products). Per pass and group, with `‖·‖` the Frobenius norm over the group's elements
//! and `y` the recipe-exact reference:
//!
//! * `distance = ‖ŷ - model‖ / ‖y‖`;
//! * `spread = max over the variants of ‖variant - model‖ / ‖y‖`;
//! * `threshold = 2·spread + 2·u_out + 2^-22` (`u_out` the output format's unit roundoff, for
//!   a different value rounded to it; `2^-22` for the two f32 scaling multiplications in
//!   another order);
//! * FAIL when `distance > threshold`: the output is further from the accumulation model
//!   than accumulators of one bit more or less, or of another order, would be.
//!
//! It never makes a PASS: within the threshold the verdict stays INCONCLUSIVE, and the report
//! gives both numbers and whether an all-zero output (`zero distance = ‖model‖ / ‖y‖`) would
//! have been caught. What the check assumes is that the accumulator under test is no further
//! from the nominal model than twice the variants are; an accumulator that keeps far fewer
//! bits (or none of the truncation) fails it, which is why it only runs where the
//! recipe-exact comparison could not decide.

use ndarray::{s, Array2, Ix2, Ix3};
use serde::{Deserialize, Serialize};

use super::accum::{AccumModel, AccumVariant};
use super::case::Fp8GemmCase;
use super::gemm::Fp8Operands;
use super::scaling::{ColumnWise, Quantized};
use crate::format::{decode_fp8, round_to, Format, Overflow};
use crate::gemm::held::Held;
use crate::gemm::{GemmOutputs, Outputs, Pass, WideOutputs};

/// The model-based check of one group of one pass (module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelGroupCheck {
    pub pass: Pass,
    /// The group (fwd, dgrad) or expert (wgrad).
    pub group: usize,
    pub elements: usize,
    /// `‖ŷ - model‖ / ‖y‖` (infinite when `ŷ` holds NaN or inf).
    pub distance: f64,
    /// `max ‖variant - model‖ / ‖y‖` over [`AccumVariant::SPREAD`].
    pub spread: f64,
    /// `2·spread + 2·u_out + 2^-22`: a distance above it fails.
    pub threshold: f64,
    /// The distance of an all-zero output, `‖model‖ / ‖y‖`: the check has teeth against zeros
    /// when this is above the threshold.
    pub zero_distance: f64,
}

impl ModelGroupCheck {
    /// A NaN distance (or threshold) fails: `!(d <= t)`, not `d > t`.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn failed(&self) -> bool {
        !(self.distance <= self.threshold)
    }
}

/// The model-based check of every undecided pass of one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCheck {
    /// Non-empty groups whose reference is not all zero.
    pub groups: Vec<ModelGroupCheck>,
}

impl ModelCheck {
    /// The group furthest beyond its threshold, if any failed.
    pub fn worst_failure(&self) -> Option<&ModelGroupCheck> {
        self.groups
            .iter()
            .filter(|g| g.failed())
            .max_by(|a, b| (a.distance / a.threshold).total_cmp(&(b.distance / b.threshold)))
    }

    /// One line for a failure.
    pub fn failure_line(&self) -> Option<String> {
        let g = self.worst_failure()?;
        Some(format!(
            "{} group {}: model-based check: distance from the fast-accumulation model {} > threshold {} (2x the spread {} of plausible accumulators, plus output rounding)",
            g.pass,
            g.group,
            short(g.distance),
            short(g.threshold),
            short(g.spread)
        ))
    }

    /// One line when nothing failed: how close the output is and why that decides nothing.
    pub fn undecided_line(&self) -> Option<String> {
        let g = self
            .groups
            .iter()
            .max_by(|a, b| (a.distance / a.threshold).total_cmp(&(b.distance / b.threshold)))?;
        let zeros = self.groups.iter().all(|g| g.zero_distance > g.threshold);
        Some(format!(
            "the model-based check found every group within its threshold (worst: {} group {}, distance {} <= {}), which decides nothing: plausible accumulators differ that much; all-zero outputs {}",
            g.pass,
            g.group,
            short(g.distance),
            short(g.threshold),
            if zeros { "would have failed it" } else { "would have passed it too" }
        ))
    }
}

fn short(x: f64) -> String {
    format!("{x:.3e}")
}

/// An FP8 operand decoded to f32 (exact), with the `scale_inv` of each of its rows.
struct Decoded {
    vals: Array2<f32>,
    sinv: Vec<f32>,
}

impl Decoded {
    fn rows(q: &Quantized) -> Decoded {
        let mut sinv = vec![1.0f32; q.q.nrows()];
        for i in 0..q.scopes() {
            sinv[q.offsets[i]..q.offsets[i + 1]].fill(q.scale_inv[i]);
        }
        Decoded {
            vals: q.q.mapv(|b| decode_fp8(b, q.format) as f32),
            sinv,
        }
    }

    /// A column-wise copy `(cols, rows)`, with the `scale_inv` of each of its columns.
    fn columns(c: &ColumnWise, format: Format) -> Decoded {
        let mut sinv = vec![1.0f32; c.qt.ncols()];
        for i in 0..c.scale_inv.len() {
            sinv[c.offsets[i]..c.offsets[i + 1]].fill(c.scale_inv[i]);
        }
        Decoded {
            vals: c.qt.mapv(|b| decode_fp8(b, format) as f32),
            sinv,
        }
    }
}

/// The operands decoded once for every model run.
struct Model<'a> {
    case: &'a Fp8GemmCase,
    acc: AccumModel,
    lhs: Decoded,
    rhs: Decoded,
    dout: Option<Decoded>,
    lhs_col: Decoded,
    dout_col: Option<Decoded>,
}

impl<'a> Model<'a> {
    fn new(case: &'a Fp8GemmCase, ops: &Fp8Operands) -> Model<'a> {
        let dout_format = ops.dout.as_ref().map_or(Format::E5m2, |d| d.format);
        Model {
            case,
            acc: case.recipe.accumulation,
            lhs: Decoded::rows(&ops.lhs),
            rhs: Decoded::rows(&ops.rhs),
            dout: ops.dout.as_ref().map(Decoded::rows),
            lhs_col: Decoded::columns(&ops.lhs_col, ops.lhs.format),
            dout_col: ops
                .dout_col
                .as_ref()
                .map(|c| Decoded::columns(c, dout_format)),
        }
    }

    /// `fl_out(fl32(fl32(sum · sa) · sb))`, as the recipe orders the scaling.
    fn finish(&self, sum: f32, sa: f32, sb: f32) -> f64 {
        round_to(
            ((sum * sa) * sb) as f64,
            self.case.gemm.out_dtype,
            Overflow::Ieee,
        )
    }

    /// The model's output for group `e` of `pass` under `v`, flattened in the order of
    /// [`block`]; `None` when the pass lacks its operand.
    ///
    /// Every element is `dot_variant` of its products, computed a row at a time by
    /// [`AccumModel::row_sums`] (the same bits), with the right operand laid out so that a
    /// row's output columns are contiguous.
    fn block(&self, pass: Pass, e: usize, v: AccumVariant) -> Option<Vec<f64>> {
        let g = &self.case.gemm;
        let (k, n) = (g.k(), g.n());
        let off = g.offsets();
        let (lo, hi) = (off[e], off[e + 1]);
        // out[row, c] = finish(Σ_i left[row][i]·right[i][c], sa(row), sb(c)) for the rows and
        // columns of this pass, `right` row-major with `cols` columns.
        let mut out = Vec::new();
        let mut run = |left: &[Vec<f32>],
                       cols: usize,
                       right: &[f32],
                       scale: &dyn Fn(usize, usize) -> (f32, f32)| {
            out.reserve(left.len() * cols);
            for (r, a) in left.iter().enumerate() {
                self.acc.row_sums(v, a, right, cols, |c, sum| {
                    let (sa, sb) = scale(r, c);
                    out.push(self.finish(sum, sa, sb));
                });
            }
        };
        let (l, r) = (&self.lhs, &self.rhs);
        let row = |a: &Array2<f32>, i: usize| a.row(i).to_vec();
        match pass {
            Pass::Fwd => {
                let sb = if k > 0 { r.sinv[e * k] } else { 1.0 };
                let rows: Vec<Vec<f32>> = (lo..hi).map(|i| row(&l.vals, i)).collect();
                let weight = r.vals.slice(s![e * k..(e + 1) * k, ..]).to_owned();
                let weight = weight.as_slice().expect("owned, standard layout");
                run(&rows, n, weight, &|i, _| (l.sinv[lo + i], sb));
            }
            Pass::Dgrad => {
                let d = self.dout.as_ref()?;
                let rows: Vec<Vec<f32>> = (lo..hi).map(|i| row(&d.vals, i)).collect();
                // rhs_eᵀ: (N, K), so K output columns are contiguous.
                let weight = r
                    .vals
                    .slice(s![e * k..(e + 1) * k, ..])
                    .t()
                    .as_standard_layout()
                    .to_owned();
                let weight = weight.as_slice().expect("owned, standard layout");
                let sb = &r.sinv[e * k..(e + 1) * k];
                run(&rows, k, weight, &|i, c| (d.sinv[lo + i], sb[c]));
            }
            Pass::Wgrad => {
                let (lc, dc) = (&self.lhs_col, self.dout_col.as_ref()?);
                if hi == lo {
                    return Some(vec![0.0; k * n]);
                }
                let rows: Vec<Vec<f32>> = (0..k)
                    .map(|a| lc.vals.slice(s![a, lo..hi]).to_vec())
                    .collect();
                // dout_colᵀ of the group's tokens: (rows, N).
                let grads = dc
                    .vals
                    .slice(s![.., lo..hi])
                    .t()
                    .as_standard_layout()
                    .to_owned();
                let grads = grads.as_slice().expect("owned, standard layout");
                let (sa, sb) = (lc.sinv[lo], dc.sinv[lo]);
                run(&rows, n, grads, &|_, _| (sa, sb));
            }
        }
        Some(out)
    }
}

/// Group `e` of `pass` of `o`, flattened row-major (fwd/dgrad: the group's rows; wgrad: the
/// expert's `(K, N)` block); `None` when `o` lacks the pass or has the wrong shape.
pub fn block<A2: Held<Ix2>, A3: Held<Ix3>>(
    case: &Fp8GemmCase,
    o: &Outputs<A2, A3>,
    pass: Pass,
    e: usize,
) -> Option<Vec<f64>> {
    let g = &case.gemm;
    let (m, k, n) = (g.m(), g.k(), g.n());
    let shape_ok = match pass {
        Pass::Fwd => o.out.as_ref()?.held().dim() == (m, n),
        Pass::Dgrad => o.dlhs.as_ref()?.held().dim() == (m, k),
        Pass::Wgrad => o.drhs.as_ref()?.held().shape() == [g.groups(), k, n],
    };
    if !shape_ok {
        return None;
    }
    let part = o.group(pass, e, &g.offsets())?;
    let (mut values, mut row) = (Vec::with_capacity(part.nrows() * part.ncols()), Vec::new());
    for r in 0..part.nrows() {
        values.extend_from_slice(part.row_f64(r, &mut row));
    }
    Some(values)
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

fn dist(a: &[f64], b: &[f64]) -> f64 {
    norm(a.iter().zip(b).map(|(x, y)| x - y))
}

/// The model-based check (module docs) of `passes` of `got` against `reference`, the
/// recipe-exact values, for operands `ops` quantised per the case's recipe. Groups that are
/// empty or whose reference is all zero are left out (the per-element comparison decides
/// them exactly).
pub fn model_check(
    case: &Fp8GemmCase,
    ops: &Fp8Operands,
    passes: &[Pass],
    reference: &WideOutputs,
    got: &GemmOutputs,
) -> ModelCheck {
    let model = Model::new(case, ops);
    let u_out = case.gemm.out_dtype.info().unit_roundoff();
    let g = &case.gemm;
    let off = g.offsets();
    let jobs: Vec<(Pass, usize)> = passes
        .iter()
        .flat_map(|&pass| (0..g.groups()).map(move |e| (pass, e)))
        .collect();
    // Products per job (each variant costs the same), the cost the groups run in parallel by.
    let work = |&(_, e): &(Pass, usize)| {
        let rows = off[e + 1] - off[e];
        (rows * g.k() * g.n()).max(1)
    };
    let model = &model;
    let groups = crate::par::map_by_cost(jobs, work, |(pass, e)| {
        let (want, have) = (block(case, reference, pass, e)?, block(case, got, pass, e)?);
        let scale = norm(want.iter().copied());
        if want.is_empty() || scale == 0.0 {
            return None;
        }
        let nominal = model.block(pass, e, AccumVariant::NOMINAL)?;
        let spread = AccumVariant::SPREAD
            .iter()
            .filter_map(|&v| model.block(pass, e, v))
            .map(|m| dist(&m, &nominal) / scale)
            .fold(0.0, f64::max);
        let distance = if have.iter().all(|x| x.is_finite()) {
            dist(&have, &nominal) / scale
        } else {
            f64::INFINITY
        };
        Some(ModelGroupCheck {
            pass,
            group: e,
            elements: want.len(),
            distance,
            spread,
            threshold: 2.0 * spread + 2.0 * u_out + 2f64.powi(-22),
            zero_distance: norm(nominal.iter().copied()) / scale,
        })
    });
    let groups = groups.into_iter().flatten().collect();
    ModelCheck { groups }
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
