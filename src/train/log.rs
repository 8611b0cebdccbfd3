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
//! so) or empty; anything else is refused, naming the flag. Links and special files are
//! treated as every file a user names (`crate::user_file`).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::StepLog;
use crate::user_file::{self, Target};

const PLAIN_MARK: &str = "# moecheck train";
const JSON_MARK: &str = "\"source\": \"moecheck train\"";

/// A log being written.
pub struct LogWriter {
    path: PathBuf,
    file: File,
    jsonl: bool,
}

/// `Ok` when `path` may be written: nothing there, a special file such as `/dev/null`
/// (written in place), an empty file (a run stopped before its first step, or anybody's: it
/// holds nothing to lose), or a log an earlier `moecheck train` wrote. A symbolic link, a
/// directory, or any other file is refused, naming the flag ([`user_file::check`]).
pub fn replaceable(path: &Path, flag: &str) -> anyhow::Result<()> {
    let Target::Regular(_) = user_file::check(path, flag)? else {
        return Ok(());
    };
    let first = File::open(path)
        .ok()
        .and_then(|f| BufReader::new(f).lines().next())
        .and_then(Result::ok);
    let Some(first) = first else {
        return Ok(());
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
        let mut file = user_file::open(path, flag)?;
        if !jsonl {
            let header = writeln!(file, "{PLAIN_MARK} {about}")
                .and_then(|()| writeln!(file, "step loss tokens_per_s"));
            if let Err(e) = header {
                // Half a first line (a full disk) would make the next run refuse the file.
                if std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e).with_context(|| format!("{flag} {}", path.display()));
            }
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
