//! gpt-oss's layer (`moecheck moe --convention hf-gpt-oss`, or `--activation clamped-swiglu
//! --expert-bias --router-bias`): the model passes and its three planted backward bugs fail,
//! JAX autodiff of the same layer agrees with the reference in f64, the case directory carries
//! the biases and their gradients, and a campaign against an external implementation that
//! declares none of these features draws none of them.

mod common;

use assert_cmd::Command;
use predicates::prelude::*;

const SHAPE: [&str; 10] = [
    "--tokens",
    "16",
    "--hidden",
    "8",
    "--ffn",
    "6",
    "--experts",
    "8",
    "--topk",
    "2",
];

fn moe(args: &[&str]) -> Command {
    let mut c = common::moecheck();
    c.arg("moe").args(SHAPE).args(args);
    c
}

#[test]
fn the_gpt_oss_layer_passes_and_each_planted_bug_fails() {
    moe(&["--convention", "hf-gpt-oss"])
        .assert()
        .code(0)
        .stdout(predicate::str::contains(
            "layer: activation clamped-swiglu, expert biases, router-logit bias",
        ))
        .stdout(predicate::str::is_match(r"drouter_bias +PASS").unwrap())
        .stdout(predicate::str::is_match(r"dexpert_bo +PASS").unwrap());
    for (bug, tensor) in [
        ("clamp-grad-ignored", "dw0"),
        ("router-bias-grad-missing", "drouter_bias"),
        ("down-bias-unweighted", "dexpert_bo"),
    ] {
        moe(&["--convention", "hf-gpt-oss", "--inject", bug])
            .assert()
            .code(1)
            .stdout(predicate::str::is_match(format!(r"{tensor} +FAIL")).unwrap());
    }
}

#[test]
fn the_flags_without_the_preset_build_the_same_layer() {
    let doc = common::json_ok(&mut moe(&[
        "--score",
        "topk-softmax",
        "--activation",
        "clamped-swiglu",
        "--expert-bias",
        "--router-bias",
        "--json",
    ]));
    assert_eq!(doc["shape"]["activation"], "clamped-swiglu", "{doc}");
    assert_eq!(doc["shape"]["expert_bias"], true);
    assert_eq!(doc["shape"]["router_bias"], true);
}

/// JAX autodiff (examples/adapters/jax_moe_layer.py) through the clamps and the biases against
/// the reference's hand-written VJP, within the f64 bound; and the dumped case reads back.
#[test]
fn jax_autodiff_agrees_and_the_dump_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    moe(&[
        "--convention",
        "hf-gpt-oss",
        "--compute",
        "f64",
        "--out-dtype",
        "f64",
        "--impl",
        "exec:python3 examples/adapters/jax_moe_layer.py --f64",
        "--dump",
        d.to_str().unwrap(),
    ])
    .assert()
    .code(0)
    .stdout(predicate::str::is_match(r"dexpert_b1 +PASS").unwrap());
    for f in [
        "router_bias.npy",
        "expert_b0.npy",
        "expert_bo.npy",
        "dexpert_b0.npy",
        "drouter_bias.npy",
    ] {
        assert!(d.join(f).is_file(), "{f} missing");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("case.json")).unwrap()).unwrap();
    assert_eq!(json["activation"], "clamped-swiglu");
    assert_eq!(
        (json["expert_bias"].clone(), json["router_bias"].clone()),
        (true.into(), true.into())
    );
    let mut check = common::moecheck();
    check
        .args(["check", d.to_str().unwrap()])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("drouter_bias"));
}

/// An external implementation that declares nothing of the new layer features (the numpy
/// adapter of the grouped GEMM has no layer at all; here a moe worker whose greeting says
/// nothing of them) must never be sent them: its campaign's cases are plain SwiGLU layers.
#[test]
fn an_external_layer_that_declares_nothing_gets_no_gpt_oss_case() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("prop.xml");
    let out = common::moecheck()
        .args([
            "prop",
            "--op",
            "moe",
            "--cases",
            "6",
            "--property",
            "layer-matches-reference",
        ])
        .args([
            "--impl",
            "exec:python3 examples/adapters/jax_moe_layer.py",
            "--json",
        ])
        .args(["--junit", junit.to_str().unwrap()])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["verdict"], "pass", "{doc}");
    let unexercised: Vec<&str> = doc["unexercised"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(unexercised.contains(&"clamped-swiglu"), "{unexercised:?}");
    assert!(unexercised.contains(&"shared-gate"), "{unexercised:?}");
}
