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
mod kind;
mod round;

pub use fp8::{decode_fp8, encode_fp8, encode_scaled};
pub use kind::{pow2, Format, FormatInfo, Overflow, UnknownFormat};
pub use round::{gamma, round_slice, round_to, ulp};
