//! Tests of the block-scoped FP8 reference: which blocks each copy has (group restarts, K
//! tails, the rhs copies), with literal scales, and the reference as the sum it claims to be.

use super::*;
use crate::format::decode_fp8;
use crate::fp8::{Fp8Recipe, ScopeKind};
use crate::gemm::{GroupedGemmCase, Pass};
use ndarray::{array, Array3};

fn scope(s: &str) -> ScopeKind {
    ScopeKind::parse(s).unwrap()
}

/// Groups of 3 and 2 rows and a dropped row; K = 3, N = 3; magnitudes differ per group.
fn case(lhs: &str, rhs: &str, dout: &str) -> Fp8GemmCase {
    let lhs_v = array![
        [1.0f32, 0.5, 3.0],
        [2.0, -1.0, 0.25],
        [4.0, 1.5, -2.0],
        [256.0, 3.0, 1.0],
        [-200.0, 7.0, 0.5],
        [9.0, 9.0, 9.0]
    ];
    let rhs_v = Array3::from_shape_fn((2, 3, 3), |(e, k, n)| {
        ((e * 9 + k * 3 + n) as f32 * 0.37 - 1.3) * if e == 0 { 1.0 } else { 64.0 }
    });
    let dout_v = Array2::from_shape_fn((6, 3), |(r, c)| (r as f32 + 1.0) * 0.5 - c as f32);
    let mut recipe = Fp8Recipe::default();
    recipe.lhs.scope = scope(lhs);
    recipe.rhs.scope = scope(rhs);
    recipe.dout.scope = scope(dout);
    Fp8GemmCase {
        gemm: GroupedGemmCase {
            lhs: lhs_v,
            rhs: rhs_v.into(),
            group_sizes: vec![3, 2],
            dout: Some(dout_v),
            dtype: Format::F32,
            out_dtype: Format::F32,
            tail: Default::default(),
        },
        recipe,
        given_scales: None,
    }
}

/// Literal scales: MX floor is `2^(floor(log2 amax) − 8)` for E4M3.
#[test]
fn blocks_restart_at_groups_and_k_tails_have_their_own_scale() {
    let c = case("mx:2", "mx:2", "group");
    let ops = quantize_block_operands(&c, Passes::ALL);
    // Row-wise lhs, 1x2 along K: row 0 = [1, 0.5 | 3]: amax 1 -> 2^-8, K tail amax 3 -> 2^-7.
    assert_eq!(ops.lhs.sinv(0, 0), Some(2f32.powi(-8)));
    assert_eq!(ops.lhs.sinv(0, 1), Some(2f32.powi(-8)));
    assert_eq!(ops.lhs.sinv(0, 2), Some(2f32.powi(-7)));
    // Column-wise lhs, 2x1 along M restarting per group: column 0 of group 0 is [1, 2 | 4],
    // of group 1 [256, -200]. Row 2 is its own (partial) block: 4 -> 2^-6, not 256's 2^0.
    assert_eq!(ops.lhs_col.sinv(0, 0), Some(2f32.powi(-7)));
    assert_eq!(ops.lhs_col.sinv(2, 0), Some(2f32.powi(-6)));
    assert_eq!(ops.lhs_col.sinv(3, 0), Some(1.0));
    assert_eq!(ops.lhs_col.sinv(4, 0), Some(1.0));
    // The dropped row is in no block and its bytes are 0.
    assert_eq!(ops.lhs.sinv(5, 0), None);
    assert!(ops.lhs.dequantize().row(5).iter().all(|v| *v == 0.0));
    // MX rhs: fwd along K (2x1 tiles), dgrad a second copy along N (1x2 tiles).
    assert_eq!(ops.rhs.pieces[0].block, (2, 1));
    assert_eq!(ops.rhs_dgrad.pieces[1].block, (1, 2));
    // A group-scope dout: one scale per group, the same copy for wgrad.
    let d = ops.dout.as_ref().unwrap();
    assert_eq!(d.sinv(0, 0), d.sinv(2, 2));
    assert_eq!(Some(d), ops.dout_col.as_ref());
    // DeepGEMM rhs blocks: one copy, read transposed by dgrad.
    let c = case("block:1x2", "block:2x2", "block:1x2");
    let ops = quantize_block_operands(&c, Passes::ALL);
    assert_eq!(ops.rhs, ops.rhs_dgrad);
    // Expert 1's block (0..2, 0..2) = rows 3..5 of the (G·K, N) view: amax is 64·|4·0.37+... |.
    let w = rhs_rows(&c.gemm.rhs);
    let amax = w.slice(s![3..5, 0..2]).fold(0f32, |m, v| m.max(v.abs()));
    assert_eq!(ops.rhs.sinv(3, 1), Some(amax / 448.0));
    assert_eq!(ops.rhs.sinv(5, 2), Some(w[(5, 2)].abs() / 448.0)); // the 1x1 corner
}

