//! `moecheck gemm --verify fast`: every planted bug of the grouped-GEMM model and of the FP8
//! model is caught by fast verification at a mid size, the models without a bug pass, and the
//! flag is parsed and reported. (The single-element guarantees are tested beside the derivation, in
//! `reference/src/gemm/fast/tests.rs`.)

use std::time::Instant;

use moecheck::generate::fp8::generate_fp8;
use moecheck::generate::gemm::{generate, GemmSpec, Spread};
use moecheck::impls::fp8::Fp8Bug;
use moecheck::impls::PlantedBug;
use moecheck::registry::Backends;
use moecheck_reference::format::Format;
use moecheck_reference::fp8::{Fp8Gemm, Fp8Recipe};
use moecheck_reference::gemm::{Gemm, Passes, TailContract, Verify};
use moecheck_reference::op::verify_in;

mod common;
use common::{with_defaults, SMALL_GEMM};

use moecheck::impls::gemm::emulate::Bug;

/// The mid size: 32 experts (2 empty), M = 512 rows (5% dropped), K = 200 and N = 72 —
/// neither a multiple of the model's 32-deep K blocks nor of any M tile — skewed routing, so
/// groups from a handful of rows to over a hundred. The model is a triple loop in the test
/// profile (about 0.45 s a run here, ten runs); at M = 1024, N = 136 the test took 18 s, 95% of
/// it in the model, so this is about the largest that stays within a few seconds. `K = 0` for
/// `k-zero-garbage`, the one bug that needs it.
fn spec(hidden: usize) -> GemmSpec {
    GemmSpec {
        experts: 32,
        tokens: 128,
        topk: 4,
        hidden,
        ffn: 72,
        dtype: Format::Bf16,
        out_dtype: Format::F32,
        spread: Spread::Skewed,
        empty: 2,
        drop_frac: 0.05,
        seed: 13,
        tail: TailContract::Zero,
        passes: Passes::ALL,
    }
}

#[test]
fn every_planted_bug_is_caught_by_fast_verification() {
    let start = Instant::now();
    let case = generate(&spec(200));
    // What the default generator gives, and what the bugs need to show.
    assert!(case.group_sizes.contains(&0), "empty experts");
    assert!(case.rows_used() < case.m(), "tail rows");
    assert!(
        case.group_sizes.iter().any(|s| *s > 64 && s % 64 != 0),
        "partial M tiles"
    );
    assert_ne!(case.k() % 32, 0, "a partial K block");
    let model = |bug| <Gemm as Backends>::emulate(bug).expect("gemm has a model");
    let clean = verify_in::<Gemm>(model(None).as_ref(), &case, Passes::ALL, Verify::Fast);
    assert!(clean.verdict.passed(), "{:?}", clean.verdict.failure());
    // The mode reached the comparison: projections of all three passes, sampled elements.
    let report = clean.verdict.report().expect("a report");
    assert_eq!(report.verify, Verify::Fast);
    assert_eq!(report.fast.len(), 3);
    for &bug in Bug::ALL {
        let case = match bug {
            Bug::KZeroGarbage => generate(&spec(0)),
            _ => case.clone(),
        };
        let v = verify_in::<Gemm>(model(Some(bug)).as_ref(), &case, Passes::ALL, Verify::Fast);
        assert!(
            !v.verdict.passed(),
            "{} escaped fast verification",
            bug.name()
        );
        eprintln!(
            "{}: {}",
            bug.name(),
            v.verdict.failure().unwrap_or_default()
        );
    }
    eprintln!("10 fast checks in {:.1} s", start.elapsed().as_secs_f64());
}

