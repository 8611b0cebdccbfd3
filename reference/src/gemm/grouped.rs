//! The f64 reference grouped GEMM.
//!
//! Each group is one dense f64 GEMM through [`crate::engine::gemm`] (f64 products and f64
//! accumulation, FMA where the CPU has it); where an operand's rows are not contiguous
//! (dgrad's `rhs_gᵀ`) the kernel copies it into rows a band tile at a time. Either way an element's error is
//! at most `γ(n, 2^-53)·Σ|a·b|` for any
//! summation order, which [`super::bound::ErrorBound`] adds to every element's bound, so the
//! reference is "exact" only up to a term some 2^29 times smaller than an f32 accumulator's.
//!
//! Work is split into jobs of at most [`CHUNK`] output rows (whole groups for dgrad) and run on
//! all cores; `run_jobs` describes the schedule. Jobs write disjoint outputs and an element's
//! summation order does not depend on the split, so results do not depend on the schedule.

use ndarray::{s, Array2, Array3, ArrayView2, ArrayView3, ArrayViewMut2, Axis};

use super::case::{GroupedGemmCase, Passes, WideOutputs};
use super::weights::{bf16_to_f32, Weights};
use crate::engine::gemm;
use crate::Error;

/// Most output rows in one job: large groups are split so both cores stay busy to the end.
pub const CHUNK: usize = 256;

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
    let mut out = Array2::<f64>::zeros((lhs.nrows(), rhs.shape()[2]));
    fwd_groups(lhs, rhs, offsets, out.view_mut());
    out
}

/// [`grouped_fwd`] into a caller's `out (M, N)`: every element is overwritten (tail rows with
/// 0) and none is read.
///
/// # Panics
/// As [`grouped_fwd`], and if `out` is not `(M, N)`.
pub fn grouped_fwd_into(
    lhs: ArrayView2<f64>,
    rhs: ArrayView3<f64>,
    offsets: &[usize],
    mut out: ArrayViewMut2<f64>,
) {
    assert_eq!(
        out.dim(),
        (lhs.nrows(), rhs.shape()[2]),
        "grouped_fwd_into: out"
    );
    let used = *offsets.last().unwrap_or(&0);
    out.slice_mut(s![used.., ..]).fill(0.0);
    fwd_groups(lhs, rhs, offsets, out);
}

fn fwd_groups(
    lhs: ArrayView2<f64>,
    rhs: ArrayView3<f64>,
    offsets: &[usize],
    out: ArrayViewMut2<f64>,
) {
    run_jobs(row_jobs(out, offsets, CHUNK, lhs.ncols()), |job| {
        let a = lhs.slice(s![job.start..job.start + job.dst.nrows(), ..]);
        gemm(a, rhs.index_axis(Axis(0), job.g), job.dst);
    });
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
    let mut dlhs = Array2::<f64>::zeros((dout.nrows(), rhs.shape()[1]));
    // One job per group: `rhs_gᵀ` has no contiguous rows, so the kernel copies the whole
    // weight into rows once per call; splitting a group would copy it once per chunk. (A
    // single group therefore runs on one core.)
    run_jobs(
        row_jobs(dlhs.view_mut(), offsets, usize::MAX, dout.ncols()),
        |job| {
            let a = dout.slice(s![job.start..job.start + job.dst.nrows(), ..]);
            gemm(a, rhs.index_axis(Axis(0), job.g).t(), job.dst);
        },
    );
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
    let mut drhs = Array3::<f64>::zeros((g_count, lhs.ncols(), dout.ncols()));
    let mut jobs = Vec::new();
    for (g, mut dst) in drhs.outer_iter_mut().enumerate() {
        let size = offsets[g + 1] - offsets[g];
        let mut start = 0;
        while size > 0 && dst.nrows() > 0 {
            let rows = CHUNK.min(dst.nrows());
            let (head, rest) = dst.split_at(Axis(0), rows);
            let cost = size * head.nrows() * head.ncols();
            jobs.push(Job {
                g,
                start,
                cost,
                dst: head,
            });
            start += CHUNK;
            dst = rest;
        }
    }
    run_jobs(jobs, |job| {
        let (lo, hi) = (offsets[job.g], offsets[job.g + 1]);
        let a = lhs.slice(s![lo..hi, job.start..job.start + job.dst.nrows()]);
        gemm(a.t(), dout.slice(s![lo..hi, ..]), job.dst);
    });
    drhs
}

/// One unit of work: `dst` is part of group `g`'s output starting at row `start` (of the
/// whole output for fwd/dgrad, of `drhs[g]` for wgrad); `cost` orders the jobs.
struct Job<'a> {
    g: usize,
    start: usize,
    cost: usize,
    dst: ArrayViewMut2<'a, f64>,
}

/// Splits `dst` into the row blocks of the non-empty groups, at most `chunk` rows each.
/// A job's cost is its multiply-adds (`rows · columns · depth`), which also decides whether the
/// work is large enough to spread over threads ([`crate::par::SERIAL_BELOW`]).
fn row_jobs<'a>(
    mut dst: ArrayViewMut2<'a, f64>,
    offsets: &[usize],
    chunk: usize,
    depth: usize,
) -> Vec<Job<'a>> {
    let mut jobs = Vec::new();
    for g in 0..offsets.len() - 1 {
        let mut start = offsets[g];
        while start < offsets[g + 1] {
            let rows = chunk.min(offsets[g + 1] - start);
            let (head, rest) = dst.split_at(Axis(0), rows);
            jobs.push(Job {
                g,
                start,
                cost: rows * head.ncols() * depth,
                dst: head,
            });
            dst = rest;
            start += rows;
        }
        // `dst` now starts at offsets[g + 1].
    }
    jobs
}

