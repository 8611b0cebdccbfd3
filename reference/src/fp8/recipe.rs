//! The per-value steps of the recipe: amax, scale, scale_inv, quantise, dequantise.
//!
//! See the [module docs](super) for the recipe and where it comes from.

use crate::format::{decode_fp8, encode_fp8, Format, Overflow};

/// The largest finite value of an FP8 format as f32: 448 (E4M3) or 57344 (E5M2).
///
/// # Panics
/// If `format` is not E4M3 or E5M2.
pub fn fp8_max(format: Format) -> f32 {
    match format {
        Format::E4m3 | Format::E5m2 => format.info().max as f32,
        other => panic!("{other} is not an FP8 format (expected e4m3 or e5m2)"),
    }
}

/// `max |x|` over `values`, NaN-propagating: NaN if any value is NaN, `None` if there are no
/// values (an empty scope). Exact (no rounding).
///
/// ```
/// use moecheck_reference::fp8::amax;
/// assert_eq!(amax([1.0f32, -3.0, 2.0]), Some(3.0));
/// assert!(amax([1.0f32, f32::NAN]).unwrap().is_nan());
/// assert_eq!(amax(std::iter::empty::<f32>()), None);
/// ```
pub fn amax(values: impl IntoIterator<Item = f32>) -> Option<f32> {
    let mut m: Option<f32> = None;
    for v in values {
        let a = v.abs();
        m = Some(match m {
            None => a,
            Some(p) if p.is_nan() || a.is_nan() => f32::NAN,
            Some(p) => p.max(a),
        });
    }
    m
}

/// `scale = (fp8_max / amax) / 2^margin` in f32, with Transformer Engine's C++ guards.
///
/// Reads `amax` (from [`amax`], or the reduction of a delayed-scaling history). Returns 1 when
/// `amax` is 0, negative, NaN or ±inf; `f32::MAX` when the quotient overflows to inf. Both
/// divisions round to nearest even in f32 (the second is exact unless it underflows).
/// Follows `compute_scale_from_amax` of TE's `recipe_common.cuh`; current scaling uses
/// `margin = 0`.
///
/// ```
/// use moecheck_reference::fp8::compute_scale;
/// use moecheck_reference::format::Format;
/// assert_eq!(compute_scale(2.0, Format::E4m3, 0), 224.0);
/// assert_eq!(compute_scale(0.0, Format::E4m3, 0), 1.0);
/// assert_eq!(compute_scale(f32::NAN, Format::E5m2, 0), 1.0);
/// assert_eq!(compute_scale(1e-38, Format::E4m3, 0), f32::MAX); // 448/1e-38 overflows
/// assert_eq!(compute_scale(2.0, Format::E4m3, 1), 112.0);
/// ```
pub fn compute_scale(amax: f32, format: Format, margin: i32) -> f32 {
    // `amax > 0` is false for NaN too.
    if amax.is_nan() || amax <= 0.0 || amax.is_infinite() {
        return 1.0;
    }
    let s = fp8_max(format) / amax;
    let s = if margin == 0 {
        s
    } else {
        s / (2.0f64.powi(margin) as f32)
    };
    if s.is_infinite() {
        f32::MAX
    } else {
        s
    }
}

/// Whether TE's JAX `compute_scale_from_amax` (no overflow guard) would give `scale = inf`
/// for this `amax`, where the C++ path clamps to `f32::MAX`.
pub fn jax_scale_overflows(amax: f32, format: Format) -> bool {
    amax > 0.0 && amax.is_finite() && (fp8_max(format) / amax).is_infinite()
}

/// `scale_inv = fl32(1 / scale)`, correctly rounded (IEEE f32 division).
pub fn scale_inv(scale: f32) -> f32 {
    1.0 / scale
}

/// The FP8 byte of `x` under `scale`: `encode(round(fl32(x · scale)))`.
///
/// The product is rounded to f32 (nearest even) first, then cast once to `format` with
/// round-to-nearest-even and `overflow` ([`Overflow::Saturate`] is the recipe's
/// `satfinite`; [`Overflow::Ieee`] is ml_dtypes' `astype`). NaN encodes as NaN with its
/// sign. See [`encode_fp8`].
///
/// ```
/// use moecheck_reference::fp8::quantize_value;
/// use moecheck_reference::format::{Format, Overflow};
/// assert_eq!(quantize_value(1.0, 448.0, Format::E4m3, Overflow::Saturate), 0x7e); // 448
/// assert_eq!(quantize_value(2.0, 448.0, Format::E4m3, Overflow::Saturate), 0x7e); // saturates
/// assert_eq!(quantize_value(2.0, 448.0, Format::E4m3, Overflow::Ieee), 0x7f); // NaN
/// ```
pub fn quantize_value(x: f32, scale: f32, format: Format, overflow: Overflow) -> u8 {
    encode_fp8((x * scale) as f64, format, overflow)
}

