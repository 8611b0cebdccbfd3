//! `emulate` for FP8 recipes with block scopes: a CPU model of a block-scaled grouped GEMM
//! (DeepGEMM's, an MXFP8 kernel's), with the planted block-scale bugs.
//!
//! It quantises every copy a pass reads (`moecheck_reference::fp8::block_scope`'s table) with
//! the block recipe (operands whose scope is not a block as the per-scope model does, its
//! planted bugs included), then for each output element walks the contraction in
//! **segments** on which both scales are constant (the union of the two operands' block grids,
//! from 0, or from the group's first row for wgrad): a segment's exact f32 products summed in
//! f32 from +0, scaled `fl32(fl32(part · sa) · sb)` with the scales read at the segment's
//! start, added into an f32 accumulator; one rounding to the output format at the end. This
//! is the computation `moecheck_reference::fp8::block_bound` bounds. It is computed a tile
//! of outputs and a segment at a time by the blocked kernel's chained sums
//! ([`segmented_gemm`]), with the bits of the element-by-element sum. A model, never a GPU
//! result.

use moecheck_reference::format::{encode_fp8, Format, Overflow};
use moecheck_reference::fp8::block::{BlockRecipe, MxRounding};
use moecheck_reference::fp8::block_gemm::BlockCopy;
use moecheck_reference::fp8::{fp8_max, rhs_rows, Fp8GemmCase};
use moecheck_reference::gemm::stream::by_group_rows;
use moecheck_reference::gemm::{GemmOutputs, Pass, Passes};
use moecheck_reference::op::RunError;
use moecheck_reference::par::map_by_cost;
use ndarray::{s, Array2, Array3, ArrayView2, ArrayViewMut2};

use super::bug::Fp8Bug;
use super::emulate::{finish, EmulateFp8};
use super::operand::KernelOperand;
use crate::impls::gemm::blocked::chained_gemm;

/// A copy as the kernel reads it: decoded values and the `scale_inv` it reads for each
/// element (after any layout bug).
struct Read {
    vals: Array2<f32>,
    sinv: Array2<f32>,
}

impl Read {
    fn of_copy(c: &BlockCopy) -> Read {
        let mut sinv = Array2::<f32>::ones(c.shape);
        let mut vals = Array2::<f32>::zeros(c.shape);
        for (w, p) in c.offsets.windows(2).zip(&c.pieces) {
            let (br, bc) = p.block;
            for ((r, col), q) in p.q.indexed_iter() {
                vals[(w[0] + r, col)] = moecheck_reference::format::decode_fp8(*q, c.format) as f32;
                sinv[(w[0] + r, col)] = p.scale_inv[(r / br, col / bc)];
            }
        }
        Read { vals, sinv }
    }

    fn of_scoped(op: &KernelOperand) -> Read {
        let vals = op.values().clone();
        let sinv = Array2::from_shape_fn(vals.dim(), |(r, c)| op.sinv(r, c));
        Read { vals, sinv }
    }
}

/// `floor(log2 |v|)` of a normal f32 (block amaxes below 2^-126 are not generated).
fn exponent(v: f32) -> i32 {
    ((v.to_bits() >> 23) & 0xff) as i32 - 127
}

/// [`BlockCopy::blocks`] with the power-of-two scale rounded the wrong way
/// ([`Fp8Bug::E8m0WrongRounding`]); other recipes unchanged.
fn wrong_e8m0(
    x: ArrayView2<f32>,
    offsets: &[usize],
    tile: (usize, usize),
    format: Format,
    recipe: BlockRecipe,
) -> BlockCopy {
    let max = fp8_max(format);
    let emax = if format == Format::E4m3 { 8 } else { 15 };
    let mut copy = BlockCopy::blocks(x, offsets, tile, format, recipe);
    for (w, p) in offsets.windows(2).zip(copy.pieces.iter_mut()) {
        let part = x.slice(s![w[0]..w[1], ..]);
        let (br, bc) = tile;
        for ((bi, bj), si) in p.scale_inv.indexed_iter_mut() {
            let t = part.slice(s![
                bi * br..((bi + 1) * br).min(part.nrows()),
                bj * bc..((bj + 1) * bc).min(part.ncols())
            ]);
            let amax = t.fold(0f32, |m, v| m.max(v.abs()));
            if amax == 0.0 || !amax.is_finite() {
                continue;
            }
            let ceil_log2 = |v: f32| exponent(v) + i32::from(v.to_bits() & 0x7f_ffff != 0);
            let e = match recipe {
                BlockRecipe::Mx {
                    rounding: MxRounding::Floor,
                } => ceil_log2(amax) - emax,
                BlockRecipe::Mx {
                    rounding: MxRounding::Rceil,
                } => exponent(amax / max),
                BlockRecipe::DeepGemm { ue8m0: true, .. } => exponent(amax.max(1e-4) / max),
                BlockRecipe::DeepGemm { .. } => continue,
            };
            *si = (2f64).powi(e) as f32;
            let inv = 2f64.powi(-e);
            for r in bi * br..((bi + 1) * br).min(part.nrows()) {
                for c in bj * bc..((bj + 1) * bc).min(part.ncols()) {
                    p.q[(r, c)] =
                        encode_fp8(f64::from(part[(r, c)]) * inv, format, Overflow::Saturate);
                }
            }
        }
    }
    copy
}

