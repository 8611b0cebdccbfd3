//! The grouped GEMM as an [`Op`]: its case ([`GroupedGemmCase`]), the passes asked, the
//! accumulator an external implementation declares, and the comparison with the f64
//! reference in either mode ([`Verify`]): element by element, computed expert by expert as it
//! is compared ([`super::compare_streamed`]), or fast ([`super::fast`]).

use super::bound::{Accumulator, Precision};
use super::case::{GemmOutputs, GroupedGemmCase, Passes};
use super::compare::{compare_streamed, CaseReport};
use super::fast::{fast_compare, fast_expected, FastExpected, Verify};
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
    /// Every element (the default) or fast verification.
    type Check = Verify;
    /// Full: nothing is computed before the implementation runs, the reference is computed
    /// where it is compared, so it is never held whole ([`super::stream`]). Fast: the
    /// projections and sampled rows and columns ([`super::fast::FastExpected`]).
    type Expected = ByMode<Streamed>;
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

    /// Full: validates the case (the reference itself is computed by [`Gemm::compare`]).
    /// Fast: the fast reference.
    fn expected(
        case: &GroupedGemmCase,
        passes: Passes,
        check: Verify,
    ) -> Result<ByMode<Streamed>, Error> {
        match check {
            Verify::Full => {
                case.validate(passes)?;
                Ok(ByMode::Full(Streamed))
            }
            Verify::Fast => fast_expected(case, passes).map(ByMode::Fast),
        }
    }

    /// Every element, in either mode (the reference as an implementation is what runs, not
    /// what checks).
    fn reference_outputs(
        case: &GroupedGemmCase,
        passes: Passes,
        _: ByMode<Streamed>,
    ) -> GemmOutputs {
        reference_written(case, passes)
    }

    fn compare(
        case: &GroupedGemmCase,
        passes: Passes,
        precision: &Precision,
        expected: &ByMode<Streamed>,
        got: &GemmOutputs,
    ) -> Result<CaseReport, Error> {
        Ok(match expected {
            ByMode::Full(Streamed) => compare_streamed(case, passes, precision, got),
            ByMode::Fast(fast) => fast_compare(case, passes, precision, fast, got),
        })
    }
}

/// What a grouped GEMM's check compares with, by mode: the full reference `F` of the
/// operation, or the fast one ([`FastExpected`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ByMode<F> {
    Full(F),
    Fast(FastExpected),
}

impl<F> ByMode<F> {
    /// The mode it was computed for.
    pub fn mode(&self) -> Verify {
        match self {
            ByMode::Full(_) => Verify::Full,
            ByMode::Fast(_) => Verify::Fast,
        }
    }

    /// A reference of mode `check` that holds nothing: `full` for the full mode, the fast
    /// reference of no pass for the fast one.
    pub fn unheld(check: Verify, full: F) -> ByMode<F> {
        match check {
            Verify::Full => ByMode::Full(full),
            Verify::Fast => ByMode::Fast(FastExpected { passes: Vec::new() }),
        }
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
