"""The ``mpi_impl`` marker: the mpiexec tests whose outcome can depend on which MPI library runs
them. .ci/run runs every ``mpi`` test under the default MPICH wheel and these again under Open
MPI (``pytest -m mpi_impl``; docs/install.md).

They are the tests of the MPI backend itself: the SPMD cases on 1 to 4 ranks (every collective
and the NaN-correct MAX/MIN user ops), the abort hook, the watchdog and the agreement check
(tests/test_mpi.py, tests/test_faults.py, tests/test_harness.py, tests/test_agree.py: calls that
differ in one field, on the check's own MPI channel), non-blocking all-reduce
progress overlapped with backward (tests/test_parallel.py), checkpoints written and read by
separate processes (tests/test_checkpoint.py) and compiled steps, whose replays make the bare
MPI calls and must still catch ranks that diverge (tests/test_compile.py). The other mpiexec
tests (demos, benchmarks, the numpy programs) run the same backend calls for numerics those
cases already cover, and would
double the Open MPI pass.
"""

from __future__ import annotations

import pytest

MPI_IMPL_FILES = {
    "test_mpi.py",
    "test_faults.py",
    "test_harness.py",
    "test_agree.py",
    "test_parallel.py",
    "test_checkpoint.py",
    "test_compile.py",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "mpi_impl: an mpi test that depends on the MPI library (tests/conftest.py)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("mpi") and item.path.name in MPI_IMPL_FILES:
            item.add_marker(pytest.mark.mpi_impl)
