//! Correctly rounded casts from f64 to every [`Format`].

use super::kind::{pow2, Format, Overflow};

/// `γ(d, u) = d·u / (1 - d·u)`, or `+inf` when `d·u >= 1`: the relative error of `d`
/// successive roundings with unit roundoff `u` (Higham, *Accuracy and Stability of Numerical
/// Algorithms*, lemma 3.1), on which every bound of a sum rests.
pub fn gamma(d: usize, u: f64) -> f64 {
    let du = d as f64 * u;
    if du >= 1.0 {
        f64::INFINITY
    } else {
        du / (1.0 - du)
    }
}

/// Rounds `x` to the nearest value of `format`, ties to even, with gradual underflow.
///
/// Formula: with `e = max(floor(log2 |x|), emin)` and quantum `q = 2^(e - p + 1)`,
/// `fl(x) = q · round_ties_even(x / q)` (both steps exact in f64 for every format here). Then
/// overflow is handled per `overflow`: a rounded magnitude above `max` becomes ±inf (formats
/// with infinities) or NaN (E4M3) under [`Overflow::Ieee`], and ±max under
/// [`Overflow::Saturate`]; ±inf maps the same way. NaN stays NaN. The sign of zero is kept.
///
/// Reads only `x`. Error: `|fl(x) - x| <= u|x| + η/2` when no overflow happens (see the
/// [module docs](super)). Follows IEEE 754 roundTiesToEven, ml_dtypes' `astype` for
/// [`Overflow::Ieee`] and PTX `cvt.rn.satfinite` for [`Overflow::Saturate`].
///
/// ```
/// use moecheck_reference::format::{round_to, Format, Overflow};
/// assert_eq!(round_to(464.0, Format::E4m3, Overflow::Ieee), 448.0); // tie to even
/// assert!(round_to(465.0, Format::E4m3, Overflow::Ieee).is_nan()); // rounds to 480 > max
/// assert_eq!(round_to(1e9, Format::E4m3, Overflow::Saturate), 448.0);
/// assert_eq!(round_to(1.0 + 1.0 / 256.0, Format::Bf16, Overflow::Ieee), 1.0);
/// ```
///
/// Inlined (its fast path is a few integer operations, and generating a case calls it once per
/// value); the general path stays out of line.
#[inline]
pub fn round_to(x: f64, format: Format, overflow: Overflow) -> f64 {
    if format == Format::F64 || x.is_nan() {
        return x;
    }
    let info = format.info();
    // Fast path, same result: a finite `x` in the normal range rounds by integer arithmetic on
    // its f64 bits — add half a quantum (minus one, plus the kept lowest bit: ties to even) to
    // the dropped bits and clear them; a carry out of the mantissa moves into the exponent,
    // which is exactly the next binade. A result above `max` (or `x` below the smallest
    // normal) takes the general path below.
    if x.is_finite() && x.abs() >= pow2(info.emin) {
        let shift = 52 - info.mantissa_bits;
        let bits = x.to_bits();
        let half = (1u64 << (shift - 1)) - 1 + ((bits >> shift) & 1);
        let r = f64::from_bits((bits + half) & !((1u64 << shift) - 1));
        if r.abs() <= info.max {
            return r;
        }
    }
    round_general(x, format, overflow)
}

/// [`round_to`] of every value of `src`, into `dst` (the same bits), for bulk work
/// (generating a case rounds billions of values).
///
/// Every value goes through one branch-free formula that the compiler vectorises (AVX2 where
/// the processor has it): [`round_to`]'s integer rounding of the f64 bits for a result in the
/// normal range, and for `|x|` below the smallest normal `fl(x + c) − c` with `c = 1.5 ·
/// 2^(emin − m + 52)`, whose spacing is exactly the subnormal quantum `2^(emin − m)` (f64's
/// own round-to-nearest-even then rounds `x` to a multiple of it, ties to even), the sign of
/// an underflow to zero kept. When any result is not finite or above `max` (overflow, NaN,
/// ±inf in `src`), the whole slice is done again by [`round_to`].
///
/// # Panics
/// When the two slices differ in length.
pub fn round_slice(src: &[f64], dst: &mut [f64], format: Format, overflow: Overflow) {
    assert_eq!(src.len(), dst.len(), "round_slice: lengths");
    if format == Format::F64 {
        dst.copy_from_slice(src);
        return;
    }
    let p = Branchless::of(format);
    #[cfg(target_arch = "x86_64")]
    let ok = if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2 (checked just above).
        unsafe { branchless_avx2(&p, src, dst) }
    } else {
        p.round(src, dst)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let ok = p.round(src, dst);
    if !ok {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = round_to(x, format, overflow);
        }
    }
}

