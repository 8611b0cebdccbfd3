//! The FP8 implementation trait of before the vocabulary ([`super::Fp8Gemm`] is the FP8
//! operation now), kept only until the properties and the CLI crate speak `Fp8Gemm`.

use super::case::Fp8GemmCase;
use super::compare::{compare_fp8, Fp8Expected, Fp8Report};
use super::gemm::{fp8_reference, Fp8Operands};
use super::op::fp8_precision;
use crate::gemm::{GemmOutputs, Passes};
use crate::op::RunError;
use crate::Error;

/// An FP8 grouped-GEMM implementation under test: it reads float32 inputs and the recipe, and
/// quantises them itself.
pub trait Fp8GroupedGemm {
    /// A short name for reports.
    fn name(&self) -> String;
    /// Whether this is a CPU model rather than the real thing (never a GPU result).
    fn is_model(&self) -> bool;
    /// Runs the asked passes. `case` has been validated. Outputs are widened to f64.
    fn run(&self, case: &Fp8GemmCase, passes: Passes) -> Result<GemmOutputs, RunError>;
    /// The quantised operands the implementation used, when it can expose them (the CPU
    /// model can; an external program does not have to). Used by the quantisation and
    /// copy-agreement properties.
    fn operands(&self, _case: &Fp8GemmCase, _passes: Passes) -> Option<Fp8Operands> {
        None
    }
}

/// What came of running an FP8 implementation.
#[derive(Debug, Clone, PartialEq)]
pub enum Fp8Verdict {
    Compared(Box<Fp8Report>),
    RunFailed(RunError),
}

impl Fp8Verdict {
    pub fn passed(&self) -> bool {
        matches!(self, Fp8Verdict::Compared(r) if r.recipe_exact.passed())
    }
    pub fn failure(&self) -> Option<String> {
        match self {
            Fp8Verdict::Compared(r) => r.recipe_exact.first_failure(),
            Fp8Verdict::RunFailed(e) => Some(format!("run failed: {e}")),
        }
    }
}

/// Validates `case`, runs `imp`, and compares (both comparisons). An invalid case is an `Err`.
pub fn verify_fp8(
    imp: &dyn Fp8GroupedGemm,
    case: &Fp8GemmCase,
    passes: Passes,
) -> Result<Fp8Verdict, Error> {
    case.validate(passes)?;
    Ok(match imp.run(case, passes) {
        Ok(got) => {
            let expected = Fp8Expected::of(case, passes)?;
            let report = compare_fp8(case, passes, &fp8_precision(case), &expected, &got);
            Fp8Verdict::Compared(Box::new(report))
        }
        Err(e) => Fp8Verdict::RunFailed(e),
    })
}

/// The recipe itself as an implementation: the f64 GEMM of the recipe's dequantised operands
/// (a self-check; passes any accumulation model).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fp8Reference;

impl Fp8GroupedGemm for Fp8Reference {
    fn name(&self) -> String {
        "reference".into()
    }
    fn is_model(&self) -> bool {
        false
    }
    fn run(&self, case: &Fp8GemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        fp8_reference(case, passes)
            .map(|r| r.value)
            .map_err(|e| RunError(e.to_string()))
    }
    fn operands(&self, case: &Fp8GemmCase, passes: Passes) -> Option<Fp8Operands> {
        Some(super::gemm::quantize_operands(case, passes))
    }
}
