//! Judging one group's elements against their bounds, a row at a time: the statistics, the
//! bound's teeth and the output fit that [`super::compare`] reports per group, and the
//! types that locate and summarise them.

use std::borrow::Cow;

use ndarray::{ArrayView1, ArrayView2};
use serde::{Deserialize, Serialize};

use super::bound::ErrorBound;
use super::fit::Fit;
use super::held::OutView2;
use crate::format::Format;
use crate::stats::{ElementStats, StatsAcc, WorstElement};

/// Which rows an element belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupId {
    /// Expert `g`'s rows (fwd, dgrad) or its weight gradient (wgrad).
    Expert(usize),
    /// Rows `>= Σ group_sizes` (dropped tokens).
    Tail,
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupId::Expert(g) => write!(f, "expert {g}"),
            GroupId::Tail => f.write_str("tail"),
        }
    }
}

/// Where a grouped-GEMM element is: the group, and its row and column (for `drhs`, the `k`
/// index of expert `group`'s weight gradient).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmAt {
    pub group: GroupId,
    /// Row of `out`/`dlhs` (global index), or the `k` index of `drhs[g]`.
    pub row: usize,
    /// Column.
    pub col: usize,
}

/// The worst element of a group.
pub type Worst = WorstElement<GemmAt>;

/// Statistics of one group of one pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStats {
    pub group: GroupId,
    #[serde(flatten)]
    pub stats: ElementStats<GemmAt>,
}

impl GroupStats {
    pub fn passed(&self) -> bool {
        self.stats.passed()
    }
}

/// `|want| / bound` for one element, as [`super::PassReport::zero_ratio`] takes its maximum (full
/// and fast verification alike).
pub(crate) fn zero_ratio(want: f64, bound: f64) -> f64 {
    let w = want.abs();
    if w == 0.0 || !w.is_finite() {
        0.0
    } else if bound.is_infinite() || bound.is_nan() {
        f64::MIN_POSITIVE
    } else if bound > 0.0 {
        w / bound
    } else {
        f64::INFINITY
    }
}

/// Accumulates one group's statistics, and the bound's teeth ([`PassReport::zero_ratio`]).
pub(super) struct Acc {
    group: GroupId,
    acc: StatsAcc<GemmAt>,
    teeth: f64,
    fit: Fit,
}

impl Acc {
    pub(super) fn new(group: GroupId, out: Format) -> Acc {
        Acc {
            group,
            acc: StatsAcc::new(out),
            teeth: 0.0,
            fit: Fit::for_output(out),
        }
    }

    /// Judges the rows `first..first + want.nrows()` of `got` against a block of the
    /// reference (`want`, `mag` are the block's rows): each element's bound, the bound's
    /// teeth and the output fit, then the statistics a row at a time through
    /// [`StatsAcc::push_slice`].
    pub(super) fn push_rows(
        &mut self,
        first: usize,
        got: OutView2<'_>,
        want: ArrayView2<f64>,
        mag: ArrayView2<f64>,
        bound: &ErrorBound,
    ) {
        let group = self.group;
        let mut bounds = Vec::with_capacity(want.ncols());
        let mut widened = Vec::with_capacity(want.ncols());
        for (i, (w, s)) in want.outer_iter().zip(mag.outer_iter()).enumerate() {
            let row = first + i;
            let g = got.row_f64(row, &mut widened);
            let (w, s) = (contiguous(w), contiguous(s));
            bounds.clear();
            bounds.extend(w.iter().zip(s.iter()).map(|(&y, &m)| bound.at(m, y)));
            let mut teeth = self.teeth;
            for (&y, &b) in w.iter().zip(&bounds) {
                teeth = teeth.max(zero_ratio(y, b));
            }
            self.teeth = teeth;
            if self.fit.looking() {
                for (&x, &y) in g.iter().zip(w.iter()) {
                    self.fit.push(x, y);
                }
            } else {
                self.fit.count_nonzero(g);
            }
            self.acc
                .push_slice(|col| GemmAt { group, row, col }, g, &w, &bounds);
        }
    }

    /// The group's statistics, its `max |want| / bound` and what its outputs fit.
    pub(super) fn finish(self) -> (GroupStats, f64, Fit) {
        let stats = GroupStats {
            group: self.group,
            stats: self.acc.finish(),
        };
        (stats, self.teeth, self.fit)
    }
}

/// A row as a slice: borrowed where it is contiguous, copied otherwise.
fn contiguous(row: ArrayView1<'_, f64>) -> Cow<'_, [f64]> {
    match row.to_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(row.to_vec()),
    }
}
