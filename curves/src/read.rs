//! Reading a log file: detecting its format and handing it to that format's reader.

use std::path::Path;

use crate::parse::{malformed, strip_ansi};
use crate::{hf, maxtext, megatron, plain, tensorboard, torchtitan};
use crate::{Curve, CurveError, LogFormat};

/// Reads `path` as `format`, or detects the format when `format` is `None`. An empty file (or
/// one of only whitespace) is [`CurveError::Empty`] whatever the format.
pub fn read(path: &Path, format: Option<LogFormat>) -> Result<Curve, CurveError> {
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
