//! The magnitudes `s = Σ_p |a[i, p]|·|b[p, j]|` of the f64 kernel ([`super::kernel`]) summed
//! in f32 from operands rounded up to bf16, beside the values in f64, in one register tile:
//! [`super::isa::Isa::Avx512F32Mag`].
//!
//! ## Why
//! A full check needs, for every element, the value `y = Σ a·b` and the magnitude `S` its bound
//! scales with. In f64 the magnitudes cost as many fused multiply-adds as the values. A bound
//! does not need `S` to 53 bits, only a certified upper bound of it a little above it: an f32
//! fused multiply-add takes 16 products against the f64 one's 8, so the magnitudes cost half
//! of the values instead of as much. (This path first used `vdpbf16ps`, 32 bf16 products an
//! instruction; on the Xeon the README's figures come from, under a hypervisor, it ran at
//! under half the f32 multiply-adds' rate, no faster than the f64 sums, and the tile that
//! carried it took 1.8 – 1.9 times the values alone, against about 1.5 now.) The operands
//! are still rounded up to bf16, so that the ranges that certify the run (step 2) are the AMX
//! path's ([`super::amx`]); the sums differ from that instruction's in their last bits (a
//! report's bounds moved in their tenth significant digit), each within step 4's inflation.
//!
//! ## The upper bound, derived
//! 1. Every `|x|` is rounded **up** to bf16 (to f32 upwards, then the low 16 bits carried into
//!    the top 16). So each `x̄ >= |x|` and `S̄ = Σ ā·b̄ >= S`. For inputs held in bf16
//!    (moecheck's bf16 cases) `x̄ = |x|`; otherwise `x̄ <= |x|·(1 + 2^-7)`.
//! 2. A product of two bf16 has 16 significant bits, so it is exact in f32 unless it underflows
//!    or overflows (the fused multiply-add forms it exactly in any case); every partial sum of
//!    non-negative terms lies between its largest term and `S̄`. A subnormal input or result
//!    would be read or rounded with an absolute error, not a relative one (or flushed to 0
//!    where MXCSR says so, as the dot-product instructions always do). So the run is kept only
//!    when the operands' rounded magnitudes (their ranges are gathered while they are packed)
//!    guarantee none of that happens: every non-zero `x̄ >= 2^-126` (normal),
//!    `min ā·min b̄ >= 2^-126` over the non-zero ones (no product flushed),
//!    `k·max ā·max b̄ < 2^127` (no sum overflows), nothing infinite or NaN, and
//!    `(k + 1)·2^-23 <= 1/2`; and the thread does not flush subnormals (MXCSR's FTZ and DAZ
//!    off, their default: the rounding of `b` obeys them). Otherwise the whole product is
//!    computed on the [`super::isa::Isa::Avx512`] path instead, f64 magnitudes included.
//! 3. The sums: within a `KC`-deep band, in f32, one fused multiply-add a product in
//!    increasing `p`, each step rounded once (round to nearest even; any faithful rounding,
//!    `u <= 2^-23`, is assumed); the band's sum is widened exactly and the bands added
//!    in f64 (`u = 2^-53`). Each product meets at most `d = min(k, KC) + ceil(k/KC) - 1 <= k + 1`
//!    roundings, each of a non-negative sum, so the computed `ŝ >= S̄·(1 - u)^d`, and
//!    `S <= S̄ <= ŝ/(1 - u)^d <= ŝ·(1 + γ(k + 1, 2^-23))`.
//! 4. The kernel stores `s = fl(ŝ·F)` with `F = 1 + γ(k + 1, 2^-23) + 2^-50`, whose own
//!    rounding the `2^-50` covers (`F·(1 - 2^-53) >= 1 + γ`): **`s >= S`** for every element,
//!    and `s <= S̄·F²`, about `S̄·(1 + 2γ(k + 1, 2^-23))` (5e-4 above at K = 2048). `s = 0` exactly
//!    when every product is 0 (a non-zero product is at least 2^-126 and never flushed), as
//!    the bound's exact-zero rule needs.
//!
//! Column tiles narrower than 16 at the right edge are computed by the f64 path and scaled by
//! the same `F`, which covers its `γ(k, 2^-53)`: the whole `s` is an upper bound of `S`. The
//! values `c` are the f64 kernel's, bit for bit (the same fused multiply-adds in the same
//! order). Products under 8 rows or 256 columns ([`pays`]: fast verification's sampled rows
//! and columns, an expert of a few rows) take the f64 path whole, f64 magnitudes included:
//! there the copies this path makes cost more than the multiply-adds it saves.

