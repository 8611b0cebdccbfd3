#!/usr/bin/env python3
"""A test adapter for op `grouped_gemm` with the limits of a real kernel (megablox's): it
refuses f16 and K = 0 / N = 0 (CaseError: not applicable), never writes tail rows (NaN there)
and writes its input dtype's precision. Its greeting declares that contract; flags change it:

* ``--no-contract``: greet without a contract (every limit is then a refusal, and the tail
  needs ``moecheck prop --tail ignored``);
* ``--wrong-expert``: a planted bug, the last group multiplies by expert 0's weights;
* ``--fwd-only``: implements (and declares) the forward pass only, writing nothing else;
* ``--refuse-all``: refuses every case.

Usage: picky_gemm.py [flags] [CASE_DIR]   (tests/prop_contract.rs)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from moecheck.adapter import serve  # noqa: E402
from moecheck.case import CaseError  # noqa: E402

FLAGS = ["--no-contract", "--wrong-expert", "--fwd-only", "--refuse-all"]
ARGS = set(a for a in sys.argv[1:] if a in FLAGS)
FWD_ONLY = "--fwd-only" in ARGS

CONTRACT = {
    "grouped_gemm": {
        "declared": {"tail": "ignored", "out_dtype": "input"},
        "supports": {"dtypes": ["f32", "bf16"], "k_min": 1, "n_min": 1,
                     "passes": ["fwd"] if FWD_ONLY else ["fwd", "dgrad", "wgrad"]},
    },
}


def handler(case):
    if "--refuse-all" in ARGS:
        raise CaseError("this kernel runs nothing")
    if case.fp8 is not None or case["dtype"] not in ("f32", "bf16"):
        raise CaseError(f"dtype {case['dtype']}: f32 or bf16 only")
    m, k, n, g = case["m"], case["k"], case["n"], case["groups"]
    if k == 0 or n == 0:
        raise CaseError(f"K = {k}, N = {n}: empty dimensions are not supported")
    lhs, rhs, dout = case.lhs, case.rhs, case.dout
    off = np.concatenate([[0], np.cumsum(case.group_sizes)])
    weight = lambda e: rhs[0] if ("--wrong-expert" in ARGS and e == g - 1) else rhs[e]  # noqa: E731
    outputs = {}
    if "fwd" in case.passes:
        out = np.full((m, n), np.nan, np.float32)
        for e in range(g):
            out[off[e]:off[e + 1]] = case.lhs[off[e]:off[e + 1]] @ weight(e)
        outputs["out"] = out
    if FWD_ONLY:
        return outputs
    if "dgrad" in case.passes:
        dlhs = np.full((m, k), np.nan, np.float32)
        for e in range(g):
            dlhs[off[e]:off[e + 1]] = dout[off[e]:off[e + 1]] @ weight(e).T
        outputs["dlhs"] = dlhs
    if "wgrad" in case.passes:
        drhs = np.zeros((g, k, n), np.float32)
        for e in range(g):
            drhs[e] = lhs[off[e]:off[e + 1]].T @ dout[off[e]:off[e + 1]]
        outputs["drhs"] = drhs
    return outputs


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:]]
    serve(handler, ops=["grouped_gemm"], flags=FLAGS, argv=argv,
          contract=None if "--no-contract" in ARGS else CONTRACT)
