//! `moecheck prop` through the real binary: every planted bug of every operation is caught,
//! and the minimal case it writes fails again under `moecheck check` with the property's own
//! reason line (or, where the printed line is the `prop` command, that command finds the
//! same failure again); correct implementations pass; the JSON and JUnit outputs; bad input
//! exits 2.

mod common;

use std::ops::ControlFlow;
use std::path::Path;

use common::moecheck;
use moecheck::impls::PlantedBug;
use moecheck::ops::{self, Operation, Visit};
use moecheck::registry::Backends;
use serde_json::Value;

/// The planted bugs of operation `op`, from the library's one list of operations.
fn bugs(op: &str) -> Vec<&'static str> {
    struct Bugs<'a>(&'a str, Vec<&'static str>);
    impl Visit for Bugs<'_> {
        fn visit<O: Operation>(&mut self, _: &'static str) -> ControlFlow<()> {
            if O::NAME == self.0 {
                self.1 = <O as Backends>::Bug::ALL.iter().map(|b| b.name()).collect();
            }
            ControlFlow::Continue(())
        }
    }
    let mut b = Bugs(op, Vec::new());
    ops::each(&mut b);
    assert!(!b.1.is_empty(), "op {op} has no planted bugs");
    b.1
}

/// `moecheck prop --op OP --json --out OUT ARGS` ([`common::prop_json`]).
fn prop(op: &str, args: &[&str], out: &Path) -> (i32, Value) {
    common::prop_json(op, args, out)
}

/// Runs a printed reproduce line (with `--json`, and `--out` for a `prop` line) and returns
/// its exit status and document.
fn rerun(line: &str, out: &Path) -> (i32, Value) {
    let words = shlex::split(line).unwrap_or_else(|| panic!("not a shell line: {line}"));
    assert_eq!(words[0], "moecheck", "{line}");
    let mut c = moecheck();
    c.args(&words[1..]).arg("--json");
    if words[1] == "prop" {
        c.arg("--out").arg(out);
    }
    let o = c.output().unwrap();
    let doc = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{line}: {e}; stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (o.status.code().unwrap(), doc)
}

fn failed(doc: &Value) -> Vec<&Value> {
    doc["properties"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["verdict"] == "fail")
        .collect()
}

/// Every bug of `op` is caught; every `moecheck check` line fails with the property's own
/// reason; the `prop` line of a bug no check line reproduces (and the first `prop` line of the
/// operation) finds the same failure again.
fn every_bug_is_caught_and_reproduced(op: &str, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let mut prop_lines_checked = 0;
    for bug in bugs(op) {
        let out = tmp.path().join(bug);
        let mut args = vec!["--impl", "emulate", "--inject", bug];
        args.extend(extra);
        let (code, doc) = prop(op, &args, &out);
        assert_eq!(code, 1, "{op} {bug} not caught: {doc:#}");
        assert_eq!(doc["verdict"], "fail");
        assert_eq!(doc["impl"], format!("emulate[inject={bug}]"));
        let failures = failed(&doc);
        assert!(!failures.is_empty(), "{doc:#}");
        let mut by_check = 0;
        let mut by_prop = Vec::new();
        for p in &failures {
            let (name, reason) = (p["name"].as_str().unwrap(), p["reason"].as_str().unwrap());
            let dir = p["minimal_case"]
                .as_str()
                .expect("a minimal case directory");
            assert!(Path::new(dir).join("case.json").is_file(), "{dir}");
            let line = p["reproduce"].as_str().unwrap();
            if line.starts_with("moecheck check ") {
                let (code, again) = rerun(line, &out);
                assert_eq!(code, 1, "{op} {bug} {name}: `{line}` passed");
                assert_eq!(again["failure"], reason, "{op} {bug} {name}: `{line}`");
                by_check += 1;
            } else {
                assert!(line.starts_with("moecheck prop "), "{line}");
                by_prop.push((name, reason, line));
            }
        }
        let to_rerun = if by_check == 0 {
            by_prop.len()
        } else {
            usize::from(prop_lines_checked == 0).min(by_prop.len())
        };
        for (name, reason, line) in &by_prop[..to_rerun] {
            let (code, again) = rerun(line, &out.join("again"));
            assert_eq!(code, 1, "{op} {bug} {name}: `{line}` passed");
            let props = again["properties"].as_array().unwrap();
            assert_eq!(props.len(), 1, "{line} runs {name} only");
            assert_eq!(props[0]["reason"], *reason, "{op} {bug}: `{line}`");
            prop_lines_checked += 1;
        }
        eprintln!(
            "{op} {bug}: {} properties failed, {by_check} reproduced by check, {} by prop",
            failures.len(),
            by_prop.len()
        );
    }
}

