"""Reading a moecheck case directory and writing an implementation's outputs (docs/protocol.md).

A case directory holds ``case.json`` and the operation's input arrays as ``.npy`` files. Which
inputs an operation has, and when the optional ones are present:

==============  ===============================================  ==================================
``op``          always                                           when
==============  ===============================================  ==================================
grouped_gemm    lhs, rhs, group_sizes                            dout: a dgrad or wgrad pass is
                                                                 asked; lhs_scale, rhs_scale (and
                                                                 dout_scale with dout): FP8 delayed
                                                                 scaling
route           logits                                           bias: ``"bias": true``
moe_layer       x, w_router, w0, w1, wo, dout                    bias: ``"bias": true``;
                                                                 shared_w0, shared_w1, shared_wo:
                                                                 ``shared_ffn > 0``
==============  ===============================================  ==================================

Pure numpy and the standard library.
"""
import json
import os

import numpy as np

#: The directory format this module reads (``case.json``'s ``"protocol"``).
CASE_PROTOCOL = 1

#: The element types an output file may have; other floats (bf16, f16, FP8) are widened to
#: float32, which holds every one of their values exactly.
_STORED = {np.dtype(t) for t in ("float32", "float64", "int32", "int64", "uint8", "bool")}


class CaseError(Exception):
    """A **refusal**: a case this adapter does not implement (an op it does not serve, a dtype,
    a shape or a setting it has no kernel for). Raise it from a handler, with a one-line
    reason; the helper raises it for an op the adapter does not serve. moecheck counts the
    case as *not applicable*, not as a failure: a worker answers
    ``{"ok": false, "unsupported": REASON}``, an ``exec:`` program exits with status 77
    (docs/protocol.md, "Refusing a case"). Any other exception fails the case."""


class CaseFormatError(ValueError):
    """A case directory this helper cannot read (a missing or unreadable file, a bad
    ``case.json``), or outputs it cannot write (a handler that returns no dict, an output of
    an unsupported type or with a bad name). Not a refusal: the case fails with this
    message."""


