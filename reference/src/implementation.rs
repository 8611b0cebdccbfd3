//! The one trait behind which every implementation under test sits.

use crate::format::Format;
use crate::gemm::{
    compare_outputs, reference, Accumulator, CaseReport, GemmOutputs, GroupedGemmCase, Passes,
    Precision,
};
use crate::Error;

/// Why an implementation produced no usable result (a crash, a timeout, a missing file): one
/// line, naming what went wrong. It is a failed case, not an input error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RunError(pub String);

/// A grouped-GEMM implementation under test.
pub trait GroupedGemm {
    /// A short name for reports (`reference`, `emulate`, `emulate[inject=…]`, `exec:CMD`).
    fn name(&self) -> String;

    /// Whether this is a CPU model of a kernel rather than the real thing. Reports say so, and
    /// a model's result is never presented as a GPU result.
    fn is_model(&self) -> bool;

    /// The precision this implementation declares for `case`; the error bound is derived
    /// from it.
    fn precision(&self, case: &GroupedGemmCase) -> Precision;

    /// Runs the asked passes. `case` has been validated. Outputs are widened to f64.
    fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError>;
}

impl<T: GroupedGemm + ?Sized> GroupedGemm for &T {
    fn name(&self) -> String {
        (**self).name()
    }
    fn is_model(&self) -> bool {
        (**self).is_model()
    }
    fn precision(&self, case: &GroupedGemmCase) -> Precision {
        (**self).precision(case)
    }
    fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        (**self).run(case, passes)
    }
}

/// The reference itself as an implementation (a self-check): f64 accumulation, f64 output.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reference;

impl GroupedGemm for Reference {
    fn name(&self) -> String {
        "reference".into()
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, case: &GroupedGemmCase) -> Precision {
        Precision {
            input: case.dtype,
            accumulator: Accumulator::any_order(Format::F64),
            output: Format::F64,
        }
    }
    fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        reference(case, passes)
            .map(|r| r.value)
            .map_err(|e| RunError(e.to_string()))
    }
}

/// The outcome of running one implementation on one case.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The implementation ran; the report says whether every element is inside its bound.
    Compared(CaseReport),
    /// The implementation produced no result.
    RunFailed(RunError),
}

impl Verdict {
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Compared(r) if r.passed())
    }
    /// One line on why it failed, `None` if it passed.
    pub fn failure(&self) -> Option<String> {
        match self {
            Verdict::Compared(r) => r.first_failure(),
            Verdict::RunFailed(e) => Some(format!("run failed: {e}")),
        }
    }
}

/// Validates `case`, computes the reference, runs `imp` and compares.
///
/// An invalid case is an `Err` (the caller's input error), distinct from a failing
/// implementation ([`Verdict`]).
pub fn verify(
    imp: &dyn GroupedGemm,
    case: &GroupedGemmCase,
    passes: Passes,
) -> Result<Verdict, Error> {
    let want = reference(case, passes)?;
    Ok(match imp.run(case, passes) {
        Ok(got) => Verdict::Compared(compare_outputs(
            case,
            passes,
            &imp.precision(case),
            &want,
            &got,
        )),
        Err(e) => Verdict::RunFailed(e),
    })
}
