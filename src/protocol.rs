//! The case-directory protocol, version 1 (docs/protocol.md), for every operation: `case.json`
//! and `.npy` files in a directory, as each operation describes them
//! ([`moecheck_reference::protocol::Protocol`]).
//!
//! Every error names the file and the problem on one line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use moecheck_reference::protocol::PROTOCOL_VERSION;
use moecheck_reference::protocol::{FileError, Files, Input, Protocol, Stored, BF16_ENCODING};

use crate::npy;
use moecheck_reference::format::Format;

/// A protocol failure: one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Invalid {
        path: PathBuf,
        #[source]
        source: moecheck_reference::Error,
    },
}

impl ProtocolError {
    fn in_dir(dir: &Path, e: FileError) -> ProtocolError {
        ProtocolError::File {
            path: dir.join(e.file),
            reason: npy::one_line(&e.reason),
        }
    }
}

/// The declaration flags a command line gave: what an external implementation declares
/// about its arithmetic. `None` where a flag was not given (the operation's default applies).
/// A dump records it in `case.json` (`"declared"`, the flags by their names without dashes)
/// so that `moecheck check` reproduces the run's verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declared {
    /// `--acc`: the accumulator format (grouped GEMM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acc: Option<Format>,
    /// `--acc-block`: the accumulator's K block (grouped GEMM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acc_block: Option<usize>,
    /// `--compute`: the compute format (routing, MoE layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<Format>,
    /// `--out-dtype`: the output format (MoE layer; a grouped GEMM's where it is not its
    /// case's, `check` and `prop` only: on `moecheck gemm` the flag is the case's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_dtype: Option<Format>,
    /// `--router-compute`: the router's compute format where it is not `--compute`'s (MoE
    /// layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_compute: Option<Format>,
}

impl Declared {
    /// Each flag of `self`, or of `recorded` where `self` does not give it.
    pub fn or(self, recorded: Declared) -> Declared {
        Declared {
            acc: self.acc.or(recorded.acc),
            acc_block: self.acc_block.or(recorded.acc_block),
            compute: self.compute.or(recorded.compute),
            out_dtype: self.out_dtype.or(recorded.out_dtype),
            router_compute: self.router_compute.or(recorded.router_compute),
        }
    }
}

impl Declared {
    /// The flags that were given, in a fixed order.
    pub fn given(&self) -> Vec<&'static str> {
        [
            (self.acc.is_some(), "--acc"),
            (self.acc_block.is_some(), "--acc-block"),
            (self.compute.is_some(), "--compute"),
            (self.out_dtype.is_some(), "--out-dtype"),
            (self.router_compute.is_some(), "--router-compute"),
        ]
        .into_iter()
        .filter(|(given, _)| *given)
        .map(|(_, flag)| flag)
        .collect()
    }
}

/// `case.json`: the version, the operation, the operation's own fields and, in a case
/// directory moecheck wrote after checking an implementation, the declaration the outputs
/// were checked against (last; implementations ignore it).
#[derive(Debug, Serialize, Deserialize)]
struct CaseFile<J> {
    protocol: u32,
    op: String,
    #[serde(flatten)]
    body: J,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    declared: Option<Declared>,
    /// Compact inputs: input name (no `.npy`) -> encoding (`bf16`: `<u2` bit patterns).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    encodings: BTreeMap<String, String>,
}

/// What every `case.json` starts with, and which top-level keys it has (for choosing the
/// operation that reads it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseHeader {
    pub protocol: u32,
    pub op: String,
    pub keys: Vec<String>,
    /// The recorded declaration (`"declared"`); the default when there is none.
    pub declared: Declared,
}

/// The arrays of one case directory, as [`Files`].
pub struct DirFiles<'a> {
    dir: &'a Path,
    /// The inputs stored as bf16 bit patterns (`"encodings"`), by name without `.npy`.
    bf16: BTreeSet<String>,
}

