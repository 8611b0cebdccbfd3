//! Permute / unpermute: the data movement around the grouped GEMM of an MoE layer.
//!
//! ## Layout
//! A routing of `T` tokens to `k` experts each gives `T·k` **assignments**, numbered
//! token-major, slot-minor: assignment `a = t·k + s` is slot `s` of token `t`, sent to expert
//! `indices[t, s]`, kept or dropped by capacity (`kept[t, s]`).
//!
//! [`Permutation::new`] sorts the assignments **stably** by the key `expert` (kept) or `E`
//! (dropped), exactly as `argsort` with a stable sort over the flattened expert ids does in
//! MaxText's `permute` once dropped assignments are given the out-of-range id `E`. Row `r` of
//! the permuted matrix holds assignment `order[r]`:
//!
//! * rows of expert `e` are contiguous, `group_sizes[e]` of them (kept assignments only), in
//!   token-major, slot-minor order;
//! * the dropped assignments follow all groups, token-major: these are the grouped GEMM's
//!   **tail rows** (`r >= Σ group_sizes`), whose output the GEMM contract makes exactly 0.
//!
//! `inverse` is the inverse permutation: `inverse[order[r]] = r` and `order[inverse[a]] = a`.
//!
//! ## Operations (all exact: they move values, the combine aside)
//! * [`Permutation::permute`]: `xp[r, :] = x[order[r] / k, :]` (each token repeated `k` times).
//! * [`Permutation::unpermute`]: `u[t, s, :] = xp[inverse[t·k + s], :]`, so
//!   `unpermute(permute(x))[t, s] = x[t]` for every slot, dropped ones included.
//! * [`Permutation::scatter_add`], the VJP of `permute`: `dx[t, :] = Σ_s dxp[inverse[t·k+s], :]`.
//! * [`Permutation::combine`]: `out[t, :] = Σ_s w[t, s] · yp[inverse[t·k + s], :]` over kept
//!   slots only (a dropped slot contributes nothing, whatever `w` and `yp` hold).
//!
//! ## The combine in f32 (what an implementation does, and what the bound assumes)
//! MaxText's `unpermute` casts the expert outputs and the routing weights to float32,
//! multiplies them, and sums the `k` products of a token in float32 before casting to the
//! activation dtype; Megatron's `unpermute` also scatters in float32 (`probs` kept in fp32).
//! moecheck's reference combines in **f64** (each product and the `k`-term sum rounded to
//! f64), and the layer bound (`super::bound`) charges an implementation one f32 rounding per
//! product and `γ(k, 2^-24)` for the sum, i.e. exactly an f32 combine.

use ndarray::{Array2, Array3, ArrayView2};

use crate::Error;

/// The stable sort of a routing's assignments by expert, with dropped assignments last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permutation {
    /// `T`
    pub tokens: usize,
    /// `k`, the slots per token.
    pub topk: usize,
    /// `E`
    pub experts: usize,
    /// `order[r]`: the assignment `t·k + s` at permuted row `r` (length `T·k`).
    pub order: Vec<usize>,
    /// `inverse[a]`: the permuted row of assignment `a` (length `T·k`).
    pub inverse: Vec<usize>,
    /// Kept assignments per expert (length `E`).
    pub group_sizes: Vec<usize>,
    /// The expert of each assignment, `indices[t, s]` flattened (length `T·k`).
    pub expert_of: Vec<usize>,
    /// Whether each assignment is kept, `kept[t, s]` flattened (length `T·k`).
    pub kept: Vec<bool>,
}

