//! The quantised operands of a block-scoped FP8 case in its case directory (docs/protocol.md,
//! "FP8 cases"): for a kernel that takes FP8 bytes and block scales (DeepGEMM's
//! `(tensor, scales)` pairs, an MXFP8 GEMM) rather than quantising the float32 inputs itself.
//! moecheck writes them; it never reads them back (its reference quantises the float32 inputs
//! again), so they cannot change a verdict.
//!
//! For each block-scoped operand, each copy a requested pass reads
//! ([`super::block_scope`]'s table), `NAME_q.npy` (uint8 FP8 bytes in the operand's own layout,
//! rows in no group 0) and `NAME_scale_inv.npy` (float32, one per block):
//!
//! | NAME | pass | bytes | scale_inv |
//! |---|---|---|---|
//! | `lhs` | fwd | `(M, K)` | `(rows in groups, ceil(K / C))` |
//! | `lhs_col` | wgrad | `(M, K)`, blocks along M | `(Σ_g ceil(size_g / C), K)`, each group's blocks in group order |
//! | `dout` | dgrad | `(M, N)` | `(rows in groups, ceil(N / C))` |
//! | `dout_col` | wgrad | `(M, N)`, blocks along M | `(Σ_g ceil(size_g / C), N)` |
//! | `rhs` | fwd (and dgrad for `block:RxC`) | `(G, K, N)` | `(G, ceil(K / R), ceil(N / C))`; `mx:S`: `(G, ceil(K / S), N)` |
//! | `rhs_dgrad` | dgrad, `mx:S` only | `(G, K, N)`, blocks along N | `(G, K, ceil(N / S))` |

use ndarray::{concatenate, s, Array2, ArrayView2, Axis};

use super::block_gemm::{quantize_block_operands, BlockCopy};
use super::case::Fp8GemmCase;
use crate::gemm::Passes;
use crate::protocol::Stored;

/// The bytes of every piece in the copy's shape.
fn bytes(c: &BlockCopy) -> Array2<u8> {
    let mut q = Array2::<u8>::zeros(c.shape);
    for (w, p) in c.offsets.windows(2).zip(&c.pieces) {
        q.slice_mut(s![w[0]..w[1], ..]).assign(&p.q);
    }
    q
}

/// The pieces' scale grids stacked in piece order.
fn grid(c: &BlockCopy) -> Array2<f32> {
    let views: Vec<ArrayView2<f32>> = c.pieces.iter().map(|p| p.scale_inv.view()).collect();
    match views.first() {
        Some(v) => concatenate(Axis(0), &views).unwrap_or_else(|_| Array2::zeros((0, v.ncols()))),
        None => Array2::zeros((0, 0)),
    }
}

/// The files of the module docs' table for `case` and `passes` (none without block scopes).
pub fn block_input_files(case: &Fp8GemmCase, passes: Passes) -> Vec<(String, Stored)> {
    let r = &case.recipe;
    if !r.has_block_scope() {
        return Vec::new();
    }
    let ops = quantize_block_operands(case, passes);
    let (g, k, n) = case.gemm.rhs.dim();
    let mut files = Vec::new();
    let mut push = |name: &str, c: &BlockCopy, experts: bool| {
        let (q, sinv) = (bytes(c), grid(c));
        let (q, sinv) = if experts {
            let rows = sinv.nrows().checked_div(g).unwrap_or(0);
            let cols = sinv.ncols();
            (
                q.into_shape_with_order((g, k, n))
                    .expect("G·K rows")
                    .into_dyn(),
                sinv.into_shape_with_order((g, rows, cols))
                    .expect("one grid per expert")
                    .into_dyn(),
            )
        } else {
            (q.into_dyn(), sinv.into_dyn())
        };
        files.push((format!("{name}_q.npy"), Stored::U8(q)));
        files.push((format!("{name}_scale_inv.npy"), Stored::F32(sinv)));
    };
    if r.lhs.scope.block().is_some() {
        if passes.fwd {
            push("lhs", &ops.lhs, false);
        }
        if passes.wgrad {
            push("lhs_col", &ops.lhs_col, false);
        }
    }
    if let (Some(_), Some(d), Some(dc)) = (r.dout.scope.block(), &ops.dout, &ops.dout_col) {
        if passes.dgrad {
            push("dout", d, false);
        }
        if passes.wgrad {
            push("dout_col", dc, false);
        }
    }
    if let Some(b) = r.rhs.scope.block() {
        if passes.fwd || (passes.dgrad && !b.is_mx()) {
            push("rhs", &ops.rhs, true);
        }
        if passes.dgrad && b.is_mx() {
            push("rhs_dgrad", &ops.rhs_dgrad, true);
        }
    }
    files
}
