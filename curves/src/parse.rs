//! Parsing helpers the readers share: printed decimals with their logging quantum, the f32
//! spacing, `key: value` fields in a log line, ANSI colour codes, Python's non-finite JSON
//! tokens, and the [`CurveError::Malformed`] every reader returns for a bad line.

use std::path::Path;

use crate::{Curve, CurveError, Metric, Sample};

/// A [`CurveError::Malformed`] naming `path` and the 1-based `line`.
pub(crate) fn malformed(path: &Path, line: usize, reason: impl Into<String>) -> CurveError {
    CurveError::Malformed {
        path: path.to_path_buf(),
        line,
        reason: reason.into(),
    }
}

/// Removes ANSI escape sequences (`ESC [ ... letter`), as torchtitan colours its log lines.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Parses a printed decimal number and returns it with its quantum: `"12.269"` gives
/// `(12.269, 0.001)`, `"1.034443E+01"` gives `(10.34443, 1e-5)`, `"1,234"` (a thousands
/// separator, as torchtitan prints tokens/s) gives `(1234, 1)`. `nan`/`inf` (any case, signed)
/// parse with quantum 0. Returns `None` for anything else.
pub fn parse_printed(token: &str) -> Option<(f64, f64)> {
    let t = token.trim();
    let lower = t.to_ascii_lowercase();
    let bare = lower.trim_start_matches(['+', '-']);
    if matches!(bare, "nan" | "inf" | "infinity") {
        return lower.parse::<f64>().ok().map(|v| (v, 0.0));
    }
    let cleaned: String = t.chars().filter(|c| *c != ',').collect();
    if cleaned.is_empty()
        || !cleaned
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
    {
        return None;
    }
    let value: f64 = cleaned.parse().ok()?;
    let (mantissa, exponent) = match cleaned.find(['e', 'E']) {
        Some(i) => (&cleaned[..i], cleaned[i + 1..].parse::<i32>().ok()?),
        None => (cleaned.as_str(), 0),
    };
    let decimals = mantissa.find('.').map_or(0, |i| mantissa.len() - i - 1) as i32;
    Some((value, 10f64.powi(exponent - decimals)))
}

/// The spacing of f32 values near `v`: the quantum of a value that was an f32 before it was
/// logged (MaxText metrics, TensorBoard `simple_value`).
pub fn f32_quantum(v: f64) -> f64 {
    if !v.is_finite() {
        return 0.0;
    }
    let x = v as f32;
    let next = f32::from_bits(x.abs().to_bits() + 1);
    (next - x.abs()) as f64
}

/// Finds `key` in `line` and parses the printed number that follows it (up to whitespace, `|`,
/// or a `,` that is not a thousands separator). Returns `Some(Err(token))` when the key is
/// present but its value is not a number.
pub(crate) fn value_after<'a>(line: &'a str, key: &str) -> Option<Result<(f64, f64), &'a str>> {
    // The key must start a word: `loss:` does not match inside `lm_loss:`.
    let at = line.match_indices(key).map(|(i, _)| i).find(|&i| {
        !line[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })? + key.len();
    let rest = line[at..].trim_start();
    let end = rest
        .char_indices()
        .find(|&(i, c)| {
            c.is_whitespace()
                || c == '|'
                || c == '('
                || (c == ',' && !rest[i + 1..].chars().take(3).all(|d| d.is_ascii_digit()))
        })
        .map_or(rest.len(), |(i, _)| i);
    let token = &rest[..end];
    Some(parse_printed(token).ok_or(token))
}