/// Every copy the passes read, as the kernel reads them.
struct Reads {
    lhs: Read,
    rhs: Read,
    rhs_dgrad: Read,
    dout: Option<Read>,
    lhs_col: Read,
    dout_col: Option<Read>,
}

impl EmulateFp8 {
    fn blocks(
        &self,
        x: ArrayView2<f32>,
        offsets: &[usize],
        tile: (usize, usize),
        format: Format,
        recipe: BlockRecipe,
    ) -> BlockCopy {
        if self.has(Fp8Bug::E8m0WrongRounding) {
            wrong_e8m0(x, offsets, tile, format, recipe)
        } else {
            BlockCopy::blocks(x, offsets, tile, format, recipe)
        }
    }

    /// The row-wise and column-wise reads of `lhs` or `dout` (`scoped`: the per-scope
    /// model's copies, for a scope that is not a block), with the layout bugs.
    fn row_reads(
        &self,
        case: &Fp8GemmCase,
        x: ArrayView2<f32>,
        op: moecheck_reference::fp8::OperandRecipe,
        scoped: (&KernelOperand, &KernelOperand),
        k_tail: bool,
    ) -> (Read, Read) {
        let Some(b) = op.scope.block() else {
            return (Read::of_scoped(scoped.0), Read::of_scoped(scoped.1));
        };
        let off = case.gemm.offsets();
        let used = *off.last().unwrap_or(&0);
        let row = self.blocks(x, &off, (1, b.cols), op.format, b.recipe);
        let col_off = if self.has(Fp8Bug::BlockCrossesGroup) {
            vec![0, used]
        } else {
            off.clone()
        };
        let col = self.blocks(x, &col_off, (b.cols, 1), op.format, b.recipe);
        let mut r = Read::of_copy(&row);
        let cols = x.ncols();
        let nb = cols.div_ceil(b.cols);
        if self.has(Fp8Bug::BlockScalesTransposed) && nb > 0 {
            // The (used, nb) grid, row-major, read at column-major positions.
            let grid: Vec<f32> = (0..used)
                .flat_map(|i| (0..nb).map(move |j| (i, j * b.cols)))
                .map(|(i, c)| r.sinv[(i, c)])
                .collect();
            for i in 0..used {
                for c in 0..cols {
                    r.sinv[(i, c)] = grid[(c / b.cols) * used + i];
                }
            }
        }
        if k_tail && self.has(Fp8Bug::KTailPreviousScale) {
            tail_previous(&mut r.sinv, b.cols, 0, cols);
        }
        let c = if self.has(Fp8Bug::WgradRowwiseCopy) {
            Read::of_copy(&row)
        } else {
            Read::of_copy(&col)
        };
        (r, c)
    }

