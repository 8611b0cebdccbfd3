#!/usr/bin/env python3
"""numpy adapter for op `grouped_gemm`, the complete "check my kernel" example: every pass
(fwd `out`, dgrad `dlhs`, wgrad `drhs`) as float32 matmuls per group (float32 accumulation
inside BLAS), zeros on tail rows (past sum(group_sizes)) and for empty experts. Replace the
three loops with calls to your kernel, and CONTRACT with what your kernel does.

    moecheck gemm --dtype f32 --impl "exec:python3 examples/adapters/numpy_grouped_gemm.py"
    moecheck gemm --dtype f32 --impl "worker:python3 examples/adapters/numpy_grouped_gemm.py"
    moecheck prop --op gemm --impl "worker:python3 examples/adapters/numpy_grouped_gemm.py"

Declared contract (CONTRACT, sent in the worker's greeting; as an `exec:` program it needs no
flags, since it is the default one): f32 accumulation, tail rows exactly 0, outputs at least
as precise as each case asks (it writes float32); every input dtype, every pass, every shape
(K = 0, N = 0, empty experts, any M). It ignores an FP8 recipe (the recipe-exact check then
fails it: tests/fp8_cli.rs shows that it does), so its contract says nothing about FP8.

As a worker it asks for compact inputs (a bf16 case's inputs as uint16 bit patterns, widened
here an expert at a time); as an `exec:` program it reads either (`--inputs compact`).

Usage: numpy_grouped_gemm.py [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import numpy as np

import _checkout  # noqa: F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve

#: What this implementation declares (docs/protocol.md, "The contract in the greeting").
#: Every key is spelled out as a template; the values here are the defaults, so omitting
#: them would declare the same. A kernel with limits names them in "supports" (e.g.
#: "k_multiple": 8, "dtypes": ["bf16"]) and moecheck prop draws only such cases.
CONTRACT = {
    "grouped_gemm": {
        "declared": {"tail": "zero", "acc": "f32"},
        "supports": {"dtypes": ["f32", "bf16", "f16"], "passes": ["fwd", "dgrad", "wgrad"]},
    },
}


def handler(case):
    # Inputs are memory-mapped by the helper (compact ones, bf16 bit patterns, widened here an
    # expert at a time) and each output is a memory-mapped file written expert by expert
    # (case.open_output, zero-filled: tail rows and empty experts stay 0), so the adapter
    # holds one expert's operands at a time: it runs at DeepSeek-V3's size
    # (docs/protocol.md, "Adapters at DeepSeek-V3's size").
    m, k, n, g = case["m"], case["k"], case["n"], case["groups"]
    off = np.concatenate([[0], np.cumsum(case.group_sizes)])
    groups = [(e, off[e], off[e + 1]) for e in range(g)]
    rows = lambda name, lo, hi: case.widened(name, slice(lo, hi))  # noqa: E731
    if "fwd" in case.passes:
        out = case.open_output("out", (m, n))
        for e, lo, hi in groups:
            out[lo:hi] = rows("lhs", lo, hi) @ case.widened("rhs", e)
    if "dgrad" in case.passes:
        dlhs = case.open_output("dlhs", (m, k))
        for e, lo, hi in groups:
            dlhs[lo:hi] = rows("dout", lo, hi) @ case.widened("rhs", e).T
    if "wgrad" in case.passes:
        drhs = case.open_output("drhs", (g, k, n))
        for e, lo, hi in groups:
            drhs[e] = rows("lhs", lo, hi).T @ rows("dout", lo, hi)
    return {}


if __name__ == "__main__":
    # Compact inputs: a bf16 case arrives as bit patterns (half the disk and memory).
    serve(handler, ops=["grouped_gemm"], contract=CONTRACT, inputs="compact")
