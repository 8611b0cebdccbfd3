//! Routing's implementations besides `reference` and `exec:`: its CPU model ([`emulate`])
//! and, with the `cuda` feature, the routing kernels ([`crate::cuda::route_impl`]).

pub mod emulate;

use moecheck_reference::format::Format;
use moecheck_reference::op::Implementation;
use moecheck_reference::routing::{ComputeFormat, Route, RoutePrecision, RoutingCase};

use crate::backends::{Backends, Declared};

impl Backends for Route {
    type Bug = emulate::RouteBug;
    const DECLARES: &'static str = "compute format";
    const DECLARATION_FLAGS: &'static [&'static str] = &["--compute"];
    const NOT_DECLARED_BY: &'static str =
        "routing declares its compute format (--compute); its weights' format is that of weights.npy";

    fn declaration(d: &Declared) -> Result<ComputeFormat, String> {
        Ok(ComputeFormat(d.compute.unwrap_or(Format::F32)))
    }

    /// `--compute` only: a declared routing's weights are f32 (`Route::declared_precision`).
    fn declared(_: &RoutingCase, p: &RoutePrecision) -> Declared {
        Declared {
            compute: Some(p.compute),
            ..Declared::default()
        }
    }

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
