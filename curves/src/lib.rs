//! Loss-curve parity: read training logs of many frameworks into one [`Curve`], then decide
//! whether two runs agree ([`diff`]) and draw them ([`plot`]).
//!
//! Every reader returns, per metric it found, the samples `(step, value, line, quantum)` in file
//! order, where `quantum` is the logging resolution of that printed value (`0.001` for MaxText's
//! `loss: 12.269`, `1e-5` for Megatron's `lm loss: 1.034443E+01`, the f32 spacing for values
//! stored as binary or JSON floats). A format's *logging precision* is the largest quantum of
//! the samples compared; the criterion never asks for agreement finer than twice that.
//!
//! Readers refuse malformed input with [`CurveError::Malformed`], naming the file and the
//! 1-based line (or, for binary TensorBoard files, the byte offset of the bad record).

pub mod diff;
mod hf;
mod maxtext;
mod megatron;
mod plain;
pub mod plot;
pub mod stats;
mod tensorboard;
mod torchtitan;
pub mod verdict;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use tensorboard::crc32c;

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
pub enum Format {
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

impl Format {
    pub const ALL: [Format; 8] = [
        Format::MaxtextStdout,
        Format::MaxtextJsonl,
        Format::MegatronStdout,
        Format::MegatronGolden,
        Format::TorchtitanStdout,
        Format::HfTrainerState,
        Format::Plain,
        Format::Tensorboard,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Format::MaxtextStdout => "maxtext-stdout",
            Format::MaxtextJsonl => "maxtext-jsonl",
            Format::MegatronStdout => "megatron-stdout",
            Format::MegatronGolden => "megatron-golden",
            Format::TorchtitanStdout => "torchtitan-stdout",
            Format::HfTrainerState => "hf-trainer-state",
            Format::Plain => "plain",
            Format::Tensorboard => "tensorboard",
        }
    }

    pub fn parse(s: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == s)
    }
}

impl fmt::Display for Format {
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
    pub format: Format,
    /// Per metric, the samples in file order (restarts and duplicates kept; see [`diff::Series`]).
    pub metrics: BTreeMap<Metric, Vec<Sample>>,
}

impl Curve {
    pub fn new(path: &Path, format: Format) -> Curve {
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
        format: Format,
        found: String,
    },
    /// A plot file whose extension names no format [`plot::Kind`] writes.
    #[error("--plot {path}: the file name must end in .svg or .png")]
    PlotExtension { path: PathBuf },
}

pub(crate) fn malformed(path: &Path, line: usize, reason: impl Into<String>) -> CurveError {
    CurveError::Malformed {
        path: path.to_path_buf(),
        line,
        reason: reason.into(),
    }
}

/// Reads `path` as `format`, or detects the format when `format` is `None`.
pub fn read(path: &Path, format: Option<Format>) -> Result<Curve, CurveError> {
    let bytes = std::fs::read(path).map_err(|source| CurveError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let format = match format {
        Some(f) => f,
        None => detect(path, &bytes)?,
    };
    if format == Format::Tensorboard {
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
        Format::MaxtextStdout => maxtext::read_stdout(path, text),
        Format::MaxtextJsonl => maxtext::read_jsonl(path, text),
        Format::MegatronStdout => megatron::read_stdout(path, text),
        Format::MegatronGolden => megatron::read_golden(path, text),
        Format::TorchtitanStdout => torchtitan::read(path, text),
        Format::HfTrainerState => hf::read(path, text),
        Format::Plain => plain::read(path, text),
        Format::Tensorboard => unreachable!("handled above"),
    }
}

/// Picks a format from the file's content (the name only for TensorBoard's
/// `events.out.tfevents.*`, which is also recognised by its record framing).
pub fn detect(path: &Path, bytes: &[u8]) -> Result<Format, CurveError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.contains("tfevents") || tensorboard::looks_like(bytes) {
        return Ok(Format::Tensorboard);
    }
    let text = String::from_utf8_lossy(bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes));
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        // A whole JSON document, or JSON lines.
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(trimmed) {
            if v.get("log_history").is_some() {
                return Ok(Format::HfTrainerState);
            }
            if v.as_object()
                .is_some_and(|o| o.values().any(|x| x.get("values").is_some()))
            {
                return Ok(Format::MegatronGolden);
            }
        }
        let first = trimmed.lines().next().unwrap_or("");
        if first.contains("\"learning/loss\"") || first.contains("\"step\"") {
            return Ok(Format::MaxtextJsonl);
        }
    }
    for line in text.lines().take(100_000) {
        let line = strip_ansi(line);
        if line.contains("completed step:") {
            return Ok(Format::MaxtextStdout);
        }
        if line.contains(" iteration ") && line.contains('|') && line.contains("loss") {
            return Ok(Format::MegatronStdout);
        }
        if torchtitan::is_step_line(&line) {
            return Ok(Format::TorchtitanStdout);
        }
    }
    if plain::looks_like(&text) {
        return Ok(Format::Plain);
    }
    Err(CurveError::Unrecognised {
        path: path.to_path_buf(),
        reason: format!(
            "format not recognised; name one with --format ({})",
            Format::ALL.map(|f| f.name()).join(", ")
        ),
    })
}

