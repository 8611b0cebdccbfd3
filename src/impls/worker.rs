//! `worker:CMD`: a persistent program that answers case after case (protocol v2,
//! docs/protocol.md), so a campaign pays the program's start, imports and compilation once.
//!
//! moecheck starts `sh -c CMD` on the first case (a campaign: at once, to read its contract,
//! [`Worker::contract`]), in its own process group (src/impls/process.rs), with
//! `MOECHECK_WORKER_PROTOCOL=2` in its environment. The worker greets with one line on
//! stdout, `{"protocol": 2, "ops": [...], "contract": {...}}` (`contract` optional: what it
//! declares and supports per op, src/prop/contract.rs). For each case moecheck writes the case
//! directory exactly as in v1 and sends one line on the worker's stdin, `{"case": "DIR"}`; the
//! worker writes its outputs there and answers one line on stdout, `{"ok": true}`, `{"ok":
//! false, "error": "..."}` (a failed case) or `{"ok": false, "unsupported": "..."}` (a refused
//! case: not applicable, [`moecheck_reference::op::RunErrorKind::Refused`]). A timeout or an
//! answer that breaks the protocol is [`moecheck_reference::op::RunErrorKind::Broken`].
//!
//! A worker that greets with another protocol version, dies, does not answer within
//! `--timeout`, or answers anything else fails **that case** (the reason and the tail of its
//! stderr) and its process group is ended; the next case starts a fresh worker. An
//! `{"ok": false}` answer fails the case and keeps the worker. A worker that fails to start
//! on the first case (it exits or times out before greeting: a missing module, a wrong
//! path) is not started again: every later case fails at once with the same reason, and
//! [`Implementation::broken`] says so, so a campaign stops instead of paying the failed
//! start for every case and shrink step. Dropping the [`Worker`] closes the worker's stdin
//! (its cue to exit) and then ends its group.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;

use moecheck_reference::op::{Implementation, Op, RunError};
use moecheck_reference::protocol::Protocol;

use crate::impls::exec::{describe, Program};
use crate::impls::process::{failure, keep_failed_case, save_stderr, with_stderr, Running, GRACE};
use crate::impls::scratch::Scratch;
use crate::impls::{no_case_dir, unread, OnDisk};
use crate::protocol;

/// The version of the worker protocol this build speaks.
pub const WORKER_PROTOCOL: u64 = 2;

/// The environment variable that tells a worker which protocol version moecheck speaks.
pub const PROTOCOL_ENV: &str = "MOECHECK_WORKER_PROTOCOL";

/// The longest line a worker may write on stdout (bytes).
const MAX_LINE: u64 = 1 << 20;

/// An external implementation of `O` as a persistent worker, declaring its precision with
/// `declaration`. The worker runs behind a lock: [`Implementation::run`] takes `&self`.
#[derive(Debug)]
pub struct Worker<O: Op> {
    pub program: Program,
    /// What the program declares (its accumulator, its compute format).
    pub declaration: O::Declaration,
    slot: Mutex<Slot>,
}

/// The worker's state, behind the lock.
#[derive(Debug, Default)]
struct Slot {
    /// The running worker, when there is one.
    session: Option<Session>,
    /// Whether a worker has greeted at least once.
    greeted: bool,
    /// How the worker failed to start on the first case, when it did (it is not restarted).
    never_started: Option<RunError>,
    /// The `"contract"` of the last greeting (`Value::Null` when it had none).
    contract: Value,
}

impl<O: Op> Worker<O> {
    /// A worker that is started on its first case.
    pub fn new(program: Program, declaration: O::Declaration) -> Worker<O> {
        Worker {
            program,
            declaration,
            slot: Mutex::new(Slot::default()),
        }
    }
}

impl<O: Protocol> Implementation<O> for Worker<O> {
    fn name(&self) -> String {
        format!("worker:{}", self.program.command)
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, case: &O::Case) -> O::Precision {
        O::declared_precision(case, &self.declaration)
    }
    fn broken(&self) -> Option<RunError> {
        self.lock().never_started.clone()
    }
    fn run(&self, case: &O::Case, ask: O::Ask) -> Result<O::Outputs, RunError> {
        let compact = self.compact()?;
        let tmp = Scratch::new("moecheck-case-").map_err(no_case_dir)?;
        protocol::write_case::<O>(tmp.path(), case, ask, None, compact)
            .map_err(|e| RunError::new(e.to_string()))?;
        let tmp = self.run_on(tmp)?;
        protocol::read_outputs::<O>(tmp.path(), case, ask).map_err(unread)
    }
}

