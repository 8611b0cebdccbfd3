//! FP8 bit encodings: OCP E4M3 "fn" and E5M2.
//!
//! A byte `S EEEE MMM` (E4M3, bias 7) or `S EEEEE MM` (E5M2, bias 15) with `m` mantissa bits,
//! exponent field `E`, mantissa field `M` and bias `b` has the value
//!
//! * `(-1)^S · (1 + M/2^m) · 2^(E - b)` when `E > 0` (normal),
//! * `(-1)^S · M · 2^(1 - b - m)` when `E = 0` (subnormal and ±0),
//!
//! except for the special encodings: E4M3 has no infinities and only `S.1111.111` is NaN (so
//! `S.1111.110 = ±448` is finite); E5M2 is IEEE-like, `S.11111.00` is ±inf and
//! `S.11111.{01,10,11}` is NaN.
//!
//! NaN encodings written by [`encode_fp8`] follow ml_dtypes 0.7 (checked in
//! `reference/tests/format_tables.rs` against `fixtures/formats/`): the sign of the NaN is kept
//! and the payload is dropped, giving `S.1111.111` (0x7f/0xff) in E4M3 and the quiet NaN
//! `S.11111.10` (0x7e/0xfe) in E5M2. An E4M3 overflow under [`Overflow::Ieee`] gives the NaN
//! with the sign of the input (−1e6 → 0xff).

use super::kind::{pow2, Format, Overflow};
use super::round::round_to;

/// Bit layout of an FP8 format: (mantissa bits, exponent bits, bias).
fn layout(format: Format) -> (u32, u32, i32) {
    match format {
        Format::E4m3 | Format::E5m2 => {
            let info = format.info();
            let bias = (1i32 << (info.exponent_bits - 1)) - 1;
            (info.mantissa_bits, info.exponent_bits, bias)
        }
        other => panic!("{other} is not an FP8 format (expected e4m3 or e5m2)"),
    }
}

/// Encodes `x` into the 8-bit pattern of `format` (E4M3 or E5M2) after rounding with
/// `overflow` semantics.
///
/// Rounding is [`round_to`]`(x, format, overflow)`: round to nearest, ties to even, gradual
/// underflow; beyond ±max the result is ±inf (E5M2) or NaN (E4M3) under [`Overflow::Ieee`] and
/// ±max under [`Overflow::Saturate`] (±inf included). The rounded value `r` is then packed
/// exactly: for `|r| >= 2^emin`, `E = floor(log2|r|) + bias` and `M = (|r|/2^(E-bias) - 1)·2^m`;
/// for smaller `|r|`, `E = 0` and `M = |r| / 2^(emin - m)`.
///
/// The sign bit is always the sign of `x`: `-0.0` encodes as 0x80, a negative value that
/// underflows gives 0x80, and NaN (input NaN or an E4M3 overflow) keeps the sign of `x`. NaN is
/// encoded as `S.1111.111` in E4M3 and `S.11111.10` in E5M2, as ml_dtypes does.
///
/// ```
/// use moecheck_reference::format::{encode_fp8, Format, Overflow};
/// assert_eq!(encode_fp8(1.0, Format::E4m3, Overflow::Ieee), 0x38);
/// assert_eq!(encode_fp8(-448.0, Format::E4m3, Overflow::Ieee), 0xfe);
/// assert_eq!(encode_fp8(1e6, Format::E4m3, Overflow::Ieee), 0x7f); // NaN
/// assert_eq!(encode_fp8(1e6, Format::E5m2, Overflow::Ieee), 0x7c); // +inf
/// assert_eq!(encode_fp8(f64::INFINITY, Format::E5m2, Overflow::Saturate), 0x7b); // 57344
/// ```
///
/// # Panics
///
/// If `format` is not [`Format::E4m3`] or [`Format::E5m2`].
#[inline]
pub fn encode_fp8(x: f64, format: Format, overflow: Overflow) -> u8 {
    let (m, max) = match format {
        Format::E4m3 => (3u32, 448.0),
        Format::E5m2 => (2, 57344.0),
        other => panic!("{other} is not an FP8 format (expected e4m3 or e5m2)"),
    };
    let a = x.abs();
    // Finite values within ±max (nearly every value a scaled operand holds) are rounded here
    // with integer arithmetic on the f64 bits; the rest (NaN, ±inf, past max) take the
    // general path. A test checks the two agree.
    if a <= max {
        let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
        let bias = (1i32 << (7 - m)) / 2 - 1;
        let emin = 1 - bias;
        if a < pow2(emin) {
            // M·2^(emin - m) with M = |x|/2^(emin - m) rounded to an integer, ties to even
            // (exact scaling); M = 2^m is the smallest normal, E = 1 and M = 0: the same byte.
            return sign | (a * pow2(m as i32 - emin)).round_ties_even() as u8;
        }
        let bits = a.to_bits();
        let mut e = (bits >> 52) as i32 - 1023;
        let shift = 52 - m;
        let frac = bits & ((1u64 << 52) - 1);
        let mut q = frac >> shift;
        let rem = frac & ((1u64 << shift) - 1);
        let half = 1u64 << (shift - 1);
        if rem > half || (rem == half && q & 1 == 1) {
            q += 1;
        }
        if q == 1 << m {
            q = 0;
            e += 1;
        }
        // |x| <= max rounds to at most max: no overflow here.
        return sign | (((e + bias) as u8) << m) | q as u8;
    }
    encode_general(x, format, overflow)
}