/// Removes ANSI escape sequences (`ESC [ ... letter`), as torchtitan colours its log lines.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Parses a printed decimal number and returns it with its quantum: `"12.269"` gives
/// `(12.269, 0.001)`, `"1.034443E+01"` gives `(10.34443, 1e-5)`, `"1,234"` (a thousands
/// separator, as torchtitan prints tokens/s) gives `(1234, 1)`. `nan`/`inf` (any case, signed)
/// parse with quantum 0. Returns `None` for anything else.
pub fn parse_printed(token: &str) -> Option<(f64, f64)> {
    let t = token.trim();
    let lower = t.to_ascii_lowercase();
    let bare = lower.trim_start_matches(['+', '-']);
    if matches!(bare, "nan" | "inf" | "infinity") {
        return lower.parse::<f64>().ok().map(|v| (v, 0.0));
    }
    let cleaned: String = t.chars().filter(|c| *c != ',').collect();
    if cleaned.is_empty()
        || !cleaned
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
    {
        return None;
    }
    let value: f64 = cleaned.parse().ok()?;
    let (mantissa, exponent) = match cleaned.find(['e', 'E']) {
        Some(i) => (&cleaned[..i], cleaned[i + 1..].parse::<i32>().ok()?),
        None => (cleaned.as_str(), 0),
    };
    let decimals = mantissa.find('.').map_or(0, |i| mantissa.len() - i - 1) as i32;
    Some((value, 10f64.powi(exponent - decimals)))
}

/// The spacing of f32 values near `v`: the quantum of a value that was an f32 before it was
/// logged (MaxText metrics, TensorBoard `simple_value`).
pub fn f32_quantum(v: f64) -> f64 {
    if !v.is_finite() {
        return 0.0;
    }
    let x = v as f32;
    let next = f32::from_bits(x.abs().to_bits() + 1);
    (next - x.abs()) as f64
}

/// Finds `key` in `line` and parses the printed number that follows it (up to whitespace, `|`,
/// or a `,` that is not a thousands separator). Returns `Some(Err(token))` when the key is
/// present but its value is not a number.
pub(crate) fn value_after<'a>(line: &'a str, key: &str) -> Option<Result<(f64, f64), &'a str>> {
    // The key must start a word: `loss:` does not match inside `lm_loss:`.
    let at = line.match_indices(key).map(|(i, _)| i).find(|&i| {
        !line[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })? + key.len();
    let rest = line[at..].trim_start();
    let end = rest
        .char_indices()
        .find(|&(i, c)| {
            c.is_whitespace()
                || c == '|'
                || c == '('
                || (c == ',' && !rest[i + 1..].chars().take(3).all(|d| d.is_ascii_digit()))
        })
        .map_or(rest.len(), |(i, _)| i);
    let token = &rest[..end];
    Some(parse_printed(token).ok_or(token))
}

