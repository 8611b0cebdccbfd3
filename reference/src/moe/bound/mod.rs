//! The a-priori error bound of an MoE-layer implementation, by running error analysis.
//!
//! ## Model
//! The implementation declares a [`LayerPrecision`]: it reads the inputs exactly (they are
//! representable in `input`), performs every operation — GEMM products and sums, the
//! softmax / sigmoid / SiLU evaluations, the normalisation, the f32 combine — in `compute`
//! with unit roundoff `u`, and rounds each returned tensor once to `output` (`u_out`). A
//! router declared in another format (`router`, e.g. Hugging Face's f32 routers inside an f64
//! module) does its own operations with `u_r` instead: the router logits GEMM, the scores,
//! gates, normalisation and scaling, and in the backward the routing VJP (`dz`, `dw_router`,
//! the router's share of `dx`); the combine-weight gradient `<dout, y>` enters it rounded
//! once more with `u_r`, and the combine weights and the router's share of `dx` enter the
//! experts' operations rounded once more with `u` (each exact when widening, counted
//! anyway). A router format must hold the inputs exactly, as `compute` must. It
//! must **select the same experts and drop the same assignments** as the reference: the
//! case generators refuse cases whose top-k, group or capacity margins are within the
//! selection-score error computed here ([`super::fd::near_tie`]), so this is a fact of every
//! checked case, not an assumption.
//!
//! ## Propagation (`e(·)` bounds the absolute error of a computed intermediate)
//! Every intermediate `v` of the reference forward and backward is replayed beside a bound
//! `e(v)`, first-order-exact and with the second-order terms kept (no term is dropped):
//!
//! * product `p = a·b`: `e = |a|e(b) + e(a)|b| + e(a)e(b) + u(|a|+e(a))(|b|+e(b))`;
//! * sum `a + b`: `e = e(a) + e(b) + u(|a|+e(a)+|b|+e(b))`;
//! * dot product / GEMM element of depth `n` (Higham §3.1):
//!   `e = Σ(|a|e(b) + e(a)|b| + e(a)e(b)) + γ_n Σ(|a|+e(a))(|b|+e(b))`, `γ_n = nu/(1−nu)`,
//!   computed as grouped GEMMs of the magnitudes (`n = H`, `F`, `E`, `T` or the group size);
//! * `σ`, `silu`, `silu'`: Lipschitz constants `1/4`, `1.1` (`max silu' = 1.0998…`) and `1/2`
//!   (`max |silu''| = 1/2`) times `e(input)`, plus `c_fn·u` relative for the evaluation, with
//!   `c_fn =` [`FN_ULPS`] (XLA's and CUDA's f32 `exp`/`logistic` are within a few ulp);
//! * softmax over `n` logits with `δ = max e(z)`: the exact softmax moves by at most the
//!   factor `e^{±2δ}`, and its evaluation adds `γ_{n+c_fn+1}`:
//!   `e(p) = p·(e^{2δ} − 1 + γ_{n+c_fn+1}·e^{2δ})`;
//! * `w = g/D` with `D = Σg + ε`: `e = (e(g) + |w|e(D))/(D − e(D)) + u(|w| + …)`;
//! * a bias added to a GEMM element (the router's logits, the experts' `a`, `b`, `y`): one
//!   more rounded sum (the sum rule with the bias exact; an implementation that starts its
//!   accumulator from the bias rounds it with every K-block instead, a difference of order
//!   `u·|b|` per block that needs `|b| ≫ Σ|x||w|` to matter);
//! * the gated shared expert: `γ = σ(x·g)` (a depth-`H` dot, then `σ` as above), `γ ⊙ ys`
//!   one product each, and in the backward the gate's `<dout, ys>·γ·(1 − γ)` by the product
//!   and dot rules;
//! * gpt-oss's clamped activation: `min(a, 7)` and `clamp(b, ±7)` are exact and 1-Lipschitz
//!   (`e` unchanged), `α·g` one product, `σ` as above, `(v + 1)` one sum; its derivative is
//!   replayed as `dh·(v + 1)·silu'(α·g)` (`silu'` with Lipschitz `1/2` in its argument) and
//!   exactly 0 past a clamp. A case with an input within its error of a clamp is refused
//!   ([`LayerBound::kink`]): a correct implementation may take either one-sided derivative.
//!
//! The backward replays [`super::backward`] the same way, the routing VJP element by element.
//! Finally `e_out = e + u_out(|v| + e)` for the rounding to `output`.
//!
//! ## The reference's own error
//! The reference is the same computation in f64. Every rule above is a polynomial in `u` with
//! non-negative coefficients and no constant term, so `e(u_impl) + e(2^-53) <= e(u_impl + 2^-53)`:
//! the replay runs with `u = u_compute + 2^-53` (and `u_r = u_router + 2^-53`) and bounds
//! `|ŷ − y_ref|` directly.

#[cfg(test)]
mod derive;
mod layer;
mod replay;
#[cfg(test)]
mod tests;

pub use layer::{layer_bound, LayerBound, LayerPrecision};
pub use replay::FN_ULPS;
