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

Block scopes (`block:RxC/recipe`, `mx:S/rounding`; docs/fp8.md, "Block scaling"): every copy a
pass reads is quantised in its own tiles (lhs/dout 1xC along the contraction, their wgrad
copies Cx1 along M restarting at each group; rhs RxC read transposed by dgrad, or MX copies
along K and along N), with DeepGEMM's casts or OCP MX's exponents as
fixtures/fp8/blocks/gen.py writes them; each pass walks the contraction in segments where both
scales are constant: a float32 matrix product per segment, times the two scale_inv, added into
a float32 accumulator. Where the case carries moecheck's own quantised copies (`lhs_q.npy`,
`lhs_scale_inv.npy`, ...; docs/protocol.md) the adapter checks that its bytes and scales are
the same, and fails the case otherwise.

Declared contract (CONTRACT, in the worker's greeting): op key `fp8`, every pass; the
accumulation is the recipe's (`fp8.accumulation` of each case: the exact FP8 products are
summed in float32), so nothing else is declared and `exec:` needs no flag. A grouped GEMM
case without an `fp8` object is refused (a one-line reason): this adapter is for
`moecheck gemm --dtype fp8` and `moecheck prop --op fp8`.

Usage: numpy_fp8_grouped_gemm.py [CASE_DIR]   (no CASE_DIR: a moecheck worker, protocol v2)
"""
import os

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


def parse_block(scope):
    """("deepgemm" | "mx", rows, cols, recipe) of a block scope string, None otherwise."""
    shape, _, recipe = scope.partition("/")
    if shape.startswith("block:"):
        r, c = shape[len("block:"):].split("x")
        return "deepgemm", int(r), int(c), recipe or "deepgemm"
    if shape.startswith("mx:"):
        return "mx", 1, int(shape[len("mx:"):]), recipe or "floor"
    return None


def ceil_pow2(sf):
    bits = np.array([sf], dtype=np.float32).view(np.int32)[0]
    exp = min(max(((bits >> 23) & 0xFF) + (1 if bits & 0x7FFFFF else 0), 1), 254)
    return np.array([exp << 23], dtype=np.int32).view(np.float32)[0]


def block_quantize(x, pieces, tile, fmt, kind, recipe):
    """(values, scale_inv per element), both float32 of x's shape, each piece (lo, hi) of rows
    quantised in tiles from its first row; rows in no piece are 0 (scale_inv 1)."""
    dt = FORMATS[fmt]
    fmax = np.float32(float(ml_dtypes.finfo(dt).max))
    emax = 8 if fmt == "e4m3" else 15
    vals = np.zeros(x.shape, np.float32)
    sinv = np.ones(x.shape, np.float32)
    br, bc = tile
    for lo, hi in pieces:
        for i in range(lo, hi, br):
            for j in range(0, x.shape[1], bc):
                sl = (slice(i, min(i + br, hi)), slice(j, min(j + bc, x.shape[1])))
                t = x[sl]
                if kind == "deepgemm":
                    amax = np.maximum(np.max(np.abs(t)), np.float32(1e-4)).astype(np.float32)
                    sf = np.float32(amax / fmax)
                    if recipe == "deepgemm":
                        v = t * np.float32(fmax / amax)
                    else:
                        if recipe == "deepgemm-ue8m0":
                            sf = ceil_pow2(sf)
                        v = t * np.float32(np.float32(1.0) / sf)
                    v = v.astype(np.float32)
                else:
                    amax = float(np.max(np.abs(t.astype(np.float64))))
                    if amax == 0:
                        e = -127
                    elif recipe == "floor":
                        e = int(np.floor(np.log2(amax))) - emax
                    else:
                        e = int(np.ceil(np.log2(amax / float(fmax))))
                        while amax > float(fmax) * 2.0 ** e:
                            e += 1
                        while amax <= float(fmax) * 2.0 ** (e - 1):
                            e -= 1
                    e = min(max(e, -127), 127)
                    v = (t.astype(np.float64) / 2.0 ** e).astype(np.float32)
                    sf = np.float32(2.0 ** e)
                vals[sl] = np.clip(v, -fmax, fmax).astype(dt).astype(np.float32)
                sinv[sl] = sf
    return vals, sinv


def check_given(case, name, copy, pieces, tile, fmt):
    """moecheck's quantised copy NAME, when the case carries it, must be this adapter's
    (values and per-element scale_inv): a ValueError otherwise."""
    qf = os.path.join(case.dir, name + "_q.npy")
    if not os.path.exists(qf):
        return
    vals, sinv = copy
    q = np.load(qf).view(FORMATS[fmt]).astype(np.float32).reshape(vals.shape)
    grid = np.load(os.path.join(case.dir, name + "_scale_inv.npy"))
    grid = grid.reshape(-1, grid.shape[-1])
    want = np.ones(vals.shape, np.float32)
    br, bc = tile
    row0 = 0
    for lo, hi in pieces:
        for i in range(lo, hi):
            want[i, :] = np.repeat(grid[row0 + (i - lo) // br], bc)[: vals.shape[1]]
        row0 += -(-(hi - lo) // br)
    if not (np.array_equal(q, vals) and np.array_equal(want, sinv)):
        raise ValueError(f"{name}_q.npy / {name}_scale_inv.npy differ from this adapter's quantisation")


def segmented(a, sa, b, sb, cuts):
    """a (R, L) @ b (L, C) in segments of the contraction split at `cuts`: per segment a
    float32 product times the scale_inv at its start (a's per row, b's per column), summed into
    a float32 accumulator."""
    length = a.shape[1]
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    starts = sorted({0} | {i for c in cuts if c for i in range(c, length, c)})
    for s, e in zip(starts, starts[1:] + [length]):
        if e > s:
            part = a[:, s:e] @ b[s:e, :]
            acc += (part * sa[:, s][:, None]) * sb[s, :][None, :]
    return acc


def block_handler(case, r):
    """An FP8 case with some block scope (module docs)."""
    lhs, rhs, sizes, dout = case.lhs, case.rhs, case.group_sizes, case.dout
    m, k, n, g = case["m"], case["k"], case["n"], case["groups"]
    used = int(np.sum(sizes))
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    groups = [(int(off[e]), int(off[e + 1])) for e in range(g)]

    def rows(x, name):
        """Row-wise and column-wise (values, scale_inv, block length) of lhs or dout."""
        b = parse_block(r[name]["scope"])
        fmt = r[name]["format"]
        if b is None:
            v, s = quantize(x, fmt, scope_bounds(r[name]["scope"], sizes, used, m), True, None)
            s = np.repeat(s[:, None], x.shape[1], axis=1)
            return (v, s, None), (v, s, None)
        kind, _, c, recipe = b
        row = block_quantize(x, groups, (1, c), fmt, kind, recipe)
        col = block_quantize(x, groups, (c, 1), fmt, kind, recipe)
        check_given(case, name, row, groups, (1, c), fmt)
        check_given(case, name + "_col", col, groups, (c, 1), fmt)
        return row + (c,), col + (c,)

    w = rhs.reshape(g * k, n)
    experts = [(e * k, (e + 1) * k) for e in range(g)]
    b = parse_block(r["rhs"]["scope"])
    fmt = r["rhs"]["format"]
    if b is None:
        wb = experts if r["rhs"]["scope"] == "expert" else [(0, g * k)]
        v, s = quantize(w, fmt, wb, True, None)
        s = np.repeat(s[:, None], n, axis=1)
        wf = wd = (v, s, None, None)
    elif b[0] == "mx":
        wf = block_quantize(w, experts, (b[2], 1), fmt, "mx", b[3])
        wd = block_quantize(w, experts, (1, b[2]), fmt, "mx", b[3])
        check_given(case, "rhs", wf, experts, (b[2], 1), fmt)
        check_given(case, "rhs_dgrad", wd, experts, (1, b[2]), fmt)
        wf, wd = wf + (b[2], None), wd + (None, b[2])
    else:
        wf = block_quantize(w, experts, (b[1], b[2]), fmt, "deepgemm", b[3])
        check_given(case, "rhs", wf, experts, (b[1], b[2]), fmt)
        wf = wd = wf + (b[1], b[2])
    (la, lc) = rows(lhs, "lhs")
    (da, dc) = rows(dout, "dout") if dout is not None else (None, None)

    outputs = {}
    if "fwd" in case.passes:
        out = np.zeros((m, n), np.float32)
        for e, (lo, hi) in enumerate(groups):
            ws = slice(e * k, (e + 1) * k)
            out[lo:hi] = segmented(la[0][lo:hi], la[1][lo:hi], wf[0][ws], wf[1][ws], [la[2], wf[2]])
        outputs["out"] = out
    if "dgrad" in case.passes:
        dlhs = np.zeros((m, k), np.float32)
        for e, (lo, hi) in enumerate(groups):
            ws = slice(e * k, (e + 1) * k)
            dlhs[lo:hi] = segmented(da[0][lo:hi], da[1][lo:hi], wd[0][ws].T, wd[1][ws].T, [da[2], wd[3]])
        outputs["dlhs"] = dlhs
    if "wgrad" in case.passes:
        drhs = np.zeros((g, k, n), np.float32)
        for e, (lo, hi) in enumerate(groups):
            drhs[e] = segmented(lc[0][lo:hi].T, lc[1][lo:hi].T, dc[0][lo:hi], dc[1][lo:hi], [lc[2], dc[2]])
        outputs["drhs"] = drhs
    return outputs


def handler(case):
    r = case.fp8
    if r is None:
        raise CaseError("not an FP8 case (case.json has no fp8 object): this adapter runs FP8 grouped GEMMs only")
    if any(parse_block(r[o]["scope"]) for o in ("lhs", "rhs", "dout")):
        return block_handler(case, r)
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
