//! Reading a log file: detecting its format and handing it to that format's reader, or reading
//! it with a user's line pattern.

use std::path::Path;

use crate::parse::{malformed, quote_python_nonfinite, strip_ansi};
use crate::pattern::{self, LinePattern};
use crate::{hf, maxtext, megatron, megatron_bridge, nanogpt, plain, tensorboard, torchtitan};
use crate::{Curve, CurveError, LogFormat, Metric};

/// Reads `path` as `format`, or detects the format when `format` is `None`. An empty file (or
/// one of only whitespace) is [`CurveError::Empty`] whatever the format. [`LogFormat::Pattern`]
/// needs its expression: [`read_pattern`].
pub fn read(path: &Path, format: Option<LogFormat>) -> Result<Curve, CurveError> {
    if format == Some(LogFormat::Pattern) {
        return Err(CurveError::Unrecognised {
            path: path.to_path_buf(),
            reason: "the pattern format needs a regular expression (--pattern REGEX)".into(),
        });
    }
    let bytes = load(path)?;
    let format = match format {
        Some(f) => f,
        None => detect(path, &bytes)?,
    };
    if format == LogFormat::Tensorboard {
        return tensorboard::read(path, &bytes);
    }
    let text = utf8(path, &bytes)?;
    match format {
        LogFormat::MaxtextStdout => maxtext::read_stdout(path, text),
        LogFormat::MaxtextJsonl => maxtext::read_jsonl(path, text),
        LogFormat::MegatronStdout => megatron::read_stdout(path, text),
        LogFormat::MegatronGolden => megatron::read_golden(path, text),
        LogFormat::MegatronBridgeGolden => megatron_bridge::read(path, text),
        LogFormat::Nanogpt => nanogpt::read(path, text),
        LogFormat::TorchtitanStdout => torchtitan::read(path, text),
        LogFormat::HfTrainerState => hf::read(path, text),
        LogFormat::Plain => plain::read(path, text),
        LogFormat::Tensorboard | LogFormat::Pattern => unreachable!("handled above"),
    }
}

/// Reads `path` line by line with `pattern` (see [`LinePattern`]), its values as `metric`.
pub fn read_pattern(
    path: &Path,
    pattern: &LinePattern,
    metric: Metric,
) -> Result<Curve, CurveError> {
    let bytes = load(path)?;
    pattern::read(path, utf8(path, &bytes)?, pattern, metric)
}

/// The file's bytes; an empty file (or one of only whitespace, after a byte-order mark) is
/// refused.
fn load(path: &Path) -> Result<Vec<u8>, CurveError> {
    let bytes = std::fs::read(path).map_err(|source| CurveError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let body = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(CurveError::Empty {
            path: path.to_path_buf(),
            blank: !body.is_empty(),
        });
    }
    Ok(bytes)
}

/// The file as text, without a UTF-8 byte-order mark (Windows editors write one; it is not
/// part of the log); bytes that are not UTF-8 are refused with their line.
fn utf8<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a str, CurveError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    std::str::from_utf8(bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        malformed(path, line, "not UTF-8 text")
    })
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
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&quote_python_nonfinite(trimmed)) {
            if v.get("log_history").is_some() {
                return Ok(LogFormat::HfTrainerState);
            }
            if v.as_object()
                .is_some_and(|o| o.values().any(|x| x.get("values").is_some()))
            {
                return Ok(LogFormat::MegatronGolden);
            }
            if megatron_bridge::looks_like(&v) {
                return Ok(LogFormat::MegatronBridgeGolden);
            }
        }
        let first = trimmed.lines().next().unwrap_or("");
        if first.contains("\"learning/loss\"") || first.contains("\"step\"") {
            return Ok(LogFormat::MaxtextJsonl);
        }
    }
    for line in text.lines().take(100_000) {
        let line = strip_ansi(line);
        if nanogpt::is_step_line(&line) {
            return Ok(LogFormat::Nanogpt);
        }
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
