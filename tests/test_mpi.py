"""The SPMD cases for real under mpiexec with 1, 2, 3 and 4 ranks, and the no-hang guarantees."""

from __future__ import annotations

import time

import pytest
from mpirun import run, run_script


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_cases_under_mpiexec(n):
    code, out = run(n, ["tests/mpi_runner.py"], timeout=420)
    assert code == 0, out
    assert "passed, 0 failed" in out, out


CRASH = """
import sys, disttensor as dt
mesh = dt.init_mesh((dt.get_world_size(),))
x = dt.ones((8,), mesh=mesh, placements=[dt.Shard(0)])
if dt.get_rank() == 1:
    raise ValueError("boom on rank one")
x.numpy()            # the other ranks wait here for rank 1, which never comes
dt.barrier()
"""

CRASH_BEFORE_MPI = """
import disttensor as dt, os
if (os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")) == "1":  # MPICH, Open MPI
    raise ValueError("boom before any MPI call")
dt.barrier()
"""


@pytest.mark.mpi
@pytest.mark.parametrize("script", [CRASH, CRASH_BEFORE_MPI], ids=["in-collective", "before-mpi"])
def test_uncaught_exception_ends_the_job(script, tmp_path):
    path = tmp_path / "crash.py"
    path.write_text(script)
    t = time.perf_counter()
    code, out = run(3, [str(path)], timeout=60)
    assert code != 0, out
    assert "ValueError: boom" in out and "Traceback" in out, out
    assert time.perf_counter() - t < 30, "the job should end within seconds"


@pytest.mark.mpi
def test_reshard_benchmark_runs():
    """bench/reshard.py --quick checks its own results; no timing is asserted here."""
    code, out = run(2, ["bench/reshard.py", "--quick"], timeout=120)
    assert code == 0, out
    assert "S->R" in out, out


@pytest.mark.mpi
def test_dispatch_benchmark_runs():
    """bench/dispatch.py --quick runs on 2 ranks; no timing is asserted here."""
    code, out = run(2, ["bench/dispatch.py", "--quick"], timeout=120)
    assert code == 0, out
    assert "matmul" in out, out


@pytest.mark.mpi
def test_train_step_benchmark_runs():
    """bench/train_step.py --quick runs its float64 agreement check (losses, gradients and
    parameters of the three variants over 3 Adam steps; a mismatch exits non-zero) and then
    the timing, whose numbers are not asserted."""
    code, out = run(2, ["bench/train_step.py", "--quick"], timeout=120)
    assert code == 0, out
    assert "agreement check (float64, 3 steps): losses, gradients and parameters agree" in out, out
    assert "speed-up" in out, out


@pytest.mark.mpi
def test_mpi_progress_benchmark_runs():
    """bench/mpi_progress.py --quick measures how much of a non-blocking all-reduce is
    hidden behind numpy work; the numbers are not asserted."""
    code, out = run(2, ["bench/mpi_progress.py", "--quick"], timeout=120)
    assert code == 0, out
    assert "hidden" in out and "no test" in out, out


# -- no silent hangs (disttensor/comm/watchdog.py: Note [Waiting for a rank that is gone]) ------
LEAVES = """
import sys, numpy as np, disttensor as dt
mesh = dt.init_mesh((dt.get_world_size(),))
x = dt.shard_tensor(np.arange(8.0), mesh, [dt.Shard(0)])
if dt.get_rank() == 1:
    sys.exit(3)
x.numpy()
print("unreachable", flush=True)
"""

PRINTS_ON_RANK_0 = """
import numpy as np, disttensor as dt
mesh = dt.init_mesh((dt.get_world_size(),))
x = dt.shard_tensor(np.arange(8.0), mesh, [dt.Shard(0)])
if dt.get_rank() == 0:
    print(x)
"""

DIVERGES = """
import numpy as np, disttensor as dt
mesh = dt.init_mesh((dt.get_world_size(),))
x = dt.shard_tensor(np.arange(8.0), mesh, [dt.Shard(0)])
y = dt.shard_tensor(np.arange(8.0), mesh, [dt.Partial()])
x.numpy() if dt.get_rank() == 0 else y.numpy()
print("finished", flush=True)
"""

