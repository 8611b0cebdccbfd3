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
    /// Checked elements where the implementation wrote the reference's infinity, and the
    /// reference value plus its bound reaches the output format's overflow threshold: rounding
    /// to nearest into the output format overflows there, so `±inf` is a correct answer (see
    /// [`StatsAcc::push`]; they take no part in the error statistics or `calc_diff`).
    #[serde(default)]
    pub overflowed: usize,
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
            overflowed: 0,
            worst: None,
        }
    }

    pub fn passed(&self) -> bool {
        self.failed == 0
    }
}

/// `1 / ulp(x)` of a format whose every ulp has a representable inverse (all but f64, whose
/// smallest ulp is 2^-1074): a power of two, so `err · (1/ulp)` is `err / ulp` exactly (both
/// are the correctly rounded value of the same real), without a division.
#[derive(Clone, Copy)]
struct InverseUlp {
    emin: i32,
    mantissa_bits: i32,
    max: f64,
}

impl InverseUlp {
    fn of(format: Format) -> Option<InverseUlp> {
        let info = format.info();
        let mantissa_bits = info.mantissa_bits as i32;
        (mantissa_bits - info.emin <= 1023).then_some(InverseUlp {
            emin: info.emin,
            mantissa_bits,
            max: info.max,
        })
    }

    /// `1 / ulp(x, format)` for finite `x` (see [`ulp`]: the spacing at `max` above it, the
    /// smallest subnormal's at 0).
    #[inline]
    fn at(self, x: f64) -> f64 {
        let a = x.abs().min(self.max);
        let biased = ((a.to_bits() >> 52) & 0x7ff) as i32;
        let e = if biased == 0 { -1075 } else { biased - 1023 };
        let k = self.mantissa_bits - e.max(self.emin);
        f64::from_bits(((k + 1023) as u64) << 52)
    }
}

