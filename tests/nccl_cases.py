"""Collective cases of the NCCL backend (disttensor/comm/nccl.py): every result against the
MPI-backed communicator's on the same data, on every dtype and reduce op, even and uneven
counts, NaN and infinities.

tests/test_nccl.py runs them on simulated ranks with the CuPy and NCCL stand-in of
tests/fake_cupy.py, and, where CuPy, NCCL and GPUs are present, for real under mpiexec::

    mpiexec -n N python tests/nccl_cases.py                    # N ranks, a GPU each
    mpiexec -n 2 python tests/nccl_cases.py --expect-fallback  # 2 ranks on one GPU

Each case takes ``cp`` (the cupy module or the stand-in), ``host`` (the MPI-backed
communicator of the group) and ``dev`` (its NCCL communicator) and returns how many results
it compared; a wrong one raises AssertionError naming the case, dtype, op and counts.
"""

from __future__ import annotations

import sys

import numpy as np

REDUCE_DTYPES = [
    np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.uint16, np.int8,
    np.uint8, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128,
]  # fmt: skip
MOVE_DTYPES = [np.float64, np.bool_, np.complex64, np.int16]


def values(dtype, n: int, rank: int, salt: int = 0, special: bool = False) -> np.ndarray:
    """``n`` values of rank ``rank`` whose sums over 4 ranks are exact in ``dtype`` in any
    order (small integers, halves for floats); ``special`` puts NaN, +-inf and -0.0 in
    (the same -0.0 on every rank: numpy's sign of max(-0.0, 0.0) depends on the order)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(1000 * rank + salt)
    if dtype == np.bool_:
        return rng.random(n) < 0.4
    if dtype.kind == "u":
        return rng.integers(0, 60, n).astype(dtype)
    if dtype.kind == "i":
        return rng.integers(-30, 31, n).astype(dtype)
    a = rng.integers(-16, 17, n) / 2
    if dtype.kind == "c":
        a = a + 1j * rng.integers(-16, 17, n) / 2
    a = a.astype(dtype)
    if special and n >= 4:
        a[(2 * rank + 1) % n] = np.nan
        a[(3 * rank + 2) % n] = np.inf if rank % 2 == 0 else -np.inf
        a[n - 1] = -0.0
    return a


def same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal values and dtype (NaN equal to NaN)."""
    nan = want.dtype.kind in "fc"
    if got.dtype != want.dtype or not np.array_equal(got, want, equal_nan=nan):
        raise AssertionError(f"{what}: got {got!r}, the MPI backend gives {want!r}")


def uneven(size: int) -> dict[str, list[int]]:
    """Counts lists of each path of Note [Uneven counts on NCCL]: equal, padded (the shards
    of numpy.array_split) and point to point (skewed, with an empty block)."""
    out = {"equal": [3] * size}
    if size > 1:
        out["padded"] = [len(b) for b in np.array_split(np.arange(3 * size - 1), size)]
        out["p2p"] = [0] + [1] * (size - 2) + [5]
    return out


def case_allreduce(cp, host, dev) -> int:
    """Blocking, non-blocking and in-place all-reduce of every dtype and op, NaN included."""
    checks = 0
    for dtype in REDUCE_DTYPES:
        for op in ("sum", "avg", "max", "min"):
            if op == "avg" and np.dtype(dtype).kind not in "fc":
                continue
            for n in (7, 0):
                h = values(dtype, n, host.rank, special=op in ("max", "min"))
                want = np.empty_like(h)
                host.allreduce(h, want, op)
                what = f"all_reduce {np.dtype(dtype).name} {op} n={n}"
                recv = cp.empty(h.shape, h.dtype)
                dev.allreduce(cp.asarray(h), recv, op)
                same(recv.get(), want, what)
                buf = cp.asarray(h)
                dev.iallreduce(buf, buf, op).wait()
                same(buf.get(), want, what + " (non-blocking, in place)")
                buf = cp.asarray(h)
                dev.allreduce(buf, buf, op)
                same(buf.get(), want, what + " (in place)")
                checks += 3
    return checks


