//! `emulate`: a CPU model of a tiled grouped-GEMM kernel, with optional injected bugs.
//!
//! The model poisons every output with NaN, then for each group walks M tiles of `tile_m`
//! rows and K blocks of `tile_k`: products are formed in f32 and summed in f32 within a block,
//! in order from 0 (one fused multiply-add each where the CPU has FMA), and each block partial
//! is added to an f32 accumulator that starts at 0 ([`super::blocked`], register-blocked and
//! packed, reading bf16 weights where they lie). The result is rounded once to
//! `case.out_dtype`. Groups run in parallel. Zero-size work writes exact zeros where the
//! contract demands (tail rows of `out`/`dlhs`, `drhs` of empty experts, `out` when `K = 0`).
//!
//! [`Bug`] injects one realistic kernel defect; `moecheck selftest` checks that the
//! properties catch every one of them.

use moecheck_reference::format::{round_to, Format, Overflow};
use moecheck_reference::gemm::{
    Accumulator, Gemm, GemmOutputs, GroupedGemmCase, Pass, Passes, Precision, WeightView,
};
use moecheck_reference::op::{Implementation, RunError};

use super::blocked::{blocked_gemm, Elem};
use crate::impls::{model_name, PlantedBug};
use moecheck_reference::par::{self, map_by_cost};
use ndarray::{s, Array2, Array3, ArrayView2, ArrayViewMut2, Axis};

/// A defect that can be injected into [`Emulate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// `drhs` of empty experts is left poisoned (never written).
    EmptyExpertWgradNotZeroed,
    /// Tail rows (dropped tokens) of `out` and `dlhs` are left poisoned.
    TailRowsUninitialised,
    /// Group `g` is multiplied by the expert at `g`'s index among the non-empty groups
    /// (compacted indexing): wrong after an empty group.
    GroupOffsetAfterEmpty,
    /// The last K block is skipped when `K % tile_k != 0`.
    PartialKTileIgnored,
    /// The last partial M tile of each group is not written.
    PartialMTileDropped,
    /// The running sum is rounded to bf16 after each addition.
    LowPrecisionAccumulator,
    /// Tail rows' `dout` is added into the last expert's `drhs`.
    WgradReadsTail,
    /// When `K = 0`, `out` is left poisoned.
    KZeroGarbage,
}

impl PlantedBug for Bug {
    const ALL: &'static [Bug] = &[
        Bug::EmptyExpertWgradNotZeroed,
        Bug::TailRowsUninitialised,
        Bug::GroupOffsetAfterEmpty,
        Bug::PartialKTileIgnored,
        Bug::PartialMTileDropped,
        Bug::LowPrecisionAccumulator,
        Bug::WgradReadsTail,
        Bug::KZeroGarbage,
    ];

    fn name(self) -> &'static str {
        match self {
            Bug::EmptyExpertWgradNotZeroed => "empty-expert-wgrad-not-zeroed",
            Bug::TailRowsUninitialised => "tail-rows-uninitialised",
            Bug::GroupOffsetAfterEmpty => "group-offset-after-empty",
            Bug::PartialKTileIgnored => "partial-k-tile-ignored",
            Bug::PartialMTileDropped => "partial-m-tile-dropped",
            Bug::LowPrecisionAccumulator => "low-precision-accumulator",
            Bug::WgradReadsTail => "wgrad-reads-tail",
            Bug::KZeroGarbage => "k-zero-garbage",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Bug::EmptyExpertWgradNotZeroed => "drhs of empty experts is left uninitialised",
            Bug::TailRowsUninitialised => "tail rows of out and dlhs are left uninitialised",
            Bug::GroupOffsetAfterEmpty => {
                "group g uses the weights of the expert at its index among non-empty groups"
            }
            Bug::PartialKTileIgnored => "the last K block is skipped when K % tile_k != 0",
            Bug::PartialMTileDropped => "the last partial M tile of each group is not written",
            Bug::LowPrecisionAccumulator => "the running sum is rounded to bf16 after each add",
            Bug::WgradReadsTail => "tail rows' dout are added into the last expert's drhs",
            Bug::KZeroGarbage => "with K = 0, out is left uninitialised",
        }
    }
}

/// The CPU model of a tiled kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emulate {
    /// Rows per M tile (default 64).
    pub tile_m: usize,
    /// Products per K block (default 32).
    pub tile_k: usize,
    /// The defect to inject, if any.
    pub inject: Option<Bug>,
}

