"""Cases about faults and edge values, run on simulated ranks (tests/test_reliability.py) and
under mpiexec (tests/mpi_runner.py): the simulated backend reduces with numpy, so only the
MPI run can show how the MPI library itself combines values."""

from __future__ import annotations

import numpy as np
from op_cases import assert_close

import disttensor as dt


def case_nan_reductions(world: int) -> int:
    """max/min over a split axis and Partial(max/min) reductions propagate NaN as numpy does,
    whichever rank holds it; complex max/min compare as numpy compares them."""
    mesh = dt.init_mesh((world,))
    checks = 0
    for where in range(world):  # the NaN on each rank in turn
        g = np.arange(2.0 * world)
        g[2 * where] = np.nan
        x = dt.shard_tensor(g, mesh, [dt.Shard(0)])
        for got, want in [
            (x.max(), np.max(g)),
            (x.min(), np.min(g)),
            (np.fmax.reduce(x), np.fmax.reduce(g)),
        ]:
            assert_close(np.asarray(got), np.asarray(want), f"NaN on rank {where}")
            checks += 1
        local = np.array([np.nan if dt.get_rank() == where else 1.0, float(dt.get_rank())])
        for kind in ("max", "min"):
            p = dt.dtensor_from_local(local, mesh, [dt.Partial(kind)])
            want = np.array([np.nan, world - 1.0 if kind == "max" else 0.0])
            assert_close(p.numpy(), want, f"Partial({kind}) with NaN on rank {where}")
            checks += 1
    c = np.array([1 + 2j, 3 - 1j, 3 + 5j, -2 + 0j, 0.5j, 1 + 1j][: 2 * world])
    xc = dt.shard_tensor(c, mesh, [dt.Shard(0)])
    for got, want in [(xc.max(), np.max(c)), (xc.min(), np.min(c))]:
        assert_close(np.asarray(got), np.asarray(want), "complex max/min")
        checks += 1
    return checks
