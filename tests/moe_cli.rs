//! Drives `moecheck moe`: the DeepSeek-V3-style command, planted layer bugs (exit 1), bad input
//! (exit 2 with a one-line reason), the JSON report, and agreement with the JAX adapter
//! (examples/adapters/jax_moe_layer.py: MaxText layer formulas, gradients by `jax.vjp`).

mod common;

use assert_cmd::Command;
use predicates::prelude::*;

fn moe(args: &[&str]) -> Command {
    let mut c = common::moecheck();
    c.arg("moe").args(args);
    c
}

/// Small shapes for the JAX runs (`ragged_dot` is slow on CPU and JAX slow to start).
const SMALL: [&str; 8] = [
    "--tokens",
    "12",
    "--hidden",
    "8",
    "--ffn",
    "6",
    "--experts",
    "8",
];

fn small(extra: &[&str]) -> Command {
    let mut a: Vec<&str> = SMALL.to_vec();
    a.extend_from_slice(extra);
    moe(&a)
}

#[test]
fn deepseek_v3_routing_layer_passes_on_the_model() {
    moe(&[
        "--experts",
        "256",
        "--topk",
        "8",
        "--groups",
        "8",
        "--topk-groups",
        "4",
        "--score",
        "sigmoid",
    ])
    .assert()
    .code(0)
    .stdout(predicate::str::contains("not a GPU result"))
    .stdout(predicate::str::contains("dw_router"))
    .stdout(predicate::str::contains("verdict: PASS"));
}

#[test]
fn reference_self_check_json_lists_every_tensor() {
    let out = small(&["--impl", "reference", "--shared-ffn", "4", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "pass");
    let names: Vec<&str> = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tensor"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "out",
            "dx",
            "dw_router",
            "dw0",
            "dw1",
            "dwo",
            "dshared_w0",
            "dshared_w1",
            "dshared_wo"
        ]
    );
    // Per-expert slices for the expert weight gradients.
    assert_eq!(v["tensors"][3]["slices"].as_array().unwrap().len(), 8);
}

#[test]
fn planted_layer_bugs_fail_with_exit_1() {
    // Many experts for few assignments (empty experts) and a tight capacity (dropping).
    let shape = [
        "--tokens",
        "8",
        "--hidden",
        "8",
        "--ffn",
        "4",
        "--experts",
        "16",
        "--topk",
        "2",
        "--capacity-factor",
        "1.0",
        "--drop-policy",
        "probs",
    ];
    for (bug, tensor) in [
        ("sort-backward-not-inverse", "dx"),
        ("dropped-leak-gradient", "dw"),
        ("empty-expert-stale-wgrad", "expert"),
        ("combine-grad-missing", "dw_router"),
    ] {
        let mut a = shape.to_vec();
        a.extend_from_slice(&["--inject", bug]);
        moe(&a)
            .assert()
            .code(1)
            .stdout(predicate::str::contains(tensor))
            .stdout(predicate::str::contains("verdict: FAIL"));
    }
}

