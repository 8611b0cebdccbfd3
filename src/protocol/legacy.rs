//! The old per-operation protocol helpers (being replaced by `super`'s generic reader): typed
//! `.npy` reading and writing with one-line errors naming the file, for the routing and MoE
//! case directories until they speak `Protocol`.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use ndarray::{Array, Dimension};
use ndarray_npy::{ReadNpyExt, ReadableElement, WriteNpyExt};

use super::ProtocolError;

pub(crate) fn file_err(path: &Path, reason: impl std::fmt::Display) -> ProtocolError {
    ProtocolError::File {
        path: path.to_path_buf(),
        reason: one_line(&reason.to_string()),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(crate) fn write_npy<A, D>(path: &Path, a: &Array<A, D>) -> Result<(), ProtocolError>
where
    A: ndarray_npy::WritableElement,
    D: Dimension,
{
    let f = File::create(path).map_err(|e| file_err(path, e))?;
    a.write_npy(std::io::BufWriter::new(f))
        .map_err(|e| file_err(path, e))
}

/// Reads a float32 or float64 array of the given shape, widened to f64.
pub(crate) fn read_float<D: Dimension>(
    path: &Path,
    shape: &[usize],
) -> Result<Array<f64, D>, ProtocolError> {
    // f32 first: its size check (4-byte elements) is the weaker one, so an f64 file reaches
    // the element-type check and is then read as f64.
    match read_shaped::<f32, D>(path, shape) {
        Ok(a) => Ok(a.mapv(f64::from)),
        Err(ProtocolError::File { reason, .. }) if is_type_error(&reason) => {
            read_shaped::<f64, D>(path, shape).map_err(|e| match e {
                ProtocolError::File { reason, .. } if is_type_error(&reason) => {
                    file_err(path, "expected a float32 or float64 array")
                }
                other => other,
            })
        }
        Err(e) => Err(e),
    }
}

pub(crate) fn is_type_error(reason: &str) -> bool {
    reason.contains("type") || reason.contains("descr")
}

/// Reads an array with an exact element type and shape. The header's shape is checked
/// against the file size before any data is allocated.
pub(crate) fn read_shaped<A: ReadableElement, D: Dimension>(
    path: &Path,
    shape: &[usize],
) -> Result<Array<A, D>, ProtocolError> {
    let f = File::open(path).map_err(|e| file_err(path, e))?;
    let len = f.metadata().map_err(|e| file_err(path, e))?.len();
    let want: u128 =
        shape.iter().map(|s| *s as u128).product::<u128>() * std::mem::size_of::<A>() as u128;
    if want > len as u128 {
        return Err(file_err(
            path,
            format!(
                "holds {len} bytes, too few for shape {shape:?} of {}-byte elements",
                std::mem::size_of::<A>()
            ),
        ));
    }
    let a = Array::<A, ndarray::IxDyn>::read_npy(BufReader::new(f))
        .map_err(|e| file_err(path, npy_reason(&e)))?;
    if a.shape() != shape {
        return Err(file_err(
            path,
            format!("has shape {:?}, expected {:?}", a.shape(), shape),
        ));
    }
    a.into_dimensionality::<D>().map_err(|e| file_err(path, e))
}

fn npy_reason(e: &ndarray_npy::ReadNpyError) -> String {
    use ndarray_npy::ReadNpyError as E;
    match e {
        E::WrongDescriptor(d) => format!("wrong element type (descr {d:?})"),
        E::ParseHeader(h) => format!("malformed .npy header: {h}"),
        other => format!("malformed .npy: {other}"),
    }
}
