"""The NCCL backend (disttensor/comm/nccl.py).

Without a GPU: on simulated ranks, against the CuPy and NCCL stand-in of tests/fake_cupy.py,
which performs NCCL's collectives (with NCCL's own NaN-dropping max/min) on host memory,
checks every kernel and NCCL call for stream order, and logs streams, events and NCCL calls.
So the communicator's logic is tested here: group creation and caching, the unique id, every
collective against the host backend (tests/nccl_cases.py), the NCCL calls it makes (dtypes,
ops, counts, groups, streams), the fallbacks and their message, the non-blocking
all-reduce's events. With CuPy, NCCL and a GPU, the same cases run for real under mpiexec
(the ``gpu`` tests; skipped otherwise, with the reason).
"""

from __future__ import annotations

import logging

import nccl_cases
import numpy as np
import pytest
from fake_cupy import FakeCupy, HazardError
from mpirun import run

import disttensor as dt
from disttensor.comm import nccl as ncclmod
from disttensor.comm.agree import RanksDiverged


@pytest.fixture(autouse=True)
def fresh_decisions():
    """Every test starts with no group decided and nothing said."""
    ncclmod._said.clear()
    yield
    ncclmod._said.clear()
    ncclmod._decided.clear()


@pytest.fixture
def fake():
    with FakeCupy() as f:
        yield f


def world_and_nccl(cupy):
    """(the simulated world, its NCCL communicator) on the calling rank."""
    w = dt.comm.world()
    return w, ncclmod.nccl_group(w, cupy)


def nccl_world(cupy):
    """The simulated world's NCCL communicator on the calling rank."""
    return ncclmod.nccl_group(dt.comm.world(), cupy)


# -- every collective against the host backend ---------------------------------------------------
@pytest.mark.parametrize("n", [1, 3])
def test_every_collective_equals_the_host_backend(fake, n):
    def body():
        w, dev = world_and_nccl(fake)
        assert dev is not None and dev.backend == "nccl"
        return nccl_cases.run_all(fake, w, dev)

    checks = dt.simulate(n, body)
    assert min(checks) > 300  # results compared on each rank


def test_sub_groups_are_nccl_communicators_made_once(fake):
    """The world's NCCL communicator, then a 2-rank sub-group's: each one unique id made by the
    group's first rank, one NcclCommunicator per rank and group, cached (the second ask makes
    nothing); the sub-group's collectives are right."""

    def body():
        w, dev = world_and_nccl(fake)
        assert ncclmod.nccl_group(w, fake) is dev
        sub = dev.group((1, 3)) if dt.get_rank() in (1, 3) else None
        if sub is not None:
            assert dev.group((1, 3)) is sub and sub.ranks == (1, 3) and sub.backend == "nccl"
            nccl_cases.case_allreduce(fake, w.group((1, 3)), sub)
        return sub is not None

    assert dt.simulate(4, body) == [False, True, False, True]
    uids = fake.nccl.uids
    assert len(uids) == 2  # the world's (rank 0) and the sub-group's (rank 1)
    by_uid = {u: sorted((r, n) for uu, r, n in fake.nccl.created if uu == u) for u in uids}
    assert by_uid[uids[0]] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert by_uid[uids[1]] == [(0, 2), (1, 2)]


# -- the NCCL calls it makes ---------------------------------------------------------------------
def calls_of(fake, fn):
    """The NCCL calls rank 0 makes in ``fn(dev)`` on 2 simulated ranks."""

    def body():
        dev = nccl_world(fake)
        start = len(fake.device().calls)
        fn(dev)
        return fake.device().calls[start:]

    return dt.simulate(2, body)[0]


