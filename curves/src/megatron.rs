//! Megatron-LM logs.
//!
//! *stdout*: `training_log` prints one line per `--log-interval`, for example
//! ` [2024-09-20 19:40:51] iteration        1/     100 | consumed samples:          256 |
//! elapsed time per iteration (ms): 46555.7 | throughput per GPU (TFLOP/s/GPU): 58.4 |
//! learning rate: 2.000000E-07 | global batch size:   256 | lm loss: 1.037833E+01 | ...`,
//! possibly after a launcher's rank prefix (`3: `). Losses are printed `{:.6E}` (logging
//! precision 1e-6 relative: `1.037833E+01` has quantum 1e-5). The step time is converted from
//! ms to s. Lines without `iteration N/ M |` are skipped; a line with it but without `lm loss:`
//! is skipped too (validation and skipped-iteration lines), unless it shows a malformed value.
//!
//! *golden values* (tests/functional_tests/.../golden_values_*.json): an object of metrics,
//! each `{"start_step": a, "end_step": b, "step_interval": s, "values": ...}` where `values` is
//! either an object keyed by step (`{"1": 10.85, ...}`, current releases) or a list holding
//! the values at `a, a+s, ...` (older releases; `start_step` and `step_interval` default to 1).
//! `start_step` must be a whole number from 0 and `step_interval` from 1, both up to 2^53, and
//! every step they give must stay within 2^53: anything else is refused, naming the field.
//! Metric names: `"lm loss"` and `"iteration-time"` (seconds). Values may be `"nan"`. They were
//! f32 on device: quantum is the f32 spacing. Line numbers for golden files point at the line of the metric's key.

use std::path::Path;

use crate::parse::{
    f32_quantum, json_number, json_step, malformed, quote_python_nonfinite, value_after, MAX_STEP,
    STEP_RANGE,
};
use crate::{Curve, CurveError, LogFormat, Metric, Sample};

pub fn read_stdout(path: &Path, text: &str) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::MegatronStdout);
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let Some(at) = raw.find(" iteration ") else {
            continue;
        };
        let line = &raw[at..];
        let after = line[" iteration ".len()..].trim_start();
        let Some(slash) = after.find('/') else {
            continue;
        };
        let head = after[..slash].trim();
        if head.is_empty() || !head.chars().all(|c| c.is_ascii_digit()) {
            // Prose that happens to contain the word "iteration".
            continue;
        }
        let step = head
            .parse::<u64>()
            .ok()
            .filter(|s| *s <= MAX_STEP)
            .ok_or_else(|| malformed(path, n, format!("iteration `{head}` is not {STEP_RANGE}")))?;
        let mut push = |metric, key: &str, scale: f64| -> Result<(), CurveError> {
            match value_after(line, key) {
                Some(Ok((v, q))) => {
                    curve.push(
                        metric,
                        Sample {
                            step,
                            value: v * scale,
                            line: n,
                            quantum: q * scale,
                        },
                    );
                    Ok(())
                }
                Some(Err(tok)) => Err(malformed(
                    path,
                    n,
                    format!("`{key}` value `{tok}` is not a number"),
                )),
                None => Ok(()),
            }
        };
        push(Metric::Loss, "lm loss:", 1.0)?;
        push(Metric::StepTimeS, "elapsed time per iteration (ms):", 1e-3)?;
        push(Metric::Tflops, "throughput per GPU (TFLOP/s/GPU):", 1.0)?;
        push(Metric::TokensPerS, "throughput (token/sec/GPU):", 1.0)?;
    }
    Ok(curve)
}

const GOLDEN_FIELDS: [(&str, Metric); 2] = [
    ("lm loss", Metric::Loss),
    ("iteration-time", Metric::StepTimeS),
];

pub fn read_golden(path: &Path, text: &str) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::MegatronGolden);
    let v: serde_json::Value = serde_json::from_str(&quote_python_nonfinite(text))
        .map_err(|e| malformed(path, e.line().max(1), format!("not valid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| malformed(path, 1, "golden values must be a JSON object of metrics"))?;
    for (key, metric) in GOLDEN_FIELDS {
        let Some(entry) = obj.get(key) else { continue };
        let line = line_of(text, &format!("\"{key}\""));
        let bad = |reason: &str| malformed(path, line, format!("\"{key}\": {reason}"));
        let values = entry.get("values").ok_or_else(|| bad("no \"values\""))?;
        // Checked whenever present (a broken file shows here even when the steps are keys);
        // used by the list layout, whose steps are `start, start + interval, ...`.
        let field = |name: &str, least: u64| -> Result<u64, CurveError> {
            let Some(raw) = entry.get(name) else {
                return Ok(1);
            };
            json_step(raw).filter(|v| *v >= least).ok_or_else(|| {
                let range = if least == 0 { "0" } else { "1" };
                bad(&format!(
                    "\"{name}\" is {raw}, not a whole number from {range} to 2^53"
                ))
            })
        };
        let start = field("start_step", 0)?;
        let interval = field("step_interval", 1)?;
        let mut push = |step: u64, raw: &serde_json::Value| -> Result<(), CurveError> {
            let value = json_number(raw)
                .ok_or_else(|| bad(&format!("value at step {step} is not a number")))?;
            curve.push(
                metric,
                Sample {
                    step,
                    value,
                    line,
                    quantum: f32_quantum(value),
                },
            );
            Ok(())
        };
        match values {
            serde_json::Value::Object(map) => {
                let mut pairs = Vec::with_capacity(map.len());
                for (k, raw) in map {
                    let step = json_step(&serde_json::Value::String(k.clone()))
                        .ok_or_else(|| bad(&format!("step key \"{k}\" is not {STEP_RANGE}")))?;
                    pairs.push((step, raw));
                }
                pairs.sort_by_key(|p| p.0);
                for (step, raw) in pairs {
                    push(step, raw)?;
                }
            }
            serde_json::Value::Array(list) => {
                for (j, raw) in list.iter().enumerate() {
                    let step = (j as u64)
                        .checked_mul(interval)
                        .and_then(|d| d.checked_add(start))
                        .filter(|s| *s <= MAX_STEP)
                        .ok_or_else(|| {
                            bad(&format!(
                                "value {j} falls at step {start} + {j}·{interval}, beyond 2^53"
                            ))
                        })?;
                    push(step, raw)?;
                }
            }
            _ => return Err(bad("\"values\" is neither an object nor a list")),
        }
    }
    Ok(curve)
}

/// 1-based line of the first occurrence of `needle` (1 when absent).
fn line_of(text: &str, needle: &str) -> usize {
    text.find(needle)
        .map_or(1, |at| 1 + text[..at].matches('\n').count())
}
