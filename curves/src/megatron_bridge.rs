//! Megatron-Bridge functional-test golden values.
//!
//! One JSON object keyed by step: `{"0": {"lm loss": 10.84, "elapsed time per iteration (ms)":
//! 1840.2, "GPU utilization": 412.5}, "1": {...}, ..., "alloc": 51234.0, "max_alloc":
//! 61234.0}`. A top-level key made of digits only is a step (up to 2^53, or the file is
//! refused naming the key) and must hold an object of metrics; every other top-level key
//! (`alloc`, `max_alloc`: memory figures of the whole run) is not a step and is not read.
//! Per step: `"lm loss"` is the loss, `"elapsed time per iteration (ms)"` the step time
//! (converted to s) and `"GPU utilization"` TFLOP/s per GPU (despite its name a throughput, not
//! a percentage: NVIDIA's cloudai reads the same field as TFLOP/s per GPU); other keys of a
//! step are not read, and a step without `"lm loss"` has no loss sample. Values may
//! be `NaN`/`"nan"` (Python's bare tokens too). The numbers are JSON floats: their quantum is
//! the f32 spacing, as for the older layout ([`crate::megatron`]). Line numbers point at the
//! line of the step's key. This layout is told apart from the older `{"lm loss": {"values":
//! ...}}` by its digit keys.

use std::collections::HashMap;
use std::path::Path;

use crate::parse::{
    f32_quantum, json_number, malformed, quote_python_nonfinite, MAX_STEP, STEP_RANGE,
};
use crate::{Curve, CurveError, LogFormat, Metric, Sample};

/// Per-step keys read, their metric and the factor to its unit.
const FIELDS: [(&str, Metric, f64); 3] = [
    ("lm loss", Metric::Loss, 1.0),
    ("elapsed time per iteration (ms)", Metric::StepTimeS, 1e-3),
    ("GPU utilization", Metric::Tflops, 1.0),
];

/// A top-level key that names a step: digits only.
fn is_step_key(k: &str) -> bool {
    !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit())
}

/// A parsed JSON document in this layout: an object with a digit key holding an object.
pub fn looks_like(v: &serde_json::Value) -> bool {
    v.as_object()
        .is_some_and(|o| o.iter().any(|(k, x)| is_step_key(k) && x.is_object()))
}

pub fn read(path: &Path, text: &str) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::MegatronBridgeGolden);
    let v: serde_json::Value = serde_json::from_str(&quote_python_nonfinite(text))
        .map_err(|e| malformed(path, e.line().max(1), format!("not valid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| malformed(path, 1, "golden values must be a JSON object keyed by step"))?;
    let lines = top_level_key_lines(text);
    let mut steps = Vec::new();
    for (k, entry) in obj.iter().filter(|(k, _)| is_step_key(k)) {
        let line = lines.get(k.as_str()).copied().unwrap_or(1);
        let step = k
            .parse::<u64>()
            .ok()
            .filter(|s| *s <= MAX_STEP)
            .ok_or_else(|| {
                malformed(path, line, format!("step key \"{k}\" is not {STEP_RANGE}"))
            })?;
        let fields = entry.as_object().ok_or_else(|| {
            malformed(
                path,
                line,
                format!("step \"{k}\": {entry} is not an object of metrics"),
            )
        })?;
        steps.push((step, line, fields));
    }
    steps.sort_by_key(|s| s.0);
    for (step, line, fields) in steps {
        for (key, metric, scale) in FIELDS {
            let Some(raw) = fields.get(key) else { continue };
            let value = json_number(raw).ok_or_else(|| {
                malformed(
                    path,
                    line,
                    format!("step \"{step}\": \"{key}\" is {raw}, not a number"),
                )
            })?;
            curve.push(
                metric,
                Sample {
                    step,
                    value: value * scale,
                    line,
                    quantum: f32_quantum(value) * scale,
                },
            );
        }
    }
    Ok(curve)
}

/// The 1-based line of each key of the top-level object (the first, if a key repeats), found
/// in one pass that skips strings (escapes included) and tracks nesting.
fn top_level_key_lines(text: &str) -> HashMap<&str, usize> {
    let mut out = HashMap::new();
    let bytes = text.as_bytes();
    let (mut depth, mut line, mut at) = (0usize, 1usize, 0usize);
    while at < bytes.len() {
        match bytes[at] {
            b'\n' => line += 1,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let (start, key_line) = (at + 1, line);
                at += 1;
                while at < bytes.len() && bytes[at] != b'"' {
                    match bytes[at] {
                        b'\\' => at += 1,
                        b'\n' => line += 1,
                        _ => {}
                    }
                    at += 1;
                }
                let end = at.min(bytes.len());
                let next = bytes[(end + 1).min(bytes.len())..]
                    .iter()
                    .find(|b| !b.is_ascii_whitespace());
                if depth == 1 && next == Some(&b':') {
                    if let Some(key) = text.get(start..end) {
                        out.entry(key).or_insert(key_line);
                    }
                }
            }
            _ => {}
        }
        at += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_lines_are_top_level_keys_only() {
        let t =
            "{\n \"alloc\": 1,\n \"3\": {\"3\": 2, \"s\": \"a\\\"4\\\": \"},\n\n \"4\":\n {}\n}";
        let lines = top_level_key_lines(t);
        assert_eq!(lines.get("alloc"), Some(&2));
        assert_eq!(lines.get("3"), Some(&3));
        assert_eq!(lines.get("4"), Some(&5));
        assert_eq!(lines.get("s"), None);
    }
}
