//! Plain columns: `step loss` a line, separated by spaces, a comma (CSV) or a tab (TSV).
//!
//! An optional header line names the columns; recognised names (case-insensitive): `step`
//! (or `iteration`, `iter`, `global_step`), `loss` (or `train_loss`, `lm_loss`), `step_time_s`
//! (or `step_time`, `seconds`, `time_s`), `tokens_per_s` (or `tps`), `tflops`. Without a header
//! the first column is the step and the second the loss. Blank lines and lines starting with
//! `#` are skipped. The quantum of each value is read from its printed decimals.

use std::path::Path;

use crate::parse::{malformed, parse_printed, whole_step, STEP_RANGE};
use crate::{Curve, CurveError, LogFormat, Metric, Sample};

fn split(line: &str) -> Vec<&str> {
    if line.contains('\t') {
        line.split('\t').map(str::trim).collect()
    } else if line.contains(',') {
        line.split(',').map(str::trim).collect()
    } else {
        line.split_whitespace().collect()
    }
}

fn is_comment_or_blank(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

fn column_metric(name: &str) -> Option<Metric> {
    match name.to_ascii_lowercase().as_str() {
        "loss" | "train_loss" | "lm_loss" | "train/loss" => Some(Metric::Loss),
        "step_time_s" | "step_time" | "seconds" | "time_s" => Some(Metric::StepTimeS),
        "tokens_per_s" | "tps" => Some(Metric::TokensPerS),
        "tflops" => Some(Metric::Tflops),
        _ => None,
    }
}

fn is_step_column(name: &str) -> bool {
    matches!(
        name.to_ascii_lowercase().as_str(),
        "step" | "iteration" | "iter" | "global_step"
    )
}

/// At least one data line, and every line is blank, a comment, a header, or numbers only.
pub fn looks_like(text: &str) -> bool {
    let mut data = 0;
    for (j, line) in text.lines().filter(|l| !is_comment_or_blank(l)).enumerate() {
        let cols = split(line);
        let numeric = cols.len() >= 2 && cols.iter().all(|c| parse_printed(c).is_some());
        if numeric {
            data += 1;
        } else if j != 0 {
            return false;
        }
    }
    data > 0
}

pub fn read(path: &Path, text: &str) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::Plain);
    let mut step_col = 0usize;
    let mut columns: Vec<(usize, Metric)> = vec![(1, Metric::Loss)];
    let mut width = 2usize;
    let mut first = true;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if is_comment_or_blank(line) {
            continue;
        }
        let cols = split(line);
        if first {
            first = false;
            if cols.iter().any(|c| parse_printed(c).is_none()) {
                // A header.
                step_col = cols.iter().position(|c| is_step_column(c)).ok_or_else(|| {
                    malformed(
                        path,
                        n,
                        "header has no `step` column (step, iteration, iter)",
                    )
                })?;
                columns = cols
                    .iter()
                    .enumerate()
                    .filter_map(|(j, c)| column_metric(c).map(|m| (j, m)))
                    .collect();
                if columns.is_empty() {
                    return Err(malformed(
                        path,
                        n,
                        "header names no known metric column (loss, step_time_s, tokens_per_s, tflops)",
                    ));
                }
                width = cols.len();
                continue;
            }
        }
        if cols.len() < width {
            return Err(malformed(
                path,
                n,
                format!("expected {width} columns, found {}", cols.len()),
            ));
        }
        let step = parse_printed(cols[step_col])
            .and_then(|(v, _)| whole_step(v))
            .ok_or_else(|| {
                malformed(
                    path,
                    n,
                    format!("step `{}` is not {STEP_RANGE}", cols[step_col]),
                )
            })?;
        for &(j, metric) in &columns {
            let (value, quantum) = parse_printed(cols[j])
                .ok_or_else(|| malformed(path, n, format!("`{}` is not a number", cols[j])))?;
            curve.push(
                metric,
                Sample {
                    step,
                    value,
                    line: n,
                    quantum,
                },
            );
        }
    }
    Ok(curve)
}