impl Permutation {
    /// Sorts the assignments of `indices (T, k)` with mask `kept (T, k)` over `experts`.
    ///
    /// Reads `indices` and `kept`; returns a new permutation.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when `kept` does not have the shape of `indices`, and
    /// [`Error::InvalidMoe`] when an index is `>= experts`.
    ///
    /// ```
    /// use ndarray::array;
    /// use moecheck_reference::moe::Permutation;
    /// // Token 0 -> experts (1, 0), token 1 -> (1, 2) with its second slot dropped.
    /// let p = Permutation::new(&array![[1, 0], [1, 2]], &array![[true, true], [true, false]], 3)
    ///     .unwrap();
    /// assert_eq!(p.order, vec![1, 0, 2, 3]); // expert 0: (0,1); expert 1: (0,0), (1,0); tail: (1,1)
    /// assert_eq!(p.group_sizes, vec![1, 2, 0]);
    /// assert_eq!(p.inverse, vec![1, 0, 2, 3]);
    /// ```
    pub fn new(
        indices: &Array2<usize>,
        kept: &Array2<bool>,
        experts: usize,
    ) -> Result<Permutation, Error> {
        let (tokens, topk) = indices.dim();
        if kept.dim() != indices.dim() {
            return Err(Error::ShapeMismatch {
                op: "permute",
                what: "kept",
                expected: vec![tokens, topk],
                got: kept.shape().to_vec(),
            });
        }
        let expert_of: Vec<usize> = indices.iter().copied().collect();
        let kept: Vec<bool> = kept.iter().copied().collect();
        if let Some((a, e)) = expert_of.iter().enumerate().find(|(_, e)| **e >= experts) {
            return Err(Error::InvalidMoe {
                what: "indices",
                reason: format!(
                    "assignment ({}, {}) names expert {e}, but there are {experts}",
                    a / topk.max(1),
                    a % topk.max(1)
                ),
            });
        }
        let key = |a: usize| if kept[a] { expert_of[a] } else { experts };
        let mut order: Vec<usize> = (0..tokens * topk).collect();
        order.sort_by_key(|&a| key(a)); // stable
        let mut inverse = vec![0; order.len()];
        for (r, &a) in order.iter().enumerate() {
            inverse[a] = r;
        }
        let mut group_sizes = vec![0; experts];
        for a in 0..order.len() {
            if kept[a] {
                group_sizes[expert_of[a]] += 1;
            }
        }
        Ok(Permutation {
            tokens,
            topk,
            experts,
            order,
            inverse,
            group_sizes,
            expert_of,
            kept,
        })
    }

    /// `T·k`, the rows of the permuted matrix.
    pub fn rows(&self) -> usize {
        self.order.len()
    }

    /// `Σ group_sizes`: the first tail (dropped) row.
    pub fn rows_used(&self) -> usize {
        self.group_sizes.iter().sum()
    }

    /// Prefix sums of `group_sizes`, length `E + 1`.
    pub fn offsets(&self) -> Vec<usize> {
        crate::gemm::case::offsets(&self.group_sizes)
    }

    /// The token of permuted row `r`.
    pub fn token_of_row(&self, r: usize) -> usize {
        self.order[r] / self.topk
    }

    /// `xp[r, :] = x[order[r] / k, :]`: reads `x (T, H)`, returns a new `(T·k, H)` array.
    ///
    /// # Panics
    /// If `x` does not have `T` rows.
    pub fn permute(&self, x: ArrayView2<f64>) -> Array2<f64> {
        assert_eq!(x.nrows(), self.tokens, "permute: x has the wrong row count");
        let mut xp = Array2::zeros((self.rows(), x.ncols()));
        for (r, mut row) in xp.outer_iter_mut().enumerate() {
            row.assign(&x.row(self.token_of_row(r)));
        }
        xp
    }

    /// `u[t, s, :] = xp[inverse[t·k + s], :]`: reads `xp (T·k, H)`, returns a new `(T, k, H)`
    /// array. The exact inverse of [`Permutation::permute`] on every slot.
    ///
    /// # Panics
    /// If `xp` does not have `T·k` rows.
    pub fn unpermute(&self, xp: ArrayView2<f64>) -> Array3<f64> {
        assert_eq!(xp.nrows(), self.rows(), "unpermute: wrong row count");
        let h = xp.ncols();
        Array3::from_shape_fn((self.tokens, self.topk, h), |(t, s, c)| {
            xp[(self.inverse[t * self.topk + s], c)]
        })
    }

