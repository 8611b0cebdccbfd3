#!/usr/bin/env python3
"""numpy + ml_dtypes adapter for FP8 cases of op `grouped_gemm`, written from the recipe in
docs/protocol.md ("FP8 cases"), independently of moecheck's Rust code.

    moecheck gemm --dtype fp8 --impl "exec:python3 examples/adapters/numpy_fp8_grouped_gemm.py"
    moecheck gemm --dtype fp8 --impl "worker:python3 examples/adapters/numpy_fp8_grouped_gemm.py"

Quantises the float32 inputs per case.json's `fp8` recipe (amax per scope, scale = fp8_max /
amax in float32 with Transformer Engine's guards, round-to-nearest-even saturating cast of the
float32 product, or the given scales for delayed scaling), then per group multiplies the FP8
values as float32 matrices (float32 accumulation inside BLAS, exact products), multiplies by
scale_inv of the lhs-side operand then of the rhs-side one in float32, and writes float32
outputs. wgrad uses the column-wise copies: the transposed bytes with the same scale_inv.

Declared contract (CONTRACT, in the worker's greeting): op key `fp8`, every pass; the
accumulation is the recipe's (`fp8.accumulation` of each case: the exact FP8 products are
summed in float32), so nothing else is declared and `exec:` needs no flag. A grouped GEMM
case without an `fp8` object is refused (a one-line reason): this adapter is for
`moecheck gemm --dtype fp8` and `moecheck prop --op fp8`.

Usage: numpy_fp8_grouped_gemm.py [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import ml_dtypes
import numpy as np

import _checkout  # noqa: F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve
from moecheck.case import CaseError

FORMATS = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}

#: What this adapter does (docs/protocol.md, "The contract in the greeting"): FP8 cases only.
CONTRACT = {"fp8": {"supports": {"passes": ["fwd", "dgrad", "wgrad"]}}}


def scope_bounds(kind, sizes, rows_used, rows):
    """(lo, hi) row ranges of the scopes of a row operand (lhs, dout) or of rhs as (G*K, N)."""
    if kind == "group":
        off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return [(int(off[i]), int(off[i + 1])) for i in range(len(sizes))]
    if kind == "tensor":
        return [(0, rows_used)]
    raise ValueError(kind)


def quantize(x, fmt, bounds, saturate, given):
    """Returns (fp8 values as float32, per-row scale_inv as float32; rows in no scope are 0)."""
    dt = FORMATS[fmt]
    fmax = np.float32(float(ml_dtypes.finfo(dt).max))
    vals = np.zeros(x.shape, np.float32)
    sinv_rows = np.zeros(x.shape[0], np.float32)
    for i, (lo, hi) in enumerate(bounds):
        part = x[lo:hi]
        if given is not None:
            s = np.float32(given[i])
        else:
            a = np.float32(np.max(np.abs(part))) if part.size else np.float32(0.0)
            with np.errstate(over="ignore", divide="ignore"):
                if not (a > 0) or not np.isfinite(a):
                    s = np.float32(1.0)
                else:
                    s = np.float32(fmax / a)
                    if np.isinf(s):
                        s = np.float32(np.finfo(np.float32).max)
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = (part * s).astype(np.float32)
            if saturate:
                scaled = np.clip(scaled, -fmax, fmax)
        vals[lo:hi] = scaled.astype(dt).astype(np.float32)
        sinv_rows[lo:hi] = np.float32(1.0) / s
    return vals, sinv_rows


def handler(case):
    r = case.fp8
    if r is None:
        raise CaseError("not an FP8 case (case.json has no fp8 object): this adapter runs FP8 grouped GEMMs only")
    lhs, rhs, sizes, dout = case.lhs, case.rhs, case.group_sizes, case.dout
    m, k, n, g = case["m"], case["k"], case["n"], case["groups"]
    used = int(np.sum(sizes))
    sat = r["saturate"]
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    # Delayed scaling: the given scales (case.lhs_scale, ...); current scaling: None.
    qa, sa = quantize(lhs, r["lhs"]["format"], scope_bounds(r["lhs"]["scope"], sizes, used, m), sat, case.lhs_scale)
    w = rhs.reshape(g * k, n)
    if r["rhs"]["scope"] == "expert":
        wb = [(e * k, (e + 1) * k) for e in range(g)]
    else:
        wb = [(0, g * k)]
    qw, sw = quantize(w, r["rhs"]["format"], wb, sat, case.rhs_scale)
    qw = qw.reshape(g, k, n)
    sw = sw.reshape(g, k)
    if dout is not None:
        qd, sd = quantize(dout, r["dout"]["format"], scope_bounds(r["dout"]["scope"], sizes, used, m), sat, case.dout_scale)

    passes = case.passes
    outputs = {}
    if "fwd" in passes:
        out = np.zeros((m, n), np.float32)
        for e in range(g):
            lo, hi = off[e], off[e + 1]
            if hi > lo and k > 0:
                acc = qa[lo:hi] @ qw[e]
                out[lo:hi] = (acc * sa[lo]) * sw[e, 0]
        outputs["out"] = out
    if "dgrad" in passes:
        dlhs = np.zeros((m, k), np.float32)
        for e in range(g):
            lo, hi = off[e], off[e + 1]
            if hi > lo and k > 0:
                acc = qd[lo:hi] @ qw[e].T
                dlhs[lo:hi] = (acc * sd[lo]) * sw[e, 0]
        outputs["dlhs"] = dlhs
    if "wgrad" in passes:
        drhs = np.zeros((g, k, n), np.float32)
        for e in range(g):
            lo, hi = off[e], off[e + 1]
            if hi > lo:
                # Column-wise copies: the same FP8 values transposed, the same scale_inv.
                acc = qa[lo:hi].T @ qd[lo:hi]
                drhs[e] = (acc * sa[lo]) * sd[lo]
        outputs["drhs"] = drhs
    return outputs


if __name__ == "__main__":
    serve(handler, ops=["grouped_gemm"], contract=CONTRACT)
