//! FP8 bit encodings (E4M3 "fn" and E5M2). Placeholder: filled in by the formats work.

use super::{Format, Overflow};

/// Encodes `x` into the 8-bit pattern of `format` (E4M3 or E5M2) after rounding with
/// `overflow` semantics.
pub fn encode_fp8(_x: f64, _format: Format, _overflow: Overflow) -> u8 {
    unimplemented!()
}

/// Decodes an 8-bit pattern of `format` (E4M3 or E5M2) into its exact value.
pub fn decode_fp8(_byte: u8, _format: Format) -> f64 {
    unimplemented!()
}
