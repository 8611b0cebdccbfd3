//! The case-directory protocol (docs/protocol.md) as pure data: which `case.json` fields and
//! which named arrays make up an operation's case and its outputs.
//!
//! Each operation says what its files are ([`Protocol`]); the CLI crate reads and writes them
//! as `.npy` files (`src/protocol.rs`, `src/npy.rs`), so `exec:` programs, `--dump`, and
//! `moecheck check` work for every operation with one implementation. Nothing here touches
//! the file system.

use half::bf16;
use ndarray::{ArrayD, ArrayViewD};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::format::Format;
use crate::op::Op;

/// The protocol version this build reads and writes.
pub const PROTOCOL_VERSION: u32 = 1;

/// An array as a case directory stores it.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    I32(ArrayD<i32>),
    U8(ArrayD<u8>),
}

/// An input array as [`Protocol::inputs`] hands it to the writer: owned, or borrowed from the
/// case (no copy of a large input is made to write it).
#[derive(Debug, Clone)]
pub enum Input<'a> {
    Stored(Stored),
    /// A float32 array of the case, written as it is.
    F32(ArrayViewD<'a, f32>),
    /// A bf16 array of the case, widened to float32 (exactly) a slice at a time as it is
    /// written: the stored file is float32 whatever the case holds.
    Bf16AsF32(ArrayViewD<'a, bf16>),
    /// Compact inputs (docs/protocol.md): a bf16 array stored as its `<u2` bit patterns.
    Bf16Bits(ArrayViewD<'a, bf16>),
    /// Compact inputs: a float32 array whose every value is a bf16 value (the case's dtype
    /// says so), stored as the bf16 bit patterns (the high 16 bits of each float32).
    F32AsBf16Bits(ArrayViewD<'a, f32>),
}

/// The one compact encoding: bf16 values as `<u2` bit patterns (`"encodings"` in
/// `case.json`).
pub const BF16_ENCODING: &str = "bf16";

impl Input<'_> {
    /// The array owned, as the file stores it.
    pub fn into_stored(self) -> Stored {
        match self {
            Input::Stored(s) => s,
            Input::F32(a) => Stored::F32(a.to_owned()),
            Input::Bf16AsF32(a) | Input::Bf16Bits(a) => Stored::F32(a.mapv(f32::from)),
            Input::F32AsBf16Bits(a) => Stored::F32(a.to_owned()),
        }
    }

    /// The file's encoding, when it is not the plain float32 (or integer) one.
    pub fn encoding(&self) -> Option<&'static str> {
        match self {
            Input::Bf16Bits(_) | Input::F32AsBf16Bits(_) => Some(BF16_ENCODING),
            _ => None,
        }
    }
}

/// A problem with one file of a case directory: `file` is its name inside the directory
/// (`lhs.npy`, `case.json`), `reason` one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct FileError {
    pub file: String,
    pub reason: String,
}

impl FileError {
    pub fn new(file: impl Into<String>, reason: impl Into<String>) -> FileError {
        FileError {
            file: file.into(),
            reason: reason.into(),
        }
    }
}

/// Reads the named arrays of one case directory. Every reader checks the element type and
/// the exact shape, and refuses a file too short for its header's shape before allocating.
pub trait Files {
    /// A float32 array.
    fn f32(&mut self, name: &str, shape: &[usize]) -> Result<ArrayD<f32>, FileError>;
    /// A float32 or float64 array, widened to f64, with the format it was stored in.
    fn float(&mut self, name: &str, shape: &[usize]) -> Result<(ArrayD<f64>, Format), FileError>;
    /// A float32 or float64 array as it is stored ([`Stored::F32`] or [`Stored::F64`]), not
    /// widened. The default widens through [`Files::float`].
    fn float_stored(&mut self, name: &str, shape: &[usize]) -> Result<Stored, FileError> {
        Ok(Stored::F64(self.float(name, shape)?.0))
    }
    /// An int32 or int64 array, widened to i64.
    fn int(&mut self, name: &str, shape: &[usize]) -> Result<ArrayD<i64>, FileError>;
    /// A uint8 (0 or 1) or bool array.
    fn flags(&mut self, name: &str, shape: &[usize]) -> Result<ArrayD<bool>, FileError>;
}

/// An operation's case directory.
pub trait Protocol: Op {
    /// The `op` field of its `case.json` (`grouped_gemm`, `route`, `moe_layer`).
    const PROTOCOL_OP: &'static str;
    /// A top-level `case.json` key whose presence selects this operation among those sharing
    /// [`Protocol::PROTOCOL_OP`] (`fp8` for the FP8 grouped GEMM).
    const MARKER: Option<&'static str> = None;
    /// Its `case.json` fields besides `protocol` and `op`.
    type CaseJson: Serialize + DeserializeOwned;

    /// The `case.json` fields of `case`.
    fn case_json(case: &Self::Case, ask: Self::Ask) -> Self::CaseJson;
    /// The input arrays of `case`, named as files (`lhs.npy`).
    fn input_files(case: &Self::Case, ask: Self::Ask) -> Vec<(String, Stored)>;
    /// The same arrays as the writer takes them: by default [`Protocol::input_files`]; an
    /// operation with large inputs lends them instead (the grouped GEMM), so that writing a
    /// case directory makes no copy of them.
    /// `compact`: bf16 inputs as their bit patterns ([`Input::Bf16Bits`]), where the operation
    /// has such inputs (the others ignore it).
    fn inputs(case: &Self::Case, ask: Self::Ask, compact: bool) -> Vec<(String, Input<'_>)> {
        let _ = compact;
        Self::input_files(case, ask)
            .into_iter()
            .map(|(name, s)| (name, Input::Stored(s)))
            .collect()
    }
    /// Reads a case back. The result is validated by the caller ([`Op::validate`]).
    fn read_case(
        json: Self::CaseJson,
        files: &mut dyn Files,
    ) -> Result<(Self::Case, Self::Ask), FileError>;
    /// The output arrays, named as files.
    fn output_files(outputs: &Self::Outputs) -> Vec<(String, Stored)>;
    /// Reads an implementation's outputs for `case`.
    fn read_outputs(
        case: &Self::Case,
        ask: Self::Ask,
        files: &mut dyn Files,
    ) -> Result<Self::Outputs, FileError>;
}

/// `a` as an array of `D` dimensions (the readers already checked the shape; this only
/// changes the type).
pub fn dims<D: ndarray::Dimension, A>(
    file: &str,
    a: ArrayD<A>,
) -> Result<ndarray::Array<A, D>, FileError> {
    a.into_dimensionality::<D>()
        .map_err(|e| FileError::new(file, e.to_string()))
}
