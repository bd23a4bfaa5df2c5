"""The docstring examples of every module run as tests: every public function shows a short
example, and it must work.

They run on one simulated rank, so the test process itself never initializes MPI (it launches
mpiexec jobs in tests/test_mpi.py).
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil

import pytest

import disttensor as dt

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(dt.__path__, "disttensor.") if not m.ispkg
) + ["disttensor", "disttensor.comm"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS
    if "dt.simulate(" in inspect.getsource(module):  # these examples simulate ranks themselves
        result = doctest.testmod(module, optionflags=flags)
    else:
        result = dt.simulate(1, doctest.testmod, module, optionflags=flags)[0]
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
