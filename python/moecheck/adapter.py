"""An adapter is one function: ``handler(case) -> outputs``, served by :func:`serve`.

::

    from moecheck.adapter import serve

    def handler(case):                      # a moecheck.case.Case
        out = my_grouped_gemm(case.lhs, case.rhs, case.group_sizes)
        return {"out": out}                 # file name (no .npy) -> array

    if __name__ == "__main__":
        serve(handler, ops=["grouped_gemm"],
              contract={"grouped_gemm": {"declared": {"out_dtype": "input"},
                                         "supports": {"dtypes": ["f32", "bf16"]}}})

The same script then speaks both protocols of docs/protocol.md:

* ``python3 adapter.py DIR`` handles the one case in ``DIR`` and exits (protocol v1,
  ``moecheck ... --impl "exec:python3 adapter.py"``): status 0; 77 for a case the handler
  refuses (it raised :class:`~moecheck.case.CaseError`), with the reason as the last line of
  stderr; 1 with the traceback on stderr for any other exception;
* ``python3 adapter.py`` (no directory) is a **worker** (protocol v2, ``--impl
  "worker:python3 adapter.py"``): it greets on stdout (with ``contract``, when given), then
  answers one case per line of stdin until stdin ends. A handler's
  :class:`~moecheck.case.CaseError` refuses that case (``{"ok": false, "unsupported":
  REASON}``); any other exception fails that case only (its traceback goes to stderr, its
  last line into the answer's ``error``) and the worker goes on.

In worker mode stdout belongs to the protocol: :func:`serve` points file descriptor 1 (and
``sys.stdout``) at stderr before the first case, so a stray ``print``
— or a C library writing to fd 1 — lands on stderr instead of corrupting an answer.

Flags the adapter reads itself (``--f64``) are named in ``flags`` so that :func:`serve`
passes over them; any other ``--flag`` is a usage error.

``contract`` is what the implementation declares about itself (docs/protocol.md, "The
contract in the greeting"), by op key (``grouped_gemm``, ``fp8``, ``route``,
``moe_layer``): ``declared``, how it computes (``tail``, ``acc``, ``out_dtype``, ...), and
``supports``, which cases it runs (``dtypes``, ``passes``, ``k_multiple``, ...), so that a
``moecheck prop`` campaign draws only those. Omitted keys mean the default, or everything.
Only a worker sends it; an ``exec:`` program's user gives the same declaration as flags.
:func:`check_contract` is the check :func:`serve` makes at start-up (exit 2 on a bad key).
"""
import json
import os
import sys
import traceback

from .case import CaseError, CaseFormatError, read_case, write_outputs

#: The worker protocol version this helper speaks.
WORKER_PROTOCOL = 2

#: The environment variable in which moecheck names the worker protocol version it speaks.
PROTOCOL_ENV = "MOECHECK_WORKER_PROTOCOL"

#: The exit status of an ``exec:`` program that refuses its case (a CaseError).
EXIT_UNSUPPORTED = 77

_FORMATS = ("f32", "bf16", "f16", "f64")
_INPUT_DTYPES = ("f32", "bf16", "f16")
_PASSES = ("fwd", "dgrad", "wgrad")
_SCORES = ("softmax", "topk-softmax", "sigmoid")
_DROP_POLICIES = ("position", "probs", "token-order")
_CONVENTIONS = {
    "convention": ("maxtext", "megatron", "deepseek-v3", "hf-deepseek-v3", "hf-qwen2-moe",
                   "hf-qwen3-moe", "hf-mixtral", "hf-gpt-oss"),
    "group_score": ("top2", "top-k-per-group", "max"),
    "sigmoid_norm": ("always", "skip-k1", "never"),
    "ties": ("lower-index", "any"),
    "slot_order": ("score", "any"),
}

#: The keys of a contract (docs/protocol.md): op key -> "declared"/"supports" -> key -> what
#: its value may be: a tuple of strings (one of them), a list holding one tuple (a non-empty
#: list of them), ``bool``, or an int (an integer at least that).
CONTRACT_KEYS = {
    "grouped_gemm": {
        "declared": {
            "tail": ("zero", "ignored"),
            "acc": _FORMATS,
            "acc_block": 1,
            "out_dtype": _FORMATS + ("input",),
        },
        "supports": {
            "dtypes": [_INPUT_DTYPES],
            "passes": [_PASSES],
            "k_min": 0,
            "k_multiple": 1,
            "n_min": 0,
            "n_multiple": 1,
            "m_multiple": 1,
            "max_experts": 1,
        },
    },
    "fp8": {
        # An FP8 case carries its own recipe and accumulation: nothing to declare.
        "declared": {},
        "supports": {"passes": [_PASSES]},
    },
    "route": {
        "declared": dict(compute=_FORMATS, **_CONVENTIONS),
        "supports": {
            "scores": [_SCORES],
            "capacity": bool,
            "drop_policies": [_DROP_POLICIES],
            "groups": bool,
            "bias": bool,
            "scaling": bool,
            "max_experts": 1,
        },
    },
    "moe_layer": {
        "declared": dict(
            compute=_FORMATS, out_dtype=_FORMATS, router_compute=_FORMATS, **_CONVENTIONS
        ),
        "supports": {
            "dtypes": [_INPUT_DTYPES],
            "scores": [_SCORES],
            "capacity": bool,
            "drop_policies": [_DROP_POLICIES],
            "groups": bool,
            "bias": bool,
            "scaling": bool,
            "shared_expert": bool,
            "shared_gate": bool,
            "activations": [("swiglu", "clamped-swiglu")],
            "expert_bias": bool,
            "router_bias": bool,
            "max_experts": 1,
        },
    },
}

