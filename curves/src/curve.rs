//! The vocabulary of the curves crate: the metrics a log can carry, the log formats, a
//! sample, a curve, and the reader's error.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::stats::upper_median;

/// A metric a training log can carry. `Loss` — the training loss — is the one compared by
/// default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Loss,
    /// Validation loss, where a reader tells it apart from the training loss (nanoGPT's
    /// `val_loss:`).
    ValLoss,
    /// Seconds per training step.
    StepTimeS,
    /// Tokens per second (per device where the framework logs it so).
    TokensPerS,
    /// TFLOP/s (per device where the framework logs it so).
    Tflops,
}

impl Metric {
    pub const ALL: [Metric; 5] = [
        Metric::Loss,
        Metric::ValLoss,
        Metric::StepTimeS,
        Metric::TokensPerS,
        Metric::Tflops,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Metric::Loss => "loss",
            Metric::ValLoss => "val_loss",
            Metric::StepTimeS => "step_time_s",
            Metric::TokensPerS => "tokens_per_s",
            Metric::Tflops => "tflops",
        }
    }

    pub fn parse(s: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// The log formats `moecheck curves` reads. See docs/curves.md for each one's exact lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// `completed step: N, seconds: S, TFLOP/s/device: X, Tokens/s/device: Y, ..., loss: L`.
    MaxtextStdout,
    /// MaxText `metrics_file`: one JSON object a line with `"step"` and `"learning/loss"`.
    MaxtextJsonl,
    /// `iteration N/ M | ... | lm loss: X.XXXXXXE+00 | ...`.
    MegatronStdout,
    /// Megatron functional-test golden values: `{"lm loss": {"start_step", ..., "values"}}`.
    MegatronGolden,
    /// Megatron-Bridge functional-test golden values: `{"<step>": {"lm loss": ..., ...}, ...}`.
    MegatronBridgeGolden,
    /// nanoGPT / modded-nanogpt: `step:N/M train_loss:X ...` and `step:N/M val_loss:X ...`.
    Nanogpt,
    /// `step: N  loss: X  memory: ...  tps: ...  tflops: ...  mfu: ...%` (ANSI colours stripped).
    TorchtitanStdout,
    /// HuggingFace `trainer_state.json` (`log_history`).
    HfTrainerState,
    /// Whitespace-, comma- or tab-separated `step loss` with an optional header line.
    Plain,
    /// TensorBoard event file (`events.out.tfevents.*`).
    Tensorboard,
    /// Any text log read line by line with a user's regular expression (`--pattern`); not in
    /// [`LogFormat::ALL`]: it is chosen by giving the expression, never by name or detection.
    Pattern,
}

impl LogFormat {
    /// The formats that can be named (`--format`) or detected.
    pub const ALL: [LogFormat; 10] = [
        LogFormat::MaxtextStdout,
        LogFormat::MaxtextJsonl,
        LogFormat::MegatronStdout,
        LogFormat::MegatronGolden,
        LogFormat::MegatronBridgeGolden,
        LogFormat::Nanogpt,
        LogFormat::TorchtitanStdout,
        LogFormat::HfTrainerState,
        LogFormat::Plain,
        LogFormat::Tensorboard,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LogFormat::MaxtextStdout => "maxtext-stdout",
            LogFormat::MaxtextJsonl => "maxtext-jsonl",
            LogFormat::MegatronStdout => "megatron-stdout",
            LogFormat::MegatronGolden => "megatron-golden",
            LogFormat::MegatronBridgeGolden => "megatron-bridge-golden",
            LogFormat::Nanogpt => "nanogpt",
            LogFormat::TorchtitanStdout => "torchtitan-stdout",
            LogFormat::HfTrainerState => "hf-trainer-state",
            LogFormat::Plain => "plain",
            LogFormat::Tensorboard => "tensorboard",
            LogFormat::Pattern => "pattern",
        }
    }

    pub fn parse(s: &str) -> Option<LogFormat> {
        LogFormat::ALL.into_iter().find(|f| f.name() == s)
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One logged value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub step: u64,
    pub value: f64,
    /// 1-based line of the log (for TensorBoard: the 1-based record number).
    pub line: usize,
    /// Logging resolution of this value: the smallest change the log could show.
    pub quantum: f64,
}

