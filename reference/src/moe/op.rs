//! The MoE layer as an [`Op`]: its case ([`MoeCase`]), the compute and output formats an
//! external implementation declares, the reference (the forward state and every gradient,
//! computed once), the comparison within the layer bound for the declared precision, and the
//! permute round trip an implementation may expose. Also the tie guard every generator of
//! layer cases applies ([`tie_guard`]).

use ndarray::{Array2, Array3};

use super::backward::backward;
use super::bound::{layer_bound, LayerPrecision};
use super::compare::{compare_layer, LayerReport};
use super::fd::near_tie;
use super::layer::{forward, Forward, MoeCase, MoeOutputs};
use crate::format::Format;
use crate::op::{Comparison, Op};
use crate::routing::{route, Ties};
use crate::Error;

/// The whole MoE layer, forward and backward (see the [module docs](super)).
#[derive(Debug, Clone, Copy, Default)]
pub struct MoeLayer;

/// What an external layer implementation declares: the format of every intermediate
/// operation (GEMM accumulation included), the router's where it differs (`None`: the same),
/// and the format of its outputs (`f32`, the same, `f32` unless declared otherwise). Inputs
/// are read in the case's `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerFormats {
    pub compute: Format,
    pub router: Option<Format>,
    pub output: Format,
}

impl Default for LayerFormats {
    fn default() -> Self {
        LayerFormats {
            compute: Format::F32,
            router: None,
            output: Format::F32,
        }
    }
}

/// The reference of one case: the forward state (routing, permutation, intermediates; the
/// bound is derived from it) and the output with every gradient.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerExpected {
    pub forward: Forward,
    pub grads: MoeOutputs,
}

/// The permute round trip of a case: the implementation's own unpermute of its own permute
/// of `case.x`, `(T, k, H)`, which must equal `x[t]` on every slot `(t, s)`, dropped slots
/// included.
pub type RoundTrip = Array3<f64>;

impl Op for MoeLayer {
    const NAME: &'static str = "moe";
    type Case = MoeCase;
    type Ask = ();
    type Declaration = LayerFormats;
    type Precision = LayerPrecision;
    type Outputs = MoeOutputs;
    /// Checked one way.
    type Check = ();
    type Expected = LayerExpected;
    type Report = LayerReport;
    type Internals = RoundTrip;

    /// Also refuses `ties = any` on a case with an exact tie at a selection boundary
    /// ([`exact_tie`]).
    fn validate(case: &MoeCase, _: ()) -> Result<(), Error> {
        case.validate()?;
        if case.routing.ties == Ties::Any {
            if let Some(why) = exact_tie(case)? {
                return Err(Error::InvalidRouting {
                    what: "ties",
                    reason: format!(
                        "any, and the case has an exact tie ({why}): the layer's outputs do not \
                         show which choice the implementation made, so it cannot be followed \
                         (use a case without exact ties, or declare --ties lower-index)"
                    ),
                });
            }
        }
        Ok(())
    }

    fn declared_precision(case: &MoeCase, declared: &LayerFormats) -> LayerPrecision {
        LayerPrecision {
            input: case.dtype,
            compute: declared.compute,
            router: declared.router.filter(|r| *r != declared.compute),
            output: declared.output,
        }
    }

    /// f64 throughout.
    fn reference_precision(case: &MoeCase) -> LayerPrecision {
        LayerPrecision {
            input: case.dtype,
            compute: Format::F64,
            router: None,
            output: Format::F64,
        }
    }

    fn expected(case: &MoeCase, _: (), _: ()) -> Result<LayerExpected, Error> {
        let forward = forward(case)?;
        let grads = backward(case, &forward).grads;
        Ok(LayerExpected { forward, grads })
    }

    fn reference_outputs(_: &MoeCase, _: (), expected: LayerExpected) -> MoeOutputs {
        expected.grads
    }

    /// Derives the layer bound for `precision` from the forward state, then compares every
    /// tensor within it. A case with an activation input within its error of a clamp (a read
    /// case: generated ones are redrawn) cannot be judged, since a correct implementation may
    /// take either one-sided derivative there (torch's clamp passes the gradient at the limit,
    /// `jnp.minimum` half of it): it is refused with the reason, never failed.
    fn compare(
        case: &MoeCase,
        _: (),
        precision: &LayerPrecision,
        expected: &LayerExpected,
        got: &MoeOutputs,
    ) -> Result<LayerReport, Error> {
        let bound = layer_bound(case, &expected.forward, precision);
        if let Some(why) = bound.kink {
            return Err(Error::InvalidMoe {
                what: "case",
                reason: format!(
                    "{why}: either one-sided derivative is correct there, so the case cannot be judged at the declared precision"
                ),
            });
        }
        Ok(compare_layer(case, precision, &expected.grads, &bound, got))
    }

    /// The reference's permutation applied to `x` and undone.
    fn reference_internals(case: &MoeCase, _: ()) -> Option<RoundTrip> {
        let perm = forward(case).ok()?.perm;
        Some(perm.unpermute(perm.permute(case.x.view()).view()))
    }
}

impl Comparison for LayerReport {
    fn passed(&self) -> bool {
        LayerReport::passed(self)
    }
    fn first_failure(&self) -> Option<String> {
        LayerReport::first_failure(self)
    }
}

/// An exact tie of `case`'s routing at a top-k, group or `probs` capacity boundary: where
/// the routing convention allows any choice among equal values ([`Ties::Any`]), the layer's
/// outputs alone cannot show which one was made. (Generated cases never have one: the near-tie
/// guard [`tie_guard`] resamples them.)
pub fn exact_tie(case: &MoeCase) -> Result<Option<String>, Error> {
    case.validate()?;
    let routing = route(&case.routing_case(case.logits()))?;
    let (t, e) = routing.selection_scores.dim();
    let k = routing.indices.ncols();
    Ok(near_tie(
        &routing,
        &Array2::zeros((t, e)),
        &Array2::zeros((t, k)),
    ))
}

/// Why `case` cannot be checked at `precision`: it is within the selection-score error of a
/// top-k, group or capacity tie ([`near_tie`]), so a correct implementation may legitimately
/// route differently, or an input of a clamped activation is within its error of the clamp
/// (a correct implementation may then take the other one-sided derivative). Generators resample such cases. Validates `case`.
pub fn tie_guard(case: &MoeCase, precision: &LayerPrecision) -> Result<Option<String>, Error> {
    let f = forward(case)?;
    let b = layer_bound(case, &f, precision);
    Ok(near_tie(&f.routing, &b.selection_err, &b.weight_err).or(b.kink))
}
