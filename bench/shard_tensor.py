"""What making shard_tensor never silently wrong costs: a checksum of the values, or rank 0's data.

Run::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/shard_tensor.py
    OMP_NUM_THREADS=1 mpiexec -n 4 python bench/shard_tensor.py --quick   # smoke run

``dt.shard_tensor(data, mesh, placements)`` with data that differs by rank (an unseeded random
draw) used to give every rank another "replica" (Note [Replicas agree] in disttensor/tensor.py).
For a 1-D float64 array of each size, on a 1-D mesh of all ranks, Replicate and Shard(0), it
times:

    check=False   shape, dtype and placements agreed (16 bytes): the old default, no values
    default       the same agreement with a crc32 of the values in its key (today's default)
    src=0         rank 0's data: its shape and dtype all-gathered, each shard sent point to
                  point (PyTorch's distribute_tensor takes rank 0's data the same way)
    raw bcast     the floor of taking rank 0's data by hand: MPI Bcast of the whole array
                  (Replicate) or Scatterv of the row blocks (Shard(0)), into fresh buffers
    crc32         zlib.crc32 of the array alone, on each rank (what "default" adds)

Before timing it checks that the default raises RanksDiverged on per-rank data, that
check=False does not, and that src=0 gives rank 0's values everywhere. Times are medians of
per-call max-over-ranks times, each call after a barrier, variants interleaved in rotating
order (_timing.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
from _timing import (  # noqa: E402
    adaptive_iters,
    estimate_call,
    format_table,
    interleaved,
    load_line,
    mpi_library,
)
from mpi4py import MPI  # noqa: E402

import disttensor as dt  # noqa: E402

SIZES = {"1 KiB": 1 << 10, "1 MiB": 1 << 20, "64 MiB": 64 << 20}


def sanity(mesh: dt.ProcessMesh, rank: int) -> None:
    """The behaviours being timed: per-rank data raises by default, not with check=False;
    src=0 gives rank 0's data on every rank."""
    mine = np.full(8, float(rank))
    try:
        dt.shard_tensor(mine, mesh, [dt.Replicate()])
    except dt.RanksDiverged:
        pass
    else:
        sys.exit("sanity: per-rank data did not raise RanksDiverged")
    dt.shard_tensor(mine, mesh, [dt.Replicate()], check=False)
    got = dt.shard_tensor(mine, mesh, [dt.Replicate()], src=0).to_local()
    if not np.array_equal(got, np.zeros(8)):
        sys.exit(f"sanity: src=0 gave {got} on rank {rank}")


def variants(comm: MPI.Comm, mesh: dt.ProcessMesh, g: np.ndarray, shard: bool) -> dict:
    placements = [dt.Shard(0) if shard else dt.Replicate()]
    size, rank = comm.Get_size(), comm.Get_rank()
    counts = [len(b) for b in np.array_split(np.empty(len(g)), size)]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()

    def raw():
        if not shard:
            out = g.copy() if rank == 0 else np.empty_like(g)
            comm.Bcast(out, root=0)
            return out
        out = np.empty(counts[rank], g.dtype)
        send = [g, counts, offsets, MPI.DOUBLE] if rank == 0 else None
        comm.Scatterv(send, out, root=0)
        return out

    return {
        "check=False": lambda: dt.shard_tensor(g, mesh, placements, check=False),
        "default": lambda: dt.shard_tensor(g, mesh, placements),
        "src=0": lambda: dt.shard_tensor(g if rank == 0 else None, mesh, placements, src=0),
        "raw bcast": raw,
        "crc32": lambda: zlib.crc32(g.view(np.uint8)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=4.0, help="seconds per (size, placement)")
    p.add_argument("--quick", action="store_true", help="1 KiB and 1 MiB, a short budget")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    mesh = dt.init_mesh((size,))
    start, load = time.perf_counter(), os.getloadavg()[0]
    sanity(mesh, rank)
    sizes = dict(list(SIZES.items())[:2]) if args.quick else SIZES
    budget = 0.3 if args.quick else args.budget
    rows = []
    for label, nbytes in sizes.items():
        g = np.random.default_rng(0).random(nbytes // 8)  # seeded: the same on every rank
        for shard in (False, True):
            fns = variants(comm, mesh, g, shard)
            per_call = estimate_call(comm, fns, warmup=2)
            iters = adaptive_iters(per_call, budget, lo=8, hi=2000)
            stats = interleaved(comm, fns, iters)
            base = stats["check=False"].median
            cells = [f"{s.median * 1e3:.3f}" for s in stats.values()]
            extra = stats["default"].median - base
            rows.append([label, "S(0)" if shard else "R", *cells, f"{extra * 1e3:+.3f}"])
    if rank == 0:
        print(f"shard_tensor on {size} ranks, float64, {mpi_library()}; ms per call (median)")
        headers = ["size", "placement", *fns, "default - check=False"]
        print(format_table(headers, rows))
        print(load_line(start, load))


if __name__ == "__main__":
    main()