#: The case.json op each contract key is about (FP8 cases are grouped_gemm cases).
_CONTRACT_OP = {"grouped_gemm": "grouped_gemm", "fp8": "grouped_gemm", "route": "route", "moe_layer": "moe_layer"}


def check_contract(contract, ops=None):
    """The one-line reason ``contract`` is not a contract (docs/protocol.md) for an adapter
    serving ``ops``, naming the bad key; ``None`` when it is one (or is ``None``)."""
    if contract is None:
        return None
    if not isinstance(contract, dict):
        return f"contract: expected a dict of op key -> {{'declared': ..., 'supports': ...}}, got {type(contract).__name__}"
    for key, parts in contract.items():
        if key not in CONTRACT_KEYS:
            return f"contract key {key!r}: expected one of {', '.join(CONTRACT_KEYS)}"
        if ops is not None and _CONTRACT_OP[key] not in ops:
            return f"contract key {key!r}: the adapter does not serve op {_CONTRACT_OP[key]} (ops: {', '.join(ops) or 'none'})"
        if not isinstance(parts, dict):
            return f"contract.{key}: expected a dict with 'declared' and/or 'supports'"
        for part, values in parts.items():
            if part not in CONTRACT_KEYS[key]:
                return f"contract.{key} key {part!r}: expected 'declared' or 'supports'"
            if not isinstance(values, dict):
                return f"contract.{key}.{part}: expected a dict"
            allowed = CONTRACT_KEYS[key][part]
            for name, value in values.items():
                if name not in allowed:
                    return f"contract.{key}.{part} key {name!r}: expected one of {', '.join(allowed)}"
                why = _bad_value(allowed[name], value)
                if why is not None:
                    return f"contract.{key}.{part}.{name}: {why}, got {value!r}"
    return None


def _bad_value(kind, value):
    """Why ``value`` is not of ``kind`` (see CONTRACT_KEYS), or None."""
    if kind is bool:
        return None if isinstance(value, bool) else "expected true or false"
    if isinstance(kind, int):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= kind
        return None if ok else f"expected an integer >= {kind}"
    if isinstance(kind, list):
        (choices,) = kind
        ok = isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v in choices for v in value)
        return None if ok else f"expected a non-empty list of {', '.join(choices)}"
    return None if isinstance(value, str) and value in kind else f"expected one of {', '.join(kind)}"


def run_case(handler, directory, ops=None, compact=False):
    """Reads the case in ``directory``, calls ``handler`` and writes what it returns.
    ``compact``: the handler reads compact inputs as bit patterns (it asked for them);
    otherwise they are widened for it (:func:`~moecheck.case.read_case`)."""
    case = read_case(directory, ops, compact=compact)
    try:
        outputs = handler(case)
        if not isinstance(outputs, dict):
            raise CaseFormatError(f"the handler returned {type(outputs).__name__}, expected a dict of name -> array")
        write_outputs(directory, outputs, case.opened)
    finally:
        case.close_outputs()


