//! A worker's greeting and answer lines (`{"ok": true}`, `{"ok": false, "error": ...}`,
//! `{"ok": false, "unsupported": ...}`) and how a worker's text is shown in a message: one
//! line, control characters escaped, clipped.

use serde_json::Value;

use super::WORKER_PROTOCOL;

/// What a worker answered about one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer {
    /// `{"ok": true}`: the outputs are written.
    Done,
    /// `{"ok": false, "error": "..."}`.
    Failed(String),
    /// `{"ok": false, "unsupported": "..."}`: the case is not applicable.
    Refused(String),
}

/// The answer `{"ok": true}`, `{"ok": false, "error": "..."}` or `{"ok": false,
/// "unsupported": "..."}`; anything else is a one-line reason.
pub(super) fn parse_answer(line: &str) -> Result<Answer, String> {
    let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
    let text = |key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    match v.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(Answer::Done),
        // A reason is printed for every case it comes with: one line, control characters
        // (escape sequences, NUL) escaped, clipped.
        Some(false) => Ok(match (text("unsupported"), text("error")) {
            (Some(reason), _) => Answer::Refused(clipped(&reason, REASON_CHARS)),
            (None, error) => Answer::Failed(
                error.map_or_else(|| "(no error given)".into(), |e| clipped(&e, REASON_CHARS)),
            ),
        }),
        None => Err(format!(
            "answered '{}' where {{\"ok\": true}} or {{\"ok\": false, \"error\": \"...\"}} was expected (stdout is the protocol's: print nothing else there)",
            shown(line)
        )),
    }
}

/// The most characters of a worker's error or refusal a message shows.
const REASON_CHARS: usize = 1000;

/// A worker's line as a message shows it: one line, at most 200 characters.
pub(super) fn shown(line: &str) -> String {
    let line = clipped(line, usize::MAX);
    match line.char_indices().nth(200) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line,
    }
}

/// `text` as one line of at most `most` characters (then `... (N more characters)`), its
/// whitespace runs made one space and every other control character escaped (`\u{1b}`), so
/// that nothing a worker sends can move the terminal's cursor or colour the report.
fn clipped(text: &str, most: usize) -> String {
    let line: String = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect();
    match line.char_indices().nth(most) {
        Some((at, _)) => format!(
            "{}... ({} more characters)",
            &line[..at],
            line[at..].chars().count()
        ),
        None => line,
    }
}

/// What a greeting says of compact inputs, after [`check_greeting`] accepted it: `Some(true)`
/// for `"inputs": "compact"`, `Some(false)` for `"float32"`, `None` when it says nothing
/// (`--inputs` decides); another value is the error.
pub(super) fn greeting_inputs(line: &str) -> Result<Option<bool>, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    match v.get("inputs") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s == "float32" => Ok(Some(false)),
        Some(Value::String(s)) if s == "compact" => Ok(Some(true)),
        Some(other) => Err(format!(
            "greeted with \"inputs\": {}: expected \"float32\" or \"compact\" (docs/protocol.md)",
            shown(&other.to_string())
        )),
    }
}

/// Checks the greeting `{"protocol": 2, "ops": [...], "contract": {...}}` (`ops` optional:
/// any op; `contract` optional) for `op` and returns its `contract` (`Value::Null` when it
/// has none); the error is one line.
pub(super) fn check_greeting(line: &str, op: &str) -> Result<Value, String> {
    let expected = format!(
        "a worker first writes {{\"protocol\": {WORKER_PROTOCOL}, \"ops\": [...]}} on stdout (docs/protocol.md, protocol v2)"
    );
    let v: Value = match serde_json::from_str(line) {
        Ok(Value::Object(o)) => Value::Object(o),
        _ => return Err(format!("greeted with '{}': {expected}", shown(line))),
    };
    let Some(version) = v.get("protocol").and_then(Value::as_u64) else {
        return Err(format!("greeted with '{}': {expected}", shown(line)));
    };
    if version != WORKER_PROTOCOL {
        return Err(format!(
            "speaks protocol {version}; this moecheck speaks worker protocol {WORKER_PROTOCOL} (docs/protocol.md)"
        ));
    }
    let contract = match v.get("contract") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::Object(c)) => Value::Object(c.clone()),
        Some(other) => {
            return Err(format!(
                "greeted with \"contract\": {}: expected an object keyed by op (docs/protocol.md)",
                shown(&other.to_string())
            ))
        }
    };
    match v.get("ops") {
        None | Some(Value::Null) => Ok(contract),
        Some(Value::Array(ops)) => {
            if ops.iter().any(|o| o.as_str() == Some(op)) {
                Ok(contract)
            } else {
                Err(format!(
                    "serves ops {}; this case is op {op}",
                    shown(&Value::Array(ops.clone()).to_string())
                ))
            }
        }
        Some(other) => Err(format!(
            "greeted with \"ops\": {}: expected a list of op names",
            shown(&other.to_string())
        )),
    }
}