/// [`encode_fp8`]`(fl32(x · scale))` for every `x` of `xs`, into `out` (the same bytes):
/// how an operand is cast to FP8 with its scale.
///
/// Values within ±max (nearly all of a scaled operand) are rounded with integer arithmetic on
/// their f32 bits, branch-free, in a loop the compiler vectorises: a normal result adds the
/// rounding increment (half an ulp less one, plus the last kept bit: ties to even) and shifts;
/// a subnormal one rounds `|v| · 2^(m - emin)` (exact) to an integer by adding 2^23. A block
/// of values holding any other (NaN, ±inf, past max) is encoded value by value. A test checks
/// it against [`encode_fp8`].
///
/// # Panics
///
/// If `format` is not [`Format::E4m3`] or [`Format::E5m2`], or the lengths differ.
pub fn encode_scaled(xs: &[f32], scale: f32, out: &mut [u8], format: Format, overflow: Overflow) {
    assert_eq!(xs.len(), out.len(), "encode_scaled: lengths");
    let (m, _, bias) = layout(format);
    let max_bits = (format.info().max as f32).to_bits();
    let shift = 23 - m;
    let rebias = ((127 - bias) as u32) << m;
    let min_normal = ((127 + 1 - bias) as u32) << 23;
    let up = pow2(m as i32 - (1 - bias)) as f32;
    const BLOCK: usize = 64;
    for (xs, out) in xs.chunks(BLOCK).zip(out.chunks_mut(BLOCK)) {
        let mut wild = false;
        for (o, &x) in out.iter_mut().zip(xs) {
            let bits = (x * scale).to_bits();
            let a = bits & 0x7fff_ffff;
            wild |= a > max_bits;
            let inc = (1u32 << (shift - 1)) - 1 + ((a >> shift) & 1);
            let normal = (a.wrapping_add(inc) >> shift).wrapping_sub(rebias);
            let sub = (f32::from_bits(a) * up + 8_388_608.0)
                .to_bits()
                .wrapping_sub(0x4b00_0000);
            let q = if a >= min_normal { normal } else { sub };
            *o = ((bits >> 24) & 0x80) as u8 | q as u8;
        }
        if wild {
            for (o, &x) in out.iter_mut().zip(xs) {
                *o = encode_fp8((x * scale) as f64, format, overflow);
            }
        }
    }
}

/// [`encode_fp8`] through [`round_to`] for any value.
fn encode_general(x: f64, format: Format, overflow: Overflow) -> u8 {
    let (m, ebits, bias) = layout(format);
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let exp_all = ((1u32 << ebits) - 1) as u8;
    let r = round_to(x, format, overflow);
    if r.is_nan() {
        let nan = match format {
            Format::E4m3 => 0x7f,
            _ => (exp_all << m) | (1 << (m - 1)),
        };
        return sign | nan;
    }
    if r.is_infinite() {
        // Only E5M2 (round_to never returns inf for E4M3).
        return sign | (exp_all << m);
    }
    let a = r.abs();
    let emin = 1 - bias;
    if a < pow2(emin) {
        // Subnormal or zero: a = M · 2^(emin - m), exact.
        let mant = (a / pow2(emin - m as i32)) as u8;
        return sign | mant;
    }
    let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let mant = ((a / pow2(e) - 1.0) * pow2(m as i32)) as u8;
    sign | (((e + bias) as u8) << m) | mant
}

