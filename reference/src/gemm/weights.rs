//! The weights `rhs (G, K, N)` held in the narrowest format that holds their values: bf16
//! when the case's values are bf16 values (half the bytes of f32), f32 otherwise.
//!
//! The weights are the largest input by far (DeepSeek-V3's expert layer: 3.8 G values, 15 GB
//! in f32, 7.5 GB in bf16). A bf16 value widens to f32 and to f64 exactly, so every reader
//! sees the same numbers whichever way they are held: the f64 kernel reads bf16 weights where
//! they lie and widens them in registers ([`crate::engine::Operand`]); the emulated kernel
//! widens one expert at a time; readers of the whole array that are not on a large check's
//! path (FP8 quantisation, case files, the whole-array test reference) take a widened copy,
//! and GPU uploads send the bf16 bits as they are.

use std::borrow::Cow;

use half::bf16;
use ndarray::{Array3, ArrayView2, Axis};

use crate::format::Format;

/// `b` as an f32: its bits are an f32's upper half. Exact for every bf16 (NaN stays NaN), and
/// a shift, where `half`'s conversion tests each value for NaN.
#[inline(always)]
pub fn bf16_to_f32(b: bf16) -> f32 {
    f32::from_bits(u32::from(b.to_bits()) << 16)
}

/// The bf16 whose value `v` is: `v`'s upper half. Exact when `v` is a bf16 value (its low 16
/// bits are 0), which the callers have checked.
#[inline(always)]
pub fn bf16_of(v: f32) -> bf16 {
    debug_assert_eq!(v.to_bits() & 0xFFFF, 0, "{v:e} is not a bf16 value");
    bf16::from_bits((v.to_bits() >> 16) as u16)
}

/// The weights of a grouped GEMM, `(G, K, N)`. Equal when their values are, however they are
/// held.
#[derive(Debug, Clone)]
pub enum Weights {
    F32(Array3<f32>),
    Bf16(Array3<bf16>),
}

impl PartialEq for Weights {
    fn eq(&self, other: &Weights) -> bool {
        match (self, other) {
            (Weights::F32(a), Weights::F32(b)) => a == b,
            (Weights::Bf16(a), Weights::Bf16(b)) => a == b,
            _ => self.shape() == other.shape() && *self.f32() == *other.f32(),
        }
    }
}

/// One expert's `(K, N)` weight, or a view of it.
#[derive(Debug, Clone, Copy)]
pub enum WeightView<'a> {
    F32(ArrayView2<'a, f32>),
    Bf16(ArrayView2<'a, bf16>),
}

impl From<Array3<f32>> for Weights {
    fn from(a: Array3<f32>) -> Self {
        Weights::F32(a)
    }
}

impl Weights {
    /// `a` held in bf16 when `dtype` is bf16 and every value is a bf16 value (then exactly);
    /// held in f32 otherwise.
    pub fn narrowed(a: Array3<f32>, dtype: Format) -> Weights {
        let exact = |v: &f32| v.to_bits() & 0xFFFF == 0;
        if dtype == Format::Bf16 && a.iter().all(exact) {
            Weights::Bf16(a.mapv(bf16_of))
        } else {
            Weights::F32(a)
        }
    }

    pub fn dim(&self) -> (usize, usize, usize) {
        match self {
            Weights::F32(a) => a.dim(),
            Weights::Bf16(a) => a.dim(),
        }
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            Weights::F32(a) => a.shape(),
            Weights::Bf16(a) => a.shape(),
        }
    }

    /// Expert `g`'s `(K, N)` weight.
    ///
    /// # Panics
    /// When `g` is not an expert.
    pub fn expert(&self, g: usize) -> WeightView<'_> {
        match self {
            Weights::F32(a) => WeightView::F32(a.index_axis(Axis(0), g)),
            Weights::Bf16(a) => WeightView::Bf16(a.index_axis(Axis(0), g)),
        }
    }

    /// Every weight as f32: borrowed when held in f32, a widened copy otherwise (for readers
    /// of the whole array that are not on a large check's path: FP8 quantisation, GPU
    /// uploads, case files, tests).
    pub fn f32(&self) -> Cow<'_, Array3<f32>> {
        match self {
            Weights::F32(a) => Cow::Borrowed(a),
            Weights::Bf16(a) => Cow::Owned(a.mapv(bf16_to_f32)),
        }
    }

    /// Weight `(g, k, n)` as f32.
    pub fn at(&self, g: usize, k: usize, n: usize) -> f32 {
        match self {
            Weights::F32(a) => a[(g, k, n)],
            Weights::Bf16(a) => bf16_to_f32(a[(g, k, n)]),
        }
    }

    /// The weights as a mutable f32 array, widened in place first when held in bf16 (tests
    /// and properties that change weights; the values are unchanged).
    pub fn f32_mut(&mut self) -> &mut Array3<f32> {
        if let Weights::Bf16(a) = self {
            *self = Weights::F32(a.mapv(bf16_to_f32));
        }
        match self {
            Weights::F32(a) => a,
            Weights::Bf16(_) => unreachable!("widened above"),
        }
    }
}