/// The FP8 grouped GEMM at the same mid size: every planted FP8 bug is caught by fast
/// verification (the recipe-exact check through the grouped GEMM's projections, scaled per
/// group), the clean model passes, at two output formats.
#[test]
fn every_planted_fp8_bug_is_caught_by_fast_verification() {
    for out_dtype in [Format::F32, Format::Bf16] {
        let gemm = GemmSpec {
            dtype: Format::F32,
            out_dtype,
            ..spec(200)
        };
        let case = generate_fp8(&gemm, Fp8Recipe::default());
        let model = |bug| <Fp8Gemm as Backends>::emulate(bug).expect("fp8 has a model");
        let fast = |imp: &dyn moecheck_reference::op::Implementation<Fp8Gemm>| {
            verify_in::<Fp8Gemm>(imp, &case, Passes::ALL, Verify::Fast)
        };
        let clean = fast(model(None).as_ref());
        assert!(clean.verdict.passed(), "{:?}", clean.verdict.failure());
        let report = clean.verdict.report().expect("a report");
        assert_eq!(report.recipe_exact.verify, Verify::Fast);
        assert!(report.high_precision.is_empty(), "not computed when fast");
        // Block-scope bugs do not act on this per-group recipe (and block scopes refuse
        // fast verification).
        for &bug in Fp8Bug::ALL.iter().filter(|b| !b.needs_block_scopes()) {
            let v = fast(model(Some(bug)).as_ref());
            assert!(
                !v.verdict.passed(),
                "{} escaped fast verification ({out_dtype} out)",
                bug.name()
            );
        }
    }
}

fn gemm(extra: &[&str]) -> assert_cmd::Command {
    with_defaults(&["gemm"], &SMALL_GEMM, extra)
}

