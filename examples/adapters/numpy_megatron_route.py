#!/usr/bin/env python3
"""A Megatron-Core-style router in numpy, for op `route` (docs/protocol.md).

It restates, from Megatron-Core's public `moe_utils.py` (`topk_routing_with_score_function`,
`group_limited_topk`, `apply_router_token_dropping`, `get_capacity`), what a Megatron user's
router does, whatever conventions case.json declares:

* scores in float32 (Megatron computes them in f32 even with an fp64 router): `softmax` is
  `use_pre_softmax=True` (top-k of the probabilities), `topk-softmax` is
  `use_pre_softmax=False` (softmax over the selected logits), `sigmoid` selects on
  `sigmoid + bias` and weighs with the pre-bias sigmoids, normalised by `sum + 1e-20`
  **only when K > 1**;
* groups scored by the sum of their top `topk // topk_groups` selection scores;
* every top-k breaks exact ties toward the **higher** index, one of the orders `torch.topk`
  may give (it promises none);
* capacity `ceil(T*K/E * cf)`; case.json `probs` is Megatron's `drop_policy="probs"` (per
  expert, the largest weights), `token-order` is Megatron's `drop_policy="position"` (per
  expert, a top-k over the 0/1 routing map: here the higher token indices, as ties go).
  MaxText's per-sequence `position` is not Megatron's and is refused.

Refused, with a one-line reason (a Megatron user cannot configure them): drop_policy
`position`, norm_topk with score softmax, a bias with a score other than sigmoid (Megatron's
expert bias is for the sigmoid score only), and group-limited selection with topk <
topk_groups.

So it passes under `--convention megatron` and fails under the default (MaxText) conventions.
Declared contract (CONTRACT): compute `f32`, convention `megatron` (ties `any`); supports
every score function, capacity with the drop policies `probs` and `token-order`, groups, a
bias and a scaling factor. `moecheck prop` reads it from the worker's greeting; with
`exec:`, and on `moecheck route`, give the flags:

    moecheck route --convention megatron --impl "worker:python3 examples/adapters/numpy_megatron_route.py"
    moecheck prop --op route --impl "worker:python3 examples/adapters/numpy_megatron_route.py"

Usage: numpy_megatron_route.py [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import math

import numpy as np

import _checkout  # noqa: F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve
from moecheck.case import CaseError
from megatron_contract import CONTRACT  # noqa: E402  (the contract in the greeting)

F32 = np.float32


def topk_higher_index(values, k):
    """Indices of the k largest entries of each row, largest first, equal values higher index
    first."""
    n = values.shape[-1]
    out = np.empty(values.shape[:-1] + (k,), np.int64)
    for row in np.ndindex(values.shape[:-1]):
        v = values[row]
        order = np.lexsort((-np.arange(n), -v))  # last key first: value desc, then index desc
        out[row] = order[:k]
    return out


def softmax(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def select(u, cfg):
    """Megatron `compute_topk`: plain or group-limited top-k of the selection scores u."""
    t, e = u.shape
    k = cfg["topk"]
    if not cfg.get("groups"):
        return topk_higher_index(u, k)
    g, tg = cfg["groups"], cfg["topk_groups"]
    per = e // g
    terms = k // tg
    if terms < 1:
        raise CaseError(f"topk {k} < topk_groups {tg}: Megatron sums the top topk // topk_groups = 0 scores")
    grouped = u.reshape(t, g, per)
    top = np.take_along_axis(grouped, topk_higher_index(grouped, terms), axis=-1)
    group_scores = top.sum(axis=-1, dtype=F32)
    keep = topk_higher_index(group_scores, tg)
    mask = np.zeros((t, g), bool)
    np.put_along_axis(mask, keep, True, axis=-1)
    masked = np.where(np.repeat(mask, per, axis=-1), u, F32(-np.inf))
    return topk_higher_index(masked, k)


def handler(case):
    cfg = case.config
    logits = np.asarray(case.logits, F32)
    t, e = logits.shape
    k = cfg["topk"]
    score = cfg["score"]
    if cfg.get("norm_topk") and score == "softmax":
        raise CaseError("norm_topk with softmax: Megatron-Core has no such switch")
    if case.bias is not None and score != "sigmoid":
        raise CaseError(f"a bias with score {score}: Megatron-Core's expert bias only supports sigmoid")
    if score == "softmax":
        s = softmax(logits)
        indices = select(s, cfg)
        probs = np.take_along_axis(s, indices, axis=-1)
    elif score == "topk-softmax":
        indices = select(logits, cfg)
        probs = softmax(np.take_along_axis(logits, indices, axis=-1))
    elif score == "sigmoid":
        s = (F32(1) / (F32(1) + np.exp(-logits))).astype(F32)
        u = s if case.bias is None else s + np.asarray(case.bias, F32)[None, :]
        indices = select(u, cfg)
        probs = np.take_along_axis(s, indices, axis=-1)
        if k > 1:
            probs = probs / (probs.sum(axis=-1, keepdims=True) + F32(1e-20))
    else:
        raise CaseError(f"score {score!r} is not a Megatron score function")
    probs = (probs * F32(cfg["scaling_factor"])).astype(F32)

    kept = np.ones((t, k), bool)
    if cfg.get("capacity_factor") is not None:
        policy = cfg["drop_policy"]
        if policy not in ("probs", "token-order"):
            raise CaseError(f"drop_policy {policy!r}: Megatron's policies are probs and token-order (its 'position')")
        cap = math.ceil(t * k / e * cfg["capacity_factor"])
        routing_map = np.zeros((t, e), bool)
        np.put_along_axis(routing_map, indices, True, axis=-1)
        dense = np.zeros((t, e), F32)
        np.put_along_axis(dense, indices, probs, axis=-1)
        ranked = dense if policy == "probs" else routing_map.astype(F32)
        winners = topk_higher_index(ranked.T, min(cap, t))  # (E, C) token indices
        cap_mask = np.zeros((e, t), bool)
        np.put_along_axis(cap_mask, winners, True, axis=-1)
        kept = np.take_along_axis(routing_map & cap_mask.T, indices, axis=-1)
    weights = np.where(kept, probs, F32(0))
    group_sizes = np.zeros(e, np.int32)
    np.add.at(group_sizes, indices[kept], 1)
    return {
        "indices": indices.astype(np.int32),
        "weights": weights.astype(F32),
        "kept": kept.astype(np.uint8),
        "group_sizes": group_sizes,
    }


if __name__ == "__main__":
    serve(handler, ops=["route"], contract=CONTRACT)
