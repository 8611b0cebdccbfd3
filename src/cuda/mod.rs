//! The CUDA backend: moecheck's own kernels (kernels/*.cu) and NVIDIA's cuBLAS as
//! implementations under test, behind the `cuda` cargo feature (on by default).
//!
//! Everything is loaded at run time (cudarc with `dynamic-loading`): the crate builds and
//! its tests pass on a machine with no CUDA at all. [`libs`] finds the libraries (and keeps
//! cudarc from panicking when they are missing), [`kernels`] embeds the kernel sources,
//! [`plan`] is the host-side launch planning (pure Rust, tested without a GPU).
//!
//! * `cuda`: our kernels ([`gemm::CudaGemm`]).
//! * `cublas`: one `cublasGemmEx` per expert ([`cublas::Cublas`]).
//! * `cublas-grouped`: one `cublasGemmGroupedBatchedEx` ([`cublas::CublasGrouped`]).

pub mod kernels;
pub mod libs;
pub mod plan;

#[cfg(feature = "cuda")]
pub mod cublas;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod fp8;
pub mod fp8_host;
#[cfg(feature = "cuda")]
pub mod fp8_impl;
#[cfg(feature = "cuda")]
pub mod gemm;
#[cfg(feature = "cuda")]
pub mod route_impl;
#[cfg(feature = "cuda")]
pub mod routing;

/// The implementations this backend adds to `--impl`, when compiled with the `cuda` feature.
pub const IMPL_NAMES: [&str; 4] = ["cuda", "cuda-tiled", "cublas", "cublas-grouped"];

/// The implementation called `name`, if it is one of [`IMPL_NAMES`]. Building one never
/// touches CUDA; running it without a device is a failed case saying "no CUDA device".
#[cfg(feature = "cuda")]
pub fn build(
    name: &str,
) -> Option<Box<dyn moecheck_reference::op::Implementation<moecheck_reference::gemm::Gemm>>> {
    use gemm::{CudaGemm, Variant};
    Some(match name {
        "cuda" => Box::new(CudaGemm {
            variant: Variant::Auto,
        }),
        "cuda-tiled" => Box::new(CudaGemm {
            variant: Variant::Tiled,
        }),
        "cublas" => Box::new(cublas::Cublas {
            grouped: false,
            ptr_arrays: cublas::PtrArrays::Device,
        }),
        "cublas-grouped" => Box::new(cublas::Cublas {
            grouped: true,
            ptr_arrays: cublas::PtrArrays::from_env(),
        }),
        _ => return None,
    })
}

/// Without the `cuda` feature every CUDA implementation is refused with this reason.
#[cfg(not(feature = "cuda"))]
pub fn build(
    name: &str,
) -> Option<Box<dyn moecheck_reference::op::Implementation<moecheck_reference::gemm::Gemm>>> {
    let _ = name;
    None
}

/// One line on whether a CUDA device is usable, or why not (`None` when usable).
#[cfg(feature = "cuda")]
pub fn unavailable_reason() -> Option<String> {
    let r = device::probe();
    if r.available {
        None
    } else {
        Some(r.reason.unwrap_or_else(|| "unknown".into()))
    }
}

/// One line on whether a CUDA device is usable, or why not (`None` when usable).
#[cfg(not(feature = "cuda"))]
pub fn unavailable_reason() -> Option<String> {
    Some("moecheck was built without the `cuda` feature".into())
}
