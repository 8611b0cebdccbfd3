#!/usr/bin/env python3
"""JAX adapter for op `route` (docs/protocol.md): `moecheck route --impl "exec:python3 examples/adapters/jax_route.py"`.

Reads a routing case directory, routes with `routing_jax.route` (MaxText / DeepSeek-V3 /
Megatron formulas on `jax.lax.top_k`) in float64 on CPU, and writes indices.npy (int32),
weights.npy (float64 combine weights, 0 where dropped), kept.npy (uint8) and group_sizes.npy
(int32). Declare `--compute f64` (or leave the default f32, which only loosens the bound).
Usage: jax_route.py CASE_DIR
"""
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from _case import fail  # noqa: E402
from routing_jax import route  # noqa: E402


def main():
    if len(sys.argv) != 2:
        fail("usage: jax_route.py CASE_DIR")
    d = sys.argv[1]
    with open(os.path.join(d, "case.json")) as f:
        cfg = json.load(f)
    if cfg.get("protocol") != 1 or cfg.get("op") != "route":
        fail(f"unsupported case: protocol {cfg.get('protocol')} op {cfg.get('op')}")
    logits = jnp.asarray(np.load(os.path.join(d, "logits.npy")), jnp.float64)
    bias = None
    if cfg.get("bias"):
        bias = jnp.asarray(np.load(os.path.join(d, "bias.npy")), jnp.float64)
    r = route(logits, bias, cfg)
    np.save(os.path.join(d, "indices.npy"), np.asarray(r["indices"], np.int32))
    np.save(os.path.join(d, "weights.npy"), np.asarray(r["combine"], np.float64))
    np.save(os.path.join(d, "kept.npy"), np.asarray(r["kept"], np.uint8))
    np.save(os.path.join(d, "group_sizes.npy"), np.asarray(r["group_sizes"], np.int32))


if __name__ == "__main__":
    main()
