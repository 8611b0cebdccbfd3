"""MoE routing in JAX, following MaxText's and DeepSeek-V3's formulas (an importable module).

`route(logits, bias, cfg)` computes, with `jax.lax.top_k` for every selection:

* scores `s`: softmax over all experts (`softmax`), the logits themselves (`topk-softmax`,
  MaxText's default and Mixtral: softmax over the k selected after top-k), or the sigmoid
  (`sigmoid`, DeepSeek-V3);
* selection on `u = s + bias`; with groups, MaxText's `expert_group_mask`: each group scored by
  the sum of its top-2 `u` (top-1 for groups of one expert; case.json `group_score`
  `top-k-per-group` sums the top `topk // topk_groups` as Megatron-Core does, `max` takes the
  top-1 as DeepSeek-V3 without a bias does), the best `topk_groups` groups kept, the rest
  masked to -inf before the top-k;
* gates from the pre-bias scores of the selected experts, normalised by `sum + norm_eps` for
  sigmoid (not at K = 1 when case.json says `sigmoid_norm: skip-k1`, as Megatron-Core; never
  under `never`, as Hugging Face's DeepseekV3TopkRouter without norm_topk_prob) or with
  `norm_topk`, times `scaling_factor` (MaxText `deepseek_scale_weights`);
* capacity dropping: `position` (MaxText `generate_masks`: one-hot of the (token, slot)
  assignments, cumulative count per sequence, keep while `count <= C`,
  `C = int(max(ceil(S*K/E) * cf, cf))`) or `probs` (Megatron `apply_router_token_dropping`:
  per expert, `lax.top_k` over the tokens' routing probabilities with `k = C`,
  `C = ceil(T*K/E * cf)`), survivors not renormalised.

Ties: `jax.lax.top_k` documents that equal elements come out lower index first; XLA however
orders +0.0 above -0.0, which IEEE calls equal, so every selection first adds +0.0 (turning
-0.0 into +0.0). With that, every tie here goes to the lower expert, group or token index, as
moecheck's reference does.

Everything is traceable (no host conversions), so `route` can sit inside `jax.vjp`; the weights
are differentiable with respect to the logits, the indices and masks are not. Call it with
float64 inputs under `jax_enable_x64` for an f64 routing.

It follows the conventions each case.json names (`group_score`, `sigmoid_norm`; ties always to
the lower index, which every `ties` accepts), so an adapter built on it declares no
convention; SUPPORTS is the `supports` part of its contract (docs/protocol.md): everything.
"""
import math

import jax
import jax.numpy as jnp

#: The score functions and capacity drop policies `route` implements.
SCORES = ("softmax", "topk-softmax", "sigmoid")
DROP_POLICIES = ("position", "probs", "token-order")

#: The `supports` of a route (or MoE layer) contract built on `route`: every case.json
#: setting (moecheck's defaults, spelled out).
SUPPORTS = {
    "scores": list(SCORES),
    "capacity": True,
    "drop_policies": list(DROP_POLICIES),
    "groups": True,
    "bias": True,
}


def top_k_lower_index(x, k):
    """`jax.lax.top_k` along the last axis with equal values (including +-0) lower index first."""
    return jax.lax.top_k(x + 0.0, k)


def scores(logits, score):
    """The pre-bias scores `s` (T, E)."""
    if score == "softmax":
        return jax.nn.softmax(logits, axis=-1)
    if score == "sigmoid":
        return jax.nn.sigmoid(logits)
    if score == "topk-softmax":
        return logits
    raise ValueError(f"unknown score function {score!r}")


