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