def case_iallreduce_in_flight(cp, host, dev) -> int:
    """Several non-blocking all-reduces in flight (as the data-parallel buckets are), polled
    with test(), then waited for in order, and a blocking collective behind them."""
    hs = [values(np.float32, 5 + i, host.rank, salt=i) for i in range(3)]
    bufs = [cp.asarray(h) for h in hs]
    works = [dev.iallreduce(b, b, "sum") for b in bufs]
    works[0].test()
    after = cp.asarray(values(np.float64, 4, host.rank, salt=9))
    dev.allreduce(after, after, "max")
    for w in works:
        w.wait()
    for i, (h, b) in enumerate(zip(hs, bufs)):
        want = np.empty_like(h)
        host.allreduce(h, want, "sum")
        same(b.get(), want, f"non-blocking all_reduce {i} of 3 in flight")
    want = values(np.float64, 4, host.rank, salt=9)
    host.allreduce(want.copy(), want, "max")
    same(after.get(), want, "blocking all_reduce after non-blocking ones")
    return 4


def case_iallgather_in_flight(cp, host, dev) -> int:
    """Non-blocking all-gathers (stage 3's groups gathered ahead): equal parts on the side
    stream, two in flight with a blocking collective between, and uneven parts at once."""
    n = host.size
    checks = 0
    for counts in ([3] * n, [2 + (r % 2) for r in range(n)]):
        hs = [values(np.float32, counts[host.rank], host.rank, salt=i) for i in range(2)]
        outs = [cp.empty(sum(counts), np.float32) for _ in hs]
        works = [dev.iallgather(cp.asarray(h), o, counts) for h, o in zip(hs, outs)]
        works[0].test()
        between = cp.asarray(values(np.float64, 4, host.rank, salt=7))
        dev.allreduce(between, between, "sum")
        for w in works:
            w.wait()
        for i, (h, o) in enumerate(zip(hs, outs)):
            want = np.empty(sum(counts), np.float32)
            host.allgather(h, want, counts)
            same(o.get(), want, f"non-blocking all_gather {i} of 2, counts {counts}")
            checks += 1
        want = values(np.float64, 4, host.rank, salt=7)
        host.allreduce(want.copy(), want, "sum")
        same(between.get(), want, "blocking all_reduce between non-blocking all-gathers")
        checks += 1
    return checks


def case_allgather(cp, host, dev) -> int:
    checks = 0
    for dtype in MOVE_DTYPES:
        for path, counts in uneven(host.size).items():
            h = values(dtype, counts[host.rank], host.rank)
            want = np.empty(sum(counts), h.dtype)
            host.allgather(h, want, counts)
            recv = cp.empty(sum(counts), h.dtype)
            dev.allgather(cp.asarray(h), recv, counts)
            same(recv.get(), want, f"all_gather {np.dtype(dtype).name} {path} {counts}")
            checks += 1
    return checks


def case_reduce_scatter(cp, host, dev) -> int:
    checks = 0
    for dtype in (np.float64, np.float16, np.int16, np.bool_, np.complex128, np.uint8):
        for op in ("sum", "avg", "max", "min"):
            if op == "avg" and np.dtype(dtype).kind not in "fc":
                continue
            for path, counts in uneven(host.size).items():
                special = op in ("max", "min")
                h = values(dtype, sum(counts), host.rank, special=special)
                want = np.empty(counts[host.rank], h.dtype)
                host.reduce_scatter(h, want, counts, op)
                recv = cp.empty(counts[host.rank], h.dtype)
                dev.reduce_scatter(cp.asarray(h), recv, counts, op)
                what = f"reduce_scatter {np.dtype(dtype).name} {op} {path} {counts}"
                same(recv.get(), want, what)
                checks += 1
    return checks


def case_alltoall(cp, host, dev) -> int:
    """Equal blocks (counts None) and uneven counts, rank i sending (i + 2 j) % 3 items to j."""
    r, size = host.rank, host.size
    checks = 0
    for dtype in MOVE_DTYPES:
        h = values(dtype, 2 * size, r, salt=3)
        want = np.empty_like(h)
        host.alltoall(h, None, want, None)
        recv = cp.empty(h.shape, h.dtype)
        dev.alltoall(cp.asarray(h), None, recv, None)
        same(recv.get(), want, f"all_to_all {np.dtype(dtype).name} equal blocks")
        sc = [(r + 2 * j) % 3 for j in range(size)]
        rc = [(i + 2 * r) % 3 for i in range(size)]
        h = values(dtype, sum(sc), r, salt=4)
        want = np.empty(sum(rc), h.dtype)
        host.alltoall(h, sc, want, rc)
        recv = cp.empty(sum(rc), h.dtype)
        dev.alltoall(cp.asarray(h), sc, recv, rc)
        same(recv.get(), want, f"all_to_all {np.dtype(dtype).name} counts {sc} / {rc}")
        checks += 2
    return checks


