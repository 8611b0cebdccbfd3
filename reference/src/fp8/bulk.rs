//! The recipe's per-value steps over whole operands, on every core: the amax of each scope,
//! the cast of each scope with its scale, and the decoding of the bytes. The same values as
//! [`amax`], [`quantize_value`] and [`decode_fp8`] taken one at a time (tests below); at
//! DeepSeek-V3's size an operand holds up to 3.8 G values, and each is cast twice (the model's
//! operands and the reference's).

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2};

use crate::format::{decode_fp8, encode_scaled, Format, Overflow};
use crate::par::{map_by_cost, zip_rows};

#[cfg(doc)]
use super::recipe::{amax, quantize_value};

/// Values per parallel piece of a scope's amax.
const PIECE: usize = 1 << 16;

/// [`amax`] of every scope of `x` (rows `off[i]..off[i + 1]`), `None` for a scope without
/// values. On the f32 bits: `|x|` is the bits without the sign, and non-negative floats order
/// as their bits do, NaN above infinity, so one integer maximum is the amax (NaN when a NaN
/// is there), which the compiler vectorises; large scopes are cut into pieces, in parallel.
pub fn scope_amaxes(x: ArrayView2<f32>, off: &[usize]) -> Vec<Option<f32>> {
    let bits = |m: u32, v: &f32| m.max(v.to_bits() & 0x7fff_ffff);
    let scopes = off.len().saturating_sub(1);
    let mut pieces = Vec::new();
    for i in 0..scopes {
        let per = (PIECE / x.ncols().max(1)).max(1);
        for start in (off[i]..off[i + 1]).step_by(per) {
            let end = (start + per).min(off[i + 1]);
            pieces.push((i, x.slice_move(s![start..end, ..])));
        }
    }
    let found = map_by_cost(
        pieces,
        |(_, p)| p.len(),
        |(i, p)| {
            let m = match p.as_slice() {
                Some(v) => v.iter().fold(0, bits),
                None => p.iter().fold(0, bits),
            };
            (i, m, !p.is_empty())
        },
    );
    let mut out: Vec<Option<u32>> = vec![None; scopes];
    for (i, m, any) in found {
        if any {
            out[i] = Some(out[i].map_or(m, |o| o.max(m)));
        }
    }
    out.into_iter()
        .map(|b| {
            b.map(|b| {
                if b > 0x7f80_0000 {
                    f32::NAN
                } else {
                    f32::from_bits(b)
                }
            })
        })
        .collect()
}

/// The bytes of `x` cast scope by scope: row `r` of scope `i` is [`quantize_value`]`(x,
/// scales[i])` of each value (through [`encode_scaled`]); rows in no scope are 0.
pub fn quantize_scopes(
    x: ArrayView2<f32>,
    off: &[usize],
    scales: &[f32],
    format: Format,
    overflow: Overflow,
) -> Array2<u8> {
    let mut q = Array2::<u8>::zeros(x.dim());
    for (i, &scale) in scales.iter().enumerate() {
        let rows = s![off[i]..off[i + 1], ..];
        zip_rows(q.slice_mut(rows), x.slice(rows), |q, x| {
            cast_rows(q, x, scale, format, overflow)
        });
    }
    q
}

fn cast_rows(
    mut q: ArrayViewMut2<u8>,
    x: ArrayView2<f32>,
    scale: f32,
    format: Format,
    overflow: Overflow,
) {
    for (mut q, x) in q.rows_mut().into_iter().zip(x.rows()) {
        match (q.as_slice_mut(), x.as_slice()) {
            (Some(q), Some(x)) => encode_scaled(x, scale, q, format, overflow),
            _ => {
                let row = x.to_vec();
                let mut bytes = vec![0u8; row.len()];
                encode_scaled(&row, scale, &mut bytes, format, overflow);
                q.assign(&ndarray::ArrayView1::from(&bytes));
            }
        }
    }
}

