#!/usr/bin/env python3
"""numpy adapter for op `grouped_gemm`: float32 matmuls per group (float32 accumulation
inside BLAS), zeros on tail rows and for empty experts. It ignores an FP8 recipe (the
recipe-exact check then fails it: tests/fp8_cli.rs shows that it does).

    moecheck gemm --dtype f32 --impl "exec:python3 examples/adapters/numpy_grouped_gemm.py"
    moecheck gemm --dtype f32 --impl "worker:python3 examples/adapters/numpy_grouped_gemm.py"

Usage: numpy_grouped_gemm.py [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import numpy as np

import _checkout  # noqa: F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve


def handler(case):
    lhs, rhs, dout = case.lhs, case.rhs, case.dout
    m, k, n, g = case["m"], case["k"], case["n"], case["groups"]
    off = np.concatenate([[0], np.cumsum(case.group_sizes)])
    groups = [(e, off[e], off[e + 1]) for e in range(g)]
    outputs = {}
    if "fwd" in case.passes:
        out = np.zeros((m, n), np.float32)
        for e, lo, hi in groups:
            out[lo:hi] = lhs[lo:hi] @ rhs[e]
        outputs["out"] = out
    if "dgrad" in case.passes:
        dlhs = np.zeros((m, k), np.float32)
        for e, lo, hi in groups:
            dlhs[lo:hi] = dout[lo:hi] @ rhs[e].T
        outputs["dlhs"] = dlhs
    if "wgrad" in case.passes:
        drhs = np.zeros((g, k, n), np.float32)
        for e, lo, hi in groups:
            drhs[e] = lhs[lo:hi].T @ dout[lo:hi]
        outputs["drhs"] = drhs
    return outputs


if __name__ == "__main__":
    serve(handler, ops=["grouped_gemm"])
