//! The grouped GEMM verified fast ([`GemmFast`]) runs the same implementations as [`Gemm`]:
//! each one is [`Gemm`]'s, wrapped so that only the check differs.

use moecheck_reference::gemm::{Gemm, GemmDeclaration, GemmFast, GemmOutputs, GroupedGemmCase};
use moecheck_reference::gemm::{Passes, Precision};
use moecheck_reference::op::{Implementation, RunError};

use super::emulate;
use crate::backends::{Backends, Declared};

/// A [`Gemm`] implementation, checked fast.
pub struct Fast(pub Box<dyn Implementation<Gemm>>);

impl Implementation<GemmFast> for Fast {
    fn name(&self) -> String {
        self.0.name()
    }
    fn is_model(&self) -> bool {
        self.0.is_model()
    }
    fn precision(&self, case: &GroupedGemmCase) -> Precision {
        self.0.precision(case)
    }
    fn supports(&self, case: &GroupedGemmCase, passes: Passes) -> Result<(), String> {
        self.0.supports(case, passes)
    }
    fn broken(&self) -> Option<RunError> {
        self.0.broken()
    }
    fn shardable(&self) -> bool {
        self.0.shardable()
    }
    fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        self.0.run(case, passes)
    }
}

/// [`Gemm`]'s backends and declaration flags, unchanged.
impl Backends for GemmFast {
    type Bug = emulate::Bug;
    const DECLARES: &'static str = <Gemm as Backends>::DECLARES;
    const DECLARATION_FLAGS: &'static [&'static str] = <Gemm as Backends>::DECLARATION_FLAGS;
    const NOT_DECLARED_BY: &'static str = <Gemm as Backends>::NOT_DECLARED_BY;

    fn declaration(d: &Declared) -> Result<GemmDeclaration, String> {
        <Gemm as Backends>::declaration(d)
    }
    fn declared(case: &GroupedGemmCase, p: &Precision) -> Declared {
        <Gemm as Backends>::declared(case, p)
    }
    fn emulate(bug: Option<emulate::Bug>) -> Option<Box<dyn Implementation<GemmFast>>> {
        <Gemm as Backends>::emulate(bug).map(|i| Box::new(Fast(i)) as _)
    }
    fn gpu_names() -> &'static [&'static str] {
        <Gemm as Backends>::gpu_names()
    }
    fn gpu(name: &str) -> Option<Box<dyn Implementation<GemmFast>>> {
        <Gemm as Backends>::gpu(name).map(|i| Box::new(Fast(i)) as _)
    }
}
