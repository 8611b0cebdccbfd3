//! A pass's output as the matrix fast verification reads ([`super::expected::flat_shape`]).

use ndarray::{Axis, Ix3};

use crate::gemm::case::{GemmOutputs, Pass};
use crate::gemm::held::{OutView, OutView2};

/// A pass's output read as a matrix ([`super::expected::flat_shape`]): `out` and `dlhs` as
/// they are, `drhs` as `G·K` rows of `N` (expert `g`'s rows from `g·K`).
#[derive(Clone, Copy)]
pub(super) enum Flat<'a> {
    Rows(OutView2<'a>),
    Experts(OutView<'a, Ix3>),
}

impl<'a> Flat<'a> {
    /// Element `(r, c)` of the matrix.
    pub(super) fn at(&self, r: usize, c: usize) -> f64 {
        match self {
            Flat::Rows(a) => a.at(r, c),
            Flat::Experts(d) => {
                let k = d.shape()[1];
                expert(*d, r / k).at(r % k, c)
            }
        }
    }

    /// Rows `lo..hi` of the matrix, which lie in one expert for `drhs` (a block of the fast
    /// reference is one group).
    pub(super) fn rows(&self, lo: usize, hi: usize) -> OutView2<'a> {
        match self {
            Flat::Rows(a) => a.rows(lo, hi),
            Flat::Experts(d) => {
                let k = d.shape()[1];
                let g = lo / k;
                expert(*d, g).rows(lo - g * k, hi - g * k)
            }
        }
    }
}

fn expert(d: OutView<'_, Ix3>, g: usize) -> OutView2<'_> {
    match d {
        OutView::F32(a) => OutView::F32(a.index_axis_move(Axis(0), g)),
        OutView::F64(a) => OutView::F64(a.index_axis_move(Axis(0), g)),
    }
}

/// The pass's output as a matrix of `want` rows and columns (`drhs` must be `experts`,
/// `[G, K, N]`), or why it cannot be read.
pub(super) fn flat<'a>(
    pass: Pass,
    got: &'a GemmOutputs,
    want: (usize, usize),
    experts: &[usize],
) -> Result<Flat<'a>, String> {
    let none = "the implementation returned no output";
    let (shape, view) = match pass {
        Pass::Fwd | Pass::Dgrad => {
            let a = if pass == Pass::Fwd {
                &got.out
            } else {
                &got.dlhs
            };
            let a = a.as_ref().ok_or(none)?;
            (a.shape().to_vec(), Flat::Rows(a.view()))
        }
        Pass::Wgrad => {
            let a = got.drhs.as_ref().ok_or(none)?;
            if a.shape() != experts {
                return Err(format!(
                    "drhs has shape {:?}, expected {experts:?}",
                    a.shape()
                ));
            }
            let (g, k, n) = a.dim();
            (vec![g * k, n], Flat::Experts(a.view()))
        }
    };
    if shape != [want.0, want.1] {
        return Err(format!(
            "{} has shape {shape:?}, expected {:?}",
            pass.output_name(),
            [want.0, want.1]
        ));
    }
    Ok(view)
}