/// Everything one reader found in one log.
#[derive(Debug, Clone)]
pub struct Curve {
    pub path: PathBuf,
    pub format: LogFormat,
    /// Per metric, the samples in file order (restarts and duplicates kept; see [`diff::Series`]).
    pub metrics: BTreeMap<Metric, Vec<Sample>>,
    /// What the reader skipped that the user should hear of (the CLI prints each on stderr).
    pub warnings: Vec<ReadWarning>,
}

/// Input a reader skipped rather than refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadWarning {
    /// The file ends inside TensorBoard record `record` (1-based), which starts at byte
    /// `offset` with `bytes_left` bytes of the file after it; `needs` is the record's whole
    /// size when its header was complete. The records before it were read.
    TruncatedRecord {
        record: usize,
        offset: u64,
        bytes_left: u64,
        needs: Option<u64>,
    },
}

impl fmt::Display for ReadWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadWarning::TruncatedRecord {
                record,
                offset,
                bytes_left,
                needs,
            } => {
                let of = needs.map_or(String::new(), |n| format!(" of the {n} it needs"));
                write!(
                    f,
                    "the last record ({record}, at byte {offset}) is truncated: {bytes_left} \
                     byte(s){of}; read the {} whole record(s) before it (a run still writing, \
                     or one that stopped mid-write)",
                    record - 1
                )
            }
        }
    }
}

impl Curve {
    pub fn new(path: &Path, format: LogFormat) -> Curve {
        Curve {
            path: path.to_path_buf(),
            format,
            metrics: BTreeMap::new(),
            warnings: Vec::new(),
        }
    }

    pub fn push(&mut self, metric: Metric, sample: Sample) {
        self.metrics.entry(metric).or_default().push(sample);
    }

    /// Names of the metrics found, in [`Metric`] order.
    pub fn metrics_found(&self) -> Vec<&'static str> {
        self.metrics.keys().map(|m| m.name()).collect()
    }

    /// The logging precision of `metric` over the whole log: the (upper) median quantum of
    /// its finite samples — the resolution its values are typically printed at. One value
    /// printed coarser (`12` among `12.269`s) does not set it. `diff` takes the same median
    /// over the compared steps only. 0 when there is no finite sample.
    pub fn precision(&self, metric: Metric) -> f64 {
        let quanta: Vec<f64> = self
            .metrics
            .get(&metric)
            .into_iter()
            .flatten()
            .filter(|x| x.value.is_finite())
            .map(|x| x.quantum)
            .collect();
        if quanta.is_empty() {
            0.0
        } else {
            upper_median(&quanta)
        }
    }
}

/// Bad input: the one-line reasons `moecheck curves` prints before exiting 2.
#[derive(Debug, thiserror::Error)]
pub enum CurveError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {reason}")]
    Malformed {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{path}: {reason}")]
    Unrecognised { path: PathBuf, reason: String },
    /// Nothing to read: no bytes (`blank` false) or only whitespace.
    #[error("{path}: empty file{}", if *blank { " (only whitespace)" } else { "" })]
    Empty { path: PathBuf, blank: bool },
    #[error("{path}: no {metric} values found (read as {format}; metrics found: {found})")]
    NoMetric {
        path: PathBuf,
        metric: &'static str,
        format: LogFormat,
        found: String,
    },
    /// A `--pattern` that does not compile or lacks the named groups `step` and `value`.
    #[error("--pattern `{pattern}`: {reason}")]
    Pattern { pattern: String, reason: String },
    /// A plot file whose extension names no format [`plot::Kind`] writes.
    #[error("--plot {path}: the file name must end in .svg or .png")]
    PlotExtension { path: PathBuf },
}