    fn block_reads(&self, case: &Fp8GemmCase, passes: Passes) -> Reads {
        let r = &case.recipe;
        let scoped = self.operands_of(case, passes);
        let (lhs, lhs_col) = self.row_reads(
            case,
            case.gemm.lhs.view(),
            r.lhs,
            (&scoped.lhs, &scoped.lhs_col),
            true,
        );
        let (dout, dout_col) = match (&case.gemm.dout, &scoped.dout, &scoped.dout_col) {
            (Some(d), Some(a), Some(b)) => {
                let (x, y) = self.row_reads(case, d.view(), r.dout, (a, b), false);
                (Some(x), Some(y))
            }
            _ => (None, None),
        };
        let (g, k, _) = case.gemm.rhs.dim();
        let experts: Vec<usize> = (0..=g).map(|e| e * k).collect();
        let w = rhs_rows(&case.gemm.rhs);
        let (mut rhs, rhs_dgrad, k_len) = match r.rhs.scope.block() {
            None => (
                Read::of_scoped(&scoped.rhs),
                Read::of_scoped(&scoped.rhs),
                None,
            ),
            Some(b) if b.is_mx() => (
                Read::of_copy(&self.blocks(
                    w.view(),
                    &experts,
                    (b.cols, 1),
                    r.rhs.format,
                    b.recipe,
                )),
                Read::of_copy(&self.blocks(
                    w.view(),
                    &experts,
                    (1, b.cols),
                    r.rhs.format,
                    b.recipe,
                )),
                Some(b.cols),
            ),
            Some(b) => {
                let c = self.blocks(w.view(), &experts, (b.rows, b.cols), r.rhs.format, b.recipe);
                (Read::of_copy(&c), Read::of_copy(&c), Some(b.rows))
            }
        };
        if let (Some(len), true) = (k_len, self.has(Fp8Bug::KTailPreviousScale)) {
            // Along K: the rows of each expert's (K, N) weight, as columns of the transpose.
            let mut t = rhs.sinv.t().to_owned();
            for e in 0..g {
                tail_previous(&mut t, len, e * k, (e + 1) * k);
            }
            rhs.sinv = t.t().to_owned();
        }
        Reads {
            lhs,
            rhs,
            rhs_dgrad,
            dout,
            lhs_col,
            dout_col,
        }
    }

    /// The block-scoped model (module docs).
    pub(super) fn run_blocks(
        &self,
        case: &Fp8GemmCase,
        passes: Passes,
    ) -> Result<GemmOutputs, RunError> {
        if passes.needs_dout() && case.gemm.dout.is_none() {
            return Err(RunError::new("dout is missing"));
        }
        let rd = self.block_reads(case, passes);
        let g = &case.gemm;
        let (m, k, n, gc) = (g.m(), g.k(), g.n(), g.groups());
        let off = g.offsets();
        let out_fmt = g.out_dtype;
        let grid = |p: Pass| case.recipe.contraction_blocks(p);
        let mut res = GemmOutputs::default();
        // Each expert's products (every pass has K·N per row), the cost experts run in
        // parallel by.
        let size = |e: usize| off[e + 1] - off[e];
        let work = |e: usize| (size(e) * k * n).max(1);
        let rows = |e: usize| s![e * k..(e + 1) * k, ..];
        if passes.fwd {
            let mut out = Array2::<f32>::zeros((m, n));
            let (l, w) = (&rd.lhs, &rd.rhs);
            by_group_rows(out.view_mut(), &off, work, |e, dst| {
                let r0 = off[e];
                let a = l.vals.slice(s![r0..r0 + dst.nrows(), ..]);
                let sa = |i: usize, j: usize| l.sinv[(r0 + i, j)];
                let sb = |j: usize, c: usize| w.sinv[(e * k + j, c)];
                let b = w.vals.slice(rows(e));
                segmented_gemm(a, b, grid(Pass::Fwd), (sa, sb), out_fmt, dst);
            });
            res.out = Some(out.into());
        }
        if let (true, Some(d)) = (passes.dgrad, &rd.dout) {
            let mut dlhs = Array2::<f32>::zeros((m, k));
            let w = &rd.rhs_dgrad;
            by_group_rows(dlhs.view_mut(), &off, work, |e, dst| {
                let r0 = off[e];
                let a = d.vals.slice(s![r0..r0 + dst.nrows(), ..]);
                let sa = |i: usize, j: usize| d.sinv[(r0 + i, j)];
                let sb = |j: usize, c: usize| w.sinv[(e * k + c, j)];
                let b = w.vals.slice(rows(e)).reversed_axes();
                segmented_gemm(a, b, grid(Pass::Dgrad), (sa, sb), out_fmt, dst);
            });
            res.dlhs = Some(dlhs.into());
        }
        if let (true, Some(d)) = (passes.wgrad, &rd.dout_col) {
            let mut drhs = Array3::<f32>::zeros((gc, k, n));
            let l = &rd.lhs_col;
            let experts: Vec<_> = drhs.outer_iter_mut().enumerate().collect();
            // An empty expert's gradient is exactly 0 (an empty sum).
            map_by_cost(
                experts,
                |(e, _)| work(*e),
                |(e, dst)| {
                    let (lo, hi) = (off[e], off[e + 1]);
                    let a = l.vals.slice(s![lo..hi, ..]).reversed_axes();
                    let sa = |i: usize, j: usize| l.sinv[(lo + j, i)];
                    let sb = |j: usize, c: usize| d.sinv[(lo + j, c)];
                    let b = d.vals.slice(s![lo..hi, ..]);
                    segmented_gemm(a, b, grid(Pass::Wgrad), (sa, sb), out_fmt, dst);
                },
            );
            res.drhs = Some(drhs.into());
        }
        Ok(res)
    }
}

