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

/// Fuzzing the two lines a worker writes (issue 42, "extend the fuzz tests to worker
/// answers"): whatever the line (garbage, partial JSON, huge, control characters, answers of
/// the wrong types), reading it never panics, and what a message shows of it is one line
/// without control characters and of bounded length.
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// Lines that look like answers and greetings, broken in every way.
    fn line() -> impl Strategy<Value = String> {
        let text = prop_oneof![
            any::<String>(),
            "[\\x00-\\x1f\\x7f\"\\\\a-z{}:,\\[\\] ]{0,60}",
            (0usize..5000).prop_map(|n| "é\u{1b}[2J".repeat(n)),
        ];
        let value = prop_oneof![
            Just("true".to_string()),
            Just("false".to_string()),
            Just("null".to_string()),
            Just("2".to_string()),
            Just("[\"route\"]".to_string()),
            text.clone()
                .prop_map(|t| serde_json::Value::String(t).to_string()),
        ];
        prop_oneof![
            text,
            (value.clone(), value.clone(), value.clone()).prop_map(|(a, b, c)| format!(
                r#"{{"ok": {a}, "error": {b}, "unsupported": {c}}}"#
            )),
            (value.clone(), value.clone(), value).prop_map(|(a, b, c)| format!(
                r#"{{"protocol": {a}, "ops": {b}, "contract": {c}}}"#
            )),
            // Cut anywhere: a partial line.
            (
                any::<usize>(),
                Just(r#"{"ok": false, "error": "ValueError: x"}"#)
            )
                .prop_map(|(n, l)| l[..n % l.len()].to_string()),
        ]
    }

    fn one_clean_line(s: &str, most: usize) {
        assert!(!s.chars().any(char::is_control), "{s:?}");
        assert!(
            s.chars().count() <= most,
            "{} characters",
            s.chars().count()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn any_line_is_read_without_panic_and_shown_as_one_clean_line(l in line()) {
            match parse_answer(&l) {
                Ok(Answer::Failed(e) | Answer::Refused(e)) => one_clean_line(&e, 1100),
                Ok(Answer::Done) => {}
                Err(e) => one_clean_line(&e, 600),
            }
            match check_greeting(&l, "route") {
                Ok(_) => {}
                Err(e) => one_clean_line(&e, 600),
            }
            one_clean_line(&shown(&l), 210);
        }
    }
}

/// `"inputs"` in a greeting: compact, float32, or nothing said (then `--inputs` decides);
/// anything else refused naming the key.
#[test]
fn greeting_inputs_are_compact_or_float32() {
    assert_eq!(greeting_inputs(r#"{"protocol": 2}"#), Ok(None));
    assert_eq!(
        greeting_inputs(r#"{"protocol": 2, "inputs": "float32"}"#),
        Ok(Some(false))
    );
    assert_eq!(
        greeting_inputs(r#"{"protocol": 2, "inputs": "compact"}"#),
        Ok(Some(true))
    );
    let e = greeting_inputs(r#"{"protocol": 2, "inputs": 16}"#).unwrap_err();
    assert!(e.contains("\"inputs\": 16") && e.contains("compact"), "{e}");
}
