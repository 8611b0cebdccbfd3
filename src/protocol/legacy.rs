//! The old per-operation protocol helpers (being replaced by `super`'s generic reader).
//!
//! A case directory holds `case.json`, the inputs `lhs.npy (M,K) f32`, `rhs.npy (G,K,N) f32`,
//! `group_sizes.npy (G,) i32`, `dout.npy (M,N) f32` (when a backward pass is asked) and, once
//! an implementation has run, its outputs `out.npy (M,N)`, `dlhs.npy (M,K)`, `drhs.npy (G,K,N)`
//! as f32 or f64. Every error names the file and the problem on one line.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use ndarray::{Array, Array1, Array2, Array3, Dimension};
use ndarray_npy::{ReadNpyExt, ReadableElement, WriteNpyExt};
use serde::{Deserialize, Serialize};

use moecheck_reference::format::Format;
use moecheck_reference::gemm::{GemmOutputs, GroupedGemmCase, Pass, Passes, TailContract};

/// The protocol version this build reads and writes.
pub use moecheck_reference::protocol::PROTOCOL_VERSION;

/// `case.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseJson {
    /// Always 1.
    pub protocol: u32,
    /// Always `"grouped_gemm"` in version 1.
    pub op: String,
    /// The passes the implementation must compute: any of `"fwd"`, `"dgrad"`, `"wgrad"`.
    pub passes: Vec<Pass>,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub groups: usize,
    /// Every input value is exactly representable in this format (`f32`, `bf16`, `f16`).
    pub dtype: Format,
    /// The format the implementation is expected to compute its outputs in.
    pub out_dtype: Format,
    /// `"zero"`: tail rows of out/dlhs must be 0; `"ignored"`: they are not checked.
    pub tail: TailContract,
}

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

/// Writes `case.json` and the inputs of `case` into `dir` (which must exist).
pub fn write_case(dir: &Path, case: &GroupedGemmCase, passes: Passes) -> Result<(), ProtocolError> {
    let json = CaseJson {
        protocol: PROTOCOL_VERSION,
        op: "grouped_gemm".into(),
        passes: passes.iter().collect(),
        m: case.m(),
        k: case.k(),
        n: case.n(),
        groups: case.groups(),
        dtype: case.dtype,
        out_dtype: case.out_dtype,
        tail: case.tail,
    };
    let path = dir.join("case.json");
    let text = serde_json::to_string_pretty(&json).map_err(|e| file_err(&path, e))?;
    std::fs::write(&path, text + "\n").map_err(|e| file_err(&path, e))?;
    write_npy(&dir.join("lhs.npy"), &case.lhs)?;
    write_npy(&dir.join("rhs.npy"), &case.rhs)?;
    let sizes: Array1<i32> = case.group_sizes.iter().map(|s| *s as i32).collect();
    write_npy(&dir.join("group_sizes.npy"), &sizes)?;
    if passes.needs_dout() {
        if let Some(d) = &case.dout {
            write_npy(&dir.join("dout.npy"), d)?;
        }
    }
    Ok(())
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

/// Reads `case.json` and the inputs, and validates them (shapes against case.json, sizes
/// non-negative and summing to at most M, finite values representable in `dtype`).
pub fn read_case(dir: &Path) -> Result<(GroupedGemmCase, Passes), ProtocolError> {
    if !dir.is_dir() {
        return Err(file_err(dir, "not a directory"));
    }
    let path = dir.join("case.json");
    let text = std::fs::read_to_string(&path).map_err(|e| file_err(&path, e))?;
    let json: CaseJson = serde_json::from_str(&text).map_err(|e| file_err(&path, e))?;
    if json.protocol != PROTOCOL_VERSION {
        return Err(file_err(
            &path,
            format!(
                "protocol {} is not supported (this build reads {PROTOCOL_VERSION})",
                json.protocol
            ),
        ));
    }
    if json.op != "grouped_gemm" {
        return Err(file_err(
            &path,
            format!("op '{}' is not supported (expected grouped_gemm)", json.op),
        ));
    }
    let mut passes = Passes::default();
    json.passes.iter().for_each(|p| passes.insert(*p));
    if passes.is_empty() {
        return Err(file_err(&path, "passes is empty"));
    }
    let lhs: Array2<f32> = read_shaped(&dir.join("lhs.npy"), &[json.m, json.k])?;
    let rhs: Array3<f32> = read_shaped(&dir.join("rhs.npy"), &[json.groups, json.k, json.n])?;
    let sizes_path = dir.join("group_sizes.npy");
    let sizes = read_sizes(&sizes_path, json.groups)?;
    let dout: Option<Array2<f32>> = if passes.needs_dout() {
        Some(read_shaped(&dir.join("dout.npy"), &[json.m, json.n])?)
    } else {
        None
    };
    let case = GroupedGemmCase {
        lhs,
        rhs,
        group_sizes: sizes,
        dout,
        dtype: json.dtype,
        out_dtype: json.out_dtype,
        tail: json.tail,
    };
    case.validate(passes)
        .map_err(|source| ProtocolError::Invalid {
            path: dir.to_path_buf(),
            source,
        })?;
    Ok((case, passes))
}

fn read_sizes(path: &Path, groups: usize) -> Result<Vec<usize>, ProtocolError> {
    let raw: Vec<i64> = match read_shaped::<i32, ndarray::Ix1>(path, &[groups]) {
        Ok(a) => a.iter().map(|v| *v as i64).collect(),
        Err(_) => read_shaped::<i64, ndarray::Ix1>(path, &[groups])
            .map_err(|e| match e {
                ProtocolError::File { reason, .. }
                    if reason.contains("type") || reason.contains("descr") =>
                {
                    file_err(path, "expected int32 or int64 group sizes")
                }
                other => other,
            })?
            .to_vec(),
    };
    raw.iter()
        .enumerate()
        .map(|(g, s)| {
            usize::try_from(*s)
                .map_err(|_| file_err(path, format!("group {g} has negative size {s}")))
        })
        .collect()
}

/// Reads the outputs of the asked passes (f32 or f64) and checks their shapes.
pub fn read_outputs(
    dir: &Path,
    case: &GroupedGemmCase,
    passes: Passes,
) -> Result<GemmOutputs, ProtocolError> {
    let (m, k, n, g) = (case.m(), case.k(), case.n(), case.groups());
    let mut got = GemmOutputs::default();
    if passes.fwd {
        got.out = Some(read_float(&dir.join("out.npy"), &[m, n])?);
    }
    if passes.dgrad {
        got.dlhs = Some(read_float(&dir.join("dlhs.npy"), &[m, k])?);
    }
    if passes.wgrad {
        got.drhs = Some(read_float(&dir.join("drhs.npy"), &[g, k, n])?);
    }
    Ok(got)
}

/// Reads a float32 or float64 array of the given shape, widened to f64.
fn read_float<D: Dimension>(path: &Path, shape: &[usize]) -> Result<Array<f64, D>, ProtocolError> {
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

fn is_type_error(reason: &str) -> bool {
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
