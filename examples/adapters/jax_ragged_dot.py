#!/usr/bin/env python3
"""JAX adapter: `jax.lax.ragged_dot` for fwd, `jax.vjp` of it for dgrad and wgrad.

This is JAX's native grouped GEMM and its autodiff, not code of ours: the check is against an
implementation nobody here wrote. Inputs are cast to the case dtype (bf16/f16/f32) and the
products accumulated with preferred_element_type=float32. Runs on CPU.
Usage: jax_ragged_dot.py CASE_DIR
"""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from _case import fail, read_case, write  # noqa: E402

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}


def main():
    if len(sys.argv) != 2:
        fail("usage: jax_ragged_dot.py CASE_DIR")
    d = sys.argv[1]
    case, lhs, rhs, sizes, dout = read_case(d)
    if case["dtype"] not in DTYPES:
        fail(f"dtype {case['dtype']} not supported")
    dt = DTYPES[case["dtype"]]
    x = jnp.asarray(lhs, dt)
    w = jnp.asarray(rhs, dt)
    gs = jnp.asarray(sizes, jnp.int32)

    def f(x, w):
        return jax.lax.ragged_dot(
            x, w, gs, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32
        )

    passes = case["passes"]
    out, vjp = jax.vjp(f, x, w)
    if "fwd" in passes:
        write(d, "out", np.asarray(out))
    if "dgrad" in passes or "wgrad" in passes:
        dlhs, drhs = vjp(jnp.asarray(dout, jnp.float32))
        if "dgrad" in passes:
            write(d, "dlhs", np.asarray(dlhs, np.float32))
        if "wgrad" in passes:
            write(d, "drhs", np.asarray(drhs, np.float32))


if __name__ == "__main__":
    main()
