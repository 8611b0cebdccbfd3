//! The FP8 grouped GEMM's implementations besides `reference` and `exec:`: its CPU model
//! ([`emulate`], quantising with [`operand`], with the planted bugs of [`bug`]) and, with the
//! `cuda` feature, our FP8 kernels ([`crate::cuda::fp8_impl::CudaFp8`]).

pub mod bug;
pub mod emulate;
pub mod operand;

use moecheck_reference::fp8::{Fp8Gemm, Fp8GemmCase, Fp8GemmFast, Fp8Operands};
use moecheck_reference::gemm::{GemmOutputs, Passes, Precision};
use moecheck_reference::op::{Implementation, RunError};

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

/// An [`Fp8Gemm`] implementation, checked fast ([`Fp8GemmFast`]: only the check differs).
pub struct Fp8Fast(pub Box<dyn Implementation<Fp8Gemm>>);

impl Implementation<Fp8GemmFast> for Fp8Fast {
    fn name(&self) -> String {
        self.0.name()
    }
    fn is_model(&self) -> bool {
        self.0.is_model()
    }
    fn precision(&self, case: &Fp8GemmCase) -> Precision {
        self.0.precision(case)
    }
    fn supports(&self, case: &Fp8GemmCase, passes: Passes) -> Result<(), String> {
        self.0.supports(case, passes)
    }
    fn broken(&self) -> Option<RunError> {
        self.0.broken()
    }
    fn shardable(&self) -> bool {
        self.0.shardable()
    }
    fn run(&self, case: &Fp8GemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        self.0.run(case, passes)
    }
    fn internals(&self, case: &Fp8GemmCase, passes: Passes) -> Option<Fp8Operands> {
        self.0.internals(case, passes)
    }
}

/// [`Fp8Gemm`]'s backends, unchanged.
impl Backends for Fp8GemmFast {
    type Bug = Fp8Bug;
    const DECLARES: &'static str = <Fp8Gemm as Backends>::DECLARES;
    const DECLARATION_FLAGS: &'static [&'static str] = <Fp8Gemm as Backends>::DECLARATION_FLAGS;
    const NOT_DECLARED_BY: &'static str = <Fp8Gemm as Backends>::NOT_DECLARED_BY;

    fn declaration(d: &Declared) -> Result<(), String> {
        <Fp8Gemm as Backends>::declaration(d)
    }
    fn emulate(bug: Option<Fp8Bug>) -> Option<Box<dyn Implementation<Fp8GemmFast>>> {
        <Fp8Gemm as Backends>::emulate(bug).map(|i| Box::new(Fp8Fast(i)) as _)
    }
    fn gpu_names() -> &'static [&'static str] {
        <Fp8Gemm as Backends>::gpu_names()
    }
    fn gpu(name: &str) -> Option<Box<dyn Implementation<Fp8GemmFast>>> {
        <Fp8Gemm as Backends>::gpu(name).map(|i| Box::new(Fp8Fast(i)) as _)
    }
}
