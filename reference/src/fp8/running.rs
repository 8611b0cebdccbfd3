//! The per-element bound of a fast FP8 accumulator in running form: the magnitudes of the
//! partial sums it holds, computed from the recipe-exact operands.
//!
//! ## Why
//! A fast accumulator's error is a rounding of every partial sum it holds, so it scales with
//! `R = Σ_j |S_j|` (the exact partial sums after each k-block, see [`super::accum`]), not with
//! the worst case `J·Σ|a·b|`. For products of random signs the partial sums wander like a
//! random walk: at K = 7168 (224 k-blocks of 32) `R` is about 150 times `Σ|a·b|/√K`, and the
//! running-form bound is about 2% of a typical output where the worst-case bound is about
//! twice the output itself (it would pass an all-zero answer). The bound is still a bound:
//! it holds for every input, under the model's assumptions (k-blocks of
//! [`super::accum::FAST_K_BLOCK`] products in increasing k, added into one accumulator per
//! element that keeps [`super::accum::FAST_BITS`] bits; under promotion each chunk of
//! [`super::accum::PROMOTE_INTERVAL`] starts from 0). Exact f32 accumulation is far inside it
//! (its error is about `2^-19·R` against the bound's `2^-13·R`); an accumulator that rounds
//! after every product to 14 bits is not covered.
//!
//! ## The effective magnitude
//! The comparison judges `|ŷ - y_ref| <= M + c_y·|y_ref| + floors` ([`super::Fp8Bound::on_effective`]),
//! with `M = k_s·S + k_r·R̂` per element ([`super::Fp8Bound::effective`]): the reference
//! carries `M` where it carries `S = Σ|x̂a·x̂b|` under exact accumulation, so every full-mode
//! path (whole, sharded, `check`) judges with it. `S = 0` gives `M = 0` (an exact zero is
//! demanded, as before).
//!
//! `R̂` is computed in f64: the partial sums of the dequantised operands (every product rounded
//! once, relative `2^-53`), one k-block at a time, then `Σ|Ŝ_j|`. With `J` the number of
//! partial sums, `|Ŝ_j - S_j| <= γ(n + 1, 2^-53)·S` and the sum of `J` non-negative terms is
//! within `γ(J, 2^-53)`, so `R <= (1 + γ(J, 2^-53))·R̂ + J·γ(n + 1, 2^-53)·S`: those two terms
//! are in `k_r` and `k_s`.

use ndarray::{s, Array2, Array3, ArrayView2, ArrayView3};

use super::accum::{AccumModel, AccumVariant};
use crate::gemm::{Passes, WideOutputs};

/// Rows of an output computed by one job.
const ROWS: usize = 64;

/// `R` of every element of `a·b` (`a` is `rows × n`, `b` is `n × cols`): the sum over the
/// accumulator's additions of the magnitude of the exact partial sum it then holds, k-blocks
/// of `block` products, partial sums restarting from 0 every `chunk` products.
pub fn partial_sum_magnitudes(
    a: ArrayView2<f64>,
    b: ArrayView2<f64>,
    block: usize,
    chunk: usize,
) -> Array2<f64> {
    let (rows, n) = a.dim();
    let cols = b.ncols();
    let block = block.max(1);
    let chunk = chunk.max(1);
    let mut prefix = Array2::<f64>::zeros((rows, cols));
    let mut r = Array2::<f64>::zeros((rows, cols));
    let mut t = 0;
    while t < n {
        if t.is_multiple_of(chunk) {
            prefix.fill(0.0);
        }
        let end = (t + block).min(n).min((t / chunk + 1) * chunk);
        ndarray::linalg::general_mat_mul(
            1.0,
            &a.slice(s![.., t..end]),
            &b.slice(s![t..end, ..]),
            1.0,
            &mut prefix,
        );
        r.zip_mut_with(&prefix, |r, p| *r += p.abs());
        t = end;
    }
    r
}

/// The dequantised operands of the three passes (`super::gemm`): `lhs (M, K)`, `rhs (G, K, N)`,
/// `dout (M, N)`, and wgrad's column-wise copies transposed back to `(M, ·)`.
pub struct Dequantised<'a> {
    pub lhs: ArrayView2<'a, f64>,
    pub rhs: ArrayView3<'a, f64>,
    pub dout: Option<ArrayView2<'a, f64>>,
    pub lhs_w: ArrayView2<'a, f64>,
    pub dout_w: Option<ArrayView2<'a, f64>>,
}