/// Decodes an 8-bit pattern of `format` (E4M3 or E5M2) into its exact value.
///
/// Formula (see the [module docs](self)): `(-1)^S · (1 + M/2^m) · 2^(E - bias)` for `E > 0`,
/// `(-1)^S · M · 2^(1 - bias - m)` for `E = 0`. Every FP8 value is exact in f64. NaN encodings
/// (E4M3 `S.1111.111`, E5M2 `S.11111.{01,10,11}`) decode to a NaN carrying the sign bit `S`;
/// E5M2 `S.11111.00` decodes to ±inf.
///
/// ```
/// use moecheck_reference::format::{decode_fp8, Format};
/// assert_eq!(decode_fp8(0x7e, Format::E4m3), 448.0);
/// assert!(decode_fp8(0x7f, Format::E4m3).is_nan());
/// assert_eq!(decode_fp8(0x7b, Format::E5m2), 57344.0);
/// assert_eq!(decode_fp8(0xfc, Format::E5m2), f64::NEG_INFINITY);
/// assert_eq!(decode_fp8(0x01, Format::E4m3), 2f64.powi(-9));
/// ```
///
/// # Panics
///
/// If `format` is not [`Format::E4m3`] or [`Format::E5m2`].
#[inline]
pub fn decode_fp8(byte: u8, format: Format) -> f64 {
    static TABLES: std::sync::OnceLock<[[f64; 256]; 2]> = std::sync::OnceLock::new();
    let t = TABLES.get_or_init(|| {
        let table = |f| std::array::from_fn(|b| decode_formula(b as u8, f));
        [table(Format::E4m3), table(Format::E5m2)]
    });
    match format {
        Format::E4m3 => t[0][byte as usize],
        Format::E5m2 => t[1][byte as usize],
        other => panic!("{other} is not an FP8 format (expected e4m3 or e5m2)"),
    }
}

