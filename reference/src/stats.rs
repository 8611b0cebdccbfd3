//! Element-by-element statistics of one slice of an output (one expert's rows of a grouped
//! GEMM pass, one expert's weight gradient, a whole layer tensor): every element judged
//! against its own bound, the largest errors, DeepGEMM's `calc_diff`, NaN/Inf counts and the
//! worst element. Shared by every element-wise comparison, so a failing group reads the same
//! whatever operation it comes from.

use serde::{Deserialize, Serialize};

use crate::format::{ulp, Format};

/// The element with the largest error/bound ratio (NaN counts as infinitely bad), located by
/// `L` (`{group, row, col}` for a grouped GEMM, `{index}` for a layer tensor).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorstElement<L> {
    #[serde(flatten)]
    pub at: L,
    pub got: f64,
    pub want: f64,
    pub bound: f64,
}

/// Statistics of one slice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElementStats<L> {
    /// Elements in the slice.
    pub elements: usize,
    /// Elements checked (fewer than `elements` where a contract leaves them unchecked).
    pub checked: usize,
    /// Checked elements outside their bound (NaN included).
    pub failed: usize,
    pub max_abs_err: f64,
    /// `max |ŷ − y| / bound` (∞ where the bound is 0 and the error is not, or NaN was read).
    pub max_bound_ratio: f64,
    /// `max |ŷ − y| / ulp_out(y)`.
    pub max_ulp: f64,
    /// DeepGEMM's `calc_diff`: `1 − 2Σŷy / Σ(ŷ² + y²)` (0 when both are all zero).
    pub calc_diff: f64,
    pub nan: usize,
    pub inf: usize,
    /// Checked elements where the reference is NaN or ±inf and the implementation matched it
    /// exactly (they take no part in the error statistics or `calc_diff`).
    #[serde(default)]
    pub exact_non_finite: usize,
    /// `Some` whenever a finite element was checked ([`StatsAcc::push`] keeps the first one at
    /// least), so always when `failed > 0`.
    pub worst: Option<WorstElement<L>>,
}

impl<L> ElementStats<L> {
    /// A slice of `elements` elements, none of them checked.
    pub fn unchecked(elements: usize) -> ElementStats<L> {
        ElementStats {
            elements,
            checked: 0,
            failed: 0,
            max_abs_err: 0.0,
            max_bound_ratio: 0.0,
            max_ulp: 0.0,
            calc_diff: 0.0,
            nan: 0,
            inf: 0,
            exact_non_finite: 0,
            worst: None,
        }
    }

    pub fn passed(&self) -> bool {
        self.failed == 0
    }
}

/// Accumulates the statistics of one slice, element by element.
pub struct StatsAcc<L> {
    stats: ElementStats<L>,
    out: Format,
    sum_xy: f64,
    sum_sq: f64,
}

impl<L> StatsAcc<L> {
    /// An empty slice whose ULP distances are measured in `out`.
    pub fn new(out: Format) -> StatsAcc<L> {
        StatsAcc {
            stats: ElementStats::unchecked(0),
            out,
            sum_xy: 0.0,
            sum_sq: 0.0,
        }
    }

    /// Judges one element: `got` against `want` within `bound` (`|got − want| <= bound`,
    /// false for NaN). Where the reference itself is not finite — a NaN or ±inf that the
    /// declared arithmetic produces, as FP8 without saturation does when delayed scaling's
    /// stale scale overflows E4M3 — the contract is exact: `got` must be NaN where `want` is
    /// NaN and the same infinity where `want` is infinite. `at` locates the element, and is
    /// only kept if it is the worst so far.
    pub fn push(&mut self, at: impl FnOnce() -> L, got: f64, want: f64, bound: f64) {
        let s = &mut self.stats;
        s.elements += 1;
        s.checked += 1;
        if got.is_nan() {
            s.nan += 1;
        } else if got.is_infinite() {
            s.inf += 1;
        }
        if !want.is_finite() {
            let same = if want.is_nan() {
                got.is_nan()
            } else {
                got == want
            };
            if same {
                s.exact_non_finite += 1;
                return;
            }
        }
        let err = (got - want).abs();
        let ok = err <= bound; // false for NaN
        if !ok {
            s.failed += 1;
        }
        let ratio = if err.is_nan() {
            f64::INFINITY
        } else if bound > 0.0 {
            err / bound
        } else if err == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        if err.is_nan() || err > s.max_abs_err {
            s.max_abs_err = if err.is_nan() { f64::NAN } else { err };
        }
        let u = err / ulp(want, self.out);
        if u.is_nan() || u > s.max_ulp {
            s.max_ulp = u;
        }
        if s.worst.is_none() || ratio > s.max_bound_ratio {
            s.max_bound_ratio = ratio;
            s.worst = Some(WorstElement {
                at: at(),
                got,
                want,
                bound,
            });
        }
        self.sum_xy += got * want;
        self.sum_sq += got * got + want * want;
    }

    pub fn finish(mut self) -> ElementStats<L> {
        self.stats.calc_diff = if self.sum_sq == 0.0 {
            0.0
        } else {
            1.0 - 2.0 * self.sum_xy / self.sum_sq
        };
        self.stats
    }
}

/// Max over slices of a statistic, NaN-propagating.
pub fn max_of<'a, L: 'a>(
    slices: impl IntoIterator<Item = &'a ElementStats<L>>,
    f: impl Fn(&ElementStats<L>) -> f64,
) -> f64 {
    slices.into_iter().map(f).fold(0.0, |a, b| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    })
}

/// The slice whose worst element has the largest bound ratio.
pub fn worst_slice<'a, S: 'a, L: 'a>(
    slices: impl IntoIterator<Item = &'a S>,
    stats: impl Fn(&S) -> &ElementStats<L>,
) -> Option<&'a S> {
    slices
        .into_iter()
        .filter(|s| stats(s).worst.is_some())
        .max_by(|a, b| {
            stats(a)
                .max_bound_ratio
                .total_cmp(&stats(b).max_bound_ratio)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(pairs: &[(f64, f64)]) -> ElementStats<usize> {
        let mut acc = StatsAcc::new(Format::F32);
        for (i, &(got, want)) in pairs.iter().enumerate() {
            acc.push(|| i, got, want, 1e-3);
        }
        acc.finish()
    }

    #[test]
    fn non_finite_references_are_matched_exactly() {
        let inf = f64::INFINITY;
        let ok = judge(&[(f64::NAN, f64::NAN), (inf, inf), (-inf, -inf), (1.0, 1.0)]);
        assert!(ok.passed(), "{ok:?}");
        assert_eq!((ok.exact_non_finite, ok.nan, ok.inf), (3, 1, 2));
        assert_eq!(ok.calc_diff, 0.0);
        for (got, want) in [
            (0.0, f64::NAN),
            (inf, f64::NAN),
            (f64::NAN, inf),
            (-inf, inf),
            (f32::MAX as f64, inf),
            (f64::NAN, 1.0),
            (inf, 1.0),
        ] {
            let s = judge(&[(got, want)]);
            assert_eq!(s.failed, 1, "got {got}, want {want}: {s:?}");
            assert_eq!(s.exact_non_finite, 0);
        }
    }
}