@pytest.mark.parametrize(
    "dtype,op,want",
    [
        (np.float32, "sum", ("allReduce", "null", 6, "float32", "NCCL_SUM", None)),
        (np.float64, "avg", ("allReduce", "null", 6, "float64", "NCCL_SUM", None)),
        (np.bool_, "sum", ("allReduce", "null", 6, "uint8", "NCCL_MAX", None)),
        (np.bool_, "min", ("allReduce", "null", 6, "uint8", "NCCL_MIN", None)),
        (np.float16, "max", ("allReduce", "null", 6, "int32", "NCCL_MAX", None)),
        (np.float64, "min", ("allReduce", "null", 6, "int64", "NCCL_MIN", None)),
        (np.int16, "sum", ("allReduce", "null", 6, "int32", "NCCL_SUM", None)),
        (np.float16, "sum", ("allReduce", "null", 6, "float16", "NCCL_SUM", None)),
        (np.complex64, "sum", ("allReduce", "null", 12, "float32", "NCCL_SUM", None)),
        (np.uint64, "max", ("allReduce", "null", 6, "uint64", "NCCL_MAX", None)),
    ],
)
def test_reductions_call_nccl_with_its_types(fake, dtype, op, want):
    def fn(dev):
        a = fake.asarray(np.ones(6, dtype))
        dev.allreduce(a, a, op)

    assert calls_of(fake, fn) == [want]


def test_complex_max_is_staged_through_the_host(fake):
    def fn(dev):
        a = fake.asarray(np.array([1 + 2j, 3j], np.complex128))
        dev.allreduce(a, a, "max")

    assert calls_of(fake, fn) == []


def test_uneven_counts_take_the_padded_or_the_point_to_point_path(fake):
    def gathers(dev):
        send = fake.asarray(np.ones(2 + dev.rank, np.float64))  # counts [2, 3]: padded
        dev.allgather(send, fake.empty(5, np.float64), [2, 3])
        send = fake.asarray(np.ones(1 + 5 * dev.rank, np.float64))  # [1, 6]: point to point
        dev.allgather(send, fake.empty(7, np.float64), [1, 6])
        dev.reduce_scatter(fake.asarray(np.ones(7)), fake.empty(1 + 5 * dev.rank), [1, 6], "sum")

    assert calls_of(fake, gathers) == [
        ("allGather", "null", 24, "uint8", None, None),  # 3 float64 per rank, padded
        ("send", "null", 8, "uint8", None, 1),
        ("recv", "null", 48, "uint8", None, 1),
        ("reduce", "null", 1, "float64", "NCCL_SUM", 0),  # block 0 to rank 0
        ("reduce", "null", 6, "float64", "NCCL_SUM", 1),
    ]


def test_alltoall_and_broadcast_move_bytes(fake):
    def fn(dev):
        a = fake.asarray(np.arange(4, dtype=np.int16))
        dev.alltoall(a, None, fake.empty(4, np.int16), None)
        dev.broadcast(a, 1)

    assert calls_of(fake, fn) == [
        ("send", "null", 4, "uint8", None, 1),  # 2 int16 to rank 1; its own block is a copy
        ("recv", "null", 4, "uint8", None, 1),
        ("broadcast", "null", 8, "uint8", None, 1),
    ]


def test_integer_average_raises_before_anything_moves(fake):
    def body():
        dev = nccl_world(fake)
        with pytest.raises(TypeError, match="average of integers"):
            dev.allreduce(fake.asarray(np.ones(3, np.int64)), fake.empty(3, np.int64), "avg")
        return fake.device().calls

    assert dt.simulate(2, body) == [[], []]


def test_host_buffers_go_over_mpi_and_mixed_ones_are_refused(fake):
    def body():
        dev = nccl_world(fake)
        out = np.empty(3)
        dev.allreduce(np.full(3, dt.get_rank() + 1.0), out, "sum")
        with pytest.raises(TypeError, match="must all be device"):
            dev.allreduce(fake.asarray(np.ones(3)), out, "sum")
        return out, fake.device().calls

    for out, calls in dt.simulate(2, body):
        np.testing.assert_array_equal(out, [3.0, 3.0, 3.0])
        assert calls == []


