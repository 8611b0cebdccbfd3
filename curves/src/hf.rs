//! HuggingFace `trainer_state.json`.
//!
//! `Trainer` saves `TrainerState` with `log_history`: a list of the dicts it logged, each with
//! `"step"`; training entries carry `"loss"` (rounded with `round(x, 4)` by `_maybe_log_save_
//! evaluate`, so logging precision 1e-4), `"learning_rate"`, `"grad_norm"`, `"epoch"`;
//! evaluation entries carry `"eval_loss"` instead, and the final summary entry carries
//! `"train_loss"`, `"train_runtime"`, `"train_samples_per_second"`. Only `"loss"` is read as
//! the loss. Line numbers point at the line of the entry's `"step"` key, counted in order.

use std::path::Path;

use crate::parse::{json_number, json_step, malformed, quote_python_nonfinite, STEP_RANGE};
use crate::{Curve, CurveError, LogFormat, Metric, Sample};

/// `round(loss, 4)`: the quantum of every logged loss.
pub const HF_LOSS_QUANTUM: f64 = 1e-4;

pub fn read(path: &Path, text: &str) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::HfTrainerState);
    let v: serde_json::Value = serde_json::from_str(&quote_python_nonfinite(text))
        .map_err(|e| malformed(path, e.line().max(1), format!("not valid JSON: {e}")))?;
    let history = v
        .get("log_history")
        .and_then(|h| h.as_array())
        .ok_or_else(|| malformed(path, 1, "no \"log_history\" list"))?;
    // Line of each entry: the n-th `"step"` key in the text (entries hold one each).
    let step_lines: Vec<usize> = text
        .match_indices("\"step\"")
        .map(|(at, _)| 1 + text[..at].matches('\n').count())
        .collect();
    for (j, entry) in history.iter().enumerate() {
        let line = step_lines.get(j).copied().unwrap_or(1);
        let Some(loss) = entry.get("loss") else {
            continue;
        };
        let step = entry.get("step").and_then(json_step).ok_or_else(|| {
            malformed(
                path,
                line,
                format!("log_history[{j}] \"step\" is missing or not {STEP_RANGE}"),
            )
        })?;
        let value = json_number(loss).ok_or_else(|| {
            malformed(
                path,
                line,
                format!("log_history[{j}] \"loss\" is not a number"),
            )
        })?;
        curve.push(
            Metric::Loss,
            Sample {
                step,
                value,
                line,
                quantum: HF_LOSS_QUANTUM,
            },
        );
    }
    Ok(curve)
}
