//! Drives the real `moecheck` binary: verdicts, exit codes, and one-line reasons for bad input.

use assert_cmd::Command;
use predicates::prelude::*;

mod common;
use common::{moecheck, with_defaults, SMALL_GEMM};

/// `moecheck gemm` on the small case, where a flag given in `extra` replaces the default of the
/// same name.
fn gemm(extra: &[&str]) -> Command {
    with_defaults(&["gemm"], &SMALL_GEMM, extra)
}

/// `gemm(extra)` dumped into a fresh directory's `case`, exiting `code`: the directory (kept
/// while it lives) and the case directory's path.
fn dumped(extra: &[&str], code: i32) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    gemm(&[extra, &["--dump", d.to_str().unwrap()]].concat())
        .assert()
        .code(code);
    (dir, d)
}

#[test]
fn gemm_default_emulate_passes_and_says_it_is_a_model() {
    gemm(&[])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("not a GPU result"))
        .stdout(predicate::str::contains("verdict: PASS"));
}

#[test]
fn gemm_reference_self_check_json() {
    let out = gemm(&["--impl", "reference", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "pass");
    assert_eq!(v["passes"].as_array().unwrap().len(), 3);
    // Per-group entries: 6 experts plus the tail for fwd.
    assert_eq!(v["passes"][0]["groups"].as_array().unwrap().len(), 7);
}

#[test]
fn injected_bugs_fail_with_exit_1_and_name_the_group() {
    for (bug, needle) in [
        ("empty-expert-wgrad-not-zeroed", "wgrad"),
        ("tail-rows-uninitialised", "tail"),
        ("low-precision-accumulator", "FAIL"),
    ] {
        gemm(&["--drop-frac", "0.2", "--inject", bug])
            .assert()
            .code(1)
            .stdout(predicate::str::contains(needle))
            .stdout(predicate::str::contains("verdict: FAIL"));
    }
}

#[test]
fn tail_ignored_is_reported_and_relaxes_only_the_tail() {
    gemm(&[
        "--drop-frac",
        "0.2",
        "--inject",
        "tail-rows-uninitialised",
        "--tail",
        "ignored",
    ])
    .assert()
    .code(0)
    .stdout(predicate::str::contains("NOT CHECKED"));
}

#[test]
fn bad_flags_exit_2_with_one_line_reason() {
    let cases: [(&[&str], &str); 6] = [
        (&["--dtype", "int7"], "int7"),
        (&["--topk", "9"], "--topk"),
        (&["--drop-frac", "1.5"], "--drop-frac"),
        (&["--impl", "nonsense"], "--impl"),
        (&["--inject", "no-such-bug"], "no-such-bug"),
        (
            &["--impl", "reference", "--inject", "tail-rows-uninitialised"],
            "--inject",
        ),
    ];
    for (args, needle) in cases {
        let out = gemm(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn k_zero_and_all_dropped_are_legal() {
    gemm(&["--hidden", "0"]).assert().code(0);
    gemm(&["--empty", "6", "--drop-frac", "1"]).assert().code(0);
}

#[test]
fn dump_then_check_round_trips_and_catches_tampering() {
    let (_dir, d) = dumped(&[], 0);
    moecheck().arg("check").arg(&d).assert().code(0);
    // Tamper: write an output of the wrong shape, then of the wrong dtype. Wrong outputs are
    // the implementation's failure, as under exec: (issue 42, item 16): exit 1, naming out.npy.
    let good: ndarray::Array2<f32> = ndarray_npy::read_npy(d.join("out.npy")).unwrap();
    let bad = ndarray::Array2::<f32>::zeros((3, 3));
    ndarray_npy::write_npy(d.join("out.npy"), &bad).unwrap();
    moecheck()
        .arg("check")
        .arg(&d)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("out.npy"))
        .stderr(predicate::str::contains("panicked").not());
    ndarray_npy::write_npy(d.join("out.npy"), &good.mapv(|v| v as i32)).unwrap();
    moecheck()
        .arg("check")
        .arg(&d)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("out.npy"));
}

/// A declaration recorded in case.json that no implementation can make (`acc_block: 0`) is
/// bad input naming the file and its key, not a flag the user never gave (issue 42, "Also").
#[test]
fn a_recorded_declaration_is_refused_naming_case_json() {
    let (_dir, d) = dumped(&[], 0);
    let path = d.join("case.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    doc["declared"] = serde_json::json!({"acc_block": 0});
    std::fs::write(&path, doc.to_string()).unwrap();
    let o = moecheck().arg("check").arg(&d).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("case.json") && err.contains("acc_block 0"),
        "{err}"
    );
    assert!(!err.contains("--acc-block"), "{err}");
}

/// A kernel that rounds to bf16 what an f32 case asks for (cuBLAS's grouped GEMM, seen on an
/// H200): `check` fails it as f32, names `--out-dtype bf16`, and passes it so declared,
/// saying so in the text and the JSON. A dump records such a declaration (here: by hand).
#[test]
fn check_takes_a_declared_output_format_for_a_grouped_gemm() {
    let (_dir, d) = dumped(&["--impl", "reference", "--out-dtype", "bf16"], 0);
    let json = d.join("case.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["out_dtype"], "bf16");
    doc["out_dtype"] = "f32".into();
    std::fs::write(&json, doc.to_string()).unwrap();
    moecheck()
        .arg("check")
        .arg(&d)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "declare it with --out-dtype bf16 on moecheck check",
        ));
    moecheck()
        .args(["check", "--out-dtype", "bf16"])
        .arg(&d)
        .assert()
        .code(0)
        .stdout(predicate::str::contains(
            "declared output: bf16 (the implementation rounds to it, not to the case's f32)",
        ));
    let out = moecheck()
        .args(["check", "--out-dtype", "bf16", "--json"])
        .arg(&d)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["precision"]["output"], "bf16");
    assert_eq!(v["out_dtype"], "f32");
    // Recorded in case.json, as a dump of such a kernel records it.
    doc["declared"]["out_dtype"] = "bf16".into();
    std::fs::write(&json, doc.to_string()).unwrap();
    moecheck().arg("check").arg(&d).assert().code(0);
}