impl DirFiles<'_> {
    /// A directory whose arrays are all stored plainly (outputs).
    fn plain(dir: &Path) -> DirFiles<'_> {
        DirFiles {
            dir,
            bf16: BTreeSet::new(),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Files for DirFiles<'_> {
    fn f32(&mut self, name: &str, shape: &[usize]) -> Result<ndarray::ArrayD<f32>, FileError> {
        let path = self.path(name);
        if self.bf16.contains(name.trim_end_matches(".npy")) {
            return npy::read_bf16_bits(&path, shape).map_err(|r| FileError::new(name, r));
        }
        npy::read_f32(&path, shape).map_err(|r| FileError::new(name, r))
    }
    fn float(
        &mut self,
        name: &str,
        shape: &[usize],
    ) -> Result<(ndarray::ArrayD<f64>, moecheck_reference::format::Format), FileError> {
        npy::read_float(&self.path(name), shape).map_err(|r| FileError::new(name, r))
    }
    fn float_stored(&mut self, name: &str, shape: &[usize]) -> Result<Stored, FileError> {
        npy::read_float_stored(&self.path(name), shape).map_err(|r| FileError::new(name, r))
    }
    fn int(&mut self, name: &str, shape: &[usize]) -> Result<ndarray::ArrayD<i64>, FileError> {
        npy::read_int(&self.path(name), shape).map_err(|r| FileError::new(name, r))
    }
    fn flags(&mut self, name: &str, shape: &[usize]) -> Result<ndarray::ArrayD<bool>, FileError> {
        npy::read_flags(&self.path(name), shape).map_err(|r| FileError::new(name, r))
    }
}

fn case_json_path(dir: &Path) -> Result<PathBuf, ProtocolError> {
    if !dir.is_dir() {
        return Err(ProtocolError::File {
            path: dir.to_path_buf(),
            reason: "not a directory".into(),
        });
    }
    Ok(dir.join("case.json"))
}

/// Reads the header of `dir/case.json`.
pub fn read_header(dir: &Path) -> Result<CaseHeader, ProtocolError> {
    let path = case_json_path(dir)?;
    let text = std::fs::read_to_string(&path).map_err(|e| file_error(&path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| file_error(&path, e))?;
    let obj = v
        .as_object()
        .ok_or_else(|| file_error(&path, "expected a JSON object"))?;
    let protocol = obj
        .get("protocol")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| file_error(&path, "missing field `protocol`"))?;
    let op = obj
        .get("op")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| file_error(&path, "missing field `op`"))?;
    if protocol != u64::from(PROTOCOL_VERSION) {
        return Err(file_error(
            &path,
            format!("protocol {protocol} is not supported (this build reads {PROTOCOL_VERSION})"),
        ));
    }
    let declared = match obj.get("declared") {
        None | Some(serde_json::Value::Null) => Declared::default(),
        Some(d) => serde_json::from_value(d.clone())
            .map_err(|e| file_error(&path, format!("\"declared\": {e}")))?,
    };
    Ok(CaseHeader {
        protocol: protocol as u32,
        op: op.to_string(),
        keys: obj.keys().cloned().collect(),
        declared,
    })
}

/// Writes `case.json` and the inputs of `case` into `dir` (which must exist).
pub fn write_case<O: Protocol>(
    dir: &Path,
    case: &O::Case,
    ask: O::Ask,
    declared: Option<&Declared>,
    compact: bool,
) -> Result<(), ProtocolError> {
    let inputs = O::inputs(case, ask, compact);
    write_case_json::<O>(dir, case, ask, declared, &inputs)?;
    for (name, a) in inputs {
        let path = dir.join(&name);
        npy::write_input(&path, a).map_err(|r| file_error(&path, r))?;
    }
    Ok(())
}

