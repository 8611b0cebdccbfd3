//! Drives the real `moecheck train` binary: logs that `curves diff` reads without options,
//! every implementation kind (in-process, exec:, worker:), `--compare` verdicts, and exit 2
//! with one line for bad flags or a file it must not replace.

mod common;

use std::path::Path;

use assert_cmd::Command;
use predicates::prelude::*;

use common::moecheck;

/// A small model: a few seconds in a debug build.
const SMALL: [&str; 12] = [
    "--experts",
    "4",
    "--hidden",
    "8",
    "--ffn",
    "8",
    "--vocab",
    "8",
    "--batch",
    "32",
    "--layers",
    "1",
];

fn train(args: &[&str]) -> Command {
    let mut c = moecheck();
    c.arg("train").args(SMALL).args(args);
    c
}

fn adapter(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/adapters")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn plain_and_jsonl_logs_are_read_by_curves_without_options() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("run.log");
    let jsonl = dir.path().join("run.jsonl");
    for log in [&plain, &jsonl] {
        train(&["--impl", "reference", "--steps", "40", "--log"])
            .arg(log)
            .assert()
            .success()
            .stdout(predicate::str::contains("floor"));
    }
    // Both logs hold the same run: every loss agrees to the 6 printed decimals.
    let read = |p: &Path| -> serde_json::Value {
        let out = moecheck()
            .args(["curves", "read", "--json"])
            .arg(p)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        serde_json::from_slice(&out).unwrap()
    };
    let (a, b) = (read(&plain), read(&jsonl));
    assert_eq!(a["format"], "plain", "{a}");
    assert_eq!(b["format"], "maxtext-jsonl", "{b}");
    for doc in [&a, &b] {
        let loss = doc["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["metric"] == "loss")
            .unwrap_or_else(|| panic!("no loss: {doc}"));
        assert_eq!(loss["samples"], 40, "{doc}");
    }
    // A log against itself passes; against a run from another init seed it does not pass.
    moecheck()
        .args(["curves", "diff"])
        .args([&plain, &jsonl])
        .assert()
        .code(0);
    let other = dir.path().join("other.log");
    train(&[
        "--impl",
        "reference",
        "--steps",
        "40",
        "--init-seed",
        "7",
        "--log",
    ])
    .arg(&other)
    .assert()
    .success();
    moecheck()
        .args(["curves", "diff"])
        .args([&plain, &other])
        .assert()
        .code(predicate::in_iter([1, 3]));
}

#[test]
fn exec_and_worker_implementations_train_and_match_the_reference_curve() {
    let dir = tempfile::tempdir().unwrap();
    let numpy = adapter("numpy_grouped_gemm.py");
    let mut logs = Vec::new();
    for (name, imp) in [
        ("reference", "reference".to_string()),
        ("exec", format!("exec:python3 {numpy}")),
        ("worker", format!("worker:python3 {numpy}")),
    ] {
        let log = dir.path().join(format!("{name}.log"));
        train(&["--dtype", "f32", "--steps", "3", "--impl", &imp, "--log"])
            .arg(&log)
            .assert()
            .success();
        let losses: Vec<f64> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
            .map(|l| l.split(' ').nth(1).unwrap().parse().unwrap())
            .collect();
        assert_eq!(losses.len(), 3, "{name}");
        logs.push(losses);
    }
    // numpy's f32 GEMMs and the f64 reference on the same f32 operands: the same curve to
    // far better than the loss's spread over steps.
    for l in &logs[1..] {
        for (a, b) in l.iter().zip(&logs[0]) {
            assert!((a - b).abs() < 1e-3, "{l:?} vs {:?}", logs[0]);
        }
    }
}

#[test]
fn compare_passes_the_reference_and_fails_a_visible_bug() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("arms");
    train(&["--impl", "reference", "--steps", "60", "--compare", "--out"])
        .arg(&out)
        .assert()
        .code(0)
        .stdout(predicate::str::contains("verdict: PASS"))
        .stdout(predicate::str::contains("reproduce the verdict"));
    for f in ["base.log", "base2.log", "test.log"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    // The verdict again from the files, as the printed line says.
    moecheck()
        .args(["curves", "diff"])
        .arg(out.join("base.log"))
        .arg(out.join("test.log"))
        .arg("--baseline2")
        .arg(out.join("base2.log"))
        .assert()
        .code(0);
    let json = train(&[
        "--impl",
        "emulate",
        "--inject",
        "partial-m-tile-dropped",
        "--steps",
        "60",
        "--compare",
        "--json",
    ])
    .assert()
    .code(1)
    .get_output()
    .stdout
    .clone();
    let doc: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(doc["curves"]["verdict"], "fail", "{doc}");
    assert_eq!(doc["arms"].as_array().unwrap().len(), 3);
    assert_eq!(doc["arms"][2]["is_model"], true);
    // The bug leaves rows of a partial tile unwritten (NaN): the model reads them at once.
    let why = doc["arms"][2]["diverged_because"].as_str().unwrap();
    assert!(why.contains("GEMM wrote NaN"), "{why}");
}

/// Piped (stderr not a terminal): one line per phase on stderr, so a long comparison is not
/// silent. See: issue 41.
#[test]
fn compare_prints_one_line_per_phase_when_piped() {
    let out = train(&["--impl", "reference", "--steps", "10", "--compare"])
        .assert()
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8_lossy(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 4, "{err}");
    for (i, role) in ["base", "base2", "test"].iter().enumerate() {
        let want = format!("run {}/3 ({role}) done: 10 steps in", i + 1);
        assert!(lines[i].contains(&want), "{err}");
    }
    assert!(lines[3].contains("curves verdict"), "{err}");
}

/// Issue 42, item 10: with `--lr 1` every arm diverges at step 1; the verdict says the runs
/// diverged (and to lower --lr), not "log more steps".
#[test]
fn compare_says_when_every_run_diverged() {
    let out = train(&[
        "--impl",
        "reference",
        "--steps",
        "20",
        "--lr",
        "1",
        "--compare",
        "--json",
    ])
    .assert()
    .code(3)
    .get_output()
    .stdout
    .clone();
    let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let why = doc["curves"]["reasons"][0].as_str().unwrap();
    assert!(why.starts_with("the runs diverged"), "{why}");
    assert!(
        why.contains("base at step 1") && why.contains("test at step 1"),
        "{why}"
    );
    let advice = doc["curves"]["suggestion"].as_str().unwrap();
    assert!(advice.contains("lower --lr"), "{advice}");
    assert!(!doc["curves"].to_string().contains("log more steps"));
}

#[test]
fn json_run_states_the_floor_and_every_step() {
    let out = train(&["--impl", "reference", "--steps", "5", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(doc["steps"].as_array().unwrap().len(), 5);
    let floor = doc["loss_floor"].as_f64().unwrap();
    assert!(floor > 0.0 && floor < doc["uniform_loss"].as_f64().unwrap());
}

#[test]
fn bad_flags_and_foreign_files_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("notes.log");
    std::fs::write(&foreign, "my notes\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--experts".into(), "0".into()], "--experts"),
        (vec!["--topk".into(), "9".into()], "topk"),
        (vec!["--inject".into(), "no-such-bug".into()], "--inject"),
        (
            vec![
                "--dtype".into(),
                "fp8".into(),
                "--inject".into(),
                "tail-rows-uninitialised".into(),
            ],
            "--inject",
        ),
        (vec!["--lr".into(), "0".into()], "--lr"),
        (vec!["--log".into(), foreign.display().to_string()], "--log"),
        (
            vec![
                "--impl".into(),
                "reference".into(),
                "--timeout".into(),
                "5".into(),
            ],
            "--timeout",
        ),
    ];
    for (args, names) in cases {
        let assert = train(&["--steps", "2"]).args(&args).assert().code(2);
        let err = String::from_utf8_lossy(&assert.get_output().stderr).to_string();
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(names), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read_to_string(&foreign).unwrap(), "my notes\n");
    // Its own log is replaced.
    let own = dir.path().join("own.log");
    for _ in 0..2 {
        train(&["--impl", "reference", "--steps", "2", "--log"])
            .arg(&own)
            .assert()
            .success();
    }
}
