//! `moecheck gemm --dtype fp8` with block scopes (`--scaling block|mxfp8`, `--lhs-scope
//! block:1x128`, ...): the correct CPU model passes and every planted block-scale bug fails,
//! at sizes where K is not a multiple of the block (K = 200: tails of 72 and 8) and the
//! groups are not multiples of 128 (about 25 and about 150 rows); recipes the block
//! reference cannot check are refused with exit 2 naming the flag.

mod common;

use common::moecheck;

/// About 25 rows per group (every group smaller than a 128 block), 2 of 8 experts empty.
const SMALL_GROUPS: [&str; 10] = [
    "--experts",
    "8",
    "--tokens",
    "100",
    "--hidden",
    "200",
    "--ffn",
    "72",
    "--empty",
    "2",
];
/// About 150 rows per group (one full 128 block and a partial one).
const LARGE_GROUPS: [&str; 10] = [
    "--experts",
    "4",
    "--tokens",
    "300",
    "--hidden",
    "200",
    "--ffn",
    "40",
    "--empty",
    "1",
];

fn gemm(scaling: &[&str], sizes: &[&str], extra: &[&str]) -> (i32, String) {
    let out = moecheck()
        .args(["gemm", "--dtype", "fp8"])
        .args(scaling)
        .args(sizes)
        .args(extra)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap(), text)
}

/// Every preset and convention, both group sizes: the model passes, the reference passes,
/// and each bug that applies fails (the E8M0 one needs a power-of-two scale: MX, or
/// DeepGEMM's ue8m0).
#[test]
fn correct_model_passes_and_every_block_bug_fails() {
    let recipes: [&[&str]; 4] = [
        &["--scaling", "block"],
        &["--scaling", "block", "--block-recipe", "deepgemm-ue8m0"],
        &["--scaling", "mxfp8"],
        &["--scaling", "mxfp8", "--block-recipe", "rceil"],
    ];
    let bugs = [
        "fp8-block-crosses-group",
        "fp8-block-scales-transposed",
        "fp8-e8m0-wrong-rounding",
        "fp8-k-tail-previous-scale",
        "fp8-wgrad-rowwise-copy",
    ];
    for sizes in [&SMALL_GROUPS[..], &LARGE_GROUPS[..]] {
        for r in recipes {
            for imp in ["emulate", "reference"] {
                let (code, text) = gemm(r, sizes, &["--impl", imp]);
                assert_eq!(code, 0, "{r:?} {imp}: {text}");
                assert!(text.contains("verdict: PASS"), "{text}");
            }
            for bug in bugs {
                let (code, text) = gemm(r, sizes, &["--inject", bug]);
                let applies = bug != "fp8-e8m0-wrong-rounding" || r.len() > 2 || r[1] == "mxfp8";
                let want = if applies { 1 } else { 0 };
                assert_eq!(code, want, "{r:?} {bug} {sizes:?}: {text}");
            }
        }
    }
}

/// Mixed scopes (a block lhs against per-expert weights, MX weights against per-group
/// activations) and a non-default dout format run through the same reference.
#[test]
fn mixed_scopes_pass_and_catch_their_bugs() {
    let mixed: [&[&str]; 3] = [
        &["--lhs-scope", "block:1x128", "--rhs-scope", "expert"],
        &["--rhs-scope", "mx:32", "--dout-format", "e5m2"],
        &[
            "--scaling",
            "mxfp8",
            "--dout-scope",
            "group",
            "--dout-format",
            "e5m2",
        ],
    ];
    for m in mixed {
        let (code, text) = gemm(m, &SMALL_GROUPS, &[]);
        assert_eq!(code, 0, "{m:?}: {text}");
    }
    let (code, text) = gemm(
        mixed[0],
        &SMALL_GROUPS,
        &["--inject", "fp8-k-tail-previous-scale"],
    );
    assert_eq!(code, 1, "{text}");
    let (code, text) = gemm(
        mixed[1],
        &SMALL_GROUPS,
        &["--inject", "fp8-e8m0-wrong-rounding"],
    );
    assert_eq!(code, 1, "{text}");
}