/// Whether round-to-nearest into `out` may overflow for some value within `bound` of the
/// finite `want`: `|want| + bound >= max + ulp(max)/2`. Never for a format without infinities.
fn overflows(want: f64, bound: f64, out: Format) -> bool {
    let info = out.info();
    info.has_inf && want.abs() + bound >= info.max + ulp(info.max, out) / 2.0
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
    /// NaN and the same infinity where `want` is infinite.
    ///
    /// Output overflow: the bound's derivation (`gemm::bound`, step 2) rounds the accumulated
    /// value `ŝ` to the output format, and round-to-nearest sends every `|ŝ|` at or above the
    /// format's overflow threshold `max + ulp(max)/2` to infinity. `ŝ` may lie anywhere within
    /// the bound of `want`, so `got = ±inf` with `want`'s sign is correct when
    /// `|want| + bound` reaches that threshold (an f16 output of a product of 2^11-sized
    /// values, cuBLAS's grouped GEMM writing f16). It counts in `overflowed` and takes no part
    /// in the error statistics. The other infinity, or an infinity where the bound stays below
    /// the threshold, fails. A format without infinities never passes one.
    ///
    /// `at` locates the element, and is only kept if it is the worst so far.
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
        } else if got.is_infinite()
            && got.is_sign_negative() == want.is_sign_negative()
            && overflows(want, bound, self.out)
        {
            s.overflowed += 1;
            return;
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

    /// [`StatsAcc::push`] for consecutive elements `got[i]`, `want[i]`, `bound[i]`, located by
    /// `at(i)`: the same statistics, bit for bit, in the same order. Runs of finite elements
    /// are judged a chunk at a time in plain loops the compiler vectorises, which is where a
    /// full verification spends its judging time; a chunk with any NaN or ±inf goes through
    /// [`StatsAcc::push`] element by element.
    ///
    /// # Panics
    /// If the three slices differ in length.
    pub fn push_slice(
        &mut self,
        at: impl Fn(usize) -> L,
        got: &[f64],
        want: &[f64],
        bound: &[f64],
    ) {
        const CHUNK: usize = 64;
        assert!(
            got.len() == want.len() && want.len() == bound.len(),
            "push_slice: {} got, {} want, {} bounds",
            got.len(),
            want.len(),
            bound.len()
        );
        let (mut err, mut ratio) = ([0.0f64; CHUNK], [0.0f64; CHUNK]);
        for start in (0..got.len()).step_by(CHUNK) {
            let end = (start + CHUNK).min(got.len());
            let (g, w, b) = (&got[start..end], &want[start..end], &bound[start..end]);
            let n = g.len();
            let finite = g.iter().chain(w).fold(true, |ok, x| ok & x.is_finite());
            if !finite {
                for i in 0..n {
                    self.push(|| at(start + i), g[i], w[i], b[i]);
                }
                continue;
            }
            // Every got and want is finite: no NaN/inf counts, no exact contract, and the
            // error is never NaN (it may be +inf when the difference overflows).
            let mut failed = 0;
            for i in 0..n {
                let e = (g[i] - w[i]).abs();
                err[i] = e;
                let ok = e <= b[i]; // false for a NaN bound, as in `push`
                failed += usize::from(!ok);
                ratio[i] = if b[i] > 0.0 {
                    e / b[i]
                } else if e == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                };
            }
            let inv = InverseUlp::of(self.out);
            let st = &mut self.stats;
            st.elements += n;
            st.checked += n;
            st.failed += failed;
            for i in 0..n {
                let e = err[i];
                if e > st.max_abs_err {
                    st.max_abs_err = e;
                }
                let u = match inv {
                    Some(inv) => e * inv.at(w[i]),
                    None => e / ulp(w[i], self.out),
                };
                if u.is_nan() || u > st.max_ulp {
                    st.max_ulp = u;
                }
                if st.worst.is_none() || ratio[i] > st.max_bound_ratio {
                    st.max_bound_ratio = ratio[i];
                    st.worst = Some(WorstElement {
                        at: at(start + i),
                        got: g[i],
                        want: w[i],
                        bound: b[i],
                    });
                }
            }
            for i in 0..n {
                self.sum_xy += g[i] * w[i];
                self.sum_sq += g[i] * g[i] + w[i] * w[i];
            }
        }
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

    /// Round-to-nearest into f16 overflows at 65520 (= max 65504 + ulp(max)/2): an infinity
    /// of the reference's sign passes where the reference plus its bound reaches it, and
    /// nowhere else; a format without infinities passes none.
    #[test]
    fn an_overflowing_output_may_be_infinite() {
        let one = |out: Format, got: f64, want: f64, bound: f64| {
            let mut acc = StatsAcc::new(out);
            acc.push(|| 0usize, got, want, bound);
            acc.finish()
        };
        let inf = f64::INFINITY;
        for (got, want, bound) in [(inf, 65519.0, 1.0), (-inf, -7e4, 1.0), (inf, 65520.0, 0.0)] {
            let s = one(Format::F16, got, want, bound);
            assert!(s.passed(), "got {got}, want {want}, bound {bound}: {s:?}");
            assert_eq!((s.overflowed, s.inf), (1, 1));
            assert_eq!((s.max_abs_err, s.calc_diff), (0.0, 0.0), "{s:?}");
        }
        for (out, got, want, bound) in [
            (Format::F16, inf, 65519.0, 0.5),
            (Format::F16, inf, -7e4, 1.0),
            (Format::F16, -inf, 7e4, 1.0),
            (Format::F32, inf, 7e4, 1.0),
            (Format::E4m3, inf, 1e3, 1.0),
        ] {
            let s = one(out, got, want, bound);
            assert_eq!(
                (s.failed, s.overflowed),
                (1, 0),
                "{out:?} got {got}, want {want}: {s:?}"
            );
        }
    }

    /// The chunked judge gives what judging element by element gives, statistic for
    /// statistic and worst element included, over runs that cross chunk edges and hold NaN,
    /// ±inf, overflowing differences, zero and infinite bounds, ties and exact matches.
    #[test]
    fn push_slice_is_push_element_by_element() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..200 {
            let len = (next() % 300) as usize;
            let special = round % 3 != 0;
            let pick = |r: u64, v: f64| match r % 40 {
                0 if special => f64::NAN,
                1 if special => f64::INFINITY,
                2 if special => f64::NEG_INFINITY,
                3 => 1e308,
                4 => -1e308,
                5 => 0.0,
                _ => v,
            };
            let (mut got, mut want, mut bound) = (vec![], vec![], vec![]);
            for _ in 0..len {
                let w = (next() % 2001) as f64 / 100.0 - 10.0;
                let g = w + ((next() % 21) as f64 - 10.0) * 1e-3;
                want.push(pick(next(), w));
                got.push(pick(next(), g));
                bound.push(match next() % 10 {
                    0 => 0.0,
                    1 => f64::INFINITY,
                    2 => 5e-3,
                    _ => (next() % 100) as f64 * 1e-4,
                });
            }
            for out in [Format::F32, Format::Bf16, Format::F64] {
                let mut one = StatsAcc::new(out);
                for i in 0..len {
                    one.push(|| i, got[i], want[i], bound[i]);
                }
                let mut chunked = StatsAcc::new(out);
                // Split in two calls, the second starting mid-chunk.
                let cut = len / 3;
                chunked.push_slice(|i| i, &got[..cut], &want[..cut], &bound[..cut]);
                chunked.push_slice(|i| cut + i, &got[cut..], &want[cut..], &bound[cut..]);
                // Debug text: NaN statistics are not equal to themselves.
                assert_eq!(
                    format!("{:?}", one.finish()),
                    format!("{:?}", chunked.finish()),
                    "round {round}, {out}"
                );
            }
        }
    }

    /// The inverse ulp is exactly `1 / ulp` for every format it applies to, over normal,
    /// subnormal, zero, huge and over-`max` values.
    #[test]
    fn inverse_ulp_is_one_over_ulp() {
        let mut values = vec![
            0.0, -0.0, 1.0, 3.0, 1e-45, 1e-40, 1e-10, 448.0, 500.0, 1e38, 1e300,
        ];
        values.extend((0..2000).map(|i| (i as f64 * 0.37).sin() * 10f64.powi(i % 90 - 45)));
        // f64 subnormals and the smallest normal f64.
        values.extend([5e-324, 1e-310, f64::MIN_POSITIVE]);
        for f in [
            Format::F32,
            Format::Bf16,
            Format::F16,
            Format::E4m3,
            Format::E5m2,
        ] {
            let inv = InverseUlp::of(f).expect("a representable inverse");
            // Each format's edges: its smallest normal and the values either side, its max and
            // the value above it.
            let info = f.info();
            let normal = 2f64.powi(info.emin);
            let edges = [
                normal,
                normal.next_down(),
                normal.next_up(),
                info.max,
                info.max.next_up(),
            ];
            for &x in values.iter().chain(&edges) {
                assert_eq!(inv.at(x), 1.0 / ulp(x, f), "{f} at {x}");
            }
        }
        assert!(InverseUlp::of(Format::F64).is_none());
    }
}
