//! The Python helper's memory-mapped inputs and outputs (python/moecheck/case.py): what lets
//! an adapter run at DeepSeek-V3's size without holding a case.

mod common;

use std::path::Path;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Inputs are copy-on-write maps of their files (a handler's write never reaches the file);
/// `open_output` makes a zero-filled output file that the helper flushes; bad names and dtypes
/// are CaseFormatErrors; an opened output returned under its own name is not written twice,
/// another array under that name replaces it; `run_case` closes what was opened even when
/// the handler fails.
#[test]
fn inputs_are_mapped_and_outputs_can_be_written_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    common::moecheck()
        .args([
            "gemm",
            "--experts",
            "3",
            "--tokens",
            "8",
            "--hidden",
            "6",
            "--ffn",
            "4",
        ])
        .args(["--impl", "reference", "--dump"])
        .arg(&d)
        .assert()
        .code(0);
    let script = format!(
        r#"import os, sys
import numpy as np
sys.path.insert(0, {python:?})
from moecheck.case import read_case, write_outputs, CaseFormatError
from moecheck.adapter import run_case
d = {d:?}
c = read_case(d)
assert isinstance(c.lhs, np.memmap) and isinstance(c.rhs, np.memmap), type(c.lhs)
before = float(np.load(os.path.join(d, "lhs.npy"))[0, 0])
c.lhs[0, 0] = before + 1.0
assert float(c.lhs[0, 0]) == before + 1.0
assert float(np.load(os.path.join(d, "lhs.npy"))[0, 0]) == before, "the file changed"
o = c.open_output("extra", (3, 4))
assert o.dtype == np.float32 and o.shape == (3, 4) and not o.any()
o[1, 2] = 5.0
c.close_outputs()
got = np.load(os.path.join(d, "extra.npy"))
assert got.dtype == np.float32 and got.shape == (3, 4) and got[1, 2] == 5.0 and got.sum() == 5.0
for name, dtype in [("../x", "float32"), (".hidden", "float32"), ("ok", "complex64")]:
    try:
        c.open_output(name, (1,), dtype)
        raise SystemExit(f"open_output({{name!r}}, {{dtype}}) was accepted")
    except CaseFormatError:
        pass
# Returned under its own name: written once (in place); another array replaces the file.
def same(case):
    a = case.open_output("same", (2,), "float64")
    a[:] = [1.0, 2.0]
    return {{"same": a}}
run_case(same, d)
assert np.load(os.path.join(d, "same.npy")).tolist() == [1.0, 2.0]
def other(case):
    a = case.open_output("same", (2,))
    a[:] = 7.0
    return {{"same": np.array([3.0, 4.0], np.float32)}}
run_case(other, d)
assert np.load(os.path.join(d, "same.npy")).tolist() == [3.0, 4.0]
def fails(case):
    a = case.open_output("partial", (2,))
    a[0] = 9.0
    raise RuntimeError("kernel failed")
try:
    run_case(fails, d)
    raise SystemExit("the failure was swallowed")
except RuntimeError:
    pass
assert np.load(os.path.join(d, "partial.npy")).tolist() == [9.0, 0.0]
print("ok")
"#,
        python = repo().join("python").display().to_string(),
        d = d.display().to_string(),
    );
    let path = dir.path().join("t.py");
    std::fs::write(&path, script).unwrap();
    let o = std::process::Command::new("python3")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("ok"),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // The files the dump wrote are still what `check` verifies: nothing was overwritten.
    common::moecheck().arg("check").arg(&d).assert().code(0);
}