#[test]
fn bad_input_exits_2_with_a_one_line_reason() {
    for (args, needle) in [
        (vec!["--experts", "8", "--topk", "9"], "--topk"),
        (
            vec!["--experts", "8", "--groups", "3", "--topk-groups", "1"],
            "--groups",
        ),
        (
            vec!["--experts", "8", "--groups", "4", "--topk-groups", "5"],
            "--topk-groups",
        ),
        (vec!["--tokens", "0"], "--tokens"),
        (vec!["--inject", "no-such-bug"], "--inject"),
        (
            vec!["--impl", "reference", "--inject", "combine-grad-missing"],
            "--inject",
        ),
        (vec!["--impl", "gpu"], "--impl"),
        (vec!["--scaling-factor", "nan"], "--scaling-factor"),
        (vec!["--capacity-factor", "1.0"], "--drop-policy"),
    ] {
        let out = moe(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn failing_program_is_a_failed_case() {
    small(&["--impl", "exec:sh -c 'exit 3'"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("run failed"));
}

#[test]
fn dump_writes_the_case_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    small(&["--bias", "--shared-ffn", "2", "--dump", d.to_str().unwrap()])
        .assert()
        .code(0);
    for f in [
        "case.json",
        "x.npy",
        "w_router.npy",
        "bias.npy",
        "w0.npy",
        "w1.npy",
        "wo.npy",
        "shared_w0.npy",
        "dout.npy",
        "out.npy",
        "dx.npy",
        "dw_router.npy",
        "dshared_wo.npy",
    ] {
        assert!(d.join(f).is_file(), "{f} missing");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("case.json")).unwrap()).unwrap();
    assert_eq!(json["op"], "moe_layer");
    assert_eq!(json["shared_ffn"], 2);
}

/// The reference's layer output and every gradient against JAX autodiff of the MaxText layer,
/// in f32 (bound for compute f32) and f64 (bound for compute f64, which pins the hand-written
/// VJP to autodiff within a few f64 roundings).
#[test]
fn jax_adapter_agrees_with_the_reference() {
    let jax = "exec:python3 examples/adapters/jax_moe_layer.py";
    let jax64 = "exec:python3 examples/adapters/jax_moe_layer.py --f64";
    let cases: [Vec<&str>; 3] = [
        vec![
            "--impl",
            jax,
            "--topk",
            "3",
            "--score",
            "sigmoid",
            "--groups",
            "4",
            "--topk-groups",
            "2",
            "--bias",
            "--scaling-factor",
            "2.5",
            "--shared-ffn",
            "4",
            "--capacity-factor",
            "0.75",
            "--drop-policy",
            "probs",
        ],
        vec![
            "--impl",
            jax64,
            "--compute",
            "f64",
            "--out-dtype",
            "f64",
            "--topk",
            "2",
            "--score",
            "topk-softmax",
            "--capacity-factor",
            "0.5",
            "--drop-policy",
            "position",
            "--seq-len",
            "6",
            "--seed",
            "1",
        ],
        vec![
            "--impl",
            jax64,
            "--compute",
            "f64",
            "--out-dtype",
            "f64",
            "--topk",
            "2",
            "--score",
            "softmax",
            "--norm-topk",
            "--bias",
            "--shared-ffn",
            "3",
            "--dtype",
            "f32",
            "--seed",
            "2",
        ],
    ];
    for args in cases {
        small(&args)
            .assert()
            .code(0)
            .stdout(predicate::str::contains("verdict: PASS"));
    }
}

/// The JAX layer as a persistent worker (protocol v2), f32 and f64 (`--f64`: the adapter's
/// own flag, given to the worker too).
#[test]
fn jax_adapter_passes_as_a_worker() {
    let runs: [&[&str]; 2] = [
        &[
            "--impl",
            "worker:python3 examples/adapters/jax_moe_layer.py",
            "--topk",
            "3",
            "--score",
            "sigmoid",
            "--groups",
            "4",
            "--topk-groups",
            "2",
            "--bias",
            "--shared-ffn",
            "4",
        ],
        &[
            "--impl",
            "worker:python3 examples/adapters/jax_moe_layer.py --f64",
            "--compute",
            "f64",
            "--out-dtype",
            "f64",
            "--topk",
            "2",
        ],
    ];
    for args in runs {
        small(args)
            .assert()
            .code(0)
            .stdout(predicate::str::contains("verdict: PASS"));
    }
}

/// `--dump` runs the implementation once and dumps the outputs that were checked: an exec:
/// program (a wrapper around the JAX adapter that counts its runs and keeps a copy of what
/// it wrote) runs exactly once, the dumped outputs equal its outputs bit for bit, and
/// `moecheck check` re-verifies the directory.
#[test]
fn dump_runs_the_program_once_and_dumps_the_checked_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("runs");
    let kept = dir.path().join("written");
    std::fs::create_dir(&kept).unwrap();
    let adapter = std::env::current_dir()
        .unwrap()
        .join("examples/adapters/jax_moe_layer.py");
    let wrapper = dir.path().join("counted.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho run >> '{}'\npython3 '{}' --f64 \"$1\" || exit $?\ncp \"$1\"/*.npy '{}'/\n",
            counter.display(),
            adapter.display(),
            kept.display()
        ),
    )
    .unwrap();
    let d = dir.path().join("case");
    let imp = format!("exec:sh {}", wrapper.display());
    small(&[
        "--impl",
        &imp,
        "--compute",
        "f64",
        "--out-dtype",
        "f64",
        "--shared-ffn",
        "3",
        "--capacity-factor",
        "0.75",
        "--drop-policy",
        "probs",
        "--dump",
        d.to_str().unwrap(),
    ])
    .assert()
    .code(0)
    .stdout(predicate::str::contains("verdict: PASS"));
    let runs = std::fs::read_to_string(&counter).unwrap();
    assert_eq!(
        runs.lines().count(),
        1,
        "the program ran {} times",
        runs.lines().count()
    );
    for name in [
        "out",
        "dx",
        "dw_router",
        "dw0",
        "dw1",
        "dwo",
        "dshared_w0",
        "dshared_w1",
        "dshared_wo",
    ] {
        let file = format!("{name}.npy");
        let dumped: ndarray::ArrayD<f64> = ndarray_npy::read_npy(d.join(&file)).unwrap();
        let written: ndarray::ArrayD<f64> = ndarray_npy::read_npy(kept.join(&file)).unwrap();
        assert_eq!(dumped.shape(), written.shape(), "{file}");
        assert!(
            dumped
                .iter()
                .zip(&written)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{file}: the dumped outputs are not the ones the program wrote"
        );
    }
    common::moecheck()
        .args([
            "check",
            d.to_str().unwrap(),
            "--compute",
            "f64",
            "--out-dtype",
            "f64",
        ])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("verdict: PASS"));
}

