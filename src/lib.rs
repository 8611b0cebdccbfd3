//! # moecheck
//!
//! Tells people who write Mixture-of-Experts kernels whether their numbers are right.
//! The CLI (`moecheck gemm`, `moecheck check`, `moecheck prop`, `moecheck selftest`, ...) is a
//! thin layer over this library; the numerics live in [`moecheck_reference`] and the
//! properties in [`moecheck_properties`].

pub mod backends;
pub mod contract;
pub mod cuda;
pub mod disk;
pub mod gemm_check;
pub mod generate;
pub mod impls;
pub mod memory;
pub mod npy;
pub mod ops;
pub mod output;
pub mod pipeline;
pub mod pipeline_external;
pub mod pipeline_sharded;
pub mod progress;
pub mod prop;
pub mod protocol;
pub mod registry;
pub mod report;
pub mod selftest;
pub mod train;
pub mod user_file;

pub use moecheck_curves as curves;
pub use moecheck_properties as properties;
pub use moecheck_reference as reference;
