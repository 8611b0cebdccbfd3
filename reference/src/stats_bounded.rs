//! [`StatsAcc::push_bounded`]: judging a run of elements whose bounds are computed from a
//! second input, with the bound's teeth beside the statistics: what a full verification of
//! the grouped GEMM does for every element (the bound from the magnitude `Σ|a·b|` and the
//! value, the teeth `|want| / bound`).
//!
//! With AVX-512F, and an output format whose ULPs have representable inverses (all but f64),
//! one sweep of eight-lane vectors does what the bounds, their teeth and
//! [`StatsAcc::push_slice`] do in three: the same statistics, bit for bit, in the same order
//! (tests check it against [`StatsAcc::push`]). Elsewhere the three run one after another.

use super::{lane_max, InverseUlp, StatsAcc, WorstElement, LANES};

/// A bound linear in the reference and a second input `aux` (the grouped GEMM's magnitude
/// `Σ|a·b|`): `value·|want| + floor + magnitude·aux + underflow`, evaluated in that order,
/// and 0 where `aux` is 0 (an empty sum: the answer is exact).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Linear {
    pub(crate) value: f64,
    pub(crate) floor: f64,
    pub(crate) magnitude: f64,
    pub(crate) underflow: f64,
}

impl Linear {
    /// The bound of one element.
    #[inline(always)]
    pub(crate) fn at(&self, aux: f64, want: f64) -> f64 {
        // Both sides computed and one selected (no branch, so a loop over a row vectorises);
        // the formula's NaN for a vacuous bound times a zero `aux` is never selected.
        let b = self.value * want.abs() + self.floor + self.magnitude * aux + self.underflow;
        if aux == 0.0 {
            0.0
        } else {
            b
        }
    }
}

/// `|want| / bound` for one element, the bound's teeth (the grouped GEMM reports its maximum
/// as `zero_ratio`, full and fast verification alike): 0 where `want` is 0 or not finite, the
/// smallest normal where the bound is infinite or NaN (vacuous: zeros would pass, by no margin
/// anyone should rely on), +inf where it is 0 (zeros fail unless `want` is 0). Never NaN.
///
/// Every case is computed and one selected, without branches, so that a loop over a row
/// vectorises.
#[inline(always)]
pub(crate) fn zero_ratio(want: f64, bound: f64) -> f64 {
    let w = want.abs();
    let q = w / bound;
    let by_bound = if bound > 0.0 { q } else { f64::INFINITY };
    let by_bound = if bound.is_infinite() || bound.is_nan() {
        f64::MIN_POSITIVE
    } else {
        by_bound
    };
    if w == 0.0 || !w.is_finite() {
        0.0
    } else {
        by_bound
    }
}

/// What [`StatsAcc::push_bounded`] finds beside the statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Swept {
    /// The largest [`zero_ratio`] of the run, and the `start` it was given.
    pub(crate) teeth: f64,
    /// Outputs that are finite and not zero.
    pub(crate) nonzero: usize,
}

/// What an output element may be held in: f32 or f64.
pub(crate) trait Held: Copy + Into<f64> + 'static {}
impl Held for f32 {}
impl Held for f64 {}