/// Python's `json.dumps` writes non-finite floats as the bare tokens `NaN`, `Infinity` and
/// `-Infinity`, which strict JSON (and serde_json) refuses. This quotes them (outside strings)
/// so that [`json_number`] can read them back.
pub(crate) fn quote_python_nonfinite(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_string = true;
        }
        let token = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|t| rest.starts_with(t));
        if let Some(t) = token {
            out.push('"');
            out.push_str(t);
            out.push('"');
            rest = &rest[t.len()..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// A JSON number, or one of the strings `"NaN"`, `"Infinity"`, `"-Infinity"` (any case,
/// `nan`/`inf` too) that stand for non-finite values.
pub(crate) fn json_number(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => {
            let l = s.to_ascii_lowercase();
            match l.trim_start_matches(['+', '-']) {
                "nan" => Some(f64::NAN),
                "inf" | "infinity" => Some(if l.starts_with('-') {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                }),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The largest step any reader accepts: 2^53, below which every whole number is an f64 (the
/// criterion's slope and the plot place steps on an f64 axis; above it neighbouring steps
/// would fall onto one point, as larger values once clamped onto one u64).
pub const MAX_STEP: u64 = 1 << 53;

/// What every refused step is told: the accepted range.
pub(crate) const STEP_RANGE: &str = "a whole number from 0 to 2^53";

/// `v` as a step: a whole number in `0..=MAX_STEP`.
pub(crate) fn whole_step(v: f64) -> Option<u64> {
    (v >= 0.0 && v.fract() == 0.0 && v <= MAX_STEP as f64).then_some(v as u64)
}

/// A JSON step number: a whole number in `0..=MAX_STEP`, written as `3` or `3.0` (MaxText
/// writes `float(step)`), or a string of digits (Megatron golden values key steps by strings).
pub(crate) fn json_step(v: &serde_json::Value) -> Option<u64> {
    match v {
        serde_json::Value::Number(n) => n
            .as_u64()
            .filter(|s| *s <= MAX_STEP)
            .or_else(|| n.as_f64().and_then(whole_step)),
        serde_json::Value::String(s) => s.trim().parse().ok().filter(|s| *s <= MAX_STEP),
        _ => None,
    }
}

/// The step number after `key` on line `n` of `path` (see [`whole_step`]).
pub(crate) fn step_after(path: &Path, n: usize, line: &str, key: &str) -> Result<u64, CurveError> {
    match value_after(line, key) {
        Some(Ok((v, _))) => whole_step(v)
            .ok_or_else(|| malformed(path, n, format!("`{key}` step is not {STEP_RANGE}"))),
        _ => Err(malformed(
            path,
            n,
            format!("`{key}` is not followed by a step number"),
        )),
    }
}

/// Pushes the value after each key of `fields` on line `n` of `path` into `curve` at `step`;
/// returns the metrics found. A key whose value is not a number is a malformed line.
pub(crate) fn push_fields(
    curve: &mut Curve,
    (path, n): (&Path, usize),
    line: &str,
    step: u64,
    fields: &[(&str, Metric)],
) -> Result<Vec<Metric>, CurveError> {
    let mut found = Vec::new();
    for &(key, metric) in fields {
        match value_after(line, key) {
            Some(Ok((value, quantum))) => {
                curve.push(
                    metric,
                    Sample {
                        step,
                        value,
                        line: n,
                        quantum,
                    },
                );
                found.push(metric);
            }
            Some(Err(tok)) => {
                return Err(malformed(
                    path,
                    n,
                    format!("`{key}` value `{tok}` is not a number"),
                ))
            }
            None => {}
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_numbers_carry_their_quantum() {
        assert_eq!(parse_printed("12.269"), Some((12.269, 1e-3)));
        let (v, q) = parse_printed("1.034443E+01").unwrap();
        assert!((v - 10.34443).abs() < 1e-12 && (q - 1e-5).abs() < 1e-18);
        assert_eq!(parse_printed("1,234"), Some((1234.0, 1.0)));
        assert!(parse_printed("nan").unwrap().0.is_nan());
        assert_eq!(parse_printed("-inf").unwrap().0, f64::NEG_INFINITY);
        assert_eq!(parse_printed("12.2x"), None);
        assert_eq!(parse_printed(""), None);
    }

    #[test]
    fn value_after_stops_at_separators_but_not_thousands() {
        let l = "step:  3  loss:  7.1234  tps: 1,234  mfu: 1.2%";
        assert_eq!(value_after(l, "loss:"), Some(Ok((7.1234, 1e-4))));
        assert_eq!(value_after(l, "tps:"), Some(Ok((1234.0, 1.0))));
        assert_eq!(value_after(l, "mfu:"), Some(Err("1.2%")));
        assert_eq!(value_after("a: 1.5, b: 2", "a:"), Some(Ok((1.5, 0.1))));
        assert_eq!(value_after(l, "nothing:"), None);
        let m = "total_weights: 9, moe_lb_loss: 0.5, loss: 8.270, lm_loss: 8.1";
        assert_eq!(value_after(m, "loss:"), Some(Ok((8.27, 1e-3))));
    }

    #[test]
    fn python_nonfinite_tokens_become_strings_outside_strings_only() {
        let t = r#"{"a": NaN, "b": -Infinity, "c": "NaN x", "d": Infinity}"#;
        let v: serde_json::Value = serde_json::from_str(&quote_python_nonfinite(t)).unwrap();
        assert!(json_number(&v["a"]).unwrap().is_nan());
        assert_eq!(json_number(&v["b"]), Some(f64::NEG_INFINITY));
        assert_eq!(v["c"], "NaN x");
        assert_eq!(json_number(&v["d"]), Some(f64::INFINITY));
        assert_eq!(json_step(&serde_json::json!(3.0)), Some(3));
        assert_eq!(json_step(&serde_json::json!(3.5)), None);
        assert_eq!(json_step(&serde_json::json!("12")), Some(12));
    }

    #[test]
    fn ansi_codes_are_stripped() {
        assert_eq!(strip_ansi("\u{1b}[36mstep: 1\u{1b}[39m x"), "step: 1 x");
    }

    #[test]
    fn f32_quantum_is_the_f32_spacing() {
        assert_eq!(f32_quantum(1.0), f32::EPSILON as f64);
        assert_eq!(f32_quantum(8.0), 8.0 * f32::EPSILON as f64);
    }
}
