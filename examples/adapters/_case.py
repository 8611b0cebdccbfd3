"""Shared reading/writing of a moecheck case directory (protocol v1, docs/protocol.md)."""
import json
import os
import sys

import numpy as np


def fail(msg):
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr)
    sys.exit(1)


def read_case(d):
    with open(os.path.join(d, "case.json")) as f:
        case = json.load(f)
    if case.get("protocol") != 1 or case.get("op") != "grouped_gemm":
        fail(f"unsupported case: protocol {case.get('protocol')} op {case.get('op')}")
    lhs = np.load(os.path.join(d, "lhs.npy"))
    rhs = np.load(os.path.join(d, "rhs.npy"))
    sizes = np.load(os.path.join(d, "group_sizes.npy")).astype(np.int64)
    dout = None
    if any(p in case["passes"] for p in ("dgrad", "wgrad")):
        dout = np.load(os.path.join(d, "dout.npy"))
    return case, lhs, rhs, sizes, dout


def write(d, name, arr):
    np.save(os.path.join(d, name + ".npy"), np.ascontiguousarray(arr, dtype=np.float32))
