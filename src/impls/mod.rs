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