/// The constants of [`round_slice`]'s formula for one format.
struct Branchless {
    shift: u32,
    min_normal: f64,
    magic: f64,
    max: f64,
}

impl Branchless {
    /// The constants for `format` (not f64).
    fn of(format: Format) -> Branchless {
        let info = format.info();
        Branchless {
            shift: 52 - info.mantissa_bits,
            min_normal: pow2(info.emin),
            magic: 1.5 * pow2(info.emin - info.mantissa_bits as i32 + 52),
            max: info.max,
        }
    }

    /// The formula on every value; false when some result needs [`round_to`]'s general path.
    #[inline(always)]
    fn round(&self, src: &[f64], dst: &mut [f64]) -> bool {
        let half = (1u64 << (self.shift - 1)) - 1;
        let mask = !((1u64 << self.shift) - 1);
        let mut ok = true;
        for (d, &x) in dst.iter_mut().zip(src) {
            let bits = x.to_bits();
            let normal =
                f64::from_bits(bits.wrapping_add(half + ((bits >> self.shift) & 1)) & mask);
            let subnormal = ((x + self.magic) - self.magic).copysign(x);
            let r = if x.abs() < self.min_normal {
                subnormal
            } else {
                normal
            };
            // A NaN `x` may carry out of its mantissa into a zero: it takes the general path,
            // as does every result above `max` or not finite.
            ok &= (r.abs() <= self.max) & !x.is_nan();
            *d = r;
        }
        ok
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn branchless_avx2(p: &Branchless, src: &[f64], dst: &mut [f64]) -> bool {
    p.round(src, dst)
}

/// [`round_to`] by its formula alone (the fast path's reference).
#[inline(never)]
fn round_general(x: f64, format: Format, overflow: Overflow) -> f64 {
    let info = format.info();
    let over = |negative: bool| -> f64 {
        let mag = match overflow {
            Overflow::Saturate => info.max,
            Overflow::Ieee if info.has_inf => f64::INFINITY,
            Overflow::Ieee => return if negative { -f64::NAN } else { f64::NAN },
        };
        if negative {
            -mag
        } else {
            mag
        }
    };
    if x.is_infinite() {
        return over(x < 0.0);
    }
    if x == 0.0 {
        return x;
    }
    let q = quantum(x.abs(), info.emin, info.mantissa_bits as i32);
    let r = (x / q).round_ties_even() * q;
    if r.abs() > info.max {
        return over(x < 0.0);
    }
    if r == 0.0 {
        // Keep the sign of an underflow to zero, as IEEE does.
        return 0.0f64.copysign(x);
    }
    r
}

/// The spacing of `format` at `x`: `ulp(x) = 2^(max(floor(log2|x|), emin) - p + 1)`.
///
/// For `x = 0` this is the smallest subnormal; for |x| above `max` it is the spacing at `max`.
/// NaN and ±inf give NaN.
pub fn ulp(x: f64, format: Format) -> f64 {
    if !x.is_finite() {
        return f64::NAN;
    }
    let info = format.info();
    let a = x.abs().min(info.max);
    if a == 0.0 {
        return info.min_subnormal();
    }
    quantum(a, info.emin, info.mantissa_bits as i32)
}

/// `2^(max(floor(log2 a), emin) - mantissa_bits)` for finite `a > 0`.
fn quantum(a: f64, emin: i32, mantissa_bits: i32) -> f64 {
    let bits = a.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let e = if biased == 0 {
        // f64 subnormal: far below every target format's emin.
        -1075
    } else {
        biased - 1023
    };
    pow2(e.max(emin) - mantissa_bits)
}

impl Format {
    /// Whether `x` is exactly representable (finite values only; NaN and ±inf are not).
    pub fn represents(self, x: f64) -> bool {
        x.is_finite() && round_to(x, self, Overflow::Ieee) == x
    }
}

#[cfg(test)]
mod tests {
    /// The bit-arithmetic fast path of `round_to` gives the formula's result for every
    /// format and overflow rule: on random bit patterns, on every tie and tie ± 1 ulp (f64) in
    /// a spread of binades, at the normal/subnormal edge and around `max`.
    /// Values that exercise every path of rounding: random bit patterns, every tie and tie ± 1
    /// ulp (f64) in a spread of binades of each format, the normal/subnormal edge and `max`.
    fn hard_values() -> Vec<f64> {
        use crate::seed::mix;
        let mut xs: Vec<f64> = (0..200_000u64)
            .map(|i| f64::from_bits(mix(i)))
            .filter(|x| x.is_finite())
            .collect();
        for f in Format::ALL.into_iter().filter(|f| *f != Format::F64) {
            let info = f.info();
            for e in [info.emin - 2, info.emin, info.emin + 1, 0, 3, 7, 15] {
                let q = pow2(e - info.mantissa_bits as i32);
                for m in 0..64u64 {
                    let base = pow2(e) + q * m as f64;
                    let tie = base + q / 2.0;
                    for x in [base, tie, tie.next_up(), tie.next_down()] {
                        xs.extend([x, -x]);
                    }
                }
            }
            for x in [
                info.max,
                info.max * 1.0625,
                info.max * 1.03,
                pow2(info.emin).next_down(),
            ] {
                xs.extend([x, -x, x.next_up(), x.next_down()]);
            }
        }
        xs
    }

    #[test]
    fn fast_path_is_the_formula() {
        let xs = hard_values();
        for f in Format::ALL {
            for o in [Overflow::Ieee, Overflow::Saturate] {
                for &x in &xs {
                    let (a, b) = (round_to(x, f, o), round_general(x, f, o));
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "{f} {o:?} {x:e}: {a:e} vs {b:e}"
                    );
                }
            }
        }
    }

    use super::*;

    /// `round_slice` gives `round_to`'s bits for every value, in slices that take the
    /// branch-free path (finite values in range, zeros of both signs, subnormal results) and
    /// in slices that fall back to `round_to` (one NaN, infinity or overflowing value among
    /// them).
    #[test]
    fn round_slice_is_round_to() {
        let mut xs = hard_values();
        xs.extend([0.0, -0.0, 1e-300, -1e-300]);
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for f in Format::ALL {
            let info = f.info();
            // In range: every finite value not above max (the path without fallback).
            let in_range: Vec<f64> = xs
                .iter()
                .copied()
                .filter(|x| x.abs() <= info.max * 0.999)
                .collect();
            let mixed: Vec<f64> = xs
                .iter()
                .copied()
                .chain([f64::NAN, f64::INFINITY, -info.max * 1.1])
                .collect();
            // NaNs whose payload carries out of the mantissa under the integer rounding,
            // each alone among in-range values (no other value forces the fallback).
            let payloads: Vec<Vec<f64>> = [0x7FFF_FFFF_FFFF_FFFFu64, 0xFFFF_FFFF_FFFF_FFFF]
                .map(|bits| vec![0.5, f64::from_bits(bits), 0.25])
                .into();
            for o in [Overflow::Ieee, Overflow::Saturate] {
                for src in [&in_range, &mixed].into_iter().chain(&payloads) {
                    for chunk in src.chunks(1000) {
                        let mut dst = vec![7.0; chunk.len()];
                        round_slice(chunk, &mut dst, f, o);
                        for (x, r) in chunk.iter().zip(&dst) {
                            let want = round_to(*x, f, o);
                            assert!(same(*r, want), "{f} {o:?} {x:e}: {r:e} vs {want:e}");
                        }
                    }
                }
            }
            // The branch-free formula alone (no fallback) on the in-range values.
            if f != Format::F64 {
                let p = Branchless::of(f);
                let mut dst = vec![0.0; in_range.len()];
                assert!(
                    p.round(&in_range, &mut dst),
                    "{f}: no value needs the fallback"
                );
                for (x, r) in in_range.iter().zip(&dst) {
                    let want = round_to(*x, f, Overflow::Ieee);
                    if want.abs() <= info.max {
                        assert!(same(*r, want), "formula {f} {x:e}: {r:e} vs {want:e}");
                    }
                }
            }
        }
    }

    #[test]
    fn f32_matches_hardware_cast() {
        let xs = [
            1.0 + 2f64.powi(-24),
            1.0 + 3.0 * 2f64.powi(-24),
            1e-40,
            -3.3e38,
            3.5e38,
        ];
        for x in xs {
            assert_eq!(
                round_to(x, Format::F32, Overflow::Ieee),
                x as f32 as f64,
                "{x}"
            );
        }
    }

    #[test]
    fn bf16_and_f16_match_half() {
        let mut x = 1.0e-9f64;
        while x < 1.0e6 {
            for v in [x, -x, x * 1.000_977, x * 0.999_31] {
                let v32 = v as f32;
                assert_eq!(
                    round_to(v32 as f64, Format::Bf16, Overflow::Ieee),
                    half::bf16::from_f32(v32).to_f64()
                );
                assert_eq!(
                    round_to(v32 as f64, Format::F16, Overflow::Ieee),
                    half::f16::from_f32(v32).to_f64()
                );
            }
            x *= 1.37;
        }
    }

    #[test]
    fn ulp_at_one() {
        assert_eq!(ulp(1.0, Format::Bf16), 2f64.powi(-7));
        assert_eq!(ulp(1.0, Format::E4m3), 0.125);
        assert_eq!(ulp(0.0, Format::E4m3), 2f64.powi(-9));
        assert_eq!(ulp(448.0, Format::E4m3), 32.0);
    }
}
