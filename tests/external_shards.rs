//! An `exec:` or `worker:` program's grouped GEMM checked a shard of experts at a time
//! (src/pipeline_external.rs): the case written a shard at a time, the program run once on the
//! whole case, its outputs read back a shard at a time. Full verification reports what the
//! whole check reports, field for field; a wrong expert fails naming it; a missing or
//! ill-shaped output fails the run naming the file; moecheck's measured peak stays under its
//! estimate; the memory guard counts the program and says how to declare its peak.

mod common;

use serde_json::Value;

/// `moecheck gemm` on the sharding tests' case in bf16, with `args`.
fn gemm(args: &[&str]) -> assert_cmd::Command {
    let bf16 = [&["--dtype", "bf16"], args].concat();
    common::with_defaults(&["gemm"], &common::SHARDED_GEMM, &bf16)
}

fn adapter(name: &str) -> String {
    format!("{}/examples/adapters/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn report(args: &[&str]) -> (Value, i32) {
    common::report_untimed(gemm(args))
}

/// A shell script running the numpy adapter, then `code` (Python, `a` the output `name` loaded,
/// `p` its path) on the case directory.
fn edited(dir: &std::path::Path, script: &str, name: &str, code: &str) -> String {
    let path = dir.join(script);
    let body = format!(
        "python3 {} \"$1\" && python3 -c 'import numpy as np, sys\np = sys.argv[1] + \"/{name}.npy\"\na = np.load(p)\n{code}' \"$1\"\n",
        adapter("numpy_grouped_gemm.py")
    );
    std::fs::write(&path, body).unwrap();
    format!("exec:sh {}", path.display())
}

/// For the numpy adapter (as `exec:` and as a worker), the adapter with expert 2's weights read
/// at expert 3's offset, one `drhs` element of the last expert moved, and outputs saved in
/// Fortran order: the report of the outputs read back in 2 or 3 shards is the whole check's
/// (full verification), and fast verification in shards gives the same verdict. The offset
/// bug fails fwd and dgrad naming expert 2 and nothing else.
#[test]
fn outputs_read_back_in_shards_report_what_the_whole_check_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let clean = format!("exec:python3 {}", adapter("numpy_grouped_gemm.py"));
    let worker = format!("worker:python3 {}", adapter("numpy_grouped_gemm.py"));
    let offset = format!(
        "exec:python3 {} --expert 2",
        adapter("numpy_grouped_gemm_offset_bug.py")
    );
    let moved = edited(
        tmp.path(),
        "moved.sh",
        "drhs",
        "a[-1, -1, -1] += 1.0\nnp.save(p, a)",
    );
    let fortran = edited(
        tmp.path(),
        "fortran.sh",
        "dlhs",
        "np.save(p, np.asfortranarray(a))\nq = p.replace(\"dlhs\", \"drhs\")\nnp.save(q, np.asfortranarray(np.load(q)))",
    );
    let runs = [
        (&clean, 0),
        (&worker, 0),
        (&offset, 1),
        (&moved, 1),
        (&fortran, 0),
    ];
    for (imp, code) in runs {
        let (whole, c) = report(&["--impl", imp, "--shards", "1"]);
        assert_eq!(c, code, "{imp}: {}", whole["failure"]);
        for parts in ["2", "3"] {
            let (sharded, c) = report(&["--impl", imp, "--shards", parts]);
            assert_eq!(c, code, "{imp}, {parts} shards");
            assert_eq!(sharded, whole, "{imp}, {parts} shards");
        }
        let (fast, c) = report(&["--impl", imp, "--verify", "fast", "--shards", "3"]);
        assert_eq!(c, code, "{imp}, fast: {}", fast["failure"]);
    }
    let (r, _) = report(&["--impl", &offset, "--shards", "3"]);
    let failure = r["failure"].as_str().unwrap_or_default();
    assert!(
        failure.starts_with("fwd: ") && failure.contains("of expert 2 outside the bound"),
        "{failure}"
    );
    for pass in &r["passes"].as_array().unwrap()[..2] {
        let failed: Vec<&Value> = pass["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["failed"].as_u64().unwrap_or(0) > 0)
            .collect();
        assert_eq!(failed.len(), 1, "{pass}");
        assert_eq!(
            failed[0]["group"],
            serde_json::json!({"expert": 2}),
            "{pass}"
        );
    }
}

/// An output the program did not write, or wrote for fewer experts, fails the run (exit 1)
/// naming the file, in shards as whole.
#[test]
fn a_missing_or_short_output_fails_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = edited(tmp.path(), "missing.sh", "dlhs", "import os\nos.remove(p)");
    let short = edited(tmp.path(), "short.sh", "drhs", "np.save(p, a[:-1])");
    let cases = [
        (
            &missing,
            "the implementation wrote no dlhs.npy for the dgrad pass",
        ),
        (
            &short,
            "drhs.npy: has shape [5, 40, 16], expected [6, 40, 16]",
        ),
    ];
    for (imp, needle) in cases {
        for parts in ["1", "3"] {
            let (r, c) = report(&["--impl", imp, "--shards", parts]);
            assert_eq!(c, 1, "{imp}, {parts}");
            let failure = r["failure"].as_str().unwrap_or_default();
            assert!(failure.contains(needle), "{imp}, {parts}: {failure}");
        }
    }
}