#[test]
fn verify_flag_names_the_mode_and_its_guarantee() {
    let out = gemm(&["--verify", "fast", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verification"]["mode"], "fast");
    assert!(v["verification"]["guarantee"]
        .as_str()
        .unwrap()
        .contains("2^-8"));
    assert_eq!(v["fast"].as_array().unwrap().len(), 3);
    let out = gemm(&["--verify", "full", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verification"]["mode"], "full");
    assert!(v.get("fast").is_none());
    // The default at this size is full; the text report says which ran, in one line.
    let out = gemm(&[]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("verification:"))
        .collect();
    assert_eq!(
        line,
        ["verification: full: every element checked against its own bound"]
    );
    let out = gemm(&["--verify", "fast", "--inject", "partial-m-tile-dropped"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("verification: fast: ") && text.contains("projections fwd:"),
        "{text}"
    );
}

#[test]
fn a_bad_verify_value_exits_2_naming_the_flag() {
    for args in [
        &["--verify", "quick"][..],
        &[
            "--verify",
            "fast",
            "--dtype",
            "fp8",
            "--scaling",
            "delayed",
            "--no-saturate",
        ][..],
    ] {
        let out = gemm(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--verify"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

/// `--dtype fp8 --verify fast`: the report names the mode, has the projections and says the
/// comparison with the unquantised GEMM was not computed.
#[test]
fn fp8_fast_verification_is_reported() {
    let out = gemm(&["--dtype", "fp8", "--verify", "fast", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verification"]["mode"], "fast");
    assert_eq!(v["fast"].as_array().unwrap().len(), 3);
    assert_eq!(v["fp8"]["high_precision"].as_array().unwrap().len(), 0);
    let out = gemm(&["--dtype", "fp8", "--verify", "fast"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("verification: fast: ")
            && text.contains("projections wgrad:")
            && text.contains("not computed under --verify fast"),
        "{text}"
    );
}

/// `moecheck check --verify fast DIR`: the same mode on a dumped case directory (plain and
/// FP8), failing a planted bug the full check fails too, and refused with exit 2 for an
/// operation checked one way.
#[test]
fn check_verifies_a_case_directory_fast() {
    let tmp = tempfile::tempdir().unwrap();
    let check = |dir: &std::path::Path, extra: &[&str]| {
        let mut cmd = common::moecheck();
        cmd.arg("check").arg(dir).args(extra);
        cmd.output().unwrap()
    };
    for (name, extra) in [
        ("clean", &[][..]),
        ("bug", &["--inject", "partial-m-tile-dropped"][..]),
        ("fp8", &["--dtype", "fp8"][..]),
    ] {
        let dir = tmp.path().join(name);
        let dump = dir.to_str().unwrap();
        let mut args = vec!["--dump", dump];
        args.extend_from_slice(extra);
        let made = gemm(&args).output().unwrap();
        let want = if name == "bug" { 1 } else { 0 };
        assert_eq!(made.status.code(), Some(want), "{name}");
        let fast = check(&dir, &["--verify", "fast", "--json"]);
        assert_eq!(fast.status.code(), Some(want), "{name}");
        let v: serde_json::Value = serde_json::from_slice(&fast.stdout).unwrap();
        assert_eq!(v["verification"]["mode"], "fast", "{name}");
        assert_eq!(v["fast"].as_array().unwrap().len(), 3, "{name}");
        let full = check(&dir, &["--json"]);
        let v: serde_json::Value = serde_json::from_slice(&full.stdout).unwrap();
        assert_eq!(v["verification"]["mode"], "full", "{name}");
        assert_eq!(full.status.code(), Some(want), "{name}");
    }
    let route = tmp.path().join("route");
    let made = common::moecheck()
        .args([
            "route", "--topk", "2", "--score", "softmax", "--tokens", "16",
        ])
        .args(["--experts", "8", "--impl", "reference", "--dump"])
        .arg(&route)
        .output()
        .unwrap();
    assert_eq!(made.status.code(), Some(0));
    let out = check(&route, &["--verify", "fast"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--verify fast") && err.contains("route"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Issue 39: one element in the middle of the largest expert moved by 64 times its own bound
/// fails `--verify fast` (by its chunk of 16 columns; before the chunks it passed up to about
/// the row's summed bounds, here some 180 times its own), and moved by half its bound it
/// passes. Through `moecheck check` on a dump of the reference's outputs, declared with an f32
/// accumulator (whose bounds follow `Σ|a·b|`, alike along a row).
#[test]
fn a_lone_element_64_times_its_bound_fails_fast_verification() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("case");
    let shape = [
        "--experts",
        "8",
        "--tokens",
        "256",
        "--topk",
        "4",
        "--hidden",
        "256",
    ];
    common::moecheck()
        .arg("gemm")
        .args(shape)
        .args(["--ffn", "192", "--impl", "reference", "--passes", "fwd"])
        .arg("--dump")
        .arg(&d)
        .assert()
        .code(0);
    let sizes: ndarray::Array1<i32> = ndarray_npy::read_npy(d.join("group_sizes.npy")).unwrap();
    let (g, size) = sizes.iter().enumerate().max_by_key(|(_, s)| **s).unwrap();
    let row = sizes.iter().take(g).sum::<i32>() as usize + *size as usize / 2;
    let col = 96;
    assert!(*size > 200, "{sizes}");
    let good: ndarray::Array2<f32> = ndarray_npy::read_npy(d.join("out.npy")).unwrap();
    let check = |value: f64, verify: &str| {
        let mut out = good.clone();
        out[(row, col)] = value as f32;
        ndarray_npy::write_npy(d.join("out.npy"), &out).unwrap();
        let run = common::moecheck()
            .args(["check", "--acc", "f32", "--verify", verify, "--json"])
            .arg(&d)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
        (run.status.code(), v)
    };
    // The element's own bound, from full verification of it moved far past it.
    let want = f64::from(good[(row, col)]);
    let (code, v) = check(want + 1.0, "full");
    assert_eq!(code, Some(1));
    let worst = v["passes"][0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|g| {
            g["worst"]
                .as_object()
                .filter(|w| w["row"] == row && w["col"] == col)
        })
        .expect("the moved element is the worst");
    let bound = worst["bound"].as_f64().unwrap();
    let (code, v) = check(want + 64.0 * bound, "fast");
    assert_eq!(code, Some(1), "{v}");
    let failure = v["failure"].as_str().unwrap();
    assert!(
        failure.contains("1 chunk(s) of 16 columns")
            && failure.contains(&format!("row {row} cols 96..112")),
        "{failure}"
    );
    let fast = &v["fast"][0];
    assert_eq!(
        (fast["failed_chunks"].as_u64(), fast["failed_rows"].as_u64()),
        (Some(1), Some(0)),
        "{fast}"
    );
    assert_eq!(check(want + 0.5 * bound, "fast").0, Some(0));
    assert_eq!(check(want + 0.5 * bound, "full").0, Some(0));
}
