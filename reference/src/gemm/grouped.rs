//! The f64 reference grouped GEMM.
//!
//! Each group is one dense f64 GEMM through ndarray's `general_mat_mul` (matrixmultiply's
//! dgemm: f64 products and f64 accumulation, FMA where the CPU has it). Its own error is at
//! most `γ(n, 2^-53)·Σ|a·b|`, which [`super::bound::ErrorBound`] adds to every element's
//! bound, so the reference is "exact" only up to a term some 2^29 times smaller than an f32
//! accumulator's.

use ndarray::{s, Array2, Array3, ArrayView2, ArrayView3, ArrayViewMut2, Axis};

use super::case::{GemmOutputs, GroupedGemmCase, Passes};
use crate::Error;

/// Forward: `out[r, :] = lhs[r, :] · rhs[g]` for `r` in group `g`; tail rows are 0.
///
/// Reads `lhs (M, K)`, `rhs (G, K, N)`, `offsets (G+1)` (prefix sums of the group sizes,
/// `offsets[G] <= M`). Returns a new `(M, N)` array; nothing is overwritten.
///
/// # Panics
/// If the shapes disagree or `offsets` is not non-decreasing within `[0, M]`.
///
/// ```
/// use ndarray::{array, Array3};
/// use moecheck_reference::gemm::grouped_fwd;
/// let lhs = array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]];
/// let rhs = Array3::from_shape_vec((2, 2, 1), vec![1.0, 1.0, 10.0, 0.0]).unwrap();
/// // group 0 = row 0, group 1 = row 1, row 2 is a dropped token.
/// let out = grouped_fwd(lhs.view(), rhs.view(), &[0, 1, 2]);
/// assert_eq!(out, array![[3.0], [30.0], [0.0]]);
/// ```
pub fn grouped_fwd(lhs: ArrayView2<f64>, rhs: ArrayView3<f64>, offsets: &[usize]) -> Array2<f64> {
    let (m, _k) = lhs.dim();
    let n = rhs.shape()[2];
    let mut out = Array2::<f64>::zeros((m, n));
    for_each_group(row_blocks(out.view_mut(), offsets), |g, mut dst| {
        let (lo, hi) = (offsets[g], offsets[g + 1]);
        let a = lhs.slice(s![lo..hi, ..]);
        ndarray::linalg::general_mat_mul(1.0, &a, &rhs.index_axis(Axis(0), g), 0.0, &mut dst);
    });
    out
}

/// Dgrad: `dlhs[r, :] = dout[r, :] · rhs[g]ᵀ` for `r` in group `g`; tail rows are 0.
///
/// Reads `dout (M, N)`, `rhs (G, K, N)`, `offsets`. Returns a new `(M, K)` array.
///
/// # Panics
/// As [`grouped_fwd`].
pub fn grouped_dgrad(
    dout: ArrayView2<f64>,
    rhs: ArrayView3<f64>,
    offsets: &[usize],
) -> Array2<f64> {
    let m = dout.nrows();
    let k = rhs.shape()[1];
    let mut dlhs = Array2::<f64>::zeros((m, k));
    for_each_group(row_blocks(dlhs.view_mut(), offsets), |g, mut dst| {
        let (lo, hi) = (offsets[g], offsets[g + 1]);
        let b = rhs.index_axis(Axis(0), g);
        ndarray::linalg::general_mat_mul(1.0, &dout.slice(s![lo..hi, ..]), &b.t(), 0.0, &mut dst);
    });
    dlhs
}

/// Wgrad: `drhs[g] = lhs[rows of g]ᵀ · dout[rows of g]`; an empty expert's `drhs` is 0 and tail
/// rows of `dout` are never read.
///
/// Reads `lhs (M, K)`, `dout (M, N)`, `offsets (G+1)`. Returns a new `(G, K, N)` array.
///
/// # Panics
/// As [`grouped_fwd`].
pub fn grouped_wgrad(
    lhs: ArrayView2<f64>,
    dout: ArrayView2<f64>,
    offsets: &[usize],
) -> Array3<f64> {
    let g_count = offsets.len() - 1;
    let k = lhs.ncols();
    let n = dout.ncols();
    let mut drhs = Array3::<f64>::zeros((g_count, k, n));
    let blocks = drhs
        .outer_iter_mut()
        .enumerate()
        .filter(|(g, _)| offsets[*g + 1] > offsets[*g])
        .map(|(g, v)| (g, offsets[g + 1] - offsets[g], v))
        .collect();
    for_each_group(blocks, |g, mut dst| {
        let (lo, hi) = (offsets[g], offsets[g + 1]);
        let a = lhs.slice(s![lo..hi, ..]);
        ndarray::linalg::general_mat_mul(1.0, &a.t(), &dout.slice(s![lo..hi, ..]), 0.0, &mut dst);
    });
    drhs
}

/// Splits `dst` into the row blocks of the non-empty groups: `(g, size_g, rows of g)`.
fn row_blocks<'a>(
    mut dst: ArrayViewMut2<'a, f64>,
    offsets: &[usize],
) -> Vec<(usize, usize, ArrayViewMut2<'a, f64>)> {
    let mut blocks = Vec::new();
    for g in 0..offsets.len() - 1 {
        let size = offsets[g + 1] - offsets[g];
        let (head, rest) = dst.split_at(Axis(0), size);
        if size > 0 {
            blocks.push((g, size, head));
        }
        dst = rest;
    }
    blocks
}

