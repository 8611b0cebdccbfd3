//! Fine-grained FP8 scaling: one scale per block of a 2-D tensor, as DeepSeek-V3's recipe
//! (DeepGEMM) and the OCP Microscaling format (MXFP8) define it. Each way a block's scale and
//! cast are computed is a convention ([`BlockRecipe`]), with the public code it follows.
//!
//! Blocks are `rows × cols` tiles from the top-left corner; the last ones along each axis may
//! be partial (DeepGEMM pads with zeros, which change no amax). `scale_inv[i, j]` belongs to
//! block `(i, j)`, row-major, and the dequantised value is `decode(q) · scale_inv`.
//!
//! * **DeepGEMM** (`per_token_cast_to_fp8`: `1 × 128` blocks; `per_block_cast_to_fp8`:
//!   `128 × 128`): `amax = max(max |x|, 1e-4)` in f32; `scale_inv = fl32(amax / 448)`; the
//!   cast is `e4m3(fl32(x · fl32(448 / amax)))` (`mul`, DeepGEMM's tests until 2025) or
//!   `e4m3(fl32(x · fl32(1 / scale_inv)))` (`reciprocal`, its `deep_gemm/utils` since), with
//!   `scale_inv` first rounded up to a power of two when `ue8m0` (`ceil_to_ue8m0`, for the
//!   UE8M0 scales of Blackwell's kernels).
//! * **MX** (OCP Microscaling Formats v1.0, §5.3: `1 × 32` blocks along the last axis): the
//!   shared scale is `X = 2^E` (an E8M0 value, `E ∈ [−127, 127]`) and an element is
//!   `cast(x / X)`, saturating to `±max` (§6.3 leaves overflow to the implementation; torchao
//!   and Transformer Engine clamp). `E` is `floor(log2 amax) − emax` (`floor`: the
//!   specification's, emax = 8 for E4M3, 15 for E5M2) or `ceil(log2(amax / max))` (`rceil`:
//!   NVIDIA's, torchao's `RCEIL`), clamped to the E8M0 range. A block whose amax is 0 gets
//!   `E = −127` (nothing to scale; its elements are 0), a convention of ours.

use ndarray::{Array2, ArrayView2};
use serde::{Deserialize, Serialize};

use super::recipe::fp8_max;
use crate::format::{encode_fp8, Format, Overflow};

/// DeepGEMM's amax floor.
pub const DEEPGEMM_AMAX_MIN: f32 = 1e-4;

/// How DeepGEMM casts a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeepGemmCast {
    /// `x · fl32(448 / amax)`.
    Mul,
    /// `x · fl32(1 / scale_inv)`.
    Reciprocal,
}

/// How an MX block's shared exponent is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MxRounding {
    /// `floor(log2 amax) − emax` (OCP v1.0).
    Floor,
    /// `ceil(log2(amax / max))` (NVIDIA, torchao `RCEIL`).
    Rceil,
}

/// A block recipe: how each block's scale and cast are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockRecipe {
    DeepGemm { cast: DeepGemmCast, ue8m0: bool },
    Mx { rounding: MxRounding },
}

/// A block-quantised 2-D tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockQuantized {
    pub format: Format,
    /// `(rows, cols)` of a block.
    pub block: (usize, usize),
    /// FP8 bytes, the input's shape.
    pub q: Array2<u8>,
    /// One per block, `(ceil(R / rows), ceil(C / cols))`.
    pub scale_inv: Array2<f32>,
}

impl BlockQuantized {
    /// `decode(q) · scale_inv` of each element's block, exact in f64.
    pub fn dequantize(&self) -> Array2<f64> {
        let (br, bc) = self.block;
        Array2::from_shape_fn(self.q.dim(), |(r, c)| {
            crate::format::decode_fp8(self.q[(r, c)], self.format)
                * f64::from(self.scale_inv[(r / br, c / bc)])
        })
    }
}

/// `2^e` as f32 for `e ∈ [−127, 127]` (`2^−127` is an f32 subnormal, exact).
fn pow2_f32(e: i32) -> f32 {
    (2f64).powi(e) as f32
}

/// The unbiased exponent `floor(log2 |v|)` of a finite, non-zero f32 (subnormals included).
fn floor_log2(v: f32) -> i32 {
    let bits = v.abs().to_bits();
    let exp = (bits >> 23) as i32;
    if exp == 0 {
        // Subnormal: 2^-126 · m / 2^23 with m < 2^23.
        -149 + (31 - (bits & 0x7f_ffff).leading_zeros() as i32)
    } else {
        exp - 127
    }
}

/// The smallest power of two `>= v` (finite, positive), as DeepGEMM's `ceil_to_ue8m0`
/// computes it on the f32 bits (exponent plus one unless the mantissa is 0, clamped to the
/// normal exponents).
fn ceil_pow2(v: f32) -> f32 {
    let bits = v.to_bits();
    let exp = ((bits >> 23) & 0xff) + u32::from(bits & 0x7f_ffff != 0);
    f32::from_bits(exp.clamp(1, 254) << 23)
}

