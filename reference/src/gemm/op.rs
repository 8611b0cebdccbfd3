//! The grouped GEMM as an [`Op`]: its case ([`GroupedGemmCase`]), the passes asked, the
//! accumulator an external implementation declares, and the comparison with the f64
//! reference ([`super::compare_outputs`]).

use super::bound::{Accumulator, Precision};
use super::case::{GemmOutputs, GroupedGemmCase, Passes};
use super::compare::{compare_outputs, CaseReport};
use super::grouped::{reference, ReferenceResult};
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
    /// The accumulator (`--acc`, `--acc-block`); inputs and outputs are the case's formats.
    type Declaration = Accumulator;
    type Precision = Precision;
    type Outputs = GemmOutputs;
    type Expected = ReferenceResult;
    type Report = CaseReport;
    type Internals = ();

    fn validate(case: &GroupedGemmCase, passes: Passes) -> Result<(), Error> {
        case.validate(passes)
    }

    fn declared_precision(case: &GroupedGemmCase, accumulator: &Accumulator) -> Precision {
        Precision {
            input: case.dtype,
            accumulator: *accumulator,
            output: case.out_dtype,
        }
    }

    /// f64 accumulation in any order, f64 output.
    fn reference_precision(case: &GroupedGemmCase) -> Precision {
        Precision {
            input: case.dtype,
            accumulator: Accumulator::any_order(Format::F64),
            output: Format::F64,
        }
    }

    fn expected(case: &GroupedGemmCase, passes: Passes) -> Result<ReferenceResult, Error> {
        reference(case, passes)
    }

    fn reference_outputs(_: &GroupedGemmCase, _: Passes, expected: ReferenceResult) -> GemmOutputs {
        expected.value
    }

    fn compare(
        case: &GroupedGemmCase,
        passes: Passes,
        precision: &Precision,
        expected: &ReferenceResult,
        got: &GemmOutputs,
    ) -> Result<CaseReport, Error> {
        Ok(compare_outputs(case, passes, precision, expected, got))
    }
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
