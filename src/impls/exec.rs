//! `exec:CMD`: any external program, through the case-directory protocol.
//!
//! moecheck writes the case into a fresh directory `D`, runs `sh -c 'CMD "$1"' sh D` (so `CMD`
//! may carry its own arguments and `D` comes last), waits at most `timeout`, and reads the
//! outputs back. A non-zero exit, a timeout, or a missing, ill-shaped or wrongly typed output
//! file is a failed case with a one-line reason (the last line the program wrote to stderr is
//! included), never a panic.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

use moecheck_reference::op::{Implementation, Op, RunError};
use moecheck_reference::protocol::Protocol;

use crate::protocol;

/// An external program, run by `sh -c` with the case directory appended, within a timeout.
#[derive(Debug, Clone)]
pub struct Program {
    /// The command (it may carry its own arguments).
    pub command: String,
    pub timeout: Duration,
}

/// An external implementation of `O`, declaring its precision with `declaration`.
#[derive(Debug, Clone)]
pub struct Exec<O: Op> {
    pub program: Program,
    /// What the program declares (its accumulator, its compute format).
    pub declaration: O::Declaration,
}

impl<O: Protocol> Implementation<O> for Exec<O> {
    fn name(&self) -> String {
        format!("exec:{}", self.program.command)
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, case: &O::Case) -> O::Precision {
        O::declared_precision(case, &self.declaration)
    }
    fn run(&self, case: &O::Case, ask: O::Ask) -> Result<O::Outputs, RunError> {
        let tmp = tempfile::Builder::new()
            .prefix("moecheck-case-")
            .tempdir()
            .map_err(|e| RunError(format!("cannot create a case directory: {e}")))?;
        let dir = tmp.path();
        protocol::write_case::<O>(dir, case, ask).map_err(|e| RunError(e.to_string()))?;
        self.program.run_in(dir)?;
        protocol::read_outputs::<O>(dir, case, ask).map_err(|e| {
            RunError(format!(
                "{e} (a temporary case directory, deleted now; --dump DIR writes the case to rerun the program on)"
            ))
        })
    }
}

impl Program {
    /// Runs the command on the case directory `dir` (any op): `sh -c 'CMD "$1"' sh DIR`, with
    /// the timeout; a non-zero exit or a timeout is a [`RunError`] with the last stderr line.
    pub fn run_in(&self, dir: &Path) -> Result<(), RunError> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("{} \"$1\"", self.command))
            .arg("sh")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| RunError(format!("cannot start sh for '{}': {e}", self.command)))?;
        // Drain stderr on a thread so a chatty program cannot block on a full pipe.
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let reader = std::thread::spawn(move || {
            let mut buf = String::new();
            let _ = stderr.read_to_string(&mut buf);
            buf
        });
        let status = match child.wait_timeout(self.timeout) {
            Ok(Some(s)) => s,
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError(format!(
                    "'{}' timed out after {:.1} s",
                    self.command,
                    self.timeout.as_secs_f64()
                )));
            }
            Err(e) => return Err(RunError(format!("waiting for '{}': {e}", self.command))),
        };
        let err_text = reader.join().unwrap_or_default();
        let last = err_text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        if !status.success() {
            let code = status
                .code()
                .map_or("a signal".to_string(), |c| format!("status {c}"));
            let tail = if last.is_empty() {
                String::new()
            } else {
                format!(": {last}")
            };
            return Err(RunError(format!(
                "'{}' exited with {code}{tail}",
                self.command
            )));
        }
        Ok(())
    }
}