/// Quantises `x` in `block`s with `recipe` to `format`. NaN in a block makes its amax NaN
/// and its bytes NaN where the format has one (not specified by either source; not tested).
///
/// # Panics
///
/// If a block dimension is 0 or `format` is not an FP8 format.
pub fn quantize_blocks(
    x: ArrayView2<f32>,
    block: (usize, usize),
    format: Format,
    recipe: BlockRecipe,
) -> BlockQuantized {
    let (br, bc) = block;
    assert!(br > 0 && bc > 0, "quantize_blocks: a block dimension is 0");
    let (rows, cols) = x.dim();
    let (nr, nc) = (rows.div_ceil(br), cols.div_ceil(bc));
    let max = fp8_max(format);
    let emax = match format {
        Format::E4m3 => 8,
        _ => 15,
    };
    let mut q = Array2::<u8>::zeros((rows, cols));
    let mut scale_inv = Array2::<f32>::zeros((nr, nc));
    for bi in 0..nr {
        for bj in 0..nc {
            let (r0, r1) = (bi * br, ((bi + 1) * br).min(rows));
            let (c0, c1) = (bj * bc, ((bj + 1) * bc).min(cols));
            let tile = x.slice(ndarray::s![r0..r1, c0..c1]);
            let amax = tile.fold(0f32, |m, v| {
                if v.is_nan() || m.is_nan() {
                    f32::NAN
                } else {
                    m.max(v.abs())
                }
            });
            // Each element's value before the cast, and the block's scale_inv.
            let (si, value): (f32, Box<dyn Fn(f32) -> f64>) = match recipe {
                BlockRecipe::DeepGemm { cast, ue8m0 } => {
                    let a = amax.max(DEEPGEMM_AMAX_MIN);
                    let mut sf = a / max;
                    if ue8m0 {
                        sf = ceil_pow2(sf);
                    }
                    let mul = match (cast, ue8m0) {
                        (DeepGemmCast::Mul, false) => max / a,
                        _ => 1.0 / sf,
                    };
                    (sf, Box::new(move |v: f32| f64::from(v * mul)))
                }
                BlockRecipe::Mx { rounding } => {
                    let e = if amax == 0.0 || amax.is_nan() {
                        -127
                    } else {
                        match rounding {
                            MxRounding::Floor => floor_log2(amax) - emax,
                            MxRounding::Rceil => {
                                // ceil(log2(amax / max)), exactly: the smallest e with
                                // amax <= max · 2^e.
                                let mut e = floor_log2(amax) - floor_log2(max) - 1;
                                while f64::from(amax) > f64::from(max) * 2f64.powi(e) {
                                    e += 1;
                                }
                                e
                            }
                        }
                    }
                    .clamp(-127, 127);
                    let x_inv = 2f64.powi(-e);
                    (pow2_f32(e), Box::new(move |v: f32| f64::from(v) * x_inv))
                }
            };
            scale_inv[(bi, bj)] = si;
            for r in r0..r1 {
                for c in c0..c1 {
                    q[(r, c)] = encode_fp8(value(x[(r, c)]), format, Overflow::Saturate);
                }
            }
        }
    }
    BlockQuantized {
        format,
        block,
        q,
        scale_inv,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn exponents_and_powers_of_two() {
        assert_eq!(floor_log2(1.0), 0);
        assert_eq!(floor_log2(448.0), 8);
        assert_eq!(floor_log2(0.75), -1);
        assert_eq!(floor_log2(f32::from_bits(1)), -149);
        assert_eq!(ceil_pow2(1.0), 1.0);
        assert_eq!(ceil_pow2(1.5), 2.0);
        assert_eq!(ceil_pow2(0.3), 0.5);
    }

    #[test]
    fn mx_scales_by_the_specified_exponent() {
        // amax 448: floor gives 2^(8 - 8) = 1; rceil 2^ceil(log2 1) = 1. amax 449: floor 1
        // (449 saturates to 448), rceil 2 (449 / 2 fits).
        let x = array![[448.0f32, 1.0], [449.0, -2.0]];
        let f = quantize_blocks(
            x.view(),
            (1, 2),
            Format::E4m3,
            BlockRecipe::Mx {
                rounding: MxRounding::Floor,
            },
        );
        assert_eq!(f.scale_inv, array![[1.0], [1.0]]);
        assert_eq!(f.dequantize()[(1, 0)], 448.0);
        let r = quantize_blocks(
            x.view(),
            (1, 2),
            Format::E4m3,
            BlockRecipe::Mx {
                rounding: MxRounding::Rceil,
            },
        );
        assert_eq!(r.scale_inv, array![[1.0], [2.0]]);
        assert_eq!(r.dequantize()[(1, 0)], 448.0);
        // A zero block: the smallest scale, zero bytes.
        let z = quantize_blocks(
            Array2::<f32>::zeros((1, 4)).view(),
            (1, 4),
            Format::E4m3,
            BlockRecipe::Mx {
                rounding: MxRounding::Floor,
            },
        );
        assert_eq!(z.scale_inv[(0, 0)], pow2_f32(-127));
        assert!(z.q.iter().all(|b| *b == 0));
    }

    #[test]
    fn deepgemm_clamps_amax_and_maps_it_to_the_format_max() {
        let x = array![[1e-6f32, -2e-6], [3.0, -6.0]];
        let b = quantize_blocks(
            x.view(),
            (1, 2),
            Format::E4m3,
            BlockRecipe::DeepGemm {
                cast: DeepGemmCast::Mul,
                ue8m0: false,
            },
        );
        assert_eq!(b.scale_inv[(0, 0)], 1e-4f32 / 448.0);
        assert_eq!(b.scale_inv[(1, 0)], 6.0f32 / 448.0);
        // The block's amax becomes exactly ±448.
        assert_eq!(crate::format::decode_fp8(b.q[(1, 1)], Format::E4m3), -448.0);
        let u = quantize_blocks(
            x.view(),
            (1, 2),
            Format::E4m3,
            BlockRecipe::DeepGemm {
                cast: DeepGemmCast::Reciprocal,
                ue8m0: true,
            },
        );
        // 6 / 448 rounded up to a power of two: 2^-6.
        assert_eq!(u.scale_inv[(1, 0)], 1.0 / 64.0);
    }
}
