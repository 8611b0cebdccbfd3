//! FP8 bit encodings: OCP E4M3 "fn" and E5M2.
//!
//! E4M3: `S EEEE MMM`, bias 7, no infinities, `S.1111.111` is NaN, max `1.75·2^8 = 448`.
//! E5M2: `S EEEEE MM`, bias 15, `S.11111.00` is ±inf, `S.11111.{01,10,11}` NaN, max `1.75·2^15 = 57344`.
//! A value with biased exponent 0 is subnormal: `(-1)^S · 0.M · 2^(1-bias)`.

use super::{pow2, round_to, Format, Overflow};

fn layout(format: Format) -> (u32, i32) {
    match format {
        Format::E4m3 => (3, 7),
        Format::E5m2 => (2, 15),
        other => panic!("{other} is not an FP8 format"),
    }
}

/// Decodes an 8-bit pattern of `format` (E4M3 or E5M2) into its exact value (NaN keeps the
/// sign bit, as ml_dtypes does).
///
/// # Panics
/// If `format` is not E4M3 or E5M2.
///
/// ```
/// use moecheck_reference::format::{decode_fp8, Format};
/// assert_eq!(decode_fp8(0x7e, Format::E4m3), 448.0);
/// assert!(decode_fp8(0x7f, Format::E4m3).is_nan());
/// assert_eq!(decode_fp8(0x7c, Format::E5m2), f64::INFINITY);
/// assert_eq!(decode_fp8(0x01, Format::E4m3), 2f64.powi(-9));
/// ```
pub fn decode_fp8(byte: u8, format: Format) -> f64 {
    let (mbits, bias) = layout(format);
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((byte & 0x7f) >> mbits) as i32;
    let man = (byte & ((1 << mbits) - 1)) as i32;
    let emax_field = (1 << (7 - mbits)) - 1;
    match format {
        Format::E4m3 if exp == emax_field && man == (1 << mbits) - 1 => {
            return f64::NAN.copysign(sign)
        }
        Format::E5m2 if exp == emax_field => {
            return if man == 0 {
                sign * f64::INFINITY
            } else {
                f64::NAN.copysign(sign)
            };
        }
        _ => {}
    }
    let m = man as f64 * pow2(-(mbits as i32));
    if exp == 0 {
        sign * m * pow2(1 - bias)
    } else {
        sign * (1.0 + m) * pow2(exp - bias)
    }
}

/// Encodes `x` into the 8-bit pattern of `format` (E4M3 or E5M2): first
/// [`round_to`]`(x, format, overflow)` (round to nearest even; saturation or not per
/// `overflow`), then the bits of the rounded value. The sign of zero is kept. NaN encodes as
/// `S.1111.111` (E4M3) or `S.11111.10` (E5M2) with the sign bit of the input NaN, as ml_dtypes
/// does.
///
/// # Panics
/// If `format` is not E4M3 or E5M2.
pub fn encode_fp8(x: f64, format: Format, overflow: Overflow) -> u8 {
    let (mbits, bias) = layout(format);
    let r = round_to(x, format, overflow);
    let sign: u8 = if r.is_sign_negative() { 0x80 } else { 0 };
    if r.is_nan() {
        return sign | if format == Format::E4m3 { 0x7f } else { 0x7e };
    }
    if r.is_infinite() {
        return sign | 0x7c;
    }
    let a = r.abs();
    if a == 0.0 {
        return sign;
    }
    let min_normal = pow2(1 - bias);
    if a < min_normal {
        // Subnormal: a = man · 2^(1 - bias - mbits), exact after rounding.
        let man = (a / pow2(1 - bias - mbits as i32)) as u8;
        return sign | man;
    }
    let e = a.log2().floor() as i32;
    // Guard against log2 rounding at exact powers of two.
    let e = if pow2(e) > a {
        e - 1
    } else if pow2(e + 1) <= a {
        e + 1
    } else {
        e
    };
    let man = ((a / pow2(e) - 1.0) * pow2(mbits as i32)) as u8;
    sign | (((e + bias) as u8) << mbits) | man
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_byte_round_trips() {
        for f in [Format::E4m3, Format::E5m2] {
            for b in 0..=255u8 {
                let v = decode_fp8(b, f);
                if v.is_finite() {
                    assert_eq!(encode_fp8(v, f, Overflow::Ieee), b, "{f} {b:#04x} = {v}");
                }
            }
        }
    }

    #[test]
    fn saturation_and_overflow() {
        assert_eq!(encode_fp8(1e6, Format::E4m3, Overflow::Saturate), 0x7e);
        assert_eq!(encode_fp8(-1e6, Format::E4m3, Overflow::Ieee), 0xff);
        assert_eq!(encode_fp8(1e6, Format::E5m2, Overflow::Ieee), 0x7c);
        assert_eq!(
            encode_fp8(f64::INFINITY, Format::E5m2, Overflow::Saturate),
            0x7b
        );
    }
}