/// moecheck's own peak resident memory, measured while it checks a program's outputs in
/// shards, is at most the estimate its memory guard used (both printed on stderr), at sizes
/// where the outputs (17 MB of drhs) are well above moecheck's fixed costs.
#[test]
fn the_measured_peak_is_within_the_estimate() {
    let imp = format!("exec:python3 {}", adapter("numpy_grouped_gemm.py"));
    for (experts, parts) in [("16", "4"), ("16", "16")] {
        let out = common::moecheck()
            .args([
                "gemm",
                "--experts",
                experts,
                "--tokens",
                "512",
                "--topk",
                "2",
            ])
            .args(["--hidden", "1024", "--ffn", "256", "--impl", &imp])
            .args(["--shards", parts])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        let line = err
            .lines()
            .find(|l| l.contains("peak resident memory"))
            .unwrap_or_else(|| panic!("{err}"));
        let mib = |after: &str| -> f64 {
            let at = line.find(after).unwrap_or_else(|| panic!("{line}")) + after.len();
            line[at..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let (peak, estimate) = (mib("peak resident memory "), mib("(estimated "));
        assert!(peak > 0.0 && peak <= estimate, "{line}");
    }
}

/// The memory guard counts an external program beside moecheck: a case whose inputs and
/// outputs cannot fit is refused (exit 2) with a line that names `--impl-memory`;
/// `--impl-memory` is refused for an implementation inside moecheck and for a size that is
/// not one.
#[test]
fn the_guard_counts_the_program_and_names_impl_memory() {
    let huge = [
        "gemm",
        "--experts",
        "256",
        "--tokens",
        "262144",
        "--topk",
        "8",
        "--hidden",
        "7168",
        "--ffn",
        "2048",
        "--impl",
        "exec:true",
    ];
    let out = common::moecheck().args(huge).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--impl-memory SIZE"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A program that alone does not fit: refused without a hint at --shards (no number of
    // shards makes room for it), and with --allow-large run whole, not in more shards.
    let pass = format!("exec:python3 {}", adapter("numpy_grouped_gemm.py"));
    let big = ["--impl", pass.as_str(), "--impl-memory", "100TiB"];
    let out = gemm(&big).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--impl-memory 102400") && !err.contains("--shards"),
        "{err}"
    );
    let out = gemm(&[&big[..], &["--allow-large"]].concat())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("shard"), "{err}");
    for (args, needle) in [
        (
            &["--impl", "reference", "--impl-memory", "2GiB"][..],
            "runs inside moecheck",
        ),
        (
            &["--impl", "exec:true", "--impl-memory", "lots"][..],
            "expected a size",
        ),
    ] {
        let out = gemm(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