impl<L> StatsAcc<L> {
    /// [`StatsAcc::push_slice`] for `got[i]` against `want[i]` within
    /// `bound.at(aux[i], want[i])`, located by `at(i)`; returns the largest
    /// [`zero_ratio`]`(want[i], bound)` and `start`, and how many `got` are finite and not 0.
    ///
    /// # Panics
    /// If the slices differ in length.
    pub(crate) fn push_bounded<G: Held>(
        &mut self,
        at: impl Fn(usize) -> L,
        got: &[G],
        want: &[f64],
        aux: &[f64],
        bound: Linear,
        start: f64,
    ) -> Swept {
        assert!(
            got.len() == want.len() && want.len() == aux.len(),
            "push_bounded: {} got, {} want, {} aux",
            got.len(),
            want.len(),
            aux.len()
        );
        #[cfg(target_arch = "x86_64")]
        if let Some(inv) = InverseUlp::of(self.out) {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the processor has AVX-512F (checked just above).
                return unsafe { self.sweep_avx512(&at, got, want, aux, bound, inv, start) };
            }
        }
        let got: Vec<f64> = got.iter().map(|&g| g.into()).collect();
        let nonzero = got.iter().filter(|g| g.is_finite() && **g != 0.0).count();
        let bounds: Vec<f64> = want
            .iter()
            .zip(aux)
            .map(|(&w, &x)| bound.at(x, w))
            .collect();
        let teeth: Vec<f64> = want
            .iter()
            .zip(&bounds)
            .map(|(&w, &b)| zero_ratio(w, b))
            .collect();
        let mut lanes = [start; LANES];
        lane_max(&mut lanes, &teeth);
        self.push_slice(at, &got, want, &bounds);
        Swept {
            teeth: lanes.iter().fold(start, |t, &z| if z > t { z } else { t }),
            nonzero,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{zero_ratio, Held, InverseUlp, Linear, StatsAcc, Swept, WorstElement, LANES};

    /// Elements judged per step: a chunk whose elements are all finite is taken whole.
    const CHUNK: usize = 64;

    impl<L> StatsAcc<L> {
        /// [`StatsAcc::push_bounded`]'s sweep, [`CHUNK`] elements at a time in eight-lane
        /// vectors: the bounds, the differences, the failures, the ULP distances
        /// (`inv`), the maxima (per lane: nothing is NaN when the chunk is finite), the teeth
        /// and `calc_diff`'s sums (each element into its lane, see [`StatsAcc`]), every
        /// operation the one [`StatsAcc::push`] does, in its order (no fused multiply-adds).
        /// A chunk with a NaN or ±inf then goes through [`StatsAcc::push`] element by element
        /// with the bounds just computed (its teeth count either way); so do the last
        /// `len % 8` elements.
        ///
        /// # Safety
        /// The CPU must have AVX-512F.
        #[target_feature(enable = "avx512f")]
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn sweep_avx512<G: Held>(
            &mut self,
            at: &impl Fn(usize) -> L,
            got: &[G],
            want: &[f64],
            aux: &[f64],
            bound: Linear,
            inv: InverseUlp,
            start: f64,
        ) -> Swept {
            let narrow = std::mem::size_of::<G>() == 4; // f32, else f64 (`Held`)
            use _mm512_abs_pd as abs;
            use _mm512_set1_pd as v;
            let (inf, zero) = (v(f64::INFINITY), _mm512_setzero_pd());
            /// Lanes whose value is finite.
            #[target_feature(enable = "avx512f")]
            #[inline]
            fn finite(x: __m512d) -> __mmask8 {
                _mm512_cmp_pd_mask::<_CMP_LT_OQ>(_mm512_abs_pd(x), _mm512_set1_pd(f64::INFINITY))
            }
            let mut bounds = [0.0f64; CHUNK];
            let mut teeth = v(start);
            let mut nonzero = 0;
            let whole = got.len() - got.len() % LANES;
            for first in (0..whole).step_by(CHUNK) {
                let n = CHUNK.min(whole - first);
                let (x, q) = self.chunk_lanes();
                // SAFETY: eight values each.
                let (mut xy, mut sq) =
                    unsafe { (_mm512_loadu_pd(x.as_ptr()), _mm512_loadu_pd(q.as_ptr())) };
                let (mut e_max, mut u_max) = (zero, zero);
                // Whether an element may beat the worst ratio so far, `m`: an exact element
                // (ratio 0) never does; where the bound is not above 0 (NaN included) the
                // ratio is +inf; otherwise `e / b` rounded is above `m` only if `e > m·b`
                // exactly, and then `e >= fl(m·b)` (rounding is monotone, `e` a float; an
                // `m·b` past the largest float leaves `e / b` below `m`). No division for the
                // others; a chunk holding one is looked through with the ratios computed
                // exactly.
                let m = v(self.stats.max_bound_ratio);
                let mut beats = self.stats.worst.is_none();
                let (mut all_finite, mut failed) = (true, 0u32);
                for c in (0..n).step_by(LANES) {
                    let i = first + c;
                    // SAFETY: elements i..i + 8 < len of every slice; `G` is f32 or f64.
                    let (g, w, x) = unsafe {
                        let g = if narrow {
                            _mm512_cvtps_pd(_mm256_loadu_ps(got.as_ptr().add(i).cast()))
                        } else {
                            _mm512_loadu_pd(got.as_ptr().add(i).cast())
                        };
                        let w = _mm512_loadu_pd(want.as_ptr().add(i));
                        (g, w, _mm512_loadu_pd(aux.as_ptr().add(i)))
                    };
                    // The bound (`Linear::at`), 0 where aux is 0.
                    let b = _mm512_add_pd(
                        _mm512_add_pd(
                            _mm512_add_pd(_mm512_mul_pd(v(bound.value), abs(w)), v(bound.floor)),
                            _mm512_mul_pd(v(bound.magnitude), x),
                        ),
                        v(bound.underflow),
                    );
                    let b =
                        _mm512_mask_blend_pd(_mm512_cmp_pd_mask::<_CMP_EQ_OQ>(x, zero), b, zero);
                    let e = abs(_mm512_sub_pd(g, w));
                    let counted = finite(g) & _mm512_cmp_pd_mask::<_CMP_NEQ_UQ>(g, zero);
                    nonzero += counted.count_ones() as usize;
                    all_finite &= finite(g) & finite(w) & finite(e) == 0xff;
                    failed += (!_mm512_cmp_pd_mask::<_CMP_LE_OQ>(e, b)).count_ones();
                    // Whether it may beat the worst so far (above): its ratio is e / b where
                    // b > 0, else 0 (e = 0) or +inf.
                    let positive = _mm512_cmp_pd_mask::<_CMP_GT_OQ>(b, zero);
                    let not_exact = _mm512_cmp_pd_mask::<_CMP_NEQ_UQ>(e, zero);
                    let reach = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(e, _mm512_mul_pd(m, b));
                    beats |= (not_exact & (reach | !positive)) != 0;
                    // The teeth (`zero_ratio`), computed only where a lane's may be above
                    // that lane's largest so far, `t`: as for the ratios above, `|w| / b`
                    // rounded is above `t` only if `|w| >= fl(t·b)`; a lane whose teeth are
                    // +inf or the smallest normal is looked at whatever `t` is, one whose
                    // teeth are 0 never (0 raises no maximum). Where no lane may be, the
                    // maximum stays as it is, with no division.
                    let aw = abs(w);
                    let vacuous = !finite(b);
                    let nothing = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(aw, zero) | !finite(aw);
                    let above = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(aw, _mm512_mul_pd(teeth, b));
                    if !nothing & (above | !positive | vacuous) != 0 {
                        let z = _mm512_mask_blend_pd(positive, inf, _mm512_div_pd(aw, b));
                        let z = _mm512_mask_blend_pd(vacuous, z, v(f64::MIN_POSITIVE));
                        let z = _mm512_mask_blend_pd(nothing, z, zero);
                        teeth = _mm512_max_pd(z, teeth);
                    }
                    // ULPs: `e · inv.at(w)`.
                    let u = _mm512_mul_pd(e, inverse_ulp(inv, w));
                    e_max = _mm512_max_pd(e, e_max);
                    u_max = _mm512_max_pd(u, u_max);
                    xy = _mm512_add_pd(xy, _mm512_mul_pd(g, w));
                    sq = _mm512_add_pd(sq, _mm512_add_pd(_mm512_mul_pd(g, g), _mm512_mul_pd(w, w)));
                    // SAFETY: elements c..c + 8 <= CHUNK of the chunk's buffers.
                    unsafe {
                        _mm512_storeu_pd(bounds.as_mut_ptr().add(c), b);
                    }
                }
                if !all_finite {
                    for (c, &b) in bounds[..n].iter().enumerate() {
                        let i = first + c;
                        self.push(|| at(i), got[i].into(), want[i], b);
                    }
                    continue;
                }
                let (mut x, mut q) = ([0.0f64; LANES], [0.0f64; LANES]);
                // SAFETY: eight values each.
                unsafe {
                    _mm512_storeu_pd(x.as_mut_ptr(), xy);
                    _mm512_storeu_pd(q.as_mut_ptr(), sq);
                }
                let (e_top, u_top) = (_mm512_reduce_max_pd(e_max), _mm512_reduce_max_pd(u_max));
                self.commit_chunk(n, failed as usize, (x, q), e_top, u_top);
                let st = &mut self.stats;
                if beats {
                    for (c, &b) in bounds[..n].iter().enumerate() {
                        let i = first + c;
                        let (g, w): (f64, f64) = (got[i].into(), want[i]);
                        let e = (g - w).abs();
                        let ratio = if b > 0.0 {
                            e / b
                        } else if e == 0.0 {
                            0.0
                        } else {
                            f64::INFINITY
                        };
                        if st.worst.is_none() || ratio > st.max_bound_ratio {
                            st.max_bound_ratio = ratio;
                            st.worst = Some(WorstElement {
                                at: at(i),
                                got: got[i].into(),
                                want: want[i],
                                bound: bounds[c],
                            });
                        }
                    }
                }
            }
            let mut top = _mm512_reduce_max_pd(teeth);
            for i in whole..got.len() {
                let (g, b) = (got[i].into(), bound.at(aux[i], want[i]));
                let z = zero_ratio(want[i], b);
                top = if z > top { z } else { top };
                nonzero += usize::from(g.is_finite() && g != 0.0);
                self.push(|| at(i), g, want[i], b);
            }
            Swept {
                teeth: top,
                nonzero,
            }
        }
    }

    /// [`InverseUlp::at`] of eight finite values: `1 / ulp(x)` as the bits of a power of two.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn inverse_ulp(inv: InverseUlp, x: __m512d) -> __m512d {
        {
            let a = _mm512_min_pd(_mm512_abs_pd(x), _mm512_set1_pd(inv.max));
            let biased = _mm512_and_si512(
                _mm512_srli_epi64::<52>(_mm512_castpd_si512(a)),
                _mm512_set1_epi64(0x7ff),
            );
            let subnormal = _mm512_cmpeq_epi64_mask(biased, _mm512_setzero_si512());
            let e = _mm512_mask_blend_epi64(
                subnormal,
                _mm512_sub_epi64(biased, _mm512_set1_epi64(1023)),
                _mm512_set1_epi64(-1075),
            );
            let k = _mm512_sub_epi64(
                _mm512_set1_epi64(i64::from(inv.mantissa_bits)),
                _mm512_max_epi64(e, _mm512_set1_epi64(i64::from(inv.emin))),
            );
            _mm512_castsi512_pd(_mm512_slli_epi64::<52>(_mm512_add_epi64(
                k,
                _mm512_set1_epi64(1023),
            )))
        }
    }
}

#[cfg(test)]
#[path = "stats_bounded_tests.rs"]
mod tests;
