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

/// Whether round-to-nearest into `out` may overflow for some value the accumulation may
/// produce for the finite `want` under `bound`: `|want| + bound − u_out·|want| >= max +
/// ulp(max)/2`. Every bound that judges a written output holds the output's own rounding,
/// `u_out·|want|` (the grouped GEMM's, the FP8 GEMM's, the MoE layer's); what is left is
/// where the value before that rounding may lie. Never for a format without infinities.
fn overflows(want: f64, bound: f64, out: Format) -> bool {
    let info = out.info();
    let before_rounding = want.abs() + bound - info.unit_roundoff() * want.abs();
    info.has_inf && before_rounding >= info.max + ulp(info.max, out) / 2.0
}

/// Lanes of [`StatsAcc`]'s sums and of the maxima of [`StatsAcc::push_slice`].
pub(crate) const LANES: usize = 8;

/// Accumulates the statistics of one slice, element by element.
///
/// `calc_diff`'s two sums are kept in [`LANES`] lanes: the `i`-th element pushed (counting
/// from 0, whichever way it came) goes to lane `i % LANES`, each lane adds its elements in
/// order, and the lanes are added in order at the end. The result depends only on the
/// sequence of elements, not on how it was split into calls, and the lanes let
/// [`StatsAcc::push_slice`] add a whole chunk in vector registers.
pub struct StatsAcc<L> {
    stats: ElementStats<L>,
    out: Format,
    sum_xy: [f64; LANES],
    sum_sq: [f64; LANES],
}

/// `lanes[l] ← max(lanes[l], xs[i])` for every `i` with `i % LANES = l` (the larger of the
/// two by `>`, so a NaN in `xs` is skipped: the callers pass none).
#[inline(always)]
pub(crate) fn lane_max(lanes: &mut [f64; LANES], xs: &[f64]) {
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        lanes[l] = if x > lanes[l] { x } else { lanes[l] };
    }
}

impl<L> StatsAcc<L> {
    /// An empty slice whose ULP distances are measured in `out`.
    pub fn new(out: Format) -> StatsAcc<L> {
        StatsAcc {
            stats: ElementStats::unchecked(0),
            out,
            sum_xy: [0.0; LANES],
            sum_sq: [0.0; LANES],
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
    /// format's overflow threshold `max + ulp(max)/2` to infinity. `ŝ` lies within the bound
    /// less its output-rounding term `u_out·|want|` of `want`, so `got = ±inf` with `want`'s
    /// sign is correct when `|want| + bound − u_out·|want|` reaches that threshold (an f16
    /// output of a product of 2^11-sized values, cuBLAS's grouped GEMM writing f16). It counts in `overflowed` and takes no part
    /// in the error statistics. The other infinity, or an infinity where the bound stays below
    /// the threshold, fails. A format without infinities never passes one.
    ///
    /// `at` locates the element, and is only kept if it is the worst so far.
    pub fn push(&mut self, at: impl FnOnce() -> L, got: f64, want: f64, bound: f64) {
        let s = &mut self.stats;
        let lane = s.elements % LANES;
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
        self.sum_xy[lane] += got * want;
        self.sum_sq[lane] += got * got + want * want;
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
        assert!(
            got.len() == want.len() && want.len() == bound.len(),
            "push_slice: {} got, {} want, {} bounds",
            got.len(),
            want.len(),
            bound.len()
        );
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor has AVX2 (checked just above).
            unsafe { self.push_slice_avx2(&at, got, want, bound) };
            return;
        }
        self.push_chunks(&at, got, want, bound);
    }

    /// [`StatsAcc::push`] for consecutive elements whose `want` and bound are all zero and whose
    /// `got` are all zero too (±0: an exact answer where the answer is exactly 0, as every
    /// element of an empty expert's weight gradient is), in one step: they count as checked
    /// and passed, the first becomes the worst element when there is none yet (with ratio 0),
    /// and nothing else changes (`calc_diff`'s sums gain ±0, which leaves a lane as it is: a
    /// lane is never −0).
    ///
    /// # Panics
    /// If the slices differ in length, or an element is not zero (in debug builds).
    pub fn push_zeros(&mut self, at: impl Fn(usize) -> L, got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "push_zeros: lengths");
        debug_assert!(
            got.iter().chain(want).all(|&x| x == 0.0),
            "push_zeros: not zeros"
        );
        let Some((&g, &w)) = got.first().zip(want.first()) else {
            return;
        };
        let s = &mut self.stats;
        s.elements += got.len();
        s.checked += got.len();
        if s.worst.is_none() {
            s.max_bound_ratio = 0.0;
            s.worst = Some(WorstElement {
                at: at(0),
                got: g,
                want: w,
                bound: 0.0,
            });
        }
    }

