//! The programs `exec:` and `worker:` run, handled so that moecheck cannot hang on them.
//!
//! * Each program is the leader of **its own process group** (`setpgid(0, 0)` through
//!   [`CommandExt::process_group`]), so everything it starts — `sh -c`'s child, Python's
//!   subprocesses, a background `( sleep 300 ) &` — is in that group.
//! * The group is **ended as a whole** ([`Running::end`]): `SIGTERM` to every process in it,
//!   up to [`GRACE`] for them to go, then `SIGKILL`. moecheck does this on a timeout and also
//!   when the program has exited, so nothing it left behind (holding a GPU, holding a pipe)
//!   outlives its case.
//! * Ctrl-C still reaches it: while it runs, moecheck forwards `SIGINT`, `SIGTERM` and
//!   `SIGHUP` to its group as `SIGTERM` (src/impls/interrupt.rs).
//! * Its **stderr is drained by a thread** into a bounded [`Tail`], so a chatty program never
//!   blocks on a full pipe, and moecheck waits for the end of that pipe only until a deadline:
//!   a process that escaped the group (`setsid`) and keeps stderr open cannot hold it up.
//!
//! A failure keeps what the program said ([`failure`]): the reason, the program's exception
//! line (the last `SomethingError: ...` line, not the boilerplate some frameworks print after
//! it), and the last lines of stderr.

use std::collections::VecDeque;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustix::process::{kill_process_group, test_kill_process_group, Pid, Signal};

use moecheck_reference::op::RunError;

use crate::impls::interrupt::{prepare, track, Tracked};

/// How long a process group has between `SIGTERM` and `SIGKILL`, and how long moecheck reads
/// a program's stderr after it is gone.
pub const GRACE: Duration = Duration::from_millis(500);

/// How much of a program's stderr is kept (the last bytes).
const TAIL_BYTES: usize = 64 * 1024;

/// Lines of stderr a failure shows.
const SHOWN_LINES: usize = 20;

/// Characters of one stderr line a failure shows.
const SHOWN_LINE_CHARS: usize = 240;

/// How often an ending group is looked at.
const POLL: Duration = Duration::from_millis(10);

/// A program running as the leader of its own process group, its stderr drained into a
/// [`Tail`]. Dropping it ends the group.
#[derive(Debug)]
pub struct Running {
    child: Child,
    group: Pid,
    /// What the program wrote to stderr (the last [`TAIL_BYTES`]).
    pub stderr: Tail,
    status: Option<ExitStatus>,
    ended: bool,
    /// Its group gets moecheck's SIGINT, SIGTERM and SIGHUP until it is ended.
    tracked: Tracked,
}

impl Running {
    /// Starts `command` (whose stdin and stdout the caller has set) in a new process group
    /// with stderr captured.
    pub fn start(mut command: Command) -> std::io::Result<Running> {
        command.process_group(0).stderr(Stdio::piped());
        prepare();
        let mut child = command.spawn()?;
        let group = Pid::from_child(&child);
        let tracked = track(group.as_raw_nonzero().get());
        let stderr = Tail::drain(child.stderr.take().expect("stderr is piped"));
        Ok(Running {
            child,
            group,
            stderr,
            status: None,
            ended: false,
            tracked,
        })
    }

    /// The leader, for taking its stdin and stdout.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// The leader's exit status if it has exited by `deadline` (`None`: still running).
    pub fn wait_until(&mut self, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(Some(s));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            std::thread::sleep(POLL.min(deadline - now));
        }
    }

    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// Ends the whole process group: `SIGTERM` to every process in it, up to [`GRACE`] for them
    /// to exit, then `SIGKILL`; the leader is reaped. Safe to call more than once.
    pub fn end(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        // The leader is not reaped yet (or the group still has members), so the group id
        // cannot have been reused by another process.
        let _ = kill_process_group(self.group, Signal::TERM);
        let until = Instant::now() + GRACE;
        loop {
            // A zombie leader still counts as a member: reap it first.
            let _ = self.try_wait();
            if test_kill_process_group(self.group).is_err() {
                break;
            }
            if Instant::now() >= until {
                let _ = kill_process_group(self.group, Signal::KILL);
                break;
            }
            std::thread::sleep(POLL);
        }
        // After SIGKILL the leader goes at once (unless it is stuck in the kernel: then give
        // up on it rather than hang).
        let _ = self.wait_until(Instant::now() + GRACE);
        self.tracked.release();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.end();
    }
}

/// The last [`TAIL_BYTES`] a program wrote to one pipe, filled by a thread; shared with it.
#[derive(Debug, Clone)]
pub struct Tail(Arc<(Mutex<TailState>, Condvar)>);