/// Columns `lo..hi` of every row of `sinv` are one contraction in blocks of `len`: the K
/// tail block's scales replaced by the previous block's ([`Fp8Bug::KTailPreviousScale`]: the
/// kernel counts `K / len` blocks, not `ceil`).
fn tail_previous(sinv: &mut Array2<f32>, len: usize, lo: usize, hi: usize) {
    let full = (hi - lo) / len;
    if (hi - lo).is_multiple_of(len) || full == 0 {
        return;
    }
    let prev = lo + (full - 1) * len;
    for mut row in sinv.rows_mut() {
        let s = row[prev];
        row.slice_mut(s![lo + full * len..hi]).fill(s);
    }
}

/// Rows and columns of the outputs [`segmented_gemm`] sums at a time: a tile's partial sums
/// and accumulators (256 KiB each) stay in L2 while the segments go by.
const TILE: (usize, usize) = (128, 512);

/// The segments of a contraction of `n` on which both scales are constant (`blocks`: each
/// side's block length, `None` for constant): `(start, end)`, cut wherever either grid has a
/// boundary, as `moecheck_reference::fp8::block_bound::BlockBound::segments` counts them.
fn segments(n: usize, blocks: (Option<usize>, Option<usize>)) -> Vec<(usize, usize)> {
    let cut = |i: usize, c: Option<usize>| c.is_some_and(|c| i.is_multiple_of(c));
    let starts: Vec<usize> = (0..n)
        .filter(|&i| i == 0 || cut(i, blocks.0) || cut(i, blocks.1))
        .collect();
    let ends = starts.iter().skip(1).copied().chain(std::iter::once(n));
    starts.iter().copied().zip(ends).collect()
}

/// `dst ← a·b` as the model computes each element (module docs): the f32 accumulator of
/// `a[i, ·]·b[·, c]` over the [`segments`], each segment's products summed in f32 from +0 in
/// order, scaled `fl32(fl32(part · sa(i, j0)) · sb(j0, c))` with the scales read at the
/// segment's start `j0`, added into the accumulator from +0; one rounding to `out`.
///
/// Every product of two decoded FP8 values is exact in f32, so a segment's sum in order is
/// one fused multiply-add chain: the blocked kernel's [`chained_gemm`] computes it for a tile
/// of outputs at once, with the same bits as the element-by-element sum this replaced (which
/// read strided operands one element at a time: 90% of a block-scaled check's time; a test
/// compares the two).
fn segmented_gemm(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    blocks: (Option<usize>, Option<usize>),
    (sa, sb): (impl Fn(usize, usize) -> f32, impl Fn(usize, usize) -> f32),
    out: Format,
    mut dst: ArrayViewMut2<f32>,
) {
    let (rows, depth) = a.dim();
    let cols = b.ncols();
    let segs = segments(depth, blocks);
    let (tr, tc) = (TILE.0.min(rows), TILE.1.min(cols));
    let mut part = Array2::<f32>::zeros((tr, tc));
    let mut acc = Array2::<f32>::zeros((tr, tc));
    let mut sbs = vec![0f32; tc];
    for i0 in (0..rows).step_by(TILE.0) {
        let h = (rows - i0).min(TILE.0);
        for c0 in (0..cols).step_by(TILE.1) {
            let w = (cols - c0).min(TILE.1);
            let mut acc = acc.slice_mut(s![..h, ..w]);
            acc.fill(0.0);
            for &(j0, j1) in &segs {
                let mut part = part.slice_mut(s![..h, ..w]);
                let (ta, tb) = (
                    a.slice(s![i0..i0 + h, j0..j1]),
                    b.slice(s![j0..j1, c0..c0 + w]),
                );
                chained_gemm(ta, tb, part.view_mut());
                for (c, v) in sbs[..w].iter_mut().enumerate() {
                    *v = sb(j0, c0 + c);
                }
                for (i, (mut acc, part)) in acc.outer_iter_mut().zip(part.outer_iter()).enumerate()
                {
                    let s = sa(i0 + i, j0);
                    for ((x, p), t) in acc.iter_mut().zip(part).zip(&sbs[..w]) {
                        *x += (p * s) * t;
                    }
                }
            }
            dst.slice_mut(s![i0..i0 + h, c0..c0 + w])
                .zip_mut_with(&acc, |d, &v| *d = finish(out, v, 1.0, 1.0));
        }
    }
}

#[cfg(test)]
#[path = "block_emulate_tests.rs"]
mod tests;