/// [`decode_fp8`] by its formula (the tables are made with it).
fn decode_formula(byte: u8, format: Format) -> f64 {
    let (m, ebits, bias) = layout(format);
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp_all = (1u32 << ebits) - 1;
    let e = ((byte as u32) >> m) & exp_all;
    let mant = (byte as u32) & ((1 << m) - 1);
    let special = match format {
        Format::E4m3 => e == exp_all && mant == (1 << m) - 1,
        _ => e == exp_all,
    };
    if special {
        let v = if mant == 0 { f64::INFINITY } else { f64::NAN };
        return v.copysign(sign);
    }
    let mag = if e == 0 {
        mant as f64 * pow2(1 - bias - m as i32)
    } else {
        (1.0 + mant as f64 * pow2(-(m as i32))) * pow2(e as i32 - bias)
    };
    sign * mag
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP8: [Format; 2] = [Format::E4m3, Format::E5m2];

    #[test]
    fn roundtrip_all_finite_bytes() {
        for f in FP8 {
            for b in 0..=255u8 {
                let v = decode_fp8(b, f);
                if v.is_nan() {
                    continue;
                }
                for o in [Overflow::Ieee, Overflow::Saturate] {
                    let want = if v.is_infinite() && o == Overflow::Saturate {
                        b - 1 // ±inf saturates to ±max, the byte just below
                    } else {
                        b
                    };
                    assert_eq!(encode_fp8(v, f, o), want, "{f} {b:#04x}");
                }
            }
        }
    }

    /// The fast path of `encode_fp8` is the general one: every FP8 value, every midpoint
    /// between neighbours and the f64 values either side of it, zero, and a spread of f32
    /// and f64 values over the whole range and past it, both signs, both overflow rules.
    #[test]
    fn fast_encoding_is_the_general_one() {
        for f in FP8 {
            let mut xs: Vec<f64> = vec![0.0, f64::MIN_POSITIVE, 1e-300, f64::INFINITY, f64::NAN];
            let vals: Vec<f64> = (0..=0x7fu8)
                .map(|b| decode_fp8(b, f))
                .filter(|v| v.is_finite())
                .collect();
            for w in vals.windows(2) {
                let mid = (w[0] + w[1]) / 2.0;
                xs.extend([w[0], mid, mid.next_up(), mid.next_down(), w[1].next_up()]);
            }
            let mut h = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..200_000 {
                h = crate::seed::mix(h);
                let v = f32::from_bits((h >> 32) as u32 & 0x47ff_ffff);
                xs.push(v as f64);
                xs.push(f64::from_bits(h & 0x40ff_ffff_ffff_ffff));
            }
            for x in xs {
                for x in [x, -x] {
                    for o in [Overflow::Ieee, Overflow::Saturate] {
                        assert_eq!(
                            encode_fp8(x, f, o),
                            encode_general(x, f, o),
                            "{f} {o:?} {x:e}"
                        );
                    }
                }
            }
            for b in 0..=255u8 {
                let (t, d) = (decode_fp8(b, f), decode_formula(b, f));
                assert!(t.to_bits() == d.to_bits() || (t.is_nan() && d.is_nan()));
                assert_eq!(t.is_sign_negative(), d.is_sign_negative());
            }
        }
    }

    /// The vectorised cast of scaled f32 values is `encode_fp8` of the f32 product: every
    /// f32 within the FP8 range's exponents at a stride (and every one near each FP8 value
    /// and midpoint), random bits of every exponent, zeros, NaN, ±inf and values past max
    /// mixed into blocks, at scales 1, 2^-3 and 3, both overflow rules.
    #[test]
    fn scaled_cast_is_encode_fp8() {
        for f in FP8 {
            let mut xs: Vec<f32> = vec![0.0, -0.0, f32::NAN, f32::INFINITY, 1e30, 464.0];
            let lo = (2f32.powi(-30)).to_bits();
            xs.extend((lo..0x4780_0000).step_by(997).map(f32::from_bits));
            for b in 0..=0x7fu8 {
                let v = decode_fp8(b, f);
                if !v.is_finite() {
                    continue;
                }
                let next = decode_fp8(b + 1, f);
                let mid = ((v + if next.is_finite() { next } else { v * 2.0 }) / 2.0) as f32;
                for c in [v as f32, mid] {
                    let c = c.to_bits();
                    xs.extend((c.saturating_sub(3)..=c + 3).map(f32::from_bits));
                }
            }
            let mut h = 0x2545_f491_4f6c_dd1du64;
            for _ in 0..100_000 {
                h = crate::seed::mix(h);
                xs.push(f32::from_bits(h as u32));
            }
            let neg: Vec<f32> = xs.iter().map(|x| -x).collect();
            xs.extend(neg);
            // In order of magnitude (blocks of 64 within range take the integer path) and
            // shuffled (blocks mix wild values with tame ones).
            xs.sort_by(|a, b| a.abs().total_cmp(&b.abs()));
            let mut mixed = xs.clone();
            for i in (1..mixed.len()).rev() {
                h = crate::seed::mix(h);
                mixed.swap(i, (h % (i as u64 + 1)) as usize);
            }
            for xs in [&xs, &mixed] {
                for scale in [1.0f32, 0.125, 3.0] {
                    for o in [Overflow::Ieee, Overflow::Saturate] {
                        let mut got = vec![0u8; xs.len()];
                        encode_scaled(xs, scale, &mut got, f, o);
                        for (x, g) in xs.iter().zip(&got) {
                            let want = encode_fp8((x * scale) as f64, f, o);
                            assert_eq!(*g, want, "{f} {o:?} {x:e} x {scale}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn special_values() {
        assert_eq!(encode_fp8(-0.0, Format::E4m3, Overflow::Ieee), 0x80);
        assert_eq!(encode_fp8(-1e-30, Format::E5m2, Overflow::Ieee), 0x80);
        assert_eq!(encode_fp8(f64::NAN, Format::E4m3, Overflow::Saturate), 0x7f);
        assert_eq!(encode_fp8(-f64::NAN, Format::E5m2, Overflow::Ieee), 0xfe);
        assert_eq!(encode_fp8(-1e6, Format::E4m3, Overflow::Ieee), 0xff);
        assert_eq!(encode_fp8(-1e6, Format::E4m3, Overflow::Saturate), 0xfe);
        assert_eq!(encode_fp8(464.0, Format::E4m3, Overflow::Ieee), 0x7e);
        assert_eq!(encode_fp8(61440.0, Format::E5m2, Overflow::Ieee), 0x7c);
        assert_eq!(decode_fp8(0x7e, Format::E4m3), 448.0);
        assert_eq!(decode_fp8(0x08, Format::E4m3), 2f64.powi(-6));
        assert_eq!(decode_fp8(0x01, Format::E5m2), 2f64.powi(-16));
        assert!(decode_fp8(0x7d, Format::E5m2).is_nan());
        assert!(decode_fp8(0xff, Format::E4m3).is_sign_negative());
    }

    #[test]
    #[should_panic(expected = "not an FP8 format")]
    fn rejects_non_fp8() {
        encode_fp8(1.0, Format::Bf16, Overflow::Ieee);
    }
}
