#!/usr/bin/env python3
"""numpy_grouped_gemm.py with one planted bug, for seeing moecheck catch it at any size: the
weights of one expert are read at the wrong offset (expert E uses expert E+1's weights, as a
kernel whose weight pointer for E is computed one expert too far would). Everything else is
the correct adapter. moecheck fails the fwd and dgrad passes naming expert E (wgrad does not
read the weights):

    moecheck gemm --dtype bf16 --impl "exec:python3 examples/adapters/numpy_grouped_gemm_offset_bug.py --expert 3"
    moecheck gemm --experts 256 --tokens 4096 --topk 8 --hidden 7168 --ffn 2048 \\
        --impl "worker:python3 examples/adapters/numpy_grouped_gemm_offset_bug.py --expert 200" \\
        --impl-memory 4GiB

Usage: numpy_grouped_gemm_offset_bug.py --expert E [CASE_DIR]
"""
import sys

import numpy_grouped_gemm as correct

import _checkout  # noqa: F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve


def _expert_from_argv():
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "--expert" or not args[1].isdigit():
        sys.exit("usage: numpy_grouped_gemm_offset_bug.py --expert E [CASE_DIR]")
    del sys.argv[1:3]  # the helper reads CASE_DIR (or nothing) from what is left
    return int(args[1])


BAD = _expert_from_argv()


def handler(case):
    widened = case.widened

    def offset(name, index=()):
        # Expert BAD's weights read one expert too far (the last expert's stay right).
        if name == "rhs" and index == BAD and BAD + 1 < case["groups"]:
            index = BAD + 1
        return widened(name, index)

    case.widened = offset
    return correct.handler(case)


if __name__ == "__main__":
    serve(handler, ops=["grouped_gemm"], contract=correct.CONTRACT, inputs="compact")
