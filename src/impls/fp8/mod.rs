//! The FP8 grouped GEMM's implementations besides `reference` and `exec:`: its CPU model
//! ([`emulate`], quantising with [`operand`], with the planted bugs of [`bug`]) and, with the
//! `cuda` feature, our FP8 kernels ([`crate::cuda::fp8_impl::CudaFp8`]).

pub mod block_emulate;
pub mod bug;
pub mod emulate;
pub mod operand;

use moecheck_reference::fp8::Fp8Gemm;
use moecheck_reference::gemm::Verify;
use moecheck_reference::op::Implementation;

use crate::backends::{Backends, Declared};

pub use bug::Fp8Bug;
pub use emulate::EmulateFp8;

impl Backends for Fp8Gemm {
    type Bug = Fp8Bug;
    const DECLARES: &'static str = "accumulation model";
    const DECLARATION_FLAGS: &'static [&'static str] = &[];
    const NOT_DECLARED_BY: &'static str =
        "the FP8 recipe declares its accumulation (--accum exact|fast|fast-promote; fp8.accumulation in case.json)";

    fn declaration(_: &Declared) -> Result<(), String> {
        Ok(())
    }

    /// Full (the default) or fast verification.
    fn check_mode(verify: Option<Verify>) -> Result<Verify, String> {
        Ok(verify.unwrap_or_default())
    }

    fn emulate(bug: Option<Fp8Bug>) -> Option<Box<dyn Implementation<Fp8Gemm>>> {
        Some(Box::new(EmulateFp8::with_bug(bug)))
    }
    fn gpu_names() -> &'static [&'static str] {
        &["cuda"]
    }
    #[cfg(feature = "cuda")]
    fn gpu(name: &str) -> Option<Box<dyn Implementation<Fp8Gemm>>> {
        match name {
            "cuda" => Some(Box::new(crate::cuda::fp8_impl::CudaFp8)),
            _ => None,
        }
    }
}
