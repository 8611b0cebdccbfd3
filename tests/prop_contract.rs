//! `moecheck prop` under an implementation's declared contract, through the real binary and a
//! test adapter with a real kernel's limits (tests/adapters/picky_gemm.py: refuses f16 and
//! K = 0 / N = 0, never writes tail rows): the greeting's contract is read and applied, flags
//! replace it key by key, refusals are not applicable (counted, never shrunk, capped), a
//! property with no applicable case is `not-run`, `--strict` fails on it, `exec:` refuses
//! with exit 77, the declaration reaches the minimal case, and the messages name the pass and
//! the file. (An inconclusive campaign's exit 3 is tested in the report's unit tests, the
//! loop's handling of it in properties/src/runner.rs.)

mod common;

use std::path::Path;

use common::moecheck;
use serde_json::Value;

const PICKY: &str = "worker:python3 tests/adapters/picky_gemm.py";

/// `moecheck prop --op OP --json --out OUT ARGS` ([`common::prop_json`]).
fn prop(op: &str, args: &[&str], out: &Path) -> (i32, Value) {
    common::prop_json(op, args, out)
}

fn property<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["properties"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no property {name}: {doc:#}"))
}

fn sum(doc: &Value, key: &str) -> u64 {
    doc["properties"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[key].as_u64().unwrap())
        .sum()
}

/// The greeting declares tail ignored, outputs in the input dtype, f32/bf16, K and N >= 1:
/// the campaign draws inside it (nothing refused), and K = 0 is `not-run`, not a failure.
#[test]
fn the_greeting_contract_is_drawn_inside_and_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, doc) = prop("gemm", &["--impl", PICKY, "--cases", "16"], tmp.path());
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["verdict"], "pass");
    let contract: Vec<&str> = doc["contract"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        contract.contains(&"declared.tail = \"ignored\" (the worker's greeting)"),
        "{contract:?}"
    );
    assert_eq!(sum(&doc, "refused"), 0, "{doc:#}");
    assert!(sum(&doc, "outside") > 0, "{doc:#}");
    for name in [
        "fwd-matches-reference",
        "tail-contract",
        "empty-expert-wgrad-zero",
    ] {
        let p = property(&doc, name);
        assert_eq!(
            (p["verdict"].as_str(), p["cases"].as_u64()),
            (Some("pass"), Some(16))
        );
    }
    let k = property(&doc, "k-zero");
    assert_eq!(k["verdict"], "not-run", "{k:#}");
    assert_eq!(k["cases"], 0);
    assert!(
        k["reason"]
            .as_str()
            .unwrap()
            .contains("K = 0 (declared minimum 1)"),
        "{k:#}"
    );
    let unexercised: Vec<&str> = doc["unexercised"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(unexercised, ["k-zero", "n-zero", "dtype-f16"]);
    // --strict fails the same campaign: a property was not run, edge classes unexercised.
    let (code, doc) = prop(
        "gemm",
        &["--impl", PICKY, "--cases", "4", "--strict"],
        tmp.path(),
    );
    assert_eq!(
        (code, doc["verdict"].as_str()),
        (1, Some("fail")),
        "{doc:#}"
    );
}

/// Without a contract the same limits are refusals: counted, never failures, never shrunk,
/// and K = 0 stops after 10 refusals per case asked for. The tail needs `--tail ignored`:
/// without it, the tail rows fail.
#[test]
fn refusals_are_not_applicable_and_flags_declare_the_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let picky = format!("{PICKY} --no-contract");
    let (code, doc) = prop(
        "gemm",
        &["--impl", &picky, "--tail", "ignored", "--cases", "8"],
        tmp.path(),
    );
    assert_eq!(code, 0, "{doc:#}");
    assert!(sum(&doc, "refused") > 0, "{doc:#}");
    assert_eq!(sum(&doc, "outside"), 0, "{doc:#}");
    let k = property(&doc, "k-zero");
    assert_eq!(k["verdict"], "not-run");
    assert_eq!(k["refused"], 81, "{k:#}");
    assert!(
        k["reason"]
            .as_str()
            .unwrap()
            .contains("refused the case: K = 0"),
        "{k:#}"
    );
    assert!(k["minimal_case"].is_null());
    // Without --tail ignored the NaN tail rows are a failure, shrunk to a minimal case.
    let (code, doc) = prop(
        "gemm",
        &[
            "--impl",
            &picky,
            "--cases",
            "8",
            "--property",
            "tail-contract",
        ],
        tmp.path(),
    );
    assert_eq!(code, 1, "{doc:#}");
    let t = property(&doc, "tail-contract");
    assert!(
        t["reason"]
            .as_str()
            .unwrap()
            .contains("in a tail row, want exactly 0"),
        "{t:#}"
    );
    assert!(
        t["arguments"].as_str().unwrap().contains("tail_rows: 1,"),
        "{t:#}"
    );
}

/// A flag replaces the greeting's key: `--tail zero` against a kernel that declares its
/// tail ignored checks the tail again, and fails.
#[test]
fn a_flag_replaces_the_greeting_key() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, doc) = prop(
        "gemm",
        &[
            "--impl",
            PICKY,
            "--tail",
            "zero",
            "--property",
            "tail-contract",
            "--cases",
            "8",
        ],
        tmp.path(),
    );
    assert_eq!(code, 1, "{doc:#}");
    assert!(doc["contract"]
        .as_array()
        .unwrap()
        .contains(&Value::from("declared.tail = \"zero\" (--tail)")));
    // A metamorphic property's failure is reproduced by the campaign, with the flag.
    let line = property(&doc, "tail-contract")["reproduce"]
        .as_str()
        .unwrap();
    assert!(
        line.starts_with("moecheck prop --op gemm")
            && line.contains("--tail zero --property tail-contract"),
        "{line}"
    );
}

