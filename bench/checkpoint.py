"""Checkpoint throughput: dt.save and dt.load next to raw numpy file I/O of the same bytes.

Run::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/checkpoint.py
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/checkpoint.py --quick   # smoke run, < 20 s

The state is float32, 8 tensors of shape (rows, 4096) split by rows over a 1-D mesh of all
ranks (each rank holds 1/n of every tensor), of 64 MiB and 256 MiB in total. Variants, each
timed as the max over ranks of one call after a barrier, interleaved in rotating order
(_timing.py), medians over the repeats:

    raw save     every rank np.save()s its shards, one file each, and fsyncs them
    dt.save      the checkpoint: the same bytes as .npy, tile checksums, metadata, fsyncs,
                 the atomic commit (which also deletes the checkpoint it replaces)
    raw load     every rank np.load()s its own files
    dt.load      into the saved layout (each rank reads its own pieces, checksums verified)
    dt.load T    into Shard(1): each rank reads a column strip of every piece

Loads run twice: "warm" (the files in the page cache, as right after a save) and "cold"
(the files' pages dropped with posix_fadvise(DONTNEED) before each call, so they come from
the disk). MB/s = total state bytes / time (10^6 bytes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from _timing import format_table, interleaved, load_line, mpi_library
from mpi4py import MPI

import disttensor as dt

COLS = 4096
TENSORS = 8


def evict(directory: str) -> None:
    """Drop the page-cache pages of every file under ``directory`` (they are clean: fsynced)."""
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def case(comm: MPI.Comm, directory: str, mib: int, repeats: int) -> list[list[str]]:
    rank, n = comm.Get_rank(), comm.Get_size()
    mesh = dt.init_mesh((n,))
    rows = max(n, (mib << 20) // (TENSORS * COLS * 4))
    state = {
        f"w{i}": dt.rand((rows, COLS), np.float32, seed=i, mesh=mesh, placements=[dt.Shard(0)])
        for i in range(TENSORS)
    }
    total = TENSORS * rows * COLS * 4
    path = os.path.join(directory, f"ckpt{mib}")
    raw_dir = os.path.join(directory, f"raw{mib}-{rank}")
    os.makedirs(raw_dir, exist_ok=True)
    same = {k: dt.zeros_like(v) for k, v in state.items()}
    other = {
        k: dt.zeros((rows, COLS), np.float32, mesh=mesh, placements=[dt.Shard(1)]) for k in state
    }

    def raw_save() -> None:
        for k, v in state.items():
            with open(os.path.join(raw_dir, f"{k}.npy"), "wb") as f:
                np.save(f, v.to_local())
                f.flush()
                os.fsync(f.fileno())

    def raw_load() -> list[np.ndarray]:
        return [np.load(os.path.join(raw_dir, f"{k}.npy")) for k in state]

    raw_save()
    dt.save(state, path)  # one untimed round, and a check of the values
    for k, v in dt.load(same, path).items():
        assert np.array_equal(v.to_local(), state[k].to_local()), f"rank {rank}: {k} differs"

    def cold() -> None:
        evict(path)
        evict(raw_dir)
        comm.Barrier()

    fns = {
        "raw save": raw_save,
        "dt.save": lambda: dt.save(state, path),
        "raw load warm": raw_load,
        "dt.load warm": lambda: dt.load(same, path),
        "dt.load T warm": lambda: dt.load(other, path),
        "raw load cold": raw_load,
        "dt.load cold": lambda: dt.load(same, path),
        "dt.load T cold": lambda: dt.load(other, path),
    }
    befores = {k: cold for k in fns if k.endswith("cold")}
    stats = interleaved(comm, fns, repeats, rounds=repeats, befores=befores)
    shutil.rmtree(raw_dir, ignore_errors=True)
    rows_out = []
    for k, s in stats.items():
        base = stats["raw save" if "save" in k else "raw load " + k.split()[-1]]
        rows_out.append(
            [
                f"{mib} MiB",
                k,
                f"{s.median * 1e3:.0f}",
                f"{total / s.median / 1e6:.0f}",
                f"{base.median / s.median:.2f}",
                f"{s.spread:.2f}",
            ]
        )
    return rows_out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64,256", help="total state sizes in MiB (64,256)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--dir", default=None, help="where to write (default: the temp directory)")
    p.add_argument("--quick", action="store_true", help="4 and 16 MiB, 2 repeats")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.repeats = "4,16", 2
    comm = MPI.COMM_WORLD
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    directory = tempfile.mkdtemp(prefix="dt-ckpt-bench-", dir=args.dir) if comm.rank == 0 else None
    directory = comm.bcast(directory)
    try:
        rows = []
        for mib in (int(s) for s in args.sizes.split(",")):
            rows += case(comm, directory, mib, args.repeats)
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
    if comm.rank == 0:
        print(f"dt.save / dt.load on {comm.size} ranks, {mpi_library()}; files in {directory}")
        print(f"float32 state: {TENSORS} tensors (rows, {COLS}) split by rows over all ranks")
        headers = ["size", "variant", "ms", "MB/s", "vs raw", "spread"]
        print(format_table(headers, rows))
        print("vs raw: raw time / this time (raw save for saves, raw load of the same cache")
        print("state for loads); spread: inter-quartile range / median")
        print(load_line(start, load_before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
