"""moecheck's Python side: the adapter helper (docs/protocol.md).

An adapter connects an implementation under test to ``moecheck ... --impl exec:CMD`` (one
process per case, protocol v1) or ``--impl worker:CMD`` (one process for many cases, protocol
v2). With this package it is one function::

    from moecheck.adapter import serve

    def handler(case):
        return {"out": my_kernel(case.lhs, case.rhs, case.group_sizes)}

    serve(handler, ops=["grouped_gemm"],
          contract={"grouped_gemm": {"declared": {"tail": "zero"}}})

* :mod:`moecheck.case`: :class:`~moecheck.case.Case` (a case directory as numpy arrays),
  :func:`~moecheck.case.read_case`, :func:`~moecheck.case.write_outputs`,
  :class:`~moecheck.case.CaseError` (raise it to refuse a case: "not applicable", not a
  failure), :class:`~moecheck.case.CaseFormatError` (a directory or outputs the helper
  cannot read or write: a failure);
* :mod:`moecheck.adapter`: :func:`~moecheck.adapter.serve`, both protocols and the declared
  contract of the worker's greeting (:func:`~moecheck.adapter.check_contract`).

Pure numpy and the standard library. examples/adapters/ holds one adapter per operation.
"""
from .adapter import check_contract, serve
from .case import Case, CaseError, CaseFormatError, read_case, write_outputs

__all__ = ["Case", "CaseError", "CaseFormatError", "check_contract", "read_case", "serve", "write_outputs"]
