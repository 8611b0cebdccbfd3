//! Plain columns: `step loss` a line, separated by spaces, a comma (CSV), a tab (TSV) or a
//! semicolon.
//!
//! An optional header line names the columns; recognised names (case-insensitive): `step`
//! (or `iteration`, `iter`, `global_step`), `loss` (or `train_loss`, `lm_loss`), `step_time_s`
//! (or `step_time`, `seconds`, `time_s`), `tokens_per_s` (or `tps`), `tflops`. Without a header
//! the first column is the step and the second the loss. Blank lines and lines starting with
//! `#` are skipped. The quantum of each value is read from its printed decimals.
//!
//! *Semicolons* (what spreadsheets write where `,` is the decimal mark): a file whose first
//! line holds a `;` is split on `;` throughout, and needs that first line to be a header naming
//! its columns — without one a `;` could as well be a stray character in a space-separated
//! log, so it is refused and the reason says so. Its values take `,` or `.` as the decimal
//! mark (`2,345` or `2.345`); a value with both (`1.234,5`: thousands and decimals) or several
//! commas is refused, naming the value, rather than guessed.

use std::path::Path;

use crate::parse::{malformed, parse_printed, whole_step, STEP_RANGE};
use crate::{Curve, CurveError, LogFormat, Metric, Sample};

/// How a file's lines split into columns, decided by its first line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sep {
    /// Each line by its own: a tab if it has one, else a comma, else whitespace.
    PerLine,
    /// `;` on every line, and `,` is a decimal mark.
    Semicolon,
}

impl Sep {
    fn of(first: &str) -> Sep {
        if first.contains(';') {
            Sep::Semicolon
        } else {
            Sep::PerLine
        }
    }

    fn split(self, line: &str) -> Vec<&str> {
        match self {
            Sep::Semicolon => line.split(';').map(str::trim).collect(),
            Sep::PerLine if line.contains('\t') => line.split('\t').map(str::trim).collect(),
            Sep::PerLine if line.contains(',') => line.split(',').map(str::trim).collect(),
            Sep::PerLine => line.split_whitespace().collect(),
        }
    }

    /// A printed number and its quantum (see [`parse_printed`]); in a semicolon file a single
    /// `,` is the decimal mark. `Err` says why a token is not a number.
    fn number(self, token: &str) -> Result<(f64, f64), String> {
        let not = || format!("`{token}` is not a number");
        if self == Sep::Semicolon && token.contains(',') {
            if token.contains('.') || token.matches(',').count() > 1 {
                return Err(format!(
                    "`{token}` is ambiguous: a semicolon-separated file takes `,` or `.` as its \
                     decimal mark, one of them once"
                ));
            }
            return parse_printed(&token.replace(',', ".")).ok_or_else(not);
        }
        parse_printed(token).ok_or_else(not)
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

/// A first line naming a step column and a metric column (then the reader says what is wrong
/// with any line below it), or at least one data line and every line blank, a comment, a
/// header or numbers only.
pub fn looks_like(text: &str) -> bool {
    let mut data = 0;
    let mut sep = Sep::PerLine;
    for (j, line) in text.lines().filter(|l| !is_comment_or_blank(l)).enumerate() {
        if j == 0 {
            sep = Sep::of(line);
            let cols = sep.split(line);
            if cols.iter().any(|c| is_step_column(c))
                && cols.iter().any(|c| column_metric(c).is_some())
            {
                return true;
            }
        }
        let cols = sep.split(line);
        let numeric = cols.len() >= 2 && cols.iter().all(|c| sep.number(c).is_ok());
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
    let mut sep = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if is_comment_or_blank(line) {
            continue;
        }
        if sep.is_none() {
            let s = Sep::of(line);
            sep = Some(s);
            let cols = s.split(line);
            if cols.iter().all(|c| s.number(c).is_ok()) {
                if s == Sep::Semicolon {
                    return Err(malformed(
                        path,
                        n,
                        "semicolon-separated values are read only under a first line naming \
                         the columns (e.g. `step;loss`), which makes `;` the separator and `,` \
                         a decimal mark; this file has none",
                    ));
                }
            } else {
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
        let sep = sep.unwrap_or(Sep::PerLine);
        let cols = sep.split(line);
        if cols.len() < width {
            return Err(malformed(
                path,
                n,
                format!("expected {width} columns, found {}", cols.len()),
            ));
        }
        let step = sep
            .number(cols[step_col])
            .ok()
            .and_then(|(v, _)| whole_step(v))
            .ok_or_else(|| {
                malformed(
                    path,
                    n,
                    format!("step `{}` is not {STEP_RANGE}", cols[step_col]),
                )
            })?;
        for &(j, metric) in &columns {
            let (value, quantum) = sep.number(cols[j]).map_err(|why| malformed(path, n, why))?;
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