#[test]
fn every_gemm_bug_is_caught_and_reproduced() {
    every_bug_is_caught_and_reproduced("gemm", &["--cases", "32"]);
}

#[test]
fn every_fp8_bug_is_caught_and_reproduced() {
    every_bug_is_caught_and_reproduced("fp8", &["--cases", "16", "--max-shrink", "64"]);
}

#[test]
fn every_route_bug_is_caught_and_reproduced() {
    every_bug_is_caught_and_reproduced("route", &["--cases", "32"]);
}

#[test]
fn every_moe_bug_is_caught_and_reproduced() {
    every_bug_is_caught_and_reproduced("moe", &["--cases", "16"]);
}

#[test]
fn correct_implementations_pass_every_property() {
    let tmp = tempfile::tempdir().unwrap();
    for op in ops::names() {
        for imp in ["reference", "emulate"] {
            let (code, doc) = prop(op, &["--impl", imp, "--cases", "16"], tmp.path());
            assert_eq!(code, 0, "{op} {imp}: {doc:#}");
            assert_eq!(doc["verdict"], "pass");
            assert_eq!(doc["op"], op);
            assert_eq!(doc["cases"], 16);
            for p in doc["properties"].as_array().unwrap() {
                assert_eq!(p["verdict"], "pass", "{op} {imp}: {p:#}");
                assert_eq!(p["cases"], 16);
                assert!(p["minimal_case"].is_null() && p["reproduce"].is_null());
                assert!(p["reason"].is_null());
            }
        }
    }
    assert_eq!(
        std::fs::read_dir(tmp.path()).map_or(0, |d| d.count()),
        0,
        "nothing is written when every property holds"
    );
}

#[test]
fn the_numpy_adapter_passes_through_exec() {
    let tmp = tempfile::tempdir().unwrap();
    let adapter = "exec:python3 examples/adapters/numpy_grouped_gemm.py";
    let (code, doc) = prop("gemm", &["--impl", adapter, "--cases", "3"], tmp.path());
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["impl"], adapter);
    assert_eq!(doc["properties"].as_array().unwrap().len(), 6);
}