/// A dumped case with the model's outputs passes `moecheck check`; a tampered gradient fails.
#[test]
fn dumped_layer_case_is_rechecked_and_tampering_fails() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    small(&["--bias", "--dump", d.to_str().unwrap()])
        .assert()
        .code(0);
    let check = || {
        let mut c = common::moecheck();
        c.args(["check", d.to_str().unwrap()]);
        c
    };
    check().assert().code(0);
    let p = d.join("dw_router.npy");
    let mut g: ndarray::Array2<f64> = ndarray_npy::read_npy(&p).unwrap();
    g[[1, 2]] += 1e-3;
    ndarray_npy::write_npy(&p, &g).unwrap();
    check()
        .assert()
        .code(1)
        .stdout(predicate::str::is_match(r"dw_router +FAIL").unwrap());
}

/// `--compute` and `--out-dtype` declare an exec: implementation's precision; a built-in
/// implementation declares its own, so with one they are refused (exit 2).
#[test]
fn declaration_flags_need_an_exec_implementation() {
    for (args, needle) in [
        (vec!["--compute", "bf16"], "--compute"),
        (
            vec!["--impl", "reference", "--out-dtype", "f64"],
            "--out-dtype",
        ),
    ] {
        let out = moe(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle) && err.contains("declares its own"),
            "{args:?}: {err}"
        );
    }
}

/// `--router-compute`: an f64 layer whose router gradient is f32 (an f64 Hugging Face module
/// with its f32 router) fails `check --compute f64` naming dw_router and passes with
/// `--router-compute f32`, which the report states; a built-in implementation refuses it.
#[test]
fn router_compute_is_declared_apart_from_compute() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    small(&["--impl", "reference", "--dump", d.to_str().unwrap()])
        .assert()
        .code(0);
    let p = d.join("dw_router.npy");
    let g: ndarray::Array2<f64> = ndarray_npy::read_npy(&p).unwrap();
    ndarray_npy::write_npy(&p, &g.mapv(|v| v as f32 as f64)).unwrap();
    let check = |extra: &[&str]| {
        common::moecheck()
            .args(["check", d.to_str().unwrap(), "--compute", "f64"])
            .args(["--out-dtype", "f64"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = check(&[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("dw_router     FAIL"), "{text}");
    let out = check(&["--router-compute", "f32"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("compute f64, router f32, output f64"),
        "{text}"
    );
    let out = small(&["--impl", "emulate", "--router-compute", "f32"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--router-compute"), "{err}");
    // A router that cannot hold the inputs: its bound would take them as exact.
    let out = small(&[
        "--dtype",
        "f32",
        "--router-compute",
        "bf16",
        "--impl",
        "exec:true",
    ])
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--router-compute bf16") && err.contains("f32"),
        "{err}"
    );
}
