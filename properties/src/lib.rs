//! # moecheck-properties
//!
//! proptest strategies and properties for every operation moecheck checks, generic over the
//! implementation under test ([`moecheck_reference::op::Implementation`]).
//!
//! * [`property`]: the one property type, [`Property<O>`](Property), and [`PropertyOp`], what
//!   an operation adds to join: its case arguments and its properties.
//! * [`runner`]: the one property loop (deterministic seeds, redrawn rejects, quiet
//!   shrinking).
//! * Per operation, its strategies and properties: [`gemm`], [`fp8`], [`routing`], [`moe`].
//!
//! ```no_run
//! use moecheck_properties::{check, PropertyOp, RunConfig};
//! use moecheck_reference::gemm::Gemm;
//! use moecheck_reference::op::Reference;
//! for p in Gemm::properties() {
//!     assert!(check(&p, &Reference, &RunConfig::default()).passed(), "{}", p.name);
//! }
//! ```

pub mod fp8;
pub mod gemm;
pub mod moe;
pub mod property;
pub mod routing;
pub mod runner;

pub use property::{by_name, check, check_observed, verified, Property, PropertyOp};
pub use runner::{
    run_property, run_property_observed, run_property_with_rejects, CaseResult, Outcome, RunConfig,
    Step, DEFAULT_CASES, DEFAULT_MAX_SHRINK_ITERS, DEFAULT_SEED,
};
