//! The f64 reference grouped GEMM.
//!
//! Each group is one dense f64 GEMM through ndarray's `general_mat_mul` (matrixmultiply's
//! dgemm: f64 products and f64 accumulation, FMA where the CPU has it). Its own error is at
//! most `γ(n, 2^-53)·Σ|a·b|`, which [`super::bound::ErrorBound`] adds to every element's
//! bound, so the reference is "exact" only up to a term some 2^29 times smaller than an f32
//! accumulator's.

use ndarray::{s, Array2, Array3, ArrayView2, ArrayView3, Axis};

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
    for g in 0..rhs.shape()[0] {
        let (lo, hi) = (offsets[g], offsets[g + 1]);
        if lo == hi {
            continue;
        }
        let mut dst = out.slice_mut(s![lo..hi, ..]);
        ndarray::linalg::general_mat_mul(
            1.0,
            &lhs.slice(s![lo..hi, ..]),
            &rhs.index_axis(Axis(0), g),
            0.0,
            &mut dst,
        );
    }
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
    for g in 0..rhs.shape()[0] {
        let (lo, hi) = (offsets[g], offsets[g + 1]);
        if lo == hi {
            continue;
        }
        let mut dst = dlhs.slice_mut(s![lo..hi, ..]);
        ndarray::linalg::general_mat_mul(
            1.0,
            &dout.slice(s![lo..hi, ..]),
            &rhs.index_axis(Axis(0), g).t(),
            0.0,
            &mut dst,
        );
    }
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
    for g in 0..g_count {
        let (lo, hi) = (offsets[g], offsets[g + 1]);
        if lo == hi {
            continue;
        }
        let mut dst = drhs.index_axis_mut(Axis(0), g);
        ndarray::linalg::general_mat_mul(
            1.0,
            &lhs.slice(s![lo..hi, ..]).t(),
            &dout.slice(s![lo..hi, ..]),
            0.0,
            &mut dst,
        );
    }
    drhs
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