/// Runs `f(g, dst_g)` for every block, on all available cores, largest groups first. The
/// blocks are disjoint, so the result does not depend on the schedule; each block is one
/// dense GEMM, so neither does its rounding.
fn for_each_group<'a, F>(mut blocks: Vec<(usize, usize, ArrayViewMut2<'a, f64>)>, f: F)
where
    F: Fn(usize, ArrayViewMut2<'a, f64>) + Sync,
{
    // Ascending by size, so popping from the end hands out the largest first.
    blocks.sort_by_key(|(g, size, _)| (*size, std::cmp::Reverse(*g)));
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(blocks.len());
    if threads <= 1 {
        blocks.into_iter().rev().for_each(|(g, _, v)| f(g, v));
        return;
    }
    let queue = std::sync::Mutex::new(blocks);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
                match next {
                    Some((g, _, v)) => f(g, v),
                    None => break,
                }
            });
        }
    });
}

/// The reference values of a case and, beside them, the magnitudes `Σ|a·b|` that the error
/// bound scales with (the same grouped GEMM applied to `|a|` and `|b|`).
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceResult {
    pub value: GemmOutputs,
    pub magnitude: GemmOutputs,
}

/// Computes the asked passes of `case` in f64, with their magnitudes.
///
/// Validates the case first ([`GroupedGemmCase::validate`]).
pub fn reference(case: &GroupedGemmCase, passes: Passes) -> Result<ReferenceResult, Error> {
    case.validate(passes)?;
    let off = case.offsets();
    let lhs = case.lhs.mapv(f64::from);
    let rhs = case.rhs.mapv(f64::from);
    let dout = case.dout.as_ref().map(|d| d.mapv(f64::from));
    let run = |lhs: &Array2<f64>, rhs: &Array3<f64>, dout: Option<&Array2<f64>>| GemmOutputs {
        out: passes
            .fwd
            .then(|| grouped_fwd(lhs.view(), rhs.view(), &off)),
        dlhs: match (passes.dgrad, dout) {
            (true, Some(d)) => Some(grouped_dgrad(d.view(), rhs.view(), &off)),
            _ => None,
        },
        drhs: match (passes.wgrad, dout) {
            (true, Some(d)) => Some(grouped_wgrad(lhs.view(), d.view(), &off)),
            _ => None,
        },
    };
    let value = run(&lhs, &rhs, dout.as_ref());
    let abs_dout = dout.as_ref().map(|d| d.mapv(f64::abs));
    let magnitude = run(&lhs.mapv(f64::abs), &rhs.mapv(f64::abs), abs_dout.as_ref());
    Ok(ReferenceResult { value, magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Triple loops with small-integer values: every product and sum is exact in f64, so the
    /// GEMM-based reference must agree bit for bit.
    #[test]
    fn matches_naive_loops_exactly() {
        let sizes = [0usize, 3, 0, 0, 5, 1, 0];
        let off = super::super::case::offsets(&sizes);
        let (m, k, n, g) = (11, 7, 4, sizes.len());
        let lhs = Array2::from_shape_fn((m, k), |(i, j)| ((i * 5 + j * 3) % 7) as f64 - 3.0);
        let rhs = Array3::from_shape_fn((g, k, n), |(e, i, j)| {
            ((e * 3 + i + j * 2) % 5) as f64 - 2.0
        });
        let dout = Array2::from_shape_fn((m, n), |(i, j)| ((i + 2 * j) % 9) as f64 - 4.0);
        let group_of = |r: usize| (0..g).find(|e| off[*e] <= r && r < off[*e + 1]);
        let out = grouped_fwd(lhs.view(), rhs.view(), &off);
        let dlhs = grouped_dgrad(dout.view(), rhs.view(), &off);
        let drhs = grouped_wgrad(lhs.view(), dout.view(), &off);
        for r in 0..m {
            for c in 0..n {
                let want =
                    group_of(r).map_or(0.0, |e| (0..k).map(|i| lhs[(r, i)] * rhs[(e, i, c)]).sum());
                assert_eq!(out[(r, c)], want, "out[{r},{c}]");
            }
            for c in 0..k {
                let want = group_of(r)
                    .map_or(0.0, |e| (0..n).map(|j| dout[(r, j)] * rhs[(e, c, j)]).sum());
                assert_eq!(dlhs[(r, c)], want, "dlhs[{r},{c}]");
            }
        }
        for e in 0..g {
            for i in 0..k {
                for j in 0..n {
                    let want: f64 = (off[e]..off[e + 1])
                        .map(|r| lhs[(r, i)] * dout[(r, j)])
                        .sum();
                    assert_eq!(drhs[(e, i, j)], want, "drhs[{e},{i},{j}]");
                }
            }
        }
        // The tail (rows 9 and 10) is zero, and its dout never reaches drhs.
        assert!(out.slice(s![9.., ..]).iter().all(|v| *v == 0.0));
        let mut dout2 = dout.clone();
        dout2.slice_mut(s![9.., ..]).fill(1e6);
        assert_eq!(grouped_wgrad(lhs.view(), dout2.view(), &off), drhs);
    }
}
