//! The formats themselves: [`Format`], our own table of their constants ([`FormatInfo`]),
//! overflow behaviour and exact powers of two.

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
#[inline]
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
    #[inline]
    /// Whether every finite value of `other` is exactly a value of `self`: at least its
    /// precision, down to its smallest normal exponent (so its subnormals too), up to its
    /// largest value.
    ///
    /// ```
    /// use moecheck_reference::format::Format;
    /// assert!(Format::F32.holds(Format::Bf16) && Format::F32.holds(Format::F16));
    /// assert!(!Format::Bf16.holds(Format::F16) && !Format::F16.holds(Format::Bf16));
    /// assert!(Format::F16.holds(Format::E4m3) && !Format::Bf16.holds(Format::F32));
    /// ```
    pub fn holds(self, other: Format) -> bool {
        let (s, o) = (self.info(), other.info());
        s.precision() >= o.precision() && s.emin <= o.emin && s.max >= o.max
    }

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
    pub fn parse(s: &str) -> Result<Format, UnknownFormat> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f64" | "float64" => Format::F64,
            "f32" | "float32" | "fp32" => Format::F32,
            "bf16" | "bfloat16" => Format::Bf16,
            "f16" | "float16" | "fp16" | "half" => Format::F16,
            "e4m3" | "fp8_e4m3" | "float8_e4m3fn" | "e4m3fn" => Format::E4m3,
            "e5m2" | "fp8_e5m2" | "float8_e5m2" => Format::E5m2,
            _ => return Err(UnknownFormat(s.to_string())),
        })
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A format name [`Format::parse`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype '{0}' (expected one of f32, bf16, f16, e4m3, e5m2, f64)")]
pub struct UnknownFormat(pub String);

impl std::str::FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::parse(s)
    }
}
