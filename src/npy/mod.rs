//! `.npy` files: every array moecheck reads or writes goes through here.
//!
//! Readers take the exact shape they expect and check the file size against it before
//! anything is allocated, so a header that claims more data than the file holds is refused
//! instead of aborting on allocation. Errors are one line (no path: callers add the file or
//! the flag that named it).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use ndarray::{Array, ArrayD, Dimension};
use ndarray_npy::{ReadNpyExt, ReadableElement, WritableElement, WriteNpyExt};

use moecheck_reference::format::Format;
use moecheck_reference::protocol::{Input, Stored};

/// The numpy name of the element type `A` reads.
fn name_of<A>() -> String {
    let t = std::any::type_name::<A>();
    match t {
        "f32" => "float32",
        "f64" => "float64",
        "i32" => "int32",
        "i64" => "int64",
        "u8" => "uint8",
        "bool" => "bool",
        other => other,
    }
    .to_string()
}

/// Why a read failed: the element type differs from the one asked (so another may fit), or
/// anything else.
enum ReadError {
    WrongType(String),
    Other(String),
}

impl ReadError {
    fn reason(self) -> String {
        match self {
            ReadError::WrongType(r) | ReadError::Other(r) => r,
        }
    }
}

/// Reads an array with element type `A` and exactly `shape`. The header is checked first
/// (shape, element type, then whether the file holds that much data), so nothing is
/// allocated for a header that claims more than the file holds or than was asked.
fn read_exact<A: ReadableElement>(path: &Path, shape: &[usize]) -> Result<ArrayD<A>, ReadError> {
    let head = header(path).map_err(ReadError::Other)?;
    let size = std::mem::size_of::<A>() as u64;
    let kind = |d: &str| d.get(1..2).map(str::to_string);
    let want_kind = match name_of::<A>().as_str() {
        "float32" | "float64" => "f",
        "int32" | "int64" => "i",
        "uint8" => "u",
        "bool" => "b",
        _ => "",
    };
    if kind(&head.descr).as_deref() != Some(want_kind) || head.element_size() != Some(size) {
        return Err(ReadError::WrongType(format!(
            "holds {} elements, expected {}",
            head.dtype_name(),
            name_of::<A>()
        )));
    }
    if head.shape != shape {
        return Err(ReadError::Other(format!(
            "has shape {:?}, expected {:?}",
            head.shape, shape
        )));
    }
    let f = File::open(path).map_err(|e| ReadError::Other(e.to_string()))?;
    let len = f
        .metadata()
        .map_err(|e| ReadError::Other(e.to_string()))?
        .len();
    let data = len.saturating_sub(head.data_offset) as u128;
    let want: u128 = shape.iter().map(|s| *s as u128).product::<u128>() * size as u128;
    if want > data {
        return Err(ReadError::Other(format!(
            "is truncated: {data} bytes of data, shape {shape:?} of {} needs {want}",
            head.dtype_name()
        )));
    }
    let a = ArrayD::<A>::read_npy(BufReader::new(f)).map_err(|e| {
        use ndarray_npy::ReadNpyError as E;
        match e {
            E::WrongDescriptor(d) => {
                ReadError::WrongType(format!("holds {d} elements, expected {}", name_of::<A>()))
            }
            E::ParseHeader(h) => ReadError::Other(one_line(&format!("malformed .npy header: {h}"))),
            other => ReadError::Other(one_line(&format!("malformed .npy: {other}"))),
        }
    })?;
    if a.shape() != shape {
        return Err(ReadError::Other(format!(
            "has shape {:?}, expected {:?}",
            a.shape(),
            shape
        )));
    }
    Ok(a)
}

/// The first of two element types the file holds; `expected` names both in the error.
fn read_either<A: ReadableElement, B: ReadableElement, T>(
    path: &Path,
    shape: &[usize],
    a: impl FnOnce(ArrayD<A>) -> T,
    b: impl FnOnce(ArrayD<B>) -> T,
    expected: &str,
) -> Result<T, String> {
    // The smaller element type first: its size check is the weaker one, so a file of the
    // other type reaches the element-type check and is then read as that type.
    match read_exact::<A>(path, shape) {
        Ok(x) => Ok(a(x)),
        Err(ReadError::WrongType(holds)) => match read_exact::<B>(path, shape) {
            Ok(x) => Ok(b(x)),
            Err(ReadError::WrongType(_)) => {
                let holds = holds.split(", expected").next().unwrap_or_default();
                Err(format!("{holds}, expected {expected}"))
            }
            Err(e) => Err(e.reason()),
        },
        Err(e) => Err(e.reason()),
    }
}

