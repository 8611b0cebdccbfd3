//! Copies of operands into row-major buffers: widened, and transposed where the source is a
//! transposed view (the streamed reference's left blocks, wgrad's `lhs_gᵀ` among them).

use ndarray::{ArrayView2, ArrayViewMut2, ShapeBuilder};

/// `buf` as a `(rows, cols)` matrix (grown when needed, never shrunk; not cleared).
pub(crate) fn matrix<T: Copy + Default>(
    buf: &mut Vec<T>,
    rows: usize,
    cols: usize,
) -> ArrayViewMut2<'_, T> {
    let len = rows * cols;
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    ArrayViewMut2::from_shape((rows, cols), &mut buf[..len]).expect("the buffer holds rows·cols")
}

/// The row stride of a [`widen`]ed copy with `cols` columns: 8 values past them (64 bytes of
/// f64). Rows a multiple of 4 KiB apart (any power-of-two width from 512 f64) all fall in one
/// set of the L1 cache, where the kernel's register tile reads its eight rows down a band
/// beside a band tile of `b` that fills the cache: measured on the AVX-512 values kernel,
/// 10 - 15% faster with the rows 64 bytes off.
pub(crate) fn padded(cols: usize) -> usize {
    cols + 8
}

/// Copies `src` into `dst` (widened to f64, or to f32), laid out row by row with the shape of
/// `src`, the rows [`padded`] apart; returns the copy.
pub(crate) fn widen<'d, S: Copy, T: Copy + Default>(
    src: ArrayView2<S>,
    dst: &'d mut Vec<T>,
    conv: impl Fn(S) -> T,
) -> ArrayView2<'d, T> {
    let (rows, cols) = src.dim();
    if rows == 0 || cols == 0 {
        return ArrayView2::from_shape((rows, cols), &dst[..0]).expect("an empty view");
    }
    let stride = padded(cols);
    let len = rows * stride;
    if dst.len() < len {
        dst.resize(len, T::default());
    }
    let mut d = ArrayViewMut2::from_shape((rows, cols).strides((stride, 1)), &mut dst[..len])
        .expect("the buffer holds rows of the padded stride");
    if src.strides()[1] == 1 || rows < 2 || cols < 2 {
        d.zip_mut_with(&src, |d, s| *d = conv(*s));
    } else {
        // A transposed operand (dgrad's rhs_gᵀ, wgrad's lhs_gᵀ): copied in strips of
        // `STRIP` rows, walking the columns. The strip's destination rows are `cols` values
        // apart, for a power-of-two width a multiple of 4 KiB, so they all fall in one set
        // of the L1 cache; eight of them fit its ways (32 × 32 tiles did not, and thrashed).
        // Where the source's columns are contiguous (unit row stride: a transposed view), a
        // strip is read as 8 × 8 tiles, eight contiguous values per column, and each tile's
        // rows are written eight contiguous values at a time.
        const STRIP: usize = 8;
        let by_tiles = src.strides()[0] == 1;
        let (full_rows, full_cols) = if by_tiles {
            (rows - rows % STRIP, cols - cols % STRIP)
        } else {
            (0, 0)
        };
        let col_stride = src.strides()[1];
        for r0 in (0..full_rows).step_by(STRIP) {
            for c0 in (0..full_cols).step_by(STRIP) {
                let mut tile = [[T::default(); STRIP]; STRIP];
                for (ci, column) in (c0..c0 + STRIP).enumerate() {
                    // SAFETY: rows r0..r0 + 8 of column `column` lie inside `src`, one
                    // element apart (unit row stride).
                    let v: [S; STRIP] = unsafe {
                        std::ptr::read_unaligned(
                            src.as_ptr()
                                .offset(column as isize * col_stride + r0 as isize)
                                as *const [S; STRIP],
                        )
                    };
                    for (ri, x) in v.into_iter().enumerate() {
                        tile[ri][ci] = conv(x);
                    }
                }
                for (ri, row) in tile.iter().enumerate() {
                    let mut out = d.row_mut(r0 + ri);
                    let out = out.as_slice_mut().expect("a row is contiguous");
                    out[c0..c0 + STRIP].copy_from_slice(row);
                }
            }
        }
        // What the tiles left: the right edge of each full strip, then the rows below them.
        let strip = |d: &mut ArrayViewMut2<T>, r0: usize, r1: usize, c0: usize| {
            for c in c0..cols {
                for r in r0..r1 {
                    // SAFETY: r < rows and c < cols, the shape of both views.
                    unsafe { *d.uget_mut((r, c)) = conv(*src.uget((r, c))) };
                }
            }
        };
        for r0 in (0..full_rows).step_by(STRIP) {
            strip(&mut d, r0, r0 + STRIP, full_cols);
        }
        for r0 in (full_rows..rows).step_by(STRIP) {
            strip(&mut d, r0, (r0 + STRIP).min(rows), 0);
        }
    }
    ArrayView2::from_shape((rows, cols).strides((stride, 1)), &dst[..len])
        .expect("the buffer holds rows of the padded stride")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    /// A copy holds the source's values, row-major or transposed, its rows [`padded`] apart;
    /// an empty source gives an empty copy.
    #[test]
    fn widened_copies_hold_the_values() {
        let src = Array2::from_shape_fn((19, 13), |(i, j)| (i * 13 + j) as f32);
        let mut buf = Vec::new();
        for view in [
            src.view(),
            src.t(),
            src.slice(ndarray::s![..0, ..]),
            src.slice(ndarray::s![.., ..0]),
        ] {
            let copy = widen(view, &mut buf, f64::from);
            assert_eq!(copy.dim(), view.dim());
            if view.nrows() > 1 && view.ncols() > 0 {
                assert_eq!(copy.strides(), &[padded(view.ncols()) as isize, 1]);
            }
            assert_eq!(copy, view.mapv(f64::from));
        }
    }
}
