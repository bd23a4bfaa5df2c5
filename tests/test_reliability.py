"""Faults and edge values on simulated ranks; tests/mpi_runner.py runs the same cases under
mpiexec, where the MPI library combines the values."""

from __future__ import annotations

import pytest
import reliability_cases

import disttensor as dt


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_nan_reductions(world):
    assert min(dt.simulate(world, reliability_cases.case_nan_reductions, world)) > 0
