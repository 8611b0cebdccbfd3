//! The MoE-layer implementation trait, the reference as one, and `verify`.

use ndarray::{Array2, Array3};

use super::backward::backward;
use super::bound::{layer_bound, LayerPrecision};
use super::compare::{compare_layer, LayerReport};
use super::fd::near_tie;
use super::layer::{forward, MoeCase, MoeOutputs};
use super::permute::Permutation;
use crate::format::Format;
use crate::op::RunError;
use crate::Error;

/// An MoE-layer implementation under test (op `moe_layer`).
pub trait MoeLayer {
    /// A short name for reports.
    fn name(&self) -> String;
    /// Whether this is a CPU model of a kernel (never reported as a GPU result).
    fn is_model(&self) -> bool;
    /// The precision it declares for `case` (the bound is derived from it).
    fn precision(&self, case: &MoeCase) -> LayerPrecision;
    /// The layer output and every gradient for `case` (validated), widened to f64.
    fn run(&self, case: &MoeCase) -> Result<MoeOutputs, RunError>;
    /// The implementation's own unpermute applied to its own permute of `x (T, H)` under
    /// `perm`: `(T, k, H)`, which must equal `x` on every slot. `None` when the
    /// implementation does not expose its permutation (an external program).
    fn permute_round_trip(&self, perm: &Permutation, x: &Array2<f64>) -> Option<Array3<f64>> {
        let _ = (perm, x);
        None
    }
}

impl<T: MoeLayer + ?Sized> MoeLayer for &T {
    fn name(&self) -> String {
        (**self).name()
    }
    fn is_model(&self) -> bool {
        (**self).is_model()
    }
    fn precision(&self, case: &MoeCase) -> LayerPrecision {
        (**self).precision(case)
    }
    fn run(&self, case: &MoeCase) -> Result<MoeOutputs, RunError> {
        (**self).run(case)
    }
    fn permute_round_trip(&self, perm: &Permutation, x: &Array2<f64>) -> Option<Array3<f64>> {
        (**self).permute_round_trip(perm, x)
    }
}

/// The f64 reference as an implementation (a self-check).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceLayer;

impl MoeLayer for ReferenceLayer {
    fn name(&self) -> String {
        "reference".into()
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, case: &MoeCase) -> LayerPrecision {
        LayerPrecision {
            input: case.dtype,
            compute: Format::F64,
            output: Format::F64,
        }
    }
    fn run(&self, case: &MoeCase) -> Result<MoeOutputs, RunError> {
        let f = forward(case).map_err(|e| RunError(e.to_string()))?;
        Ok(backward(case, &f).grads)
    }
    fn permute_round_trip(&self, perm: &Permutation, x: &Array2<f64>) -> Option<Array3<f64>> {
        Some(perm.unpermute(perm.permute(x.view()).view()))
    }
}

/// The outcome of one implementation on one case.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerVerdict {
    Compared(LayerReport),
    RunFailed(RunError),
}

impl LayerVerdict {
    pub fn passed(&self) -> bool {
        matches!(self, LayerVerdict::Compared(r) if r.passed())
    }
    pub fn failure(&self) -> Option<String> {
        match self {
            LayerVerdict::Compared(r) => r.first_failure(),
            LayerVerdict::RunFailed(e) => Some(format!("run failed: {e}")),
        }
    }
}

/// Why `case` cannot be checked at `precision`: it is within the selection-score error of a
/// top-k, group or capacity tie ([`near_tie`]), so a correct implementation may legitimately
/// route differently. Generators resample such cases. Validates `case`.
pub fn tie_guard(case: &MoeCase, precision: &LayerPrecision) -> Result<Option<String>, Error> {
    let f = forward(case)?;
    let b = layer_bound(case, &f, precision);
    Ok(near_tie(&f.routing, &b.selection_err, &b.weight_err))
}

/// Computes the reference and the bound, runs `imp`, compares. An invalid case is `Err`.
pub fn verify_layer(imp: &dyn MoeLayer, case: &MoeCase) -> Result<LayerVerdict, Error> {
    let f = forward(case)?;
    let want = backward(case, &f).grads;
    let precision = imp.precision(case);
    let bound = layer_bound(case, &f, &precision);
    Ok(match imp.run(case) {
        Ok(got) => LayerVerdict::Compared(compare_layer(case, &precision, &want, &bound, &got)),
        Err(e) => LayerVerdict::RunFailed(e),
    })
}
