//! `moecheck fp8 quantize` against the committed ml_dtypes re-implementation of the recipe
//! (fixtures/fp8/gen_fixtures.py): every byte, scale, scale_inv, amax and dequantised value
//! bit for bit, on inputs with zeros, outliers, NaN/inf, values past max and subnormals.
//! Python is not needed: the expected outputs are committed.

mod common;

use std::path::{Path, PathBuf};

use ndarray::{ArrayD, Dimension};
use ndarray_npy::ReadNpyExt;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fp8")
}

fn load<T: ndarray_npy::ReadableElement>(p: &Path) -> ArrayD<T> {
    let f = std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    ArrayD::<T>::read_npy(f).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Bit-for-bit, except that any NaN equals any NaN (payloads are not part of the recipe).
fn same_f32(what: &str, got: &ArrayD<f32>, want: &ArrayD<f32>) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!(
            "{what}: shape {:?} != {:?}",
            got.shape(),
            want.shape()
        ));
    }
    for ((i, g), w) in got.indexed_iter().zip(want.iter()) {
        if g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()) {
            return Err(format!(
                "{what}{:?}: got {g:e} ({:#010x}), ml_dtypes {w:e} ({:#010x})",
                i.slice(),
                g.to_bits(),
                w.to_bits()
            ));
        }
    }
    Ok(())
}

#[test]
fn quantize_matches_ml_dtypes_bit_for_bit() {
    let list = std::fs::read_to_string(fixtures().join("cases.txt")).expect("cases.txt");
    let tmp = tempfile::tempdir().unwrap();
    let mut n = 0;
    let mut failures = Vec::new();
    for line in list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (input, format, scope, sat) = (f[0], f[1], f[2], f[3]);
        let dir = fixtures().join(input);
        let out = tmp.path().join(line.replace(' ', "_"));
        let mut cmd = common::moecheck();
        cmd.args(["fp8", "quantize", "--format", format, "--in"])
            .arg(dir.join("x.npy"))
            .arg("--out")
            .arg(&out);
        if scope == "rows" {
            cmd.arg("--scope")
                .arg(format!("rows:{}", dir.join("sizes.npy").display()));
        }
        if sat == "nosat" {
            cmd.arg("--no-saturate");
        }
        cmd.assert().code(0);
        let tag = format!(
            "{format}-{scope}{}",
            if sat == "nosat" { "-nosat" } else { "" }
        );
        let want = dir.join("expected").join(tag);
        let q_got = load::<u8>(&out.join("q.npy"));
        let q_want = load::<u8>(&want.join("q.npy"));
        if q_got != q_want {
            let (i, g, w) = q_got
                .indexed_iter()
                .zip(q_want.iter())
                .find(|((_, g), w)| g != w)
                .map(|((i, g), w)| (i.slice().to_vec(), *g, *w))
                .unwrap_or_default();
            failures.push(format!("{line}: q{i:?} = {g:#04x}, ml_dtypes {w:#04x}"));
        }
        for name in ["scale", "scale_inv", "amax", "dequant"] {
            let file = format!("{name}.npy");
            if let Err(e) = same_f32(name, &load(&out.join(&file)), &load(&want.join(&file))) {
                failures.push(format!("{line}: {e}"));
            }
        }
        n += 1;
    }
    assert!(n >= 40, "only {n} fixture cases found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn quantize_bad_input_exits_2_with_one_line_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.npy");
    std::fs::write(&bad, b"not an npy").unwrap();
    let sizes = tmp.path().join("sizes.npy");
    ndarray_npy::write_npy(&sizes, &ndarray::arr1(&[10i32, 9])).unwrap();
    let x = fixtures().join("outlier/x.npy");
    for (args, needle) in [
        (
            vec!["--in", bad.to_str().unwrap(), "--format", "e4m3"],
            "bad.npy",
        ),
        (
            vec!["--in", x.to_str().unwrap(), "--format", "bf16"],
            "--format",
        ),
        (
            vec![
                "--in",
                x.to_str().unwrap(),
                "--format",
                "e4m3",
                "--scope",
                "cols",
            ],
            "--scope",
        ),
        (
            vec![
                "--in",
                x.to_str().unwrap(),
                "--format",
                "e4m3",
                "--scope",
                &format!("rows:{}", sizes.display()),
            ],
            "sum to 19",
        ),
    ] {
        let out = common::moecheck()
            .args(["fp8", "quantize", "--out"])
            .arg(tmp.path().join("o"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
