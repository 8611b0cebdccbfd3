//! Host-side launch planning for the grouped GEMM: pure Rust, no CUDA, tested on any machine.
//!
//! * [`plan_tiles`]: the tile schedule of our kernels (kernels/grouped_gemm.cu, fp8.cu): a list
//!   of `{group, row0, rows}` entries and the number of column tiles. Every output element is
//!   covered by exactly one tile; tail rows get `group = -1` tiles (the kernel writes zeros);
//!   an empty expert's wgrad tiles have a zero-length reduction (the kernel writes zeros).
//! * [`plan_blas`]: the cuBLAS calls (column-major, see below) plus the zero fills that
//!   cuBLAS is never asked to do (tails, `K = 0`, empty experts).
//! * [`grouped_arrays`]: the per-problem arrays of `cublasGemmGroupedBatchedEx`.
//!
//! A plan with nothing to do is empty: no zero-size launch or call is ever issued.

use moecheck_reference::gemm::case::offsets;
use moecheck_reference::gemm::Pass;

/// Rows (of the output) per tile; must equal `GG_BM` in kernels/gemm_tile.cuh.
pub const TILE_M: usize = 64;
/// Columns per tile; must equal `GG_BN`.
pub const TILE_N: usize = 64;
/// Threads per block of the tiled (SIMT) kernels (`GG_TILED_THREADS`).
pub const TILED_THREADS: u32 = 256;
/// Threads per block of the mma kernels (`GG_MMA_THREADS`).
pub const MMA_THREADS: u32 = 128;
/// Largest `gridDim.y`.
pub const MAX_GRID_Y: usize = 65_535;
/// Largest `gridDim.x`.
pub const MAX_GRID_X: usize = i32::MAX as usize;

/// Why a shape cannot be launched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("{what} = {value} does not fit the kernels' 32-bit {limit}")]
    TooLarge {
        what: &'static str,
        value: usize,
        limit: &'static str,
    },
    #[error("group sizes sum to {sum}, more than the {m} rows")]
    GroupsExceedRows { sum: usize, m: usize },
}

/// The launch of one pass of our grouped GEMM kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TilePlan {
    /// `{group, row0, rows}` per tile (group -1: tail rows, written as zeros). For fwd/dgrad
    /// rows are output rows; for wgrad they are K indices of `drhs[group]`.
    pub tiles: Vec<[i32; 3]>,
    /// Output columns (N for fwd/wgrad, K for dgrad).
    pub cols: usize,
}

impl TilePlan {
    /// `(grid_x, grid_y)`: tiles by column tiles; `None` when there is nothing to launch.
    pub fn grid(&self) -> Option<(u32, u32)> {
        if self.tiles.is_empty() || self.cols == 0 {
            return None;
        }
        Some((self.tiles.len() as u32, self.cols.div_ceil(TILE_N) as u32))
    }
    /// The tiles flattened for upload (`num_tiles * 3` int32).
    pub fn flat(&self) -> Vec<i32> {
        self.tiles.iter().flatten().copied().collect()
    }
}

fn fit_i32(what: &'static str, value: usize) -> Result<i32, PlanError> {
    i32::try_from(value).map_err(|_| PlanError::TooLarge {
        what,
        value,
        limit: "int",
    })
}

/// Chunks `[lo, hi)` into tiles of at most [`TILE_M`] rows for `group`.
fn push_chunks(tiles: &mut Vec<[i32; 3]>, group: i32, lo: usize, hi: usize) {
    let mut r = lo;
    while r < hi {
        let e = (r + TILE_M).min(hi);
        // Values were checked to fit i32 by the caller (hi <= M or K).
        tiles.push([group, r as i32, (e - r) as i32]);
        r = e;
    }
}

