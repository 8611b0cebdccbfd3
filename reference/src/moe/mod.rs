//! The whole MoE layer: forward, a hand-written VJP, the dense formulation, finite
//! differences, and the error bound of an implementation that declares a precision.
//!
//! ## The layer (MaxText `RoutedMoE`, DeepSeek-V3 `MoE`)
//! Inputs: tokens `x (T, H)`, router `W_r (H, E)`, optional selection bias `b (E,)`, expert
//! weights `W0, W1 (E, H, F)` and `Wo (E, F, H)`, optional shared expert
//! `S0, S1 (H, Fs)`, `So (Fs, H)`, and a [`crate::routing::RoutingConfig`].
//!
//! 1. router logits `z = x · W_r` (T, E);
//! 2. routing ([`crate::routing::route`]): `indices (T, k)`, combine weights `c (T, k)` (0 where
//!    dropped), `kept (T, k)`;
//! 3. permute ([`permute`]): the `T·k` assignments sorted stably by expert, dropped last;
//!    `xp[r] = x[token of r]`;
//! 4. expert FFN through the grouped GEMM ([`crate::gemm`]) with SwiGLU:
//!    `a = xp·W0_e`, `b = xp·W1_e`, `h = silu(a) ⊙ b`, `yp = h·Wo_e` (`silu(a) = a·σ(a)`);
//!    dropped rows are the GEMM's tail and give exactly 0;
//! 5. unpermute and combine: `out[t] = Σ_{s kept} c[t, s]·yp[row of (t, s)]`;
//! 6. shared expert (DeepSeek-V3): `out += (silu(x·S0) ⊙ (x·S1))·So`; gated (Qwen2-MoE
//!    `shared_expert_gate`, weight `g (H,)`): `out += σ(x·g) ⊙ (silu(x·S0) ⊙ (x·S1))·So`, the
//!    gate one scalar per token.
//!
//! ## The backward ([`backward`]), given `dout (T, H)`, as a fused kernel decomposes it
//! * `dyp[r] = c[t,s]·dout[t]` (tail rows 0); combine-weight gradient
//!   `dc[t, s] = <dout[t], yp[row of (t,s)]>` for kept slots, exactly 0 for dropped ones;
//! * grouped dgrad/wgrad: `dh = dyp·Wo_eᵀ`, `dWo_e = h_eᵀ·dyp_e`;
//! * SwiGLU backward: `da = dh ⊙ b ⊙ silu'(a)`, `db = dh ⊙ silu(a)`,
//!   `silu'(a) = σ(a)·(1 + a·(1 − σ(a)))`;
//! * `dxp = da·W0_eᵀ + db·W1_eᵀ`, `dW0_e = xp_eᵀ·da_e`, `dW1_e = xp_eᵀ·db_e` (an empty expert's
//!   weight gradients are exactly 0: no row reaches them);
//! * unpermute: `dx[t] = Σ_s dxp[row of (t, s)]`;
//! * routing ([`backward::routing_vjp`]): `dc` through the normalisation, the scaling and
//!   the score function to `dz (T, E)`; the bias, the selection and the capacity mask are
//!   piecewise constant and get no gradient;
//! * router: `dx += dz·W_rᵀ`, `dW_r = xᵀ·dz`; shared expert as a one-group FFN (gated:
//!   its output gradient is `γ[t]·dout[t]` with `γ = σ(x·g)`, and the gate's
//!   `dℓ[t] = <dout[t], ys[t]>·γ[t](1 − γ[t])` gives `dx += dℓ·gᵀ`, `dg = xᵀ·dℓ`).
//!
//! Everything is f64. Two independent checks: [`dense`] (every expert on every token, the
//! routing weights scattered into a masked `(T, E)` matrix, differentiated the same way) and
//! [`fd`] (central finite differences with a derived step and tolerance, and a guard that
//! refuses points near a top-k / group / capacity tie).
//!
//! As an operation it is [`MoeLayer`] (`op.rs`), with its case directory (`files.rs`) and its
//! report (`report.rs`).

pub mod backward;
pub mod bound;
pub mod compare;
pub mod dense;
pub mod fd;
pub mod ffn;
mod files;
pub mod layer;
mod op;
pub mod permute;
mod report;

pub use backward::{backward, combine_vjp, routing_vjp, Backward};
pub use bound::{layer_bound, LayerBound, LayerPrecision};
pub use compare::{compare_layer, LayerAt, LayerReport, SliceStats, TensorReport, WorstElement};
pub use dense::dense_layer;
pub use files::{MoeJson, SharedGate};
pub use layer::{forward, Forward, MoeCase, MoeOutputs, SharedExpert, TensorId};
pub use op::{exact_tie, tie_guard, LayerExpected, LayerFormats, MoeLayer, RoundTrip};
pub use permute::Permutation;
pub use report::{MoeDocument, MoeShape};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_gpt_oss;
