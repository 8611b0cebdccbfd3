//! Block-scaled FP8 (`moecheck_reference::fp8::block`) against tables computed from the public
//! definitions by `fixtures/fp8/blocks/gen.py` (numpy float32 arithmetic, ml_dtypes' casts;
//! not moecheck's code): DeepGEMM's 1x128 and 128x128 casts in their three forms and OCP
//! MXFP8's 32-element blocks with the floor and rceil exponents, on rows spread over
//! 2^±12, a zero block, a block under DeepGEMM's 1e-4 clamp and values at the format's max.
//! Every byte and every scale must be identical.

mod common;

use moecheck::reference::format::Format;
use moecheck::reference::fp8::block::{quantize_blocks, BlockRecipe, DeepGemmCast, MxRounding};
use ndarray::{Array2, Zip};
use std::path::PathBuf;

fn fixture<T: ndarray_npy::ReadableElement>(name: &str) -> Array2<T> {
    let p: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "fixtures",
        "fp8",
        "blocks",
        name,
    ]
    .iter()
    .collect();
    ndarray_npy::read_npy(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn block_and_mx_casts_match_the_public_definitions_bit_for_bit() {
    let x: Array2<f32> = fixture("x.npy");
    let deepgemm = |cast, ue8m0| BlockRecipe::DeepGemm { cast, ue8m0 };
    let cases = [
        (
            "deepgemm_1x128_mul",
            (1, 128),
            deepgemm(DeepGemmCast::Mul, false),
        ),
        (
            "deepgemm_1x128_reciprocal",
            (1, 128),
            deepgemm(DeepGemmCast::Reciprocal, false),
        ),
        (
            "deepgemm_1x128_ue8m0",
            (1, 128),
            deepgemm(DeepGemmCast::Reciprocal, true),
        ),
        (
            "deepgemm_128x128_mul",
            (128, 128),
            deepgemm(DeepGemmCast::Mul, false),
        ),
        (
            "mx32_floor",
            (1, 32),
            BlockRecipe::Mx {
                rounding: MxRounding::Floor,
            },
        ),
        (
            "mx32_rceil",
            (1, 32),
            BlockRecipe::Mx {
                rounding: MxRounding::Rceil,
            },
        ),
    ];
    for (name, block, recipe) in cases {
        let got = quantize_blocks(x.view(), block, Format::E4m3, recipe);
        let q: Array2<u8> = fixture(&format!("{name}_q.npy"));
        let s: Array2<f32> = fixture(&format!("{name}_scale_inv.npy"));
        assert_eq!(got.scale_inv.dim(), s.dim(), "{name}");
        let mut bad_s = 0;
        Zip::from(&got.scale_inv)
            .and(&s)
            .for_each(|a, b| bad_s += usize::from(a.to_bits() != b.to_bits()));
        let mut bad_q = 0;
        Zip::from(&got.q)
            .and(&q)
            .for_each(|a, b| bad_q += usize::from(a != b));
        assert_eq!(
            (bad_s, bad_q),
            (0, 0),
            "{name}: scales and bytes that differ"
        );
    }
}

/// The conventions differ on this input: each table tells its recipe from the others, so a
/// recipe that is another's in disguise fails above.
#[test]
fn the_recipes_give_different_bits() {
    let names = [
        "deepgemm_1x128_mul",
        "deepgemm_1x128_reciprocal",
        "deepgemm_1x128_ue8m0",
        "mx32_floor",
        "mx32_rceil",
    ];
    for (i, a) in names.iter().enumerate() {
        for b in &names[i + 1..] {
            let (qa, qb): (Array2<u8>, Array2<u8>) = (
                fixture(&format!("{a}_q.npy")),
                fixture(&format!("{b}_q.npy")),
            );
            let differ = Zip::from(&qa)
                .and(&qb)
                .fold(0usize, |n, x, y| n + usize::from(x != y));
            assert!(differ > 0, "{a} and {b} give the same bytes");
        }
    }
}

/// `fp8 quantize --scope block:1x128` and `--scope mx:32 --block-recipe rceil` write the
/// tables' bytes and scales; malformed block scopes and recipes are refused naming the flag.
#[test]
fn fp8_quantize_writes_the_block_tables() {
    let dir = tempfile::tempdir().unwrap();
    let x: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "fixtures",
        "fp8",
        "blocks",
        "x.npy",
    ]
    .iter()
    .collect();
    for (scope, recipe, table) in [
        ("block:1x128", None, "deepgemm_1x128_mul"),
        ("block:128x128", None, "deepgemm_128x128_mul"),
        ("mx:32", Some("rceil"), "mx32_rceil"),
    ] {
        let out = dir.path().join(table);
        let mut c = common::moecheck();
        c.args(["fp8", "quantize", "--format", "e4m3", "--scope", scope])
            .arg("--in")
            .arg(&x)
            .arg("--out")
            .arg(&out);
        if let Some(r) = recipe {
            c.args(["--block-recipe", r]);
        }
        c.assert().code(0);
        let q: Array2<u8> = ndarray_npy::read_npy(out.join("q.npy")).unwrap();
        let s: Array2<f32> = ndarray_npy::read_npy(out.join("scale_inv.npy")).unwrap();
        assert_eq!(q, fixture::<u8>(&format!("{table}_q.npy")), "{scope}");
        assert_eq!(
            s,
            fixture::<f32>(&format!("{table}_scale_inv.npy")),
            "{scope}"
        );
    }
    for (args, needle) in [
        (vec!["--scope", "block:128"], "block:RxC"),
        (vec!["--scope", "mx:0"], "positive integer"),
        (
            vec!["--scope", "mx:32", "--block-recipe", "deepgemm"],
            "--block-recipe",
        ),
        (
            vec!["--scope", "tensor", "--block-recipe", "floor"],
            "--block-recipe",
        ),
        (vec!["--scope", "mx:32", "--no-saturate"], "--no-saturate"),
    ] {
        let out = common::moecheck()
            .args(["fp8", "quantize", "--format", "e4m3"])
            .arg("--in")
            .arg(&x)
            .arg("--out")
            .arg(dir.path().join("refused"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(needle),
            "{args:?}"
        );
    }
}