/// The tile schedule of `pass` for `lhs (m, k)`, `rhs (G, k, n)`, `group_sizes`.
pub fn plan_tiles(
    pass: Pass,
    group_sizes: &[usize],
    m: usize,
    k: usize,
    n: usize,
) -> Result<TilePlan, PlanError> {
    let used: usize = group_sizes.iter().sum();
    if used > m {
        return Err(PlanError::GroupsExceedRows { sum: used, m });
    }
    fit_i32("M", m)?;
    fit_i32("K", k)?;
    fit_i32("N", n)?;
    fit_i32("G", group_sizes.len())?;
    let off = offsets(group_sizes);
    let mut tiles = Vec::new();
    let cols = match pass {
        Pass::Fwd | Pass::Dgrad => {
            for (g, w) in off.windows(2).enumerate() {
                push_chunks(&mut tiles, g as i32, w[0], w[1]);
            }
            push_chunks(&mut tiles, -1, used, m);
            if pass == Pass::Fwd {
                n
            } else {
                k
            }
        }
        Pass::Wgrad => {
            for g in 0..group_sizes.len() {
                push_chunks(&mut tiles, g as i32, 0, k);
            }
            n
        }
    };
    if tiles.len() > MAX_GRID_X {
        return Err(PlanError::TooLarge {
            what: "tiles",
            value: tiles.len(),
            limit: "gridDim.x",
        });
    }
    if cols.div_ceil(TILE_N) > MAX_GRID_Y {
        return Err(PlanError::TooLarge {
            what: "column tiles",
            value: cols.div_ceil(TILE_N),
            limit: "gridDim.y",
        });
    }
    Ok(TilePlan { tiles, cols })
}

/// A 1-D grid-stride launch over `n` elements: `(blocks, threads)`, `None` for `n = 0`.
pub fn grid_1d(n: usize, threads: u32, max_blocks: u32) -> Option<(u32, u32)> {
    if n == 0 {
        return None;
    }
    let blocks = n.div_ceil(threads as usize).min(max_blocks as usize).max(1);
    Some((blocks as u32, threads))
}

/// An input operand of a cuBLAS call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Lhs,
    Rhs,
    Dout,
}

/// The output a cuBLAS call or zero fill writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Out,
    Dlhs,
    Drhs,
}

/// One column-major GEMM `C = op(A) · op(B)` (alpha 1, beta 0) with `C` `m × n`, reduction
/// `k`; offsets are in elements from the start of each array.
///
/// Row-major `X (r, c)` is column-major `Xᵀ (c, r)` with leading dimension `c`, so
/// * fwd   `out_g = lhs_g · rhs_g`   is `out_gᵀ (N×s) = rhs_gᵀ (N×K) · lhs_gᵀ (K×s)`: N, N.
/// * dgrad `dlhs_g = dout_g · rhs_gᵀ` is `dlhs_gᵀ (K×s) = rhs_g (K×N) · dout_gᵀ (N×s)`: T, N.
/// * wgrad `drhs_g = lhs_gᵀ · dout_g` is `drhs_gᵀ (N×K) = dout_gᵀ (N×s) · lhs_g (s×K)`: N, T.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlasCall {
    pub group: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub a: (Input, usize),
    pub lda: i32,
    pub b: (Input, usize),
    pub ldb: i32,
    pub c: (Output, usize),
    pub ldc: i32,
}

/// Elements `[offset, offset + len)` of `output` set to exactly zero (a memset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroFill {
    pub output: Output,
    pub offset: usize,
    pub len: usize,
}

/// The cuBLAS calls and zero fills of one pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlasPlan {
    pub calls: Vec<BlasCall>,
    pub zeros: Vec<ZeroFill>,
}

