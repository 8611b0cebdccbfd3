#!/usr/bin/env python3
"""JAX adapter for op `grouped_gemm`: `jax.lax.ragged_dot` for fwd, `jax.vjp` of it for dgrad
and wgrad.

This is JAX's native grouped GEMM and its autodiff, not code of ours: the check is against an
implementation nobody here wrote. Inputs are cast to the case dtype (bf16/f16/f32) and the
products accumulated with preferred_element_type=float32. Runs on CPU.

JAX's VJP returns the gradients in the primal's dtype (bf16 for bf16 inputs, whatever
preferred_element_type says). The case names the format it wants every output in
(`out_dtype`): when that is the input dtype, the VJP is taken at the bf16/f16 inputs as they
are; when it is wider (f32 outputs for bf16 inputs), it is taken at f32 copies of the same
values (exact: every bf16/f16 value is an f32 value, and so is every product of two), so the
forward arithmetic is unchanged and the gradients come back in f32, as asked.

    moecheck gemm --impl "exec:python3 examples/adapters/jax_ragged_dot.py"
    moecheck gemm --impl "worker:python3 examples/adapters/jax_ragged_dot.py"   # imports once
    moecheck prop --op gemm --impl "worker:python3 examples/adapters/jax_ragged_dot.py"

Declared contract (CONTRACT, in the worker's greeting): the defaults (f32 accumulation, tail
rows exactly 0, each case's output format, as above), every pass and shape, and dtypes f32,
bf16, f16 (FP8 cases are refused). So no flag is needed, as `exec:` either.

Usage: jax_ragged_dot.py [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import _checkout  # noqa: E402,F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve  # noqa: E402
from moecheck.case import CaseError  # noqa: E402

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}

#: What this adapter does (docs/protocol.md, "The contract in the greeting").
CONTRACT = {"grouped_gemm": {"declared": {"tail": "zero"}, "supports": {"dtypes": list(DTYPES)}}}


def handler(case):
    if case.fp8 is not None or case["dtype"] not in DTYPES:
        raise CaseError(f"dtype {case['dtype']} not supported (expected one of {', '.join(DTYPES)})")
    dt = DTYPES[case["dtype"]]
    # Where the VJP is taken: the inputs' dtype, or f32 when the case wants wider outputs.
    at = dt if case["out_dtype"] == case["dtype"] else jnp.float32
    x = jnp.asarray(case.lhs, dt).astype(at)
    w = jnp.asarray(case.rhs, dt).astype(at)
    gs = jnp.asarray(case.group_sizes, jnp.int32)

    def f(x, w):
        return jax.lax.ragged_dot(
            x, w, gs, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32
        )

    passes = case.passes
    out, vjp = jax.vjp(f, x, w)
    outputs = {}
    if "fwd" in passes:
        outputs["out"] = np.asarray(out, np.float32)
    if "dgrad" in passes or "wgrad" in passes:
        dlhs, drhs = vjp(jnp.asarray(case.dout, jnp.float32))
        if "dgrad" in passes:
            outputs["dlhs"] = np.asarray(dlhs, np.float32)
        if "wgrad" in passes:
            outputs["drhs"] = np.asarray(drhs, np.float32)
    return outputs


if __name__ == "__main__":
    serve(handler, ops=["grouped_gemm"], contract=CONTRACT)
