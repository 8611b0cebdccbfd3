//! `moecheck moe --shared-gate sigmoid` (Qwen2-MoE's `shared_expert_gate`): the gated shared
//! expert passes on the model and on JAX autodiff, its planted backward bug fails, its case
//! directory carries the gate and its gradient, and a gate without a shared expert is refused.

mod common;

use assert_cmd::Command;
use predicates::prelude::*;

fn moe(args: &[&str]) -> Command {
    let mut c = common::moecheck();
    c.arg("moe")
        .args(common::SMALL_MOE)
        .args(["--shared-ffn", "4", "--shared-gate", "sigmoid"])
        .args(args);
    c
}

#[test]
fn the_gated_shared_expert_passes_and_its_ungated_backward_fails() {
    moe(&[])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("dshared_gate  PASS"))
        .stdout(predicate::str::contains("verdict: PASS"));
    moe(&["--inject", "shared-gate-ungated-backward"])
        .assert()
        .code(1)
        .stdout(predicate::str::is_match(r"dshared_w0 +FAIL").unwrap())
        .stdout(predicate::str::contains("verdict: FAIL"));
}

#[test]
fn the_dump_carries_the_gate_and_check_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    moe(&["--dump", d.to_str().unwrap()]).assert().code(0);
    for f in ["shared_gate.npy", "dshared_gate.npy", "shared_wo.npy"] {
        assert!(d.join(f).is_file(), "{f} missing");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("case.json")).unwrap()).unwrap();
    assert_eq!(json["shared_gate"], "sigmoid");
    let mut check = common::moecheck();
    check
        .args(["check", d.to_str().unwrap()])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("dshared_gate"));
    // Without the gate's gradient the outputs are incomplete: a failed case, naming the file.
    std::fs::remove_file(d.join("dshared_gate.npy")).unwrap();
    let mut check = common::moecheck();
    let out = check.args(["check", d.to_str().unwrap()]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("dshared_gate.npy"), "{text}");
}

#[test]
fn a_case_json_gate_without_a_shared_expert_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    moe(&["--dump", d.to_str().unwrap()]).assert().code(0);
    let path = d.join("case.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["shared_ffn"] = 0.into();
    std::fs::write(&path, json.to_string()).unwrap();
    let mut check = common::moecheck();
    check
        .args(["check", d.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("case.json"))
        .stderr(predicate::str::contains("shared_gate"));
}

#[test]
fn a_gate_needs_a_shared_expert() {
    let mut c = common::moecheck();
    c.args(["moe", "--shared-gate", "sigmoid"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--shared-gate"))
        .stderr(predicate::str::contains("--shared-ffn"));
}

/// JAX autodiff of the gated layer (examples/adapters/jax_moe_layer.py) in f64 against the
/// reference's hand-written VJP, within the f64 bound.
#[test]
fn jax_autodiff_agrees_with_the_gated_reference() {
    moe(&[
        "--compute",
        "f64",
        "--out-dtype",
        "f64",
        "--impl",
        "exec:python3 examples/adapters/jax_moe_layer.py --f64",
    ])
    .assert()
    .code(0)
    .stdout(predicate::str::contains("dshared_gate  PASS"));
}