/// Plans one pass as per-expert cuBLAS calls. Experts whose output block is empty get
/// nothing; experts whose reduction is empty (K = 0 fwd, N = 0 dgrad, an empty expert's
/// wgrad) and the tail rows get zero fills. Every output element is written exactly once.
pub fn plan_blas(
    pass: Pass,
    group_sizes: &[usize],
    m: usize,
    k: usize,
    n: usize,
) -> Result<BlasPlan, PlanError> {
    let used: usize = group_sizes.iter().sum();
    if used > m {
        return Err(PlanError::GroupsExceedRows { sum: used, m });
    }
    let (mi, ki, ni) = (fit_i32("M", m)?, fit_i32("K", k)?, fit_i32("N", n)?);
    let _ = mi;
    let off = offsets(group_sizes);
    let mut plan = BlasPlan::default();
    let zero = |plan: &mut BlasPlan, output, offset, len| {
        if len > 0 {
            plan.zeros.push(ZeroFill {
                output,
                offset,
                len,
            });
        }
    };
    for (g, &s) in group_sizes.iter().enumerate() {
        let si = s as i32; // s <= m fits i32
        let o = off[g];
        match pass {
            Pass::Fwd => {
                if s == 0 || n == 0 {
                    continue;
                }
                if k == 0 {
                    zero(&mut plan, Output::Out, o * n, s * n);
                    continue;
                }
                plan.calls.push(BlasCall {
                    group: g,
                    trans_a: false,
                    trans_b: false,
                    m: ni,
                    n: si,
                    k: ki,
                    a: (Input::Rhs, g * k * n),
                    lda: ni,
                    b: (Input::Lhs, o * k),
                    ldb: ki,
                    c: (Output::Out, o * n),
                    ldc: ni,
                });
            }
            Pass::Dgrad => {
                if s == 0 || k == 0 {
                    continue;
                }
                if n == 0 {
                    zero(&mut plan, Output::Dlhs, o * k, s * k);
                    continue;
                }
                plan.calls.push(BlasCall {
                    group: g,
                    trans_a: true,
                    trans_b: false,
                    m: ki,
                    n: si,
                    k: ni,
                    a: (Input::Rhs, g * k * n),
                    lda: ni,
                    b: (Input::Dout, o * n),
                    ldb: ni,
                    c: (Output::Dlhs, o * k),
                    ldc: ki,
                });
            }
            Pass::Wgrad => {
                if k == 0 || n == 0 {
                    continue;
                }
                if s == 0 {
                    zero(&mut plan, Output::Drhs, g * k * n, k * n);
                    continue;
                }
                plan.calls.push(BlasCall {
                    group: g,
                    trans_a: false,
                    trans_b: true,
                    m: ni,
                    n: ki,
                    k: si,
                    a: (Input::Dout, o * n),
                    lda: ni,
                    b: (Input::Lhs, o * k),
                    ldb: ki,
                    c: (Output::Drhs, g * k * n),
                    ldc: ni,
                });
            }
        }
    }
    match pass {
        Pass::Fwd => zero(&mut plan, Output::Out, used * n, (m - used) * n),
        Pass::Dgrad => zero(&mut plan, Output::Dlhs, used * k, (m - used) * k),
        Pass::Wgrad => {}
    }
    Ok(plan)
}

/// The arrays `cublasGemmGroupedBatchedEx` takes, one cuBLAS "group" of one problem per call
/// (the problems differ in `n`). Pointers are device addresses: `base` of each array plus
/// `offset · elem_bytes`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupedArrays {
    pub trans_a: Vec<bool>,
    pub trans_b: Vec<bool>,
    pub m: Vec<i32>,
    pub n: Vec<i32>,
    pub k: Vec<i32>,
    pub lda: Vec<i32>,
    pub ldb: Vec<i32>,
    pub ldc: Vec<i32>,
    pub a_ptrs: Vec<u64>,
    pub b_ptrs: Vec<u64>,
    pub c_ptrs: Vec<u64>,
    /// All ones: each cuBLAS group holds one problem.
    pub group_size: Vec<i32>,
}

/// Builds [`GroupedArrays`] from the calls of a plan; `input_base` / `output_base` give each
/// array's device address, `in_bytes` / `out_bytes` the element sizes.
pub fn grouped_arrays(
    calls: &[BlasCall],
    input_base: impl Fn(Input) -> u64,
    in_bytes: u64,
    output_base: impl Fn(Output) -> u64,
    out_bytes: u64,
) -> GroupedArrays {
    let mut g = GroupedArrays::default();
    for c in calls {
        g.trans_a.push(c.trans_a);
        g.trans_b.push(c.trans_b);
        g.m.push(c.m);
        g.n.push(c.n);
        g.k.push(c.k);
        g.lda.push(c.lda);
        g.ldb.push(c.ldb);
        g.ldc.push(c.ldc);
        g.a_ptrs.push(input_base(c.a.0) + c.a.1 as u64 * in_bytes);
        g.b_ptrs.push(input_base(c.b.0) + c.b.1 as u64 * in_bytes);
        g.c_ptrs.push(output_base(c.c.0) + c.c.1 as u64 * out_bytes);
        g.group_size.push(1);
    }
    g
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