/// Every byte of `q` decoded and stored by `to` (exact in f32, and in bf16: every FP8 value
/// is one), from a table, in parallel.
pub fn decode_all<T: Copy + Default + Send + Sync>(
    q: &Array2<u8>,
    format: Format,
    to: impl Fn(f64) -> T,
) -> Array2<T> {
    let table: [T; 256] = std::array::from_fn(|b| to(decode_fp8(b as u8, format)));
    let mut out = Array2::<T>::default(q.dim());
    zip_rows(out.view_mut(), q.view(), |mut o, q| {
        o.zip_mut_with(&q, |o, &b| *o = table[b as usize])
    });
    out
}

#[cfg(test)]
mod tests {
    use super::super::recipe::{amax, quantize_value};
    use super::*;

    /// A (rows, cols) array of mixed magnitudes with zeros, NaN and ±inf placed by `seed`.
    fn values(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
        let mut h = seed;
        Array2::from_shape_fn((rows, cols), |_| {
            h = crate::seed::mix(h);
            match h % 1000 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3..=30 => 0.0,
                _ => f32::from_bits((h >> 32) as u32 & 0xbfff_ffff) * 1e-20,
            }
        })
    }

    /// Each scope's amax is `amax` of its values: empty scopes, one large scope of several
    /// pieces (with and without a NaN, with an inf and no NaN), -0, rows without columns, a
    /// column view (not contiguous).
    #[test]
    fn scope_amaxes_are_amax() {
        let mut x = values(300, 700, 5);
        x.mapv_inplace(|v| if v.is_finite() { v } else { 1.5 });
        x[(3, 4)] = -7e30;
        let mut no_nan = values(300, 700, 7);
        no_nan.mapv_inplace(|v| if v.is_nan() { 1.0 } else { v });
        assert!(no_nan.iter().any(|v| v.is_infinite()));
        for (off, x) in [
            (vec![0, 0, 10, 10, 200, 300], x.clone()),
            (vec![0, 300], x.clone()),
            (vec![0, 120, 121, 250], values(300, 700, 9)),
            (vec![0, 150, 300], no_nan),
            (vec![0, 2, 2], Array2::from_elem((2, 3), -0.0)),
            (vec![0, 1, 2], Array2::zeros((2, 0))),
        ] {
            let got = scope_amaxes(x.view(), &off);
            let want: Vec<_> = off
                .windows(2)
                .map(|w| amax(x.slice(s![w[0]..w[1], ..]).iter().copied()))
                .collect();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                let same = match (g, w) {
                    (Some(g), Some(w)) => g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    (None, None) => true,
                    _ => false,
                };
                assert!(same, "{off:?}: {got:?} against {want:?}");
            }
            let t = x.t();
            let cols = scope_amaxes(t, &[0, t.nrows()]);
            let whole = amax(x.iter().copied());
            assert!(
                cols[0] == whole
                    || cols[0]
                        .zip(whole)
                        .is_some_and(|(a, b)| a.is_nan() && b.is_nan())
            );
        }
    }

    /// Each byte is `quantize_value` with its scope's scale (rows past the scopes 0, a
    /// transposed view too), and decodes to `decode_fp8` of it.
    #[test]
    fn quantized_and_decoded_values_are_the_recipes() {
        let x = values(130, 90, 11);
        let off = [0, 7, 7, 80];
        let scales = [448.0 / 3.0, 2.0, 1.0e20];
        for view in [x.view(), x.t()] {
            for (f, o) in [
                (Format::E4m3, Overflow::Saturate),
                (Format::E5m2, Overflow::Ieee),
            ] {
                let q = quantize_scopes(view, &off, &scales, f, o);
                for ((r, c), b) in q.indexed_iter() {
                    let i = (0..3).find(|&i| off[i] <= r && r < off[i + 1]);
                    let want = i.map_or(0, |i| quantize_value(view[(r, c)], scales[i], f, o));
                    assert_eq!(*b, want, "{f} ({r}, {c})");
                }
                let d = decode_all(&q, f, |v| v as f32);
                for (v, b) in d.iter().zip(q.iter()) {
                    let want = decode_fp8(*b, f) as f32;
                    assert!(v.to_bits() == want.to_bits() || (v.is_nan() && want.is_nan()));
                }
            }
        }
    }
}
