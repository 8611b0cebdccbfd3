//! Routing: strategies ([`strategies`]) and properties ([`props`]) of implementations of
//! [`moecheck_reference::routing::Route`] (`impl PropertyOp for Route`).

pub mod props;
pub mod strategies;

pub use strategies::{route_args, LogitPattern, RouteArgs, RouteRequire};
