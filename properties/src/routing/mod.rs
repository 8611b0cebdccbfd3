//! Routing: strategies ([`strategies`]) and properties ([`props`]) of routing
//! implementations, generic over [`moecheck_reference::routing::Router`].

pub mod props;
pub mod strategies;

pub use props::{all_route, check_route, RouteProperty};
pub use strategies::{route_args, LogitPattern, RouteArgs, RouteRequire};
