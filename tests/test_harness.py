"""The test harness itself can fail: an error on one rank other than rank 0 fails the grid,
on simulated ranks and under mpiexec, and results that differ between ranks are caught."""

from __future__ import annotations

import numpy as np
import pytest
from mpirun import run
from op_cases import S0, Grid, R, assert_grid, every_rank, mesh_of

import disttensor as dt

X = np.arange(12.0).reshape(4, 3)


def _rank1_wrong(mesh: dt.ProcessMesh) -> tuple[int, list[str]]:
    """A grid whose op returns the right value on every rank but rank 1 (a planted bug)."""
    grid = Grid()
    for pl in ([S0], [R]):
        grid.check(
            mesh,
            lambda a: a.numpy() + (dt.get_rank() == 1),
            (X,),
            [pl],
            lambda a: a,
            f"planted {pl}",
        )
    return grid.result()


def test_a_failure_on_rank_1_only_fails_the_grid():
    results = dt.simulate(3, _rank1_wrong, mesh_of((3,)))
    assert results[0] == (2, []) and len(results[1][1]) == 2  # only rank 1 saw it
    with pytest.raises(AssertionError, match=r"rank 0: 0 of 2 failed \| rank 1: 2 of 2 failed"):
        assert_grid(results)


def test_ranks_that_ran_different_checks_fail_the_grid():
    with pytest.raises(AssertionError, match="different numbers of checks"):
        assert_grid([(5, []), (4, [])])


def test_every_rank_compares_every_result():
    def body():
        x = dt.shard_tensor(X, mesh_of((2,)), [S0])
        value = x.numpy()
        if dt.get_rank() == 1:
            value[0, 0] += 1e-12  # the smallest of differences still counts
        return x.placements, value

    with pytest.raises(AssertionError, match="simulated rank 1 returned"):
        every_rank(dt.simulate(2, body))
    got = every_rank([(1, [np.zeros(2)]), (1, [np.zeros(2)])])
    assert got[0] == 1 and np.array_equal(got[1][0], np.zeros(2))
    with pytest.raises(AssertionError):  # same values, another dtype
        every_rank([np.zeros(2), np.zeros(2, np.float32)])


RANK1_UNDER_MPI = """
import sys
sys.path.insert(0, "tests")
from test_harness import _rank1_wrong
from op_cases import assert_grid, mesh_of
import disttensor as dt
assert_grid([_rank1_wrong(mesh_of((dt.get_world_size(),)))], ranks=[dt.get_rank()])
"""


@pytest.mark.mpi
def test_a_failure_on_rank_1_only_fails_the_job_under_mpiexec(tmp_path):
    path = tmp_path / "rank1.py"
    path.write_text(RANK1_UNDER_MPI)
    code, out = run(2, [str(path)], timeout=60)
    assert code != 0, out
    assert "rank 1: 2 of 2 failed" in out and "planted" in out, out
