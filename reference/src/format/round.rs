//! Correctly rounded casts from f64 to every [`Format`].

use super::kind::{pow2, Format, Overflow};

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
    #[test]
    fn fast_path_is_the_formula() {
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
