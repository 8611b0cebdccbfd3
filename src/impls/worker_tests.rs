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