/// Runs `f(job)` for every job on all available cores, largest first
/// ([`crate::par::map_by_cost`]).
fn run_jobs<'a, F>(jobs: Vec<Job<'a>>, f: F)
where
    F: Fn(Job<'a>) + Sync,
{
    crate::par::map_by_cost(jobs, |job| job.cost, f);
}

/// The reference values of a case and, beside them, the magnitudes `Σ|a·b|` that the error
/// bound scales with (the same grouped GEMM applied to `|a|` and `|b|`).
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceResult {
    pub value: WideOutputs,
    pub magnitude: WideOutputs,
}

/// Computes the asked passes of `case` in f64, with their magnitudes.
///
/// Validates the case first ([`GroupedGemmCase::validate`]).
pub fn reference(case: &GroupedGemmCase, passes: Passes) -> Result<ReferenceResult, Error> {
    case.validate(passes)?;
    let off = case.offsets();
    let lhs = case.lhs.mapv(f64::from);
    let rhs = match &case.rhs {
        Weights::F32(w) => w.mapv(f64::from),
        Weights::Bf16(w) => w.mapv(|v| f64::from(bf16_to_f32(v))),
    };
    let dout = case.dout.as_ref().map(|d| d.mapv(f64::from));
    let run = |lhs: &Array2<f64>, rhs: &Array3<f64>, dout: Option<&Array2<f64>>| WideOutputs {
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
    /// Triple loops for all three passes, group by group.
    fn naive(
        lhs: &Array2<f64>,
        rhs: &Array3<f64>,
        dout: &Array2<f64>,
        off: &[usize],
    ) -> (Array2<f64>, Array2<f64>, Array3<f64>) {
        let (m, k) = lhs.dim();
        let (g, n) = (rhs.shape()[0], rhs.shape()[2]);
        let group_of = |r: usize| (0..g).find(|e| off[*e] <= r && r < off[*e + 1]);
        let out = Array2::from_shape_fn((m, n), |(r, c)| {
            group_of(r).map_or(0.0, |e| (0..k).map(|i| lhs[(r, i)] * rhs[(e, i, c)]).sum())
        });
        let dlhs = Array2::from_shape_fn((m, k), |(r, c)| {
            group_of(r).map_or(0.0, |e| (0..n).map(|j| dout[(r, j)] * rhs[(e, c, j)]).sum())
        });
        let drhs = Array3::from_shape_fn((g, k, n), |(e, i, j)| {
            (off[e]..off[e + 1])
                .map(|r| lhs[(r, i)] * dout[(r, j)])
                .sum()
        });
        (out, dlhs, drhs)
    }

    /// Groups larger than a job ([`CHUNK`] rows) and K deeper than one kernel band
    /// ([`crate::engine::KC`]), empty groups between them, a tail, and K = 0 / M = 0:
    /// still bit for bit equal to triple loops with small integers.
    #[test]
    fn chunked_groups_and_edges_match_naive_loops_exactly() {
        let shapes: [(&[usize], usize, usize, usize); 5] = [
            (&[0, 300, 1, 0, 9, 600, 0, 129], 1045, 300, 27),
            (&[257], 257, 9, 8),
            (&[0, 0, 3], 7, 0, 5),
            (&[0, 0], 0, 4, 3),
            (&[2, 0, 1], 4, 5, 0),
        ];
        for (sizes, m, k, n) in shapes {
            let off = super::super::case::offsets(sizes);
            let g = sizes.len();
            let lhs = Array2::from_shape_fn((m, k), |(i, j)| ((i * 5 + j * 3) % 7) as f64 - 3.0);
            let rhs = Array3::from_shape_fn((g, k, n), |(e, i, j)| {
                ((e * 3 + i + j * 2) % 5) as f64 - 2.0
            });
            let dout = Array2::from_shape_fn((m, n), |(i, j)| ((i + 2 * j) % 9) as f64 - 4.0);
            let (out, dlhs, drhs) = naive(&lhs, &rhs, &dout, &off);
            let what = format!("sizes {sizes:?} m={m} k={k} n={n}");
            assert_eq!(grouped_fwd(lhs.view(), rhs.view(), &off), out, "fwd {what}");
            assert_eq!(
                grouped_dgrad(dout.view(), rhs.view(), &off),
                dlhs,
                "dgrad {what}"
            );
            assert_eq!(
                grouped_wgrad(lhs.view(), dout.view(), &off),
                drhs,
                "wgrad {what}"
            );
            // The _into form overwrites everything, the tail with 0, and reads nothing.
            let mut poisoned = Array2::from_elem((m, n), f64::NAN);
            grouped_fwd_into(lhs.view(), rhs.view(), &off, poisoned.view_mut());
            assert_eq!(poisoned, out, "fwd_into {what}");
        }
    }
}
