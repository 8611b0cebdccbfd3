//! `moecheck gemm --dtype fp8` and `moecheck check` on FP8 case directories, driven through
//! the real binary.

use assert_cmd::Command;
use predicates::prelude::*;

mod common;
use common::{with_defaults, SMALL_GEMM};

/// `moecheck gemm --dtype fp8` on a small routed case (two empty experts, a dropped tail),
/// where a flag in `extra` replaces the default of the same name.
fn fp8_gemm(extra: &[&str]) -> Command {
    with_defaults(&["gemm", "--dtype", "fp8"], &SMALL_GEMM, extra)
}

#[test]
fn fp8_emulate_passes_recipe_exact_and_reports_both_comparisons() {
    fp8_gemm(&[])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("not a GPU result"))
        .stdout(predicate::str::contains("recipe-exact"))
        .stdout(predicate::str::contains("against the unquantised f64 GEMM"))
        .stdout(predicate::str::contains("verdict: PASS"));
    let out = fp8_gemm(&["--json", "--scaling", "delayed", "--accum", "fast-promote"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "pass");
    assert_eq!(v["fp8"]["recipe"]["dout"]["format"], "e5m2");
    assert_eq!(v["fp8"]["recipe"]["scaling"]["kind"], "delayed");
    assert_eq!(v["fp8"]["recipe"]["accumulation"], "fast-promote");
    assert_eq!(v["fp8"]["high_precision"].as_array().unwrap().len(), 3);
}

/// K = 4096: every accumulation model passes with teeth (plain fast accumulation through the
/// running form of its bound: its worst case would admit zeros there).
#[test]
fn fp8_long_reduction_passes_every_accumulation_model_with_teeth() {
    for (acc, code) in [("exact", 0), ("fast", 0), ("fast-promote", 0)] {
        fp8_gemm(&[
            "--hidden", "4096", "--tokens", "8", "--ffn", "8", "--accum", acc,
        ])
        .assert()
        .code(code);
    }
}