use std::arch::x86_64::*;

use super::band::{pack_b, Band, Shape, KC, MC};
pub(super) use super::operand::up;
use super::operand::Operand;
use crate::format::gamma;
use pack::{pack_a_pairs, pair_rows};

#[path = "bf16mag_pack.rs"]
mod pack;

/// Rows of the register tile: 16 value accumulators (8 × 16 f64), 8 magnitude accumulators
/// (8 × 16 f32), a pair of the band's rows (4), their magnitudes (2) and a broadcast fit the
/// 32 registers (6 rows, the tile the dot-product instruction had, ran about 10% slower).
const MR: usize = 8;
/// Columns of the register tile.
const NR: usize = 16;

/// [`up`] of 16 values, `lo` the first 8 and `hi` the last 8, each in the low half of its
/// lane: the conversion to f32 rounds upwards itself.
#[inline(always)]
pub(super) unsafe fn up16(lo: __m512d, hi: __m512d) -> __m512i {
    const UP: i32 = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC;
    unsafe {
        let (l, h) = (
            _mm512_cvt_roundpd_ps::<UP>(_mm512_abs_pd(lo)),
            _mm512_cvt_roundpd_ps::<UP>(_mm512_abs_pd(hi)),
        );
        // The upper half through f64 lanes: `insertf64x4` is AVX-512F (`insertf32x8` needs DQ).
        let f = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castps_pd(_mm512_castps256_ps512(l)),
            _mm256_castps_pd(h),
        ));
        _mm512_srli_epi32::<16>(_mm512_add_epi32(
            _mm512_castps_si512(f),
            _mm512_set1_epi32(0xffff),
        ))
    }
}

/// The range of an operand's magnitudes rounded up to bf16, as bf16 bits (which order as
/// the values do): gathered as they are packed. A NaN or an infinity makes `hi >= 0x7f80`.
#[derive(Clone, Copy)]
pub(super) struct Range {
    /// Smallest non-zero (`u32::MAX` if none).
    pub(super) lo: u32,
    /// Largest.
    pub(super) hi: u32,
}

impl Range {
    pub(super) const EMPTY: Range = Range {
        lo: u32::MAX,
        hi: 0,
    };

    #[inline(always)]
    pub(super) fn see(&mut self, bits: u32) {
        self.lo = if bits != 0 && bits < self.lo {
            bits
        } else {
            self.lo
        };
        self.hi = if bits > self.hi { bits } else { self.hi };
    }

    pub(super) fn join(self, o: Range) -> Range {
        Range {
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
        }
    }
}

/// A [`Range`] gathered sixteen bf16 bit patterns (one a 32-bit lane) at a time: per lane the
/// largest bits and the smallest of `bits - 1` (wrapping: a zero becomes the largest, so
/// that zeros drop out of a plain minimum).
#[derive(Clone, Copy)]
pub(super) struct Lanes {
    below: __m512i,
    top: __m512i,
}

impl Lanes {
    /// Nothing seen.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[inline(always)]
    pub(super) unsafe fn new() -> Lanes {
        // SAFETY: AVX-512F (the caller's).
        unsafe {
            Lanes {
                below: _mm512_set1_epi32(-1),
                top: _mm512_setzero_si512(),
            }
        }
    }

    /// # Safety
    /// The CPU must have AVX-512F.
    #[inline(always)]
    pub(super) unsafe fn see(&mut self, bits: __m512i) {
        // SAFETY: AVX-512F (the caller's).
        unsafe {
            self.below = _mm512_min_epu32(self.below, _mm512_sub_epi32(bits, _mm512_set1_epi32(1)));
            self.top = _mm512_max_epu32(self.top, bits);
        }
    }

