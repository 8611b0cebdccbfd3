#!/usr/bin/env python3
"""Hugging Face transformers adapter for ops `route` and `moe_layer`: the families' own modules.

    --family deepseek-v3   DeepseekV3TopkRouter / DeepseekV3MoE
    --family qwen2-moe     Qwen2MoeTopKRouter   / Qwen2MoeSparseMoeBlock
    --family qwen3-moe     Qwen3MoeTopKRouter   / Qwen3MoeSparseMoeBlock
    --family mixtral       MixtralTopKRouter    / MixtralSparseMoeBlock
    --family gpt-oss       GptOssTopKRouter     / GptOssMLP (GptOssExperts)

The adapter **is** transformers: it builds the family's module from a configuration made from
case.json, copies the case's arrays into its parameters, and returns what the module returns
(the forward, and for `moe_layer` every gradient by autograd of `sum(dout * out)`). It
behaves as the family behaves whatever case.json says about conventions, so the checker must
be told the family's preset (`--convention hf-<family>`, docs/contract.md); the greeting
declares it for `moecheck prop`.

case.json -> transformers:

* `route`: the router alone with `hidden_size = E` and an identity weight, fed the logits as
  its hidden states (an f32 product with the identity is exact), so its logits are the case's;
  `bias.npy` -> `e_score_correction_bias` (DeepSeek-V3); groups -> `n_group` / `topk_group`;
  `scaling_factor` -> `routed_scaling_factor`; `norm_topk` -> `norm_topk_prob`.
* `moe_layer`: x (T, H) as a batch of one sequence; `w_router.T` -> the router's weight;
  `w0[e].T` / `w1[e].T` -> the gate and up halves of `gate_up_proj[e]` (E, 2F, H);
  `wo[e].T` -> `down_proj[e]` (E, H, F); the shared expert's `gate_proj`, `up_proj`,
  `down_proj` (an MLP of width `shared_ffn`); `shared_gate.npy` -> Qwen2-MoE's
  `shared_expert_gate` (Linear(H, 1)). gpt-oss: `w0[e]` / `w1[e]` -> the even / odd columns of
  `gate_up_proj[e]` (E, H, 2F) and `expert_b0` / `expert_b1` of `gate_up_proj_bias` (it
  interleaves gate and up), `wo`, `expert_bo` -> `down_proj`, `down_proj_bias`; `router_bias` ->
  the router's `bias`. Gradients come back the same way.

Refused, with a one-line reason: what the family's module cannot express (capacity dropping;
a score function other than the family's; a bias or groups outside DeepSeek-V3; a scaling
factor outside DeepSeek-V3; Mixtral without `norm_topk`; a shared expert where the family has
none, none where it has one, or one gated otherwise than the family's; DeepSeek-V3 groups of
one expert, whose group score `topk(2)` cannot be taken).

Precision: the module runs in float32, or float64 with `--f64`; the routers score in float32
either way (DeepSeek-V3 casts its input and weight to float32; Qwen and Mixtral take the
softmax in float32), so `--f64` declares `compute f64, router_compute f32`, except gpt-oss's
router, which runs in the module's dtype.

`--bug NAME` plants one defect in a copy of the family's code, for the runs that must fail:
`drop-last-slot` (every family: the weight of each token's last slot is zeroed),
`biased-weights` (deepseek-v3: the weights gathered from the biased selection scores),
`ungated-shared` (qwen2-moe: the shared expert added without its gate), `unclamped-up`
(gpt-oss: the up projection not clamped).

    moecheck route --convention hf-deepseek-v3 --topk 4 --groups 4 --topk-groups 2 --bias \\
        --impl "worker:.peers-venv/bin/python examples/adapters/hf_moe.py --family deepseek-v3"
    moecheck moe --convention hf-qwen2-moe --shared-ffn 8 \\
        --impl "worker:.peers-venv/bin/python examples/adapters/hf_moe.py --family qwen2-moe"
    moecheck prop --op moe --impl "worker:.peers-venv/bin/python examples/adapters/hf_moe.py --family mixtral"

Needs torch and transformers (scripts/peers installs them in .peers-venv). Usage:
hf_moe.py --family F [--f64] [--bug NAME] [CASE_DIR]   (no CASE_DIR: a moecheck worker)
"""
import sys
import warnings

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import _checkout  # noqa: E402,F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve  # noqa: E402
from moecheck.case import CaseError  # noqa: E402


