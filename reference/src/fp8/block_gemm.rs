//! The recipe-exact reference of an FP8 grouped GEMM with block scopes: every copy each pass
//! reads ([`super::block_scope`]'s table) quantised per its recipe ([`quantize_block_operands`]),
//! dequantised exactly (`decode(q) · scale_inv` of each element's block, in f64), and the f64
//! grouped GEMM of those values with its magnitudes `Σ|x̂a·x̂b|` ([`block_reference_from`]), as
//! [`super::reference_from_operands`] does for one scale per scope. The bound is
//! [`super::block_bound`]'s, the comparison [`compare_block`].
//!
//! Operands whose scope is not a block (`tensor`, `group`, `expert`) are quantised as before
//! ([`quantize_rows`]) and enter as copies with one scale per group or expert
//! ([`BlockCopy::from_scopes`]), so a recipe may mix them with block scopes.

use ndarray::{s, Array2, ArrayView2};

use super::block::{quantize_blocks, BlockQuantized};
use super::block_bound::BlockBound;
use super::case::{Fp8GemmCase, ScopeKind};
use super::compare::{Fp8Expected, Fp8Report};
use super::gemm::{rhs_rows, Fp8Operands};
use super::high_precision::high_precision;
use super::scaling::{quantize_rows, Quantized};
use crate::format::{Format, Overflow};
use crate::gemm::{
    compare_outputs_with_bound, grouped_dgrad, grouped_fwd, grouped_wgrad, reference, CaseReport,
    GemmOutputs, Passes, Precision, ReferenceResult, WideOutputs,
};
use crate::Error;

/// One quantised copy of an operand, in the operand's own layout (`(M, ·)` for `lhs`/`dout`,
/// `(G·K, N)` for `rhs`), as consecutive pieces of rows (one per group or expert), each
/// quantised in its own blocks. Rows past the last piece (dropped tokens) are 0.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockCopy {
    pub format: Format,
    /// `(rows, cols)` of the whole copy.
    pub shape: (usize, usize),
    /// Piece `i` holds rows `offsets[i]..offsets[i+1]`.
    pub offsets: Vec<usize>,
    pub pieces: Vec<BlockQuantized>,
}

impl BlockCopy {
    /// Quantises the rows of `x` in each piece (`offsets`) in `tile`s with `recipe`.
    pub fn blocks(
        x: ArrayView2<f32>,
        offsets: &[usize],
        tile: (usize, usize),
        format: Format,
        recipe: super::block::BlockRecipe,
    ) -> BlockCopy {
        let pieces = offsets
            .windows(2)
            .map(|w| quantize_blocks(x.slice(s![w[0]..w[1], ..]), tile, format, recipe))
            .collect();
        BlockCopy {
            format,
            shape: x.dim(),
            offsets: offsets.to_vec(),
            pieces,
        }
    }

    /// A per-scope quantisation as pieces `offsets` (each inside one scope): each piece one
    /// block, with its scope's `scale_inv` (1 for an empty piece).
    pub fn from_scopes(q: &Quantized, offsets: &[usize]) -> BlockCopy {
        let cols = q.q.ncols();
        let pieces = offsets
            .windows(2)
            .map(|w| {
                let rows = w[1] - w[0];
                let sinv = (rows > 0)
                    .then(|| q.scope_of_row(w[0]))
                    .flatten()
                    .map_or(1.0, |i| q.scale_inv[i]);
                let (br, bc) = (rows.max(1), cols.max(1));
                BlockQuantized {
                    format: q.format,
                    block: (br, bc),
                    q: q.q.slice(s![w[0]..w[1], ..]).to_owned(),
                    scale_inv: Array2::from_elem((rows.div_ceil(br), cols.div_ceil(bc)), sinv),
                }
            })
            .collect();
        BlockCopy {
            format: q.format,
            shape: q.q.dim(),
            offsets: offsets.to_vec(),
            pieces,
        }
    }