# -- NaN through max/min -------------------------------------------------------------------------
def test_nccl_drops_a_nan_that_the_keys_keep(fake):
    """The stand-in's NCCL max drops a NaN as NCCL's fmax does; the backend's result has it."""
    raw = fake.nccl.reduce([np.array([np.nan, 1.0]), np.array([2.0, np.nan])], fake.nccl.NCCL_MAX)
    np.testing.assert_array_equal(raw, [2.0, 1.0])

    def body():
        dev = nccl_world(fake)
        x = np.array([np.nan, 1.0, -np.inf, 4.0]) if dt.get_rank() else np.array([2.0, 3, 5, 6])
        out = {}
        for dtype in (np.float16, np.float32, np.float64):
            for op in ("max", "min"):
                a = fake.asarray(x.astype(dtype))
                dev.allreduce(a, a, op)
                out[np.dtype(dtype).name, op] = a.get()
        return out

    out = dt.simulate(2, body)[0]
    for dtype in ("float16", "float32", "float64"):
        np.testing.assert_array_equal(out[dtype, "max"], np.array([np.nan, 3, 5, 6], dtype))
        np.testing.assert_array_equal(out[dtype, "min"], np.array([np.nan, 1, -np.inf, 4], dtype))
        assert not np.signbit(out[dtype, "min"][0])  # numpy's NaN, positive


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_keys_order_as_numpy_with_nan_last(dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 200)) * 10.0 ** rng.integers(-3, 4, (3, 200))).astype(dtype)
    x[rng.random((3, 200)) < 0.05] = np.nan
    x[0, :4] = [np.inf, -np.inf, 0.0, np.finfo(dtype).tiny]
    key = np.dtype(np.int64 if np.dtype(dtype).itemsize == 8 else np.int32)
    for op, f in (("max", np.maximum), ("min", np.minimum)):
        keys = np.stack([ncclmod.float_keys(np, row, key, op) for row in x])
        out = np.empty(200, dtype)
        ncclmod.from_keys(np, (keys.max if op == "max" else keys.min)(axis=0), out, op)
        np.testing.assert_array_equal(out, f.reduce(x, axis=0))


# -- fallbacks and the one message ------------------------------------------------------------
def decide(fake, cupy=None):
    """nccl_group of the world on 4 simulated ranks: each rank's answer (None or a backend)."""

    def body():
        g = ncclmod.nccl_group(dt.comm.world(), cupy or fake)
        again = ncclmod.nccl_group(dt.comm.world(), cupy or fake)
        assert again is g  # decided once, None included
        return None if g is None else g.backend

    return dt.simulate(4, body)


def messages(caplog):
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "disttensor"]


def test_nccl_path_is_said_once(fake, caplog):
    caplog.set_level(logging.INFO, "disttensor")
    assert decide(fake) == ["nccl"] * 4
    assert messages(caplog) == [("INFO", "disttensor: device arrays: collectives over NCCL 2.27.3")]


def test_ranks_sharing_a_gpu_fall_back_together(caplog):
    caplog.set_level(logging.INFO, "disttensor")
    with FakeCupy(bus_of=lambda r: "0000:41:00.0" if r in (1, 2) else f"0000:0{r}:00.0") as f:
        assert decide(f) == [None] * 4
        assert f.nccl.created == [] and f.nccl.uids == []
    [(level, text)] = messages(caplog)
    assert level == "WARNING" and "host staging over MPI: ranks 1 and 2 share the GPU" in text
    assert "0000:41:00.0" in text


@pytest.mark.parametrize(
    "missing,says",
    [
        ("module", "CuPy has no cupy.cuda.nccl (cannot import name 'nccl'"),
        ("library", "the NCCL library is missing (pip install nvidia-nccl-cu12"),
    ],
)
def test_missing_nccl_falls_back(missing, says, caplog):
    caplog.set_level(logging.INFO, "disttensor")
    with FakeCupy(missing=missing) as f:
        assert decide(f) == [None] * 4
    [(level, text)] = messages(caplog)
    assert level == "WARNING" and text.startswith(
        "disttensor: device arrays: host staging over MPI"
    )
    assert f"rank 0: {says}" in text


def test_one_rank_without_nccl_takes_every_rank_to_host_staging(fake, caplog):
    caplog.set_level(logging.INFO, "disttensor")
    without = FakeCupy(missing="library")

    def body():
        cupy = without if dt.get_rank() == 2 else fake
        return ncclmod.nccl_group(dt.comm.world(), cupy)

    assert dt.simulate(4, body) == [None] * 4
    assert "rank 2: the NCCL library is missing" in messages(caplog)[0][1]


