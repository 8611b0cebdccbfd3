//! The grouped GEMM's implementations besides `reference` and `exec:`: its CPU model
//! ([`emulate`]) and, with the `cuda` feature, our kernels and cuBLAS ([`crate::cuda`]).

pub mod emulate;

use moecheck_reference::gemm::Gemm;
use moecheck_reference::op::Implementation;

use crate::registry::Backends;

impl Backends for Gemm {
    type Bug = emulate::Bug;
    const DECLARES: &'static str = "accumulator";

    fn emulate(bug: Option<emulate::Bug>) -> Option<Box<dyn Implementation<Gemm>>> {
        Some(Box::new(emulate::Emulate::with_bug(bug)))
    }
    fn gpu_names() -> &'static [&'static str] {
        &crate::cuda::IMPL_NAMES
    }
    fn gpu(name: &str) -> Option<Box<dyn Implementation<Gemm>>> {
        crate::cuda::build(name)
    }
}
