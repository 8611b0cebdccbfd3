#!/usr/bin/env python3
"""Megatron-Core adapter for op `route`: Megatron's own router functions, on CPU.

Calls `megatron.core.transformer.moe.moe_utils.topk_routing_with_score_function` and then,
with a capacity factor, `apply_router_token_dropping`, exactly as `TopKRouter.routing` does
(megatron/core/transformer/moe/router.py; fused=False, pad_to_capacity=False). The adapter
**is** Megatron: it behaves as Megatron behaves whatever case.json says about conventions, so
the checker has to be told Megatron's conventions (`moecheck route --convention megatron`);
under moecheck's default (MaxText) conventions it shows where the two differ.

case.json -> Megatron (TransformerConfig field in brackets):

* `score` softmax -> score_function="softmax", use_pre_softmax=True [moe_router_pre_softmax];
  topk-softmax -> "softmax", use_pre_softmax=False; sigmoid -> "sigmoid"
  [moe_router_score_function];
* bias.npy -> expert_bias (float32, as Megatron keeps it) [moe_router_enable_expert_bias];
* groups / topk_groups -> num_groups / group_topk [moe_router_num_groups,
  moe_router_group_topk]; a group's score is Megatron's: the sum of its top topk // group_topk;
* scaling_factor -> scaling_factor [moe_router_topk_scaling_factor] (None when 1);
* capacity_factor -> apply_router_token_dropping [moe_expert_capacity_factor]; drop_policy
  `probs` -> "probs", `token-order` -> "position" [moe_token_drop_policy]. Megatron's
  "position" is per expert over all tokens, capacity ceil(T*K/E*cf), implemented as
  torch.topk over the 0/1 routing map.
* norm_eps is ignored: Megatron divides sigmoid gates by sum + 1e-20, and does not normalise
  at all when K = 1.

Refused, with a one-line reason (settings Megatron does not have, or that its
TransformerConfig rejects):

* drop_policy `position` (MaxText's per-sequence policy: Megatron has none such);
* norm_topk with score softmax (Megatron has no switch for it; topk-softmax gates are a
  softmax over the selected and so already normalised, and sigmoid gates always are for K > 1:
  there it is accepted as what Megatron does anyway);
* a bias with a softmax score (TransformerConfig: "Expert bias for aux-loss-free routing only
  supports sigmoid score function"; the function itself would silently ignore it);
* topk-softmax with K = 1 (TransformerConfig: "Please use --moe-router-pre-softmax when topk
  is 1");
* 0 tokens with groups: `group_limited_topk` raises "cannot reshape tensor of 0 elements"
  (measured on megatron-core 0.16.1; an empty micro-batch is rare but legal).

Scores are computed in float32: logits go in as float32 (moe_router_dtype="fp32"; an f64
logit that is not an f32 is rounded to one), so declare `--compute f32`. With `--fp64-router`
they go in as float64 (moe_router_dtype="fp64"); Megatron still computes the softmax and the
sigmoid in float32 (`dtype=torch.float32`, `logits.float()`) and casts them back, so the
declaration stays `--compute f32` (`--compute f64` fails on the weights).

Outputs: indices in the order Megatron's top-k returned them (torch.topk's, largest first;
recorded through Megatron's own RouterReplay hook in RECORD mode, since the function returns
only dense maps), weights = Megatron's routing probs after dropping, gathered at the indices
(in the router's dtype; 0 where dropped), kept = its routing map after dropping gathered at
the indices, group_sizes = kept assignments per expert.

Declared contract (CONTRACT): compute `f32`, convention `megatron` (ties `any`: torch.topk
promises no order among equal values); supports every score function, capacity with the
drop policies `probs` and `token-order`, groups, a bias (with the sigmoid score only: a bias
with another score is refused, see above) and a scaling factor. `moecheck prop` reads it from
the worker's greeting; with `exec:`, and on `moecheck route`, give the flags:

    moecheck route --convention megatron --compute f32 \\
        --impl "worker:.peers-venv/bin/python examples/adapters/megatron_route.py" ...
    moecheck prop --op route --impl "worker:.peers-venv/bin/python examples/adapters/megatron_route.py"

Needs torch and megatron-core (scripts/peers installs them in .peers-venv). Usage:
megatron_route.py [--fp64-router] [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import sys
import warnings

warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from megatron.core.transformer.moe.moe_utils import (  # noqa: E402
    apply_router_token_dropping,
    topk_routing_with_score_function,
)
from megatron.core.transformer.moe.router_replay import (  # noqa: E402
    RouterReplay,
    RouterReplayAction,
)

import _checkout  # noqa: E402,F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve  # noqa: E402
from moecheck.case import CaseError  # noqa: E402
from megatron_contract import CONTRACT  # noqa: E402  (the contract in the greeting)

#: case.json drop_policy -> Megatron's moe_token_drop_policy.
DROP_POLICIES = {"probs": "probs", "token-order": "position"}

#: The router's logits dtype (Megatron's moe_router_dtype): fp32, or fp64 with --fp64-router.
ROUTER_DTYPE = torch.float64 if "--fp64-router" in sys.argv[1:] else torch.float32


def refusal(cfg, has_bias, tokens):
    """The one-line reason Megatron cannot run this case, or None."""
    score, k = cfg["score"], cfg["topk"]
    if tokens == 0 and cfg.get("groups"):
        return ("0 tokens with groups: Megatron's group_limited_topk raises (it reshapes the "
                "empty scores to [0, groups, -1])")
    if score not in ("softmax", "topk-softmax", "sigmoid"):
        return f"score {score!r}: Megatron has softmax (pre- or post-top-k) and sigmoid"
    if cfg.get("capacity_factor") is not None and cfg.get("drop_policy") not in DROP_POLICIES:
        return (f"drop_policy {cfg.get('drop_policy')!r}: Megatron drops by 'probs' or by "
                f"'position' (moecheck's token-order), not MaxText's per-sequence position")
    if cfg.get("norm_topk") and score == "softmax":
        return "norm_topk with a pre-top-k softmax: Megatron has no switch to renormalise it"
    if has_bias and score != "sigmoid":
        return f"a bias with score {score}: Megatron's expert bias only supports sigmoid"
    if score == "topk-softmax" and k == 1:
        return "topk-softmax with K = 1: Megatron requires moe_router_pre_softmax when topk is 1"
    return None


def handler(case):
    cfg = case.config
    reason = refusal(cfg, case.bias is not None, np.asarray(case.logits).shape[0])
    if reason is not None:
        raise CaseError(reason)
    k = cfg["topk"]
    logits = torch.from_numpy(np.asarray(case.logits)).to(ROUTER_DTYPE)
    bias = None if case.bias is None else torch.from_numpy(np.asarray(case.bias)).to(torch.float32)
    scaling = cfg.get("scaling_factor")
    recorder = RouterReplay()
    recorder.set_router_replay_action(RouterReplayAction.RECORD)
    try:
        probs, routing_map = topk_routing_with_score_function(
            logits,
            k,
            use_pre_softmax=cfg["score"] == "softmax",
            num_groups=cfg.get("groups") or None,
            group_topk=cfg.get("topk_groups") or None,
            scaling_factor=None if scaling in (None, 1, 1.0) else float(scaling),
            score_function="sigmoid" if cfg["score"] == "sigmoid" else "softmax",
            expert_bias=bias,
            fused=False,
            router_replay=recorder,
        )
        indices = recorder.get_recorded_indices()
    finally:
        RouterReplay.global_router_replay_instances.remove(recorder)
    if not bool(routing_map.gather(1, indices).all()):
        raise RuntimeError("Megatron's routing map does not hold the recorded top-k indices")
    if cfg.get("capacity_factor") is not None:
        probs, routing_map = apply_router_token_dropping(
            probs,
            routing_map,
            router_topk=k,
            capacity_factor=float(cfg["capacity_factor"]),
            drop_policy=DROP_POLICIES[cfg["drop_policy"]],
            pad_to_capacity=False,
        )
    return {
        "indices": indices.to(torch.int32).numpy(),
        "weights": probs.gather(1, indices).numpy(),
        "kept": routing_map.gather(1, indices).to(torch.uint8).numpy(),
        "group_sizes": routing_map.sum(dim=0).to(torch.int32).numpy(),
    }


if __name__ == "__main__":
    serve(handler, ops=["route"], flags=["--fp64-router"], contract=CONTRACT)