/// Tail rows and empty experts' `drhs` must be exactly 0: in a float64 output file, 1e-50
/// (far below f32's smallest subnormal) fails. It used to pass against a "bound" of half an
/// f32 subnormal.
#[test]
fn exact_zeros_are_exact_in_float64_output_files() {
    let (_dir, d) = dumped(&["--impl", "reference"], 0);
    let sizes: ndarray::Array1<i64> =
        ndarray_npy::read_npy::<_, ndarray::Array1<i32>>(d.join("group_sizes.npy"))
            .map(|a| a.mapv(i64::from))
            .or_else(|_| ndarray_npy::read_npy(d.join("group_sizes.npy")))
            .unwrap();
    let used = sizes.sum() as usize;
    // The reference writes the case's output format, float32 here: widened to float64, where
    // 1e-50 is a value.
    let narrow: ndarray::Array2<f32> = ndarray_npy::read_npy(d.join("out.npy")).unwrap();
    let mut wide = narrow.mapv(f64::from);
    assert!(used < wide.nrows(), "the case has tail rows");
    wide.slice_mut(ndarray::s![used.., ..]).fill(1e-50);
    ndarray_npy::write_npy(d.join("out.npy"), &wide).unwrap();
    moecheck()
        .arg("check")
        .arg(&d)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "got 1e-50, want 0e0, bound 0 (contract)",
        ));
}

