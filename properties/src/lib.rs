//! # moecheck-properties
//!
//! proptest strategies ([`strategies`]) and properties ([`props`]) for grouped-GEMM
//! implementations, generic over the implementation under test
//! ([`moecheck_reference::implementation::GroupedGemm`]); in [`routing`], the same for routing
//! implementations ([`moecheck_reference::routing::Router`]).
//!
//! [`moe`] holds the strategies and properties of whole MoE-layer implementations
//! ([`moecheck_reference::moe::MoeLayer`]).
//!
//! ```no_run
//! use moecheck_properties::{all, check, RunConfig};
//! use moecheck_reference::implementation::Reference;
//! for p in all() {
//!     assert!(check(&p, &Reference, &RunConfig::default()).passed(), "{}", p.name);
//! }
//! ```

pub mod fp8;
pub mod moe;
pub mod props;
pub mod routing;
pub mod strategies;

pub use props::{
    all, by_name, check, run_property, run_property_with_rejects, CaseResult, Outcome, Property,
    RunConfig, DEFAULT_CASES, DEFAULT_SEED,
};
pub use strategies::{any_case, case_args, CaseArgs, Require};
