//! Helpers shared by the tests that drive the real binary.
#![allow(dead_code)] // each test binary uses its own subset

use assert_cmd::Command;

/// The `moecheck` binary.
pub fn moecheck() -> Command {
    Command::cargo_bin("moecheck").expect("binary built")
}

/// A small routed grouped-GEMM case (six experts, two of them empty, a dropped tail): every
/// run takes well under a second.
pub const SMALL_GEMM: [&str; 10] = [
    "--experts",
    "6",
    "--tokens",
    "40",
    "--hidden",
    "24",
    "--ffn",
    "16",
    "--empty",
    "2",
];

/// `moecheck` with `command`, the flag/value pairs of `defaults`, and `extra`, where a flag
/// given in `extra` replaces the default of the same name.
pub fn with_defaults(command: &[&str], defaults: &[&str], extra: &[&str]) -> Command {
    let mut c = moecheck();
    c.args(command);
    for pair in defaults.chunks(2) {
        if !extra.contains(&pair[0]) {
            c.args(pair);
        }
    }
    c.args(extra);
    c
}

/// A copy of the case directory `base` at `to` (created), for a test to damage.
pub fn copy_case(base: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(base).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Runs `moecheck prop --op OP --json --out OUT ARGS`: the exit status and the document.
pub fn prop_json(op: &str, args: &[&str], out: &std::path::Path) -> (i32, serde_json::Value) {
    let o = moecheck()
        .args(["prop", "--op", op, "--json", "--out"])
        .arg(out)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    let doc = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("prop {op} {args:?}: {e}; stderr: {stderr}"));
    (o.status.code().unwrap(), doc)
}
