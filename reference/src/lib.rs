//! # moecheck-reference
//!
//! The slow, plainly correct CPU reference that every moecheck verdict stands on.
//!
//! * [`format`]: the number formats (f32, bf16, f16, FP8 E4M3 and E5M2) with our own table of
//!   constants and correctly rounded casts (saturating and non-saturating).
//! * [`gemm`]: the grouped GEMM (forward, dgrad, wgrad) accumulated in f64, the dropped-token
//!   contract, the a-priori error bound and the per-group comparison report.
//! * [`fp8`]: FP8 current (and delayed) scaling as Transformer Engine does it, the FP8
//!   grouped GEMM's recipe-exact reference and the accumulation models of its bound.
//! * [`routing`]: MoE routing (score functions, DeepSeek-V3 group-limited top-k, capacity
//!   dropping), in f64, the weight bound and the comparison.
//! * [`moe`]: the whole MoE layer (permute, SwiGLU experts, combine, shared expert), its
//!   hand-written VJP, the dense formulation, finite differences and the layer error bound.
//! * [`op`]: the one vocabulary every operation above speaks — the [`op::Op`] trait, the
//!   [`op::Implementation`] trait behind which every implementation under test sits, the
//!   [`op::Verdict`] and [`op::verify`]; with [`protocol`] (the case directory as data) and
//!   [`report`] (the text and JSON of a run), the same for every operation.
//! * [`stats`]: element-by-element statistics shared by the comparisons; [`seed`]: the one
//!   seed-mixing function.
//!
//! This crate is pure: no I/O, no CUDA, no randomness.

pub mod engine;
pub mod error;
pub mod format;
pub mod fp8;
pub mod gemm;
pub mod moe;
pub mod op;
pub mod par;
pub mod protocol;
pub mod report;
pub mod routing;
pub mod seed;
pub mod stats;

pub use error::Error;
