#!/usr/bin/env python3
"""Peer adapter for op `grouped_gemm`: tokamax's `ragged_dot` (PyPI `tokamax` 0.0.12, pinned in
requirements.txt, with jax 0.10.2), implementation `"xla"`, and `jax.vjp` of it (tokamax's own
VJP) for dgrad and wgrad. Products accumulated with preferred_element_type=float32, precision
HIGHEST, under `jax.jit` as in a training step. Runs on CPU.

    moecheck prop --op gemm --impl "worker:python3 examples/adapters/tokamax_ragged_dot.py"
    moecheck gemm --dtype f32 --impl "worker:python3 examples/adapters/tokamax_ragged_dot.py"
    moecheck gemm --dtype bf16 --out-dtype bf16 \\
        --impl "worker:python3 examples/adapters/tokamax_ragged_dot.py"
    (exec:python3 ... works too: one process per case)

Declared contract (CONTRACT): `moecheck prop` reads it from the worker's greeting; with an
`exec:` program, and on `moecheck gemm`, give the flags named here:

* out_dtype `input` (`--out-dtype bf16` for `--dtype bf16`, `f16` for `f16`): the forward
  output is f32 (preferred_element_type), but the VJP returns the gradients in the inputs'
  dtype. f32 inputs: f32 throughout.
* tail `zero` (the default `--tail zero`): the tail rows (past sum(group_sizes)) come back
  exactly 0, empty experts' `drhs` exactly 0.
* supports dtypes f32, bf16, f16 (FP8 cases are refused), every pass and shape.

tokamax reads its configuration from absl flags and parses `sys.argv` on its first call (any
`--flag` it does not define raises UnrecognizedFlagError there): the adapter keeps its own
arguments for the helper and leaves tokamax `sys.argv[:1]`.

Usage: tokamax_ragged_dot.py [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# tokamax parses sys.argv as absl flags: the adapter's own arguments are not for it.
ARGS = sys.argv[1:]
sys.argv = sys.argv[:1]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import tokamax  # noqa: E402

import _checkout  # noqa: E402,F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve  # noqa: E402
from moecheck.case import CaseError  # noqa: E402

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}

#: What tokamax's ragged_dot does (docs/protocol.md, "The contract in the greeting").
CONTRACT = {
    "grouped_gemm": {
        "declared": {"tail": "zero", "out_dtype": "input"},
        "supports": {"dtypes": list(DTYPES)},
    },
}


def _ragged_dot(x, w, gs):
    return tokamax.ragged_dot(
        x,
        w,
        gs,
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
        implementation="xla",
    )


_fwd = jax.jit(_ragged_dot)


@jax.jit
def _fwd_bwd(x, w, gs, dout):
    out, vjp = jax.vjp(lambda x, w: _ragged_dot(x, w, gs), x, w)
    dlhs, drhs = vjp(dout)
    return out, dlhs, drhs


def handler(case):
    if case.fp8 is not None or case["dtype"] not in DTYPES:
        raise CaseError(f"dtype {case['dtype']} not supported (expected one of {', '.join(DTYPES)})")
    dt = DTYPES[case["dtype"]]
    x = jnp.asarray(case.lhs, dt)
    w = jnp.asarray(case.rhs, dt)
    gs = jnp.asarray(case.group_sizes, jnp.int32)

    passes = case.passes
    outputs = {}
    if "dgrad" in passes or "wgrad" in passes:
        out, dlhs, drhs = _fwd_bwd(x, w, gs, jnp.asarray(case.dout, jnp.float32))
        if "dgrad" in passes:
            outputs["dlhs"] = np.asarray(dlhs, np.float32)
        if "wgrad" in passes:
            outputs["drhs"] = np.asarray(drhs, np.float32)
    else:
        out = _fwd(x, w, gs)
    if "fwd" in passes:
        outputs["out"] = np.asarray(out, np.float32)
    return outputs


if __name__ == "__main__":
    serve(handler, ops=["grouped_gemm"], argv=ARGS, contract=CONTRACT)
