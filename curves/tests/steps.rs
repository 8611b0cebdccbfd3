//! Step numbers every reader accepts: whole numbers from 0 to 2^53 (`MAX_STEP`), where f64 —
//! which the criterion's slope and the plot use — still holds every integer. Anything else is
//! refused with the file, the line (or record) and the field, never wrapped or clamped.
//! See: issue 16, item 6 (golden files with `step_interval` -1 or 1e30 became steps 1..3, a
//! `start_step` near 2^64 wrapped to 0, plain-log steps of 2^64 or more clamped onto one step).

use std::path::PathBuf;

use moecheck_curves::{crc32c, read, CurveError, LogFormat, Metric, MAX_STEP};

/// Writes `bytes` as `name` in a fresh temporary directory (kept alive by the returned guard).
fn file(name: &str, bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    (dir, p)
}

fn refusal(name: &str, text: &str, format: Option<LogFormat>) -> String {
    let (_dir, p) = file(name, text.as_bytes());
    match read(&p, format) {
        Err(e @ CurveError::Malformed { .. }) => e.to_string(),
        Err(other) => panic!("{name}: expected a malformed-input error, got {other}"),
        Ok(c) => panic!("{name}: accepted, loss steps {:?}", steps(&c)),
    }
}

fn steps(c: &moecheck_curves::Curve) -> Vec<u64> {
    c.metrics[&Metric::Loss].iter().map(|s| s.step).collect()
}

fn golden(fields: &str) -> String {
    format!("{{\n  \"lm loss\": {{{fields}, \"values\": [10.0, 9.0, 8.0]}}\n}}\n")
}

#[test]
fn golden_step_fields_out_of_range_are_refused_naming_the_field() {
    for (fields, field) in [
        ("\"step_interval\": -1", "\"step_interval\" is -1"),
        ("\"step_interval\": 1e30", "\"step_interval\" is 1e+30"),
        ("\"step_interval\": 0", "\"step_interval\" is 0"),
        ("\"step_interval\": 2.5", "\"step_interval\" is 2.5"),
        (
            "\"step_interval\": \"five\"",
            "\"step_interval\" is \"five\"",
        ),
        ("\"start_step\": -3", "\"start_step\" is -3"),
        (
            "\"start_step\": 9223372036854775808",
            "\"start_step\" is 9223372036854775808",
        ),
        (
            "\"start_step\": 18446744073709551615",
            "\"start_step\" is 18446744073709551615",
        ),
    ] {
        let e = refusal("golden.json", &golden(fields), None);
        assert!(
            e.contains("golden.json:2: \"lm loss\": ") && e.contains(field),
            "{fields}: {e}"
        );
        assert!(e.contains("not a whole number from"), "{e}");
    }
    // The same fields beside step-keyed values are checked too: the file is broken.
    let keyed = "{\"lm loss\": {\"step_interval\": -1, \"values\": {\"1\": 10.0}}}";
    let e = refusal("keyed.json", keyed, Some(LogFormat::MegatronGolden));
    assert!(e.contains("\"step_interval\" is -1"), "{e}");
    // Steps that `start + j·interval` would carry past 2^53 (or wrap past 2^64).
    for fields in [
        format!("\"start_step\": {MAX_STEP}, \"step_interval\": 1"),
        format!("\"start_step\": 1, \"step_interval\": {}", MAX_STEP / 2 + 1),
    ] {
        let e = refusal("far.json", &golden(&fields), None);
        assert!(e.contains("beyond 2^53"), "{fields}: {e}");
    }
    let e = refusal(
        "key.json",
        "{\"lm loss\": {\"values\": {\"18446744073709551616\": 1.0}}}",
        None,
    );
    assert!(e.contains("step key"), "{e}");
}

