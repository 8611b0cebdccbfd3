//! Implementations under test, besides the reference itself
//! ([`moecheck_reference::op::Reference`]).
//!
//! * Per operation, its CPU **model** of a kernel with planted bugs (`--impl emulate --inject
//!   BUG`) and its GPU implementations, registered through [`crate::backends::Backends`]:
//!   [`gemm`], [`fp8`], [`route`], [`moe`]. A model is never a GPU
//!   result.
//! * [`exec`]: any external program, through the case-directory protocol (v1), for every
//!   operation; [`worker`]: a persistent program answering case after case (protocol v2).
//!   Both run their program through [`process`], which cannot hang.

pub mod exec;
pub mod fp8;
pub mod gemm;
pub mod interrupt;
pub mod moe;
pub mod process;
pub mod route;
pub mod scratch;
pub mod worker;

pub use crate::backends::{model_name, parse_bug, NoBug, PlantedBug};

use moecheck_reference::op::{Implementation, Op, RunError};

use scratch::Scratch;

/// An implementation that runs on a case directory ([`exec`], [`worker`]): moecheck writes the
/// case into it, the program writes its outputs beside the inputs. A grouped GEMM too large to
/// hold is written a shard of experts at a time and its outputs read back a shard at a time
/// (src/pipeline_external.rs); [`Implementation::run`] writes, runs and reads a whole case.
pub trait OnDisk<O: Op>: Implementation<O> {
    /// Whether the program gets compact inputs (docs/protocol.md): `--inputs compact`, or what
    /// a worker's greeting asks for (the worker is started to read it).
    fn compact(&self) -> Result<bool, RunError>;

    /// Runs the program on the case written in `tmp`: the directory back when the program
    /// says it wrote its outputs, or why not (the directory then kept for the first failures
    /// of a run, [`process::keep_failed_case`]; a refusal deletes it).
    fn run_on(&self, tmp: Scratch) -> Result<Scratch, RunError>;
}

/// Why a case directory could not be made.
pub(crate) fn no_case_dir(e: std::io::Error) -> RunError {
    RunError::new(format!("cannot create a case directory: {e}"))
}

/// An `exec:` or `worker:` program's outputs could not be read back from its case directory.
pub(crate) fn unread(e: impl std::fmt::Display) -> RunError {
    RunError::new(format!(
        "{e} (a temporary case directory, deleted now; `--dump DIR` on gemm, route or moe, or a failing property's minimal case under `prop --out DIR`, keeps a case to rerun the program on)"
    ))
}