HALO_LEAVES = """
import sys, numpy as np, disttensor as dt
mesh = dt.init_mesh((dt.get_world_size(),))
u = dt.shard_tensor(np.arange(24.0).reshape(6, 4), mesh, [dt.Shard(0)])
if dt.get_rank() == 1:
    sys.exit(3)
u[1:] + 1  # rows move between neighbours: rank 0 waits for one from rank 1
if dt.get_rank() == 0:  # rank 2 only sends, and may finish
    print("unreachable", flush=True)
"""

BUSY_RANK_0 = """
import time, numpy as np, disttensor as dt
mesh = dt.init_mesh((dt.get_world_size(),))
x = dt.shard_tensor(np.arange(8.0), mesh, [dt.Shard(0)])
total = float(x.sum())
if dt.get_rank() == 0:
    time.sleep(2)  # works on alone: the others wait for it at exit, and nothing aborts
    print("done", total, flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize(
    "script,env,says",
    [
        (LEAVES, {}, "rank 1 left the job"),
        (HALO_LEAVES, {}, " s in sendrecv from rank 1 over ranks [0, 1, 2]: rank"),
        (PRINTS_ON_RANK_0, {}, "left the job"),
        (
            DIVERGES,
            {"DISTTENSOR_TIMEOUT": "2", "DISTTENSOR_CHECK": "0"},
            "no reply after DISTTENSOR_TIMEOUT=2 s",
        ),
        (DIVERGES, {}, "were about to make different collective calls"),
        (DIVERGES, {"DISTTENSOR_DEBUG": "1"}, "were about to make different collective calls"),
    ],
    ids=[
        "sys.exit on one rank",
        "sys.exit on one rank, a neighbour waiting for its rows",
        "print on rank 0",
        "diverged, unchecked: timeout",
        "diverged, checked",
        "diverged, debug check",
    ],
)
def test_a_rank_waiting_for_a_call_that_never_comes_ends_the_job(script, env, says, tmp_path):
    path = tmp_path / "waits.txt"
    path.write_text(script)
    t = time.perf_counter()
    code, out = run(3, [str(path)], timeout=60, env=env)
    assert code != 0, out
    assert says in out and "unreachable" not in out and "finished" not in out, out
    assert time.perf_counter() - t < 30, "the job should end within seconds"


@pytest.mark.mpi
def test_a_rank_that_finishes_first_waits_for_the_others(tmp_path):
    path = tmp_path / "busy_rank.txt"
    path.write_text(BUSY_RANK_0)
    code, out = run(3, [str(path)], timeout=60)
    assert code == 0, out
    assert "done 28.0" in out and "Abort" not in out, out


ROOM = """
import numpy as np, disttensor as dt
from disttensor.comm import mpi
data_calls = []
real = mpi.MPIComm._allgather
mpi.MPIComm._allgather = lambda self, *a: (data_calls.append(1), real(self, *a))[1]
mesh = dt.init_mesh((dt.get_world_size(),))
size = mesh.size
share = mpi.room(size) // 8  # float64 items of a rank's payload room
for n, calls in ((256, 0), (share * size, 0), (share * size + 1, 1), (share * (size - 1), 0)):
    v = np.arange(n, dtype=np.float64) * 0.5 - 3
    x = dt.shard_tensor(v, mesh, [dt.Shard(0)])
    data_calls.clear()
    with dt.CommCounter() as c:
        y = dt.reshard(x, mesh, [dt.Replicate()])
    assert np.array_equal(y.to_local(), v), (n, y.to_local())
    assert c.counts == {"all_gather": 1}, (n, c.counts)  # whichever way it travels
    assert len(data_calls) == calls, (n, data_calls)
print("ROOM OK")
"""


@pytest.mark.mpi
def test_a_gather_that_fills_the_room_is_the_envelope_alone(tmp_path):
    """Note [The check rides along]: every rank's part filling its payload room exactly (the
    half of 256 float64 on 2 ranks, a quarter on 4) is gathered in the envelope, one MPI call;
    one item more, and the data call follows the envelope."""
    run_script(tmp_path / "script.py", ROOM, (2, 4), "ROOM OK")


@pytest.mark.mpi
def test_cg_lines_benchmark_runs():
    """bench/cg_lines.py --quick checks every variant's x against numpy's CG and counts dt's
    collectives per iteration (the hand-written 3); no timing is asserted here."""
    code, out = run(2, ["bench/cg_lines.py", "--quick"], timeout=120)
    assert code == 0, out
    assert "ratio to hand" in out and "collectives per iteration: dt 3 " in out, out
