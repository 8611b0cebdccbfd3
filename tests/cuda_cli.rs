//! The CUDA backend's FP8 GEMM and routing through the real binary, on a machine without a
//! GPU: input errors are exit 2 naming the flag, and a run without a device is a failed case
//! (exit 1) saying "no CUDA device" — never a pass, never a panic.

mod common;

use predicates::prelude::*;

use common::moecheck;

/// Whether a CUDA device is usable here (the tests below are about its absence).
fn device_present() -> bool {
    let probe = moecheck().args(["devices", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
    v["available"] == true
}

const SMALL: [&str; 6] = ["--tokens", "8", "--hidden", "8", "--ffn", "8"];

#[test]
fn fp8_cuda_without_a_device_is_a_failed_case() {
    if device_present() {
        println!("a CUDA device is present: this test is about its absence");
        return;
    }
    for extra in [
        &[][..],
        &["--lhs-scope", "tensor", "--rhs-scope", "tensor"][..],
    ] {
        let out = moecheck()
            .args(["gemm", "--dtype", "fp8", "--impl", "cuda"])
            .args(SMALL)
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("run failed: no CUDA device"), "{text}");
        assert!(text.contains("accumulation exact"), "{text}");
    }
}

#[test]
fn fp8_cuda_refuses_recipes_the_kernels_do_not_implement() {
    for (flags, named) in [
        (&["--accum", "fast"][..], "--accum"),
        (&["--no-saturate"][..], "--no-saturate"),
        (&["--dout-format", "e4m3"][..], "--dout-format"),
        (&["--scaling", "delayed"][..], "--scaling"),
    ] {
        moecheck()
            .args(["gemm", "--dtype", "fp8", "--impl", "cuda"])
            .args(SMALL)
            .args(flags)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(named));
    }
    moecheck()
        .args(["gemm", "--dtype", "fp8", "--impl", "cublas"])
        .args(SMALL)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--impl cublas"));
}

#[test]
fn route_cuda_without_a_device_is_a_failed_case() {
    if device_present() {
        println!("a CUDA device is present: this test is about its absence");
        return;
    }
    let out = moecheck()
        .args([
            "route", "--impl", "cuda", "--topk", "8", "--score", "sigmoid",
        ])
        .args([
            "--tokens",
            "64",
            "--experts",
            "32",
            "--groups",
            "4",
            "--topk-groups",
            "2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("run failed: no CUDA device"), "{text}");
}

#[test]
fn route_cuda_refuses_the_probs_policy() {
    moecheck()
        .args([
            "route", "--impl", "cuda", "--topk", "2", "--score", "softmax",
        ])
        .args(["--capacity-factor", "1", "--drop-policy", "probs"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--drop-policy probs"));
}