def case_broadcast(cp, host, dev) -> int:
    checks = 0
    for root in range(host.size):
        for dtype in MOVE_DTYPES:
            h = values(dtype, 6, host.rank, salt=root)
            want = h.copy()
            host.broadcast(want, root)
            buf = cp.asarray(h)
            dev.broadcast(buf, root)
            same(buf.get(), want, f"broadcast {np.dtype(dtype).name} from {root}")
            checks += 1
    return checks


def case_send_recv(cp, host, dev) -> int:
    """Each rank sends tags 5 and 9 to the next rank and receives them from the previous one,
    posting the receives in the other tag order, plus a message to itself; ``send``/``recv``
    between ranks 0 and 1."""
    r, size = host.rank, host.size
    nxt, prev = (r + 1) % size, (r - 1) % size
    msgs = {t: cp.asarray(np.arange(4.0) + 100 * r + t) for t in (5, 9)}
    got = {t: cp.empty(4, np.float64) for t in (9, 5)}
    works = [dev.irecv(got[t], prev, tag=t) for t in (9, 5)]
    works += [dev.isend(msgs[t], nxt, tag=t) for t in (5, 9)]
    me = cp.empty(3, np.int16)
    works.append(dev.irecv(me, r, tag=3))
    works.append(dev.isend(cp.asarray(np.array([r, 7, -r], np.int16)), r, tag=3))
    for w in works:
        w.wait()
    for t in (5, 9):
        same(got[t].get(), np.arange(4.0) + 100 * prev + t, f"recv tag {t} from {prev}")
    same(me.get(), np.array([r, 7, -r], np.int16), "a message to this rank itself")
    checks = 3
    if size > 1 and r < 2:
        if r == 0:
            dev.send(cp.asarray(np.array([True, False, True])), 1, tag=1)
        else:
            flags = cp.empty(3, np.bool_)
            dev.recv(flags, 0, tag=1)
            same(flags.get(), np.array([True, False, True]), "send/recv of bools")
        checks += 1
    return checks


CASES = [
    case_allreduce,
    case_iallreduce_in_flight,
    case_iallgather_in_flight,
    case_allgather,
    case_reduce_scatter,
    case_alltoall,
    case_broadcast,
    case_send_recv,
]


def run_all(cp, host, dev) -> int:
    """Every case on ``dev`` (and ``host``, the MPI-backed communicator of the same ranks)."""
    return sum(case(cp, host, dev) for case in CASES)


def main(argv: list[str]) -> None:
    """The cases on real GPUs: the world, then the even ranks' sub-group (a cached NCCL
    group of its own); ``--expect-fallback``: every rank must get None from nccl_group."""
    import cupy

    import disttensor as dt
    from disttensor.comm.nccl import nccl_group

    world = dt.comm.world()
    cupy.cuda.Device(world.rank % cupy.cuda.runtime.getDeviceCount()).use()
    dev = nccl_group(world)
    if "--expect-fallback" in argv:
        assert dev is None, "ranks sharing a GPU must fall back to host staging"
        dt.print0(f"fallback on {world.size} ranks sharing a GPU: as expected")
        return
    assert dev is not None, "NCCL could not serve the world (see the log above)"
    checks = run_all(cupy, world, dev)
    if world.size > 2:
        evens = tuple(range(0, world.size, 2))
        if world.rank % 2 == 0:
            sub = dev.group(evens)
            assert sub is dev.group(evens) and sub.backend == "nccl"
            checks += run_all(cupy, world.group(evens), sub)
    cupy.cuda.get_current_stream().synchronize()
    dt.print0(f"nccl cases: {checks} results equal the MPI backend's on {world.size} ranks")


if __name__ == "__main__":
    main(sys.argv[1:])
