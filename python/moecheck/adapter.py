"""An adapter is one function: ``handler(case) -> outputs``, served by :func:`serve`.

::

    from moecheck.adapter import serve

    def handler(case):                      # a moecheck.case.Case
        out = my_grouped_gemm(case.lhs, case.rhs, case.group_sizes)
        return {"out": out}                 # file name (no .npy) -> array

    if __name__ == "__main__":
        serve(handler, ops=["grouped_gemm"])

The same script then speaks both protocols of docs/protocol.md:

* ``python3 adapter.py DIR`` handles the one case in ``DIR`` and exits (protocol v1,
  ``moecheck ... --impl "exec:python3 adapter.py"``): status 0, or 1 with the traceback on
  stderr;
* ``python3 adapter.py`` (no directory) is a **worker** (protocol v2, ``--impl
  "worker:python3 adapter.py"``): it greets on stdout, then answers one case per line of stdin
  until stdin ends. A handler's exception fails that case only (its traceback goes to
  stderr, its last line into the answer) and the worker goes on.

In worker mode stdout belongs to the protocol: :func:`serve` points file descriptor 1 (and
``sys.stdout``) at stderr before the first case, so a stray ``print``
— or a C library writing to fd 1 — lands on stderr instead of corrupting an answer.

Flags the adapter reads itself (``--f64``) are named in ``flags`` so that :func:`serve`
passes over them; any other ``--flag`` is a usage error.
"""
import json
import os
import sys
import traceback

from .case import CaseError, read_case, write_outputs

#: The worker protocol version this helper speaks.
WORKER_PROTOCOL = 2

#: The environment variable in which moecheck names the worker protocol version it speaks.
PROTOCOL_ENV = "MOECHECK_WORKER_PROTOCOL"


def run_case(handler, directory, ops=None):
    """Reads the case in ``directory``, calls ``handler`` and writes what it returns."""
    case = read_case(directory, ops)
    outputs = handler(case)
    if not isinstance(outputs, dict):
        raise CaseError(f"the handler returned {type(outputs).__name__}, expected a dict of name -> array")
    write_outputs(directory, outputs)


def serve(handler, ops=None, flags=(), argv=None):
    """Serves ``handler`` as an exec: program (one directory argument) or as a worker (none).

    ``ops``: the ``case.json`` op names the handler implements (``grouped_gemm``, ``route``,
    ``moe_layer``; ``None``: any), announced in the worker's greeting and checked before the
    handler is called. ``flags``: the ``--flags`` the adapter reads itself. Never returns.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    name = os.path.basename(sys.argv[0]) or "adapter"
    unknown = [a for a in args if a.startswith("--") and a not in flags]
    dirs = [a for a in args if not a.startswith("--")]
    if unknown or len(dirs) > 1:
        usage = " ".join([name] + [f"[{f}]" for f in flags] + ["[CASE_DIR]"])
        print(f"{name}: usage: {usage}   (no CASE_DIR: serve as a moecheck worker)", file=sys.stderr)
        sys.exit(2)
    if dirs:
        sys.exit(_serve_one(handler, dirs[0], ops, name))
    sys.exit(_serve_worker(handler, ops, name))


def _serve_one(handler, directory, ops, name):
    """Protocol v1: one case, exit status 0 or 1."""
    try:
        run_case(handler, directory, ops)
    except CaseError as e:
        print(f"{name}: CaseError: {e}", file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 - every failure is the case's, with its traceback
        traceback.print_exc()
        return 1
    return 0


def _serve_worker(handler, ops, name):
    """Protocol v2: greet, then one answer per request line, until stdin ends."""
    offered = os.environ.get(PROTOCOL_ENV)
    if offered is not None and offered.strip().isdigit() and int(offered) < WORKER_PROTOCOL:
        print(f"{name}: moecheck speaks worker protocol {offered}, this helper {WORKER_PROTOCOL}: update moecheck", file=sys.stderr)
        return 1
    if sys.stdin.isatty():
        print(f"{name}: serving as a moecheck worker (protocol v2) on stdin/stdout; "
              f"give a CASE_DIR to run one case", file=sys.stderr)
    answers = _claim_stdout()
    _send(answers, {"protocol": WORKER_PROTOCOL, "ops": list(ops) if ops is not None else None})
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
            run_case(handler, directory, ops)
        except CaseError as e:
            print(f"{name}: CaseError: {e}", file=sys.stderr)
            _send(answers, {"ok": False, "error": f"CaseError: {e}"})
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the case fails, the worker goes on
            traceback.print_exc()
            _send(answers, {"ok": False, "error": _last_line(e)})
        else:
            _send(answers, {"ok": True})
        sys.stderr.flush()


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