/// The exact dequantised value `decode(q) · scale_inv` (exact in f64: at most 4 + 24
/// significant bits).
pub fn dequantize_value(q: u8, scale_inv: f32, format: Format) -> f64 {
    decode_fp8(q, format) * scale_inv as f64
}

/// The f32 dequantised value `fl32(decode(q) · scale_inv)` (one rounding, nearest even), as
/// `q.astype(float32) * scale_inv` computes it in numpy.
pub fn dequantize_f32(q: u8, scale_inv: f32, format: Format) -> f32 {
    decode_fp8(q, format) as f32 * scale_inv
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{round_to, ulp};

    #[test]
    fn scale_guards() {
        for f in [Format::E4m3, Format::E5m2] {
            assert_eq!(compute_scale(-1.0, f, 0), 1.0);
            assert_eq!(compute_scale(f32::INFINITY, f, 0), 1.0);
            assert_eq!(compute_scale(f32::MIN_POSITIVE / 1024.0, f, 0), f32::MAX);
            assert!(jax_scale_overflows(f32::MIN_POSITIVE / 1024.0, f));
            assert!(!jax_scale_overflows(1.0, f));
            assert_eq!(compute_scale(fp8_max(f), f, 0), 1.0);
        }
        // 448/3 rounds to nearest in f32.
        assert_eq!(compute_scale(3.0, Format::E4m3, 0), 448.0f32 / 3.0);
    }

    /// Known answers for every function of the recipe, worked by hand from TE's formulas.
    #[test]
    fn known_answers() {
        assert_eq!(fp8_max(Format::E4m3), 448.0);
        assert_eq!(fp8_max(Format::E5m2), 57344.0);
        // amax: exact, NaN wherever a NaN appears (first, middle, last), None when empty.
        assert_eq!(amax([1.0f32, -3.0, 2.0]), Some(3.0));
        assert_eq!(amax([-0.5f32]), Some(0.5));
        assert_eq!(amax(std::iter::empty::<f32>()), None);
        for v in [
            [f32::NAN, 1.0, 2.0],
            [1.0, f32::NAN, 2.0],
            [1.0, 2.0, f32::NAN],
        ] {
            assert!(amax(v).unwrap().is_nan(), "{v:?}");
        }
        // compute_scale: 448/2 = 224, 57344/2 = 28672; margin m divides by 2^m; the guards.
        assert_eq!(compute_scale(2.0, Format::E4m3, 0), 224.0);
        assert_eq!(compute_scale(2.0, Format::E5m2, 0), 28672.0);
        assert_eq!(compute_scale(2.0, Format::E4m3, 1), 112.0);
        assert_eq!(compute_scale(2.0, Format::E4m3, 3), 28.0);
        assert_eq!(compute_scale(2.0, Format::E4m3, -1), 448.0);
        assert_eq!(compute_scale(0.0, Format::E4m3, 0), 1.0);
        assert_eq!(compute_scale(-0.0, Format::E4m3, 0), 1.0);
        assert_eq!(compute_scale(f32::NAN, Format::E4m3, 0), 1.0);
        assert_eq!(compute_scale(f32::NEG_INFINITY, Format::E4m3, 0), 1.0);
        assert_eq!(compute_scale(1e-38, Format::E4m3, 0), f32::MAX);
        // A large finite quotient is not clamped: 448 / 2^-100 = 448·2^100; 448 / 2^-120 overflows.
        assert_eq!(
            compute_scale(2f32.powi(-100), Format::E4m3, 0),
            448.0 * 2f32.powi(100)
        );
        assert_eq!(compute_scale(2f32.powi(-120), Format::E4m3, 0), f32::MAX);
        // jax_scale_overflows: only a positive finite amax whose quotient is inf.
        let tiny = f32::MIN_POSITIVE / 1024.0;
        assert!(jax_scale_overflows(tiny, Format::E4m3));
        assert!(jax_scale_overflows(1e-38, Format::E5m2));
        assert!(!jax_scale_overflows(2f32.powi(-100), Format::E4m3));
        assert!(jax_scale_overflows(2f32.powi(-120), Format::E4m3));
        assert!(!jax_scale_overflows(0.0, Format::E4m3)); // 448/0 = inf, but amax = 0
        assert!(!jax_scale_overflows(-tiny, Format::E4m3)); // 448/-tiny = -inf
        assert!(!jax_scale_overflows(f32::INFINITY, Format::E4m3));
        assert!(!jax_scale_overflows(f32::NAN, Format::E4m3));
        assert!(!jax_scale_overflows(1.0, Format::E5m2));
        // scale_inv: the f32 reciprocal, correctly rounded.
        assert_eq!(scale_inv(4.0), 0.25);
        assert_eq!(scale_inv(0.5), 2.0);
        assert_eq!(scale_inv(3.0), 0.333_333_34);
        // quantize_value: 0.5·4 = 2 is 0x40 in E4M3 (exponent 8 = bias 7 + 1) and E5M2 (0x40).
        assert_eq!(
            quantize_value(0.5, 4.0, Format::E4m3, Overflow::Saturate),
            0x40
        );
        assert_eq!(
            quantize_value(0.5, 4.0, Format::E5m2, Overflow::Saturate),
            0x40
        );
        assert_eq!(
            quantize_value(-0.5, 4.0, Format::E4m3, Overflow::Saturate),
            0xc0
        );
        assert_eq!(
            quantize_value(3.0, 0.5, Format::E4m3, Overflow::Saturate),
            0x3c
        ); // 1.5
           // dequantize: decode(0x40) = 2, times scale_inv.
        assert_eq!(dequantize_value(0x40, 0.25, Format::E4m3), 0.5);
        assert_eq!(dequantize_value(0x40, 3.0, Format::E5m2), 6.0);
        assert_eq!(dequantize_f32(0x40, 0.25, Format::E4m3), 0.5);
        assert_eq!(dequantize_f32(0x40, 3.0, Format::E5m2), 6.0);
        // The f32 product is rounded, the f64 one exact: 1.75 · (1 + 2^-23) needs 26 bits.
        let s = 1.0 + 2f32.powi(-23);
        assert_eq!(
            dequantize_value(0x3e, s, Format::E4m3),
            1.75 * (1.0 + 2f64.powi(-23))
        );
        assert_eq!(
            dequantize_f32(0x3e, s, Format::E4m3),
            (1.75f64 * s as f64) as f32
        );
        assert_ne!(
            dequantize_f32(0x3e, s, Format::E4m3) as f64,
            dequantize_value(0x3e, s, Format::E4m3)
        );
    }

    #[test]
    #[should_panic(expected = "not an FP8 format")]
    fn fp8_max_rejects_f32() {
        fp8_max(Format::F32);
    }

    #[test]
    fn amax_element_quantises_to_max() {
        // The element that sets amax lands on ±max or within half an ulp of it.
        for amax_v in [1.0f32, 3.0, 1e-20, 7.5e30, 0.1] {
            for f in [Format::E4m3, Format::E5m2] {
                let s = compute_scale(amax_v, f, 0);
                let q = quantize_value(-amax_v, s, f, Overflow::Saturate);
                let v = decode_fp8(q, f);
                assert!((v + fp8_max(f) as f64).abs() <= ulp(448.0, f) / 2.0, "{v}");
            }
        }
    }

    #[test]
    fn quantise_is_round_of_f32_product() {
        let x = 0.3f32;
        let s = 448.0f32 / 0.7;
        let want = round_to((x * s) as f64, Format::E4m3, Overflow::Saturate);
        assert_eq!(
            decode_fp8(
                quantize_value(x, s, Format::E4m3, Overflow::Saturate),
                Format::E4m3
            ),
            want
        );
        assert_eq!(dequantize_value(0x38, 0.5, Format::E4m3), 0.5);
        assert_eq!(dequantize_f32(0x38, 0.25, Format::E4m3), 0.25);
    }

    #[test]
    #[should_panic(expected = "not an FP8 format")]
    fn fp8_max_rejects_bf16() {
        fp8_max(Format::Bf16);
    }
}
