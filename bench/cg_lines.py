"""Where an iteration of a small conjugate gradient goes: each line of the textbook iteration
timed in place, three ways.

Run::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/cg_lines.py             # 61 unknowns
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/cg_lines.py --n 256
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/cg_lines.py --quick     # smoke run

The iteration (demos/numpy_algorithms.py's ``cg_step``, its SPD matrix of ``--n`` unknowns
split by rows, every vector split like them)::

    Ap = A @ p;  d = p @ Ap;  alpha = rs / d;  x = x + alpha * p;  r = r - alpha * Ap
    rs_new = r @ r;  p = r + (rs_new / rs) * p;  rs = rs_new

    dt        the lines as written, on DistTensors (Shard(0); ``A @ p`` gathers p, the dot
              products are Partial scalars reduced where a division needs them)
    no ops    the same kernels on this rank's local arrays and dt's own Communicator
              (``dt.comm.world()``: its ``allgather`` of p and two ``allreduce`` of a
              scalar, each with the agreement check): dt's collectives without its ops
    hand      raw mpi4py, as demos/_handwritten_mpi.py writes it (``Allgatherv`` of p, two
              ``Allreduce`` of a scalar, the updates in place on Python floats)

Each variant runs ``--rounds`` times ``--steps`` iterations from the same start, the rounds
interleaved; every iteration starts after a barrier, each line's time is the max over the
ranks, and the figure is the median over the iterations (the first of each round left out).
Before timing, each variant's x after ``--steps`` iterations is checked against numpy's CG on
one process (relative 1e-10). A failed check exits 1 on every rank.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from _timing import format_table, load_line, mpi_library
from mpi4py import MPI

import disttensor as dt
from disttensor import comm as dtcomm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "demos"))
from numpy_algorithms import cg_inputs, cg_start, cg_step

LINES = (
    "Ap = A @ p",
    "d = p @ Ap",
    "alpha = rs / d",
    "x = x + alpha * p",
    "r = r - alpha * Ap",
    "rs_new = r @ r",
    "p = r + (rs_new / rs) * p",
)
pc = time.perf_counter_ns


def numpy_cg(A: np.ndarray, b: np.ndarray, steps: int) -> np.ndarray:
    """x after ``steps`` iterations of the demo's own cg, on numpy arrays in one process."""
    x = np.zeros_like(b)
    state = {"A": A, "x": x, **cg_start(A, b, x)}
    for _ in range(steps):
        state.update(cg_step(**state))
    return state["x"]


def split(n: int, size: int) -> list[int]:
    """numpy.array_split's sizes: the split dt's Shard(0) makes."""
    return [n // size + (r < n % size) for r in range(size)]


def run_dt(comm, A, b, steps: int, T: np.ndarray | None) -> np.ndarray:
    x, r = b * 0.0, b.copy()
    p, rs = r.copy(), r @ r
    for it in range(steps):
        if T is not None:
            comm.Barrier()
        t0 = pc()
        Ap = A @ p
        t1 = pc()
        d = p @ Ap
        t2 = pc()
        alpha = rs / d
        t3 = pc()
        x = x + alpha * p
        t4 = pc()
        r = r - alpha * Ap
        t5 = pc()
        rs_new = r @ r
        t6 = pc()
        p = r + (rs_new / rs) * p
        t7 = pc()
        rs = rs_new
        if T is not None:
            T[it] = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6)
    return x.numpy()


def run_no_ops(comm, A, b, steps: int, T: np.ndarray | None) -> np.ndarray:
    w = dtcomm.world()
    n = len(b)
    counts = split(n, comm.size)
    lo = sum(counts[: comm.rank])
    A, r = A[lo : lo + counts[comm.rank]], b[lo : lo + counts[comm.rank]].copy()
    x, p, full = np.zeros_like(r), r.copy(), np.empty(n)
    rs = w.allreduce(np.asarray(r @ r), None, "sum")
    for it in range(steps):
        if T is not None:
            comm.Barrier()
        t0 = pc()
        w.allgather(p, full, counts)
        Ap = A @ full
        t1 = pc()
        d = w.allreduce(np.asarray(p @ Ap), None, "sum")
        t2 = pc()
        alpha = rs / d
        t3 = pc()
        x = x + alpha * p
        t4 = pc()
        r = r - alpha * Ap
        t5 = pc()
        rs_new = w.allreduce(np.asarray(r @ r), None, "sum")
        t6 = pc()
        p = r + (rs_new / rs) * p
        t7 = pc()
        rs = rs_new
        if T is not None:
            T[it] = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6)
    w.allgather(x, full, counts)
    return full.copy()