#[derive(Debug, Default)]
struct TailState {
    bytes: VecDeque<u8>,
    /// Bytes read since the start (kept or not).
    total: u64,
    /// The pipe reached its end (every writer closed it) or failed.
    closed: bool,
}

impl Tail {
    /// Reads `pipe` to its end on a thread, keeping the last [`TAIL_BYTES`].
    pub fn drain(mut pipe: impl Read + Send + 'static) -> Tail {
        let tail = Tail(Arc::default());
        let shared = tail.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                let n = match pipe.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let mut s = shared.state();
                s.bytes.extend(&buf[..n]);
                let extra = s.bytes.len().saturating_sub(TAIL_BYTES);
                s.bytes.drain(..extra);
                s.total += n as u64;
            }
            shared.state().closed = true;
            shared.0 .1.notify_all();
        });
        tail
    }

    fn state(&self) -> MutexGuard<'_, TailState> {
        self.0 .0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes read so far: a mark for [`Tail::since`].
    pub fn mark(&self) -> u64 {
        self.state().total
    }

    /// What was written after `mark` (as far as it is still kept), as text.
    pub fn since(&self, mark: u64) -> String {
        let s = self.state();
        let kept_from = s.total - s.bytes.len() as u64;
        let skip = mark.saturating_sub(kept_from).min(s.bytes.len() as u64) as usize;
        let bytes: Vec<u8> = s.bytes.iter().skip(skip).copied().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Waits until nothing has come for `quiet` (or the pipe closed, or `deadline` passed):
    /// what a live program wrote just before an answer on another pipe is then here.
    pub fn settle(&self, quiet: Duration, deadline: Instant) {
        let mut seen = self.mark();
        loop {
            let now = Instant::now();
            if now >= deadline || self.wait_closed(deadline.min(now + quiet)) {
                return;
            }
            let total = self.mark();
            if total == seen {
                return;
            }
            seen = total;
        }
    }

    /// Waits until the pipe is closed or `deadline` passes; whether it closed.
    pub fn wait_closed(&self, deadline: Instant) -> bool {
        let mut s = self.state();
        while !s.closed {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = self
                .0
                 .1
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

/// The program's own account of its failure in `stderr`: the last line that looks like a
/// Python exception (`ValueError: ...`, `jax.errors.TracerArrayConversionError: ...`), so
/// that boilerplate printed after it (JAX's "For simplicity, JAX has removed its internal
/// frames ...") does not hide it; otherwise the last non-empty line.
pub fn exception_line(stderr: &str) -> Option<&str> {
    let lines = || stderr.lines().rev().filter(|l| !l.trim().is_empty());
    lines()
        .find(|l| is_exception(l))
        .or_else(|| lines().next())
        .map(str::trim)
}

/// `Name: message` or a bare `Name` at the start of a line, where `Name` is a dotted Python
/// identifier whose last part ends in `Error`, `Exception`, `Exit` or `Interrupt`.
fn is_exception(line: &str) -> bool {
    let name = line.split(':').next().unwrap_or("");
    let last = name.rsplit('.').next().unwrap_or("");
    let identifier = !name.is_empty()
        && name.split('.').all(|p| {
            p.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
        })
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.');
    identifier
        && ["Error", "Exception", "Exit", "Interrupt"]
            .iter()
            .any(|end| last.ends_with(end))
}

/// How many failed cases' directories one program keeps; later failures' are deleted (a
/// property campaign fails many cases while it shrinks).
const KEPT_CASES: usize = 3;

/// How many failed case directories a program (and its clones) has kept.
#[derive(Debug, Clone, Default)]
pub struct KeptCases(std::sync::Arc<std::sync::atomic::AtomicUsize>);

/// The file a failed case's stderr is written to, in its case directory.
pub const STDERR_FILE: &str = "stderr.txt";

/// Writes `stderr` (what the program wrote while it ran the case in `dir`, the last
/// [`TAIL_BYTES`]) to [`STDERR_FILE`] there, for [`keep_failed_case`]. Best effort: the case
/// has failed already, and a directory that cannot be written to changes nothing about that.
pub fn save_stderr(dir: &std::path::Path, stderr: &str) {
    let _ = std::fs::write(dir.join(STDERR_FILE), stderr);
}

/// The failure `e` of the case in the temporary directory `tmp`: for the first
/// [`KEPT_CASES`] failures counted by `kept` the directory is kept (with the case, whatever
/// outputs were written, and [`STDERR_FILE`]) and `e` says where; later ones are deleted.
pub fn keep_failed_case(tmp: super::scratch::Scratch, e: RunError, kept: &KeptCases) -> RunError {
    use std::sync::atomic::Ordering;
    if kept.0.fetch_add(1, Ordering::Relaxed) >= KEPT_CASES {
        return e;
    }
    let Some(dir) = tmp.keep() else {
        return e;
    };
    let stderr = match dir.join(STDERR_FILE).exists() {
        true => format!(", its stderr in {STDERR_FILE}"),
        false => String::new(),
    };
    e.with_message(format!(
        "{}
  case kept in {}{stderr} (the first {KEPT_CASES} failed cases of a run are kept)",
        e.message,
        dir.display()
    ))
}

/// A failed run: `reason`, the program's exception line, and the last lines of its stderr
/// (the first line is the summary; the stderr follows, indented, when there is more to it
/// than the exception line).
pub fn failure(reason: &str, stderr: &str) -> RunError {
    let summary = match exception_line(stderr) {
        Some(line) => format!("{reason}: {}", cut(line)),
        None => reason.to_string(),
    };
    RunError::new(with_stderr(summary, stderr))
}

/// `summary`, then the last [`SHOWN_LINES`] non-empty lines of `stderr`, indented under a
/// `stderr:` line (nothing when `stderr` holds only a line the summary already says).
pub fn with_stderr(mut summary: String, stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    match lines.as_slice() {
        [] => return summary,
        [only] if summary.contains(cut(only.trim()).as_str()) => return summary,
        _ => {}
    }
    let shown = &lines[lines.len().saturating_sub(SHOWN_LINES)..];
    let head = if shown.len() < lines.len() {
        format!("stderr (last {} of {} lines):", shown.len(), lines.len())
    } else {
        "stderr:".to_string()
    };
    summary.push_str(&format!("\n  {head}"));
    for l in shown {
        summary.push_str(&format!("\n  | {}", cut(l.trim_end())));
    }
    summary
}

/// `line` cut to [`SHOWN_LINE_CHARS`] characters.
fn cut(line: &str) -> String {
    match line.char_indices().nth(SHOWN_LINE_CHARS) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JAX: &str = "Traceback (most recent call last):\n  File \"a.py\", line 4, in <module>\n    f()\nTypeError: dot_general requires contracting dimensions to have the same shape\n--------------------\nFor simplicity, JAX has removed its internal frames from the traceback of the following exception. Set JAX_TRACEBACK_FILTERING=off to include these.\n";

    #[test]
    fn the_exception_line_is_found_under_boilerplate() {
        assert_eq!(
            exception_line(JAX),
            Some("TypeError: dot_general requires contracting dimensions to have the same shape")
        );
        assert_eq!(
            exception_line("x\njax.errors.ConcretizationTypeError: abstract\n"),
            Some("jax.errors.ConcretizationTypeError: abstract")
        );
        assert_eq!(exception_line("AssertionError\n"), Some("AssertionError"));
        // Not an exception: the last non-empty line.
        assert_eq!(
            exception_line("warming up\nsegfault here\n\n"),
            Some("segfault here")
        );
        assert_eq!(exception_line(" \n"), None);
        assert!(!is_exception("For simplicity, JAX has removed: x"));
        assert!(!is_exception("    raise ValueError: no"));
    }

    #[test]
    fn a_failure_keeps_the_exception_line_and_the_last_lines_of_stderr() {
        let e = failure("'x' exited with status 1", JAX).message;
        let first = e.lines().next().unwrap();
        assert_eq!(
            first,
            "'x' exited with status 1: TypeError: dot_general requires contracting dimensions to have the same shape"
        );
        assert!(e.contains("  stderr:\n  | Traceback"), "{e}");
        assert!(e.contains("| For simplicity"), "{e}");
        let many: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let e = failure("r", &many).message;
        assert!(e.contains("stderr (last 20 of 100 lines)"), "{e}");
        assert!(e.ends_with("| line 99") && !e.contains("line 79\n"), "{e}");
        assert_eq!(failure("r", "").message, "r");
        assert_eq!(failure("r", "only\n").message, "r: only");
        assert!(failure("r", &"x".repeat(1000)).message.len() < 300);
    }

    #[test]
    fn the_tail_keeps_the_last_bytes_and_marks() {
        let data: Vec<u8> = (0..TAIL_BYTES + 10)
            .map(|i| b'a' + (i % 26) as u8)
            .collect();
        let tail = Tail::drain(std::io::Cursor::new(data.clone()));
        assert!(tail.wait_closed(Instant::now() + Duration::from_secs(5)));
        assert_eq!(tail.mark(), data.len() as u64);
        assert_eq!(tail.since(0).as_bytes(), &data[10..]);
        assert_eq!(
            tail.since(data.len() as u64 - 3).as_bytes(),
            &data[data.len() - 3..]
        );
    }
}
