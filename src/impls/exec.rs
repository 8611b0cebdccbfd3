//! `exec:CMD`: any external program, through the case-directory protocol.
//!
//! moecheck writes the case into a fresh directory `D`, runs `sh -c 'CMD "$1"' sh D` (so `CMD`
//! may carry its own arguments and `D` comes last) in its own process group, waits at most
//! `timeout`, ends the group, and reads the outputs back (src/impls/process.rs says how it
//! cannot hang). A non-zero exit, a timeout, or a missing, ill-shaped or wrongly typed output
//! file is a failed case whose first line is the reason (with the program's exception line)
//! and the last lines of its stderr follow, never a panic. When the program fails, its case
//! directory is kept with its whole stderr in `stderr.txt` (the first few failures of a run;
//! [`keep_failed_case`]). Exit status [`REFUSED_STATUS`] (77) refuses the case instead: not
//! applicable, the last line of stderr its reason; a timeout is a broken run, never shrunk.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use moecheck_reference::op::{Implementation, Op, RunError};
use moecheck_reference::protocol::Protocol;

use crate::impls::process::{failure, keep_failed_case, save_stderr, KeptCases, Running, GRACE};
use crate::impls::scratch::Scratch;
use crate::impls::{no_case_dir, unread, OnDisk};
use crate::protocol;

/// An external program, run by `sh -c` with the case directory appended, within a timeout.
#[derive(Debug, Clone)]
pub struct Program {
    /// The command (it may carry its own arguments).
    pub command: String,
    pub timeout: Duration,
    /// The failed case directories kept so far ([`keep_failed_case`]).
    pub kept: KeptCases,
    /// Compact inputs (`--inputs compact`; a worker may also ask in its greeting): bf16
    /// inputs as their bit patterns (docs/protocol.md).
    pub compact: bool,
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
        let tmp = Scratch::new("moecheck-case-").map_err(no_case_dir)?;
        protocol::write_case::<O>(tmp.path(), case, ask, None, self.program.compact)
            .map_err(|e| RunError::new(e.to_string()))?;
        let tmp = self.run_on(tmp)?;
        protocol::read_outputs::<O>(tmp.path(), case, ask).map_err(unread)
    }
}

impl<O: Protocol> OnDisk<O> for Exec<O> {
    fn compact(&self) -> Result<bool, RunError> {
        Ok(self.program.compact)
    }
    fn run_on(&self, tmp: Scratch) -> Result<Scratch, RunError> {
        match self.program.run_in(tmp.path()) {
            Ok(()) => Ok(tmp),
            Err(e) if e.is_refusal() => Err(e),
            Err(e) => Err(keep_failed_case(tmp, e, &self.program.kept)),
        }
    }
}

impl Program {
    /// Runs the command on the case directory `dir` (any op): `sh -c 'CMD "$1"' sh DIR` in its
    /// own process group, stdin closed, stdout discarded, within the timeout. When it exits
    /// (or times out) its whole group is ended, and its stderr is read until then (and a
    /// short grace after, never past the deadline). A non-zero exit or a timeout is a
    /// [`RunError`] with the program's exception line and the last lines of its stderr.
    pub fn run_in(&self, dir: &Path) -> Result<(), RunError> {
        let deadline = Instant::now() + self.timeout;
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("{} \"$1\"", self.command))
            .arg("sh")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let mut running = Running::start(command)
            .map_err(|e| RunError::new(format!("cannot start sh for '{}': {e}", self.command)))?;
        let status = running.wait_until(deadline);
        // Whatever the program left running in its group goes with it.
        running.end();
        running
            .stderr
            .wait_closed(deadline.min(Instant::now() + GRACE));
        let stderr = running.stderr.since(0);
        let reason = match status {
            Ok(Some(s)) if s.success() => return Ok(()),
            Ok(Some(s)) if s.code() == Some(REFUSED_STATUS) => {
                return Err(RunError::refused(refusal(&self.command, &stderr)));
            }
            Ok(Some(s)) => format!("'{}' exited with {}", self.command, describe(s)),
            Ok(None) => {
                let reason = format!(
                    "'{}' timed out after {:.1} s (its process group was ended)",
                    self.command,
                    self.timeout.as_secs_f64()
                );
                save_stderr(dir, &stderr);
                let e = failure(&reason, &stderr);
                return Err(RunError::broken(e.message));
            }
            Err(e) => format!("waiting for '{}': {e}", self.command),
        };
        save_stderr(dir, &stderr);
        Err(failure(&reason, &stderr))
    }
}

/// The exit status with which an `exec:` program refuses a case (a setting or shape it does
/// not implement): the case is not applicable, and the last non-empty line of its stderr is
/// the reason (docs/protocol.md). 77 is the "skipped" status of automake's test harness.
pub const REFUSED_STATUS: i32 = 77;

/// The reason `command` gave for refusing a case: the last non-empty line of its `stderr`.
fn refusal(command: &str, stderr: &str) -> String {
    match stderr.lines().rev().map(str::trim).find(|l| !l.is_empty()) {
        // The Python helper writes `NAME: unsupported: REASON`.
        Some(line) => {
            let reason = line.split_once("unsupported: ").map_or(line, |(_, r)| r);
            format!("'{command}' refused the case: {reason}")
        }
        None => {
            format!("'{command}' refused the case (exit {REFUSED_STATUS}, no reason on stderr)")
        }
    }
}

/// `status 3` or `signal 9`.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("status {c}"),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "an unknown status".into(),
    }
}
