//! The FP8 grouped GEMM verified fast (`moecheck gemm --dtype fp8 --verify fast`, the
//! [`crate::gemm::Verify::Fast`] mode of [`super::Fp8Gemm`]): the recipe-exact comparison by
//! the grouped GEMM's fast verification ([`crate::gemm::fast`]), with the FP8 bound.
//!
//! ## Why the grouped GEMM's fast check applies
//! Every scale is constant over a group's rows and over an expert's weight (group, expert or
//! tensor scopes, current or given), so in every pass the recipe-exact reference of group `g`
//! is one number times a grouped GEMM of FP8 values:
//!
//! `y = s_g·Σ qa·qb`, `S = s_g·Σ |qa·qb|`, with `s_g` the product of the two operands'
//! `scale_inv` for that group (fwd `lhs`·`rhs`, dgrad `dout`·`rhs`, wgrad `lhs`·`dout`, the
//! column-wise copies sharing the row-wise `scale_inv`).
//!
//! The decoded FP8 values are exact in bf16 (at most 4 significant bits, exponents within
//! bf16's), so the grouped GEMM of the decoded operands ([`decoded`]: `lhs`, `dout` in f32,
//! `rhs` held in bf16) is an ordinary grouped-GEMM case. Its fast reference
//! ([`crate::gemm::fast::fast_expected`]: projections, row magnitudes, sampled rows and
//! columns) is computed and every value and magnitude of group `g` multiplied by `s_g`
//! ([`scaled`]). The comparison is [`crate::gemm::fast::fast_compare_with_bound`] with
//! [`super::Fp8Bound`]: the same per-element bound as the full FP8 check for the sampled
//! elements, and the thresholds of the projections derived from it as in the grouped GEMM
//! (its module docs give the derivation and the guarantee; it holds for any bound of the
//! form `c_S·S + c_y·|y| + floor + underflow`).
//!
//! **The reference's own rounding.** `s_g` is exact in f64 (two f32 factors); multiplying a
//! value or magnitude by it rounds once more (relative `2^-53`). The FP8 bound's coefficient
//! of `S` carries `3·γ(n, 2^-53)` for the reference's error ([`super::gemm`]), of which the
//! fast derivation uses `γ(n, 2^-53)`: the extra rounding is inside what is left.
//!
//! ## What fast mode does not do for FP8
//! * The comparison with the unquantised GEMM (information in full mode) is not computed.
//! * The model-based check of a fast accumulator (full mode's, where the bound admits an
//!   all-zero output) is not run: such a pass stays INCONCLUSIVE.
//! * IEEE casts (`--no-saturate`) under delayed scaling can quantise to NaN or ±inf, which a
//!   correct kernel then propagates; fast mode fails any non-finite output, so such a recipe
//!   is checked in full ([`Fp8Recipe::fast_applies`]).

use half::bf16;

use super::bulk::decode_all;
use super::case::{Fp8GemmCase, Fp8Recipe, ScalingKind};
use super::compare::Fp8Report;
use super::gemm::{quantize_operands, Fp8Bound, Fp8Operands};
use super::scaling::Quantized;
use crate::format::Format;
use crate::gemm::fast::{fast_compare_with_bound, fast_expected, FastExpected};
use crate::gemm::{GemmOutputs, GroupedGemmCase, Pass, Passes, Precision, Weights};
use crate::Error;

impl Fp8Recipe {
    /// `None` when fast verification applies to this recipe ([module docs](self)); otherwise
    /// why the case must be checked in full.
    pub fn fast_applies(&self) -> Option<&'static str> {
        if self.has_block_scope() {
            return Some(
                "block scopes (block:RxC, mx:N) are checked element by element only: the fast reference assumes one scale per group (use --verify full)",
            );
        }
        (!self.saturate && matches!(self.scaling, ScalingKind::Delayed { .. })).then_some(
            "IEEE casts under delayed scaling may quantise to NaN or inf, which only --verify full checks",
        )
    }
}

