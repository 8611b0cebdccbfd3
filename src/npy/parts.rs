//! `.npy` files a part at a time: an input written a slice of its first axis at a time
//! ([`Appender`]), an output read a range of its first axis at a time
//! ([`read_float_stored_range`]), so that a case too large to hold is never held whole.

use std::fs::File;
use std::path::Path;

use ndarray::ArrayD;

use moecheck_reference::protocol::{Input, Stored};

use super::format::{
    descr_size, dtype_name, header, input_shape, npy_header, one_line, WIDEN_ELEMENTS,
};
use crate::memory::elements;

/// The `.npy` descriptor an input is written with.
pub(super) fn descr_of(a: &Input<'_>) -> &'static str {
    match a {
        Input::Stored(Stored::F32(_)) | Input::F32(_) | Input::Bf16AsF32(_) => "<f4",
        Input::Stored(Stored::F64(_)) => "<f8",
        Input::Stored(Stored::I32(_)) => "<i4",
        Input::Stored(Stored::U8(_)) => "|u1",
        Input::Bf16Bits(_) | Input::F32AsBf16Bits(_) => "<u2",
    }
}

/// A `.npy` file written a slice of its first axis at a time (a case's input made a shard of
/// experts at a time, never whole): the header names the whole shape, each [`Appender::append`]
/// adds the next slice's elements (in logical C order, [`WIDEN_ELEMENTS`] converted at a time),
/// and [`Appender::finish`] checks that the whole array was written.
pub struct Appender {
    w: std::io::BufWriter<File>,
    descr: &'static str,
    /// Bytes of one element.
    size: u64,
    /// Bytes of data still to come.
    left: u64,
}

impl Appender {
    /// Creates `path` for an array of `shape` stored as `like` is (its descriptor).
    pub fn create(path: &Path, like: &Input<'_>, shape: &[usize]) -> Result<Appender, String> {
        use std::io::Write as _;
        let descr = descr_of(like);
        let size = descr_size(descr).expect("a descriptor with a size");
        let mut w = std::io::BufWriter::new(File::create(path).map_err(io_reason)?);
        w.write_all(&npy_header(descr, shape)).map_err(io_reason)?;
        Ok(Appender {
            w,
            descr,
            size,
            left: elements(shape).saturating_mul(size),
        })
    }

    /// Appends the elements of `a` (stored as the file is).
    pub fn append(&mut self, a: Input<'_>) -> Result<(), String> {
        if descr_of(&a) != self.descr {
            return Err(format!(
                "a slice of {} appended to a file of {}",
                dtype_name(descr_of(&a)),
                dtype_name(self.descr)
            ));
        }
        let bytes = elements(input_shape(&a)).saturating_mul(self.size);
        if bytes > self.left {
            return Err(format!(
                "{bytes} bytes appended where {} were left",
                self.left
            ));
        }
        let w = &mut self.w;
        let written = match a {
            Input::Stored(Stored::F32(v)) => put(w, v.iter().map(|x| x.to_le_bytes())),
            Input::Stored(Stored::F64(v)) => put(w, v.iter().map(|x| x.to_le_bytes())),
            Input::Stored(Stored::I32(v)) => put(w, v.iter().map(|x| x.to_le_bytes())),
            Input::Stored(Stored::U8(v)) => put(w, v.iter().map(|x| [*x])),
            Input::F32(v) => put(w, v.iter().map(|x| x.to_le_bytes())),
            Input::Bf16AsF32(v) => put(w, v.iter().map(|x| f32::from(*x).to_le_bytes())),
            Input::Bf16Bits(v) => put(w, v.iter().map(|x| x.to_bits().to_le_bytes())),
            Input::F32AsBf16Bits(v) => {
                // Every value is a bf16 value: its low 16 bits are 0 (else the case was wrong).
                if let Some(x) = v.iter().find(|x| x.to_bits() & 0xffff != 0) {
                    return Err(format!(
                        "{x} is not a bf16 value: it cannot be stored compact"
                    ));
                }
                put(
                    w,
                    v.iter().map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()),
                )
            }
        };
        // Counted once written: a refused slice owes nothing, and `finish` still sees what
        // is missing.
        written?;
        self.left -= bytes;
        Ok(())
    }

    /// Flushes the file; an error when less than the whole array was appended.
    pub fn finish(mut self) -> Result<(), String> {
        use std::io::Write as _;
        if self.left > 0 {
            return Err(format!("{} bytes of data were never written", self.left));
        }
        self.w.flush().map_err(io_reason)
    }
}

pub(super) fn io_reason(e: std::io::Error) -> String {
    one_line(&e.to_string())
}

/// Writes the elements `items` (little-endian bytes, in logical C order) to `w`,
/// [`WIDEN_ELEMENTS`] at a time.
fn put<const N: usize>(
    w: &mut impl std::io::Write,
    items: impl Iterator<Item = [u8; N]>,
) -> Result<(), String> {
    let mut buf: Vec<u8> = Vec::with_capacity(WIDEN_ELEMENTS * N);
    for x in items {
        buf.extend_from_slice(&x);
        if buf.len() >= WIDEN_ELEMENTS * N {
            w.write_all(&buf).map_err(io_reason)?;
            buf.clear();
        }
    }
    w.write_all(&buf).map_err(io_reason)
}