def test_a_rank_whose_cupy_sees_no_gpu_takes_every_rank_to_host_staging(fake, caplog):
    caplog.set_level(logging.INFO, "disttensor")
    device = fake.cuda.Device

    def no_gpu_on_rank_3(*args):
        if dt.get_rank() == 3:
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
        return device(*args)

    fake.cuda.Device = no_gpu_on_rank_3
    assert decide(fake) == [None] * 4
    [(level, text)] = messages(caplog)
    assert level == "WARNING" and text.endswith(
        "rank 3: CuPy sees no GPU (RuntimeError: cudaErrorNoDevice: no CUDA-capable device is "
        "detected)"
    )


def test_without_cupy_the_factory_says_so(caplog):
    """With no cupy installed (this machine), the default import fails and every rank agrees."""
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here: its absence cannot be shown")
    except ImportError:
        pass
    caplog.set_level(logging.INFO, "disttensor")
    assert dt.simulate(2, lambda: ncclmod.nccl_group(dt.comm.world())) == [None, None]
    assert "host staging over MPI: rank 0: CuPy cannot be imported" in messages(caplog)[0][1]


FACTORY_UNDER_MPI = """
import logging, sys
import numpy as np
sys.path.insert(0, "tests")
import disttensor as dt
from disttensor.comm import nccl as ncclmod
from fake_cupy import FakeCupy

logging.basicConfig(format="%(levelname)s %(message)s")
logging.getLogger("disttensor").setLevel(logging.INFO)
w = dt.comm.world()
with FakeCupy() as f:
    dev = ncclmod.nccl_group(w, f)
    assert dev is not None and ncclmod.nccl_group(w, f) is dev
    [(uid, rank, size)] = f.nccl.created  # this process's NcclCommunicator
    assert (rank, size) == (w.rank, w.size)
    assert len(set(w.allgather_object(uid))) == 1, "one unique id, rank 0's, on every rank"
    out = np.empty(3)
    dev.allreduce(np.full(3, w.rank + 1.0), out, "sum")  # host buffers: over MPI
    assert out.tolist() == [6.0] * 3, out
    dev.barrier()
ncclmod._decided.clear()
with FakeCupy(bus_of=lambda rank: "0000:07:00.0") as f:
    assert ncclmod.nccl_group(w, f) is None
ncclmod._decided.clear()
with FakeCupy(missing="library") as f:
    assert ncclmod.nccl_group(w, f) is None
print("rank", w.rank, "done", flush=True)
"""


@pytest.mark.mpi
def test_the_factory_under_mpiexec(tmp_path):
    """On 3 MPI processes (the decisions and the unique id over MPIComm): NCCL with a GPU
    each, host staging on a shared GPU and without the library; rank 0 says each once."""
    path = tmp_path / "factory.txt"  # a script; .txt: not a file of the repository
    path.write_text(FACTORY_UNDER_MPI)
    code, out = run(3, [str(path)], timeout=120)
    assert code == 0, out
    assert out.count("done") == 3, out
    assert out.count("INFO disttensor: device arrays: collectives over NCCL 2.27.3") == 1, out
    assert (
        out.count("WARNING disttensor: device arrays: host staging over MPI: ranks 0 and 1 share")
        == 1
    )
    assert out.count("rank 0: the NCCL library is missing") == 1, out


# -- streams and events (Note [NCCL streams]) ----------------------------------------------------
def test_nonblocking_allreduce_runs_on_a_side_stream_between_two_events(fake):
    def body():
        dev = nccl_world(fake)
        d = fake.device()
        h = np.arange(5.0) + dt.get_rank()
        buf = fake.asarray(h)
        buf *= 2  # a kernel on the compute stream writes the gradient
        start = len(d.trace)
        d.busy = True  # the reduction is in flight
        work = dev.iallreduce(buf, buf, "avg")
        launched = d.trace[start:]
        assert not work.test() and not work.is_completed()
        with pytest.raises(HazardError, match="never waited"):
            buf.get()  # the compute stream reads it before the wait: a race
        d.busy = False
        assert work.test() and work.is_completed()
        after = d.trace[start:]
        return launched, after, buf.get()

    for launched, after, result in dt.simulate(2, body):
        (_, ready, compute), (_, side, waited), *middle, (_, done, side2) = launched
        assert (compute, side, waited, side2) == ("null", "stream1", ready, "stream1")
        assert launched[0][0] == "record" and launched[1][0] == "wait"
        assert ("nccl", "allReduce", "stream1") in middle and launched[-1][0] == "record"
        assert after[len(launched) :] == [
            ("query", done),
            ("query", done),
            ("wait", "null", done),
        ]
        np.testing.assert_array_equal(result, np.arange(5.0) * 2 + 1)  # avg of 2x and 2x + 2


