//! The FP8 grouped GEMM as an [`Op`]: its case ([`Fp8GemmCase`], whose recipe declares the
//! accumulation model the bound is derived from, so an external implementation declares
//! nothing more), both references computed once ([`Fp8Expected`]) and the two comparisons
//! ([`compare_fp8`]), or under fast verification ([`Verify::Fast`]) the fast reference of the
//! recipe-exact GEMM ([`super::fast`]). Its internals are the quantised operands an implementation used
//! ([`Fp8Operands`]), for the quantisation and copy properties.

use super::accum::{AccumModel, PROMOTE_INTERVAL};
use super::block_gemm::{
    block_expected, block_reference_from, compare_block, quantize_block_operands,
};
use super::case::Fp8GemmCase;
use super::compare::{compare_fp8, Fp8Expected, Fp8Report};
use super::fast::{fp8_fast_compare, fp8_fast_expected};
use super::gemm::{quantize_operands, reference_from_operands, Fp8Operands};
use crate::format::Format;
use crate::gemm::{Accumulator, ByMode, CaseReport, GemmOutputs, Passes, Precision, Verify};
use crate::op::{Comparison, Op};
use crate::Error;

/// The FP8 grouped GEMM (see the [module docs](super)).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fp8Gemm;

/// The declared precision of an FP8 case, for reports: the recipe's lhs format, an f32
/// accumulator (in blocks of [`PROMOTE_INTERVAL`] under fast-promote), the case's output
/// format. The bound itself is [`super::Fp8Bound`], from the recipe's accumulation model.
pub fn fp8_precision(case: &Fp8GemmCase) -> Precision {
    Precision {
        input: case.recipe.lhs.format,
        accumulator: Accumulator {
            format: Format::F32,
            block: match case.recipe.accumulation {
                AccumModel::FastPromote => Some(PROMOTE_INTERVAL),
                _ => None,
            },
        },
        output: case.gemm.out_dtype,
    }
}

impl Op for Fp8Gemm {
    const NAME: &'static str = "fp8";
    type Case = Fp8GemmCase;
    type Ask = Passes;
    /// Nothing: the recipe in the case declares the accumulation.
    type Declaration = ();
    type Precision = Precision;
    type Outputs = GemmOutputs;
    /// Every element (the default) or fast verification ([`super::fast`]).
    type Check = Verify;
    type Expected = ByMode<Fp8Expected>;
    type Report = Fp8Report;
    type Internals = Fp8Operands;

    fn validate(case: &Fp8GemmCase, passes: Passes) -> Result<(), Error> {
        case.validate(passes)
    }

    fn declared_precision(case: &Fp8GemmCase, _: &()) -> Precision {
        fp8_precision(case)
    }

    /// The recipe's: the reference follows the recipe too (and passes any accumulation
    /// model's bound).
    fn reference_precision(case: &Fp8GemmCase) -> Precision {
        fp8_precision(case)
    }

    fn expected(
        case: &Fp8GemmCase,
        passes: Passes,
        check: Verify,
    ) -> Result<ByMode<Fp8Expected>, Error> {
        match check {
            // Block scopes: their own reference and bound (`block_gemm`), full verification only.
            Verify::Full if case.recipe.has_block_scope() => {
                block_expected(case, passes).map(ByMode::Full)
            }
            Verify::Fast if case.recipe.has_block_scope() => Err(Error::InvalidRecipe {
                reason: case.recipe.fast_applies().unwrap_or_default().to_string(),
            }),
            Verify::Full => Fp8Expected::of(case, passes).map(ByMode::Full),
            Verify::Fast => fp8_fast_expected(case, passes).map(ByMode::Fast),
        }
    }

    /// The GEMM of the recipe's dequantised operands (every element, in either mode).
    fn reference_outputs(
        case: &Fp8GemmCase,
        passes: Passes,
        expected: ByMode<Fp8Expected>,
    ) -> GemmOutputs {
        match expected {
            ByMode::Full(e) => e.recipe_exact.value.into(),
            ByMode::Fast(_) if case.recipe.has_block_scope() => {
                let ops = quantize_block_operands(case, passes);
                block_reference_from(case, &ops, passes).value.into()
            }
            ByMode::Fast(_) => {
                let ops = quantize_operands(case, passes);
                reference_from_operands(case, &ops, passes).value.into()
            }
        }
    }

    fn compare(
        case: &Fp8GemmCase,
        passes: Passes,
        precision: &Precision,
        expected: &ByMode<Fp8Expected>,
        got: &GemmOutputs,
    ) -> Result<Fp8Report, Error> {
        Ok(match expected {
            ByMode::Full(e) if case.recipe.has_block_scope() => {
                compare_block(case, passes, precision, e, got)
            }
            ByMode::Full(e) => compare_fp8(case, passes, precision, e, got),
            ByMode::Fast(e) => fp8_fast_compare(case, passes, precision, e, got),
        })
    }

    /// The operands exactly as the recipe quantises them; none under block scopes (one
    /// scale per scope cannot describe them).
    fn reference_internals(case: &Fp8GemmCase, passes: Passes) -> Option<Fp8Operands> {
        if case.recipe.has_block_scope() {
            return None;
        }
        Some(quantize_operands(case, passes))
    }
}

/// The verdict is the recipe-exact comparison's, failed also by the model-based check where
/// that ran; the high-precision one is information.
impl Comparison for Fp8Report {
    /// Nothing failed: every element within the nominal bound, or (a fast accumulator) within
    /// the covering one, and no model-based failure.
    fn passed(&self) -> bool {
        (self.recipe_exact.passed() || self.covered())
            && self
                .model
                .as_ref()
                .is_none_or(|m| m.worst_failure().is_none())
    }
    /// Beyond the covering bound where there is one (the nominal failure is within reach of a
    /// plausible accumulator, not a finding), else the nominal failure.
    fn first_failure(&self) -> Option<String> {
        let cover = self.cover.as_ref().and_then(CaseReport::first_failure);
        cover
            .map(|f| format!("{f} (beyond the covering bound of accumulators down to 13 bits and k-blocks of 4 too)"))
            .or_else(|| self.recipe_exact.first_failure())
            .or_else(|| self.model.as_ref()?.failure_line())
    }
    fn inconclusive(&self) -> Option<String> {
        if self.covered() {
            let nominal = self.recipe_exact.first_failure().unwrap_or_default();
            return Some(format!(
                "{nominal}: outside the fast-accumulation model's bound (k-blocks of 32, 14 bits) but within the covering bound of accumulators down to 13 bits and k-blocks of 4, which the model's public sources do not rule out; a GPU run that checks the model would decide (docs/fp8.md)"
            ));
        }
        let reason = self.recipe_exact.inconclusive()?;
        Some(match self.model.as_ref().and_then(|m| m.undecided_line()) {
            Some(line) => format!("{reason}; {line}"),
            None => reason,
        })
    }
}