def serve(handler, ops=None, flags=(), argv=None, contract=None, inputs="float32"):
    """Serves ``handler`` as an exec: program (one directory argument) or as a worker (none).

    ``ops``: the ``case.json`` op names the handler implements (``grouped_gemm``, ``route``,
    ``moe_layer``; ``None``: any), announced in the worker's greeting and checked before the
    handler is called (a case of another op is refused). ``flags``: the ``--flags`` the
    adapter reads itself. ``contract``: the declared contract, a dict by op key
    (``grouped_gemm``, ``fp8``, ``route``, ``moe_layer``) of ``{"declared": {...},
    "supports": {...}}`` (docs/protocol.md), sent in the worker's greeting; a bad one is a
    usage error (exit 2) naming the key. ``inputs``: ``"compact"`` asks a worker's cases
    with compact inputs (a grouped GEMM's bf16 inputs as uint16 bit patterns, read with
    :meth:`~moecheck.case.Case.widened`); an ``exec:`` run gets them with ``--inputs
    compact`` on moecheck's command line. Never returns.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    name = os.path.basename(sys.argv[0]) or "adapter"
    unknown = [a for a in args if a.startswith("--") and a not in flags]
    dirs = [a for a in args if not a.startswith("--")]
    if unknown or len(dirs) > 1:
        usage = " ".join([name] + [f"[{f}]" for f in flags] + ["[CASE_DIR]"])
        print(f"{name}: usage: {usage}   (no CASE_DIR: serve as a moecheck worker)", file=sys.stderr)
        sys.exit(2)
    bad = check_contract(contract, None if ops is None else list(ops))
    if bad is None and inputs not in ("float32", "compact"):
        bad = f"inputs={inputs!r}: expected 'float32' or 'compact'"
    if bad is not None:
        print(f"{name}: usage error: serve(contract=...): {bad}", file=sys.stderr)
        sys.exit(2)
    if dirs:
        sys.exit(_serve_one(handler, dirs[0], ops, name, inputs == "compact"))
    sys.exit(_serve_worker(handler, ops, name, contract, inputs))


def _serve_one(handler, directory, ops, name, compact=False):
    """Protocol v1: one case; exit status 0, 77 (refused) or 1 (failed)."""
    try:
        run_case(handler, directory, ops, compact)
    except CaseError as e:
        sys.stdout.flush()
        print(f"{name}: unsupported: {_reason(e)}", file=sys.stderr)
        sys.stderr.flush()
        return EXIT_UNSUPPORTED
    except CaseFormatError as e:
        print(f"CaseFormatError: {_one_line(str(e))}", file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 - every failure is the case's, with its traceback
        traceback.print_exc()
        return 1
    return 0


def _serve_worker(handler, ops, name, contract=None, inputs="float32"):
    """Protocol v2: greet, then one answer per request line, until stdin ends."""
    offered = os.environ.get(PROTOCOL_ENV)
    if offered is not None and offered.strip().isdigit() and int(offered) < WORKER_PROTOCOL:
        print(f"{name}: moecheck speaks worker protocol {offered}, this helper {WORKER_PROTOCOL}: update moecheck", file=sys.stderr)
        return 1
    if sys.stdin.isatty():
        print(f"{name}: serving as a moecheck worker (protocol v2) on stdin/stdout; "
              f"give a CASE_DIR to run one case", file=sys.stderr)
    answers = _claim_stdout()
    greeting = {"protocol": WORKER_PROTOCOL, "ops": list(ops) if ops is not None else None}
    if contract is not None:
        greeting["contract"] = contract
    if inputs != "float32":
        greeting["inputs"] = inputs
    _send(answers, greeting)
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            directory = request["case"]
            if not isinstance(directory, str):
                raise ValueError("'case' is not a string")
        except (ValueError, KeyError, TypeError) as e:
            _send(answers, {"ok": False, "error": f"bad request {line.strip()[:200]!r}: {e}"})
            continue
        try:
            run_case(handler, directory, ops, inputs == "compact")
        except CaseError as e:
            reason = _reason(e)
            print(f"{name}: unsupported: {reason}", file=sys.stderr)
            _send(answers, {"ok": False, "unsupported": reason})
        except CaseFormatError as e:
            error = f"CaseFormatError: {_one_line(str(e))}"
            print(f"{name}: {error}", file=sys.stderr)
            _send(answers, {"ok": False, "error": error})
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the case fails, the worker goes on
            traceback.print_exc()
            _send(answers, {"ok": False, "error": _last_line(e)})
        else:
            _send(answers, {"ok": True})
        sys.stderr.flush()


def _one_line(text):
    return " ".join(text.split())


def _reason(e):
    """A refusal's reason: the CaseError's message on one line (at most 1000 characters)."""
    reason = _one_line(str(e)) or "refused (a CaseError without a message)"
    return reason if len(reason) <= 1000 else reason[:997] + "..."


def _claim_stdout():
    """Keeps file descriptor 1 for the protocol's answers and points fd 1 and
    ``sys.stdout`` at stderr, so nothing else can write an answer line."""
    sys.stdout.flush()
    answers = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return answers


def _send(answers, message):
    answers.write(json.dumps(message) + "\n")
    answers.flush()


def _last_line(e):
    """``ValueError: message`` on one line (without the notes some frameworks attach, such as
    JAX's "For simplicity, JAX has removed its internal frames ...")."""
    kind = type(e)
    name = kind.__qualname__
    if kind.__module__ not in ("builtins", "__main__"):
        name = f"{kind.__module__}.{name}"
    text = f"{name}: {e}" if str(e) else name
    return " ".join(text.split())
