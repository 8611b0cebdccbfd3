//! The grouped GEMM verified fast as an [`Op`]: the same case, passes, declaration,
//! precision, outputs and case directory as [`Gemm`], with [`super::fast_expected`] for the
//! reference and [`super::fast_compare`] for the comparison.

use super::check::{fast_compare, FastReport};
use super::expected::{fast_expected, FastExpected};
use super::mode::Verification;
use crate::gemm::bound::Precision;
use crate::gemm::case::{GemmOutputs, GroupedGemmCase, Passes};
use crate::gemm::files::GemmJson;
use crate::gemm::op::{Gemm, GemmDeclaration};
use crate::gemm::report::GemmDocument;
use crate::op::{Comparison, Op};
use crate::protocol::{FileError, Files, Protocol, Stored};
use crate::report::{Reported, RunInfo};
use crate::Error;

/// The grouped GEMM, verified fast (`--verify fast`; see the [module docs](super)).
#[derive(Debug, Clone, Copy, Default)]
pub struct GemmFast;

impl Op for GemmFast {
    const NAME: &'static str = "gemm";
    type Case = GroupedGemmCase;
    type Ask = Passes;
    type Declaration = GemmDeclaration;
    type Precision = Precision;
    type Outputs = GemmOutputs;
    type Expected = FastExpected;
    type Report = FastReport;
    type Internals = ();

    fn validate(case: &GroupedGemmCase, passes: Passes) -> Result<(), Error> {
        Gemm::validate(case, passes)
    }

    fn declared_precision(case: &GroupedGemmCase, declared: &GemmDeclaration) -> Precision {
        Gemm::declared_precision(case, declared)
    }

    fn reference_precision(case: &GroupedGemmCase) -> Precision {
        Gemm::reference_precision(case)
    }

    fn expected(case: &GroupedGemmCase, passes: Passes) -> Result<FastExpected, Error> {
        fast_expected(case, passes)
    }

    /// The reference as an implementation computes every element (it is what runs, not what
    /// checks); `expected` does not hold them.
    fn reference_outputs(case: &GroupedGemmCase, passes: Passes, _: FastExpected) -> GemmOutputs {
        crate::gemm::stream::reference_written(case, passes)
    }

    fn compare(
        case: &GroupedGemmCase,
        passes: Passes,
        precision: &Precision,
        expected: &FastExpected,
        got: &GemmOutputs,
    ) -> Result<FastReport, Error> {
        Ok(fast_compare(case, passes, precision, expected, got))
    }
}

impl Comparison for FastReport {
    fn passed(&self) -> bool {
        FastReport::passed(self)
    }
    fn first_failure(&self) -> Option<String> {
        FastReport::first_failure(self)
    }
    fn inconclusive(&self) -> Option<String> {
        self.sampled.inconclusive()
    }
}

/// The grouped GEMM's case directory, unchanged.
impl Protocol for GemmFast {
    const PROTOCOL_OP: &'static str = <Gemm as Protocol>::PROTOCOL_OP;
    type CaseJson = GemmJson;

    fn case_json(case: &GroupedGemmCase, passes: Passes) -> GemmJson {
        Gemm::case_json(case, passes)
    }
    fn input_files(case: &GroupedGemmCase, passes: Passes) -> Vec<(String, Stored)> {
        Gemm::input_files(case, passes)
    }
    fn read_case(
        json: GemmJson,
        files: &mut dyn Files,
    ) -> Result<(GroupedGemmCase, Passes), FileError> {
        Gemm::read_case(json, files)
    }
    fn output_files(outputs: &GemmOutputs) -> Vec<(String, Stored)> {
        Gemm::output_files(outputs)
    }
    fn read_outputs(
        case: &GroupedGemmCase,
        passes: Passes,
        files: &mut dyn Files,
    ) -> Result<GemmOutputs, FileError> {
        Gemm::read_outputs(case, passes, files)
    }
}

/// [`Gemm`]'s document and table, with the projections and the fast guarantee.
impl Reported for GemmFast {
    type Document = GemmDocument;

    fn document(run: &RunInfo<GemmFast>) -> GemmDocument {
        let report = run.report();
        GemmDocument::of(
            run,
            report.map_or_else(Vec::new, |r| r.sampled.passes.clone()),
            report.map_or_else(Vec::new, |r| r.fast.clone()),
            Verification::fast(),
        )
    }

    fn render(doc: &GemmDocument) -> String {
        Gemm::render(doc)
    }
}