#[test]
fn golden_steps_up_to_the_limit_are_read_exactly() {
    let fields = format!("\"start_step\": {}, \"step_interval\": 1", MAX_STEP - 2);
    let (_dir, p) = file("edge.json", golden(&fields).as_bytes());
    let c = read(&p, None).unwrap();
    assert_eq!(steps(&c), [MAX_STEP - 2, MAX_STEP - 1, MAX_STEP]);
    // Absent fields keep their defaults: steps 1, 2, 3.
    let (_dir, p) = file("plain.json", golden("\"end_step\": 3").as_bytes());
    assert_eq!(steps(&read(&p, None).unwrap()), [1, 2, 3]);
}

#[test]
fn text_log_steps_beyond_two_to_the_53_are_refused_with_the_line() {
    let mt = |step: &str| format!("completed step: {step}, seconds: 1.000, loss: 9.000\n");
    let cases: Vec<(&str, String, usize)> = vec![
        ("p.txt", "0 1.0\n18446744073709551616 2.0\n".into(), 2),
        (
            "p2.txt",
            "0 1.0\n1 1.5\n18446744073709551617 2.0\n".into(),
            3,
        ),
        (
            "p3.csv",
            "step,loss\n99999999999999999999999,1.0\n".into(),
            2,
        ),
        ("p4.txt", format!("{} 1.0\n", MAX_STEP + 2), 1),
        ("mt.log", mt("18446744073709551616"), 1),
        (
            "m.jsonl",
            "{\"step\": 1e20, \"learning/loss\": 9.1}\n".into(),
            1,
        ),
        (
            "meg.log",
            " iteration 18446744073709551616/ 10 | lm loss: 1.000000E+01 |\n".into(),
            1,
        ),
        ("tt.log", "step: 1e19  loss:  9.1234\n".into(), 1),
    ];
    for (name, text, line) in cases {
        let e = refusal(name, &text, None);
        assert!(e.contains(&format!("{name}:{line}: ")), "{e}");
        assert!(e.contains("2^53"), "{name}: {e}");
    }
    // 2^53 itself is a step; two distinct large steps stay distinct.
    let (_dir, p) = file(
        "edge.txt",
        format!("{} 1.0\n{} 2.0\n", MAX_STEP - 1, MAX_STEP).as_bytes(),
    );
    assert_eq!(steps(&read(&p, None).unwrap()), [MAX_STEP - 1, MAX_STEP]);
}

/// One TFRecord-framed `Event{step, summary{value{tag: "loss", simple_value}}}`.
fn tb_record(step: u64, value: f32) -> Vec<u8> {
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let masked = |d: &[u8]| crc32c(d).rotate_right(15).wrapping_add(0xa282_ead8);
    let mut val = vec![0x0a, 4];
    val.extend_from_slice(b"loss");
    val.push(0x15);
    val.extend_from_slice(&value.to_le_bytes());
    let mut summary = vec![0x0a, val.len() as u8];
    summary.extend(val);
    let mut event = vec![0x10];
    varint(step, &mut event);
    event.push(0x2a);
    event.push(summary.len() as u8);
    event.extend(summary);
    let len = (event.len() as u64).to_le_bytes();
    let mut out = len.to_vec();
    out.extend_from_slice(&masked(&len).to_le_bytes());
    out.extend_from_slice(&event);
    out.extend_from_slice(&masked(&event).to_le_bytes());
    out
}

#[test]
fn tensorboard_steps_beyond_two_to_the_53_are_refused_with_the_record() {
    let mut bytes = tb_record(MAX_STEP, 2.0);
    let (_dir, p) = file("ok.tfevents", &bytes);
    assert_eq!(steps(&read(&p, None).unwrap()), [MAX_STEP]);
    bytes.extend(tb_record(MAX_STEP + 1, 1.0));
    let (_dir, p) = file("far.tfevents", &bytes);
    let e = read(&p, None).unwrap_err().to_string();
    assert!(e.contains("far.tfevents:2: record at byte"), "{e}");
    assert!(e.contains("2^53"), "{e}");
}
