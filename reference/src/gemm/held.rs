//! Outputs held as they were written: in f32 when the implementation wrote f32 (its output
//! format is f32 or narrower), in f64 when it wrote f64.
//!
//! Widening every output to f64 doubled the memory of the largest arrays a check holds (at
//! DeepSeek-V3 size `drhs` is 3.8 G elements: 15 GB in f32, 30 GB in f64). Every f32 value is
//! an f64 value exactly, so the comparison reads an f32 output a row at a time, widened into a
//! reused buffer ([`OutView2::row_f64`]), and sees the same numbers as it would have from a
//! widened copy.

use std::borrow::Cow;

use ndarray::{s, Array, ArrayView, Axis, Dimension, Ix2, Ix3, RemoveAxis};

use crate::protocol::{dims, FileError, Stored};

/// An output array in the precision it was written in.
#[derive(Debug, Clone, PartialEq)]
pub enum OutArray<D: Dimension> {
    F32(Array<f32, D>),
    F64(Array<f64, D>),
}

/// A 2-D output (`out`, `dlhs`).
pub type OutArray2 = OutArray<Ix2>;
/// A 3-D output (`drhs`).
pub type OutArray3 = OutArray<Ix3>;

/// A view of an [`OutArray`].
#[derive(Debug, Clone, Copy)]
pub enum OutView<'a, D: Dimension> {
    F32(ArrayView<'a, f32, D>),
    F64(ArrayView<'a, f64, D>),
}

/// A 2-D view (rows of `out`, `dlhs`, or one expert's `drhs`).
pub type OutView2<'a> = OutView<'a, Ix2>;

impl<D: Dimension> From<Array<f64, D>> for OutArray<D> {
    fn from(a: Array<f64, D>) -> Self {
        OutArray::F64(a)
    }
}

impl<D: Dimension> From<Array<f32, D>> for OutArray<D> {
    fn from(a: Array<f32, D>) -> Self {
        OutArray::F32(a)
    }
}

impl<D: Dimension> OutArray<D> {
    pub fn shape(&self) -> &[usize] {
        match self {
            OutArray::F32(a) => a.shape(),
            OutArray::F64(a) => a.shape(),
        }
    }

    pub fn dim(&self) -> D::Pattern {
        match self {
            OutArray::F32(a) => a.dim(),
            OutArray::F64(a) => a.dim(),
        }
    }

    pub fn view(&self) -> OutView<'_, D> {
        match self {
            OutArray::F32(a) => OutView::F32(a.view()),
            OutArray::F64(a) => OutView::F64(a.view()),
        }
    }

    /// The values as f64: borrowed when held in f64, a widened copy otherwise (for callers
    /// that are not on a large check's path: the FP8 references, training, tests).
    pub fn f64(&self) -> Cow<'_, Array<f64, D>> {
        match self {
            OutArray::F32(a) => Cow::Owned(a.mapv(f64::from)),
            OutArray::F64(a) => Cow::Borrowed(a),
        }
    }

    /// The values as a mutable f64 array, widened in place first when held in f32 (tests
    /// that plant errors; the values are unchanged).
    pub fn f64_mut(&mut self) -> &mut Array<f64, D> {
        if let OutArray::F32(a) = self {
            *self = OutArray::F64(a.mapv(f64::from));
        }
        match self {
            OutArray::F64(a) => a,
            OutArray::F32(_) => unreachable!("widened above"),
        }
    }

    /// The values as f64, consuming the array (no copy when held in f64).
    pub fn into_f64(self) -> Array<f64, D> {
        match self {
            OutArray::F32(a) => a.mapv(f64::from),
            OutArray::F64(a) => a,
        }
    }

    /// The array as a case directory stores it (a copy; f32 stays f32).
    pub fn stored(&self) -> Stored {
        match self {
            OutArray::F32(a) => Stored::F32(a.clone().into_dyn()),
            OutArray::F64(a) => Stored::F64(a.clone().into_dyn()),
        }
    }

    /// An array read from `file`: float32 or float64 of this dimensionality.
    pub fn from_stored(file: &str, stored: Stored) -> Result<OutArray<D>, FileError> {
        match stored {
            Stored::F32(a) => Ok(OutArray::F32(dims(file, a)?)),
            Stored::F64(a) => Ok(OutArray::F64(dims(file, a)?)),
            _ => Err(FileError::new(file, "expected a float32 or float64 array")),
        }
    }

    /// Whether the values are held in f32.
    pub fn is_f32(&self) -> bool {
        matches!(self, OutArray::F32(_))
    }
}

impl<D: RemoveAxis> OutArray<D> {
    /// A copy of the indices `range` of the first axis (rows of `out`, experts of `drhs`), in
    /// the precision it is held in.
    ///
    /// # Panics
    /// If `range` is not within the first axis.
    pub fn outer_range(&self, range: std::ops::Range<usize>) -> OutArray<D> {
        let slice = ndarray::Slice::from(range);
        match self {
            OutArray::F32(a) => OutArray::F32(a.slice_axis(Axis(0), slice).to_owned()),
            OutArray::F64(a) => OutArray::F64(a.slice_axis(Axis(0), slice).to_owned()),
        }
    }

    /// The sub-array at `index` of the first axis (`drhs[g]`).
    pub fn outer(&self, index: usize) -> OutView<'_, D::Smaller> {
        match self {
            OutArray::F32(a) => OutView::F32(a.index_axis(Axis(0), index)),
            OutArray::F64(a) => OutView::F64(a.index_axis(Axis(0), index)),
        }
    }
}