class Case:
    """One case: its directory, its ``case.json`` and its input arrays.

    * ``case.op``: ``"grouped_gemm"``, ``"route"`` or ``"moe_layer"``;
    * ``case["m"]``, ``case.get("fp8")``: the fields of ``case.json`` (``case.config`` is the
      whole dict);
    * ``case.lhs``, ``case.group_sizes``, ...: the input arrays as numpy arrays
      (``case.arrays`` is the dict), ``group_sizes`` as int64; an optional input that is
      absent is ``None``. Inputs are **memory-mapped** (``np.load(mmap_mode="c")``): pages
      are read when touched, so a handler that works expert by expert never holds a 15 GB
      weight; writing into one changes the handler's private copy of those pages, never
      the file;
    * ``case.open_output(name, shape, dtype)``: an output file the handler writes into
      (memory-mapped), for outputs too large to hold whole (``drhs`` at DeepSeek-V3's size);
    * ``case.encodings``: the compact inputs (``{"rhs": "bf16", ...}``; ``--inputs compact``
      or a worker's ``inputs="compact"``). For an adapter that asked for them
      (``serve(..., inputs="compact")``) such an input is its uint16 bit patterns; for any
      other it is widened to float32 whole, so a program that never asked computes the same
      values. ``case.widened(name, index)`` is float32 of ``case.<name>[index]`` for any input
      (one expert's weight widened at a time: ``case.widened("rhs", e)``);
    * ``case.passes``: the asked passes of a grouped GEMM (``[]`` for other ops);
    * ``case.fp8``: the FP8 recipe of an FP8 case, else ``None``.
    """

    def __init__(self, directory, config, arrays, bits=None):
        self.dir = directory
        self.config = config
        self.arrays = arrays
        self.opened = {}
        #: Compact inputs as read (bit patterns), by name: what ``widened`` reads.
        self.bits = bits or {}

    @property
    def encodings(self):
        return dict(self.config.get("encodings") or {})

    def widened(self, name, index=()):
        """float32 of ``getattr(case, name)[index]``: a compact (bf16 bit pattern) input is
        widened exactly, any other converted as numpy does. Only the indexed part is read."""
        if name in self.bits:
            return (np.asarray(self.bits[name][index], dtype=np.uint32) << 16).view(np.float32)
        a = getattr(self, name)
        if a is None:
            return None
        return np.asarray(a[index], dtype=np.float32)

    def open_output(self, name, shape, dtype="float32"):
        """A new output file ``name.npy`` of ``shape`` and ``dtype`` (float32, float64, int32,
        int64, uint8 or bool), memory-mapped for writing, zero-filled: write into it (expert by
        expert, row block by row block) and leave it out of the handler's returned dict, or
        return it under the same name. The helper flushes it when the handler returns; pages
        already written go to the file as the system needs the memory, so the output is never
        held whole. Raises :class:`CaseFormatError` for a bad name or dtype."""
        _check_name(name)
        dt = np.dtype(dtype)
        if dt not in _STORED:
            raise CaseFormatError(f"output {name}: dtype {dt} (expected float32/float64, int32/int64, uint8 or bool)")
        shape = tuple(int(d) for d in shape)
        path = os.path.join(self.dir, name + ".npy")
        a = np.lib.format.open_memmap(path, mode="w+", dtype=dt, shape=shape)
        self.opened[name] = a
        return a

    def close_outputs(self):
        """Flushes every output opened with :meth:`open_output` (the helper calls it)."""
        for a in self.opened.values():
            if isinstance(a, np.memmap):
                a.flush()
        self.opened.clear()

    @property
    def op(self):
        return self.config["op"]

    @property
    def passes(self):
        return list(self.config.get("passes", []))

    @property
    def fp8(self):
        return self.config.get("fp8")

    def __getitem__(self, key):
        return self.config[key]

    def get(self, key, default=None):
        return self.config.get(key, default)

    def __getattr__(self, name):
        arrays = self.__dict__.get("arrays", {})
        if name in arrays:
            return arrays[name]
        if name in _optional_names(self.__dict__.get("config", {})):
            return None
        raise AttributeError(f"case of op {self.__dict__.get('config', {}).get('op')} has no input {name!r}")

    def __repr__(self):
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self.arrays.items())
        return f"Case({self.op}, {self.dir}: {shapes})"


def _inputs(config):
    """The input arrays of a case with ``config``: the names that must be present."""
    op = config.get("op")
    if op == "grouped_gemm":
        names = ["lhs", "rhs", "group_sizes"]
        backward = bool({"dgrad", "wgrad"} & set(config.get("passes", [])))
        if backward:
            names.append("dout")
        fp8 = config.get("fp8")
        if fp8 and fp8.get("scaling", {}).get("kind") == "delayed":
            names += ["lhs_scale", "rhs_scale"] + (["dout_scale"] if backward else [])
        return names
    if op == "route":
        return ["logits"] + (["bias"] if config.get("bias") else [])
    if op == "moe_layer":
        names = ["x", "w_router", "w0", "w1", "wo", "dout"]
        if config.get("bias"):
            names.append("bias")
        if config.get("shared_ffn", 0) > 0:
            names += ["shared_w0", "shared_w1", "shared_wo"]
            if config.get("shared_gate", "none") == "sigmoid":
                names.append("shared_gate")
        if config.get("router_bias"):
            names.append("router_bias")
        if config.get("expert_bias"):
            names += ["expert_b0", "expert_b1", "expert_bo"]
        return names
    if not isinstance(op, str):
        raise CaseFormatError(f"case.json: 'op' is {op!r}, expected an op name")
    raise CaseError(f"op {op!r} is not one this helper reads (grouped_gemm, route, moe_layer)")


