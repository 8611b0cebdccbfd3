//! `exec:CMD`: any external program, through the case-directory protocol.
//!
//! moecheck writes the case into a fresh directory `D`, runs `sh -c 'CMD "$1"' sh D` (so `CMD`
//! may carry its own arguments and `D` comes last), waits at most `timeout`, and reads the
//! outputs back. A non-zero exit, a timeout, or a missing, ill-shaped or wrongly typed output
//! file is a failed case with a one-line reason (the last line the program wrote to stderr is
//! included), never a panic.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

use moecheck_reference::gemm::{Accumulator, GemmOutputs, GroupedGemmCase, Passes, Precision};
use moecheck_reference::implementation::{GroupedGemm, RunError};

use crate::protocol;

/// An external implementation.
#[derive(Debug, Clone)]
pub struct Exec {
    /// The command, run by `sh -c`, with the case directory appended.
    pub command: String,
    pub timeout: Duration,
    /// Use (and keep) this directory instead of a temporary one.
    pub keep_dir: Option<PathBuf>,
    /// The accumulator the program declares (the bound is derived from it).
    pub accumulator: Accumulator,
}

impl GroupedGemm for Exec {
    fn name(&self) -> String {
        format!("exec:{}", self.command)
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, case: &GroupedGemmCase) -> Precision {
        Precision {
            input: case.dtype,
            accumulator: self.accumulator,
            output: case.out_dtype,
        }
    }
    fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        let (_tmp, dir) = self.case_dir()?;
        protocol::write_case(&dir, case, passes).map_err(|e| RunError(e.to_string()))?;
        self.run_in(&dir)?;
        protocol::read_outputs(&dir, case, passes).map_err(|e| RunError(e.to_string()))
    }
}

impl Exec {
    /// The case directory: `keep_dir` (created if needed), or a fresh temporary directory that
    /// lives as long as the returned guard.
    pub fn case_dir(&self) -> Result<(Option<tempfile::TempDir>, PathBuf), RunError> {
        match &self.keep_dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .map_err(|e| RunError(format!("{}: {e}", d.display())))?;
                Ok((None, d.clone()))
            }
            None => {
                let tmp = tempfile::Builder::new()
                    .prefix("moecheck-case-")
                    .tempdir()
                    .map_err(|e| RunError(format!("cannot create a case directory: {e}")))?;
                let dir = tmp.path().to_path_buf();
                Ok((Some(tmp), dir))
            }
        }
    }

    /// Runs the command on the case directory `dir` (any op): `sh -c 'CMD "$1"' sh DIR`, with
    /// the timeout; a non-zero exit or a timeout is a [`RunError`] with the last stderr line.
    pub fn run_in(&self, dir: &std::path::Path) -> Result<(), RunError> {
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
