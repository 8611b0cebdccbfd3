#!/usr/bin/env python3
"""PyTorch adapter for op `grouped_gemm`: `torch.nn.functional.grouped_mm` for fwd, autograd
(`out.backward(dout)`) for dgrad and wgrad, on CPU.

This is PyTorch's own grouped GEMM and its own backward, not code of ours. It runs as PyTorch
runs it, so its contract has to be declared. CONTRACT declares it: `moecheck prop` reads it
from the worker's greeting; with an `exec:` program, and on `moecheck gemm`, give the flags
named here (scripts/peers does, docs/peers.md records it):

* **tail `ignored`** (`--tail ignored`): rows past `sum(group_sizes)` of `out` (and of
  `dlhs`) are not written; they are whatever the allocator left there (measured on torch
  2.15.0: garbage, NaN, 1e24).
* **out_dtype `input`** (`--out-dtype` equal to `--dtype`: bf16 -> bf16, f16 -> f16, f32 ->
  f32): grouped_mm refuses `out_dtype` other than its input's ("Grouped gemm output dtype
  must match `mat_a` dtype"), and autograd returns the gradients in the inputs' dtype. A case
  asking for another output dtype is refused (a campaign under this contract draws none).
* **supports dtypes f32, bf16, f16; K >= 1; K and N multiples of 8** (`k_min` 1,
  `k_multiple` 8, `n_multiple` 8): grouped_mm raises "strides should be multiple of 16 bytes"
  unless K and N are multiples of 16 bytes (4 elements for f32, 8 for bf16/f16) and K > 0;
  N = 0 (a multiple of everything) raises it too and is refused.
  One multiple serves every dtype, so the contract asks for 8 (f32's 4 divides it). This
  adapter **refuses** a case outside with a one-line reason (it does not pad: padding would
  check a GEMM PyTorch was never asked to do). FP8 cases are refused too.

Groups are passed as `offs = cumsum(group_sizes)` (int32), as the docstring of grouped_mm
asks; empty groups are equal consecutive offsets.

    moecheck prop --op gemm --impl "worker:.peers-venv/bin/python examples/adapters/torch_grouped_mm.py"
    moecheck gemm --dtype bf16 --out-dtype bf16 --tail ignored \\
        --impl "worker:.peers-venv/bin/python examples/adapters/torch_grouped_mm.py"

Needs torch (scripts/peers installs it in .peers-venv). Usage: torch_grouped_mm.py [CASE_DIR]
(no CASE_DIR: a moecheck worker, protocol v2)
"""
import numpy as np
import torch
import torch.nn.functional as F

import _checkout  # noqa: F401  (the moecheck helper from this checkout)
from moecheck.adapter import serve
from moecheck.case import CaseError

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

#: What torch's grouped_mm does (docs/protocol.md, "The contract in the greeting").
CONTRACT = {
    "grouped_gemm": {
        "declared": {"tail": "ignored", "out_dtype": "input"},
        "supports": {"dtypes": list(DTYPES), "k_min": 1, "k_multiple": 8, "n_multiple": 8},
    },
}


def refusal(case):
    """The one-line reason this case cannot be run by grouped_mm, or None."""
    if case.fp8 is not None or case["dtype"] not in DTYPES:
        return f"dtype {case['dtype']}: torch grouped_mm adapter runs f32, bf16, f16"
    if case["out_dtype"] != case["dtype"]:
        return (f"out_dtype {case['out_dtype']}: torch grouped_mm returns its input dtype "
                f"({case['dtype']}); declare --out-dtype {case['dtype']}")
    align = 16 // torch.tensor([], dtype=DTYPES[case["dtype"]]).element_size()
    k, n = case["k"], case["n"]
    if k == 0 or n == 0 or k % align or n % align:
        return (f"K={k}, N={n}: torch grouped_mm needs 16-byte strides, K and N positive "
                f"multiples of {align} for {case['dtype']}")
    return None


def handler(case):
    reason = refusal(case)
    if reason is not None:
        raise CaseError(reason)
    dt = DTYPES[case["dtype"]]
    passes = case.passes
    x = torch.from_numpy(np.ascontiguousarray(case.lhs, np.float32)).to(dt)
    w = torch.from_numpy(np.ascontiguousarray(case.rhs, np.float32)).to(dt)
    x.requires_grad_("dgrad" in passes)
    w.requires_grad_("wgrad" in passes)
    offs = torch.from_numpy(np.cumsum(case.group_sizes)).to(torch.int32)
    with torch.set_grad_enabled(x.requires_grad or w.requires_grad):
        out = F.grouped_mm(x, w, offs=offs)
        if x.requires_grad or w.requires_grad:
            out.backward(torch.from_numpy(np.ascontiguousarray(case.dout, np.float32)).to(dt))
    outputs = {}
    if "fwd" in passes:
        outputs["out"] = out.detach().float().numpy()
    if "dgrad" in passes:
        outputs["dlhs"] = x.grad.float().numpy()
    if "wgrad" in passes:
        outputs["drhs"] = w.grad.float().numpy()
    return outputs


if __name__ == "__main__":
    serve(handler, ops=["grouped_gemm"], contract=CONTRACT)
