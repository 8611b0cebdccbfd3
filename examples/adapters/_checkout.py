"""Lets the adapters here import the `moecheck` helper package from this checkout.

The package lives in the repository's python/ folder (python/moecheck/); an installed
moecheck wheel brings the same package. Each adapter imports this module first, so running
`python3 examples/adapters/ADAPTER.py` from a checkout uses the checkout's helper (the one
these adapters are written against), installed or not. This is the only place that knows
the path.
"""
import os
import sys

_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python")
if os.path.isdir(os.path.join(_PYTHON, "moecheck")):
    sys.path.insert(0, os.path.normpath(_PYTHON))