/// An array that can be read as an [`OutView`]: an [`OutArray`], or an f64 array.
pub trait Held<D: Dimension> {
    fn held(&self) -> OutView<'_, D>;
}

impl<D: Dimension> Held<D> for OutArray<D> {
    fn held(&self) -> OutView<'_, D> {
        self.view()
    }
}

impl<D: Dimension> Held<D> for Array<f64, D> {
    fn held(&self) -> OutView<'_, D> {
        OutView::F64(self.view())
    }
}

impl<D: Dimension> OutView<'_, D> {
    pub fn shape(&self) -> &[usize] {
        match self {
            OutView::F32(a) => a.shape(),
            OutView::F64(a) => a.shape(),
        }
    }
}

impl<'a> OutView2<'a> {
    pub fn dim(&self) -> (usize, usize) {
        match self {
            OutView::F32(a) => a.dim(),
            OutView::F64(a) => a.dim(),
        }
    }

    pub fn nrows(&self) -> usize {
        self.dim().0
    }

    pub fn ncols(&self) -> usize {
        self.dim().1
    }

    /// Element `(r, c)` as f64.
    ///
    /// # Panics
    /// When the index is out of bounds.
    pub fn at(&self, r: usize, c: usize) -> f64 {
        match self {
            OutView::F32(a) => f64::from(a[(r, c)]),
            OutView::F64(a) => a[(r, c)],
        }
    }

    /// Rows `lo..hi`.
    pub fn rows(&self, lo: usize, hi: usize) -> OutView2<'a> {
        match self {
            OutView::F32(a) => OutView::F32(a.slice_move(s![lo..hi, ..])),
            OutView::F64(a) => OutView::F64(a.slice_move(s![lo..hi, ..])),
        }
    }

    /// Row `r` as f64: borrowed when it is a contiguous f64 row, otherwise widened (or
    /// copied) into `buf`, which is reused from row to row.
    pub fn row_f64<'b>(&'b self, r: usize, buf: &'b mut Vec<f64>) -> &'b [f64] {
        match self {
            OutView::F64(a) => {
                let row = a.row(r);
                if let Some(contiguous) = row.to_slice() {
                    return contiguous;
                }
                buf.clear();
                buf.extend(row.iter().copied());
            }
            OutView::F32(a) => {
                buf.clear();
                let row = a.row(r);
                match row.to_slice() {
                    // A plain slice: the widening loop vectorises.
                    Some(s) => buf.extend(s.iter().map(|&v| f64::from(v))),
                    None => buf.extend(row.iter().map(|&v| f64::from(v))),
                }
            }
        }
        buf
    }

    /// The view as an f64 array: borrowed when held in f64, widened otherwise.
    pub fn f64(&self) -> ndarray::CowArray<'a, f64, Ix2> {
        match self {
            OutView::F32(a) => ndarray::CowArray::from(a.mapv(f64::from)),
            OutView::F64(a) => ndarray::CowArray::from(*a),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, Array3};

    /// An f32 output reads as the f64 values of the same numbers, row by row, element by
    /// element and whole; `f64_mut` widens without changing a value; `outer` is `drhs[g]`.
    #[test]
    fn f32_outputs_read_as_their_f64_values() {
        let wide = Array3::from_shape_fn((3, 4, 5), |(g, r, c)| {
            // Values an f32 holds exactly, including a subnormal and a large one.
            [1.5, -0.1f32 as f64, 1e-40f32 as f64, 3.0e38][(g + r + c) % 4]
                * (1 + g * 20 + r * 5 + c) as f64
        });
        let wide = wide.mapv(|v| f64::from(v as f32));
        let narrow: OutArray3 = wide.mapv(|v| v as f32).into();
        assert!(narrow.is_f32());
        assert_eq!(narrow.shape(), &[3, 4, 5]);
        assert_eq!(*narrow.f64(), wide);
        let mut buf = Vec::new();
        for g in 0..3 {
            let (n, w) = (narrow.outer(g), OutArray::from(wide.clone()));
            let w = w.outer(g);
            for r in 0..4 {
                assert_eq!(
                    n.row_f64(r, &mut buf).to_vec(),
                    w.row_f64(r, &mut Vec::new())
                );
                for c in 0..5 {
                    assert_eq!(n.at(r, c).to_bits(), wide[(g, r, c)].to_bits());
                }
            }
            assert_eq!(n.rows(1, 3).f64().into_owned(), wide.slice(s![g, 1..3, ..]));
        }
        let mut m = narrow.clone();
        assert_eq!(*m.f64_mut(), wide);
        assert!(!m.is_f32());
        assert_eq!(m.into_f64(), wide);
        // A transposed f64 view has no contiguous rows: its rows are copied, not misread.
        let t = Array2::from_shape_fn((4, 3), |(r, c)| (r * 3 + c) as f64);
        let tv = OutView::F64(t.t());
        assert_eq!(tv.row_f64(1, &mut buf), &[1.0, 4.0, 7.0, 10.0]);
        assert_eq!(tv.at(2, 3), 11.0);
        // The same for a transposed f32 view.
        let t32 = t.mapv(|v| v as f32);
        let tv32 = OutView::F32(t32.t());
        assert_eq!(tv32.row_f64(2, &mut buf), &[2.0, 5.0, 8.0, 11.0]);
    }
}
