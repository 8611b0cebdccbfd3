#!/usr/bin/env python3
"""JAX adapter for op `route` (docs/protocol.md).

Routes with `routing_jax.route` (MaxText / DeepSeek-V3 / Megatron formulas on
`jax.lax.top_k`) in float64 on CPU, and writes indices.npy (int32), weights.npy (float64
combine weights, 0 where dropped), kept.npy (uint8) and group_sizes.npy (int32).

Declared contract (CONTRACT): compute `f64`, and every score function, capacity policy,
group rule, bias and scaling factor (routing_jax.SUPPORTS); no convention, since it follows
the conventions each case.json names. `moecheck prop` reads it from the worker's greeting;
with `exec:`, and on `moecheck route`, declare `--compute f64` (or leave the default f32,
which only loosens the bound).

    moecheck route --compute f64 --impl "exec:python3 examples/adapters/jax_route.py"
    moecheck route --compute f64 --impl "worker:python3 examples/adapters/jax_route.py"
    moecheck prop --op route --impl "worker:python3 examples/adapters/jax_route.py"

Usage: jax_route.py [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import _checkout  # noqa: E402,F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve  # noqa: E402
from routing_jax import SUPPORTS, route  # noqa: E402

#: What this adapter does (docs/protocol.md, "The contract in the greeting").
CONTRACT = {"route": {"declared": {"compute": "f64"}, "supports": dict(SUPPORTS, scaling=True)}}


def handler(case):
    logits = jnp.asarray(case.logits, jnp.float64)
    bias = None if case.bias is None else jnp.asarray(case.bias, jnp.float64)
    r = route(logits, bias, case.config)
    return {
        "indices": np.asarray(r["indices"], np.int32),
        "weights": np.asarray(r["combine"], np.float64),
        "kept": np.asarray(r["kept"], np.uint8),
        "group_sizes": np.asarray(r["group_sizes"], np.int32),
    }


if __name__ == "__main__":
    serve(handler, ops=["route"], contract=CONTRACT)
