"""moecheck's Python side: the adapter helper (docs/protocol.md).

An adapter connects an implementation under test to ``moecheck ... --impl exec:CMD`` (one
process per case, protocol v1) or ``--impl worker:CMD`` (one process for many cases, protocol
v2). With this package it is one function::

    from moecheck.adapter import serve

    def handler(case):
        return {"out": my_kernel(case.lhs, case.rhs, case.group_sizes)}

    serve(handler, ops=["grouped_gemm"])

* :mod:`moecheck.case`: :class:`~moecheck.case.Case` (a case directory as numpy arrays),
  :func:`~moecheck.case.read_case`, :func:`~moecheck.case.write_outputs`,
  :class:`~moecheck.case.CaseError`;
* :mod:`moecheck.adapter`: :func:`~moecheck.adapter.serve`, both protocols.

Pure numpy and the standard library. examples/adapters/ holds one adapter per operation.
"""
from .adapter import serve
from .case import Case, CaseError, read_case, write_outputs

__all__ = ["Case", "CaseError", "read_case", "serve", "write_outputs"]