/// What the block reference cannot check is bad input: exit 2, one line naming the flag.
#[test]
fn unsupported_block_recipes_exit_2_naming_the_flag() {
    let cases: [(&[&str], &str); 8] = [
        (&["--scaling", "block", "--verify", "fast"], "--verify fast"),
        (&["--scaling", "block", "--accum", "fast"], "--accum"),
        (
            &["--scaling", "mxfp8", "--accum", "fast-promote"],
            "--accum",
        ),
        (
            &["--scaling", "delayed", "--lhs-scope", "block:1x128"],
            "--scaling",
        ),
        (&["--scaling", "block", "--no-saturate"], "--no-saturate"),
        (&["--lhs-scope", "block:128x128"], "--lhs-scope"),
        (
            &["--scaling", "block", "--block-recipe", "rceil"],
            "--block-recipe rceil",
        ),
        (&["--dout-scope", "mx:0"], "--dout-scope"),
    ];
    for (args, flag) in cases {
        let (code, text) = gemm(args, &SMALL_GROUPS, &[]);
        assert_eq!(code, 2, "{args:?}: {text}");
        assert!(text.contains(flag), "{args:?}: {text}");
        assert_eq!(text.trim().lines().count(), 1, "{args:?}: one line: {text}");
    }
}

/// The recipe travels in case.json as strings (`block:1x128/deepgemm`), `check DIR`
/// re-verifies the dump with the block reference, and a run in shards of experts gives the
/// whole case's verdict.
#[test]
fn dump_check_and_shards_keep_the_block_recipe() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("case");
    let (code, text) = gemm(
        &["--scaling", "mxfp8", "--block-recipe", "rceil"],
        &SMALL_GROUPS,
        &["--dump", case.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{text}");
    let json = std::fs::read_to_string(case.join("case.json")).unwrap();
    assert!(json.contains("\"mx:32/rceil\""), "{json}");
    let out = moecheck().arg("check").arg(&case).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (extra, want) in [
        (&[][..], 0),
        (&["--inject", "fp8-wgrad-rowwise-copy"][..], 1),
    ] {
        let mut args = vec!["--shards", "3"];
        args.extend_from_slice(extra);
        let (code, text) = gemm(&["--scaling", "block"], &SMALL_GROUPS, &args);
        assert_eq!(code, want, "{extra:?}: {text}");
    }
}

/// The numpy adapter (examples/adapters/numpy_fp8_grouped_gemm.py: block casts written from
/// the public definitions, segment-wise float32 products) passes the block recipes: the
/// reference and an independent implementation agree (the planted bugs above show the same
/// check failing).
#[test]
fn numpy_adapter_agrees_with_the_block_reference() {
    let adapter = "exec:python3 examples/adapters/numpy_fp8_grouped_gemm.py";
    for r in [
        &["--scaling", "block"][..],
        &["--scaling", "mxfp8", "--block-recipe", "rceil"],
        &[
            "--lhs-scope",
            "block:1x128",
            "--rhs-scope",
            "mx:32",
            "--dout-format",
            "e5m2",
        ],
    ] {
        let (code, text) = gemm(r, &LARGE_GROUPS, &["--impl", adapter]);
        assert_eq!(code, 0, "{r:?}: {text}");
    }
}

/// A block-scoped case directory carries the quantised copies each asked pass reads
/// (docs/protocol.md): the numpy adapter finds them equal to its own quantisation (the
/// exec: runs above), and a flipped byte in one makes it fail, naming the file.
#[test]
fn case_directory_carries_the_quantised_copies() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("case");
    let (code, text) = gemm(
        &["--scaling", "mxfp8", "--passes", "fwd,dgrad"],
        &SMALL_GROUPS,
        &["--dump", case.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{text}");
    let has = |f: &str| case.join(f).exists();
    for f in [
        "lhs_q.npy",
        "lhs_scale_inv.npy",
        "rhs_q.npy",
        "rhs_dgrad_scale_inv.npy",
        "dout_q.npy",
    ] {
        assert!(has(f), "{f}");
    }
    for f in ["lhs_col_q.npy", "dout_col_q.npy"] {
        assert!(!has(f), "{f} without wgrad");
    }
    let adapter = |dir: &std::path::Path| {
        std::process::Command::new("python3")
            .arg("examples/adapters/numpy_fp8_grouped_gemm.py")
            .arg(dir)
            .output()
            .unwrap()
    };
    let ok = adapter(&case);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let q: ndarray::Array2<u8> = ndarray_npy::read_npy(case.join("lhs_q.npy")).unwrap();
    let mut bad = q.clone();
    let i = q.iter().position(|b| *b != 0).expect("a non-zero byte");
    bad.as_slice_mut().unwrap()[i] ^= 1;
    ndarray_npy::write_npy(case.join("lhs_q.npy"), &bad).unwrap();
    let out = adapter(&case);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("lhs_q.npy"), "{err}");
}