/// `R` of every element of the asked passes under `model`'s nominal accumulator, tail rows 0.
pub fn running_magnitudes(
    model: AccumModel,
    ops: &Dequantised<'_>,
    off: &[usize],
    passes: Passes,
) -> WideOutputs {
    let block = AccumVariant::NOMINAL.block;
    let (g, k, n) = ops.rhs.dim();
    let m = ops.lhs.nrows();
    // One job per (expert, block of output rows): `f(e, r0, r1)` is rows r0..r1 of its output.
    let by_rows = |out_rows: usize,
                   ranges: &dyn Fn(usize) -> (usize, usize),
                   cols: usize,
                   f: &(dyn Fn(usize, usize, usize) -> Array2<f64> + Sync)| {
        let mut jobs = Vec::new();
        for e in 0..g {
            let (lo, hi) = ranges(e);
            let mut r0 = lo;
            while r0 < hi {
                let r1 = (r0 + ROWS).min(hi);
                jobs.push((e, r0, r1));
                r0 = r1;
            }
        }
        let parts = crate::par::map_by_cost(
            jobs.clone(),
            |&(_, r0, r1)| (r1 - r0) * cols,
            |(e, r0, r1)| f(e, r0, r1),
        );
        let mut out = Array2::<f64>::zeros((out_rows, cols));
        for ((_, r0, r1), part) in jobs.into_iter().zip(parts) {
            out.slice_mut(s![r0..r1, ..]).assign(&part);
        }
        out
    };
    let groups = |e: usize| (off[e], off[e + 1]);
    let out = passes.fwd.then(|| {
        let chunk = model.chunk(k);
        by_rows(m, &groups, n, &|e, r0, r1| {
            let a = ops.lhs.slice(s![r0..r1, ..]);
            partial_sum_magnitudes(a, ops.rhs.index_axis(ndarray::Axis(0), e), block, chunk)
        })
    });
    let dlhs = match (passes.dgrad, ops.dout) {
        (true, Some(d)) => Some({
            let chunk = model.chunk(n);
            by_rows(m, &groups, k, &|e, r0, r1| {
                let a = d.slice(s![r0..r1, ..]);
                let w = ops.rhs.index_axis(ndarray::Axis(0), e);
                partial_sum_magnitudes(a, w.t(), block, chunk)
            })
        }),
        _ => None,
    };
    let drhs = match (passes.wgrad, ops.dout_w) {
        (true, Some(d)) => Some({
            // drhs[e] = lhs_eᵀ·dout_e: rows are k, the reduction runs over the group's rows.
            let mut all = Array3::<f64>::zeros((g, k, n));
            for e in 0..g {
                let (lo, hi) = groups(e);
                let chunk = model.chunk(hi - lo);
                let one = by_rows(
                    k,
                    &|x| if x == e { (0, k) } else { (0, 0) },
                    n,
                    &|_, r0, r1| {
                        let a = ops.lhs_w.slice(s![lo..hi, r0..r1]);
                        partial_sum_magnitudes(a.t(), d.slice(s![lo..hi, ..]), block, chunk)
                    },
                );
                all.index_axis_mut(ndarray::Axis(0), e).assign(&one);
            }
            all
        }),
        _ => None,
    };
    WideOutputs { out, dlhs, drhs }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    /// Hand-worked: blocks of 2 over 5 products, one chunk, then chunks of 4.
    #[test]
    fn partial_sums_by_hand() {
        // One output element: products 1, -3, 2, 2, -5 (a = row, b = column of ones).
        let a = array![[1.0, -3.0, 2.0, 2.0, -5.0]];
        let b = array![[1.0], [1.0], [1.0], [1.0], [1.0]];
        // Blocks [1, -3], [2, 2], [-5]: partial sums -2, 2, -3: R = 7.
        assert_eq!(
            partial_sum_magnitudes(a.view(), b.view(), 2, 5)[(0, 0)],
            7.0
        );
        // One product at a time: 1, -2, 0, 2, -3: R = 8.
        assert_eq!(
            partial_sum_magnitudes(a.view(), b.view(), 1, 5)[(0, 0)],
            8.0
        );
        // Chunks of 4 with blocks of 2: -2, 2 | restart: -5: R = 9.
        assert_eq!(
            partial_sum_magnitudes(a.view(), b.view(), 2, 4)[(0, 0)],
            9.0
        );
        // A chunk that is not a multiple of the block ends a block early: chunks of 3,
        // blocks of 2: [1, -3] -> -2, [2] -> 0 | [2, -5] -> -3: R = 5.
        assert_eq!(
            partial_sum_magnitudes(a.view(), b.view(), 2, 3)[(0, 0)],
            5.0
        );
        // No products: R = 0.
        let e = Array2::<f64>::zeros((2, 0));
        let f = Array2::<f64>::zeros((0, 3));
        assert_eq!(
            partial_sum_magnitudes(e.view(), f.view(), 32, 128),
            Array2::<f64>::zeros((2, 3))
        );
    }

    /// Each element's `R` is the scalar definition's, for every pass and group layout
    /// (groups of 0, 1 and 70 rows: more than one job of rows), and tail rows are 0.
    #[test]
    fn running_magnitudes_match_the_definition() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (k, n) = (75, 40);
        let m = 75; // 71 used, 4 tail rows
        let mut draw =
            |r: usize, c: usize| Array2::from_shape_fn((r, c), |_| rng.random_range(-2.0..2.0f64));
        let lhs = draw(m, k);
        let dout = draw(m, n);
        let lhs_w = draw(m, k);
        let dout_w = draw(m, n);
        let rhs =
            Array3::from_shape_vec((3, k, n), draw(3 * k, n).into_raw_vec_and_offset().0).unwrap();
        let off = [0, 0, 1, 71]; // groups of 0, 1 and 70 rows
        let ops = Dequantised {
            lhs: lhs.view(),
            rhs: rhs.view(),
            dout: Some(dout.view()),
            lhs_w: lhs_w.view(),
            dout_w: Some(dout_w.view()),
        };
        let scalar = |p: &dyn Fn(usize) -> f64, len: usize, chunk: usize| {
            let (mut s, mut r) = (0.0f64, 0.0f64);
            for i in 0..len {
                if i % chunk == 0 {
                    s = 0.0;
                }
                s += p(i);
                if (i + 1) % 32 == 0 || i + 1 == len || (i + 1) % chunk == 0 {
                    r += s.abs();
                }
            }
            r
        };
        let close = |got: f64, want: f64| (got - want).abs() <= 1e-12 * want.abs().max(1.0);
        for model in [AccumModel::Fast, AccumModel::FastPromote] {
            let w = running_magnitudes(model, &ops, &off, Passes::ALL);
            let (out, dlhs, drhs) = (w.out.unwrap(), w.dlhs.unwrap(), w.drhs.unwrap());
            for e in 0..3 {
                for row in off[e]..off[e + 1] {
                    for c in 0..n {
                        let want = scalar(&|i| lhs[(row, i)] * rhs[(e, i, c)], k, model.chunk(k));
                        assert!(close(out[(row, c)], want), "{model} fwd {row},{c}");
                    }
                    for c in 0..k {
                        let want = scalar(&|i| dout[(row, i)] * rhs[(e, c, i)], n, model.chunk(n));
                        assert!(close(dlhs[(row, c)], want), "{model} dgrad {row},{c}");
                    }
                }
                let rows = off[e + 1] - off[e];
                for i in 0..k {
                    for c in 0..n {
                        let p = |t: usize| lhs_w[(off[e] + t, i)] * dout_w[(off[e] + t, c)];
                        let want = scalar(&p, rows, model.chunk(rows));
                        assert!(close(drhs[(e, i, c)], want), "{model} wgrad {e} {i},{c}");
                    }
                }
            }
            assert!(out.slice(s![71.., ..]).iter().all(|x| *x == 0.0));
            assert!(dlhs.slice(s![71.., ..]).iter().all(|x| *x == 0.0));
            // The empty expert's drhs: no products.
            assert!(drhs
                .index_axis(ndarray::Axis(0), 0)
                .iter()
                .all(|x| *x == 0.0));
        }
    }
}