    /// The VJP of [`Permutation::permute`]: `dx[t, :] = Σ_s dxp[inverse[t·k + s], :]`, summed
    /// in f64 in slot order. Reads `dxp (T·k, H)`, returns a new `(T, H)` array.
    ///
    /// # Panics
    /// If `dxp` does not have `T·k` rows.
    pub fn scatter_add(&self, dxp: ArrayView2<f64>) -> Array2<f64> {
        assert_eq!(dxp.nrows(), self.rows(), "scatter_add: wrong row count");
        let mut dx = Array2::zeros((self.tokens, dxp.ncols()));
        for t in 0..self.tokens {
            for s in 0..self.topk {
                let r = self.inverse[t * self.topk + s];
                let mut row = dx.row_mut(t);
                row += &dxp.row(r);
            }
        }
        dx
    }

    /// The weighted combine: `out[t, :] = Σ_{s kept} w[t, s] · yp[inverse[t·k + s], :]`, in
    /// f64, slots in order. Dropped slots are skipped (they contribute exactly 0).
    ///
    /// Reads `yp (T·k, H)` and `w (T, k)`; returns a new `(T, H)` array.
    ///
    /// # Panics
    /// If the shapes disagree with the permutation.
    pub fn combine(&self, yp: ArrayView2<f64>, w: ArrayView2<f64>) -> Array2<f64> {
        assert_eq!(yp.nrows(), self.rows(), "combine: wrong row count");
        assert_eq!(
            w.dim(),
            (self.tokens, self.topk),
            "combine: wrong weight shape"
        );
        let mut out = Array2::zeros((self.tokens, yp.ncols()));
        for t in 0..self.tokens {
            for s in 0..self.topk {
                let a = t * self.topk + s;
                if !self.kept[a] {
                    continue;
                }
                let wt = w[(t, s)];
                let r = self.inverse[a];
                out.row_mut(t).zip_mut_with(&yp.row(r), |o, y| *o += wt * y);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn unpermute_inverts_permute_and_tail_holds_dropped() {
        let idx = array![[2, 0, 1], [0, 2, 1], [1, 1, 0], [2, 0, 0]];
        let kept = array![
            [true, false, true],
            [true, true, true],
            [false, true, true],
            [true, true, false]
        ];
        let p = Permutation::new(&idx, &kept, 4).unwrap();
        assert_eq!(p.group_sizes, vec![3, 3, 3, 0]);
        assert_eq!(p.rows_used(), 9);
        // Dropped assignments (0,1), (2,0), (3,2) are the tail, token-major.
        assert_eq!(&p.order[9..], &[1, 6, 11]);
        // Within expert 0 the order is token-major: (1,0), (2,2), (3,1).
        assert_eq!(&p.order[0..3], &[3, 8, 10]);
        let x = Array2::from_shape_fn((4, 3), |(t, c)| (10 * t + c) as f64);
        let u = p.unpermute(p.permute(x.view()).view());
        for t in 0..4 {
            for s in 0..3 {
                assert_eq!(u.slice(ndarray::s![t, s, ..]), x.row(t));
            }
        }
        // scatter_add of permute(x) is k·x.
        assert_eq!(
            p.scatter_add(p.permute(x.view()).view()),
            x.mapv(|v| 3.0 * v)
        );
    }

    #[test]
    fn combine_skips_dropped_slots() {
        let idx = array![[0, 1]];
        let kept = array![[true, false]];
        let p = Permutation::new(&idx, &kept, 2).unwrap();
        let yp = array![[1.0, 2.0], [1e9, 1e9]]; // row 1 is the dropped (tail) row
        let out = p.combine(yp.view(), array![[0.5, 0.25]].view());
        assert_eq!(out, array![[0.5, 1.0]]);
    }

    #[test]
    fn out_of_range_expert_is_an_error() {
        let e = Permutation::new(&array![[3]], &array![[true]], 3).unwrap_err();
        assert!(e.to_string().contains("expert 3"), "{e}");
    }
}