    /// What the lanes saw, as a [`Range`].
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[inline(always)]
    pub(super) unsafe fn range(self) -> Range {
        // SAFETY: AVX-512F (the caller's).
        let (below, top) = unsafe {
            (
                _mm512_reduce_min_epu32(self.below),
                _mm512_reduce_max_epu32(self.top),
            )
        };
        Range {
            lo: if below == u32::MAX {
                u32::MAX
            } else {
                below + 1
            },
            hi: top,
        }
    }
}

/// The value of bf16 bits.
fn value(bits: u32) -> f64 {
    f64::from(f32::from_bits(bits << 16))
}

/// Whether magnitudes from operands of ranges `a` and `b` over `k` products meet step 2.
pub(super) fn certified(a: Range, b: Range, k: usize) -> bool {
    let nothing = a.hi == 0 || b.hi == 0;
    let finite = a.hi < 0x7f80 && b.hi < 0x7f80;
    let min_normal = 0x0080; // 2^-126
    finite
        && (k as f64 + 1.0) * 2f64.powi(-23) <= 0.5
        && (nothing
            || (a.lo >= min_normal
                && b.lo >= min_normal
                && value(a.lo) * value(b.lo) >= 2f64.powi(-126)
                && k as f64 * value(a.hi) * value(b.hi) < 2f64.powi(127)))
}

/// Whether an `m × n` product is worth the path: its copies (each row of `a` rounded and
/// paired once per band, each band tile of `b` once per block of rows) cost more than the
/// f64 magnitudes' extra multiply-adds they save unless they are shared by enough column tiles
/// (`n`) and rows (`m`). Fast verification's sampled rows and columns (a few dozen) stay on
/// the f64 path, where this path had made them slower.
///
/// In this crate's unit tests the path runs whatever the shape, so that their small products
/// exercise it; [`worth_it`] is the rule itself.
pub(super) fn pays(m: usize, n: usize) -> bool {
    cfg!(test) || worth_it(m, n)
}

fn worth_it(m: usize, n: usize) -> bool {
    m >= 8 && n >= 256
}

/// `F` of step 4 for `k` products.
pub fn inflation(k: usize) -> f64 {
    1.0 + gamma(k + 1, 2f64.powi(-23)) + 2f64.powi(-50)
}

/// `c ← a·b` in f64 and `s ≥ Σ|a|·|b|` as the module doc derives. Returns `false`, having
/// written nothing that counts, when the operands fall outside step 2: the caller then runs
/// the f64 path.
///
/// # Safety
/// As for the kernel's `body` (`s.s` not null); the CPU must have AVX-512F and FMA.
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn run<B: Operand>(s: &Shape<B>, edge: impl FnOnce(&Shape<B>)) -> bool {
    if flushes_subnormals() {
        return false;
    }
    let full = s.n - s.n % NR;
    // Buffers for the widest band and the tallest block this product has (a short product's
    // would otherwise be mostly buffer to clear).
    let (depth, rows) = (KC.min(s.k).next_multiple_of(2), MC.min(s.m));
    let mut packed = vec![0.0f64; depth * NR];
    let mut b2 = vec![0.0f32; depth * NR];
    let mut a2 = vec![0.0f32; depth * rows];
    let mut a_vals = vec![0.0f64; depth * rows];
    let (mut ra, mut rb) = (Range::EMPTY, Range::EMPTY);
    let f = inflation(s.k);
    let mut pc = 0;
    while pc < s.k {
        let kc = KC.min(s.k - pc);
        let kp = kc.div_ceil(2);
        let mut ic = 0;
        while ic < s.m {
            let mc = MC.min(s.m - ic);
            // SAFETY: rows ic..ic + mc, columns pc..pc + kc of a.
            let block = Band {
                pc,
                kc,
                ic,
                mc,
                jr: 0,
            };
            unsafe { pack_a_pairs(s, &block, &mut a2, &mut a_vals, &mut ra) };
            let mut jr = 0;
            while jr < full {
                let band = Band { pc, kc, ic, mc, jr };
                // SAFETY: columns jr..jr + 16 <= n of the band.
                unsafe {
                    pack_b::<B, NR, false>(s, &band, &mut packed, &mut []);
                    let seen = pair_rows(&packed[..kc * NR], kc, &mut b2[..2 * kp * NR]);
                    rb = rb.join(seen);
                }
                let mut ir = ic;
                while ir < ic + mc {
                    let mr = MR.min(ic + mc - ir);
                    let t = Tile {
                        kc,
                        a: a_vals[2 * (ir - ic) * kp..].as_ptr(),
                        b: packed.as_ptr(),
                        b2: b2.as_ptr(),
                        a2: a2[2 * (ir - ic) * kp..].as_ptr(),
                        // SAFETY: rows ir.., columns jr.. of c and s.
                        c: unsafe { s.c.offset(ir as isize * s.ldc + jr as isize) },
                        ldc: s.ldc,
                        s: unsafe { s.s.offset(ir as isize * s.lds + jr as isize) },
                        lds: s.lds,
                        first: pc == 0,
                        last: pc + kc == s.k,
                        f,
                    };
                    // SAFETY: the tile's rows and columns lie inside a, c and s.
                    unsafe { tile_rows(mr, &t) };
                    ir += MR;
                }
                jr += NR;
            }
            ic += mc;
        }
        pc += kc;
    }
    if !certified(ra, rb, s.k) {
        return false;
    }
    if full < s.n {
        let rest = Shape {
            n: s.n - full,
            b: s.b.wrapping_offset(full as isize * s.csb),
            c: s.c.wrapping_add(full),
            s: s.s.wrapping_add(full),
            ..*s
        };
        edge(&rest);
        for i in 0..s.m {
            for j in 0..rest.n {
                // SAFETY: row i < m, column full + j < n of s.
                unsafe { *rest.s.offset(i as isize * s.lds + j as isize) *= f };
            }
        }
    }
    true
}