def _flag_value(name):
    """The value after ``name`` in the arguments (removed from REST), or None."""
    if name in REST:
        i = REST.index(name)
        if i + 1 < len(REST):
            value = REST[i + 1]
            del REST[i:i + 2]
            return value
    return None


#: The arguments left for moecheck's serve() once --family and --bug are read.
REST = list(sys.argv[1:])


FAMILIES = ("deepseek-v3", "qwen2-moe", "qwen3-moe", "mixtral", "gpt-oss")
BUGS = {"drop-last-slot": FAMILIES, "biased-weights": ("deepseek-v3",),
        "ungated-shared": ("qwen2-moe",), "unclamped-up": ("gpt-oss",)}
FAMILY = _flag_value("--family")
BUG = _flag_value("--bug")
F64 = "--f64" in sys.argv[1:]
if FAMILY not in FAMILIES:
    sys.exit(f"hf_moe.py: --family must be one of {', '.join(FAMILIES)} (got {FAMILY!r})")
if BUG is not None and FAMILY not in BUGS.get(BUG, ()):
    sys.exit(f"hf_moe.py: --bug {BUG!r} is not one for {FAMILY} ({', '.join(BUGS)})")
DT = torch.float64 if F64 else torch.float32
FORMAT = "f64" if F64 else "f32"

# The contract in the greeting (docs/protocol.md): the family's preset and what it can run.
_ROUTE_SUPPORTS = {
    "deepseek-v3": {"scores": ["sigmoid"], "capacity": False, "groups": True, "bias": True,
                    "scaling": True},
    "qwen2-moe": {"scores": ["softmax"], "capacity": False, "groups": False, "bias": False,
                  "scaling": False},
    "mixtral": {"scores": ["softmax"], "capacity": False, "groups": False, "bias": False,
                "scaling": False},
}
_ROUTE_SUPPORTS["qwen3-moe"] = _ROUTE_SUPPORTS["qwen2-moe"]
_ROUTE_SUPPORTS["gpt-oss"] = dict(_ROUTE_SUPPORTS["qwen2-moe"], scores=["topk-softmax"])
_SHARED = {"deepseek-v3": (True, False), "qwen2-moe": (True, True), "qwen3-moe": (False, False),
           "mixtral": (False, False), "gpt-oss": (False, False)}
OSS = FAMILY == "gpt-oss"
_LAYER = {"activations": ["clamped-swiglu" if OSS else "swiglu"], "expert_bias": OSS,
          "router_bias": OSS}
CONTRACT = {
    "route": {
        "declared": {"compute": "f32", "convention": f"hf-{FAMILY}"},
        "supports": _ROUTE_SUPPORTS[FAMILY],
    },
    "moe_layer": {
        "declared": {"compute": FORMAT, "out_dtype": FORMAT,
                     "router_compute": FORMAT if OSS else "f32", "convention": f"hf-{FAMILY}"},
        "supports": dict(_ROUTE_SUPPORTS[FAMILY], dtypes=["f32", "bf16", "f16"],
                         shared_expert=_SHARED[FAMILY][0], shared_gate=_SHARED[FAMILY][1],
                         **_LAYER),
    },
}


