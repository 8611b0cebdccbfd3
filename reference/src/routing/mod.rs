//! MoE routing: which experts each token goes to, with which combine weight, and which
//! assignments are dropped. Everything is computed in f64 from the logits as given.
//!
//! As an operation it is [`Route`] (`op.rs`), with its case directory (`files.rs`) and its
//! report (`report.rs`).
//!
//! ## Inputs
//! Router logits `l (T, E)` (T tokens, E experts; finite), an optional per-expert bias
//! `b (E,)` (DeepSeek-V3's `e_score_correction_bias`; finite) and a [`RoutingConfig`].
//!
//! ## Step 1: scores ([`scores`])
//! The *pre-bias scores* `s (T, E)`:
//!
//! | `score` | `s[t, e]` | public implementation |
//! |---|---|---|
//! | `softmax` | `exp(l[t,e] - m_t) / Σ_f exp(l[t,f] - m_t)`, `m_t = max_f l[t,f]` | Megatron `topk_routing_with_score_function` (`use_pre_softmax`), Switch/GShard |
//! | `topk-softmax` | `l[t, e]` (the softmax comes after selection, step 3) | MaxText `get_topk` default, Mixtral |
//! | `sigmoid` | `1 / (1 + exp(-l[t,e]))` | DeepSeek-V3 `Gate` (`score_func="sigmoid"`), MaxText `GateLogit` |
//!
//! ## Step 2: selection ([`topk`])
//! The *selection scores* are `u = s + b` (`u = s` without a bias): the bias moves the choice
//! of experts and nothing else.
//!
//! *Group-limited selection* (DeepSeek-V3, `--groups G --topk-groups TG`): the experts are cut
//! into `G` contiguous groups of `E/G`. Group `q` of token `t` scores the sum of the `n`
//! largest `u[t, e]` with `e` in `q`, with `n` set by the declared group score
//! ([`GroupScore`], `--group-score`): `top2` (default) `n = min(2, E/G)` (MaxText
//! `expert_group_mask`, DeepSeek-V3 `Gate.forward` with a bias), `top-k-per-group`
//! `n = K/TG` (Megatron-Core `group_limited_topk`), `max` `n = 1` (DeepSeek-V3 without a
//! bias). The `TG` groups with the largest scores are kept and every expert of the other
//! groups is excluded from the top-k.
//!
//! `indices[t, 0..K]` are the `K` allowed experts with the largest `u[t, ·]`, in descending
//! order of `u`.
//!
//! **Ties** ([`Ties`], `--ties`): by default (`lower-index`) among equal `u` the lower expert
//! index is selected first (and comes first in `indices`), and among equal group scores the
//! lower group index is kept (`jax.lax.top_k` documents this order). `torch.topk` leaves it
//! unspecified, so routers built on it (Megatron-Core, DeepSeek-V3's reference) declare
//! `any`: every choice among exactly equal values is valid, and the check follows the
//! implementation's choice ([`route_following`]): the routing is recomputed with each tie
//! broken as the implementation broke it, then compared as usual, so weights, capacity and
//! group sizes are checked for the choice it made. A choice no tie order gives still fails.
//!
//! ## Step 3: combine weights ([`scores::gates`])
//! The gates `g (T, K)` come from the **pre-bias** scores of the selected experts:
//!
//! * `softmax`, `sigmoid`: `g[t, j] = s[t, indices[t, j]]`;
//! * `topk-softmax`: `g[t, ·] = softmax(l[t, indices[t, ·]])` over the `K` selected logits
//!   (max-subtracted, as step 1).
//!
//! Then, per token, with `D_t = Σ_j g[t, j] + ε` and `ε = 1e-20` ([`NORM_EPS`]):
//!
//! `w[t, j] = α · g[t, j] / D_t` when normalising, `w[t, j] = α · g[t, j]` otherwise,
//!
//! where `α` is `routed_scaling_factor` (`--scaling-factor`, default 1). Normalisation is always
//! on for `sigmoid` (DeepSeek-V3 `weights /= weights.sum()`, Megatron and HF DeepSeek-V3 with
//! `+ 1e-20`) and on for the other score functions with `norm_topk_prob` (`--norm-topk`, Qwen3
//! in MaxText; for `topk-softmax` it only changes rounding). The `ε` never matters for softmax
//! gates (`Σ g >= 1/E`) but is part of the formula, and of its derivative.
//! With `K = 1` DeepSeek-V3's `Gate` still normalises, so a sigmoid weight is `α·g/(g + ε)`,
//! i.e. `α` (`--sigmoid-norm always`, the default); Megatron-Core does not normalise at
//! `K = 1` and its weight is `α·g` (`--sigmoid-norm skip-k1`, [`SigmoidNorm`]).
//!
//! ## Step 4: capacity ([`capacity`])
//! Per assignment `(t, j)` (a token can keep one slot and lose another). Three policies:
//!
//! * `position` (MaxText `generate_masks`, dense path): tokens form sequences of `S` consecutive
//!   tokens (`--seq-len`, `T = B·S`). Per sequence, capacity
//!   `C = int(max(ceil(S·K/E)·cf, cf))`; the sequence's assignments are visited token-major,
//!   slot-minor (`(t, 0), (t, 1), …, (t+1, 0)`), and an assignment is kept iff it is among the
//!   first `C` visited for its expert.
//! * `token-order` (Megatron `drop_policy="position"`; `--convention megatron` reads
//!   `--drop-policy position` as this): capacity as `probs` below, over all `T` tokens; per
//!   expert, the `C` assignments of the lowest token indices are kept (under `ties = any`,
//!   any `C` of them: Megatron ranks them with `torch.topk` over a 0/1 map).
//! * `probs` (Megatron `apply_router_token_dropping`, `drop_policy="probs"`): capacity
//!   `C = ceil((T·K)/E · cf)` over all `T` tokens; per expert, the `C` assignments with the
//!   largest weight `w[t, j]` are kept (equal weights: the lower token index wins).
//!
//! Survivors are **not** renormalised: `combine[t, j] = w[t, j]` if kept, exactly `0` if
//! dropped. `group_sizes[e]` counts the kept assignments of expert `e`.
//!
//! ## Derivatives (for a hand-written VJP)
//! With `dc = ∂L/∂combine`: `dw = dc ⊙ kept` (dropped assignments get exactly 0); when
//! normalising `dg[t,j] = α·(dw[t,j] - Σ_i dw[t,i]·g[t,i]/D_t) / D_t`, else `dg = α·dw`.
//! Then `softmax`: `ds[t, indices[t,j]] = dg[t,j]` (0 elsewhere),
//! `dl[t,e] = s[t,e]·(ds[t,e] - Σ_f s[t,f]·ds[t,f])`; `sigmoid`:
//! `dl[t, indices[t,j]] = dg[t,j]·s·(1 - s)`; `topk-softmax`:
//! `dl[t, indices[t,j]] = g[t,j]·(dg[t,j] - Σ_i g[t,i]·dg[t,i])`. The bias, the selection,
//! the group mask and the capacity get no gradient (they are piecewise constant).

mod bound;
pub mod capacity;
mod compare;
mod config;
pub mod convention;
mod files;
mod near_tie;
mod op;
mod report;
mod route;
pub mod scores;
pub mod topk;

pub use bound::{selection_score_bound, weight_bound, RouteOutputs, RoutePrecision};
pub use capacity::{apply_capacity, position_capacity, probs_capacity};
pub use compare::{compare_routing, RouteMismatch, RouteReport};
pub use config::{Capacity, DropPolicy, GroupLimit, RoutingConfig, ScoreFunction, NORM_EPS};
pub use convention::{Convention, GroupScore, SigmoidNorm, SlotOrder, Ties};
pub use files::{logits_dtype, RouteJson, RoutingJson};
pub use op::{ComputeFormat, Route};
pub use report::RouteDocument;
pub use route::{route, route_following, Routing, RoutingCase};
