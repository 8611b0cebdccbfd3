//! Judging one group's elements against their bounds, a row at a time: the statistics, the
//! bound's teeth and the output fit that [`super::compare`] reports per group, and the
//! types that locate and summarise them.

use std::borrow::Cow;

use ndarray::{ArrayView1, ArrayView2};
use serde::{Deserialize, Serialize};

use super::bound::ErrorBound;
use super::fit::Fit;
use super::held::{OutView, OutView2};
use crate::format::Format;
use crate::stats::{ElementStats, Held, StatsAcc, WorstElement};

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

pub(crate) use crate::stats::zero_ratio;

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
    /// reference (`want`, `mag` are the block's rows), a row at a time: the output fit, then
    /// each element's bound, the statistics and the bound's teeth in one sweep
    /// ([`StatsAcc::push_bounded`]).
    pub(super) fn push_rows(
        &mut self,
        first: usize,
        got: OutView2<'_>,
        want: ArrayView2<f64>,
        mag: ArrayView2<f64>,
        bound: &ErrorBound,
    ) {
        let group = self.group;
        let mut widened = Vec::with_capacity(want.ncols());
        for (i, (w, s)) in want.outer_iter().zip(mag.outer_iter()).enumerate() {
            let row = first + i;
            let (w, s) = (contiguous(w), contiguous(s));
            let zero = |xs: &[f64]| xs.iter().fold(true, |z, &x| z & (x == 0.0));
            // A row with a non-zero magnitude up front (nearly every row) is not scanned.
            let maybe = s.first() == Some(&0.0);
            if maybe && zero(&s) && zero(&w) {
                let g = got.row_f64(row, &mut widened);
                if zero(g) {
                    // An exact zero where the answer is exactly zero (an empty expert's
                    // wgrad): bounds 0, teeth 0 (no change), what judging element by element
                    // gives.
                    if self.fit.looking() {
                        self.fit.push_zeros();
                    }
                    self.acc.push_zeros(|col| GemmAt { group, row, col }, g, &w);
                    continue;
                }
            }
            // The first rows, until the outputs stop fitting a narrower format: the fit looks
            // at every element (and counts the non-zeros itself); after that, the sweep counts.
            let looking = self.fit.looking();
            if looking {
                let g = got.row_f64(row, &mut widened);
                for (&x, &y) in g.iter().zip(w.iter()) {
                    self.fit.push(x, y);
                }
            }
            // An f32 row where it lies (widened in the sweep's registers), else in f64.
            let nonzero = match got {
                OutView::F32(a) => match a.row(row).to_slice() {
                    Some(g) => self.sweep(row, g, &w, &s, bound),
                    None => self.sweep(row, got.row_f64(row, &mut widened), &w, &s, bound),
                },
                OutView::F64(_) => self.sweep(row, got.row_f64(row, &mut widened), &w, &s, bound),
            };
            if !looking {
                self.fit.count(nonzero);
            }
        }
    }

    /// One row judged in one sweep ([`StatsAcc::push_bounded`]): the statistics and the
    /// teeth; returns how many outputs are finite and not zero.
    fn sweep<G: Held>(
        &mut self,
        row: usize,
        got: &[G],
        want: &[f64],
        mag: &[f64],
        bound: &ErrorBound,
    ) -> usize {
        let group = self.group;
        let swept = self.acc.push_bounded(
            |col| GemmAt { group, row, col },
            got,
            want,
            mag,
            bound.linear(),
            self.teeth,
        );
        self.teeth = swept.teeth;
        swept.nonzero
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::bound::{Accumulator, Precision};
    use crate::gemm::held::OutView;
    use ndarray::Array2;

    /// Judging rows gives what judging element by element gives: the statistics (worst
    /// element included), the teeth (`max |want| / bound`) and the fit, over rows whose width
    /// is not a multiple of the lanes, with zero magnitudes (a zero bound), zero references,
    /// errors above the bound, and the largest teeth in a row's first eight columns (a row
    /// whose teeth beat every later one) or in its last, past the whole chunks of lanes; with
    /// rows that are exactly zero (reference, magnitude and output: judged in one step), one
    /// such row first, and a zero row whose output is not zero in one element.
    #[test]
    fn rows_are_judged_as_elements() {
        for special in [(3, 5), (20, 35)] {
            rows_are_judged_as_elements_with(special);
        }
    }

    /// The branch-free ratio is the rule written with branches, bit for bit, over zero,
    /// subnormal, huge, infinite and NaN references and bounds of both signs. Planted: the
    /// vacuous bound's case dropped (a NaN bound gives +inf), and a zero bound taken as 0.
    #[test]
    fn zero_ratio_follows_its_rule() {
        let rule = |want: f64, bound: f64| {
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
        };
        let values = [
            0.0,
            -0.0,
            5e-324,
            1e-300,
            0.75,
            -3.0,
            1e300,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for want in values {
            for bound in values {
                let (got, expect) = (zero_ratio(want, bound), rule(want, bound));
                assert_eq!(got.to_bits(), expect.to_bits(), "{want} / {bound}");
            }
        }
    }

    fn rows_are_judged_as_elements_with(special: (usize, usize)) {
        let (rows, cols) = (23, 37);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 10_000) as f64 / 1000.0 - 5.0
        };
        // Element `special` has the largest teeth: a large reference whose magnitude is its
        // own size (no cancellation); every other magnitude exceeds its reference by >= 1.
        let zero_row = |r: usize| r == 0 || r == 7 || r == 12;
        let want = Array2::from_shape_fn((rows, cols), |(r, c)| match (r * cols + c) % 17 {
            _ if zero_row(r) => 0.0,
            _ if (r, c) == special => 1e3,
            0 => 0.0,
            _ => next(),
        });
        // Zero magnitudes (a zero bound) where the reference is 0: an empty sum.
        let mag = Array2::from_shape_fn((rows, cols), |(r, c)| match (r * cols + c) % 17 {
            _ if zero_row(r) => 0.0,
            _ if (r, c) == special => 1e3,
            0 => 0.0,
            _ => want[(r, c)].abs() + 1.0 + next().abs(),
        });
        let got = Array2::from_shape_fn((rows, cols), |(r, c)| match (r * cols + c) % 11 {
            _ if (r, c) == (12, 4) => 2e-3,
            _ if zero_row(r) => {
                if c % 2 == 0 {
                    0.0
                } else {
                    -0.0
                }
            }
            0 => want[(r, c)] + 1e-3,
            _ => (want[(r, c)] as f32) as f64,
        });
        let got32 = got.mapv(|v| v as f32);
        let precision = Precision {
            input: Format::Bf16,
            accumulator: Accumulator::any_order(Format::F32),
            output: Format::F32,
        };
        let bound = ErrorBound::new(&precision, 64);
        let group = GroupId::Expert(2);
        let mut acc = Acc::new(group, Format::F32);
        // In two calls, the second starting mid-way.
        let cut = 9;
        let view: OutView2 = OutView::F32(got32.view());
        acc.push_rows(
            0,
            view,
            want.slice(ndarray::s![..cut, ..]),
            mag.slice(ndarray::s![..cut, ..]),
            &bound,
        );
        acc.push_rows(
            cut,
            view,
            want.slice(ndarray::s![cut.., ..]),
            mag.slice(ndarray::s![cut.., ..]),
            &bound,
        );
        let (stats, teeth, fit) = acc.finish();
        let mut one = StatsAcc::new(Format::F32);
        let (mut t, mut f) = (0.0f64, Fit::for_output(Format::F32));
        for r in 0..rows {
            for c in 0..cols {
                let (g, w) = (f64::from(got32[(r, c)]), want[(r, c)]);
                let b = bound.at(mag[(r, c)], w);
                t = t.max(zero_ratio(w, b));
                f.push(g, w);
                one.push(
                    || GemmAt {
                        group,
                        row: r,
                        col: c,
                    },
                    g,
                    w,
                    b,
                );
            }
        }
        let one = one.finish();
        assert!(one.failed > 0 && one.worst.is_some());
        assert_eq!(format!("{:?}", stats.stats), format!("{one:?}"));
        assert!(t > 0.0 && t.is_finite());
        assert_eq!(teeth.to_bits(), t.to_bits(), "{teeth} vs {t}, {special:?}");
        assert_eq!(fit, f);
    }
}