/// Whether this thread's SSE control word flushes subnormal results to zero or reads
/// subnormal inputs as zero (FTZ, DAZ; off by default, set by code built with `-ffast-math`
/// in a host process): the conversion to f32 that rounds `b` up obeys them, and would turn a
/// value in f32's subnormal range into 0, which the ranges take for an exact zero. The path
/// is then not taken.
pub(super) fn flushes_subnormals() -> bool {
    const FTZ: u32 = 1 << 15;
    const DAZ: u32 = 1 << 6;
    control_word() & (FTZ | DAZ) != 0
}

/// This thread's SSE control word (MXCSR).
fn control_word() -> u32 {
    let mut csr: u32 = 0;
    // SAFETY: `stmxcsr` stores the 32-bit control word at the given address, nothing else.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
    }
    csr
}

/// One `mr × 16` tile over one band: the tile's values of `a` in pairs (`a`), the band's
/// values packed in rows of 16 (`b`), its magnitudes so (`b2`) and the tile's `|a|` in pairs
/// (`a2`), as [`pair_rows`] and [`pack_a_pairs`] lay them out.
struct Tile {
    kc: usize,
    /// The tile's values of `a` in pairs, as [`pack_a_pairs`] lays them out.
    a: *const f64,
    b: *const f64,
    b2: *const f32,
    a2: *const f32,
    c: *mut f64,
    ldc: isize,
    s: *mut f64,
    lds: isize,
    first: bool,
    last: bool,
    f: f64,
}

#[inline(always)]
unsafe fn tile_rows(mr: usize, t: &Tile) {
    unsafe {
        match mr {
            1 => tile::<1>(t),
            2 => tile::<2>(t),
            3 => tile::<3>(t),
            4 => tile::<4>(t),
            5 => tile::<5>(t),
            6 => tile::<6>(t),
            7 => tile::<7>(t),
            8 => tile::<8>(t),
            _ => unreachable!("tile with {mr} rows, at most {MR}"),
        }
    }
}

