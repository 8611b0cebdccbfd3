use super::*;

#[test]
fn greetings() {
    assert!(check_greeting(r#"{"protocol": 2, "ops": ["route"]}"#, "route").is_ok());
    assert!(check_greeting(r#"{"protocol": 2}"#, "route").is_ok());
    let e = check_greeting(r#"{"protocol": 3, "ops": ["route"]}"#, "route").unwrap_err();
    assert_eq!(
        e,
        "speaks protocol 3; this moecheck speaks worker protocol 2 (docs/protocol.md)"
    );
    let e = check_greeting(r#"{"protocol": 2, "ops": ["route"]}"#, "moe_layer").unwrap_err();
    assert_eq!(e, r#"serves ops ["route"]; this case is op moe_layer"#);
    let e = check_greeting("hello", "route").unwrap_err();
    assert!(
        e.starts_with("greeted with 'hello': a worker first writes"),
        "{e}"
    );
    assert!(check_greeting(r#"{"protocol": 2, "ops": "route"}"#, "route").is_err());
    let contract = check_greeting(
        r#"{"protocol": 2, "ops": ["route"], "contract": {"route": {"declared": {"ties": "any"}}}}"#,
        "route",
    )
    .unwrap();
    assert_eq!(contract["route"]["declared"]["ties"], "any");
    assert_eq!(
        check_greeting(r#"{"protocol": 2}"#, "route"),
        Ok(Value::Null)
    );
    let e = check_greeting(r#"{"protocol": 2, "contract": ["route"]}"#, "route").unwrap_err();
    assert!(e.contains("expected an object keyed by op"), "{e}");
}

#[test]
fn answers() {
    assert_eq!(parse_answer(r#"{"ok": true}"#), Ok(Answer::Done));
    assert_eq!(
        parse_answer(r#"{"ok": false, "error": "ValueError: k"}"#),
        Ok(Answer::Failed("ValueError: k".into()))
    );
    assert_eq!(
        parse_answer(r#"{"ok": false}"#),
        Ok(Answer::Failed("(no error given)".into()))
    );
    assert_eq!(
        parse_answer(r#"{"ok": false, "unsupported": "K = 0"}"#),
        Ok(Answer::Refused("K = 0".into()))
    );
    for bad in ["", "ok", r#"{"ok": "yes"}"#, "[1]", r#"{"done": true}"#] {
        let e = parse_answer(bad).unwrap_err();
        assert!(e.starts_with("answered '"), "{e}");
    }
    assert!(shown(&"x".repeat(500)).len() < 210);
}

/// An error or refusal is shown as one line, control characters escaped, clipped: an escape
/// sequence, a NUL byte and a 900 KB traceback printed whole for every case before.
#[test]
fn reasons_are_one_clipped_line_without_control_characters() {
    let evil = r"\u001b[2J\u001b[31mboom\u0000\nline 2";
    let a = parse_answer(&format!(r#"{{"ok": false, "error": "{evil}"}}"#)).unwrap();
    let Answer::Failed(e) = a else {
        panic!("{a:?}")
    };
    assert!(!e.chars().any(|c| c.is_control()), "{e:?}");
    assert!(e.contains("boom") && e.contains("line 2"), "{e:?}");
    let huge = "x".repeat(900_000);
    let a = parse_answer(&format!(r#"{{"ok": false, "unsupported": "{huge}"}}"#)).unwrap();
    let Answer::Refused(r) = a else {
        panic!("{a:?}")
    };
    assert!(r.len() < 1100, "{}", r.len());
    assert!(
        r.ends_with("(899000 more characters)"),
        "{}",
        &r[r.len() - 40..]
    );
}
