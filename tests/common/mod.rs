//! Helpers shared by the tests that drive the real binary.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
use std::sync::OnceLock;

use assert_cmd::Command;

/// The `moecheck` binary, its `$TMPDIR` this test binary's own ([`own_tmpdir`]).
pub fn moecheck() -> Command {
    own_tmpdir();
    Command::cargo_bin("moecheck").expect("binary built")
}

/// This test binary's own temporary directory.
static OWN_TMPDIR: OnceLock<PathBuf> = OnceLock::new();

/// Makes `$TMPDIR` a fresh directory of this test binary's own (for what it runs in process
/// and every program it starts, moecheck and the programs moecheck starts), removed when the
/// binary exits: the failed cases moecheck keeps for its user, and whatever a test's program
/// leaves, never reach the machine's temporary directory. `.ci/run` fails when anything is
/// left there after the tests.
pub fn own_tmpdir() {
    OWN_TMPDIR.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("moecheck-tests-")
            .tempdir()
            .expect("a temporary directory for the tests")
            .keep();
        // Rust's own environment functions hold a lock while they read or write it, and the
        // children this binary starts read it under the same lock.
        std::env::set_var("TMPDIR", &dir);
        // SAFETY: registers a plain function with no arguments, run once at exit.
        unsafe { libc::atexit(remove_own_tmpdir) };
        dir
    });
}

extern "C" fn remove_own_tmpdir() {
    if let Some(dir) = OWN_TMPDIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
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

/// The sharding tests' small grouped GEMM: 6 experts (2 empty), a partial K block (40 is not
/// a multiple of the model's 32).
pub const SHARDED_GEMM: [&str; 10] = [
    "--experts",
    "6",
    "--tokens",
    "40",
    "--hidden",
    "40",
    "--ffn",
    "16",
    "--empty",
    "2",
];

/// A small MoE layer (12 tokens, hidden 8, ffn 6, 8 experts): a run takes well under a second.
pub const SMALL_MOE: [&str; 8] = [
    "--tokens",
    "12",
    "--hidden",
    "8",
    "--ffn",
    "6",
    "--experts",
    "8",
];

/// Runs `c`, asserts that it exits 0 (showing its stderr if not) and parses its stdout as
/// JSON.
pub fn json_ok(c: &mut Command) -> serde_json::Value {
    let out = c.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The JSON report `c --json` prints (timings left out, so that two runs compare) and its
/// exit status; its stderr with the failure to parse.
pub fn report_untimed(mut c: Command) -> (serde_json::Value, i32) {
    use serde_json::Value;
    let out = c.arg("--json").output().unwrap();
    let mut v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|k, _| !k.contains("seconds"));
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    (v, out.status.code().unwrap_or(-1))
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