def _optional_names(config):
    """Inputs an op may lack, read as ``None``."""
    return {
        "grouped_gemm": ("dout", "lhs_scale", "rhs_scale", "dout_scale"),
        "route": ("bias",),
        "moe_layer": ("bias", "shared_w0", "shared_w1", "shared_wo", "shared_gate",
                      "router_bias", "expert_b0", "expert_b1", "expert_bo"),
    }.get(config.get("op"), ())


def _load(file):
    """One input, memory-mapped copy-on-write; loaded whole where numpy cannot map it (an
    array with no elements, an object array). :class:`CaseFormatError` names the file."""
    try:
        return np.load(file, allow_pickle=False, mmap_mode="c")
    except OSError as e:
        raise CaseFormatError(f"{file}: {e}") from e
    except ValueError:
        pass
    try:
        return np.load(file, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise CaseFormatError(f"{file}: {e}") from e


def read_case(directory, ops=None, compact=False):
    """Reads the case in ``directory``; ``ops`` (a list of ``op`` names), when given, are the
    ones the caller serves. ``compact``: compact inputs stay bit patterns (the caller asked for
    them); otherwise they are widened to float32. Raises :class:`CaseFormatError` naming the
    file that cannot be read, or :class:`CaseError` (a refusal) for an op outside ``ops``."""
    path = os.path.join(directory, "case.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise CaseFormatError(f"{path}: {e}") from e
    if not isinstance(config, dict):
        raise CaseFormatError(f"{path}: expected a JSON object")
    if config.get("protocol") != CASE_PROTOCOL:
        raise CaseFormatError(f"{path}: case directory protocol {config.get('protocol')!r} (this helper reads {CASE_PROTOCOL})")
    if ops is not None and config.get("op") not in ops:
        raise CaseError(f"op {config.get('op')!r}: this adapter serves {', '.join(ops) or 'no op'}")
    encodings = config.get("encodings") or {}
    if not isinstance(encodings, dict) or any(v != "bf16" for v in encodings.values()):
        raise CaseFormatError(f"{path}: \"encodings\" is {encodings!r}, expected input name -> \"bf16\"")
    arrays = {}
    for name in _inputs(config):
        file = os.path.join(directory, name + ".npy")
        arrays[name] = _load(file)
        if name in encodings and arrays[name].dtype != np.uint16:
            raise CaseFormatError(f"{file}: dtype {arrays[name].dtype}, expected uint16 bf16 bit patterns (\"encodings\")")
    bits = {name: arrays[name] for name in encodings if name in arrays}
    if not compact:
        for name, b in bits.items():
            arrays[name] = (np.asarray(b, dtype=np.uint32) << 16).view(np.float32)
    if "group_sizes" in arrays:
        arrays["group_sizes"] = arrays["group_sizes"].astype(np.int64)
    return Case(directory, config, arrays, bits)


def _check_name(name):
    if not isinstance(name, str) or not name or os.sep in name or name.startswith("."):
        raise CaseFormatError(f"output name {name!r} is not a plain file name")


def write_outputs(directory, outputs, opened=None):
    """Writes ``outputs`` (a dict: file name without ``.npy`` -> array, numpy or anything
    ``np.asarray`` takes, such as a JAX array) into ``directory``. ``opened``: the outputs
    already in their files (:meth:`Case.open_output`); the same array returned under its name
    is not written again, another array under that name replaces the file.

    float32, float64, int32, int64, uint8 and bool arrays are written as they are; bf16, f16
    and FP8 arrays are widened to float32 (exactly). Other types raise :class:`CaseFormatError`.
    """
    opened = opened or {}
    for name, value in outputs.items():
        _check_name(name)
        if opened.get(name) is value:
            continue
        a = np.asarray(value)
        if a.dtype not in _STORED:
            if a.dtype.kind in "fV" and a.dtype.itemsize <= 4:
                a = a.astype(np.float32)
            else:
                raise CaseFormatError(f"output {name}: dtype {a.dtype} (expected float32/float64, int32/int64, uint8 or bool)")
        np.save(os.path.join(directory, name + ".npy"), np.ascontiguousarray(a))