    /// The exact dequantised values (f64), 0 outside every piece.
    pub fn dequantize(&self) -> Array2<f64> {
        let mut out = Array2::<f64>::zeros(self.shape);
        for (w, p) in self.offsets.windows(2).zip(&self.pieces) {
            out.slice_mut(s![w[0]..w[1], ..]).assign(&p.dequantize());
        }
        out
    }

    /// The `scale_inv` of element `(r, c)`, `None` in no piece.
    pub fn sinv(&self, r: usize, c: usize) -> Option<f32> {
        let i =
            (0..self.pieces.len()).find(|&i| self.offsets[i] <= r && r < self.offsets[i + 1])?;
        let p = &self.pieces[i];
        Some(p.scale_inv[((r - self.offsets[i]) / p.block.0, c / p.block.1)])
    }
}

/// Every copy the passes of a block-scoped FP8 GEMM read ([`super::block_scope`]'s table).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockOperands {
    /// `lhs (M, K)` row-wise (fwd).
    pub lhs: BlockCopy,
    /// `rhs (G·K, N)` as fwd reads it.
    pub rhs: BlockCopy,
    /// `rhs (G·K, N)` as dgrad reads it (the same as `rhs` unless an MX scope).
    pub rhs_dgrad: BlockCopy,
    /// `dout (M, N)` row-wise (dgrad), when a backward pass is asked.
    pub dout: Option<BlockCopy>,
    /// `lhs (M, K)` column-wise, blocks along M within each group (wgrad).
    pub lhs_col: BlockCopy,
    /// `dout (M, N)` column-wise (wgrad).
    pub dout_col: Option<BlockCopy>,
}

/// The row-wise and column-wise copies of a row operand `x` (`lhs` or `dout`) under `scope`.
fn row_operand(
    case: &Fp8GemmCase,
    x: ArrayView2<f32>,
    scope: ScopeKind,
    format: Format,
    overflow: Overflow,
) -> (BlockCopy, BlockCopy) {
    let off = case.gemm.offsets();
    match scope.block() {
        Some(b) => (
            BlockCopy::blocks(x, &off, (1, b.cols), format, b.recipe),
            BlockCopy::blocks(x, &off, (b.cols, 1), format, b.recipe),
        ),
        None => {
            let c = BlockCopy::from_scopes(
                &quantize_rows(x, &case.row_scope(scope), format, overflow),
                &off,
            );
            (c.clone(), c)
        }
    }
}

/// Quantises every copy per the recipe (current scaling; [`Fp8GemmCase::validate`] refuses
/// delayed scaling with block scopes).
pub fn quantize_block_operands(case: &Fp8GemmCase, passes: Passes) -> BlockOperands {
    let r = &case.recipe;
    let ov = r.overflow();
    let (lhs, lhs_col) = row_operand(case, case.gemm.lhs.view(), r.lhs.scope, r.lhs.format, ov);
    let (dout, dout_col) = match (&case.gemm.dout, passes.needs_dout()) {
        (Some(d), true) => {
            let (a, b) = row_operand(case, d.view(), r.dout.scope, r.dout.format, ov);
            (Some(a), Some(b))
        }
        _ => (None, None),
    };
    let w = rhs_rows(&case.gemm.rhs);
    let (g, k, _) = case.gemm.rhs.dim();
    let experts: Vec<usize> = (0..=g).map(|e| e * k).collect();
    let (rhs, rhs_dgrad) = match r.rhs.scope.block() {
        Some(b) if b.is_mx() => (
            BlockCopy::blocks(w.view(), &experts, (b.cols, 1), r.rhs.format, b.recipe),
            BlockCopy::blocks(w.view(), &experts, (1, b.cols), r.rhs.format, b.recipe),
        ),
        Some(b) => {
            let c = BlockCopy::blocks(w.view(), &experts, (b.rows, b.cols), r.rhs.format, b.recipe);
            (c.clone(), c)
        }
        None => {
            let q = quantize_rows(w.view(), &case.rhs_scope(), r.rhs.format, ov);
            let c = BlockCopy::from_scopes(&q, &experts);
            (c.clone(), c)
        }
    };
    BlockOperands {
        lhs,
        rhs,
        rhs_dgrad,
        dout,
        lhs_col,
        dout_col,
    }
}

