//! Routing: strategies ([`strategies`]) and properties ([`props`]) of implementations of
//! [`moecheck_reference::routing::Route`] (`impl PropertyOp for Route`).

mod capacity;
pub mod domain;
mod outputs;
pub mod props;
pub mod strategies;

pub use domain::RouteDomain;
pub use strategies::{route_args, LogitPattern, RouteArgs, RouteRequire};
