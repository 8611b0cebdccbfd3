//! `exec:CMD` for FP8 cases: the FP8 case directory (docs/protocol.md, "FP8 cases") is
//! written, the command run as for [`Exec`], and the outputs read back.

use moecheck_reference::fp8::{Fp8GemmCase, Fp8GroupedGemm};
use moecheck_reference::gemm::{GemmOutputs, Passes};
use moecheck_reference::op::RunError;

use super::exec::Program;
use crate::protocol;

/// An external FP8 implementation (`exec:CMD`).
#[derive(Debug, Clone)]
pub struct ExecFp8(pub Program);

impl Fp8GroupedGemm for ExecFp8 {
    fn name(&self) -> String {
        format!("exec:{}", self.0.command)
    }
    fn is_model(&self) -> bool {
        false
    }
    fn run(&self, case: &Fp8GemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        let _tmp = tempfile::Builder::new()
            .prefix("moecheck-case-")
            .tempdir()
            .map_err(|e| RunError(format!("cannot create a case directory: {e}")))?;
        let dir = _tmp.path().to_path_buf();
        protocol::fp8::write_fp8_case(&dir, case, passes).map_err(|e| RunError(e.to_string()))?;
        self.0.run_in(&dir)?;
        protocol::legacy::read_outputs(&dir, &case.gemm, passes)
            .map_err(|e| RunError(e.to_string()))
    }
}
