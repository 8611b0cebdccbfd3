#!/usr/bin/env python3
"""numpy adapter for `moecheck gemm --impl "exec:python3 examples/adapters/numpy_grouped_gemm.py"`.

Computes every asked pass per group with float32 matmuls (float32 accumulation inside BLAS),
writes zeros on tail rows and for empty experts. Usage: numpy_grouped_gemm.py CASE_DIR
"""
import sys

import numpy as np

from _case import fail, read_case, write


def main():
    if len(sys.argv) != 2:
        fail("usage: numpy_grouped_gemm.py CASE_DIR")
    d = sys.argv[1]
    case, lhs, rhs, sizes, dout = read_case(d)
    m, k, n, g = case["m"], case["k"], case["n"], case["groups"]
    off = np.concatenate([[0], np.cumsum(sizes)])
    if "fwd" in case["passes"]:
        out = np.zeros((m, n), np.float32)
        for e in range(g):
            lo, hi = off[e], off[e + 1]
            out[lo:hi] = lhs[lo:hi] @ rhs[e]
        write(d, "out", out)
    if "dgrad" in case["passes"]:
        dlhs = np.zeros((m, k), np.float32)
        for e in range(g):
            lo, hi = off[e], off[e + 1]
            dlhs[lo:hi] = dout[lo:hi] @ rhs[e].T
        write(d, "dlhs", dlhs)
    if "wgrad" in case["passes"]:
        drhs = np.zeros((g, k, n), np.float32)
        for e in range(g):
            lo, hi = off[e], off[e + 1]
            drhs[e] = lhs[lo:hi].T @ dout[lo:hi]
        write(d, "drhs", drhs)


if __name__ == "__main__":
    main()
