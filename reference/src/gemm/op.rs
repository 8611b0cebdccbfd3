//! The grouped GEMM as an [`Op`]: its case ([`GroupedGemmCase`]), the passes asked, the
//! accumulator an external implementation declares, and the comparison with the f64
//! reference, computed expert by expert as it is compared ([`super::compare_streamed`]).

use super::bound::{Accumulator, Precision};
use super::case::{GemmOutputs, GroupedGemmCase, Passes};
use super::compare::{compare_streamed, CaseReport};
use super::stream::reference_written;
use crate::format::Format;
use crate::op::{Comparison, Op};
use crate::Error;

/// The grouped GEMM (forward, dgrad, wgrad; see the [module docs](super)).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gemm;

impl Op for Gemm {
    const NAME: &'static str = "gemm";
    type Case = GroupedGemmCase;
    type Ask = Passes;
    /// The accumulator (`--acc`, `--acc-block`) and, where it is not the case's, the output
    /// format (`--out-dtype`); inputs are the case's format.
    type Declaration = GemmDeclaration;
    type Precision = Precision;
    type Outputs = GemmOutputs;
    /// Nothing is computed before the implementation runs: the reference is computed where
    /// it is compared, so it is never held whole ([`super::stream`]).
    type Expected = Streamed;
    type Report = CaseReport;
    type Internals = ();

    fn validate(case: &GroupedGemmCase, passes: Passes) -> Result<(), Error> {
        case.validate(passes)
    }

    fn declared_precision(case: &GroupedGemmCase, declared: &GemmDeclaration) -> Precision {
        Precision {
            input: case.dtype,
            accumulator: declared.accumulator,
            output: declared.output.unwrap_or(case.out_dtype),
        }
    }

    /// f64 accumulation in any order, rounded once to the case's output format
    /// ([`reference_written`]).
    fn reference_precision(case: &GroupedGemmCase) -> Precision {
        Precision {
            input: case.dtype,
            accumulator: Accumulator::any_order(Format::F64),
            output: case.out_dtype,
        }
    }

    /// Validates the case; the reference itself is computed by [`Gemm::compare`].
    fn expected(case: &GroupedGemmCase, passes: Passes) -> Result<Streamed, Error> {
        case.validate(passes)?;
        Ok(Streamed)
    }

    fn reference_outputs(case: &GroupedGemmCase, passes: Passes, _: Streamed) -> GemmOutputs {
        reference_written(case, passes)
    }

    fn compare(
        case: &GroupedGemmCase,
        passes: Passes,
        precision: &Precision,
        _: &Streamed,
        got: &GemmOutputs,
    ) -> Result<CaseReport, Error> {
        Ok(compare_streamed(case, passes, precision, got))
    }
}

/// [`Gemm`]'s `Expected`: the case was validated, and the reference is left to the
/// comparison, which computes it one expert's row block at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streamed;

/// What an implementation of the grouped GEMM declares about its arithmetic.
///
/// `output`: the format the implementation rounds its results to, where that is not the
/// case's `out_dtype` (`None`, the default). A kernel may be unable to write what the case
/// asks: cuBLAS's grouped GEMM writes bf16 for bf16 inputs, and so does
/// `torch.nn.functional.grouped_mm`. Its outputs still arrive in the case's `.npy` dtype; the
/// declaration says they were rounded to `output` on the way, so the bound takes that
/// rounding (step 2 of [`super::bound`]) instead of failing every element.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GemmDeclaration {
    pub accumulator: Accumulator,
    pub output: Option<Format>,
}

/// The default declaration of an external implementation: f32 accumulation in any order.
impl Default for Accumulator {
    fn default() -> Self {
        Accumulator::any_order(Format::F32)
    }
}

impl Comparison for CaseReport {
    fn passed(&self) -> bool {
        CaseReport::passed(self)
    }
    fn first_failure(&self) -> Option<String> {
        CaseReport::first_failure(self)
    }
    fn inconclusive(&self) -> Option<String> {
        CaseReport::inconclusive(self)
    }
}
