//! `exec:CMD` for op `moe_layer`: any program, through the case-directory protocol
//! (docs/protocol.md, "Op moe_layer"). The process handling (timeout, exit status, last
//! stderr line) is [`Exec`]'s.

use moecheck_reference::format::Format;
use moecheck_reference::moe::{LayerPrecision, MoeCase, MoeLayer, MoeOutputs};
use moecheck_reference::op::RunError;

use super::exec::Program;
use crate::protocol::moe::{read_moe_outputs, write_moe_case};

/// An external MoE-layer implementation.
#[derive(Debug, Clone)]
pub struct MoeExec {
    pub exec: Program,
    /// The format the program declares for every intermediate operation (`--compute`).
    pub compute: Format,
    /// The format of the outputs it writes (`--out-dtype`).
    pub output: Format,
}

impl MoeLayer for MoeExec {
    fn name(&self) -> String {
        format!("exec:{}", self.exec.command)
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, case: &MoeCase) -> LayerPrecision {
        LayerPrecision {
            input: case.dtype,
            compute: self.compute,
            output: self.output,
        }
    }
    fn run(&self, case: &MoeCase) -> Result<MoeOutputs, RunError> {
        let _tmp = tempfile::Builder::new()
            .prefix("moecheck-case-")
            .tempdir()
            .map_err(|e| RunError(format!("cannot create a case directory: {e}")))?;
        let dir = _tmp.path().to_path_buf();
        write_moe_case(&dir, case).map_err(|e| RunError(e.to_string()))?;
        self.exec.run_in(&dir)?;
        read_moe_outputs(&dir, case).map_err(|e| RunError(e.to_string()))
    }
}
