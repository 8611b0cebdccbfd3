//! The routing implementation trait (the routing twin of
//! [`crate::implementation::GroupedGemm`]) and the reference as an implementation.

use ndarray::Array2;
use serde::{Deserialize, Serialize};

use super::compare::{compare_routing, RouteReport};
use super::route::{route, Routing, RoutingCase};
use crate::format::Format;
use crate::op::RunError;
use crate::Error;

/// What an implementation returns for a routing case.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteOutputs {
    /// `(T, K)` selected experts, in selection order (largest selection score first, ties
    /// toward the lower index). Every entry `< E`.
    pub indices: Array2<usize>,
    /// `(T, K)` combine weights after normalisation and scaling, exactly 0 where dropped,
    /// widened to f64.
    pub weights: Array2<f64>,
    /// `(T, K)` the assignment survived capacity dropping.
    pub kept: Array2<bool>,
    /// `(E,)` kept assignments per expert.
    pub group_sizes: Vec<usize>,
}

impl RouteOutputs {
    /// The outputs of a reference [`Routing`].
    pub fn from_routing(r: &Routing) -> RouteOutputs {
        RouteOutputs {
            indices: r.indices.clone(),
            weights: r.combine.clone(),
            kept: r.kept.clone(),
            group_sizes: r.group_sizes.clone(),
        }
    }
}

/// The precision an implementation declares: the weight bound is derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutePrecision {
    /// The format scores and weights are computed in.
    pub compute: Format,
    /// The format the weights are written in.
    pub output: Format,
}

/// A routing implementation under test.
pub trait Router {
    /// A short name for reports.
    fn name(&self) -> String;
    /// Whether this is a CPU model rather than the real thing (never a GPU result).
    fn is_model(&self) -> bool;
    /// The declared precision for `case`.
    fn precision(&self, case: &RoutingCase) -> RoutePrecision;
    /// Routes `case` (already validated).
    fn route(&self, case: &RoutingCase) -> Result<RouteOutputs, RunError>;
}

impl<T: Router + ?Sized> Router for &T {
    fn name(&self) -> String {
        (**self).name()
    }
    fn is_model(&self) -> bool {
        (**self).is_model()
    }
    fn precision(&self, case: &RoutingCase) -> RoutePrecision {
        (**self).precision(case)
    }
    fn route(&self, case: &RoutingCase) -> Result<RouteOutputs, RunError> {
        (**self).route(case)
    }
}

/// The reference routing as an implementation (a self-check): f64 throughout.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceRouter;

impl Router for ReferenceRouter {
    fn name(&self) -> String {
        "reference".into()
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, _case: &RoutingCase) -> RoutePrecision {
        RoutePrecision {
            compute: Format::F64,
            output: Format::F64,
        }
    }
    fn route(&self, case: &RoutingCase) -> Result<RouteOutputs, RunError> {
        route(case)
            .map(|r| RouteOutputs::from_routing(&r))
            .map_err(|e| RunError(e.to_string()))
    }
}

/// The outcome of running one routing implementation on one case.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteVerdict {
    Compared(RouteReport),
    RunFailed(RunError),
}

impl RouteVerdict {
    pub fn passed(&self) -> bool {
        matches!(self, RouteVerdict::Compared(r) if r.passed())
    }
    /// One line on why it failed, `None` if it passed.
    pub fn failure(&self) -> Option<String> {
        match self {
            RouteVerdict::Compared(r) => r.first_failure(),
            RouteVerdict::RunFailed(e) => Some(format!("run failed: {e}")),
        }
    }
}

/// Validates `case`, computes the reference routing, runs `imp` and compares.
/// An invalid case is an `Err` (the caller's input error).
pub fn verify_route(imp: &dyn Router, case: &RoutingCase) -> Result<RouteVerdict, Error> {
    let want = route(case)?;
    Ok(match imp.route(case) {
        Ok(got) => RouteVerdict::Compared(compare_routing(case, &want, &got, imp.precision(case))),
        Err(e) => RouteVerdict::RunFailed(e),
    })
}