def group_terms(rule, per, topk, topk_groups):
    """How many of a group's largest scores its score sums (case.json `group_score`)."""
    if rule == "top2":
        return min(2, per)
    if rule == "top-k-per-group":
        return min(topk // topk_groups, per)
    if rule == "max":
        return 1
    raise ValueError(f"unknown group_score {rule!r}")


def group_mask(u, groups, topk_groups, terms=2):
    """(T, E) mask of the experts in the `topk_groups` best groups (MaxText expert_group_mask),
    each group scored by the sum of its `terms` largest scores."""
    t, e = u.shape
    per = e // groups
    grouped = u.reshape(t, groups, per)
    top, _ = top_k_lower_index(grouped, min(terms, per))
    group_scores = top.sum(axis=-1)
    _, keep = top_k_lower_index(group_scores, topk_groups)
    mask = jax.nn.one_hot(keep, groups, dtype=u.dtype).sum(axis=-2)
    return jnp.repeat(mask, per, axis=-1)


def position_capacity(seq_len, topk, experts, cf):
    """MaxText: int(max(ceil(S*K/E) * cf, cf))."""
    return int(max(math.ceil(seq_len * topk / experts) * cf, cf))


def probs_capacity(tokens, topk, experts, cf):
    """Megatron get_capacity(T*K, E, cf): ceil(T*K/E * cf)."""
    return math.ceil(tokens * topk / experts * cf)


def route(logits, bias, cfg):
    """Routes `logits` (T, E); `bias` (E,) or None; `cfg` a dict with the case.json fields
    (topk, score, groups, topk_groups, norm_topk, scaling_factor, norm_eps, capacity_factor,
    drop_policy, seq_len). Returns a dict of indices (T, K) int32, gates (T, K), weights (T, K)
    (normalised and scaled, before dropping), kept (T, K) bool, combine (T, K) (0 where dropped)
    and group_sizes (E,) int32."""
    t, e = logits.shape
    k = cfg["topk"]
    score = cfg["score"]
    s = scores(logits, score)
    u = s if bias is None else s + bias[None, :]
    if cfg.get("groups"):
        per = e // cfg["groups"]
        terms = group_terms(cfg.get("group_score", "top2"), per, k, cfg["topk_groups"])
        mask = group_mask(u, cfg["groups"], cfg["topk_groups"], terms)
        u = jnp.where(mask > 0, u, -jnp.inf)
    _, indices = top_k_lower_index(u, k)
    picked = jnp.take_along_axis(s, indices, axis=-1)
    gates = jax.nn.softmax(picked, axis=-1) if score == "topk-softmax" else picked
    weights = gates
    sigmoid_norm = cfg.get("sigmoid_norm", "always")
    plain = sigmoid_norm == "never" or (sigmoid_norm == "skip-k1" and k == 1)
    if (score == "sigmoid" and not plain) or (score != "sigmoid" and cfg.get("norm_topk")):
        weights = weights / (weights.sum(axis=-1, keepdims=True) + cfg["norm_eps"])
    weights = weights * cfg["scaling_factor"]

    kept = jnp.ones((t, k), dtype=bool)
    if cfg.get("capacity_factor") is not None:
        cf = cfg["capacity_factor"]
        onehot = jax.nn.one_hot(indices, e, dtype=jnp.int32)  # (T, K, E)
        if cfg["drop_policy"] == "position":
            s_len = cfg.get("seq_len") or max(t, 1)
            cap = position_capacity(s_len, k, e, cf)
            flat = onehot.reshape(t // s_len, s_len * k, e)
            count = jnp.cumsum(flat, axis=1).reshape(t, k, e)
            kept = (count * onehot).sum(axis=-1) <= cap
        elif cfg["drop_policy"] == "token-order":
            cap = probs_capacity(t, k, e, cf)
            count = jnp.cumsum(onehot.reshape(t * k, e), axis=0).reshape(t, k, e)
            kept = (count * onehot).sum(axis=-1) <= cap
        elif cfg["drop_policy"] != "probs":
            raise ValueError(f"unknown drop_policy {cfg['drop_policy']!r}")
        else:
            cap = probs_capacity(t, k, e, cf)
            # Megatron: routing_probs (T, E) holds each token's weight at its selected experts.
            probs = (onehot * weights[..., None]).sum(axis=1)
            routed = onehot.sum(axis=1) > 0
            top = min(cap, t)
            if top > 0:
                _, winners = top_k_lower_index(probs.T, top)  # (E, C) token indices
                cap_mask = jax.nn.one_hot(winners, t, dtype=jnp.int32).sum(axis=1).T > 0
            else:
                cap_mask = jnp.zeros((t, e), dtype=bool)
            keep_te = routed & cap_mask
            kept = jnp.take_along_axis(keep_te, indices, axis=-1)
    combine = jnp.where(kept, weights, 0.0)
    group_sizes = (jax.nn.one_hot(indices, e, dtype=jnp.int32) * kept[..., None]).sum(axis=(0, 1))
    return {
        "indices": indices.astype(jnp.int32),
        "gates": gates,
        "weights": weights,
        "kept": kept,
        "combine": combine,
        "group_sizes": group_sizes.astype(jnp.int32),
    }