impl<O: Protocol> OnDisk<O> for Worker<O> {
    /// The greeting says how the inputs are written (a worker that said "float32" gets
    /// float32 whatever --inputs says; one that said nothing, what --inputs says): the
    /// worker starts first.
    fn compact(&self) -> Result<bool, RunError> {
        if let Some(e) = Implementation::<O>::broken(self) {
            return Err(e);
        }
        let greeted = self.lock().running(&self.program, O::PROTOCOL_OP)?.compact;
        Ok(greeted.unwrap_or(self.program.compact))
    }
    fn run_on(&self, tmp: Scratch) -> Result<Scratch, RunError> {
        match self.answer(&mut self.lock(), tmp.path(), O::PROTOCOL_OP) {
            Ok(()) => Ok(tmp),
            Err(e) if e.is_refusal() => Err(e),
            Err(e) => Err(keep_failed_case(tmp, e, &self.program.kept)),
        }
    }
}

impl<O: Op> Worker<O> {
    /// Starts the worker now (when it is not running) and returns what its greeting declares
    /// under `"contract"` for `key` (`grouped_gemm`, `fp8`, `route`, `moe_layer`): `None`
    /// when it declares nothing there. A worker that cannot start is the error.
    pub fn contract(&self, op: &str, key: &str) -> Result<Option<Value>, RunError> {
        let mut slot = self.lock();
        if let Some(e) = &slot.never_started {
            return Err(e.clone());
        }
        slot.running(&self.program, op)?;
        Ok(slot.contract.get(key).cloned())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Has the worker in `slot` ([`Slot::running`]) answer the case in `dir`; a worker that
    /// failed the protocol is dropped (its group ended), one that answered stays.
    fn answer(&self, slot: &mut Slot, dir: &Path, op: &str) -> Result<(), RunError> {
        let session = slot.running(&self.program, op)?;
        let answer = session.ask(dir);
        if answer.is_err() {
            slot.session = None;
        }
        answer?
    }
}

impl Slot {
    /// The running worker: the one there when it is alive and in step, else one started
    /// afresh (its greeting's contract kept). A first start that fails is recorded in
    /// `never_started`.
    fn running(&mut self, program: &Program, op: &str) -> Result<&mut Session, RunError> {
        if let Some(session) = self.session.as_mut() {
            match session.idle() {
                Idle::Yes => {}
                // Dead or gone: a fresh one, as after a failed case.
                Idle::Gone => self.session = None,
                // A line nobody asked for breaks the protocol (one answer per case): this
                // case fails, whenever the line came (read as its answer, it would fail it
                // too), and the next starts a fresh worker.
                Idle::Stray(line) => {
                    let who = session.who.clone();
                    session.process.end();
                    self.session = None;
                    return Err(RunError::broken(format!(
                        "{who} wrote '{}' on stdout between cases, where the protocol has one answer line per case and nothing else (docs/protocol.md): this case fails and the worker is restarted",
                        shown(&line)
                    )));
                }
            }
        }
        if self.session.is_none() {
            match Session::start(program, op) {
                Ok((s, contract)) => {
                    self.greeted = true;
                    self.contract = contract;
                    self.session = Some(s);
                }
                Err(e) => {
                    if !self.greeted {
                        self.never_started = Some(e.clone());
                    }
                    return Err(e);
                }
            }
        }
        Ok(self.session.as_mut().expect("started above"))
    }
}

/// One started worker: its process group, its stdin, and its stdout as lines.
#[derive(Debug)]
struct Session {
    process: Running,
    stdin: Option<ChildStdin>,
    lines: Receiver<Line>,
    /// `worker 'CMD'`, for messages.
    who: String,
    program: Program,
    /// What its greeting said of compact inputs (`"inputs"`; `None`: nothing).
    compact: Option<bool>,
}

/// What the stdout reader saw.
#[derive(Debug)]
enum Line {
    Text(String),
    /// A line longer than [`MAX_LINE`] (the reader stops there).
    TooLong,
    Failed(String),
}

/// How often [`Session::next`] looks whether the worker is still running.
const WATCH: Duration = Duration::from_millis(100);

impl From<Line> for Next {
    fn from(line: Line) -> Next {
        match line {
            Line::Text(l) => Next::Line(l),
            Line::TooLong => Next::Line(format!("(a line longer than {MAX_LINE} bytes)")),
            Line::Failed(e) => Next::Closed(Some(e)),
        }
    }
}

/// A live worker between cases.
enum Idle {
    /// Alive, nothing written.
    Yes,
    /// Exited, or its stdout closed.
    Gone,
    /// It wrote this line when no case was asked.
    Stray(String),
}

/// What came of waiting for a line.
enum Next {
    Line(String),
    /// Stdout ended (the worker exited or closed it), or could not be read.
    Closed(Option<String>),
    TimedOut,
}

impl Session {
    /// Starts the worker and reads its greeting (within the timeout); the error fails the
    /// case that asked for it.
    fn start(program: &Program, op: &str) -> Result<(Session, Value), RunError> {
        let who = format!("worker '{}'", program.command);
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(&program.command)
            .env(PROTOCOL_ENV, WORKER_PROTOCOL.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut process = Running::start(command)
            .map_err(|e| RunError::new(format!("cannot start sh for {who}: {e}")))?;
        let stdin = process.child().stdin.take();
        let stdout = process.child().stdout.take().expect("stdout is piped");
        let mut session = Session {
            process,
            stdin,
            lines: read_lines(stdout),
            who,
            program: program.clone(),
            compact: None,
        };
        let deadline = Instant::now() + program.timeout;
        let greeting = match session.next(deadline) {
            Next::Line(l) => l,
            Next::Closed(why) => {
                return Err(session.gone("before its greeting", why.as_deref(), 0));
            }
            Next::TimedOut => {
                return Err(session.timed_out("did not greet", 0));
            }
        };
        match check_greeting(&greeting, op).and_then(|c| Ok((c, greeting_inputs(&greeting)?))) {
            Ok((contract, compact)) => {
                session.compact = compact;
                Ok((session, contract))
            }
            Err(reason) => {
                session.process.end();
                Err(RunError::broken(session.failed(&reason, 0).message))
            }
        }
    }

    /// Sends the case in `dir` and reads the answer. The outer error means the worker broke
    /// the protocol (the session must be dropped); the inner one is its `{"ok": false}`.
    fn ask(&mut self, dir: &Path) -> Result<Result<(), RunError>, RunError> {
        let mark = self.process.stderr.mark();
        let answer = self.ask_marked(dir, mark);
        if !matches!(answer, Ok(Ok(()))) {
            save_stderr(dir, &self.process.stderr.since(mark));
        }
        answer
    }

    /// [`Session::ask`], with the worker's stderr since `mark` in its failures.
    fn ask_marked(&mut self, dir: &Path, mark: u64) -> Result<Result<(), RunError>, RunError> {
        let Some(path) = dir.to_str() else {
            return Ok(Err(RunError::new(format!(
                "the case directory {} is not UTF-8 text (set TMPDIR to a plain path)",
                dir.display()
            ))));
        };
        let message = serde_json::json!({ "case": path }).to_string() + "\n";
        let sent = match self.stdin.as_mut() {
            Some(stdin) => stdin
                .write_all(message.as_bytes())
                .and_then(|()| stdin.flush()),
            None => Err(std::io::ErrorKind::BrokenPipe.into()),
        };
        let deadline = Instant::now() + self.program.timeout;
        if let Err(e) = sent {
            return Err(self.gone("before it read the case", Some(&e.to_string()), mark));
        }
        let line = match self.next(deadline) {
            Next::Line(l) => l,
            Next::Closed(why) => return Err(self.gone("on this case", why.as_deref(), mark)),
            Next::TimedOut => return Err(self.timed_out("did not answer", mark)),
        };
        match parse_answer(&line) {
            Ok(Answer::Done) => Ok(Ok(())),
            Ok(Answer::Failed(error)) => Ok(Err(RunError::new(with_stderr(
                format!("{} failed the case: {}", self.who, error),
                &self.settled_stderr(mark),
            )))),
            Ok(Answer::Refused(reason)) => Ok(Err(RunError::refused(format!(
                "{} refused the case: {}",
                self.who, reason
            )))),
            Err(reason) => {
                self.process.end();
                Err(RunError::broken(self.failed(&reason, mark).message))
            }
        }
    }

    /// What the live worker wrote to stderr since `mark`, once that pipe has been quiet for a
    /// moment (it wrote there before it answered on stdout).
    fn settled_stderr(&self, mark: u64) -> String {
        let stderr = &self.process.stderr;
        stderr.settle(Duration::from_millis(50), Instant::now() + GRACE);
        stderr.since(mark)
    }

    /// Whether the worker is alive and has written nothing nobody asked for.
    fn idle(&mut self) -> Idle {
        match self.lines.try_recv() {
            Ok(Line::Text(l)) => return Idle::Stray(l),
            Ok(Line::TooLong) => {
                return Idle::Stray(format!("a line longer than {MAX_LINE} bytes"))
            }
            Ok(Line::Failed(_)) | Err(TryRecvError::Disconnected) => return Idle::Gone,
            Err(TryRecvError::Empty) => {}
        }
        match self.process.wait_until(Instant::now()) {
            Ok(None) => Idle::Yes,
            _ => Idle::Gone,
        }
    }

    /// The next line before `deadline`. The process is watched as well as the pipe: a worker
    /// that exited while something it started holds its stdout open answers nothing more,
    /// and is reported at once (by [`Session::gone`]), not at the timeout.
    fn next(&mut self, deadline: Instant) -> Next {
        loop {
            let slice = deadline
                .saturating_duration_since(Instant::now())
                .min(WATCH);
            match self.lines.recv_timeout(slice) {
                Ok(line) => return line.into(),
                Err(RecvTimeoutError::Disconnected) => return Next::Closed(None),
                Err(RecvTimeoutError::Timeout) if Instant::now() >= deadline => {
                    return Next::TimedOut;
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            if let Ok(Some(_)) = self.process.wait_until(Instant::now()) {
                // What it wrote before it exited is still read.
                return self
                    .lines
                    .recv_timeout(WATCH)
                    .map_or(Next::Closed(None), Next::from);
            }
        }
    }

    /// The worker's stdout ended `when`: how it exited, with its stderr since `mark`.
    fn gone(&mut self, when: &str, why: Option<&str>, mark: u64) -> RunError {
        let how = match self.process.wait_until(Instant::now() + GRACE) {
            Ok(Some(s)) => format!("exited with {} {when}", describe(s)),
            _ => format!("closed its stdout {when}"),
        };
        let how = match why {
            Some(why) => format!("{how} ({why})"),
            None => how,
        };
        self.process.end();
        self.failed(&how, mark)
    }

    fn timed_out(&mut self, what: &str, mark: u64) -> RunError {
        self.process.end();
        let reason = format!(
            "{what} within {:.1} s (its process group was ended)",
            self.program.timeout.as_secs_f64()
        );
        RunError::broken(self.failed(&reason, mark).message)
    }

    /// `worker 'CMD' REASON`, with the worker's exception line and stderr since `mark`.
    fn failed(&self, reason: &str, mark: u64) -> RunError {
        self.process
            .stderr
            .wait_closed(Instant::now() + GRACE.min(self.program.timeout));
        failure(
            &format!("{} {reason}", self.who),
            &self.process.stderr.since(mark),
        )
    }
}

impl Drop for Session {
    /// Closes the worker's stdin (its cue to exit), gives it a moment, then ends its group.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.process.wait_until(Instant::now() + GRACE);
        self.process.end();
    }
}

/// Reads `stdout` line by line on a thread (lines at most [`MAX_LINE`] bytes).
fn read_lines(stdout: impl Read + Send + 'static) -> Receiver<Line> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut buf = Vec::new();
            let line = match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut buf) {
                Ok(0) => break,
                Ok(_) if buf.last() != Some(&b'\n') && buf.len() as u64 >= MAX_LINE => {
                    Line::TooLong
                }
                Ok(_) => Line::Text(String::from_utf8_lossy(&buf).trim_end().to_string()),
                Err(e) => Line::Failed(e.to_string()),
            };
            let last = !matches!(line, Line::Text(_));
            if tx.send(line).is_err() || last {
                break;
            }
        }
    });
    rx
}

#[path = "worker_answer.rs"]
mod answer;
use answer::{check_greeting, greeting_inputs, parse_answer, shown, Answer};

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