/// The text report names each failure's minimal case and reproduce line; the JSON document
/// has the documented fields.
#[test]
fn text_and_json_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let out = moecheck()
        .current_dir(tmp.path())
        .args([
            "prop",
            "--op",
            "gemm",
            "--impl",
            "emulate",
            "--inject",
            "k-zero-garbage",
        ])
        .args(["--cases", "8", "--seed", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("k-zero FAILED"), "{text}");
    assert!(
        text.contains("minimal case: moecheck-prop/gemm-k-zero-seed-5"),
        "{text}"
    );
    assert!(text.contains("reproduce: moecheck "), "{text}");
    assert!(text.ends_with("verdict: FAIL\n"), "{text}");
    assert!(tmp
        .path()
        .join("moecheck-prop/gemm-k-zero-seed-5/case.json")
        .is_file());
    // A second run replaces the case directories it wrote.
    let again = moecheck()
        .current_dir(tmp.path())
        .args([
            "prop",
            "--op",
            "gemm",
            "--impl",
            "emulate",
            "--inject",
            "k-zero-garbage",
        ])
        .args(["--cases", "8", "--seed", "5", "--json"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&again.stdout).unwrap();
    for key in [
        "verdict",
        "op",
        "impl",
        "cases",
        "seed",
        "max_shrink",
        "properties",
    ] {
        assert!(doc.get(key).is_some(), "{key} missing: {doc:#}");
    }
    for p in doc["properties"].as_array().unwrap() {
        for key in [
            "name",
            "cases",
            "verdict",
            "reason",
            "minimal_case",
            "reproduce",
        ] {
            assert!(p.get(key).is_some(), "{key} missing: {p:#}");
        }
    }
}

/// Parses `file` with Python's XML parser: the suite's name, its test cases and their
/// failure messages.
fn parse_junit(file: &Path) -> Value {
    let script = "import json, sys, xml.etree.ElementTree as ET\n\
        root = ET.parse(sys.argv[1]).getroot()\n\
        suites = root.findall('testsuite')\n\
        cases = [{'name': c.get('name'), 'failure': (c.find('failure').get('message') if c.find('failure') is not None else None), 'text': (c.find('failure').text if c.find('failure') is not None else None)} for s in suites for c in s.findall('testcase')]\n\
        print(json.dumps({'root': root.tag, 'suites': [s.get('name') for s in suites], 'failures': [s.get('failures') for s in suites], 'cases': cases}))";
    let o = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn junit_has_one_testcase_per_property_and_failures_where_they_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("prop.xml");
    let (code, doc) = prop(
        "route",
        &[
            "--impl",
            "emulate",
            "--inject",
            "tie-toward-higher-index",
            "--cases",
            "16",
            "--junit",
            file.to_str().unwrap(),
        ],
        &tmp.path().join("cases"),
    );
    assert_eq!(code, 1);
    let x = parse_junit(&file);
    assert_eq!(x["root"], "testsuites");
    assert_eq!(x["suites"], serde_json::json!(["moecheck prop route"]));
    let props = doc["properties"].as_array().unwrap();
    let cases = x["cases"].as_array().unwrap();
    assert_eq!(cases.len(), props.len());
    for (c, p) in cases.iter().zip(props) {
        assert_eq!(c["name"], p["name"]);
        assert_eq!(c["failure"], p["reason"], "{c:#}");
        if p["verdict"] == "fail" {
            let text = c["text"].as_str().unwrap();
            let line = p["reproduce"].as_str().unwrap();
            assert!(text.contains(&format!("reproduce: {line}")), "{text}");
        }
    }
    assert_eq!(x["failures"][0], failed(&doc).len().to_string());
    // A passing campaign: test cases without failures.
    let (code, _) = prop(
        "gemm",
        &[
            "--impl",
            "reference",
            "--cases",
            "4",
            "--junit",
            file.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert_eq!(code, 0);
    let x = parse_junit(&file);
    assert_eq!(x["failures"][0], "0");
    assert!(x["cases"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["failure"].is_null()));
}

#[test]
fn bad_input_exits_2_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let not_a_case = tmp.path().join("mine");
    std::fs::create_dir_all(not_a_case.join("gemm-k-zero-seed-0")).unwrap();
    std::fs::write(not_a_case.join("gemm-k-zero-seed-0/notes.txt"), "mine").unwrap();
    let t = tmp.path().to_str().unwrap();
    let cases: [(&[&str], &str); 9] = [
        (&["--op", "nope", "--impl", "emulate"], "nope"),
        (&["--op", "gemm"], "--impl"),
        (
            &["--op", "gemm", "--impl", "emulate", "--acc", "f32"],
            "--acc",
        ),
        (
            &["--op", "gemm", "--impl", "exec:true", "--compute", "f32"],
            "--compute does not apply to op gemm",
        ),
        (
            &["--op", "moe", "--impl", "emulate", "--property", "nope"],
            "--property nope",
        ),
        (
            &["--op", "gemm", "--impl", "emulate", "--cases", "0"],
            "--cases",
        ),
        (
            &["--op", "gemm", "--impl", "emulate", "--junit", t],
            "is a directory",
        ),
        (
            &[
                "--op",
                "gemm",
                "--impl",
                "emulate",
                "--out",
                file.to_str().unwrap(),
            ],
            "not a directory",
        ),
        (
            &[
                "--op",
                "gemm",
                "--impl",
                "emulate",
                "--inject",
                "k-zero-garbage",
                "--out",
            ],
            "not a case directory",
        ),
    ];
    for (args, reason) in cases {
        let mut c = moecheck();
        c.arg("prop").args(args);
        if args.last() == Some(&"--out") {
            c.arg(&not_a_case);
        }
        let o = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
    }
}

/// A worker that never starts (a missing module, an `exec:` adapter started as a worker) is
/// started once: the first property fails with its reason, the others are not run and say
/// why, and the campaign ends in well under a second instead of restarting it for every case
/// and shrink step.
#[test]
fn a_worker_that_never_starts_is_started_once_and_the_campaign_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let starts = tmp.path().join("starts");
    let cmd = format!(
        "worker:echo x >> '{}'; echo \"ModuleNotFoundError: No module named 'moecheck'\" >&2; exit 1",
        starts.display()
    );
    let (code, doc) = prop(
        "gemm",
        &["--impl", &cmd, "--cases", "8"],
        &tmp.path().join("out"),
    );
    assert_eq!(code, 1, "{doc}");
    assert_eq!(doc["verdict"], "fail");
    let props = doc["properties"].as_array().unwrap();
    assert!(props.len() > 1);
    let first = props[0]["reason"].as_str().unwrap();
    assert!(
        first.contains("before its greeting") && first.contains("ModuleNotFoundError"),
        "{first}"
    );
    for p in &props[1..] {
        let why = p["reason"].as_str().unwrap();
        assert!(
            why.starts_with("not run: ") && why.contains("ModuleNotFoundError"),
            "{why}"
        );
        assert_eq!(p["cases"], 0, "{p}");
        assert!(p["reproduce"].is_null(), "{p}");
    }
    assert_eq!(std::fs::read_to_string(&starts).unwrap().lines().count(), 1);
}

/// The FP8 properties about an implementation's quantised operands cannot check an external
/// program (it does not expose them): they are skipped, saying why, and neither pass nor fail
/// the campaign; the others check the program's outputs. The JUnit file marks them skipped.
#[test]
fn properties_on_internals_are_skipped_for_an_external_program() {
    let tmp = tempfile::tempdir().unwrap();
    let junit = tmp.path().join("fp8.xml");
    let adapter = "worker:python3 examples/adapters/numpy_fp8_grouped_gemm.py";
    let (code, doc) = prop(
        "fp8",
        &[
            "--impl",
            adapter,
            "--cases",
            "4",
            "--junit",
            junit.to_str().unwrap(),
        ],
        &tmp.path().join("out"),
    );
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["verdict"], "pass");
    let props = doc["properties"].as_array().unwrap();
    let skipped: Vec<&str> = props
        .iter()
        .filter(|p| p["verdict"] == "skipped")
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        skipped,
        ["fp8-quantize-half-ulp", "fp8-copies-agree"],
        "{doc:#}"
    );
    for p in props {
        if p["verdict"] == "skipped" {
            let why = p["reason"].as_str().unwrap();
            assert!(
                why.contains("does not expose its quantised operands"),
                "{why}"
            );
            assert_eq!(p["cases"], 0);
        } else {
            assert_eq!(p["verdict"], "pass", "{p:#}");
        }
    }
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("skipped=\"2\""), "{xml}");
    assert_eq!(xml.matches("<skipped ").count(), 2, "{xml}");
}
