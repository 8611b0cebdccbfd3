//! Compact inputs (docs/protocol.md): a bf16 grouped GEMM's inputs written as uint16 bit
//! patterns, with `"encodings"` in case.json, for `exec:` (`--inputs compact`) and for a worker
//! that asks in its greeting; read back by `moecheck check` and by the Python helper.

mod common;

use std::path::Path;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

const SHAPE: [&str; 8] = [
    "--experts",
    "4",
    "--tokens",
    "24",
    "--hidden",
    "16",
    "--ffn",
    "8",
];

/// `exec:` with `--inputs compact`: the program sees uint16 files and the encodings, the numpy
/// adapter passes, and a copy of the directory it saw is re-verified by `moecheck check`
/// (which decodes the bit patterns). A float32 case is written plainly whatever the flag.
#[test]
fn exec_gets_bf16_bit_patterns_and_check_reads_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("kept");
    let cmd = format!(
        "exec:f() {{ python3 examples/adapters/numpy_grouped_gemm.py \"$1\" && cp -r \"$1\" '{}'; }}; f",
        kept.display()
    );
    common::moecheck()
        .args([
            "gemm", "--dtype", "bf16", "--inputs", "compact", "--impl", &cmd,
        ])
        .args(SHAPE)
        .assert()
        .code(0);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(kept.join("case.json")).unwrap()).unwrap();
    assert_eq!(
        json["encodings"],
        serde_json::json!({"lhs": "bf16", "rhs": "bf16", "dout": "bf16"}),
        "{json:#}"
    );
    for name in ["lhs.npy", "rhs.npy", "dout.npy"] {
        let bytes = std::fs::read(kept.join(name)).unwrap();
        let header = String::from_utf8_lossy(&bytes[..64]);
        assert!(header.contains("'descr': '<u2'"), "{name}: {header}");
    }
    common::moecheck()
        .arg("check")
        .arg(&kept)
        .assert()
        .code(0)
        .stdout(predicates::str::contains("verdict: PASS"));
    // A bit pattern changed in the kept lhs (row 0's first element, its exponent): check
    // reads the case it describes, and the outputs no longer match it.
    let lhs = kept.join("lhs.npy");
    let mut bytes = std::fs::read(&lhs).unwrap();
    let data = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[data + 1] ^= 0x40;
    std::fs::write(&lhs, bytes).unwrap();
    common::moecheck().arg("check").arg(&kept).assert().code(1);
    // f32: nothing narrower holds the values, so nothing is encoded.
    let plain = dir.path().join("plain");
    let cmd = format!(
        "exec:f() {{ python3 examples/adapters/numpy_grouped_gemm.py \"$1\" && cp -r \"$1\" '{}'; }}; f",
        plain.display()
    );
    common::moecheck()
        .args([
            "gemm", "--dtype", "f32", "--inputs", "compact", "--impl", &cmd,
        ])
        .args(SHAPE)
        .assert()
        .code(0);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plain.join("case.json")).unwrap()).unwrap();
    assert!(json.get("encodings").is_none(), "{json:#}");
}

/// A worker that greets with `"inputs": "compact"` gets compact bf16 cases (the helper's
/// `case.encodings` logged per case) and passes; one greeting with another value is refused
/// naming the key.
#[test]
fn a_worker_asks_for_compact_inputs_in_its_greeting() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("encodings.log");
    let script = format!(
        r#"import json, os, sys
sys.path[:0] = [{adapters:?}, {python:?}]
import numpy_grouped_gemm as a
from moecheck.adapter import serve
def h(case):
    with open({log:?}, "a") as f:
        f.write(json.dumps(case.encodings, sort_keys=True) + "\n")
    return a.handler(case)
serve(h, ops=["grouped_gemm"], inputs=os.environ["W_INPUTS"])
"#,
        adapters = repo().join("examples/adapters").display().to_string(),
        python = repo().join("python").display().to_string(),
        log = log.display().to_string(),
    );
    let path = dir.path().join("w.py");
    std::fs::write(&path, script).unwrap();
    let worker = |inputs: &str| format!("worker:W_INPUTS={inputs} python3 {}", path.display());
    common::moecheck()
        .args(["gemm", "--dtype", "bf16", "--impl", &worker("compact")])
        .args(SHAPE)
        .assert()
        .code(0);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.trim(),
        r#"{"dout": "bf16", "lhs": "bf16", "rhs": "bf16"}"#
    );
    std::fs::remove_file(&log).unwrap();
    common::moecheck()
        .args(["gemm", "--dtype", "bf16", "--impl", &worker("float32")])
        .args(SHAPE)
        .assert()
        .code(0);
    assert_eq!(std::fs::read_to_string(&log).unwrap().trim(), "{}");
    // serve() itself refuses a bad value (exit 2) before greeting.
    let o = std::process::Command::new("python3")
        .arg(&path)
        .env("W_INPUTS", "smaller")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("inputs='smaller'"));
}

/// `--inputs compact` names what reads it: refused (exit 2) for a built-in implementation.
#[test]
fn compact_inputs_need_a_program() {
    common::moecheck()
        .args(["gemm", "--dtype", "bf16", "--inputs", "compact"])
        .args(SHAPE)
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "--inputs compact: only an exec: or worker:",
        ));
}

/// An adapter that never asked for compact inputs computes with `case.lhs` and `case.rhs` as
/// float32 arrays: under `--inputs compact` the helper widens them for it, through `exec:` and
/// as a worker that says nothing of inputs in its greeting (review of the first version, which
/// handed it bit patterns and failed every element).
#[test]
fn an_adapter_that_did_not_ask_gets_its_inputs_widened() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        r#"import sys
sys.path.insert(0, {python:?})
import numpy as np
from moecheck.adapter import serve
def h(case):
    off = np.concatenate([[0], np.cumsum(case.group_sizes)])
    out = np.zeros((case["m"], case["n"]), np.float32)
    for e in range(case["groups"]):
        lo, hi = off[e], off[e + 1]
        out[lo:hi] = np.asarray(case.lhs[lo:hi], np.float32) @ np.asarray(case.rhs[e], np.float32)
    return {{"out": out}}
serve(h, ops=["grouped_gemm"])
"#,
        python = repo().join("python").display().to_string(),
    );
    let path = dir.path().join("naive.py");
    std::fs::write(&path, script).unwrap();
    for imp in ["exec", "worker"] {
        common::moecheck()
            .args([
                "gemm", "--dtype", "bf16", "--passes", "fwd", "--inputs", "compact",
            ])
            .args(["--impl", &format!("{imp}:python3 {}", path.display())])
            .args(SHAPE)
            .assert()
            .code(0);
    }
}