/// Writes `dir/case.json` for `case` (whose arrays it does not read) and its `inputs` (their
/// encodings), before or without the input files themselves.
pub fn write_case_json<O: Protocol>(
    dir: &Path,
    case: &O::Case,
    ask: O::Ask,
    declared: Option<&Declared>,
    inputs: &[(String, Input<'_>)],
) -> Result<(), ProtocolError> {
    let encodings = inputs
        .iter()
        .filter_map(|(name, a)| {
            let e = a.encoding()?;
            Some((name.trim_end_matches(".npy").to_string(), e.to_string()))
        })
        .collect();
    let json = CaseFile {
        protocol: PROTOCOL_VERSION,
        op: O::PROTOCOL_OP.to_string(),
        body: O::case_json(case, ask),
        declared: declared.copied(),
        encodings,
    };
    let path = dir.join("case.json");
    let text = serde_json::to_string_pretty(&json).map_err(|e| file_error(&path, e))?;
    std::fs::write(&path, text + "\n").map_err(|e| file_error(&path, e))
}

/// The error for a failed write or read of `path`, one line.
pub fn file_error(path: &Path, reason: impl std::fmt::Display) -> ProtocolError {
    ProtocolError::File {
        path: path.to_path_buf(),
        reason: npy::one_line(&reason.to_string()),
    }
}

/// Writes the outputs `got` into `dir`.
pub fn write_outputs<O: Protocol>(dir: &Path, got: &O::Outputs) -> Result<(), ProtocolError> {
    write_arrays(dir, O::output_files(got))
}

fn write_arrays(
    dir: &Path,
    files: Vec<(String, moecheck_reference::protocol::Stored)>,
) -> Result<(), ProtocolError> {
    for (name, a) in files {
        let path = dir.join(&name);
        npy::write_stored(&path, &a).map_err(|r| file_error(&path, r))?;
    }
    Ok(())
}

/// Reads and validates the case in `dir` (it must be one of `O`'s).
pub fn read_case<O: Protocol>(dir: &Path) -> Result<(O::Case, O::Ask), ProtocolError> {
    let header = read_header(dir)?;
    let path = dir.join("case.json");
    if header.op != O::PROTOCOL_OP {
        return Err(file_error(
            &path,
            format!(
                "op '{}' is not supported (expected {})",
                header.op,
                O::PROTOCOL_OP
            ),
        ));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| file_error(&path, e))?;
    let json: CaseFile<O::CaseJson> =
        serde_json::from_str(&text).map_err(|e| file_error(&path, e))?;
    for (name, e) in &json.encodings {
        if e != BF16_ENCODING {
            return Err(file_error(
                &path,
                format!("\"encodings\": {name}: unknown encoding '{e}' (expected {BF16_ENCODING})"),
            ));
        }
    }
    let mut files = DirFiles {
        dir,
        bf16: json.encodings.into_keys().collect(),
    };
    let (case, ask) =
        O::read_case(json.body, &mut files).map_err(|e| ProtocolError::in_dir(dir, e))?;
    O::validate(&case, ask).map_err(|source| ProtocolError::Invalid {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok((case, ask))
}

/// Reads an implementation's outputs for `case` from `dir`.
pub fn read_outputs<O: Protocol>(
    dir: &Path,
    case: &O::Case,
    ask: O::Ask,
) -> Result<O::Outputs, ProtocolError> {
    O::read_outputs(case, ask, &mut DirFiles::plain(dir)).map_err(|e| unwritten_or(dir, e))
}

/// `e` for the output file it names, or, when the implementation did not write that file,
/// the missing file and the pass that asked for it.
pub fn unwritten_or(dir: &Path, e: FileError) -> ProtocolError {
    if dir.join(&e.file).exists() {
        return ProtocolError::in_dir(dir, e);
    }
    let asked = match e.file.as_str() {
        "out.npy" => " for the fwd pass",
        "dlhs.npy" => " for the dgrad pass",
        "drhs.npy" => " for the wgrad pass",
        _ => "",
    };
    ProtocolError::File {
        path: dir.join(&e.file),
        reason: format!("the implementation wrote no {}{asked}", e.file),
    }
}

/// The indices `range` of the first axis of the float32 or float64 output `name` of `shape`
/// in `dir`, read without the rest of the file ([`npy::read_float_stored_range`]).
pub fn read_output_range(
    dir: &Path,
    name: &str,
    shape: &[usize],
    range: std::ops::Range<usize>,
) -> Result<Stored, ProtocolError> {
    npy::read_float_stored_range(&dir.join(name), shape, range)
        .map_err(|r| unwritten_or(dir, FileError::new(name, r)))
}
