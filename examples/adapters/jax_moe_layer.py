#!/usr/bin/env python3
"""JAX adapter for op `moe_layer` (docs/protocol.md): the MaxText MoE layer, gradients by autodiff.

    moecheck moe --impl "exec:python3 examples/adapters/jax_moe_layer.py"              # f32
    moecheck moe --compute f64 --out-dtype f64 \
        --impl "exec:python3 examples/adapters/jax_moe_layer.py --f64"                  # f64
    moecheck moe --impl "worker:python3 examples/adapters/jax_moe_layer.py"            # a worker
    moecheck prop --op moe --impl "worker:python3 examples/adapters/jax_moe_layer.py --f64"

The forward follows MaxText's `RoutedMoE` sparse path: router logits `x @ w_router`, routing
by `routing_jax.route` (the routing adapter's module: `jax.lax.top_k`, DeepSeek-V3 groups and
bias, normalisation, scaling, capacity), `permute` as a stable `argsort` of the flattened
expert ids (dropped assignments get id E and sort last), `jax.lax.ragged_dot` for
`silu(x W0) * (x W1)` and `@ Wo`, `unpermute` with the inverse permutation and the combine
`einsum("TKH,TK->TH")` in the compute dtype, plus the shared expert (scaled by
`sigmoid(x @ shared_gate)` when case.json has `shared_gate: "sigmoid"`), and gpt-oss's layer
when case.json asks (`activation: "clamped-swiglu"`, `expert_bias`, `router_bias`: biases on
the router logits and on each expert's projections, tail rows without). Every gradient (dx,
dw_router, dw0, dw1, dwo, dshared_*) comes from `jax.vjp` of that function: autodiff, nothing
hand-written. Runs on CPU, in float32 (default) or float64 (`--f64`), whatever the case's
input dtype (its values are exact in float32).

Declared contract (CONTRACT): compute and out_dtype `f32`, or `f64` with `--f64`; every
input dtype, score function, capacity policy, group rule, bias and shared expert
(routing_jax.SUPPORTS); no convention, since routing_jax follows the conventions each
case.json names. `moecheck prop` reads it from the worker's greeting; with `exec:`, and on
`moecheck moe`, give `--compute f64 --out-dtype f64` with `--f64`.

Usage: jax_moe_layer.py [--f64] [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

F64 = "--f64" in sys.argv[1:]
if F64:
    jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import _checkout  # noqa: E402,F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve  # noqa: E402
from routing_jax import SUPPORTS, route  # noqa: E402

DT = jnp.float64 if F64 else jnp.float32

#: What this adapter does (docs/protocol.md, "The contract in the greeting").
_FORMAT = "f64" if F64 else "f32"
CONTRACT = {
    "moe_layer": {
        "declared": {"compute": _FORMAT, "out_dtype": _FORMAT},
        "supports": dict(SUPPORTS, dtypes=["f32", "bf16", "f16"], shared_expert=True,
                         shared_gate=True, activations=["swiglu", "clamped-swiglu"],
                         expert_bias=True, router_bias=True),
    },
}
HI = jax.lax.Precision.HIGHEST


def silu(v):
    return v * jax.nn.sigmoid(v)


def activation(a, b, kind):
    """swiglu: silu(a)*b; clamped-swiglu (gpt-oss): (clip(b, -7, 7) + 1) * g * sigmoid(1.702 g)."""
    if kind == "clamped-swiglu":
        g = jnp.minimum(a, 7.0)
        return (jnp.clip(b, -7.0, 7.0) + 1.0) * g * jax.nn.sigmoid(1.702 * g)
    return silu(a) * b


def layer(params, bias, cfg):
    x, wr = params["x"], params["w_router"]
    t, _ = x.shape
    e = wr.shape[1]
    k = cfg["topk"]
    logits = jnp.matmul(x, wr, precision=HI)
    if "router_bias" in params:
        logits = logits + params["router_bias"]
    r = route(logits, bias, cfg)
    indices, kept, combine = r["indices"], r["kept"], r["combine"]
    # permute: stable sort of the (token, slot) assignments by expert, dropped ones last.
    flat = jnp.where(kept, indices, e).reshape(-1)
    order = jnp.argsort(flat, stable=True)
    group_sizes = jnp.bincount(flat, length=e + 1)[:e].astype(jnp.int32)
    xp = jnp.repeat(x, k, axis=0)[order]

    def gmm(a, w):
        return jax.lax.ragged_dot(a, w, group_sizes, precision=HI, preferred_element_type=DT)

    kind = cfg.get("activation", "swiglu")
    a, b = gmm(xp, params["w0"]), gmm(xp, params["w1"])
    if "expert_b0" in params:
        # Each permuted row's expert (E for a dropped row: no bias).
        ids = flat[order]

        def rows(bias):
            return jnp.concatenate([bias, jnp.zeros((1, bias.shape[1]), bias.dtype)])[ids]

        a, b = a + rows(params["expert_b0"]), b + rows(params["expert_b1"])
    h = activation(a, b, kind)
    yp = gmm(h, params["wo"])
    if "expert_bo" in params:
        yp = yp + rows(params["expert_bo"])
    # unpermute with the inverse permutation, then the weighted combine.
    inverse = jnp.argsort(order, stable=True)
    y = yp[inverse].reshape(t, k, -1)
    out = jnp.einsum("TKH,TK->TH", y, combine.astype(DT), precision=HI)
    if "shared_w0" in params:
        hs = activation(jnp.matmul(x, params["shared_w0"], precision=HI),
                        jnp.matmul(x, params["shared_w1"], precision=HI), kind)
        ys = jnp.matmul(hs, params["shared_wo"], precision=HI)
        if "shared_gate" in params:
            # Qwen2-MoE: sigmoid(x . g) scales the shared expert per token.
            ys = jax.nn.sigmoid(jnp.matmul(x, params["shared_gate"], precision=HI))[:, None] * ys
        out = out + ys
    return out


def handler(case):
    cfg = case.config

    def load(name):
        return jnp.asarray(getattr(case, name), DT)

    names = ["x", "w_router", "w0", "w1", "wo"]
    if cfg["shared_ffn"] > 0:
        names += ["shared_w0", "shared_w1", "shared_wo"]
        if cfg.get("shared_gate", "none") == "sigmoid":
            names.append("shared_gate")
    if cfg.get("router_bias"):
        names.append("router_bias")
    if cfg.get("expert_bias"):
        names += ["expert_b0", "expert_b1", "expert_bo"]
    params = {n: load(n) for n in names}
    bias = load("bias") if cfg.get("bias") else None
    out, vjp = jax.vjp(lambda p: layer(p, bias, cfg), params)
    (grads,) = vjp(load("dout"))
    np_dt = np.float64 if F64 else np.float32
    save = {"out": out, "dx": grads["x"], "dw_router": grads["w_router"]}
    for n in names[2:]:
        save["d" + n] = grads[n]
    return {name: np.asarray(arr, np_dt) for name, arr in save.items()}


if __name__ == "__main__":
    serve(handler, ops=["moe_layer"], flags=["--f64"], contract=CONTRACT)
