//! torchtitan stdout.
//!
//! The trainer logs one line per `log_freq` steps, coloured with ANSI escape codes, e.g.
//! `[titan] 2025-03-01 10:00:00,123 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss: 12.2498
//! \x1b[33mmemory: 39.10GiB(41.16%)  \x1b[34mtps: 1,234  \x1b[36mtflops: 12.34
//! \x1b[35mmfu: 1.23%\x1b[39m` (older releases: `wps:` instead of `tps:`; newer ones add
//! `grad_norm:` and print the loss `:8.5f`). The escape codes are stripped first; the loss's
//! quantum is read from its printed decimals (`:7.4f` gives 1e-4). Lines without `step:` and
//! `loss:` are skipped, as are `evaluation:` lines.

use std::path::Path;

use crate::parse::{push_fields, step_after, strip_ansi, value_after};
use crate::{Curve, CurveError, LogFormat, Metric};

/// A training-step line once colours are stripped: `step: N` followed by `loss: X`.
pub fn is_step_line(line: &str) -> bool {
    !line.contains("evaluation:")
        && line.contains("loss:")
        && matches!(value_after(line, "step:"), Some(Ok(_)))
        && line.find("step:") < line.find("loss:")
}

pub fn read(path: &Path, text: &str) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::TorchtitanStdout);
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = strip_ansi(raw);
        if line.contains("evaluation:") || !line.contains("step:") || !line.contains("loss:") {
            continue;
        }
        let step = step_after(path, n, &line, "step:")?;
        push_fields(
            &mut curve,
            (path, n),
            &line,
            step,
            &[
                ("loss:", Metric::Loss),
                ("tps:", Metric::TokensPerS),
                ("wps:", Metric::TokensPerS),
                ("tflops:", Metric::Tflops),
            ],
        )?;
    }
    Ok(curve)
}