impl<'a> WeightView<'a> {
    pub fn dim(&self) -> (usize, usize) {
        match self {
            WeightView::F32(a) => a.dim(),
            WeightView::Bf16(a) => a.dim(),
        }
    }

    /// The values widened to f64 (a copy).
    pub fn to_f64(&self) -> ndarray::Array2<f64> {
        match self {
            WeightView::F32(a) => a.mapv(f64::from),
            WeightView::Bf16(a) => a.mapv(|v| f64::from(bf16_to_f32(v))),
        }
    }

    /// The transposed view (`rhs_gᵀ`).
    pub fn t(self) -> WeightView<'a> {
        match self {
            WeightView::F32(a) => WeightView::F32(a.reversed_axes()),
            WeightView::Bf16(a) => WeightView::Bf16(a.reversed_axes()),
        }
    }

    /// The view as f32: borrowed when held in f32; otherwise widened into `buf` (reused,
    /// grown when needed), laid out row-major.
    pub fn f32_in<'b>(&self, buf: &'b mut Vec<f32>) -> ArrayView2<'b, f32>
    where
        'a: 'b,
    {
        match self {
            WeightView::F32(a) => *a,
            WeightView::Bf16(a) => {
                let (rows, cols) = a.dim();
                buf.clear();
                buf.extend(a.iter().map(|v| bf16_to_f32(*v)));
                ArrayView2::from_shape((rows, cols), &buf[..rows * cols])
                    .expect("the buffer holds rows·cols")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::s;

    /// The shifts are `half`'s conversions on every bf16 (NaN as NaN).
    #[test]
    fn shifts_are_the_conversions() {
        for bits in 0..=u16::MAX {
            let b = bf16::from_bits(bits);
            let (ours, theirs) = (bf16_to_f32(b), f32::from(b));
            assert!(ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()));
            if !ours.is_nan() {
                assert_eq!(bf16_of(ours).to_bits(), bits);
            }
        }
    }

    /// bf16 values are held in bf16 and read back as the same f32 values, by expert, element
    /// and whole; a single value that is not a bf16 value keeps the array in f32, as does
    /// another format.
    #[test]
    fn bf16_weights_read_as_their_f32_values() {
        let a = Array3::from_shape_fn((3, 4, 5), |(g, k, n)| {
            let v = (g * 20 + k * 5 + n) as f32 * 0.37 - 9.0;
            f32::from_bits(v.to_bits() & 0xFFFF_0000)
        });
        let w = Weights::narrowed(a.clone(), Format::Bf16);
        assert!(matches!(w, Weights::Bf16(_)));
        assert_eq!(w.dim(), (3, 4, 5));
        assert_eq!(*w.f32(), a);
        let mut buf = Vec::new();
        for g in 0..3 {
            let e = w.expert(g);
            assert_eq!(e.f32_in(&mut buf), a.slice(s![g, .., ..]));
            assert_eq!(e.t().f32_in(&mut buf), a.slice(s![g, .., ..]).t());
            assert_eq!(w.at(g, 3, 4).to_bits(), a[(g, 3, 4)].to_bits());
        }
        let mut inexact = a.clone();
        inexact[(1, 2, 3)] = 0.1;
        assert!(matches!(
            Weights::narrowed(inexact, Format::Bf16),
            Weights::F32(_)
        ));
        assert!(matches!(
            Weights::narrowed(a.clone(), Format::F32),
            Weights::F32(_)
        ));
        // Equal values are equal weights, however they are held.
        assert_eq!(w, Weights::F32(a.clone()));
        assert_ne!(w, Weights::F32(a.mapv(|v| -v)));
        let mut scaled = w.clone();
        scaled.f32_mut().mapv_inplace(|v| v * 2.0);
        assert!(matches!(scaled, Weights::F32(_)));
        assert_eq!(*scaled.f32(), a.mapv(|v| v * 2.0));
    }
}
