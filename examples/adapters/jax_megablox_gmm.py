#!/usr/bin/env python3
"""Peer adapter for op `grouped_gemm`: JAX's Pallas megablox `gmm`
(`jax.experimental.pallas.ops.tpu.megablox.gmm`, the custom-VJP grouped GEMM MaxText uses),
its VJP (`gmm` for dgrad, `tgmm` for wgrad) for the backward passes. Checked with jax 0.10.2
(requirements.txt), run with Pallas `interpret=True` on CPU.

    moecheck prop --op gemm --impl "worker:python3 examples/adapters/jax_megablox_gmm.py"
    moecheck gemm --dtype f32  --tail ignored --impl "worker:python3 examples/adapters/jax_megablox_gmm.py"
    moecheck gemm --dtype bf16 --tail ignored --out-dtype bf16 \\
        --impl "worker:python3 examples/adapters/jax_megablox_gmm.py"
    (exec:python3 ... works too: one process per case)

Declared contract (CONTRACT): `moecheck prop` reads it from the worker's greeting; with an
`exec:` program, and on `moecheck gemm`, give the flags named here:

* tail `ignored` (`--tail ignored`): megablox only visits the row tiles of the groups; rows
  past `sum(group_sizes)` (dropped tokens) of `out` and `dlhs` are never written (NaN in
  interpret mode, whatever was in memory on a TPU). `drhs` does not see the tail's `dout`.
* out_dtype `input` (`--out-dtype bf16` for `--dtype bf16`): the forward output is f32
  (`preferred_element_type`), but the VJP returns `dlhs` in the dtype of `lhs` and `drhs` in
  the dtype of `rhs`, so the gradients of bf16 inputs are bf16. f32 inputs: f32 throughout.
* supports dtypes f32 and bf16 only: megablox accepts no other input dtype (f16 and FP8
  cases are refused); K >= 1 and N >= 1 (`k_min`, `n_min`): megablox raises on an empty K
  or N dimension, so such a case is refused with a one-line reason.

The forward and the VJP run under `jax.jit`, as in a training step (and one compilation per
shape instead of one per eager operation). M must be a multiple of the M tile (128): the
adapter pads the rows with zeros up to one and slices the outputs back (so any M is
supported); the padding rows belong to no group, so they are tail rows to megablox and
never reach a group's result.

Usage: jax_megablox_gmm.py [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.pallas.ops.tpu.megablox import gmm  # noqa: E402

import _checkout  # noqa: E402,F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve  # noqa: E402
from moecheck.case import CaseError  # noqa: E402

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}

#: gmm's default (m, k, n) tiling; M must be a multiple of the M tile.
TILING = (128, 128, 128)

#: What megablox gmm does (docs/protocol.md, "The contract in the greeting").
CONTRACT = {
    "grouped_gemm": {
        "declared": {"tail": "ignored", "out_dtype": "input"},
        "supports": {"dtypes": list(DTYPES), "k_min": 1, "n_min": 1},
    },
}


@jax.jit
def _fwd(x, w, gs):
    return gmm(x, w, gs, jnp.float32, TILING, interpret=True)


@jax.jit
def _fwd_bwd(x, w, gs, dout):
    out, vjp = jax.vjp(lambda x, w: gmm(x, w, gs, jnp.float32, TILING, interpret=True), x, w)
    dlhs, drhs = vjp(dout)
    return out, dlhs, drhs


def handler(case):
    if case.fp8 is not None or case["dtype"] not in DTYPES:
        raise CaseError(f"dtype {case['dtype']} not supported by megablox gmm (f32 or bf16 only)")
    m, k, n = case["m"], case["k"], case["n"]
    if k == 0 or n == 0:
        raise CaseError(f"K = {k}, N = {n}: megablox gmm raises on an empty K or N dimension")
    dt = DTYPES[case["dtype"]]
    tm = TILING[0]
    mp = max(tm, -(-m // tm) * tm)  # M padded up to a multiple of the M tile
    pad = ((0, mp - m), (0, 0))
    x = jnp.asarray(np.pad(case.lhs, pad), dt)
    w = jnp.asarray(case.rhs, dt)
    gs = jnp.asarray(case.group_sizes, jnp.int32)

    passes = case.passes
    outputs = {}
    if "dgrad" in passes or "wgrad" in passes:
        out, dlhs, drhs = _fwd_bwd(x, w, gs, jnp.asarray(np.pad(case.dout, pad), jnp.float32))
        if "dgrad" in passes:
            outputs["dlhs"] = np.asarray(dlhs, np.float32)[:m]
        if "wgrad" in passes:
            outputs["drhs"] = np.asarray(drhs, np.float32)
    else:
        out = _fwd(x, w, gs)
    if "fwd" in passes:
        outputs["out"] = np.asarray(out, np.float32)[:m]
    return outputs


if __name__ == "__main__":
    serve(handler, ops=["grouped_gemm"], contract=CONTRACT)