def _modules():
    """(config class, router class, block class, MLP class) of the family."""
    if FAMILY == "deepseek-v3":
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m
        from transformers import DeepseekV3Config as C
        return C, m.DeepseekV3TopkRouter, m.DeepseekV3MoE, m.DeepseekV3MLP
    if FAMILY == "qwen2-moe":
        from transformers.models.qwen2_moe import modeling_qwen2_moe as m
        from transformers import Qwen2MoeConfig as C
        return C, m.Qwen2MoeTopKRouter, m.Qwen2MoeSparseMoeBlock, m.Qwen2MoeMLP
    if FAMILY == "qwen3-moe":
        from transformers.models.qwen3_moe import modeling_qwen3_moe as m
        from transformers import Qwen3MoeConfig as C
        return C, m.Qwen3MoeTopKRouter, m.Qwen3MoeSparseMoeBlock, None
    if FAMILY == "gpt-oss":
        from transformers.models.gpt_oss import modeling_gpt_oss as m
        from transformers import GptOssConfig as C
        return C, m.GptOssTopKRouter, m.GptOssMLP, None
    from transformers.models.mixtral import modeling_mixtral as m
    from transformers import MixtralConfig as C
    return C, m.MixtralTopKRouter, m.MixtralSparseMoeBlock, None


CONFIG, ROUTER, BLOCK, MLP = _modules()


def refusal(cfg, experts, has_bias, shared_ffn=0, gated=False, layer=False):
    """The one-line reason the family's module cannot run this case, or None."""
    want = {"deepseek-v3": "sigmoid", "gpt-oss": "topk-softmax"}.get(FAMILY, "softmax")
    if cfg["score"] != want:
        return f"score {cfg['score']}: the {FAMILY} router scores with {want}"
    if cfg.get("capacity_factor") is not None:
        return "capacity dropping: transformers' MoE blocks drop nothing"
    groups = cfg.get("groups")
    if FAMILY != "deepseek-v3":
        if has_bias:
            return f"a selection bias: {FAMILY} has none"
        if groups:
            return f"group-limited selection: {FAMILY} has none"
        if float(cfg.get("scaling_factor", 1.0)) != 1.0:
            return f"scaling factor {cfg['scaling_factor']}: {FAMILY} has none"
    elif experts // (groups or 1) < 2:
        return "groups of one expert: DeepseekV3TopkRouter scores a group by topk(2)"
    if FAMILY == "mixtral" and not cfg.get("norm_topk"):
        return "norm_topk false: MixtralTopKRouter always renormalises the top k"
    if layer:
        oss = (cfg.get("activation", "swiglu") == "clamped-swiglu", bool(cfg.get("expert_bias")),
               bool(cfg.get("router_bias")))
        if oss != (OSS, OSS, OSS):
            return (f"the {FAMILY} layer has " + ("the clamped SwiGLU, expert biases and a router "
                    "bias" if OSS else "a plain SwiGLU and no expert or router bias"))
        has, has_gate = _SHARED[FAMILY]
        if (shared_ffn > 0) != has or (has and gated != has_gate):
            what = "a gated shared expert" if has_gate else ("a shared expert" if has else "no shared expert")
            return f"the {FAMILY} layer has {what}"
    return None


def make_config(cfg, hidden, experts, ffn, shared_ffn):
    common = dict(hidden_size=hidden, num_experts_per_tok=cfg["topk"], hidden_act="silu",
                  norm_topk_prob=bool(cfg.get("norm_topk")))
    if FAMILY == "deepseek-v3":
        c = CONFIG(**common, n_routed_experts=experts, moe_intermediate_size=ffn,
                   n_group=cfg.get("groups") or 1, topk_group=cfg.get("topk_groups") or 1,
                   routed_scaling_factor=float(cfg.get("scaling_factor", 1.0)),
                   n_shared_experts=1)
    elif FAMILY in ("qwen2-moe", "qwen3-moe"):
        extra = {"shared_expert_intermediate_size": shared_ffn} if FAMILY == "qwen2-moe" else {}
        c = CONFIG(**common, num_experts=experts, moe_intermediate_size=ffn, **extra)
    else:
        c = CONFIG(**common, num_local_experts=experts, intermediate_size=ffn)
    if OSS:
        assert (c.swiglu_alpha, c.swiglu_limit) == (1.702, 7.0), "moecheck's gpt-oss constants"
    return c


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).to(DT)