def run_hand(comm, A, b, steps: int, T: np.ndarray | None) -> np.ndarray:
    n = len(b)
    counts = split(n, comm.size)
    lo = sum(counts[: comm.rank])
    A, r = A[lo : lo + counts[comm.rank]], b[lo : lo + counts[comm.rank]].copy()
    x, p, full = np.zeros_like(r), r.copy(), np.empty(n)
    gather = [full, counts]
    rs = np.array([r @ r])
    comm.Allreduce(MPI.IN_PLACE, rs)
    for it in range(steps):
        if T is not None:
            comm.Barrier()
        t0 = pc()
        comm.Allgatherv(p, gather)
        Ap = A @ full
        t1 = pc()
        d = np.array([p @ Ap])
        comm.Allreduce(MPI.IN_PLACE, d)
        t2 = pc()
        alpha = rs[0] / d[0]
        t3 = pc()
        x += alpha * p
        t4 = pc()
        r -= alpha * Ap
        t5 = pc()
        rs_new = np.array([r @ r])
        comm.Allreduce(MPI.IN_PLACE, rs_new)
        t6 = pc()
        p = r + (rs_new[0] / rs[0]) * p
        t7 = pc()
        rs = rs_new
        if T is not None:
            T[it] = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6)
    comm.Allgatherv(x, gather)
    return full.copy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=61, help="unknowns (default 61)")
    ap.add_argument("--steps", type=int, default=20, help="iterations per round (default 20)")
    ap.add_argument("--rounds", type=int, default=100, help="rounds of each variant (default 100)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds of 5 steps")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.rounds = 5, 2
    comm = MPI.COMM_WORLD
    start, load = time.perf_counter(), os.getloadavg()[0]
    mesh = dt.init_mesh((comm.size,), dim_names=["x"])
    inputs = cg_inputs(args.n)
    A_np, b_np = inputs["A"], inputs["b"]
    A = dt.shard_tensor(A_np, mesh, [dt.Shard(0)])
    b = dt.shard_tensor(b_np, mesh, [dt.Shard(0)])
    variants = {
        "dt": lambda T: run_dt(comm, A, b, args.steps, T),
        "no ops": lambda T: run_no_ops(comm, A_np, b_np, args.steps, T),
        "hand": lambda T: run_hand(comm, A_np, b_np, args.steps, T),
    }

    want = numpy_cg(A_np, b_np, args.steps)
    bad = []
    for name, fn in variants.items():
        got = fn(None)
        if not np.allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max()):
            bad.append(name)
    made = []
    for steps in (2, 3):  # each run from the start: the difference is the third iteration's
        with dt.CommCounter() as cc:
            run_dt(comm, A, b, steps, None)
        made.append(cc.total)
    collectives = made[1] - made[0]
    if comm.allreduce(len(bad), op=MPI.MAX):
        if comm.rank == 0:
            print(f"FAILED: {bad} differ from numpy's CG after {args.steps} iterations")
        return 1

    samples: dict[str, list[np.ndarray]] = {k: [] for k in variants}
    names = list(variants)
    for rnd in range(args.rounds):
        for k in names[rnd % 3 :] + names[: rnd % 3]:
            T = np.zeros((args.steps, len(LINES)))
            variants[k](T)
            comm.Allreduce(MPI.IN_PLACE, T, op=MPI.MAX)
            samples[k].append(T[1:] / 1000)  # us; the round's first iteration left out
    med = {k: np.median(np.concatenate(v), axis=0) for k, v in samples.items()}
    total = {k: float(np.median(np.concatenate(v).sum(axis=1))) for k, v in samples.items()}
    if comm.rank == 0:
        print(
            f"cg of {args.n} unknowns on {comm.size} rank(s), {mpi_library()}; {args.rounds} "
            f"rounds of {args.steps} iterations each, every iteration after a barrier; us per "
            "line: the median over the iterations of the max over ranks"
        )
        rows = [[line, *(f"{med[k][i]:.2f}" for k in names)] for i, line in enumerate(LINES)]
        rows.append(["iteration", *(f"{total[k]:.2f}" for k in names)])
        rows.append(["ratio to hand", *(f"{total[k] / total['hand']:.2f}" for k in names)])
        print()
        print(format_table(["line", *names], rows))
        hand = 3 if comm.size > 1 else 0  # on one rank MPI moves nothing (and dt calls nothing)
        print(f"\ncollectives per iteration: dt {collectives} (its third), hand-written {hand}")
        print(load_line(start, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