#[test]
fn check_missing_dir_exits_2() {
    moecheck()
        .args(["check", "/nonexistent/moecheck-case"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("/nonexistent/moecheck-case"));
}

/// Issue 10's defect: a declaration flag (`--acc`, `--acc-block`) or `--timeout` given with an
/// implementation that cannot honour it was silently ignored. Every built-in implementation
/// now refuses them with exit 2 and a reason naming the flag.
#[test]
fn flags_an_implementation_cannot_honour_exit_2() {
    for imp in ["reference", "emulate", "cuda", "cublas"] {
        for (flags, reason) in [
            (&["--acc", "bf16"][..], "declares its own accumulator"),
            (&["--acc-block", "32"][..], "declares its own accumulator"),
            (&["--timeout", "5"][..], "runs inside moecheck"),
        ] {
            let mut args = vec!["--impl", imp];
            args.extend(flags);
            let out = gemm(&args).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(
                err.contains(flags[0]) && err.contains(reason),
                "{args:?}: {err}"
            );
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        }
    }
    // A flag another operation reads, and one check does not apply to this case.
    let out = gemm(&["--impl", "exec:true", "--compute", "f64"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// ... and an exec: implementation takes the declaration: the report says so and the bound
/// follows it (bf16 accumulation passes the f32 adapter; an f32 declaration is the default).
#[test]
fn exec_declares_its_accumulator_with_acc() {
    let adapter = "exec:python3 examples/adapters/numpy_grouped_gemm.py";
    let out = gemm(&[
        "--impl",
        adapter,
        "--dtype",
        "f32",
        "--acc",
        "bf16",
        "--acc-block",
        "16",
        "--json",
    ])
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["precision"]["accumulator"]["format"], "bf16");
    assert_eq!(v["precision"]["accumulator"]["block"], 16);
}

#[test]
fn numpy_adapter_passes_through_exec() {
    gemm(&[
        "--impl",
        "exec:python3 examples/adapters/numpy_grouped_gemm.py",
        "--dtype",
        "f32",
    ])
    .assert()
    .code(0)
    .stdout(predicate::str::contains("verdict: PASS"));
}

/// JAX's native `lax.ragged_dot` and its autodiff: the first check against an implementation
/// nobody here wrote. Kept small: ragged_dot on CPU masks densely.
#[test]
fn jax_adapter_passes_through_exec() {
    // With bf16 inputs, jax.vjp returns the gradients in the primal's dtype (bf16) even with
    // preferred_element_type=float32, so the declared output format is bf16 there.
    for (dtype, out) in [("f32", "f32"), ("bf16", "bf16")] {
        let jax = "exec:python3 examples/adapters/jax_ragged_dot.py";
        gemm(&["--impl", jax, "--dtype", dtype, "--out-dtype", out])
            .assert()
            .code(0)
            .stdout(predicate::str::contains("verdict: PASS"));
    }
}

/// The same adapters as persistent workers (protocol v2): `--impl worker:CMD` takes the
/// same declaration flags and `--timeout` as exec:.
#[test]
fn numpy_and_jax_adapters_pass_as_workers() {
    let runs: [&[&str]; 3] = [
        &[
            "--impl",
            "worker:python3 examples/adapters/numpy_grouped_gemm.py",
            "--dtype",
            "f32",
            "--acc",
            "f32",
            "--timeout",
            "120",
        ],
        &[
            "--impl",
            "worker:python3 examples/adapters/jax_ragged_dot.py",
            "--dtype",
            "f32",
        ],
        &[
            "--impl",
            "worker:python3 examples/adapters/jax_ragged_dot.py",
            "--dtype",
            "bf16",
            "--out-dtype",
            "bf16",
        ],
    ];
    for args in runs {
        gemm(args)
            .assert()
            .code(0)
            .stdout(predicate::str::contains("implementation: worker:python3"))
            .stdout(predicate::str::contains("verdict: PASS"));
    }
}

/// A worker that fails is a failed case (exit 1) naming the reason, never a usage error.
#[test]
fn worker_failure_is_a_failed_case_not_a_usage_error() {
    gemm(&["--impl", "worker:echo hello"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "run failed: worker 'echo hello' greeted with 'hello'",
        ));
    gemm(&["--impl", "worker:sleep 30", "--timeout", "1"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("did not greet within 1.0 s"));
}

#[test]
fn exec_failure_is_a_failed_case_not_a_usage_error() {
    gemm(&["--impl", "exec:sh -c 'exit 3'"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("run failed"));
}

#[test]
fn selftest_catches_every_planted_bug() {
    moecheck()
        .args(["selftest", "--cases", "24"])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("caught"))
        // Every shrink finishes inside RunConfig's budget: proptest stays silent.
        .stderr(predicate::str::contains("Aborting shrinking").not())
        .stdout(predicate::str::contains("note: with --cases").not());
    // One case per property cannot reach every bug's edge case: the selftest fails, and says
    // why instead of leaving the user to guess.
    moecheck()
        .args(["selftest", "--cases", "1"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "note: with --cases 1 each property sees only 1 case(s) per implementation",
        ))
        .stdout(predicate::str::contains("selftest: FAILED"));
}

/// Bad inputs in a case directory: exit 2 and a one-line reason naming the file.
#[test]
fn malformed_case_dirs_exit_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    gemm(&["--dump", base.to_str().unwrap()]).assert().code(0);
    type Damage = fn(&std::path::Path);
    let damages: [(&str, Damage, &str); 7] = [
        (
            "truncated header",
            |d| std::fs::write(d.join("lhs.npy"), b"\x93NUMPY\x01\x00").unwrap(),
            "lhs.npy",
        ),
        (
            "wrong magic",
            |d| std::fs::write(d.join("rhs.npy"), b"hello world, not an npy file").unwrap(),
            "rhs.npy",
        ),
        (
            "int16 sizes",
            |d| {
                ndarray_npy::write_npy(d.join("group_sizes.npy"), &ndarray::Array1::<i16>::zeros(6))
                    .unwrap()
            },
            "group_sizes.npy",
        ),
        (
            "negative size",
            |d| {
                let mut s = ndarray::Array1::<i32>::zeros(6);
                s[2] = -1;
                ndarray_npy::write_npy(d.join("group_sizes.npy"), &s).unwrap()
            },
            "negative",
        ),
        (
            "sizes exceed M",
            |d| {
                ndarray_npy::write_npy(
                    d.join("group_sizes.npy"),
                    &ndarray::Array1::<i32>::from_elem(6, 1000),
                )
                .unwrap()
            },
            "more than",
        ),
        (
            "NaN in lhs",
            |d| {
                let mut a: ndarray::Array2<f32> = ndarray_npy::read_npy(d.join("lhs.npy")).unwrap();
                a[(3, 1)] = f32::NAN;
                ndarray_npy::write_npy(d.join("lhs.npy"), &a).unwrap()
            },
            "non-finite",
        ),
        (
            "unknown dtype",
            |d| {
                let t = std::fs::read_to_string(d.join("case.json")).unwrap();
                std::fs::write(d.join("case.json"), t.replace("\"bf16\"", "\"int7\"")).unwrap()
            },
            "case.json",
        ),
    ];
    for (what, damage, needle) in damages {
        let d = dir.path().join(what.replace(' ', "_"));
        common::copy_case(&base, &d);
        damage(&d);
        let out = moecheck().arg("check").arg(&d).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains(needle), "{what}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
}

#[test]
fn exec_timeout_is_a_failed_case_with_the_reason() {
    gemm(&["--impl", "exec:sleep 30 #", "--timeout", "1"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("timed out after 1.0 s"));
}

/// `moecheck bench` on a tiny shape: a well-formed JSON report (no timing is asserted), and
/// impossible flags exit 2 naming them.
#[test]
fn bench_reports_a_ratio_and_rejects_bad_flags() {
    let small = [
        "bench",
        "--experts",
        "5",
        "--rows",
        "70",
        "--k",
        "9",
        "--n",
        "17",
    ];
    for alloc in [false, true] {
        let mut args: Vec<&str> = small.to_vec();
        args.extend(["--empty", "2", "--reps", "3", "--json"]);
        if alloc {
            args.push("--alloc");
        }
        let out = moecheck()
            .args(&args)
            .assert()
            .code(0)
            .get_output()
            .stdout
            .clone();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["reps"], 3);
        assert_eq!(v["alloc"], alloc);
        assert_eq!(v["empty_experts"], 2);
        let r = v["ratio"].as_f64().unwrap();
        assert!(r > 0.0 && v["ratio_min"].as_f64().unwrap() <= r);
        assert!(r <= v["ratio_max"].as_f64().unwrap());
    }
    moecheck()
        .args(["bench", "--reps", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--reps"));
    // The hidden default of --empty is named when it is the problem.
    moecheck()
        .args(["bench", "--experts", "4"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--empty 16 must be below --experts 4 (at least one expert gets rows; --empty defaults to 16)",
        ));
}

/// `moecheck bench --end-to-end` runs each case as its own process: a passing case has its
/// verdict, wall time and a peak memory of its own (not this process's); a case the memory
/// guard refuses has no verdict, exit 2 and the guard's reason; a planted bug is a FAIL row
/// (a verdict, not a bench error). `--case` is split as a shell splits it; alone, or with an
/// unclosed quote, it is refused.
#[test]
fn bench_end_to_end_runs_each_case_as_a_user_would() {
    let out = moecheck()
        .args([
            "bench",
            "--end-to-end",
            "--json",
            "--case",
            // Quoted as in a shell: the value is 8.
            "gemm --experts '8' --tokens 64 --hidden 32 --ffn 16",
            "--case",
            "gemm --experts 8 --tokens 64 --hidden 33 --ffn 16 --inject partial-k-tile-ignored",
            "--case",
            "gemm --experts 100000000 --hidden 7000 --ffn 7000",
        ])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    assert!(v["dense_three_s"].as_f64().unwrap() > 0.0);
    assert_eq!(cases[0]["verdict"], "PASS", "{:?}", cases[0]);
    assert_eq!(cases[0]["exit"], 0);
    let peak = cases[0]["peak_bytes"].as_u64().unwrap();
    assert!(peak > 1 << 20 && peak < 1 << 30, "{peak}");
    assert!(cases[0]["wall_s"].as_f64().unwrap() > 0.0);
    assert_eq!(cases[1]["verdict"], "FAIL", "{:?}", cases[1]);
    assert_eq!(cases[1]["exit"], 1);
    assert_eq!(cases[2]["exit"], 2);
    let why = cases[2]["verdict"].as_str().unwrap();
    assert!(
        why.contains("this case needs about") && why.contains("--allow-large"),
        "{why}"
    );
    moecheck()
        .args(["bench", "--case", "gemm"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--case needs --end-to-end"));
    // Split as a shell would: an unclosed quote is refused before anything runs.
    moecheck()
        .args(["bench", "--end-to-end", "--case", "gemm --dump \"/tmp/x"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unbalanced quotes"));
}

/// `--runs N` runs each case N times and reports the median run, with every run's wall time
/// and the child's user and system CPU time; 0 runs, or `--runs` without `--end-to-end`, is
/// refused.
#[test]
fn bench_end_to_end_reports_the_median_of_its_runs() {
    let case = "gemm --experts 8 --tokens 64 --hidden 32 --ffn 16";
    let out = moecheck()
        .args([
            "bench",
            "--end-to-end",
            "--json",
            "--runs",
            "3",
            "--case",
            case,
        ])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["runs"], 3);
    let c = &v["cases"][0];
    let mut runs: Vec<f64> = c["runs_s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_f64().unwrap())
        .collect();
    assert_eq!(runs.len(), 3, "{c:?}");
    runs.sort_by(f64::total_cmp);
    assert_eq!(c["wall_s"].as_f64().unwrap(), runs[1], "the median run");
    let (user, sys) = (c["user_s"].as_f64().unwrap(), c["sys_s"].as_f64().unwrap());
    assert!(
        user >= 0.0 && sys >= 0.0 && user + sys > 0.0,
        "{user} {sys}"
    );
    assert_eq!(c["verdict"], "PASS");
    moecheck()
        .args(["bench", "--end-to-end", "--runs", "2", "--case", case])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("user s").and(predicate::str::contains("runs: ")));
    moecheck()
        .args(["bench", "--end-to-end", "--runs", "0", "--case", case])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--runs must be at least 1"));
    moecheck()
        .args(["bench", "--runs", "2"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--runs needs --end-to-end"));
}

#[test]
fn devices_explains_the_absence_of_a_gpu_in_one_line_and_exits_0() {
    let out = moecheck().arg("devices").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    if text.starts_with("no CUDA device") {
        assert_eq!(text.lines().count(), 1, "{text}");
    } else {
        assert!(text.contains("available:"), "{text}");
    }
    let out = moecheck().args(["devices", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["available"].is_boolean());
    if v["available"] == false {
        assert!(v["reason"].as_str().is_some_and(|r| !r.is_empty()));
    }
}

#[test]
fn gpu_impls_without_a_device_fail_the_case_naming_the_reason() {
    let probe = moecheck().args(["devices", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
    if v["available"] == true {
        println!("a CUDA device is present: this test is about its absence");
        return;
    }
    for imp in ["cuda", "cublas", "cublas-grouped"] {
        let out = moecheck()
            .args([
                "gemm", "--impl", imp, "--tokens", "8", "--hidden", "8", "--ffn", "8",
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{imp}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("run failed: no CUDA device"), "{imp}: {text}");
    }
}

/// A reader that has gone (`moecheck gemm | head -c 1`) is not a crash: the command exits with
/// its verdict's status (0 for a pass, 1 for a planted bug), quietly. It used to panic with
/// "failed printing to stdout: Broken pipe" (exit 101).
#[test]
fn a_closed_stdout_keeps_the_verdicts_exit_status() {
    let bin = assert_cmd::cargo::cargo_bin("moecheck");
    let small = ["--experts", "4", "--tokens", "8", "--ffn", "4"];
    let runs: [(&[&str], i32); 4] = [
        (&["--hidden", "8"], 0),
        (&["--hidden", "8", "--json"], 0),
        (&["--inject", "k-zero-garbage", "--hidden", "0"], 1),
        (
            &["--inject", "k-zero-garbage", "--hidden", "0", "--json"],
            1,
        ),
    ];
    for (extra, want) in runs {
        // The read end is closed before moecheck starts: its first write fails.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = std::process::Command::new(&bin)
            .arg("gemm")
            .args(small)
            .args(extra)
            .stdout(writer)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(want), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{extra:?}: {stderr}");
    }
}

/// A declared bf16 accumulator cannot resolve K = 512: its worst-case bound is infinite, and
/// all-zero outputs used to PASS next to `"bound_vacuous": true`. Now: INCONCLUSIVE, exit 3.
#[test]
fn a_vacuous_bound_is_inconclusive_not_a_pass() {
    let (_dir, d) = dumped(
        &["--hidden", "512", "--passes", "fwd", "--impl", "reference"],
        0,
    );
    let out: ndarray::Array2<f32> = ndarray_npy::read_npy(d.join("out.npy")).unwrap();
    ndarray_npy::write_npy(d.join("out.npy"), &out.mapv(|_| 0.0f32)).unwrap();
    // With the f32 accumulator the zeros fail; declared bf16, nothing can be said.
    moecheck().arg("check").arg(&d).assert().code(1);
    let o = moecheck()
        .args(["check", "--acc", "bf16", "--json"])
        .arg(&d)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(3), "{v:#}");
    assert_eq!(v["verdict"], "inconclusive");
    assert_eq!(v["passes"][0]["bound_vacuous"], true);
    moecheck()
        .args(["check", "--acc", "bf16"])
        .arg(&d)
        .assert()
        .code(3)
        .stdout(predicate::str::contains("the bound is infinite"))
        .stdout(predicate::str::contains("verdict: INCONCLUSIVE"));
}

/// `--dump` into a directory that holds an earlier dump replaces it whole: when the new run
/// produced nothing, the old outputs are gone (they used to stay and PASS under `check`), and
/// moecheck says the dump has no outputs. A directory holding anything but a case (a notes
/// file, a symbolic link) is refused before anything runs (exit 2).
#[test]
fn dump_replaces_an_earlier_case_and_refuses_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    let dump = ["--dump", d.to_str().unwrap()];
    gemm(&[&["--impl", "reference"][..], &dump].concat())
        .assert()
        .code(0);
    assert!(d.join("out.npy").exists());
    gemm(&[&["--impl", "exec:false"][..], &dump].concat())
        .assert()
        .code(1)
        .stderr(predicate::str::contains("written without outputs"));
    assert!(!d.join("out.npy").exists() && d.join("case.json").exists());
    moecheck()
        .arg("check")
        .arg(&d)
        .assert()
        .code(predicate::ne(0));

    std::fs::write(d.join("notes.txt"), "mine").unwrap();
    gemm(&[&["--impl", "reference"][..], &dump].concat())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is not a case directory"));
    assert_eq!(
        std::fs::read_to_string(d.join("notes.txt")).unwrap(),
        "mine"
    );
    std::fs::remove_file(d.join("notes.txt")).unwrap();

    let target = dir.path().join("precious.npy");
    std::fs::write(&target, "keep").unwrap();
    std::os::unix::fs::symlink(&target, d.join("out.npy")).unwrap();
    gemm(&[&["--impl", "reference"][..], &dump].concat())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is not a case directory"));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");

    // Someone's own arrays, without a case.json, are not a case to replace.
    let mine = dir.path().join("arrays");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("logits.npy"), "mine").unwrap();
    gemm(&["--impl", "reference", "--dump", mine.to_str().unwrap()])
        .assert()
        .code(2);
    assert_eq!(
        std::fs::read_to_string(mine.join("logits.npy")).unwrap(),
        "mine"
    );
}

/// A temporary directory that cannot be written is the environment's problem, named with the
/// fix (exit 2), not the implementation failing (it used to be exit 1, `run failed`).
#[test]
fn an_unwritable_tmpdir_is_bad_input_naming_tmpdir() {
    for imp in ["exec:true", "worker:true"] {
        gemm(&["--impl", imp])
            .env("TMPDIR", "/nonexistent/moecheck-tmp")
            .assert()
            .code(2)
            .stderr(predicate::str::contains(
                "cannot create a case directory in /nonexistent/moecheck-tmp",
            ))
            .stderr(predicate::str::contains(
                "set TMPDIR to a writable directory",
            ));
    }
}

/// A dump records the declaration the outputs were checked against, so `check DIR` gives the
/// run's verdict without the flags: `--acc f64` failed the run, and `check` used to PASS the
/// same outputs under the default f32. A flag given to `check` still wins; a malformed record
/// is bad input naming case.json.
#[test]
fn check_reproduces_the_runs_verdict_from_the_recorded_declaration() {
    let (_dir, d) = dumped(
        &[
            "--impl",
            "exec:python3 examples/adapters/numpy_grouped_gemm.py",
            "--acc",
            "f64",
        ],
        1,
    );
    let json = std::fs::read_to_string(d.join("case.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["declared"], serde_json::json!({"acc": "f64"}), "{json}");
    moecheck().arg("check").arg(&d).assert().code(1);
    moecheck()
        .args(["check", "--acc", "f32"])
        .arg(&d)
        .assert()
        .code(0);
    std::fs::write(
        d.join("case.json"),
        json.replace(r#""acc": "f64""#, r#""acc": "f65""#),
    )
    .unwrap();
    moecheck()
        .arg("check")
        .arg(&d)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("case.json: \"declared\""));
}

/// `path`'s `.npy` header with its first dimension replaced by `dim` (the data unchanged).
fn claim_first_dim(path: &std::path::Path, dim: u64) {
    let b = std::fs::read(path).unwrap();
    let hl = u16::from_le_bytes([b[8], b[9]]) as usize;
    let h = String::from_utf8_lossy(&b[10..10 + hl]).to_string();
    let open = h.find("'shape': (").unwrap() + "'shape': (".len();
    let first_end = open + h[open..].find([',', ')']).unwrap();
    let mut h2 = format!("{}{dim}{}", &h[..open], &h[first_end..]);
    h2 = h2.trim_end().to_string();
    while (10 + h2.len() + 1) % 64 != 0 {
        h2.push(' ');
    }
    h2.push('\n');
    let mut out = b[..8].to_vec();
    out.extend((h2.len() as u16).to_le_bytes());
    out.extend(h2.as_bytes());
    out.extend(&b[10 + hl..]);
    std::fs::write(path, out).unwrap();
}

/// Issue 16 items 13 and 15: every array's header is checked before anything is allocated
/// (a `lhs.npy` or `group_sizes.npy` claiming 2^40 rows used to abort), and the reason names
/// what is wrong: the shape, the element type, or the missing data.
#[test]
fn npy_headers_are_checked_before_allocating_and_named_precisely() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    gemm(&["--dump", base.to_str().unwrap()]).assert().code(0);
    let copy = |name: &str| {
        let d = dir.path().join(name);
        common::copy_case(&base, &d);
        d
    };
    let check = |d: &std::path::Path, needle: &str| {
        let out = moecheck().arg("check").arg(d).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{needle}: {err}");
        assert!(err.contains(needle), "want {needle:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    };
    for file in ["lhs.npy", "group_sizes.npy", "rhs.npy", "dout.npy"] {
        let d = copy(&format!("huge_{file}"));
        claim_first_dim(&d.join(file), 1 << 40);
        check(&d, &format!("{file}: has shape [1099511627776"));
    }
    // An output is the implementation's: a failed case (exit 1), the same reason in the report.
    let d = copy("huge_out.npy");
    claim_first_dim(&d.join("out.npy"), 1 << 40);
    let out = moecheck().arg("check").arg(&d).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("out.npy: has shape [1099511627776"),
        "{report}"
    );
    // A float64 lhs: the element type, not a size.
    let d = copy("f64_lhs");
    let a: ndarray::Array2<f32> = ndarray_npy::read_npy(d.join("lhs.npy")).unwrap();
    ndarray_npy::write_npy(d.join("lhs.npy"), &a.mapv(f64::from)).unwrap();
    check(&d, "lhs.npy: holds float64 elements, expected float32");
    // int16 group sizes: both accepted types named.
    let d = copy("i16_sizes");
    ndarray_npy::write_npy(d.join("group_sizes.npy"), &ndarray::Array1::<i16>::zeros(6)).unwrap();
    check(
        &d,
        "group_sizes.npy: holds int16 elements, expected an int32 or int64 array",
    );
    // Group sizes of the wrong length: the shape.
    let d = copy("short_sizes");
    ndarray_npy::write_npy(d.join("group_sizes.npy"), &ndarray::Array1::<i64>::zeros(5)).unwrap();
    check(&d, "group_sizes.npy: has shape [5], expected [6]");
    // A truncated float32 file: in its own element type.
    let d = copy("truncated_out");
    let b = std::fs::read(d.join("lhs.npy")).unwrap();
    std::fs::write(d.join("lhs.npy"), &b[..b.len() - 4]).unwrap();
    check(&d, "lhs.npy: is truncated");
    check(&d, "of float32 needs");
}

/// Issue 16 item 14: a case larger than the machine's available memory is refused at once
/// with exit 2, the estimate and `--allow-large` (it used to abort allocating, or run for
/// minutes). `--allow-large` is accepted on a case that fits. (A grouped GEMM whose inputs
/// fit is checked in shards instead, so the refused one has 32 GB of bf16 weights; a kernel
/// under test is never sharded, so for it 4000 experts, 16 GB of weights and as much again
/// of `drhs`, are refused.)
#[test]
fn size_guards_refuse_cases_larger_than_memory() {
    for args in [
        &[
            "gemm",
            "--experts",
            "8000",
            "--hidden",
            "2000",
            "--ffn",
            "1000",
        ][..],
        &[
            "gemm",
            "--experts",
            "4000",
            "--hidden",
            "2000",
            "--ffn",
            "1000",
            "--impl",
            "exec:true",
        ][..],
        &[
            "gemm",
            "--dtype",
            "fp8",
            "--experts",
            "8000",
            "--hidden",
            "2000",
            "--ffn",
            "1000",
        ],
        &["moe", "--tokens", "100000000"],
        &["moe", "--experts", "2000000"],
    ] {
        let out = moecheck().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("this case needs about"), "{args:?}: {err}");
        assert!(err.contains("GiB is available"), "{args:?}: {err}");
        assert!(err.contains("--allow-large"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    gemm(&["--allow-large"]).assert().code(0);
}

/// Issue 42 item 14: under `ulimit -v` a case of about 1.8 GB that fits the machine passed the
/// guard and then aborted allocating (exit 134). The address-space limit counts in what is
/// available: exit 2 with the guard's line.
#[test]
fn the_memory_guard_counts_ulimit_v() {
    let moe = [
        "moe",
        "--tokens",
        "64",
        "--hidden",
        "1024",
        "--experts",
        "8",
        "--ffn",
        "1024",
    ];
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1200000 && exec \"$0\" \"$@\"")
        .arg(assert_cmd::cargo::cargo_bin("moecheck"))
        .args(moe)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(err.contains("this case needs about"), "{err}");
    assert!(err.contains("--allow-large"), "{err}");
}

/// Issue 16 item 10: `fp8 quantize --out` and `route --out` never overwrite their own input,
/// never write through a symbolic link, and never mix their files into a directory that holds
/// something else (a GEMM case, say) — exit 2 naming the file, unless `--force`. A rerun into
/// their own earlier output is fine.
#[test]
fn out_directories_never_lose_files() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    let data = ndarray::Array2::<f32>::from_shape_fn((8, 4), |(i, j)| (i * 4 + j) as f32 / 7.0);
    ndarray_npy::write_npy(&x, &data).unwrap();
    let d = dir.path().join("q");
    let quantize = |input: &std::path::Path, extra: &[&str]| {
        let mut c = moecheck();
        c.args(["fp8", "quantize", "--format", "e4m3", "--in"])
            .arg(input)
            .arg("--out")
            .arg(&d)
            .args(extra);
        c.output().unwrap()
    };
    let refused = |o: std::process::Output, needle: &str| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{needle}: {err}");
        assert!(err.contains(needle), "want {needle:?}: {err}");
    };
    assert_eq!(quantize(&x, &[]).status.code(), Some(0));
    assert_eq!(
        quantize(&x, &[]).status.code(),
        Some(0),
        "a rerun replaces its own files"
    );
    // Its own input.
    let deq = d.join("dequant.npy");
    let before = std::fs::read(&deq).unwrap();
    refused(
        quantize(&deq, &[]),
        "dequant.npy is this command's own input",
    );
    assert_eq!(std::fs::read(&deq).unwrap(), before);
    assert_eq!(quantize(&deq, &["--force"]).status.code(), Some(0));
    // A symbolic link: never written through, even with --force.
    #[cfg(unix)]
    {
        std::fs::remove_file(d.join("q.npy")).unwrap();
        std::os::unix::fs::symlink(&x, d.join("q.npy")).unwrap();
        refused(quantize(&x, &[]), "q.npy is a symbolic link");
        assert_eq!(quantize(&x, &["--force"]).status.code(), Some(0));
        let kept: ndarray::Array2<f32> = ndarray_npy::read_npy(&x).unwrap();
        assert_eq!(kept, data, "the link's target is untouched");
        assert!(!d.join("q.npy").is_symlink());
    }
    // A directory holding something else.
    std::fs::write(d.join("notes.txt"), "mine").unwrap();
    refused(quantize(&x, &[]), "holds other files (notes.txt)");
    // route --out into a GEMM dump.
    let g = dir.path().join("gemm");
    gemm(&["--dump", g.to_str().unwrap()]).assert().code(0);
    let sizes = std::fs::read(g.join("group_sizes.npy")).unwrap();
    let o = moecheck()
        .args([
            "route",
            "--topk",
            "2",
            "--score",
            "softmax",
            "--tokens",
            "16",
            "--experts",
            "6",
            "--out",
        ])
        .arg(&g)
        .output()
        .unwrap();
    refused(o, "holds other files (case.json");
    assert_eq!(std::fs::read(g.join("group_sizes.npy")).unwrap(), sizes);
    moecheck().arg("check").arg(&g).assert().code(0);
}

/// Issue 16 item 15: a cause is said once, and a format flag's error lists exactly the
/// formats that flag accepts (it used to list FP8 formats the command then refused).
#[test]
fn messages_say_each_cause_once_and_list_only_accepted_formats() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("c");
    gemm(&["--dump", d.to_str().unwrap()]).assert().code(0);
    let mut a: ndarray::Array2<f32> = ndarray_npy::read_npy(d.join("dout.npy")).unwrap();
    a[(0, 0)] = f32::NAN;
    ndarray_npy::write_npy(d.join("dout.npy"), &a).unwrap();
    let out = moecheck().arg("check").arg(&d).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.matches("non-finite").count(), 1, "{err}");
    for (args, says) in [
        (
            &["gemm", "--out-dtype", "e4m3"][..],
            "e4m3 is not accepted here (expected one of f32, bf16, f16, f64)",
        ),
        (
            &["gemm", "--acc", "int8"],
            "unknown dtype 'int8' (expected one of f32, bf16, f16, f64)",
        ),
        (
            &["moe", "--dtype", "f64"],
            "f64 is not accepted here (expected one of bf16, f16, f32)",
        ),
        (
            &[
                "fp8", "quantize", "--in", "x.npy", "--out", "o", "--format", "bf16",
            ],
            "(expected one of e4m3, e5m2)",
        ),
        (
            &["gemm", "--dtype", "fp8", "--dout-format", "f32"],
            "(expected one of e4m3, e5m2)",
        ),
    ] {
        let out = moecheck().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// A `--timeout` no deadline can hold (1e20 s panicked converting it), zero, negative or not a
/// number: exit 2 with one line naming the flag, on every command that takes it.
#[test]
fn an_impossible_timeout_exits_2_naming_the_flag() {
    let commands: [&[&str]; 4] = [
        &[
            "gemm",
            "--experts",
            "4",
            "--tokens",
            "8",
            "--hidden",
            "8",
            "--ffn",
            "8",
        ],
        &[
            "route",
            "--topk",
            "2",
            "--score",
            "softmax",
            "--tokens",
            "4",
            "--experts",
            "4",
        ],
        &[
            "moe",
            "--tokens",
            "4",
            "--hidden",
            "8",
            "--ffn",
            "8",
            "--experts",
            "4",
        ],
        &["prop", "--op", "route", "--cases", "1"],
    ];
    for cmd in commands {
        for t in ["1e20", "0", "-1", "nan", "inf"] {
            let out = moecheck()
                .args(cmd)
                .args(["--impl", "exec:true", "--timeout", t])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd:?} --timeout {t}: {err}");
            assert!(err.contains("--timeout"), "{cmd:?} --timeout {t}: {err}");
            assert_eq!(
                err.trim().lines().count(),
                1,
                "{cmd:?} --timeout {t}: {err}"
            );
        }
    }
}

/// int64 group sizes whose sum passes 2^64 (it wrapped, passed "sum <= M" and panicked):
/// exit 2 naming group_sizes.npy, for a grouped GEMM and an FP8 case directory.
#[test]
fn group_sizes_summing_past_u64_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [("gemm", &[][..]), ("fp8", &["--dtype", "fp8"][..])] {
        let d = dir.path().join(name);
        let mut args = vec!["--impl", "reference", "--dump", d.to_str().unwrap()];
        args.extend_from_slice(extra);
        with_defaults(&["gemm"], &SMALL_GEMM, &args)
            .assert()
            .code(0);
        let g: ndarray::Array1<i32> = ndarray_npy::read_npy(d.join("group_sizes.npy")).unwrap();
        let mut huge = g.mapv(i64::from);
        huge[0] = i64::MAX;
        huge[1] = i64::MAX;
        huge[2] = 4;
        ndarray_npy::write_npy(d.join("group_sizes.npy"), &huge).unwrap();
        let out = moecheck().arg("check").arg(&d).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains("group_sizes.npy"), "{name}: {err}");
    }
}

/// A shape whose element count overflows 64 bits names the flags whose product overflows
/// (it said "--experts" for a --tokens overflow).
#[test]
fn an_overflowing_shape_names_its_flags() {
    for (args, want) in [
        (
            &["--tokens", "4611686018427387904", "--topk", "4"][..],
            "--tokens × --topk",
        ),
        (
            &[
                "--tokens",
                "4294967296",
                "--topk",
                "1",
                "--hidden",
                "4294967296",
            ][..],
            "--tokens × --topk × --hidden",
        ),
        (
            &[
                "--experts",
                "4294967296",
                "--hidden",
                "4294967296",
                "--ffn",
                "2",
            ][..],
            "--experts × --hidden × --ffn",
        ),
    ] {
        let out = moecheck().arg("gemm").args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(want) && err.contains("overflows 64 bits"),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