def buggy_router_forward(router):
    """The router's forward, with --bug planted in a copy of the family's code."""
    original = router.forward

    def biased(hidden_states):
        # DeepseekV3TopkRouter.forward (transformers 5.25) with the weights gathered from
        # the biased selection scores instead of the sigmoid scores.
        hidden_states = hidden_states.view(-1, router.hidden_dim)
        logits = torch.nn.functional.linear(hidden_states.type(torch.float32),
                                            router.weight.type(torch.float32))
        scores = logits.sigmoid()
        choice = scores + router.e_score_correction_bias
        g = router.num_group
        gs = choice.view(-1, g, router.num_experts // g).topk(2, dim=-1)[0].sum(dim=-1)
        gidx = torch.topk(gs, k=router.topk_group, dim=-1, sorted=False)[1]
        gmask = torch.zeros_like(gs).scatter_(1, gidx, 1)
        smask = gmask.unsqueeze(-1).expand(-1, g, router.num_experts // g).reshape(-1, router.num_experts)
        choice = choice.masked_fill(~smask.bool(), float("-inf"))
        idx = torch.topk(choice, k=router.top_k, dim=-1, sorted=False)[1]
        w = choice.gather(1, idx)  # the bug: scores.gather in transformers
        if router.norm_topk_prob:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, w * router.routed_scaling_factor, idx

    def drop_last(hidden_states):
        logits, w, idx = original(hidden_states)
        mask = torch.ones_like(w)
        mask[:, -1] = 0
        return logits, w * mask, idx

    return {"biased-weights": biased, "drop-last-slot": drop_last}.get(BUG, original)


def route_handler(case):
    cfg = case.config
    logits = np.asarray(case.logits)
    t, e = logits.shape
    reason = refusal(cfg, e, case.bias is not None)
    if reason is not None:
        raise CaseError(reason)
    router = ROUTER(make_config(cfg, e, e, 1, 0)).to(DT)
    with torch.no_grad():
        router.weight.copy_(torch.eye(e, dtype=router.weight.dtype))
        if OSS:
            router.bias.zero_()
        if case.bias is not None:
            router.e_score_correction_bias.copy_(torch.from_numpy(np.asarray(case.bias, np.float32)))
    router.forward = buggy_router_forward(router)
    with torch.no_grad():
        _, weights, indices = router(_t(logits))
    counts = np.bincount(indices.numpy().reshape(-1), minlength=e)
    return {
        "indices": indices.to(torch.int32).numpy(),
        "weights": weights.to(torch.float64).numpy(),
        "kept": np.ones(indices.shape, np.uint8),
        "group_sizes": counts.astype(np.int32),
    }


def layer_handler(case):
    cfg = case.config
    t, h, e, f = cfg["tokens"], cfg["hidden"], cfg["experts"], cfg["ffn"]
    fs = cfg.get("shared_ffn", 0)
    gated = cfg.get("shared_gate", "none") == "sigmoid"
    reason = refusal(cfg, e, cfg.get("bias", False), fs, gated, layer=True)
    if reason is not None:
        raise CaseError(reason)
    block = BLOCK(make_config(cfg, h, e, f, fs))
    if FAMILY == "deepseek-v3":
        block.shared_experts = MLP(block.config, intermediate_size=fs)
    block = block.to(DT)
    block.eval()
    experts = block.experts
    router = getattr(block, "gate", None) or block.router
    with torch.no_grad():
        router.weight.copy_(_t(np.asarray(case.w_router).T))
        w0, w1, wo = (np.asarray(a) for a in (case.w0, case.w1, case.wo))
        if OSS:
            # gate_up_proj (E, H, 2F) interleaves gate (even columns) and up (odd).
            gu = np.empty((e, h, 2 * f))
            gu[..., ::2], gu[..., 1::2] = w0, w1
            experts.gate_up_proj.copy_(_t(gu))
            gub = np.empty((e, 2 * f))
            gub[:, ::2], gub[:, 1::2] = case.expert_b0, case.expert_b1
            experts.gate_up_proj_bias.copy_(_t(gub))
            experts.down_proj.copy_(_t(wo))
            experts.down_proj_bias.copy_(_t(case.expert_bo))
            router.bias.copy_(_t(case.router_bias))
        else:
            experts.gate_up_proj.copy_(_t(np.concatenate([w0, w1], axis=2).transpose(0, 2, 1)))
            experts.down_proj.copy_(_t(wo.transpose(0, 2, 1)))
        if cfg.get("bias"):
            router.e_score_correction_bias.copy_(torch.from_numpy(np.asarray(case.bias, np.float32)))
        shared = getattr(block, "shared_experts", None) or getattr(block, "shared_expert", None)
        if shared is not None:
            shared.gate_proj.weight.copy_(_t(np.asarray(case.shared_w0).T))
            shared.up_proj.weight.copy_(_t(np.asarray(case.shared_w1).T))
            shared.down_proj.weight.copy_(_t(np.asarray(case.shared_wo).T))
        if gated:
            block.shared_expert_gate.weight.copy_(_t(np.asarray(case.shared_gate)[None, :]))
    router.forward = buggy_router_forward(router)
    if BUG == "ungated-shared":
        block.shared_expert_gate.forward = lambda x: torch.full((x.shape[0], 1), 1e4, dtype=x.dtype)
    if BUG == "unclamped-up":
        # GptOssExperts._apply_gate (transformers 5.25) without the up projection's clamp.
        def unclamped(gate_up):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            gate = gate.clamp(min=None, max=experts.limit)
            return (up + 1) * gate * torch.sigmoid(gate * experts.alpha)
        experts._apply_gate = unclamped
    x = _t(case.x).reshape(1, t, h).requires_grad_(True)
    out = block(x)
    out = out[0] if isinstance(out, tuple) else out
    (out * _t(case.dout).reshape(1, t, h)).sum().backward()

    def grad(p):
        return np.zeros(tuple(p.shape)) if p.grad is None else p.grad.to(torch.float64).numpy()

    gu, dn = grad(experts.gate_up_proj), grad(experts.down_proj)
    if OSS:
        dw0, dw1, dwo = gu[..., ::2], gu[..., 1::2], dn
    else:
        dw0, dw1, dwo = (gu[:, :f, :].transpose(0, 2, 1), gu[:, f:, :].transpose(0, 2, 1),
                         dn.transpose(0, 2, 1))
    res = {
        "out": out.detach().reshape(t, h).to(torch.float64).numpy(),
        "dx": grad(x).reshape(t, h),
        "dw_router": grad(router.weight).T,
        "dw0": dw0,
        "dw1": dw1,
        "dwo": dwo,
    }
    if OSS:
        gub = grad(experts.gate_up_proj_bias)
        res["dexpert_b0"], res["dexpert_b1"] = gub[:, ::2], gub[:, 1::2]
        res["dexpert_bo"] = grad(experts.down_proj_bias)
        res["drouter_bias"] = grad(router.bias)
    if shared is not None:
        res["dshared_w0"] = grad(shared.gate_proj.weight).T
        res["dshared_w1"] = grad(shared.up_proj.weight).T
        res["dshared_wo"] = grad(shared.down_proj.weight).T
    if gated:
        res["dshared_gate"] = grad(block.shared_expert_gate.weight)[0]
    np_dt = np.float64 if F64 else np.float32
    return {k: np.ascontiguousarray(v, np_dt) for k, v in res.items()}


def handler(case):
    return route_handler(case) if case.config.get("op") == "route" else layer_handler(case)


if __name__ == "__main__":
    serve(handler, ops=["route", "moe_layer"], flags=["--f64"], argv=REST, contract=CONTRACT)
