//! Any text log, read line by line with a user's regular expression (`--pattern REGEX`), for
//! the formats no reader knows.
//!
//! The expression (Rust `regex` syntax, no look-around or back-references) must have the
//! named groups `step` and `value`: `step:(?P<step>\d+) .* loss=(?P<value>\S+)`. Each line,
//! its ANSI colour codes stripped, is searched (not anchored: add `^`/`$` to anchor); a line
//! that does not match is skipped. On a line that matches, `step` must capture a whole number
//! from 0 to 2^53 (`1,000` and `12.0` are accepted) and `value` a printed number (`nan`/`inf`
//! included), whose quantum is read from its printed decimals, or the line is refused with its
//! number; a group that took no part in the match (inside `(...)?`) is refused the same way.
//! The values are one metric, the one the caller names (the CLI's `--metric`, default
//! `loss`). A file in which no line matches is refused, naming the file and the expression.

use std::path::Path;

use regex::Regex;

use crate::parse::{malformed, parse_printed, strip_ansi, whole_step, STEP_RANGE};
use crate::{Curve, CurveError, LogFormat, Metric, Sample};

/// The named groups a pattern must have.
const GROUPS: [&str; 2] = ["step", "value"];

/// A compiled `--pattern`: a regular expression with the named groups `step` and `value`.
#[derive(Debug, Clone)]
pub struct LinePattern {
    regex: Regex,
}

impl LinePattern {
    /// Compiles `source`, refusing ([`CurveError::Pattern`], one line) an expression that
    /// does not compile or lacks a named group `step` or `value`.
    pub fn new(source: &str) -> Result<LinePattern, CurveError> {
        let refuse = |reason: String| CurveError::Pattern {
            pattern: one_line(source),
            reason,
        };
        let regex = Regex::new(source).map_err(|e| refuse(regex_reason(&e)))?;
        let names: Vec<&str> = regex.capture_names().flatten().collect();
        let missing: Vec<&str> = GROUPS.into_iter().filter(|g| !names.contains(g)).collect();
        if !missing.is_empty() {
            return Err(refuse(format!(
                "needs the named groups (?P<step>...) and (?P<value>...); it has no {}",
                missing
                    .iter()
                    .map(|g| format!("`{g}`"))
                    .collect::<Vec<_>>()
                    .join(" and no ")
            )));
        }
        Ok(LinePattern { regex })
    }

    /// The expression as given.
    pub fn as_str(&self) -> &str {
        self.regex.as_str()
    }
}

/// `s` on one line: newlines and carriage returns written as `\n` and `\r`.
fn one_line(s: &str) -> String {
    s.replace('\n', "\\n").replace('\r', "\\r")
}

/// The `regex` crate's reason on one line: its `error: ...` line (the rest of its message
/// repeats the expression with a caret under the fault).
fn regex_reason(e: &regex::Error) -> String {
    let text = e.to_string();
    let reason = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("error:"))
        .map(str::trim)
        .map(str::to_string)
        .unwrap_or_else(|| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; ")
        });
    format!("does not compile: {reason}")
}

pub fn read(
    path: &Path,
    text: &str,
    pattern: &LinePattern,
    metric: Metric,
) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::Pattern);
    let mut lines = 0;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        lines = n;
        let line = strip_ansi(raw);
        let Some(caps) = pattern.regex.captures(&line) else {
            continue;
        };
        let group = |name: &str| -> Result<&str, CurveError> {
            caps.name(name).map(|m| m.as_str()).ok_or_else(|| {
                malformed(
                    path,
                    n,
                    format!("the line matches --pattern but its group `{name}` took no part in the match"),
                )
            })
        };
        let step_text = group("step")?;
        let step = parse_printed(step_text)
            .and_then(|(v, _)| whole_step(v))
            .ok_or_else(|| {
                malformed(
                    path,
                    n,
                    format!("--pattern group `step` captured `{step_text}`, not {STEP_RANGE}"),
                )
            })?;
        let value_text = group("value")?;
        let (value, quantum) = parse_printed(value_text).ok_or_else(|| {
            malformed(
                path,
                n,
                format!("--pattern group `value` captured `{value_text}`, not a number"),
            )
        })?;
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
    if curve.metrics.is_empty() {
        return Err(CurveError::Unrecognised {
            path: path.to_path_buf(),
            reason: format!(
                "no line matched the pattern (--pattern `{}`; {lines} line(s) read)",
                one_line(pattern.as_str())
            ),
        });
    }
    Ok(curve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regex_error_is_one_line_naming_the_fault() {
        let e = LinePattern::new(r"step (?P<step>\d+")
            .unwrap_err()
            .to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.starts_with(r"--pattern `step (?P<step>\d+`: does not compile: "),
            "{e}"
        );
        assert!(e.contains("unclosed group"), "{e}");
    }

    #[test]
    fn both_named_groups_are_required() {
        let e = LinePattern::new(r"(?P<step>\d+) (\S+)")
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("it has no `value`"), "{e}");
        let e = LinePattern::new(r"(\d+)\n(\S+)").unwrap_err().to_string();
        assert!(e.ends_with("it has no `step` and no `value`"), "{e}");
        assert!(e.starts_with(r"--pattern `(\d+)\n(\S+)`"), "{e}");
        assert!(LinePattern::new(r"(?<step>\d+) (?P<value>\S+)").is_ok());
    }
}