/// Python's `json.dumps` writes non-finite floats as the bare tokens `NaN`, `Infinity` and
/// `-Infinity`, which strict JSON (and serde_json) refuses. This quotes them (outside strings)
/// so that [`json_number`] can read them back.
pub(crate) fn quote_python_nonfinite(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_string = true;
        }
        let token = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|t| rest.starts_with(t));
        if let Some(t) = token {
            out.push('"');
            out.push_str(t);
            out.push('"');
            rest = &rest[t.len()..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// A JSON number, or one of the strings `"NaN"`, `"Infinity"`, `"-Infinity"` (any case,
/// `nan`/`inf` too) that stand for non-finite values.
pub(crate) fn json_number(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => {
            let l = s.to_ascii_lowercase();
            match l.trim_start_matches(['+', '-']) {
                "nan" => Some(f64::NAN),
                "inf" | "infinity" => Some(if l.starts_with('-') {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                }),
                _ => None,
            }
        }
        _ => None,
    }
}

/// A JSON step number: a non-negative integer, written as `3` or `3.0` (MaxText writes
/// `float(step)`), or a string of digits (Megatron golden values key steps by strings).
pub(crate) fn json_step(v: &serde_json::Value) -> Option<u64> {
    match v {
        serde_json::Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 9.0e15)
                .map(|f| f as u64)
        }),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_numbers_carry_their_quantum() {
        assert_eq!(parse_printed("12.269"), Some((12.269, 1e-3)));
        let (v, q) = parse_printed("1.034443E+01").unwrap();
        assert!((v - 10.34443).abs() < 1e-12 && (q - 1e-5).abs() < 1e-18);
        assert_eq!(parse_printed("1,234"), Some((1234.0, 1.0)));
        assert!(parse_printed("nan").unwrap().0.is_nan());
        assert_eq!(parse_printed("-inf").unwrap().0, f64::NEG_INFINITY);
        assert_eq!(parse_printed("12.2x"), None);
        assert_eq!(parse_printed(""), None);
    }

    #[test]
    fn value_after_stops_at_separators_but_not_thousands() {
        let l = "step:  3  loss:  7.1234  tps: 1,234  mfu: 1.2%";
        assert_eq!(value_after(l, "loss:"), Some(Ok((7.1234, 1e-4))));
        assert_eq!(value_after(l, "tps:"), Some(Ok((1234.0, 1.0))));
        assert_eq!(value_after(l, "mfu:"), Some(Err("1.2%")));
        assert_eq!(value_after("a: 1.5, b: 2", "a:"), Some(Ok((1.5, 0.1))));
        assert_eq!(value_after(l, "nothing:"), None);
        let m = "total_weights: 9, moe_lb_loss: 0.5, loss: 8.270, lm_loss: 8.1";
        assert_eq!(value_after(m, "loss:"), Some(Ok((8.27, 1e-3))));
    }

    #[test]
    fn python_nonfinite_tokens_become_strings_outside_strings_only() {
        let t = r#"{"a": NaN, "b": -Infinity, "c": "NaN x", "d": Infinity}"#;
        let v: serde_json::Value = serde_json::from_str(&quote_python_nonfinite(t)).unwrap();
        assert!(json_number(&v["a"]).unwrap().is_nan());
        assert_eq!(json_number(&v["b"]), Some(f64::NEG_INFINITY));
        assert_eq!(v["c"], "NaN x");
        assert_eq!(json_number(&v["d"]), Some(f64::INFINITY));
        assert_eq!(json_step(&serde_json::json!(3.0)), Some(3));
        assert_eq!(json_step(&serde_json::json!(3.5)), None);
        assert_eq!(json_step(&serde_json::json!("12")), Some(12));
    }

    #[test]
    fn ansi_codes_are_stripped() {
        assert_eq!(strip_ansi("\u{1b}[36mstep: 1\u{1b}[39m x"), "step: 1 x");
    }

    #[test]
    fn f32_quantum_is_the_f32_spacing() {
        assert_eq!(f32_quantum(1.0), f32::EPSILON as f64);
        assert_eq!(f32_quantum(8.0), 8.0 * f32::EPSILON as f64);
    }
}