/// `c[i, j] (=|+=) Σ_p a[i, p]·b[p, j]` in f64 fused multiply-adds in increasing `p` (the f64
/// kernel's order and bits), and the magnitudes' sums in f32 fused multiply-adds, in the same
/// order, widened and stored (`=`) or added (`+=`) into `s`, times `F` after the last band.
#[target_feature(enable = "avx512f,fma")]
#[inline(never)]
unsafe fn tile<const R: usize>(t: &Tile) {
    unsafe {
        let mut acc = [[_mm512_setzero_pd(); 2]; R];
        let mut mag = [_mm512_setzero_ps(); R];
        // Pair `pp` of row `i`: its column `2pp + h`, of the values and of the magnitudes.
        let at = |i: usize, pp: usize, h: usize| 2 * (pp * R + i) + h;
        let pairs = t.kc / 2;
        for pp in 0..pairs {
            let p = 2 * pp;
            let row = |q: usize, h: usize| _mm512_loadu_pd(t.b.add(q * NR + 8 * h));
            let (b00, b01, b10, b11) = (row(p, 0), row(p, 1), row(p + 1, 0), row(p + 1, 1));
            let m0 = _mm512_loadu_ps(t.b2.add(p * NR));
            let m1 = _mm512_loadu_ps(t.b2.add((p + 1) * NR));
            for (i, (x, m)) in acc.iter_mut().zip(mag.iter_mut()).enumerate() {
                let a0 = _mm512_set1_pd(*t.a.add(at(i, pp, 0)));
                x[0] = _mm512_fmadd_pd(a0, b00, x[0]);
                x[1] = _mm512_fmadd_pd(a0, b01, x[1]);
                let a1 = _mm512_set1_pd(*t.a.add(at(i, pp, 1)));
                x[0] = _mm512_fmadd_pd(a1, b10, x[0]);
                x[1] = _mm512_fmadd_pd(a1, b11, x[1]);
                *m = _mm512_fmadd_ps(_mm512_set1_ps(*t.a2.add(at(i, pp, 0))), m0, *m);
                *m = _mm512_fmadd_ps(_mm512_set1_ps(*t.a2.add(at(i, pp, 1))), m1, *m);
            }
        }
        if t.kc % 2 == 1 {
            // The last row of an odd band: its pair's second half is past the band.
            let (p, pp) = (t.kc - 1, pairs);
            let (b0, b1) = (
                _mm512_loadu_pd(t.b.add(p * NR)),
                _mm512_loadu_pd(t.b.add(p * NR + 8)),
            );
            let m0 = _mm512_loadu_ps(t.b2.add(p * NR));
            for (i, (x, m)) in acc.iter_mut().zip(mag.iter_mut()).enumerate() {
                let a0 = _mm512_set1_pd(*t.a.add(at(i, pp, 0)));
                x[0] = _mm512_fmadd_pd(a0, b0, x[0]);
                x[1] = _mm512_fmadd_pd(a0, b1, x[1]);
                *m = _mm512_fmadd_ps(_mm512_set1_ps(*t.a2.add(at(i, pp, 0))), m0, *m);
            }
        }
        for (i, (x, m)) in acc.iter().zip(&mag).enumerate() {
            let c = t.c.offset(i as isize * t.ldc);
            let s = t.s.offset(i as isize * t.lds);
            for (h, v) in x.iter().enumerate() {
                let at = c.add(8 * h);
                let v = if t.first {
                    *v
                } else {
                    _mm512_add_pd(_mm512_loadu_pd(at), *v)
                };
                _mm512_storeu_pd(at, v);
            }
            let halves = [
                _mm512_cvtps_pd(_mm512_castps512_ps256(*m)),
                _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                    _mm512_castps_pd(*m),
                ))),
            ];
            for (h, x) in halves.into_iter().enumerate() {
                band_sum(s.add(8 * h), x, t.first, t.last, t.f);
            }
        }
    }
}

/// Eight magnitudes' band sums `x` into `s`: stored (the `first` band) or added to what is
/// there, and times `f` after the `last` (step 4). Both bf16 paths store their sums so.
///
/// # Safety
/// `s` must hold eight values; the CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn band_sum(s: *mut f64, x: __m512d, first: bool, last: bool, f: f64) {
    unsafe {
        let v = if first {
            x
        } else {
            _mm512_add_pd(_mm512_loadu_pd(s), x)
        };
        let v = if last {
            _mm512_mul_pd(v, _mm512_set1_pd(f))
        } else {
            v
        };
        _mm512_storeu_pd(s, v);
    }
}

#[cfg(test)]
#[path = "bf16mag_tests.rs"]
mod tests;
