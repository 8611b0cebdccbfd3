//! Routing as an [`Op`]: its case ([`RoutingCase`]), the compute format an external
//! implementation declares, and the comparison with the f64 reference routing
//! ([`compare_routing`]).

use super::bound::{RouteOutputs, RoutePrecision};
use super::compare::{compare_routing, RouteReport};
use super::route::{route, Routing, RoutingCase};
use crate::format::Format;
use crate::op::{Comparison, Op};
use crate::Error;

/// MoE routing (scores, group-limited top-k, weights, capacity; see the [module docs](super)).
#[derive(Debug, Clone, Copy, Default)]
pub struct Route;

/// What an external routing implementation declares: the format it computes scores and
/// weights in (`f32` unless declared otherwise). Its weights are bounded as written in f32,
/// the coarser of the two dtypes `weights.npy` may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeFormat(pub Format);

impl Default for ComputeFormat {
    fn default() -> Self {
        ComputeFormat(Format::F32)
    }
}

impl Op for Route {
    const NAME: &'static str = "route";
    type Case = RoutingCase;
    type Ask = ();
    type Declaration = ComputeFormat;
    type Precision = RoutePrecision;
    type Outputs = RouteOutputs;
    /// Checked one way.
    type Check = ();
    type Expected = Routing;
    type Report = RouteReport;
    type Internals = ();

    fn validate(case: &RoutingCase, _: ()) -> Result<(), Error> {
        case.validate()
    }

    fn declared_precision(_: &RoutingCase, declared: &ComputeFormat) -> RoutePrecision {
        RoutePrecision {
            compute: declared.0,
            output: Format::F32,
        }
    }

    /// f64 throughout.
    fn reference_precision(_: &RoutingCase) -> RoutePrecision {
        RoutePrecision {
            compute: Format::F64,
            output: Format::F64,
        }
    }

    fn expected(case: &RoutingCase, _: (), _: ()) -> Result<Routing, Error> {
        route(case)
    }

    fn reference_outputs(_: &RoutingCase, _: (), expected: Routing) -> RouteOutputs {
        RouteOutputs::from_routing(&expected)
    }

    fn compare(
        case: &RoutingCase,
        _: (),
        precision: &RoutePrecision,
        expected: &Routing,
        got: &RouteOutputs,
    ) -> Result<RouteReport, Error> {
        // Weights read from a file are checked at the precision of the file's dtype: float64
        // weights from an f64 computation must be f64-accurate, not f32-accurate.
        let precision = RoutePrecision {
            output: got.weights_format.unwrap_or(precision.output),
            ..*precision
        };
        Ok(compare_routing(case, expected, got, precision))
    }
}

impl Comparison for RouteReport {
    fn passed(&self) -> bool {
        RouteReport::passed(self)
    }
    fn first_failure(&self) -> Option<String> {
        RouteReport::first_failure(self)
    }
}