/// The f64 grouped GEMM of the dequantised copies, with magnitudes: fwd `lhs · rhs`, dgrad
/// `dout · rhs_dgradᵀ`, wgrad `lhs_colᵀ · dout_col`.
pub fn block_reference_from(
    case: &Fp8GemmCase,
    ops: &BlockOperands,
    passes: Passes,
) -> ReferenceResult {
    let off = case.gemm.offsets();
    let (g, k, n) = case.gemm.rhs.dim();
    let w3 = |c: &BlockCopy| {
        c.dequantize()
            .into_shape_with_order((g, k, n))
            .expect("G·K rows")
    };
    let lhs = ops.lhs.dequantize();
    let rhs = w3(&ops.rhs);
    let rhs_d = w3(&ops.rhs_dgrad);
    let dout = ops.dout.as_ref().map(BlockCopy::dequantize);
    let lhs_w = ops.lhs_col.dequantize();
    let dout_w = ops.dout_col.as_ref().map(BlockCopy::dequantize);
    let run = |abs: bool| {
        let f = |a: &Array2<f64>| if abs { a.mapv(f64::abs) } else { a.clone() };
        let f3 = |a: &ndarray::Array3<f64>| if abs { a.mapv(f64::abs) } else { a.clone() };
        WideOutputs {
            out: passes
                .fwd
                .then(|| grouped_fwd(f(&lhs).view(), f3(&rhs).view(), &off)),
            dlhs: match (passes.dgrad, &dout) {
                (true, Some(d)) => Some(grouped_dgrad(f(d).view(), f3(&rhs_d).view(), &off)),
                _ => None,
            },
            drhs: match (passes.wgrad, &dout_w) {
                (true, Some(d)) => Some(grouped_wgrad(f(&lhs_w).view(), f(d).view(), &off)),
                _ => None,
            },
        }
    };
    ReferenceResult {
        value: run(false),
        magnitude: run(true),
    }
}

/// Both references of a block-scoped case (validated first); `operands` is empty (the
/// per-scope operands describe no block scale; the model-based check never runs here).
pub fn block_expected(case: &Fp8GemmCase, passes: Passes) -> Result<Fp8Expected, Error> {
    case.validate(passes)?;
    let ops = quantize_block_operands(case, passes);
    Ok(Fp8Expected {
        recipe_exact: block_reference_from(case, &ops, passes),
        high_precision: reference(&case.gemm, passes)?,
        operands: Fp8Operands::empty(),
        // Block scopes accumulate exactly (fast accumulation is refused with them).
        cover: None,
    })
}

/// Compares `got` with the block reference, each pass within its [`BlockBound`] (the block
/// lengths along that pass's contraction), and with the unquantised GEMM for information.
pub fn compare_block(
    case: &Fp8GemmCase,
    passes: Passes,
    precision: &Precision,
    expected: &Fp8Expected,
    got: &GemmOutputs,
) -> Fp8Report {
    let mut whole: Option<CaseReport> = None;
    for pass in passes.iter() {
        let bound = BlockBound {
            output: case.gemm.out_dtype,
            blocks: case.recipe.contraction_blocks(pass),
        };
        let one = compare_outputs_with_bound(
            &case.gemm,
            Passes::only(pass),
            precision,
            &expected.recipe_exact,
            got,
            &|n| bound.at_len(n),
        );
        match &mut whole {
            Some(w) => w.passes.extend(one.passes),
            None => whole = Some(one),
        }
    }
    let recipe_exact = whole.unwrap_or_else(|| {
        compare_outputs_with_bound(
            &case.gemm,
            passes,
            precision,
            &expected.recipe_exact,
            got,
            &|_| unreachable!("no pass"),
        )
    });
    Fp8Report {
        recipe_exact,
        high_precision: high_precision(case, passes, &expected.high_precision, got),
        model: None,
        cover: None,
    }
}

#[cfg(test)]
#[path = "block_gemm_tests.rs"]
mod tests;