/// A float32 array of exactly `shape`.
pub fn read_f32(path: &Path, shape: &[usize]) -> Result<ArrayD<f32>, String> {
    read_exact::<f32>(path, shape).map_err(ReadError::reason)
}

/// A float32 or float64 array of `shape`, widened to f64, with the format it was stored in.
pub fn read_float(path: &Path, shape: &[usize]) -> Result<(ArrayD<f64>, Format), String> {
    read_either::<f32, f64, _>(
        path,
        shape,
        |a| (a.mapv(f64::from), Format::F32),
        |a| (a, Format::F64),
        "a float32 or float64 array",
    )
}

/// A float32 or float64 array of `shape`, as it is stored (not widened).
pub fn read_float_stored(path: &Path, shape: &[usize]) -> Result<Stored, String> {
    read_either::<f32, f64, _>(
        path,
        shape,
        Stored::F32,
        Stored::F64,
        "a float32 or float64 array",
    )
}

/// An int32 or int64 array of `shape`, widened to i64.
pub fn read_int(path: &Path, shape: &[usize]) -> Result<ArrayD<i64>, String> {
    read_either::<i32, i64, _>(
        path,
        shape,
        |a| a.mapv(i64::from),
        |a| a,
        "an int32 or int64 array",
    )
}

/// A uint8 array of 0s and 1s, or a bool array, of `shape`.
pub fn read_flags(path: &Path, shape: &[usize]) -> Result<ArrayD<bool>, String> {
    let raw = read_either::<u8, bool, _>(path, shape, Err, Ok, "a uint8 or bool array")?;
    match raw {
        Ok(b) => Ok(b),
        Err(u) => match u.indexed_iter().find(|(_, v)| **v > 1) {
            Some((i, v)) => Err(format!(
                "holds {v} at index {:?}, expected 0 or 1",
                i.slice()
            )),
            None => Ok(u.mapv(|v| v == 1)),
        },
    }
}

/// Writes `a` to `path`.
pub fn write<A: WritableElement, D: Dimension>(path: &Path, a: &Array<A, D>) -> Result<(), String> {
    let f = File::create(path).map_err(|e| e.to_string())?;
    a.write_npy(std::io::BufWriter::new(f))
        .map_err(|e| one_line(&e.to_string()))
}

/// Writes `a` as `dir/name`, an error naming `flag` and the file (`--out DIR/q.npy: ...`).
pub fn write_in<A: WritableElement, D: Dimension>(
    dir: &Path,
    name: &str,
    a: &Array<A, D>,
    flag: &str,
) -> anyhow::Result<()> {
    let p = dir.join(name);
    write(&p, a).map_err(|r| anyhow::anyhow!("{flag} {}: {r}", p.display()))
}

/// Writes a stored array to `path`.
pub fn write_stored(path: &Path, a: &Stored) -> Result<(), String> {
    match a {
        Stored::F32(a) => write(path, a),
        Stored::F64(a) => write(path, a),
        Stored::I32(a) => write(path, a),
        Stored::U8(a) => write(path, a),
    }
}

/// Writes an input of a case directory to `path` without copying a borrowed array; a bf16
/// one is widened to float32 a slice of at most [`WIDEN_ELEMENTS`] at a time.
pub fn write_input(path: &Path, a: Input<'_>) -> Result<(), String> {
    if let Input::Stored(s) = &a {
        return write_stored(path, s);
    }
    let mut file = Appender::create(path, &a, input_shape(&a))?;
    file.append(a)?;
    file.finish()
}

/// Reads a compact input (`<u2` bf16 bit patterns) of `shape`, widened to float32.
pub fn read_bf16_bits(path: &Path, shape: &[usize]) -> Result<ArrayD<f32>, String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let a = ArrayD::<u16>::read_npy(std::io::BufReader::new(f)).map_err(|e| {
        format!(
            "expected uint16 bf16 bit patterns (\"encodings\" in case.json): {}",
            one_line(&e.to_string())
        )
    })?;
    if a.shape() != shape {
        return Err(format!("has shape {:?}, expected {shape:?}", a.shape()));
    }
    Ok(a.mapv(|b| half::bf16::from_bits(b).to_f32()))
}

#[cfg(test)]
mod tests;

mod format;
mod parts;
pub use format::{header, header_shape, input_shape, one_line, Header, WIDEN_ELEMENTS};
pub use parts::{read_float_stored_range, Appender};