impl Default for Emulate {
    fn default() -> Self {
        Emulate {
            tile_m: 64,
            tile_k: 32,
            inject: None,
        }
    }
}

impl Emulate {
    /// The default tiling with `bug` injected.
    pub fn with_bug(bug: Option<Bug>) -> Emulate {
        Emulate {
            inject: bug,
            ..Emulate::default()
        }
    }

    fn has(&self, bug: Bug) -> bool {
        self.inject == Some(bug)
    }

    /// The blocked f32 dot product of `n` products `f(i)`.
    fn dot(&self, n: usize, f: impl Fn(usize) -> f32) -> f32 {
        let b = self.tile_k.max(1);
        let low = self.has(Bug::LowPrecisionAccumulator);
        let to_bf16 = |x: f32| round_to(x as f64, Format::Bf16, Overflow::Ieee) as f32;
        let mut acc = 0.0f32;
        let mut start = 0;
        while start < n {
            let end = (start + b).min(n);
            let mut part = 0.0f32;
            for i in start..end {
                part += f(i);
                if low {
                    part = to_bf16(part);
                }
            }
            acc += part;
            if low {
                acc = to_bf16(acc);
            }
            start = end;
        }
        acc
    }

    /// The row ranges `[lo, hi)` of the M tiles of a group `[lo, hi)`, honouring
    /// `PartialMTileDropped`.
    fn m_tiles(&self, lo: usize, hi: usize) -> Vec<(usize, usize)> {
        let t = self.tile_m.max(1);
        let mut tiles = Vec::new();
        let mut r = lo;
        while r < hi {
            let e = (r + t).min(hi);
            if !(self.has(Bug::PartialMTileDropped) && e - r < t) {
                tiles.push((r, e));
            }
            r = e;
        }
        tiles
    }

    /// The first index of the last partial K block, when `PartialKTileIgnored` skips it.
    fn k_limit(&self, k: usize) -> usize {
        let b = self.tile_k.max(1);
        if self.has(Bug::PartialKTileIgnored) && !k.is_multiple_of(b) {
            k - k % b
        } else {
            k
        }
    }

    /// `acc ← a·b` as the kernel accumulates it: for each K block of `tile_k` products a
    /// partial sum in f32 from 0, the partials added in f32 in block order
    /// ([`blocked::blocked_gemm`], which reads `b` where it lies, f32 or bf16). Under
    /// `LowPrecisionAccumulator` every addition is rounded to bf16 instead ([`Emulate::dot`],
    /// element by element). Every element of `acc` is written.
    fn blocked_into<B: Elem>(
        &self,
        a: ArrayView2<f32>,
        b: ArrayView2<B>,
        mut acc: ArrayViewMut2<f32>,
    ) {
        if self.has(Bug::LowPrecisionAccumulator) {
            let (rows, depth) = a.dim();
            acc.assign(&Array2::from_shape_fn((rows, b.ncols()), |(r, c)| {
                self.dot(depth, |i| a[(r, i)] * b[(i, c)].widen())
            }));
            return;
        }
        blocked_gemm(a, b, self.tile_k, acc);
    }

    /// Rounds the f32 values of `dst` once to the case's output format, in place. Outputs are
    /// held in f32 whatever the format: an f32 accumulator's values, and their roundings to a
    /// narrower format, are f32 values (and f64 values) exactly.
    fn round_out(&self, dst: &mut ArrayViewMut2<f32>, case: &GroupedGemmCase) {
        match case.out_dtype {
            Format::F32 | Format::F64 => {}
            out => dst.mapv_inplace(|v| round_to(f64::from(v), out, Overflow::Ieee) as f32),
        }
    }

