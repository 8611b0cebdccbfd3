//! MaxText logs.
//!
//! *stdout*: `MetricLogger.log_metrics` prints, through `max_logging.log` (so possibly after an
//! absl/logging prefix such as `I1202 12:00:00.1 140 max_logging.py:12] `),
//! `completed step: N, seconds: S, TFLOP/s/device: X, Tokens/s/device: Y, total_weights: W,
//! loss: L` with `:.3f` for every float (newer versions append `, lm_loss: ...` and the MoE
//! losses). Logging precision of the loss: 0.001. Other lines are skipped.
//!
//! *metrics file* (`metrics_file=...`): `write_metrics_locally` appends `json.dumps` of
//! `{<every scalar metric>: float, "step": float(step), "run_name": ...}` a line; the loss is
//! `"learning/loss"`, the step time `"perf/step_time_seconds"`, throughput
//! `"perf/per_device_tokens_per_sec"` and `"perf/per_device_tflops_per_sec"` (older releases:
//! `"perf/per_device_tflops"`). The values were f32 on device, so their quantum is the f32
//! spacing. Lines without `"learning/loss"` (evaluation lines) contribute no loss sample.

use std::path::Path;

use crate::parse::{
    f32_quantum, json_number, json_step, malformed, push_fields, quote_python_nonfinite,
    step_after, STEP_RANGE,
};
use crate::{Curve, CurveError, LogFormat, Metric, Sample};

const STDOUT_FIELDS: [(&str, Metric); 4] = [
    ("seconds:", Metric::StepTimeS),
    ("TFLOP/s/device:", Metric::Tflops),
    ("Tokens/s/device:", Metric::TokensPerS),
    ("loss:", Metric::Loss),
];

pub fn read_stdout(path: &Path, text: &str) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::MaxtextStdout);
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let Some(at) = line.find("completed step:") else {
            continue;
        };
        let line = &line[at..];
        let step = step_after(path, n, line, "completed step:")?;
        let found = push_fields(&mut curve, (path, n), line, step, &STDOUT_FIELDS)?;
        if !found.contains(&Metric::Loss) {
            return Err(malformed(path, n, "`completed step:` line has no `loss:`"));
        }
    }
    Ok(curve)
}

const JSON_FIELDS: [(&str, Metric); 5] = [
    ("learning/loss", Metric::Loss),
    ("perf/step_time_seconds", Metric::StepTimeS),
    ("perf/per_device_tokens_per_sec", Metric::TokensPerS),
    ("perf/per_device_tflops_per_sec", Metric::Tflops),
    ("perf/per_device_tflops", Metric::Tflops),
];

pub fn read_jsonl(path: &Path, text: &str) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::MaxtextJsonl);
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&quote_python_nonfinite(line))
            .map_err(|e| malformed(path, n, format!("not a JSON object: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| malformed(path, n, "not a JSON object"))?;
        let step = obj
            .get("step")
            .and_then(json_step)
            .ok_or_else(|| malformed(path, n, format!("\"step\" is not {STEP_RANGE}")))?;
        let mut tflops_seen = false;
        for (key, metric) in JSON_FIELDS {
            let Some(raw) = obj.get(key) else { continue };
            let value = json_number(raw)
                .ok_or_else(|| malformed(path, n, format!("\"{key}\" is not a number")))?;
            if metric == Metric::Tflops {
                if tflops_seen {
                    continue;
                }
                tflops_seen = true;
            }
            curve.push(
                metric,
                Sample {
                    step,
                    value,
                    line: n,
                    quantum: f32_quantum(value),
                },
            );
        }
    }
    Ok(curve)
}
