//! Grouped GEMM: edge-biased strategies ([`strategies`]) and the properties of
//! implementations of [`moecheck_reference::gemm::Gemm`] ([`props`]).

pub mod domain;
pub mod props;
pub mod strategies;

pub use domain::GemmDomain;
pub use strategies::{any_case, case_args, group_sizes, GemmArgs, Require};
