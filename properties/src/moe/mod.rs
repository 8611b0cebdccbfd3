//! The MoE layer: strategies ([`strategies`]) and properties ([`props`]) of implementations
//! of [`moecheck_reference::moe::MoeLayer`] (`impl PropertyOp for MoeLayer`).

pub mod domain;
pub mod props;
pub mod strategies;

pub use strategies::{moe_args, MoeArgs, MoeRequire, MAX_EXPERTS, MAX_FFN, MAX_HIDDEN, MAX_TOKENS};

pub use domain::MoeDomain;