    /// Each expert's rows of `all`, the output of `pass` (fwd's `out`, dgrad's `dlhs`): rows
    /// `written(g)` of group `g` (its M tiles) through [`Emulate::blocked_into`], rounded to the
    /// output format; the experts in parallel, a large one in several items of rows
    /// ([`Emulate::row_items`]), bf16 weights read where they lie. Columns past the last full K block stay unwritten under `PartialKTileIgnored`
    /// (dgrad), as do rows past the written ones.
    fn expert_rows(
        &self,
        case: &GroupedGemmCase,
        pass: Pass,
        all: ArrayViewMut2<f32>,
        written: &(dyn Fn(usize) -> (usize, usize) + Sync),
    ) {
        let off = case.offsets();
        let (k, n) = (case.k(), case.n());
        let klim = self.k_limit(k);
        let items = self.row_items(all, &off);
        map_by_cost(
            items,
            |(_, _, rows)| rows.nrows() * k * n,
            |(g, first, dst)| {
                // The rows of this item the kernel writes.
                let (lo, hi) = written(g);
                let (lo, hi) = (lo.max(first), hi.min(first + dst.nrows()));
                if lo >= hi {
                    return;
                }
                let w = case.rhs.expert(self.expert_of(&case.group_sizes, g));
                let (left, cols) = match pass {
                    Pass::Fwd => (case.lhs.slice(s![lo..hi, ..klim]), n),
                    Pass::Dgrad => {
                        let dout = case.dout.as_ref().expect("checked by the caller");
                        (dout.slice(s![lo..hi, ..]), klim)
                    }
                    Pass::Wgrad => unreachable!("wgrad writes drhs, not rows of the output"),
                };
                let mut dst = dst.slice_move(s![lo - first..hi - first, ..cols]);
                // The weight where it lies: fwd reads `rhs_g[..klim, :]`, dgrad `rhs_g[..klim, :]ᵀ`.
                fn right<T>(w: ArrayView2<'_, T>, klim: usize, pass: Pass) -> ArrayView2<'_, T> {
                    let w = w.slice_move(s![..klim, ..]);
                    if pass == Pass::Fwd {
                        w
                    } else {
                        w.reversed_axes()
                    }
                }
                match w {
                    WeightView::F32(w) => {
                        self.blocked_into(left, right(w, klim, pass), dst.view_mut())
                    }
                    WeightView::Bf16(w) => {
                        self.blocked_into(left, right(w, klim, pass), dst.view_mut())
                    }
                }
                self.round_out(&mut dst, case);
            },
        );
    }

    /// Rows per parallel item of a pass over `used` rows: a quarter of an even share per
    /// core, in whole M tiles. An expert of many rows (a skewed routing's hottest expert
    /// holds about a quarter of them) is then computed on every core rather than on one
    /// while the others wait, and the others still take a few items each. No element's
    /// arithmetic depends on it.
    fn item_rows(&self, used: usize) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let tile = self.tile_m.max(1);
        used.div_ceil(4 * cores).div_ceil(tile).max(1) * tile
    }

    /// Each group's rows of `all` (the output of fwd or dgrad) in items of at most
    /// [`Emulate::item_rows`] rows, each with its group and its first row; the tail rows
    /// past the last group are not among them.
    fn row_items<'a>(
        &self,
        mut all: ArrayViewMut2<'a, f32>,
        off: &[usize],
    ) -> Vec<(usize, usize, ArrayViewMut2<'a, f32>)> {
        let groups = off.len() - 1;
        let per = self.item_rows(off[groups]);
        let mut items = Vec::new();
        for g in 0..groups {
            let (mut rows, rest) = all.split_at(Axis(0), off[g + 1] - off[g]);
            all = rest;
            let mut first = off[g];
            while rows.nrows() > per {
                let (head, tail) = rows.split_at(Axis(0), per);
                items.push((g, first, head));
                (first, rows) = (first + per, tail);
            }
            items.push((g, first, rows));
        }
        items
    }

    /// Which expert's weights group `g` reads (compacted under `GroupOffsetAfterEmpty`).
    fn expert_of(&self, sizes: &[usize], g: usize) -> usize {
        if self.has(Bug::GroupOffsetAfterEmpty) {
            sizes[..g].iter().filter(|&&s| s > 0).count()
        } else {
            g
        }
    }
}

impl Implementation<Gemm> for Emulate {
    fn name(&self) -> String {
        model_name(self.inject)
    }

    fn is_model(&self) -> bool {
        true
    }

    /// Each expert is computed on its own, and the tail rows are the last shard's, so a
    /// shard's outputs are its experts' in the whole case, planted bugs included; except
    /// `group-offset-after-empty`, whose wrong weight depends on the empty experts before
    /// the group in the whole case.
    fn shardable(&self) -> bool {
        !self.has(Bug::GroupOffsetAfterEmpty)
    }

    fn precision(&self, case: &GroupedGemmCase) -> Precision {
        Precision {
            input: case.dtype,
            accumulator: Accumulator {
                format: Format::F32,
                block: Some(self.tile_k.max(1)),
            },
            output: case.out_dtype,
        }
    }

    fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        let (m, k, n) = (case.m(), case.k(), case.n());
        let g_count = case.groups();
        let off = case.offsets();
        let used = off[g_count];
        let lhs = &case.lhs;
        let tail_zero = !self.has(Bug::TailRowsUninitialised);
        let klim = self.k_limit(k);
        let mut result = GemmOutputs::default();
        let dout = || {
            case.dout
                .as_ref()
                .ok_or_else(|| RunError::new("dout is missing"))
        };
        // Rows of group `g` the kernel writes: its M tiles (the last partial one dropped
        // under `PartialMTileDropped`).
        let written = |g: usize| {
            let (lo, hi) = (off[g], off[g + 1]);
            let tiles = self.m_tiles(lo, hi);
            (lo, tiles.last().map_or(lo, |t| t.1))
        };

        if passes.fwd {
            let mut out = nan_filled2((m, n));
            let k_zero_poison = k == 0 && self.has(Bug::KZeroGarbage);
            if !k_zero_poison {
                self.expert_rows(case, Pass::Fwd, out.view_mut(), &written);
                if tail_zero {
                    out.slice_mut(s![used.., ..]).fill(0.0);
                }
            }
            result.out = Some(out.into());
        }

        if passes.dgrad {
            dout()?;
            let mut dlhs = nan_filled2((m, k));
            self.expert_rows(case, Pass::Dgrad, dlhs.view_mut(), &written);
            if tail_zero {
                dlhs.slice_mut(s![used.., ..]).fill(0.0);
            }
            result.dlhs = Some(dlhs.into());
        }

        if passes.wgrad {
            let dout = dout()?;
            let mut drhs = Array3::<f32>::zeros((g_count, k, n));
            par::fill(drhs.as_slice_mut().expect("a new array"), f32::NAN);
            // Rows each expert's kernel reads: its M tiles, plus the tail for the last expert
            // under `WgradReadsTail` (even when that expert is empty).
            let rows_of = |g: usize| -> Vec<usize> {
                let (lo, hi) = written(g);
                let mut rows: Vec<usize> = (lo..hi).collect();
                if self.has(Bug::WgradReadsTail) && g + 1 == g_count {
                    rows.extend(used..m);
                }
                rows
            };
            // Each expert writes its own slice of drhs, an expert of many rows in pieces of
            // its K rows (each element's sum is over the expert's rows whatever the piece).
            let per_item = self.item_rows(used);
            let mut items = Vec::new();
            for (g, mut w) in drhs.outer_iter_mut().enumerate() {
                let pieces = (off[g + 1] - off[g]).div_ceil(per_item).max(1);
                let per = k.div_ceil(pieces).max(1);
                let mut first = 0;
                while w.nrows() > per {
                    let (head, rest) = w.split_at(Axis(0), per);
                    items.push((g, first, head));
                    (first, w) = (first + per, rest);
                }
                items.push((g, first, w));
            }
            map_by_cost(
                items,
                |&(g, _, ref w)| (off[g + 1] - off[g]) * w.nrows() * n,
                |(g, first, mut dst)| {
                    let rows = rows_of(g);
                    let empty = off[g] == off[g + 1];
                    if empty && rows.is_empty() {
                        if !self.has(Bug::EmptyExpertWgradNotZeroed) {
                            dst.fill(0.0);
                        }
                        return;
                    }
                    // An empty expert that reads the tail writes every k; others stop at klim.
                    let cols = if empty { k } else { klim };
                    let end = (first + dst.nrows()).min(cols);
                    if first >= end {
                        return;
                    }
                    let mut dst = dst.slice_mut(s![..end - first, ..]);
                    let contiguous = rows.windows(2).all(|w| w[1] == w[0] + 1);
                    if contiguous {
                        // The expert's rows where they lie.
                        let r = rows.first().map_or(0..0, |&f| f..f + rows.len());
                        let a = lhs.slice(s![r.clone(), first..end]);
                        self.blocked_into(a.t(), dout.slice(s![r, ..]), dst.view_mut());
                    } else {
                        let a = lhs.select(Axis(0), &rows);
                        let b = dout.select(Axis(0), &rows);
                        let a = a.slice(s![.., first..end]);
                        self.blocked_into(a.t(), b.view(), dst.view_mut());
                    }
                    self.round_out(&mut dst, case);
                },
            );
            result.drhs = Some(drhs.into());
        }
        Ok(result)
    }
}

/// A new `shape` array of NaN (what an unwritten element reads as), first touched in
/// parallel ([`par::fill`]).
fn nan_filled2(shape: (usize, usize)) -> Array2<f32> {
    let mut a = Array2::<f32>::zeros(shape);
    par::fill(a.as_slice_mut().expect("a new array"), f32::NAN);
    a
}

#[cfg(test)]
#[path = "emulate_tests.rs"]
mod tests;
