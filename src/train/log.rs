//! The loss log of `moecheck train`, in a format `moecheck curves diff` reads without options:
//!
//! * plain (any name): a comment line `# moecheck train …` naming the run, then
//!   `step loss tokens_per_s` and one line per step (loss to 6 decimals);
//! * JSONL (a name ending in `.jsonl`): one MaxText `metrics_file` object per step —
//!   `"step"`, `"learning/loss"`, `"perf/step_time_seconds"`,
//!   `"perf/per_device_tokens_per_sec"` — plus `"source": "moecheck train"`.
//!
//! A log is written line by line as the run goes (a run stopped early leaves a readable log).
//! An existing file is replaced only when it is a log this command wrote (its first line says
//! so); anything else is refused, naming the flag.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::StepLog;

const PLAIN_MARK: &str = "# moecheck train";
const JSON_MARK: &str = "\"source\": \"moecheck train\"";

/// A log being written.
pub struct LogWriter {
    path: PathBuf,
    file: File,
    jsonl: bool,
}

/// `Ok` when `path` may be written: nothing there, or a log an earlier `moecheck train` wrote.
pub fn replaceable(path: &Path, flag: &str) -> anyhow::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("{flag} {}", path.display())),
    };
    let first = if meta.is_file() {
        File::open(path)
            .ok()
            .and_then(|f| BufReader::new(f).lines().next())
            .and_then(Result::ok)
            .unwrap_or_default()
    } else {
        String::new()
    };
    if !(first.starts_with(PLAIN_MARK) || first.contains(JSON_MARK)) {
        bail!(
            "{flag}: {} exists and is not a log written by moecheck train; not replacing it",
            path.display()
        );
    }
    Ok(())
}

impl LogWriter {
    /// Creates (or replaces, see [`replaceable`]) the log at `path`; `about` goes into the
    /// plain log's first line.
    pub fn create(path: &Path, flag: &str, about: &str) -> anyhow::Result<LogWriter> {
        replaceable(path, flag)?;
        let jsonl = path.extension().is_some_and(|e| e == "jsonl");
        let mut file = File::create(path)
            .with_context(|| format!("{flag} {}: cannot create the log", path.display()))?;
        if !jsonl {
            writeln!(file, "{PLAIN_MARK} {about}")
                .and_then(|()| writeln!(file, "step loss tokens_per_s"))
                .with_context(|| format!("{flag} {}", path.display()))?;
        }
        Ok(LogWriter {
            path: path.to_path_buf(),
            file,
            jsonl,
        })
    }

    /// Appends one step.
    pub fn write(&mut self, s: &StepLog) -> anyhow::Result<()> {
        let r = if self.jsonl {
            // JSON has no NaN: a diverged step is written as Python's json.dumps writes it,
            // which the MaxText reader accepts.
            let loss = if s.loss.is_finite() {
                format!("{:.6}", s.loss)
            } else {
                "NaN".into()
            };
            writeln!(
                self.file,
                "{{{JSON_MARK}, \"step\": {}, \"learning/loss\": {loss}, \"perf/step_time_seconds\": {:.6}, \"perf/per_device_tokens_per_sec\": {:.1}}}",
                s.step, s.step_time_s, s.tokens_per_s
            )
        } else {
            writeln!(self.file, "{} {:.6} {:.1}", s.step, s.loss, s.tokens_per_s)
        };
        r.with_context(|| format!("{}: cannot write the log", self.path.display()))
    }
}