/// The grouped-GEMM case of the decoded FP8 operands: `lhs` and `dout` in f32, `rhs` in bf16
/// (every FP8 value is a bf16 value), the case's group sizes, output format and tail
/// contract. Rows in no scope (the tail) are 0.
pub fn decoded(case: &Fp8GemmCase, ops: &Fp8Operands) -> GroupedGemmCase {
    let dec = |q: &Quantized| decode_all(&q.q, q.format, |v| v as f32);
    let (g, k, n) = case.gemm.rhs.dim();
    let rhs = decode_all(&ops.rhs.q, ops.rhs.format, bf16::from_f64)
        .into_shape_with_order((g, k, n))
        .expect("G·K rows");
    GroupedGemmCase {
        lhs: dec(&ops.lhs),
        rhs: Weights::Bf16(rhs),
        group_sizes: case.gemm.group_sizes.clone(),
        dout: ops.dout.as_ref().map(dec),
        dtype: Format::F32,
        out_dtype: case.gemm.out_dtype,
        tail: case.gemm.tail,
    }
}

/// `s_g` of every group for `pass` (module docs): the product, exact in f64, of the two
/// operands' `scale_inv` for the group.
pub fn group_scales(ops: &Fp8Operands, groups: usize, pass: Pass) -> Vec<f64> {
    // A tensor scope has one scale for every group; a group or expert scope one per group.
    let sinv = |q: &Quantized, g: usize| {
        let i = if q.scopes() == 1 { 0 } else { g };
        q.scale_inv[i] as f64
    };
    let dout = || {
        ops.dout
            .as_ref()
            .expect("dout was quantised for a backward pass")
    };
    (0..groups)
        .map(|g| match pass {
            Pass::Fwd => sinv(&ops.lhs, g) * sinv(&ops.rhs, g),
            Pass::Dgrad => sinv(dout(), g) * sinv(&ops.rhs, g),
            Pass::Wgrad => sinv(&ops.lhs, g) * sinv(dout(), g),
        })
        .collect()
}

/// The fast reference of the decoded case with each group's values and magnitudes (the
/// projections' and magnitudes of whole rows and of chunks, the sampled elements') multiplied
/// by its `s_g` ([`group_scales`]).
pub fn scaled(mut fast: FastExpected, ops: &Fp8Operands, groups: usize) -> FastExpected {
    for pe in &mut fast.passes {
        let s = group_scales(ops, groups, pe.pass);
        for b in &mut pe.blocks {
            let f = s[b.group];
            let times = |v: &mut f64| *v *= f;
            b.magnitude.map_inplace(times);
            b.projection.map_inplace(times);
            b.chunk_projection.map_inplace(times);
            b.chunk_magnitude.map_inplace(times);
            for sampled in [&mut b.rows, &mut b.cols] {
                sampled.want.map_inplace(times);
                sampled.magnitude.map_inplace(times);
            }
        }
    }
    fast
}

/// The fast reference of `case` ([`Fp8Recipe::fast_applies`] must hold): the fast reference
/// of the decoded case, scaled group by group ([`scaled`]).
pub fn fp8_fast_expected(case: &Fp8GemmCase, passes: Passes) -> Result<FastExpected, Error> {
    case.validate(passes)?;
    if let Some(why) = case.recipe.fast_applies() {
        return Err(Error::InvalidRecipe {
            reason: format!("--verify fast: {why}"),
        });
    }
    let ops = quantize_operands(case, passes);
    let fast = fast_expected(&decoded(case, &ops), passes)?;
    Ok(scaled(fast, &ops, case.gemm.groups()))
}

