//! The two comparisons of an FP8 grouped GEMM's outputs.
//!
//! 1. **Recipe-exact** (the verdict): against [`super::fp8_reference`], every element within
//!    [`super::Fp8Bound`] for the accumulation model the recipe declares. This is the tight
//!    check that catches scale mix-ups, wrong rounding and wrong formats.
//! 2. **Model-based** ([`super::model`]), only where a fast accumulator's worst-case bound
//!    admits an all-zero output: it can turn that INCONCLUSIVE into a FAIL, never a PASS.
//! 3. **Against the unquantised GEMM** (information only, [`super::high_precision`]).
//!
//! Both references are computed once per case ([`Fp8Expected`]) and shared by every
//! comparison made against them.

use serde::Serialize;

use super::accum::AccumModel;
use super::case::Fp8GemmCase;
use super::gemm::{quantize_operands, reference_and_cover, Fp8Bound, Fp8Operands};
use super::high_precision::{high_precision, HighPrecisionStats};
use super::model::{model_check, ModelCheck};
use crate::gemm::{
    compare_outputs_with_bound, reference, CaseReport, GemmOutputs, Pass, Passes, Precision,
    ReferenceResult, Verify, WideOutputs,
};
use crate::Error;

/// What an FP8 case is compared with: both references, computed once.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Expected {
    /// The f64 GEMM of the recipe's dequantised operands, with its magnitudes (the verdict's
    /// reference).
    pub recipe_exact: ReferenceResult,
    /// The f64 GEMM of the unquantised float32 inputs (information).
    pub high_precision: ReferenceResult,
    /// The operands as the recipe quantises them (for the model-based check).
    pub operands: Fp8Operands,
    /// Under a fast accumulator, the covering bound's effective magnitudes (accumulators down
    /// to 13 bits and k-blocks of 4, `super::accum`), judged where the nominal bound fails.
    pub cover: Option<WideOutputs>,
}

impl Fp8Expected {
    /// Both references of `case` (validated first).
    pub fn of(case: &Fp8GemmCase, passes: Passes) -> Result<Fp8Expected, Error> {
        case.validate(passes)?;
        let operands = quantize_operands(case, passes);
        let (recipe_exact, cover) = reference_and_cover(case, &operands, passes);
        Ok(Fp8Expected {
            recipe_exact,
            high_precision: reference(&case.gemm, passes)?,
            operands,
            cover,
        })
    }
}

/// Both comparisons of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fp8Report {
    /// The verdict: every element within the recipe-exact bound.
    pub recipe_exact: CaseReport,
    /// Per pass against the unquantised GEMM, for information.
    pub high_precision: Vec<HighPrecisionStats>,
    /// The model-based check of the passes the recipe-exact bound could not decide (fast
    /// accumulation only).
    pub model: Option<ModelCheck>,
    /// Where the nominal bound of a fast accumulator failed: the same comparison against the
    /// covering bound. Within it the verdict is INCONCLUSIVE (a plausible accumulator that is
    /// not the model could have written this), beyond it FAIL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cover: Option<CaseReport>,
}

impl Fp8Report {
    /// Whether the failures of the nominal bound are all within the covering one.
    pub fn covered(&self) -> bool {
        !self.recipe_exact.passed() && self.cover.as_ref().is_some_and(CaseReport::passed)
    }
}

/// The passes the model-based check runs on (none when it does not run): those whose
/// recipe-exact bound admits an all-zero output, when a fast accumulator is declared, every
/// element passed, and every element was checked (not under fast verification).
pub(super) fn undecided(case: &Fp8GemmCase, recipe_exact: &CaseReport) -> Vec<Pass> {
    if case.recipe.accumulation == AccumModel::Exact
        || !recipe_exact.passed()
        || recipe_exact.verify != Verify::Full
    {
        return Vec::new();
    }
    recipe_exact
        .passes
        .iter()
        .filter(|p| p.admits_zero())
        .map(|p| p.pass)
        .collect()
}

/// Compares `got` with the recipe-exact reference (for an implementation that declared
/// `precision`: its output format sets the ULP statistics) and with the unquantised GEMM.
/// `expected` must be [`Fp8Expected::of`] `case` for `passes`.
pub fn compare_fp8(
    case: &Fp8GemmCase,
    passes: Passes,
    precision: &Precision,
    expected: &Fp8Expected,
    got: &GemmOutputs,
) -> Fp8Report {
    let bound = Fp8Bound {
        accumulation: case.recipe.accumulation,
        output: case.gemm.out_dtype,
    };
    let recipe_exact = compare_outputs_with_bound(
        &case.gemm,
        passes,
        precision,
        &expected.recipe_exact,
        got,
        &|n| bound.judged(n),
    );
    let cover = match (&expected.cover, recipe_exact.passed()) {
        (Some(m), false) => {
            // Only on a failure: the values are copied once to pair them with these bounds.
            let covering = ReferenceResult {
                value: expected.recipe_exact.value.clone(),
                magnitude: m.clone(),
            };
            Some(compare_outputs_with_bound(
                &case.gemm,
                passes,
                precision,
                &covering,
                got,
                &|n| bound.judged(n),
            ))
        }
        _ => None,
    };
    let undecided = undecided(case, &recipe_exact);
    let model = (!undecided.is_empty()).then(|| {
        model_check(
            case,
            &expected.operands,
            &undecided,
            &expected.recipe_exact.value,
            got,
        )
    });
    Fp8Report {
        recipe_exact,
        high_precision: high_precision(case, passes, &expected.high_precision, got),
        model,
        cover,
    }
}