    /// [`StatsAcc::push_chunks`] compiled for AVX2 (the crate is built for baseline x86-64).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn push_slice_avx2(
        &mut self,
        at: &impl Fn(usize) -> L,
        got: &[f64],
        want: &[f64],
        bound: &[f64],
    ) {
        self.push_chunks(at, got, want, bound)
    }

    /// [`StatsAcc::push_slice`]'s work, a chunk of 64 elements at a time. A chunk whose
    /// `got`, `want` and differences are all finite is judged in branch-free loops: the
    /// maxima in eight lanes (a maximum is the same in any order when nothing is NaN, and
    /// nothing is: a ratio is NaN only for an infinite difference over an infinite bound),
    /// the worst element looked for only when the chunk holds a ratio above the worst so far,
    /// then in order with [`StatsAcc::push`]'s rule, and the sums each into its element's
    /// lane (see [`StatsAcc`]), eight at a time. Any other chunk goes through
    /// [`StatsAcc::push`] element by element.
    #[inline(always)]
    fn push_chunks(&mut self, at: &impl Fn(usize) -> L, got: &[f64], want: &[f64], bound: &[f64]) {
        const CHUNK: usize = 64;
        let inv = InverseUlp::of(self.out);
        let (mut err, mut ratio, mut ulps) = ([0.0f64; CHUNK], [0.0f64; CHUNK], [0.0f64; CHUNK]);
        for start in (0..got.len()).step_by(CHUNK) {
            let end = (start + CHUNK).min(got.len());
            let (g, w, b) = (&got[start..end], &want[start..end], &bound[start..end]);
            let n = g.len();
            let mut finite = g.iter().chain(w).fold(true, |ok, x| ok & x.is_finite());
            let mut failed = 0;
            for i in 0..n {
                let e = (g[i] - w[i]).abs();
                err[i] = e;
                finite &= e.is_finite();
                let ok = e <= b[i]; // false for a NaN bound, as in `push`
                failed += usize::from(!ok);
            }
            if !finite {
                for i in 0..n {
                    self.push(|| at(start + i), g[i], w[i], b[i]);
                }
                continue;
            }
            for i in 0..n {
                let (e, bi) = (err[i], b[i]);
                let q = e / bi;
                ratio[i] = if bi > 0.0 {
                    q
                } else if e == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                };
            }
            match inv {
                Some(inv) => {
                    for i in 0..n {
                        ulps[i] = err[i] * inv.at(w[i]);
                    }
                }
                None => {
                    for i in 0..n {
                        ulps[i] = err[i] / ulp(w[i], self.out);
                    }
                }
            }
            let (mut e_max, mut u_max, mut r_max) =
                ([0.0f64; LANES], [0.0f64; LANES], [0.0f64; LANES]);
            lane_max(&mut e_max, &err[..n]);
            lane_max(&mut u_max, &ulps[..n]);
            lane_max(&mut r_max, &ratio[..n]);
            let (mut xy, mut sq) = self.chunk_lanes();
            let (mut gc, mut wc) = (g.chunks_exact(LANES), w.chunks_exact(LANES));
            for (gl, wl) in (&mut gc).zip(&mut wc) {
                for l in 0..LANES {
                    xy[l] += gl[l] * wl[l];
                    sq[l] += gl[l] * gl[l] + wl[l] * wl[l];
                }
            }
            for (l, (&x, &y)) in gc.remainder().iter().zip(wc.remainder()).enumerate() {
                xy[l] += x * y;
                sq[l] += x * x + y * y;
            }
            let top = |m: [f64; LANES]| m.iter().fold(0.0f64, |t, &x| if x > t { x } else { t });
            self.commit_chunk(n, failed, (xy, sq), top(e_max), top(u_max));
            let st = &mut self.stats;
            let chunk_worst = r_max.iter().fold(0.0f64, |m, &r| if r > m { r } else { m });
            if st.worst.is_none() || chunk_worst > st.max_bound_ratio {
                for i in 0..n {
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
            }
        }
    }

    /// `calc_diff`'s sums rotated so that element `i` of a chunk judged next lands in lane
    /// `i % LANES` (its lane by count is `(elements + i) % LANES`, see [`StatsAcc`]).
    #[inline(always)]
    fn chunk_lanes(&self) -> ([f64; LANES], [f64; LANES]) {
        let first = self.stats.elements % LANES;
        (
            std::array::from_fn(|l| self.sum_xy[(first + l) % LANES]),
            std::array::from_fn(|l| self.sum_sq[(first + l) % LANES]),
        )
    }

    /// A chunk of `n` finite elements judged: its `failed`, its sums (lanes as
    /// [`StatsAcc::chunk_lanes`] gave them), and its largest error and ULP distance (kept
    /// where above the slice's so far). The worst element is the caller's.
    #[inline(always)]
    fn commit_chunk(
        &mut self,
        n: usize,
        failed: usize,
        (xy, sq): ([f64; LANES], [f64; LANES]),
        max_err: f64,
        max_ulp: f64,
    ) {
        let first = self.stats.elements % LANES;
        for l in 0..LANES {
            self.sum_xy[(first + l) % LANES] = xy[l];
            self.sum_sq[(first + l) % LANES] = sq[l];
        }
        let st = &mut self.stats;
        st.elements += n;
        st.checked += n;
        st.failed += failed;
        if max_err > st.max_abs_err {
            st.max_abs_err = max_err;
        }
        if max_ulp > st.max_ulp {
            st.max_ulp = max_ulp;
        }
    }

    pub fn finish(mut self) -> ElementStats<L> {
        let (xy, sq) = (
            self.sum_xy.iter().fold(0.0, |t, x| t + x),
            self.sum_sq.iter().fold(0.0, |t, x| t + x),
        );
        self.stats.calc_diff = if sq == 0.0 { 0.0 } else { 1.0 - 2.0 * xy / sq };
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

#[path = "stats_bounded.rs"]
mod bounded;
pub(crate) use bounded::{zero_ratio, Held, Linear};

#[cfg(test)]
#[path = "stats_tests.rs"]
mod tests;
