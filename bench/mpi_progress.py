"""Does MPI progress a non-blocking all-reduce while Python and numpy compute?

Run (any MPI; 2 ranks, one thread each)::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/mpi_progress.py
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/mpi_progress.py --quick   # smoke run

dt.DataParallel starts each gradient bucket's reduction with ``Iallreduce`` during backward
and waits for it in ``opt.step()``. That hides communication only if the MPI library moves
the collective forward while the rank computes. Some libraries progress a non-blocking
collective only inside MPI calls; DataParallel therefore calls ``MPI_Test`` on the buckets
in flight each time a gradient becomes final. This script measures, with a ``--mb`` MB
float32 buffer and ``--compute-ms`` of numpy work (matrix products, 1 thread):

    reduce     blocking Allreduce alone
    compute    the numpy work alone
    no test    Iallreduce, the work, then Wait
    test       the same, with a Test call after each of the work's chunks (what
               DataParallel does once per final gradient)

and reports per variant ``hidden = (reduce + compute - total) / reduce``: 100 % when the
reduction was completely hidden behind the work, 0 % when it ran after it; and how long the
final ``Wait`` took. A short Wait with no time hidden means MPI did progress the reduction
during the work, but its CPU time (copies and sums through shared memory) was taken from
the work: with every core computing there is nothing to hide it in. Medians of
``--repeats`` rounds, max over ranks per round.
"""

from __future__ import annotations

import argparse
import os
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=32.0)
    p.add_argument("--compute-ms", type=float, default=120.0)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.mb, args.compute_ms, args.repeats = 2.0, 10.0, 2
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    buf = np.ones(int(args.mb * 2**20 / 4), np.float32)
    a = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)

    def chunk() -> None:
        for _ in range(4):
            a @ a

    t0 = time.perf_counter()  # calibrate: chunks for --compute-ms
    for _ in range(20):
        chunk()
    per = (time.perf_counter() - t0) / 20
    chunks = int(comm.allreduce(max(1, round(args.compute_ms / 1e3 / per)), op=MPI.MAX))

    def reduce() -> None:
        comm.Allreduce(MPI.IN_PLACE, buf)

    def compute() -> None:
        for _ in range(chunks):
            chunk()

    waits: dict[bool, list[float]] = {False: [], True: []}

    def overlapped(test: bool) -> None:
        req = comm.Iallreduce(MPI.IN_PLACE, buf)
        for _ in range(chunks):
            chunk()
            if test:
                req.Test()
        t = time.perf_counter()
        req.Wait()
        waits[test].append(time.perf_counter() - t)

    variants = {
        "reduce": reduce,
        "compute": compute,
        "no test": lambda: overlapped(False),
        "test": lambda: overlapped(True),
    }
    times = {k: [] for k in variants}
    for r in range(args.repeats + 1):
        for name, fn in variants.items():
            comm.Barrier()
            t = time.perf_counter()
            fn()
            t = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
            if r:  # round 0 warms up
                times[name].append(t)
            else:
                waits[False].clear(), waits[True].clear()
    med = {k: float(np.median(v)) for k, v in times.items()}
    if rank == 0:
        vendor = MPI.get_vendor()
        print(
            f"{vendor[0]} {'.'.join(map(str, vendor[1]))}, {comm.Get_size()} ranks: "
            f"{args.mb:g} MB float32 Iallreduce against {chunks} chunks of numpy work"
        )
        for name, t in med.items():
            line = f"  {name:8s} {t * 1e3:8.1f} ms"
            if name in ("no test", "test"):
                hidden = (med["reduce"] + med["compute"] - t) / med["reduce"]
                wait = float(np.median(waits[name == "test"]))
                line += (
                    f"   hidden {100 * hidden:5.0f} % of the reduction;"
                    f" Wait after the work {wait * 1e3:6.1f} ms (rank 0)"
                )
            print(line, flush=True)


if __name__ == "__main__":
    main()