def test_a_blocking_collective_waits_for_the_nonblocking_one_before_it(fake):
    def body():
        dev = nccl_world(fake)
        d = fake.device()
        a, b = fake.asarray(np.ones(3)), fake.asarray(np.ones(2))
        work = dev.iallreduce(a, a, "sum")
        start = len(d.trace)
        dev.allreduce(b, b, "sum")  # same communicator, compute stream
        between = d.trace[start:]
        work.wait()
        return between, a.get(), b.get()

    for between, a, b in dt.simulate(2, body):
        (rec, event, side), (wait, stream, waited), nccl = between
        assert (rec, side, wait, stream, waited) == ("record", "stream1", "wait", "null", event)
        assert nccl == ("nccl", "allReduce", "null")
        np.testing.assert_array_equal(a, [2, 2, 2])
        np.testing.assert_array_equal(b, [2, 2])


def test_the_stand_in_catches_a_missing_wait(fake):
    """What the stream checks guard against: a side-stream reduction read on the compute
    stream without an event in between."""

    def body():
        dev = nccl_world(fake)
        cuda = fake.cuda
        buf = fake.asarray(np.ones(4))
        side = cuda.Stream(non_blocking=True)
        side.wait_event(cuda.get_current_stream().record())  # the side stream sees buf
        with side:
            dev.comm.allReduce(
                buf.data.ptr, buf.data.ptr, 4, fake.nccl.NCCL_FLOAT64, fake.nccl.NCCL_SUM, side.ptr
            )
        with pytest.raises(HazardError, match="null reads memory that NCCL allReduce on stream"):
            buf.get()
        return True

    assert dt.simulate(2, body) == [True, True]


# -- counting and the agreement check -----------------------------------------------------------
def test_collectives_are_counted_and_checked_like_the_other_backends(fake):
    def body():
        dev = nccl_world(fake)
        with dt.CommCounter() as cc:
            a = fake.asarray(np.ones(4, np.float32))
            dev.allreduce(a, a, "sum")
            dev.iallreduce(a, a, "max").wait()
            dev.allgather(a, fake.empty(8, np.float32), [4, 4])
            dev.broadcast(a, 0)
        return cc.counts, cc.bytes, cc.checks

    counts, nbytes, checks = dt.simulate(2, body)[0]
    assert counts == {"all_reduce": 2, "all_gather": 1, "broadcast": 1}
    assert nbytes == {"all_reduce": 32, "all_gather": 16, "broadcast": 16}
    assert checks == 4


def test_diverged_ranks_get_the_agreement_error_before_nccl_runs(fake):
    def body():
        dev = nccl_world(fake)
        a = fake.asarray(np.ones(4 + dt.get_rank()))
        with pytest.raises(RanksDiverged, match="different collective calls"):
            dev.allreduce(a, a, "sum")
        return fake.device().calls

    assert dt.simulate(2, body) == [[], []]


# -- real CuPy + NCCL ----------------------------------------------------------------------------
def _gpus() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


GPUS = _gpus()
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="needs CuPy with NCCL and a CUDA GPU")


@pytest.mark.mpi
@needs_gpu
def test_gpu_collectives_under_mpiexec():
    """The same cases on real GPUs, one per rank (a 1-rank group where there is one GPU)."""
    n = min(GPUS, 4)
    code, out = run(n, ["tests/nccl_cases.py"], timeout=600)
    assert code == 0, out
    assert f"results equal the MPI backend's on {n} ranks" in out, out


@pytest.mark.mpi
@needs_gpu
def test_gpu_ranks_sharing_a_device_fall_back():
    code, out = run(
        2,
        ["tests/nccl_cases.py", "--expect-fallback"],
        timeout=300,
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    assert code == 0, out
    assert "share the GPU" in out and "fallback on 2 ranks sharing a GPU" in out, out
