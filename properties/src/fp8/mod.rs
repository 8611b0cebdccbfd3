//! FP8 grouped GEMM: strategies built to expose scale bugs ([`strategies`]) and the properties
//! of implementations of [`moecheck_reference::fp8::Fp8Gemm`] ([`props`]).

pub mod block_strategies;
pub mod props;
pub mod strategies;

pub use block_strategies::{fp8_block_case_args, FP8_BLOCK_SIZES};
pub use strategies::{fp8_case_args, Fp8CaseArgs, FP8_MAX_EXP, FP8_MAX_K, FP8_MAX_N};
