//! Loss-curve parity: read training logs of many frameworks into one [`Curve`], then decide
//! whether two runs agree ([`diff`], whose verdict is [`decide`]d), print the result
//! ([`render`]) and draw it ([`plot`]). Dependencies point one way: `diff` uses `decide`, both
//! fill the plain data of `report`, and `render` and `plot` only read it.
//!
//! Every reader returns, per metric it found, the samples `(step, value, line, quantum)` in file
//! order, where `quantum` is the logging resolution of that printed value (`0.001` for MaxText's
//! `loss: 12.269`, `1e-5` for Megatron's `lm loss: 1.034443E+01`, the f32 spacing for values
//! stored as binary or JSON floats). A format's *logging precision* is the largest quantum of
//! the samples compared; the criterion never asks for agreement finer than twice that.
//!
//! Readers refuse malformed input with [`CurveError::Malformed`], naming the file and the
//! 1-based line (or, for binary TensorBoard files, the byte offset of the bad record).

pub mod decide;
pub mod diff;
mod hf;
mod maxtext;
mod megatron;
mod parse;
mod plain;
pub mod plot;
pub mod render;
mod report;
pub mod stats;
mod tensorboard;
mod torchtitan;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use parse::{f32_quantum, parse_printed, strip_ansi};
pub use tensorboard::crc32c;

use parse::malformed;

/// A metric a training log can carry. `Loss` is the one compared by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Loss,
    /// Seconds per training step.
    StepTimeS,
    /// Tokens per second (per device where the framework logs it so).
    TokensPerS,
    /// TFLOP/s (per device where the framework logs it so).
    Tflops,
}

impl Metric {
    pub const ALL: [Metric; 4] = [
        Metric::Loss,
        Metric::StepTimeS,
        Metric::TokensPerS,
        Metric::Tflops,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Metric::Loss => "loss",
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
    /// `step: N  loss: X  memory: ...  tps: ...  tflops: ...  mfu: ...%` (ANSI colours stripped).
    TorchtitanStdout,
    /// HuggingFace `trainer_state.json` (`log_history`).
    HfTrainerState,
    /// Whitespace-, comma- or tab-separated `step loss` with an optional header line.
    Plain,
    /// TensorBoard event file (`events.out.tfevents.*`).
    Tensorboard,
}

impl LogFormat {
    pub const ALL: [LogFormat; 8] = [
        LogFormat::MaxtextStdout,
        LogFormat::MaxtextJsonl,
        LogFormat::MegatronStdout,
        LogFormat::MegatronGolden,
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
            LogFormat::TorchtitanStdout => "torchtitan-stdout",
            LogFormat::HfTrainerState => "hf-trainer-state",
            LogFormat::Plain => "plain",
            LogFormat::Tensorboard => "tensorboard",
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
}

impl Curve {
    pub fn new(path: &Path, format: LogFormat) -> Curve {
        Curve {
            path: path.to_path_buf(),
            format,
            metrics: BTreeMap::new(),
        }
    }

    pub fn push(&mut self, metric: Metric, sample: Sample) {
        self.metrics.entry(metric).or_default().push(sample);
    }

    /// Names of the metrics found, in [`Metric`] order.
    pub fn metrics_found(&self) -> Vec<&'static str> {
        self.metrics.keys().map(|m| m.name()).collect()
    }

    /// The logging precision of `metric`: the largest quantum among its samples.
    pub fn precision(&self, metric: Metric) -> f64 {
        self.metrics
            .get(&metric)
            .map(|s| s.iter().map(|x| x.quantum).fold(0.0, f64::max))
            .unwrap_or(0.0)
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
    #[error("{path}: no {metric} values found (read as {format}; metrics found: {found})")]
    NoMetric {
        path: PathBuf,
        metric: &'static str,
        format: LogFormat,
        found: String,
    },
    /// A plot file whose extension names no format [`plot::Kind`] writes.
    #[error("--plot {path}: the file name must end in .svg or .png")]
    PlotExtension { path: PathBuf },
}

/// Reads `path` as `format`, or detects the format when `format` is `None`.
pub fn read(path: &Path, format: Option<LogFormat>) -> Result<Curve, CurveError> {
    let bytes = std::fs::read(path).map_err(|source| CurveError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let format = match format {
        Some(f) => f,
        None => detect(path, &bytes)?,
    };
    if format == LogFormat::Tensorboard {
        return tensorboard::read(path, &bytes);
    }
    // A UTF-8 byte-order mark (Windows editors write one) is not part of the log.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        malformed(path, line, "not UTF-8 text")
    })?;
    match format {
        LogFormat::MaxtextStdout => maxtext::read_stdout(path, text),
        LogFormat::MaxtextJsonl => maxtext::read_jsonl(path, text),
        LogFormat::MegatronStdout => megatron::read_stdout(path, text),
        LogFormat::MegatronGolden => megatron::read_golden(path, text),
        LogFormat::TorchtitanStdout => torchtitan::read(path, text),
        LogFormat::HfTrainerState => hf::read(path, text),
        LogFormat::Plain => plain::read(path, text),
        LogFormat::Tensorboard => unreachable!("handled above"),
    }
}

/// Picks a format from the file's content (the name only for TensorBoard's
/// `events.out.tfevents.*`, which is also recognised by its record framing).
pub fn detect(path: &Path, bytes: &[u8]) -> Result<LogFormat, CurveError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.contains("tfevents") || tensorboard::looks_like(bytes) {
        return Ok(LogFormat::Tensorboard);
    }
    let text = String::from_utf8_lossy(bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes));
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        // A whole JSON document, or JSON lines.
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(trimmed) {
            if v.get("log_history").is_some() {
                return Ok(LogFormat::HfTrainerState);
            }
            if v.as_object()
                .is_some_and(|o| o.values().any(|x| x.get("values").is_some()))
            {
                return Ok(LogFormat::MegatronGolden);
            }
        }
        let first = trimmed.lines().next().unwrap_or("");
        if first.contains("\"learning/loss\"") || first.contains("\"step\"") {
            return Ok(LogFormat::MaxtextJsonl);
        }
    }
    for line in text.lines().take(100_000) {
        let line = strip_ansi(line);
        if line.contains("completed step:") {
            return Ok(LogFormat::MaxtextStdout);
        }
        if line.contains(" iteration ") && line.contains('|') && line.contains("loss") {
            return Ok(LogFormat::MegatronStdout);
        }
        if torchtitan::is_step_line(&line) {
            return Ok(LogFormat::TorchtitanStdout);
        }
    }
    if plain::looks_like(&text) {
        return Ok(LogFormat::Plain);
    }
    Err(CurveError::Unrecognised {
        path: path.to_path_buf(),
        reason: format!(
            "format not recognised; name one with --format ({})",
            LogFormat::ALL.map(|f| f.name()).join(", ")
        ),
    })
}