#[test]
fn fp8_injected_bugs_fail_with_exit_1() {
    for bug in [
        "fp8-scale-inv-not-advanced",
        "fp8-amax-from-neighbour",
        "fp8-inverted-scale",
        "fp8-truncation",
        "fp8-e4m3-gradients",
        "fp8-colwise-own-scale",
    ] {
        fp8_gemm(&["--inject", bug])
            .assert()
            .code(1)
            .stdout(predicate::str::contains("verdict: FAIL"));
    }
    // The generated case has an all-zero lhs group: scale = inf gives NaN there.
    fp8_gemm(&["--inject", "fp8-zero-amax-inf-scale"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("NaN"));
}

#[test]
fn fp8_bad_flags_exit_2_naming_the_flag() {
    for (args, needle) in [
        (vec!["--rhs-scope", "group"], "--rhs-scope"),
        (vec!["--dout-format", "bf16"], "--dout-format"),
        (vec!["--accum", "kahan"], "kahan"),
        (vec!["--margin", "1"], "--scaling delayed"),
        (vec!["--inject", "nope"], "fp8-truncation"),
        (vec!["--out-dtype", "e4m3"], "--out-dtype"),
    ] {
        let out = fp8_gemm(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // FP8 flags without an FP8 dtype.
    let out = common::moecheck()
        .args([
            "gemm",
            "--experts",
            "4",
            "--tokens",
            "8",
            "--scaling",
            "current",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--scaling needs --dtype fp8"));
}

#[test]
fn fp8_dump_then_check_round_trips_and_catches_tampering() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("case");
    fp8_gemm(&["--dump", dir.to_str().unwrap()])
        .assert()
        .code(0);
    let json = std::fs::read_to_string(dir.join("case.json")).unwrap();
    assert!(json.contains("\"fp8\""), "{json}");
    let check = || {
        let mut c = common::moecheck();
        c.arg("check").arg(&dir);
        c
    };
    check()
        .assert()
        .code(0)
        .stdout(predicate::str::contains("recipe-exact"));
    // Change the largest output by one part in 10^4: far beyond the f32 accumulation bound,
    // far inside FP8's quantisation error.
    let p = dir.join("out.npy");
    // The emulated FP8 kernel's outputs are held, and dumped, in float32.
    let mut out: ndarray::Array2<f32> = ndarray_npy::read_npy(&p).unwrap();
    let (i, _) = out
        .indexed_iter()
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
        .unwrap();
    out[i] *= 1.0001;
    ndarray_npy::write_npy(&p, &out).unwrap();
    check().assert().code(1);
}

#[test]
fn numpy_fp8_adapter_passes_through_exec() {
    for extra in [
        &[][..],
        &["--scaling", "delayed"],
        &["--lhs-scope", "tensor", "--rhs-scope", "tensor"],
    ] {
        let mut args = vec![
            "--impl",
            "exec:python3 examples/adapters/numpy_fp8_grouped_gemm.py",
        ];
        args.extend_from_slice(extra);
        fp8_gemm(&args)
            .assert()
            .code(0)
            .stdout(predicate::str::contains("verdict: PASS"));
    }
    // The plain f32 adapter ignores the recipe: the recipe-exact check fails it.
    fp8_gemm(&[
        "--impl",
        "exec:python3 examples/adapters/numpy_grouped_gemm.py",
    ])
    .assert()
    .code(1);
}

#[test]
fn numpy_fp8_adapter_passes_as_a_worker() {
    for extra in [&[][..], &["--scaling", "delayed"]] {
        let mut args = vec![
            "--impl",
            "worker:python3 examples/adapters/numpy_fp8_grouped_gemm.py",
        ];
        args.extend_from_slice(extra);
        fp8_gemm(&args)
            .assert()
            .code(0)
            .stdout(predicate::str::contains("verdict: PASS"));
    }
}

#[test]
fn fp8_refuses_the_gemm_accumulator_flags_naming_accum() {
    for flags in [&["--acc", "bf16"][..], &["--acc-block", "32"][..]] {
        let out = fp8_gemm(flags).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(flags[0]) && err.contains("--accum"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

#[test]
fn fp8_delayed_dump_round_trips_its_scales_and_refuses_bad_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("case");
    fp8_gemm(&["--scaling", "delayed", "--dump", dir.to_str().unwrap()])
        .assert()
        .code(0);
    for f in ["lhs_scale.npy", "rhs_scale.npy", "dout_scale.npy"] {
        assert!(dir.join(f).is_file(), "{f} not written");
    }
    let check = || {
        let mut c = common::moecheck();
        c.arg("check").arg(&dir);
        c
    };
    check()
        .assert()
        .code(0)
        .stdout(predicate::str::contains("delayed scaling"));
    // The recipe declares the accumulation: the GEMM's --acc does not apply, nor does any
    // other operation's declaration flag.
    check()
        .args(["--acc", "bf16"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("fp8.accumulation"));
    for flags in [["--compute", "bf16"], ["--out-dtype", "f16"]] {
        check()
            .args(flags)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(flags[0]));
    }
    let p = dir.join("rhs_scale.npy");
    let mut s: ndarray::Array1<f32> = ndarray_npy::read_npy(&p).unwrap();
    s[0] = -s[0];
    ndarray_npy::write_npy(&p, &s).unwrap();
    check()
        .assert()
        .code(2)
        .stderr(predicate::str::contains("rhs_scale.npy"))
        .stderr(predicate::str::contains("positive finite"));
    // One scale too many for the scopes.
    ndarray_npy::write_npy(&p, &ndarray::Array1::<f32>::ones(s.len() + 1)).unwrap();
    check()
        .assert()
        .code(2)
        .stderr(predicate::str::contains("rhs_scale.npy"));
}

/// Delayed scaling without saturation: where the stale scale overflows E4M3 the recipe itself
/// gives NaN. The reference and the CPU model must pass (they used to fail with "got NaN, want
/// NaN, bound NaN"), the report says the NaN come from the recipe, and an implementation that
/// writes anything else there fails.
#[test]
fn fp8_delayed_without_saturation_matches_the_recipes_nan_exactly() {
    let flags = ["--scaling", "delayed", "--no-saturate", "--hidden", "64"];
    for imp in ["reference", "emulate"] {
        let mut args = flags.to_vec();
        args.extend(["--impl", imp]);
        fp8_gemm(&args)
            .assert()
            .code(0)
            .stdout(predicate::str::contains("NaN or inf in the recipe itself"))
            .stdout(predicate::str::contains("verdict: PASS"));
    }
    // The dump holds the NaN outputs; zeros in their place fail under `check`.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    let mut args = flags.to_vec();
    args.extend(["--impl", "reference", "--dump", d.to_str().unwrap()]);
    fp8_gemm(&args).assert().code(0);
    let mut out: ndarray::Array2<f64> = ndarray_npy::read_npy(d.join("out.npy")).unwrap();
    let nan = out.iter().filter(|v| v.is_nan()).count();
    assert!(nan > 0, "the case overflows");
    out.mapv_inplace(|v| if v.is_nan() { 0.0 } else { v });
    ndarray_npy::write_npy(d.join("out.npy"), &out).unwrap();
    common::moecheck()
        .arg("check")
        .arg(&d)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("got 0e0, want NaN"));
}

/// At DeepSeek-V3's K = 7168 the worst-case bound of fast accumulation is looser than the
/// values themselves: an all-zero output, and both planted scale bugs, used to PASS there,
/// and later the correct model was INCONCLUSIVE. The running form of the bound
/// (reference/src/fp8/running.rs) decides: the correct model PASSes, and the all-zero output
/// and both scale bugs FAIL element by element; so does a shape with longer groups.
#[test]
fn fast_accumulation_at_k_7168_is_never_a_pass_for_a_wrong_answer() {
    let at = |k: &'static str| {
        vec![
            "--experts",
            "4",
            "--tokens",
            "32",
            "--ffn",
            "8",
            "--hidden",
            k,
            "--accum",
            "fast",
            "--passes",
            "fwd",
        ]
    };
    let big = at("7168");
    // moecheck's default shape (8 experts, 512 tokens top-2, N = 128) at K = 7168.
    let default_shape = ["--hidden", "7168", "--passes", "fwd", "--accum", "fast"].to_vec();
    let run = |args: &[&str], small: bool| {
        if small {
            fp8_gemm(args)
        } else {
            let mut c = common::moecheck();
            c.args(["gemm", "--dtype", "fp8"]).args(args);
            c
        }
    };
    for (args, small) in [(&big, true), (&default_shape, false)] {
        run(args, small)
            .assert()
            .code(0)
            .stdout(predicate::str::contains(
                "accumulation fast: a bound under the model (k-blocks of 32 products into a 14-bit truncating accumulator)",
            ))
            .stdout(predicate::str::contains("verdict: PASS"));
        for inject in ["fp8-inverted-scale", "fp8-amax-from-neighbour"] {
            let mut args = args.to_vec();
            args.extend(["--inject", inject]);
            run(&args, small)
                .assert()
                .code(1)
                .stdout(predicate::str::contains("outside the bound"));
        }
    }
    // The recipe-exact values written, then zeroed: every element of the zeros fails.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    let mut args = big.to_vec();
    args.extend(["--impl", "reference", "--dump", d.to_str().unwrap()]);
    fp8_gemm(&args).assert().code(0);
    let out: ndarray::Array2<f64> = ndarray_npy::read_npy(d.join("out.npy")).unwrap();
    ndarray_npy::write_npy(d.join("out.npy"), &out.mapv(|_| 0.0)).unwrap();
    let o = common::moecheck()
        .args(["check", "--json"])
        .arg(&d)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(1), "{v:#}");
    assert_eq!(v["verdict"], "fail");
    // The bound's teeth: every non-zero value is many times its bound.
    let ratio = v["passes"][0]["zero_ratio"].as_f64().unwrap();
    assert!(ratio > 10.0, "{ratio}");
    assert!(v["fp8"]["model_check"].is_null(), "{v:#}");
}
