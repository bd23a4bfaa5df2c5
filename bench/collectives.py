"""A small collective through dt against raw mpi4py: what the comm layer and the agreement
check cost per call.

Run::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/collectives.py
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/collectives.py --quick          # smoke run
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/collectives.py --alternatives   # the designs

An all-reduce (sum) of 8 float32 on every rank (``--count``: another size), on a 1-D mesh of
all ranks, five ways:

    raw             MPI.COMM_WORLD.Allreduce(send, out)            (mpi4py, preallocated out)
    comm            dt.comm.world().allreduce(send, out)           (the Communicator)
    comm, no check  the same with the agreement check off          (DISTTENSOR_CHECK=0)
    reshard         dt.reshard(x, mesh, [Replicate()]), x a new Partial tensor each call
    reshard, no check

``--alternatives`` adds raw mpi4py versions of the ways an agreement check can travel
(Note [The check rides along] in disttensor/comm/agree.py), each with the work it needs
around the MPI calls, written as lean as the library's own:

    check+data      a 16-byte MAX all-reduce of (f, -f) on a duplicate communicator, then
                    the data all-reduce (the check before issue 23)
    icheck+data     that check started non-blocking, the data all-reduce, then its wait
    folded          data and 16 check elements in one all-reduce (copies in and out): the
                    fingerprint in 8-bit pieces and their squares, whose sums equal the
                    rank's own times the ranks on every rank only where all are equal
    envelope        one all-gather of a slot per rank (fingerprint, size, data; 1024 bytes
                    on 2 ranks, as the library's), the fingerprints compared and the sum
                    taken from the slots

Each variant runs in batches of ``--calls`` back-to-back calls; a batch starts after a barrier
and its time is the max over ranks (bench/_timing.py). The variants are interleaved in rotating
order, and the number shown is the median per-call time over the batches, with the IQR
relative to it. ratio = variant / raw (the goal for "reshard": at most 2).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _timing import format_table, interleaved, load_line, mpi_library
from mpi4py import MPI

import disttensor as dt
from disttensor import comm as dtcomm
from disttensor.comm import agree
from disttensor.tensor import DistTensor

DTYPE = np.float32
GOAL = 2.0


def batch(fn: Callable[[], Any], calls: int, check: bool) -> Callable[[], None]:
    """``calls`` calls of ``fn`` with the agreement check on or off (a process-wide setting
    that every rank makes alike)."""

    def run() -> None:
        agree.set_checks(check)
        for _ in range(calls):
            fn()
        agree.set_checks(True)

    return run


def variants(comm: MPI.Comm, mesh: dt.ProcessMesh, count: int, calls: int, alternatives: bool):
    """{name: batch function}, and a check that every variant computes the sum."""
    n, rank = comm.Get_size(), comm.Get_rank()
    values = np.arange(count) % 251  # small integers: every order of summing is exact
    send = (values + rank).astype(DTYPE)
    out = np.empty(count, DTYPE)
    want = (values * n + n * (n - 1) // 2).astype(DTYPE)
    w = dtcomm.world()
    x = dt.dtensor_from_local(send.copy(), mesh, [dt.Partial()], global_shape=(count,))
    replicate = [dt.Replicate()]

    def raw() -> None:
        comm.Allreduce(send, out, MPI.SUM)

    def through_comm() -> None:
        w.allreduce(send, out, "sum")

    def through_reshard() -> dt.DistTensor:
        # a new Partial tensor each call, as an iteration makes one (p @ q): the same tensor
        # would be reduced once and then reused (Note [One move per tensor] in tensor.py)
        return dt.reshard(DistTensor(x._local, x._spec), mesh, replicate)

    fns = {
        "raw": batch(raw, calls, True),
        "comm": batch(through_comm, calls, True),
        "comm, no check": batch(through_comm, calls, False),
        "reshard": batch(through_reshard, calls, True),
        "reshard, no check": batch(through_reshard, calls, False),
    }
    checks: list[Callable[[], np.ndarray]] = [
        lambda: (raw(), out.copy())[1],
        lambda: (through_comm(), out.copy())[1],
        lambda: through_reshard().to_local(),
    ]
    if alternatives:
        alt, alt_checks = _alternatives(comm, send, out, count)
        fns.update({k: batch(f, calls, True) for k, f in alt.items()})
        checks += alt_checks

    def check() -> None:
        for i, got in enumerate(c() for c in checks):
            if not np.array_equal(got, want):
                raise AssertionError(f"rank {rank}: variant {i} summed to {got}, not {want}")

    return fns, check


def _alternatives(comm: MPI.Comm, send: np.ndarray, out: np.ndarray, count: int):
    """Raw mpi4py forms of the ways the agreement check can travel, each with its own work
    around the MPI calls (module doc)."""
    from disttensor.comm.mpi import HEAD, room

    n = comm.Get_size()
    dup = comm.Dup()
    fp = 0x1234_5678_9ABC
    pair = np.empty(2, np.int64)
    pieces = np.array([(fp >> (8 * i)) & 0xFF for i in range(8)], DTYPE)
    extra = np.concatenate([pieces, pieces * pieces])  # exact in float32, summed too
    wide = np.zeros(count + extra.size, DTYPE)
    wide[count:] = extra
    wide_out = np.empty_like(wide)
    summed = (extra * n).tolist()
    slot = HEAD + max(room(n), send.nbytes)  # a large count rides too: the design's floor
    mine = np.zeros(slot, np.uint8)
    head = mine[:HEAD].view(np.int64)
    payload = mine[HEAD : HEAD + send.nbytes].view(DTYPE)
    every = np.empty((n, slot), np.uint8)
    heads = every[:, :HEAD].view(np.int64)
    rows = list(every[:, HEAD : HEAD + send.nbytes].view(DTYPE))

    def check_then_data() -> None:
        pair[0], pair[1] = fp, -fp
        dup.Allreduce(MPI.IN_PLACE, pair, MPI.MAX)
        hi, lo = pair.tolist()
        if hi != -lo:
            raise AssertionError("fingerprints differ")
        comm.Allreduce(send, out, MPI.SUM)

    def icheck_data() -> None:
        pair[0], pair[1] = fp, -fp
        req = dup.Iallreduce(MPI.IN_PLACE, pair, MPI.MAX)
        comm.Allreduce(send, out, MPI.SUM)
        req.Wait()
        hi, lo = pair.tolist()
        if hi != -lo:
            raise AssertionError("fingerprints differ")

    def folded() -> None:
        wide[:count] = send
        comm.Allreduce(wide, wide_out, MPI.SUM)
        if wide_out[count:].tolist() != summed:
            raise AssertionError("fingerprints differ")
        out[...] = wide_out[:count]

    def envelope() -> None:
        head[0], head[1] = fp, send.nbytes
        payload[...] = send
        comm.Allgather(mine, every)
        for f, _ in heads.tolist():
            if f != fp:
                raise AssertionError("fingerprints differ")
        np.add(rows[0], rows[1], out=out)
        for r in rows[2:]:
            np.add(out, r, out=out)

    fns = {
        "check+data": check_then_data,
        "icheck+data": icheck_data,
        "folded": folded,
        "envelope": envelope,
    }
    return fns, [(lambda f=f: (f(), out.copy())[1]) for f in fns.values()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=8, help="float32 elements per rank (8)")
    p.add_argument("--calls", type=int, default=100, help="back-to-back calls per batch")
    p.add_argument("--batches", type=int, default=200, help="timed batches per variant")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches per variant first")
    p.add_argument("--alternatives", action="store_true", help="also time the check's designs")
    p.add_argument("--quick", action="store_true", help="smoke run: 10 calls x 10 batches")
    args = p.parse_args(argv)
    if args.quick:
        args.calls, args.batches, args.warmup = 10, 10, 1

    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    mesh = dt.init_mesh((n,))
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    fns, check = variants(comm, mesh, args.count, args.calls, args.alternatives)
    check()
    for _ in range(args.warmup):
        for fn in fns.values():
            fn()
    stats = interleaved(comm, fns, args.batches, rounds=min(20, args.batches))
    check()  # still right after every timed call
    if rank == 0:
        raw = stats["raw"].median
        rows = [
            [k, f"{s.median / args.calls * 1e6:.2f}", f"{s.median / raw:.2f}",
             f"{s.spread * 100:.0f}%"]
            for k, s in stats.items()
        ]  # fmt: skip
        print(
            f"{args.count}-element {np.dtype(DTYPE).name} all-reduce (sum), {n} ranks, "
            f"{os.cpu_count()} cores; {mpi_library()}, mpi4py "
            f"{sys.modules['mpi4py'].__version__}, numpy {np.__version__}"
        )
        print(
            f"per call: median over {args.batches} batches of {args.calls} back-to-back calls "
            "(max over ranks); ratio = variant / raw\n"
        )
        print(format_table(["variant", "us/call", "ratio", "IQR"], rows))
        ratio = stats["reshard"].median / raw
        verdict = "met" if ratio <= GOAL else "NOT met"
        print(f"\ngoal reshard (check on) <= {GOAL:g} x raw: {verdict} ({ratio:.2f})")
        print(load_line(start, load_before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