/// The indices `range` of the first axis of the float32 or float64 array of exactly `shape`
/// stored at `path` (rows of `out`, experts of `drhs`), as stored: only that part of the file
/// is read (a case checked a shard of experts at a time never holds an output whole). C or
/// Fortran order, either byte order. The header is checked as [`read_float_stored`] checks
/// it; `range` must lie within the first axis.
pub fn read_float_stored_range(
    path: &Path,
    shape: &[usize],
    range: std::ops::Range<usize>,
) -> Result<Stored, String> {
    let head = header(path)?;
    let size = match head.descr.get(1..) {
        Some("f4") => 4,
        Some("f8") => 8,
        _ => {
            return Err(format!(
                "holds {} elements, expected a float32 or float64 array",
                head.dtype_name()
            ))
        }
    };
    let big = head.descr.starts_with('>');
    if head.shape != shape {
        return Err(format!("has shape {:?}, expected {:?}", head.shape, shape));
    }
    assert!(
        !shape.is_empty() && range.end <= shape[0] && range.start <= range.end,
        "{range:?} is not within {shape:?}"
    );
    let file = File::open(path).map_err(io_reason)?;
    let len = file.metadata().map_err(io_reason)?.len();
    let data = len.saturating_sub(head.data_offset) as u128;
    let want = shape.iter().map(|s| *s as u128).product::<u128>() * size as u128;
    if want > data {
        return Err(format!(
            "is truncated: {data} bytes of data, shape {shape:?} of {} needs {want}",
            head.dtype_name()
        ));
    }
    if want < data {
        // As the whole file's reader (ndarray-npy) refuses it: the shape says less than is there.
        return Err(format!(
            "malformed .npy: {} extra bytes after the data of shape {shape:?} of {}",
            data - want,
            head.dtype_name()
        ));
    }
    let inner = elements(&shape[1..]) as usize;
    let mut part_shape = shape.to_vec();
    part_shape[0] = range.len();
    let count = range.len() * inner;
    // The byte runs the part is made of, in the order its elements are laid out: one run in C
    // order; in Fortran order (the first axis fastest) one per index of the other axes.
    let runs = if head.fortran_order && shape.len() > 1 {
        Runs {
            first: head.data_offset + range.start as u64 * size,
            count: inner,
            step: shape[0] as u64 * size,
            len: range.len() * size as usize,
        }
    } else {
        Runs {
            first: head.data_offset + (range.start * inner) as u64 * size,
            count: 1,
            step: 0,
            len: count * size as usize,
        }
    };
    let dim = ndarray::IxDyn(&part_shape);
    let shape_of = |d: ndarray::IxDyn| -> ndarray::StrideShape<ndarray::IxDyn> {
        if head.fortran_order {
            ndarray::ShapeBuilder::f(d).into()
        } else {
            d.into()
        }
    };
    let shaped = |e: ndarray::ShapeError| format!("malformed .npy: {e}");
    Ok(if size == 4 {
        let v = runs
            .values(&file, count, big, f32::from_le_bytes, f32::from_be_bytes)
            .map_err(io_reason)?;
        Stored::F32(ArrayD::from_shape_vec(shape_of(dim), v).map_err(shaped)?)
    } else {
        let v = runs
            .values(&file, count, big, f64::from_le_bytes, f64::from_be_bytes)
            .map_err(io_reason)?;
        Stored::F64(ArrayD::from_shape_vec(shape_of(dim), v).map_err(shaped)?)
    })
}

/// `count` runs of `len` bytes of a file, the first at `first`, each `step` after the last.
struct Runs {
    first: u64,
    count: usize,
    step: u64,
    len: usize,
}

impl Runs {
    /// The `count` values of `N` bytes the runs hold, decoded little- or (`big`) big-endian.
    fn values<const N: usize, T>(
        &self,
        file: &File,
        count: usize,
        big: bool,
        le: fn([u8; N]) -> T,
        be: fn([u8; N]) -> T,
    ) -> std::io::Result<Vec<T>> {
        let decode = if big { be } else { le };
        let mut v = Vec::with_capacity(count);
        self.each(file, N, |bytes| {
            let words = bytes.chunks_exact(N);
            v.extend(words.map(|b| decode(b.try_into().expect("N bytes"))));
        })?;
        Ok(v)
    }

    /// Hands the runs' bytes to `take`, in order, in pieces of whole elements of `size`
    /// bytes. Few or far-apart runs are read one by one, at most [`READ_BYTES`] at a time;
    /// many short runs close together (a Fortran-order file's) are read through a window of
    /// [`READ_BYTES`] moved forward over the file, so each byte is read once and no more than
    /// the window is held.
    fn each(&self, file: &File, size: usize, mut take: impl FnMut(&[u8])) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt as _;
        let at = |i: usize| self.first + i as u64 * self.step;
        if self.count <= 64 || self.step >= FAR || self.len >= READ_BYTES {
            let piece = READ_BYTES / size * size;
            let mut buf = vec![0u8; piece.min(self.len)];
            for i in 0..self.count {
                let mut done = 0;
                while done < self.len {
                    let n = piece.min(self.len - done);
                    file.read_exact_at(&mut buf[..n], at(i) + done as u64)?;
                    take(&buf[..n]);
                    done += n;
                }
            }
            return Ok(());
        }
        let end = at(self.count - 1) + self.len as u64;
        let mut window = vec![0u8; READ_BYTES];
        let (mut from, mut to) = (0u64, 0u64);
        for i in 0..self.count {
            let (start, stop) = (at(i), at(i) + self.len as u64);
            if start < from || stop > to {
                from = start;
                to = (start + READ_BYTES as u64).min(end);
                file.read_exact_at(&mut window[..(to - from) as usize], from)?;
            }
            take(&window[(start - from) as usize..(stop - from) as usize]);
        }
        Ok(())
    }
}

/// Runs this far apart (bytes) are read one by one rather than through a window.
const FAR: u64 = 1 << 16;

/// The most bytes of a file [`read_float_stored_range`] reads at once.
const READ_BYTES: usize = 8 << 20;
