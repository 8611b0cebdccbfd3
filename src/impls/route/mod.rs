//! Routing's implementations besides `reference` and `exec:`: its CPU model ([`emulate`])
//! and, with the `cuda` feature, the routing kernels ([`crate::cuda::route_impl`]).

pub mod emulate;

use moecheck_reference::op::Implementation;
use moecheck_reference::routing::Route;

use crate::registry::Backends;

impl Backends for Route {
    type Bug = emulate::RouteBug;
    const DECLARES: &'static str = "compute format";

    fn emulate(bug: Option<emulate::RouteBug>) -> Option<Box<dyn Implementation<Route>>> {
        Some(Box::new(emulate::RouteEmulate::with_bug(bug)))
    }
    fn gpu_names() -> &'static [&'static str] {
        &["cuda"]
    }
    #[cfg(feature = "cuda")]
    fn gpu(name: &str) -> Option<Box<dyn Implementation<Route>>> {
        (name == "cuda").then(|| {
            Box::new(crate::cuda::route_impl::CudaRouter) as Box<dyn Implementation<Route>>
        })
    }
}