/// The kernel with a planted bug still fails, shrunk, and `moecheck check` on the minimal case
/// fails again for the same reason; the case records the declared tail.
#[test]
fn a_planted_bug_fails_with_a_minimal_case_check_refails() {
    let tmp = tempfile::tempdir().unwrap();
    let picky = format!("{PICKY} --wrong-expert");
    let (code, doc) = prop(
        "gemm",
        &[
            "--impl",
            &picky,
            "--cases",
            "16",
            "--property",
            "fwd-matches-reference",
        ],
        tmp.path(),
    );
    assert_eq!(code, 1, "{doc:#}");
    let p = property(&doc, "fwd-matches-reference");
    let args = p["arguments"].as_str().unwrap();
    assert!(
        args.contains("k: 1, n: 1") && args.contains("tail: Ignored"),
        "{args}"
    );
    let dir = p["minimal_case"].as_str().unwrap();
    let case: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(dir).join("case.json")).unwrap())
            .unwrap();
    assert_eq!(case["tail"], "ignored", "{case:#}");
    let line = p["reproduce"].as_str().unwrap();
    assert_eq!(line, format!("moecheck check {dir}"));
    let o = moecheck().args(["check", dir, "--json"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let again: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(again["failure"], p["reason"]);
}

/// An `exec:` program refuses with exit 77 and its reason on stderr; one that refuses
/// everything leaves every property `not-run`, and the campaign fails (nothing checked).
#[test]
fn exec_refuses_with_77_and_a_campaign_that_applied_nothing_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let exec = "exec:python3 tests/adapters/picky_gemm.py --no-contract";
    let (code, doc) = prop(
        "gemm",
        &[
            "--impl",
            exec,
            "--tail",
            "ignored",
            "--cases",
            "16",
            "--property",
            "fwd-matches-reference",
        ],
        tmp.path(),
    );
    assert_eq!(code, 0, "{doc:#}");
    assert!(
        property(&doc, "fwd-matches-reference")["refused"]
            .as_u64()
            .unwrap()
            > 0
    );
    let refuser = "exec:python3 tests/adapters/picky_gemm.py --refuse-all --no-contract";
    let (code, doc) = prop("gemm", &["--impl", refuser, "--cases", "2"], tmp.path());
    assert_eq!(code, 1, "{doc:#}");
    for p in doc["properties"].as_array().unwrap() {
        assert_eq!(p["verdict"], "not-run", "{p:#}");
        assert_eq!(p["refused"], 21, "{p:#}");
        assert!(
            p["reason"]
                .as_str()
                .unwrap()
                .contains("this kernel runs nothing"),
            "{p:#}"
        );
    }
    // The single-case command names the refusal and exits 2.
    let o = moecheck()
        .args(["gemm", "--impl", refuser, "--experts", "4", "--tokens", "8"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(
        text.contains("not applicable: 'python3 tests/adapters/picky_gemm.py --refuse-all --no-contract' refused the case: this kernel runs nothing"),
        "{text}"
    );
    assert!(text.contains("verdict: NOT APPLICABLE"), "{text}");
}

/// A forward-only kernel declares `passes: [fwd]`: the other passes' properties are not
/// applicable, the rest ask for fwd only. Undeclared, its missing dlhs is named.
#[test]
fn a_forward_only_kernel_and_the_missing_output_message() {
    let tmp = tempfile::tempdir().unwrap();
    let fwd = format!("{PICKY} --fwd-only");
    let (code, doc) = prop("gemm", &["--impl", &fwd, "--cases", "8"], tmp.path());
    assert_eq!(code, 0, "{doc:#}");
    for name in [
        "dgrad-matches-reference",
        "wgrad-matches-reference",
        "empty-expert-wgrad-zero",
        "tail-contract",
    ] {
        assert_eq!(property(&doc, name)["verdict"], "not-applicable", "{name}");
    }
    assert_eq!(property(&doc, "fwd-matches-reference")["verdict"], "pass");
    // The same kernel declared for every pass (the flag replaces the greeting's passes).
    let (code, doc) = prop(
        "gemm",
        &[
            "--impl",
            &fwd,
            "--passes",
            "fwd,dgrad,wgrad",
            "--cases",
            "4",
            "--property",
            "dgrad-matches-reference",
        ],
        tmp.path(),
    );
    assert_eq!(code, 1, "{doc:#}");
    let reason = property(&doc, "dgrad-matches-reference")["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reason.contains("the implementation wrote no dlhs.npy for the dgrad pass"),
        "{reason}"
    );
}

/// Bad contracts and flags exit 2 naming the key and its source.
#[test]
fn a_bad_contract_exits_2_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, want) in [
        (vec!["--supports", "dtypes=fp8"], "--supports: contract.grouped_gemm.supports.dtypes"),
        (vec!["--supports", "k_mult=8"], "contract.grouped_gemm.supports.k_mult: op grouped_gemm has no such key"),
        (vec!["--convention", "megatron"], "--convention: contract.grouped_gemm.declared.convention: op grouped_gemm has no such key"),
        (vec!["--supports", "k_min"], "expected KEY=VALUE"),
    ] {
        let o = moecheck()
            .args(["prop", "--op", "gemm", "--impl", PICKY, "--cases", "1", "--out"])
            .arg(tmp.path())
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}
