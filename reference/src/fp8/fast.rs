//! The FP8 grouped GEMM verified fast (`moecheck gemm --dtype fp8 --verify fast`): the
//! recipe-exact comparison by the grouped GEMM's fast verification ([`crate::gemm::fast`]),
//! with the FP8 bound.
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
use super::files::Fp8Json;
use super::gemm::{quantize_operands, reference_from_operands, Fp8Bound, Fp8Operands};
use super::op::{fp8_precision, Fp8Gemm};
use super::report::{Fp8Document, Fp8Extra};
use super::scaling::Quantized;
use crate::format::Format;
use crate::gemm::fast::{fast_compare_with_bound, fast_expected, FastExpected, FastReport};
use crate::gemm::shard::{merge_fast, Shard, Sharded};
use crate::gemm::{GemmFast, GemmOutputs, GroupedGemmCase, Pass, Passes, Precision, Weights};
use crate::op::Op;
use crate::protocol::{FileError, Files, Protocol, Stored};
use crate::report::{Reported, RunInfo};
use crate::Error;

/// The FP8 grouped GEMM, verified fast (see the [module docs](self)).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fp8GemmFast;

impl Fp8Recipe {
    /// `None` when fast verification applies to this recipe ([module docs](self)); otherwise
    /// why the case must be checked in full.
    pub fn fast_applies(&self) -> Option<&'static str> {
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

/// The fast reference of the decoded case with each group's values and magnitudes
/// multiplied by its `s_g` ([`group_scales`]).
pub fn scaled(mut fast: FastExpected, ops: &Fp8Operands, groups: usize) -> FastExpected {
    for pe in &mut fast.passes {
        let s = group_scales(ops, groups, pe.pass);
        for b in &mut pe.blocks {
            let f = s[b.group];
            let times = |v: &mut f64| *v *= f;
            b.magnitude.map_inplace(times);
            b.projection.map_inplace(times);
            for sampled in [&mut b.rows, &mut b.cols] {
                sampled.want.map_inplace(times);
                sampled.magnitude.map_inplace(times);
            }
        }
    }
    fast
}

impl Op for Fp8GemmFast {
    const NAME: &'static str = "fp8";
    type Case = Fp8GemmCase;
    type Ask = Passes;
    type Declaration = ();
    type Precision = Precision;
    type Outputs = GemmOutputs;
    type Expected = FastExpected;
    type Report = FastReport;
    type Internals = Fp8Operands;

    fn validate(case: &Fp8GemmCase, passes: Passes) -> Result<(), Error> {
        case.validate(passes)
    }

    fn declared_precision(case: &Fp8GemmCase, _: &()) -> Precision {
        fp8_precision(case)
    }

    fn reference_precision(case: &Fp8GemmCase) -> Precision {
        fp8_precision(case)
    }

    fn expected(case: &Fp8GemmCase, passes: Passes) -> Result<FastExpected, Error> {
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

    /// The recipe-exact reference's values, every element (what runs as `--impl reference`,
    /// not what checks).
    fn reference_outputs(case: &Fp8GemmCase, passes: Passes, _: FastExpected) -> GemmOutputs {
        let ops = quantize_operands(case, passes);
        reference_from_operands(case, &ops, passes).value.into()
    }

    fn compare(
        case: &Fp8GemmCase,
        passes: Passes,
        precision: &Precision,
        expected: &FastExpected,
        got: &GemmOutputs,
    ) -> Result<FastReport, Error> {
        let bound = Fp8Bound {
            accumulation: case.recipe.accumulation,
            output: case.gemm.out_dtype,
        };
        Ok(fast_compare_with_bound(
            &case.gemm,
            passes,
            precision,
            expected,
            got,
            &|n| bound.at_len(n),
        ))
    }

    fn reference_internals(case: &Fp8GemmCase, passes: Passes) -> Option<Fp8Operands> {
        Some(quantize_operands(case, passes))
    }
}

/// The FP8 grouped GEMM's case directory, unchanged.
impl Protocol for Fp8GemmFast {
    const PROTOCOL_OP: &'static str = <Fp8Gemm as Protocol>::PROTOCOL_OP;
    const MARKER: Option<&'static str> = <Fp8Gemm as Protocol>::MARKER;
    type CaseJson = Fp8Json;

    fn case_json(case: &Fp8GemmCase, passes: Passes) -> Fp8Json {
        Fp8Gemm::case_json(case, passes)
    }
    fn input_files(case: &Fp8GemmCase, passes: Passes) -> Vec<(String, Stored)> {
        Fp8Gemm::input_files(case, passes)
    }
    fn read_case(json: Fp8Json, files: &mut dyn Files) -> Result<(Fp8GemmCase, Passes), FileError> {
        Fp8Gemm::read_case(json, files)
    }
    fn output_files(outputs: &GemmOutputs) -> Vec<(String, Stored)> {
        Fp8Gemm::output_files(outputs)
    }
    fn read_outputs(
        case: &Fp8GemmCase,
        passes: Passes,
        files: &mut dyn Files,
    ) -> Result<GemmOutputs, FileError> {
        Fp8Gemm::read_outputs(case, passes, files)
    }
}

/// The FP8 document: the grouped GEMM's fast document of the recipe-exact comparison, the
/// recipe, and no comparison with the unquantised GEMM.
impl Reported for Fp8GemmFast {
    type Document = Fp8Document;

    fn document(run: &RunInfo<Fp8GemmFast>) -> Fp8Document {
        let gemm = <GemmFast as Reported>::document(&RunInfo::<GemmFast> {
            implementation: run.implementation,
            case: &run.case.gemm,
            ask: run.ask,
            expected: run.expected,
            precision: run.precision,
            verdict: run.verdict,
            draws: run.draws,
            reference_seconds: run.reference_seconds,
        });
        Fp8Document {
            gemm,
            fp8: Fp8Extra {
                recipe: run.case.recipe,
                verdict_from: "recipe-exact",
                high_precision: Vec::new(),
                model_check: None,
            },
        }
    }

    fn render(doc: &Fp8Document) -> String {
        Fp8Gemm::render(doc)
    }
}

impl Sharded for Fp8GemmFast {
    fn grouped(case: &Fp8GemmCase) -> &GroupedGemmCase {
        &case.gemm
    }
    fn shard(case: &Fp8GemmCase, shard: &Shard) -> Fp8GemmCase {
        case.shard(shard)
    }
    fn merge(case: &Fp8GemmCase, parts: &[(Shard, FastReport)]) -> FastReport {
        merge_fast(&case.gemm, parts)
    }
    fn unheld() -> FastExpected {
        FastExpected { passes: Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{Array2, Array3};

    use super::*;
    use crate::fp8::fp8_reference;
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
        let expected = Fp8GemmFast::expected(&c, Passes::ALL).unwrap();
        let precision = fp8_precision(&c);
        let judge = |got: &GemmOutputs| {
            Fp8GemmFast::compare(&c, Passes::ALL, &precision, &expected, got).unwrap()
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
        assert!(caught.sampled.passed(), "the moved element was sampled");
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
