//! `emulate`: a CPU model of a tiled grouped-GEMM kernel, with optional injected bugs.
//!
//! The model poisons every output with NaN, then for each group walks M tiles of `tile_m`
//! rows and K blocks of `tile_k`: products are formed in f32, summed sequentially in f32
//! within a block, and each block partial is added to an f32 accumulator. The result is
//! rounded once to `case.out_dtype`. Zero-size work writes exact zeros where the contract
//! demands (tail rows of `out`/`dlhs`, `drhs` of empty experts, `out` when `K = 0`).
//!
//! [`Bug`] injects one realistic kernel defect; `moecheck selftest` checks that the
//! properties catch every one of them.

use moecheck_reference::format::{round_to, Format, Overflow};
use moecheck_reference::gemm::{
    Accumulator, Gemm, GemmOutputs, GroupedGemmCase, Passes, Precision,
};
use moecheck_reference::op::{Implementation, RunError};

use crate::impls::{model_name, PlantedBug};
use ndarray::{Array2, Array3};

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
        if self.has(Bug::PartialKTileIgnored) && k % b != 0 {
            k - k % b
        } else {
            k
        }
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
        let out_fmt = case.out_dtype;
        let round = |x: f32| round_to(x as f64, out_fmt, Overflow::Ieee);
        let lhs = &case.lhs;
        let rhs = &case.rhs;
        let sizes = &case.group_sizes;
        let tail_zero = !self.has(Bug::TailRowsUninitialised);
        let mut result = GemmOutputs::default();

        if passes.fwd {
            let mut out = Array2::<f64>::from_elem((m, n), f64::NAN);
            let k_zero_poison = k == 0 && self.has(Bug::KZeroGarbage);
            let klim = self.k_limit(k);
            for g in 0..g_count {
                let e = self.expert_of(sizes, g);
                for (lo, hi) in self.m_tiles(off[g], off[g + 1]) {
                    for r in lo..hi {
                        for c in 0..n {
                            if k_zero_poison {
                                continue;
                            }
                            let v = if e < g_count {
                                self.dot(klim, |i| lhs[(r, i)] * rhs[(e, i, c)])
                            } else {
                                0.0
                            };
                            out[(r, c)] = round(v);
                        }
                    }
                }
            }
            if tail_zero && !k_zero_poison {
                out.slice_mut(ndarray::s![used.., ..]).fill(0.0);
            }
            result.out = Some(out);
        }

        if passes.needs_dout() {
            let dout = case
                .dout
                .as_ref()
                .ok_or_else(|| RunError("dout is missing".into()))?;
            if passes.dgrad {
                let mut dlhs = Array2::<f64>::from_elem((m, k), f64::NAN);
                let klim = self.k_limit(k);
                for g in 0..g_count {
                    let e = self.expert_of(sizes, g);
                    for (lo, hi) in self.m_tiles(off[g], off[g + 1]) {
                        for r in lo..hi {
                            for kk in 0..klim {
                                let v = if e < g_count {
                                    self.dot(n, |i| dout[(r, i)] * rhs[(e, kk, i)])
                                } else {
                                    0.0
                                };
                                dlhs[(r, kk)] = round(v);
                            }
                        }
                    }
                }
                if tail_zero {
                    dlhs.slice_mut(ndarray::s![used.., ..]).fill(0.0);
                }
                result.dlhs = Some(dlhs);
            }
            if passes.wgrad {
                let mut drhs = Array3::<f64>::from_elem((g_count, k, n), f64::NAN);
                let klim = self.k_limit(k);
                for g in 0..g_count {
                    let (lo, hi) = (off[g], off[g + 1]);
                    if lo == hi {
                        if !self.has(Bug::EmptyExpertWgradNotZeroed) {
                            for kk in 0..k {
                                for c in 0..n {
                                    drhs[(g, kk, c)] = 0.0;
                                }
                            }
                        }
                        continue;
                    }
                    // Rows of the group that this kernel reads: its M tiles, plus the tail
                    // for the last expert under `WgradReadsTail`.
                    let mut rows: Vec<usize> = self
                        .m_tiles(lo, hi)
                        .into_iter()
                        .flat_map(|(a, b)| a..b)
                        .collect();
                    if self.has(Bug::WgradReadsTail) && g + 1 == g_count {
                        rows.extend(used..m);
                    }
                    for kk in 0..klim {
                        for c in 0..n {
                            let v =
                                self.dot(rows.len(), |i| lhs[(rows[i], kk)] * dout[(rows[i], c)]);
                            drhs[(g, kk, c)] = round(v);
                        }
                    }
                }
                if self.has(Bug::WgradReadsTail) && g_count > 0 && off[g_count - 1] == used {
                    // The last expert is empty: the tail is still summed into it.
                    let g = g_count - 1;
                    let rows: Vec<usize> = (used..m).collect();
                    if !rows.is_empty() {
                        for kk in 0..k {
                            for c in 0..n {
                                let v = self
                                    .dot(rows.len(), |i| lhs[(rows[i], kk)] * dout[(rows[i], c)]);
                                drhs[(g, kk, c)] = round(v);
                            }
                        }
                    }
                }
                result.drhs = Some(drhs);
            }
        }
        Ok(result)
    }
}
