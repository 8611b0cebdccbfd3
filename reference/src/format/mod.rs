//! Number formats and correctly rounded casts.
//!
//! A binary floating-point format with precision `p` (mantissa bits + 1), minimum normal
//! exponent `emin` and largest finite value `max` represents
//! `x = ± m · 2^(e - p + 1)` with integer `0 <= m < 2^p`, `e >= emin`. Rounding a real `x` to the
//! format (round to nearest, ties to even, with gradual underflow) has error
//! `|fl(x) - x| <= u·|x| + η/2`, `u = 2^-p` (the unit roundoff), `η = 2^(emin - p + 1)` (the
//! smallest subnormal), as long as no overflow happens ([Higham 2002, Thm 2.2]).
//!
//! The constants are ours ([`Format::info`]), not the `float8` crate's: float8 0.7 gives
//! `F8E4M3::MAX = 416` and `F8E5M2::MAX = 49152` (the right values are 448 and 57344), and its
//! `is_nan`/`is_infinite` are wrong for several encodings. We use float8 only as a second
//! opinion in tests; the casts here are written from the definitions and checked exhaustively
//! against ml_dtypes tables in `fixtures/formats/`.
//!
//! | format | p  | emin | max           | inf | NaN encodings            |
//! |--------|----|------|---------------|-----|--------------------------|
//! | f64    | 53 | -1022| ≈1.8e308      | yes | IEEE                     |
//! | f32    | 24 | -126 | ≈3.4e38       | yes | IEEE                     |
//! | bf16   | 8  | -126 | ≈3.39e38      | yes | IEEE                     |
//! | f16    | 11 | -14  | 65504         | yes | IEEE                     |
//! | e4m3   | 4  | -6   | 448           | no  | S.1111.111 (OCP "fn")    |
//! | e5m2   | 3  | -14  | 57344         | yes | S.11111.{01,10,11}       |

mod fp8;
mod round;

pub use fp8::{decode_fp8, encode_fp8};
pub use round::{round_to, ulp};

use serde::{Deserialize, Serialize};

/// A number format that an implementation reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    F64,
    F32,
    Bf16,
    F16,
    /// OCP FP8 E4M3 "fn": 4 exponent bits, 3 mantissa bits, bias 7, no infinities, max 448.
    E4m3,
    /// OCP FP8 E5M2: 5 exponent bits, 2 mantissa bits, bias 15, IEEE-like with infinities.
    E5m2,
}

/// What happens to values beyond the largest finite value of a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    /// IEEE / ml_dtypes / XLA `convert`: round first; a result beyond `max` becomes ±inf, or NaN
    /// in a format without infinities (E4M3). ±inf stays ±inf (NaN in E4M3).
    Ieee,
    /// GPU `cvt.rn.satfinite` and Transformer Engine's casts: round first, then clamp to
    /// ±max; ±inf becomes ±max. NaN stays NaN.
    Saturate,
}

/// Constants of a format. All values are exact powers of two or exact finite values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FormatInfo {
    pub name: &'static str,
    /// Storage width in bits.
    pub bits: u32,
    /// Explicit mantissa bits (precision `p = mantissa_bits + 1`).
    pub mantissa_bits: u32,
    /// Exponent bits.
    pub exponent_bits: u32,
    /// Minimum normal exponent `emin` (so the smallest normal is `2^emin`).
    pub emin: i32,
    /// Largest finite value.
    pub max: f64,
    /// Whether the format has infinities.
    pub has_inf: bool,
}

impl FormatInfo {
    /// Precision `p`, counting the implicit bit.
    pub fn precision(&self) -> u32 {
        self.mantissa_bits + 1
    }
    /// Unit roundoff `u = 2^-p`: the relative error bound of round-to-nearest.
    pub fn unit_roundoff(&self) -> f64 {
        pow2(-(self.precision() as i32))
    }
    /// Machine epsilon `2^(1-p)`: the gap between 1 and the next value.
    pub fn epsilon(&self) -> f64 {
        pow2(1 - self.precision() as i32)
    }
    /// Smallest positive normal value `2^emin`.
    pub fn min_normal(&self) -> f64 {
        pow2(self.emin)
    }
    /// Smallest positive subnormal value `η = 2^(emin - p + 1)`.
    pub fn min_subnormal(&self) -> f64 {
        pow2(self.emin - self.mantissa_bits as i32)
    }
}

/// `2^e` as f64, exact for `-1074 <= e <= 1023`.
pub fn pow2(e: i32) -> f64 {
    if e >= -1022 {
        f64::from_bits(((e + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (e + 1074))
    }
}

impl Format {
    /// Every format, in a fixed order.
    pub const ALL: [Format; 6] = [
        Format::F64,
        Format::F32,
        Format::Bf16,
        Format::F16,
        Format::E4m3,
        Format::E5m2,
    ];

    /// The format's constants.
    pub fn info(self) -> FormatInfo {
        match self {
            Format::F64 => FormatInfo {
                name: "f64",
                bits: 64,
                mantissa_bits: 52,
                exponent_bits: 11,
                emin: -1022,
                max: f64::MAX,
                has_inf: true,
            },
            Format::F32 => FormatInfo {
                name: "f32",
                bits: 32,
                mantissa_bits: 23,
                exponent_bits: 8,
                emin: -126,
                max: f32::MAX as f64,
                has_inf: true,
            },
            Format::Bf16 => FormatInfo {
                name: "bf16",
                bits: 16,
                mantissa_bits: 7,
                exponent_bits: 8,
                emin: -126,
                // (2 - 2^-7) · 2^127
                max: (2.0 - pow2(-7)) * pow2(127),
                has_inf: true,
            },
            Format::F16 => FormatInfo {
                name: "f16",
                bits: 16,
                mantissa_bits: 10,
                exponent_bits: 5,
                emin: -14,
                max: 65504.0,
                has_inf: true,
            },
            Format::E4m3 => FormatInfo {
                name: "e4m3",
                bits: 8,
                mantissa_bits: 3,
                exponent_bits: 4,
                emin: -6,
                max: 448.0,
                has_inf: false,
            },
            Format::E5m2 => FormatInfo {
                name: "e5m2",
                bits: 8,
                mantissa_bits: 2,
                exponent_bits: 5,
                emin: -14,
                max: 57344.0,
                has_inf: true,
            },
        }
    }

    /// The lower-case name used in flags, case.json and reports.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Parses a format name (`f32`, `float32`, `bf16`, `bfloat16`, `f16`, `float16`, `e4m3`,
    /// `float8_e4m3fn`, `e5m2`, `float8_e5m2`, `f64`, `float64`).
    pub fn parse(s: &str) -> Result<Format, crate::Error> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f64" | "float64" => Format::F64,
            "f32" | "float32" | "fp32" => Format::F32,
            "bf16" | "bfloat16" => Format::Bf16,
            "f16" | "float16" | "fp16" | "half" => Format::F16,
            "e4m3" | "fp8_e4m3" | "float8_e4m3fn" | "e4m3fn" => Format::E4m3,
            "e5m2" | "fp8_e5m2" | "float8_e5m2" => Format::E5m2,
            _ => return Err(crate::Error::UnknownFormat(s.to_string())),
        })
    }

    /// Whether `x` is exactly representable (finite values only; NaN and ±inf are not).
    pub fn represents(self, x: f64) -> bool {
        x.is_finite() && round_to(x, self, Overflow::Ieee) == x
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Format {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::parse(s)
    }
}