/// The reference is the f64 sum over the contraction of each element's byte times its own
/// block's scale_inv, for every pass, from the copies the table names.
#[test]
fn reference_is_the_sum_of_dequantised_blocks() {
    for (l, r, d) in [
        ("block:1x2", "block:2x2", "block:1x2"),
        ("mx:2", "mx:2", "mx:2"),
        ("mx:2", "expert", "tensor"),
        ("group", "block:2x1", "block:1x2/deepgemm-ue8m0"),
    ] {
        let c = case(l, r, d);
        let ops = quantize_block_operands(&c, Passes::ALL);
        let res = block_reference_from(&c, &ops, Passes::ALL);
        let deq = |cp: &BlockCopy, row: usize, col: usize| {
            let p = (0..cp.pieces.len()).find(|&i| cp.offsets[i] <= row && row < cp.offsets[i + 1]);
            p.map_or(0.0, |i| {
                let q = cp.pieces[i].q[(row - cp.offsets[i], col)];
                decode_fp8(q, cp.format) * f64::from(cp.sinv(row, col).unwrap())
            })
        };
        let off = c.gemm.offsets();
        let out = res.value.out.as_ref().unwrap();
        let dlhs = res.value.dlhs.as_ref().unwrap();
        let drhs = res.value.drhs.as_ref().unwrap();
        let dout = ops.dout.as_ref().unwrap();
        let dcol = ops.dout_col.as_ref().unwrap();
        for e in 0..2 {
            for row in off[e]..off[e + 1] {
                for col in 0..3 {
                    let f: f64 = (0..3)
                        .map(|k| deq(&ops.lhs, row, k) * deq(&ops.rhs, e * 3 + k, col))
                        .sum();
                    assert!(
                        (out[(row, col)] - f).abs() <= 1e-12 * f.abs().max(1.0),
                        "{l} fwd"
                    );
                    let g: f64 = (0..3)
                        .map(|n| deq(dout, row, n) * deq(&ops.rhs_dgrad, e * 3 + col, n))
                        .sum();
                    assert!(
                        (dlhs[(row, col)] - g).abs() <= 1e-12 * g.abs().max(1.0),
                        "{r} dgrad"
                    );
                }
            }
            for a in 0..3 {
                for b in 0..3 {
                    let h: f64 = (off[e]..off[e + 1])
                        .map(|i| deq(&ops.lhs_col, i, a) * deq(dcol, i, b))
                        .sum();
                    let got = drhs[(e, a, b)];
                    assert!((got - h).abs() <= 1e-12 * h.abs().max(1.0), "{d} wgrad");
                }
            }
        }
        assert_eq!(out.row(5).to_vec(), vec![0.0; 3]);
        assert!(res.magnitude.out.unwrap().iter().all(|v| *v >= 0.0));
    }
    // The bound of each pass uses that pass's block lengths.
    let c = case("block:1x2", "block:2x2", "mx:2");
    assert_eq!(c.recipe.contraction_blocks(Pass::Wgrad), (Some(2), Some(2)));
}

/// A recipe the block reference cannot check is refused as bad input, naming the flag.
#[test]
fn refused_recipes_name_their_flag() {
    let mut c = case("block:1x2", "expert", "group");
    c.recipe.accumulation = crate::fp8::AccumModel::FastPromote;
    let e = block_expected(&c, Passes::ALL).unwrap_err().to_string();
    assert!(e.contains("--accum"), "{e}");
    let mut c = case("block:2x2", "expert", "group");
    let e = c.validate(Passes::ALL).unwrap_err().to_string();
    assert!(
        e.contains("fp8.lhs.scope block:2x2/deepgemm does not apply"),
        "{e}"
    );
    c.recipe.lhs.scope = scope("tensor");
    assert!(c.validate(Passes::ALL).is_ok());
}
