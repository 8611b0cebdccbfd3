//! `exec:CMD` for routing: any program, through the case-directory protocol, op `route`
//! (docs/protocol.md). The process handling (timeout, exit status, last stderr line) is
//! [`Exec`]'s.

use moecheck_reference::format::Format;
use moecheck_reference::op::RunError;
use moecheck_reference::routing::{RouteOutputs, RoutePrecision, Router, RoutingCase};

use super::exec::Program;
use crate::protocol::route::{read_route_outputs, write_route_case};

/// An external routing implementation.
#[derive(Debug, Clone)]
pub struct ExecRouter {
    pub exec: Program,
    /// The format the program declares it computes scores and weights in (`--compute`); the
    /// output format is the dtype of the `weights.npy` it writes.
    pub compute: Format,
}

impl Router for ExecRouter {
    fn name(&self) -> String {
        format!("exec:{}", self.exec.command)
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, _case: &RoutingCase) -> RoutePrecision {
        // The output format is refined from the file when the outputs are read; f32 is the
        // coarser of the two accepted dtypes.
        RoutePrecision {
            compute: self.compute,
            output: Format::F32,
        }
    }
    fn route(&self, case: &RoutingCase) -> Result<RouteOutputs, RunError> {
        let _tmp = tempfile::Builder::new()
            .prefix("moecheck-case-")
            .tempdir()
            .map_err(|e| RunError(format!("cannot create a case directory: {e}")))?;
        let dir = _tmp.path().to_path_buf();
        write_route_case(&dir, case).map_err(|e| RunError(e.to_string()))?;
        self.exec.run_in(&dir)?;
        read_route_outputs(&dir, case)
            .map(|(out, _)| out)
            .map_err(|e| RunError(e.to_string()))
    }
}