/// Compares `got` with the fast reference `expected` of `case` under the FP8 bound: the
/// recipe-exact report of fast verification, nothing against the unquantised GEMM and no
/// model-based check ([module docs](self)).
pub fn fp8_fast_compare(
    case: &Fp8GemmCase,
    passes: Passes,
    precision: &Precision,
    expected: &FastExpected,
    got: &GemmOutputs,
) -> Fp8Report {
    let bound = Fp8Bound {
        accumulation: case.recipe.accumulation,
        output: case.gemm.out_dtype,
    };
    Fp8Report {
        recipe_exact: fast_compare_with_bound(&case.gemm, passes, precision, expected, got, &|n| {
            bound.covering_at_len(n)
        }),
        high_precision: Vec::new(),
        model: None,
        cover: None,
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{Array2, Array3};

    use super::*;
    use crate::fp8::{fp8_precision, fp8_reference};
    use crate::gemm::fast::CHUNK;
    use crate::gemm::TailContract;
    use crate::seed::mix;

    /// Groups of 0, 300, 3 and 40 rows and 4 tail rows; K = 70, N = 50; values over 2^±9 per
    /// group and expert, so every group's `s_g` differs from 1 and from the others.
    fn case() -> Fp8GemmCase {
        let sizes = vec![0, 300, 3, 40];
        let m = sizes.iter().sum::<usize>() + 4;
        let (k, n, g) = (70, 50, sizes.len());
        let off = crate::gemm::case::offsets(&sizes);
        let group = |r: usize| (0..g).rev().find(|&e| off[e] <= r).unwrap_or(0);
        let v = |i: u64, e: i32| (((mix(i) % 1999) as f32 - 999.0) / 512.0) * 2f32.powi(e);
        Fp8GemmCase {
            gemm: GroupedGemmCase {
                lhs: Array2::from_shape_fn((m, k), |(r, c)| {
                    v((r * k + c) as u64, 3 * group(r) as i32 - 4)
                }),
                rhs: Array3::from_shape_fn((g, k, n), |(e, r, c)| {
                    v((1 << 20) + ((e * k + r) * n + c) as u64, 5 - 2 * e as i32)
                })
                .into(),
                group_sizes: sizes,
                dout: Some(Array2::from_shape_fn((m, n), |(r, c)| {
                    v((1 << 30) + (r * n + c) as u64, 9 - 4 * group(r) as i32)
                })),
                dtype: Format::F32,
                out_dtype: Format::F32,
                tail: TailContract::Zero,
            },
            recipe: Fp8Recipe::default(),
            given_scales: None,
        }
    }

    /// The recipe-exact reference rounded to f32 (inside every bound) passes fast
    /// verification in every pass (no false failure: the scaled projections and magnitudes
    /// are the recipe's); one element of the 300-row group, in a row and a column neither
    /// sampled, moved by the row's summed magnitude fails the projections (and only them);
    /// moved by a tenth of its own bound it still passes.
    #[test]
    fn scaled_projections_judge_the_recipe_exact_outputs() {
        let c = case();
        let r = fp8_reference(&c, Passes::ALL).unwrap();
        let good: GemmOutputs = GemmOutputs {
            out: r.value.out.clone().map(|a| a.mapv(|x| x as f32).into()),
            dlhs: r.value.dlhs.clone().map(|a| a.mapv(|x| x as f32).into()),
            drhs: r.value.drhs.clone().map(|a| a.mapv(|x| x as f32).into()),
        };
        let expected = fp8_fast_expected(&c, Passes::ALL).unwrap();
        let precision = fp8_precision(&c);
        let judge = |got: &GemmOutputs| {
            fp8_fast_compare(&c, Passes::ALL, &precision, &expected, got).recipe_exact
        };
        let clean = judge(&good);
        assert!(clean.passed(), "{:?}", clean.first_failure());
        // Group 1 (rows 0..300): an element whose row and column are both unsampled, so
        // only the projections (whose thresholds are the scaled magnitudes) can see it.
        let fwd = &expected.passes[0];
        let block = fwd.blocks.iter().find(|b| b.group == 1).unwrap();
        let row = (1..299).find(|i| !block.rows.index.contains(i)).unwrap();
        let col = (0..50).find(|j| !block.cols.index.contains(j)).unwrap();
        let mags = r.magnitude.out.as_ref().unwrap();
        let want = r.value.out.as_ref().unwrap();
        let bound = Fp8Bound {
            accumulation: c.recipe.accumulation,
            output: c.gemm.out_dtype,
        }
        .at_len(c.gemm.k());
        // 100 times the row's summed bounds: past twice its threshold, far inside what the
        // unscaled magnitudes (s_1 is about 2^-15) would let through.
        let row_bounds: f64 = (0..50)
            .map(|j| bound.at(mags[(row, j)], want[(row, j)]))
            .sum();
        let mut bad = good.clone();
        let out = bad.out.as_mut().unwrap().f64_mut();
        out[(row, col)] += 100.0 * row_bounds;
        let caught = judge(&bad);
        assert!(
            caught.passes.iter().all(crate::gemm::PassReport::passed),
            "the moved element was sampled"
        );
        assert!(
            caught.fast[0].failed_rows > 0,
            "100x the row's bounds escaped the projections"
        );
        let mut small = good.clone();
        let y = r.value.out.as_ref().unwrap()[(row, col)];
        let out = small.out.as_mut().unwrap().f64_mut();
        out[(row, col)] = (y + bound.at(mags[(row, col)], y) / 10.0) as f32 as f64;
        assert!(judge(&small).passed(), "an error inside the bound failed");
        // The scales differ per group: the check would not pass unscaled.
        let ops = quantize_operands(&c, Passes::ALL);
        let s = group_scales(&ops, 4, Pass::Fwd);
        assert!(s[1] != 1.0 && s[1] != s[3], "{s:?}");
        let unscaled = fast_expected(&decoded(&c, &ops), Passes::ALL).unwrap();
        let v = fast_compare_with_bound(&c.gemm, Passes::ALL, &precision, &unscaled, &good, &|n| {
            Fp8Bound {
                accumulation: c.recipe.accumulation,
                output: c.gemm.out_dtype,
            }
            .at_len(n)
        });
        assert!(
            !v.passed(),
            "the unscaled reference passed the recipe's outputs"
        );
    }

    /// The chunks' rule under the FP8 bound and the scaled reference: in every pass, one
    /// element of the 300-row group moved by 64 times its own FP8 bound (either sign), at
    /// every column of a row that is not sampled, fails its chunk's projection.
    #[test]
    fn a_lone_element_64_times_its_fp8_bound_fails_by_its_chunk() {
        let c = case();
        let r = fp8_reference(&c, Passes::ALL).unwrap();
        let good = GemmOutputs {
            out: r.value.out.clone().map(|a| a.mapv(|x| x as f32).into()),
            dlhs: r.value.dlhs.clone().map(|a| a.mapv(|x| x as f32).into()),
            drhs: r.value.drhs.clone().map(|a| a.mapv(|x| x as f32).into()),
        };
        let expected = fp8_fast_expected(&c, Passes::ALL).unwrap();
        let precision = fp8_precision(&c);
        let bound = |n: usize| {
            Fp8Bound {
                accumulation: c.recipe.accumulation,
                output: c.gemm.out_dtype,
            }
            .at_len(n)
        };
        let k = c.gemm.k();
        for pe in &expected.passes {
            let pass = pe.pass;
            let b = pe.blocks.iter().find(|b| b.group == 1).unwrap();
            let rows = b.magnitude.len();
            let i = (rows / 2..rows)
                .find(|i| !b.rows.index.contains(i))
                .unwrap();
            let row = b.row0 + i;
            for col in 0..pe.shape.1 {
                let mut bad = good.clone();
                let (want, mag, n, slot) = match pass {
                    Pass::Fwd => {
                        let at = (row, col);
                        let (w, m) = (
                            r.value.out.as_ref().unwrap()[at],
                            r.magnitude.out.as_ref().unwrap()[at],
                        );
                        (w, m, k, &mut bad.out.as_mut().unwrap().f64_mut()[at])
                    }
                    Pass::Dgrad => {
                        let at = (row, col);
                        let (w, m) = (
                            r.value.dlhs.as_ref().unwrap()[at],
                            r.magnitude.dlhs.as_ref().unwrap()[at],
                        );
                        (
                            w,
                            m,
                            c.gemm.n(),
                            &mut bad.dlhs.as_mut().unwrap().f64_mut()[at],
                        )
                    }
                    Pass::Wgrad => {
                        let at = (1, row - b.row0, col);
                        let (w, m) = (
                            r.value.drhs.as_ref().unwrap()[at],
                            r.magnitude.drhs.as_ref().unwrap()[at],
                        );
                        (w, m, 300, &mut bad.drhs.as_mut().unwrap().f64_mut()[at])
                    }
                };
                let sign = if col % 2 == 0 { 1.0 } else { -1.0 };
                *slot = want + sign * 64.0 * bound(n).at(mag, want);
                let report = fp8_fast_compare(&c, Passes::only(pass), &precision, &expected, &bad);
                let f = &report.recipe_exact.fast[0];
                // The chunk holding it fails, whatever its signs (the row's projections may
                // too: these rows are 50 and 70 columns, their thresholds about 50 and 70
                // bounds).
                let w = f.chunk_worst.as_ref().unwrap();
                let at = format!("{pass} row {row} col {col}");
                assert_eq!((f.failed_chunks, w.col / CHUNK), (1, col / CHUNK), "{at}");
            }
        }
    }

    #[test]
    fn ieee_casts_under_delayed_scaling_are_checked_in_full() {
        let mut c = case();
        c.recipe.saturate = false;
        assert!(c.recipe.fast_applies().is_none(), "current scaling");
        c.recipe.scaling = ScalingKind::Delayed {
            history_len: 4,
            algo: crate::fp8::AmaxAlgo::Max,
            margin: 0,
        };
        let why = c.recipe.fast_applies().expect("refused");
        assert!(why.contains("--verify full"), "{why}");
    }
}
