"""Reshard vs raw MPI: how close dt.reshard gets to the mpi4py buffer call it wraps.

Run::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/reshard.py
    OMP_NUM_THREADS=1 mpiexec -n 4 python bench/reshard.py --quick   # smoke run, < 20 s
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/reshard.py --plot reshard.png   # also a figure

On a 1-D mesh of all ranks, for float32 tensors of shape (rows, 256) with the given global
sizes, it times four reshards against the raw mpi4py call on the same buffers:

    S->R        Shard(0) -> Replicate    vs  Allgather
    P->R        Partial  -> Replicate    vs  Allreduce(SUM)
    P->S        Partial  -> Shard(0)     vs  Reduce_scatter_block(SUM)
    S0->S1      Shard(0) -> Shard(1)     vs  Alltoall on the local shard as it lies in memory

"raw" allocates its receive buffer with np.empty on every call, as user code would (so does
dt); "raw-pre" reuses one preallocated receive buffer, to show what allocation costs. Raw
S0->S1 sends the contiguous local shard without packing, so it is a lower bound: a real
Shard(0) -> Shard(1) has to gather each destination's columns into one block first. That is
what "raw+pack" does (np.ascontiguousarray of the transposed blocks, then Alltoall): the
hand-written equivalent of the reshard, shown for S0->S1 only.

Times are medians of per-call max-over-ranks times, each call after a barrier, with dt, raw
and raw-pre interleaved in rotating order (see _timing.py). ratio = raw time / dt time, i.e.
dt throughput relative to raw (1.0 = as fast, the goal is >= 0.95 at 4 MiB and above).
GB/s = global tensor bytes / time. ``--plot FILE.png`` also draws GB/s against size, one panel
per op, dt next to raw (and raw+pack), with matplotlib (imported only then).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from _timing import (
    Stats,
    adaptive_iters,
    estimate_call,
    format_table,
    interleaved,
    load_line,
    mpi_library,
)
from mpi4py import MPI

import disttensor as dt

COLS = 256
DTYPE = np.float32
DEFAULT_SIZES = "64K,256K,1M,4M,16M,64M"
QUICK_SIZES = "64K,256K"
OPS = ("S->R", "P->R", "P->S", "S0->S1")
GOAL_RATIO = 0.95
GOAL_FROM = 4 << 20


def parse_size(text: str) -> int:
    """'64K', '4MiB', '1m', '65536' -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?)(i?b)?\s*", text, re.IGNORECASE)
    if m is None:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 64K, 4M, 1G or bytes")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def human(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            v = nbytes / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{nbytes} B"


@dataclass
class Case:
    """The three timed variants of one (size, op), and a check that dt computed the right thing."""

    fns: dict[str, Callable[[], Any]]
    check: Callable[[], None]


def make_case(op: str, rows: int, comm: MPI.Comm, mesh: dt.ProcessMesh) -> Case:
    n, r = comm.Get_size(), comm.Get_rank()
    mine = slice(r * rows // n, (r + 1) * rows // n)  # rows are a multiple of n: even shards
    shape = (rows, COLS)
    # Small integers, so every reduction order gives the same float32 sums.
    full = (np.arange(rows * COLS, dtype=np.int64).reshape(shape) % 251).astype(DTYPE)

    if op.startswith("S"):
        local = np.ascontiguousarray(full[mine])
        x = dt.dtensor_from_local(local, mesh, [dt.Shard(0)], global_shape=shape)
    else:
        local = full + DTYPE(r)  # Partial(sum): the value is n * full + n(n-1)/2
        x = dt.dtensor_from_local(local, mesh, [dt.Partial()], global_shape=shape)
    total = full * DTYPE(n) + DTYPE(n * (n - 1) // 2)

    target: list[dt.Placement]
    extra: dict[str, Callable[[], Any]] = {}
    if op == "S->R":
        target, want = [dt.Replicate()], full
        pre = np.empty(shape, DTYPE)

        def raw() -> np.ndarray:
            out = np.empty(shape, DTYPE)
            comm.Allgather(local, out)
            return out

        def raw_pre() -> np.ndarray:
            comm.Allgather(local, pre)
            return pre

    elif op == "P->R":
        target, want = [dt.Replicate()], total
        pre = np.empty(shape, DTYPE)

        def raw() -> np.ndarray:
            out = np.empty(shape, DTYPE)
            comm.Allreduce(local, out, op=MPI.SUM)
            return out

        def raw_pre() -> np.ndarray:
            comm.Allreduce(local, pre, op=MPI.SUM)
            return pre

    elif op == "P->S":
        target, want = [dt.Shard(0)], total[mine]
        pre = np.empty((rows // n, COLS), DTYPE)

        def raw() -> np.ndarray:
            out = np.empty((rows // n, COLS), DTYPE)
            comm.Reduce_scatter_block(local, out, op=MPI.SUM)
            return out

        def raw_pre() -> np.ndarray:
            comm.Reduce_scatter_block(local, pre, op=MPI.SUM)
            return pre

    elif op == "S0->S1":
        target = [dt.Shard(1)]
        want = full[:, r * COLS // n : (r + 1) * COLS // n] if COLS % n == 0 else None
        flat = local.reshape(-1)
        flat = flat[: flat.size - flat.size % n]  # equal blocks for any n
        pre = np.empty(flat.size, DTYPE)

        def raw() -> np.ndarray:
            out = np.empty(flat.size, DTYPE)
            comm.Alltoall(flat, out)
            return out

        def raw_pre() -> np.ndarray:
            comm.Alltoall(flat, pre)
            return pre

        if COLS % n == 0:
            lr, lc = rows // n, COLS // n

            def raw_pack() -> np.ndarray:
                send = np.ascontiguousarray(local.reshape(lr, n, lc).transpose(1, 0, 2))
                out = np.empty((rows, lc), DTYPE)
                comm.Alltoall(send, out)
                return out

            extra["raw+pack"] = raw_pack

    else:
        raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")

    def dt_call() -> dt.DistTensor:
        return dt.reshard(x, mesh, target)

    def check() -> None:
        got = dt_call()
        wrong = want is not None and not np.array_equal(got.to_local(), want)
        if got.placements != target or wrong:
            raise AssertionError(f"rank {r}: dt.reshard {op} gave a wrong result")
        checked = extra.get("raw+pack", raw) if op == "S0->S1" else raw
        if want is not None and not np.array_equal(checked(), want):
            raise AssertionError(f"rank {r}: raw {op} gave a wrong result")

    return Case({"dt": dt_call, "raw": raw, "raw-pre": raw_pre, **extra}, check)


def rows_for(nbytes: int, n: int) -> int:
    """Rows of a (rows, 256) float32 tensor of about ``nbytes``, a multiple of ``n``."""
    per_row = COLS * np.dtype(DTYPE).itemsize
    return max(n, round(nbytes / per_row / n) * n)


def plot(path: str, points: dict[str, dict[str, list[tuple[int, float]]]], title: str) -> None:
    """Draw GB/s against global size, one panel per op, a line per variant, into ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    ops = list(points)
    cols = 2 if len(ops) > 1 else 1
    rows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows), squeeze=False)
    style = {"dt": ("C0", "-", "o"), "raw": ("C1", "--", "s"), "raw+pack": ("C2", ":", "^")}
    for ax, op in zip(axes.flat, ops):
        for variant, xy in points[op].items():
            color, line, marker = style[variant]
            sizes, rates = zip(*xy)
            ax.plot(sizes, rates, line, color=color, marker=marker,
                    label="dt.reshard" if variant == "dt" else f"{variant} mpi4py")  # fmt: skip
        ax.set_xscale("log", base=2)
        ticks = sorted({s for xy in points[op].values() for s, _ in xy})
        ax.set_xticks(ticks, [human(s) for s in ticks])
        ax.minorticks_off()
        ax.set_title(op)
        ax.set_xlabel("global size")
        ax.set_ylabel("GB/s")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(ops) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=None, help=f"global sizes, comma-separated ({DEFAULT_SIZES})")
    p.add_argument(
        "--ops", default=",".join(OPS), help=f"ops to run, quoted in the shell ('{','.join(OPS)}')"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed calls per variant (default: adaptive, to fit --budget)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=100.0,
        help="seconds of timed calls for the whole run, when --repeats is not given",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per variant first")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: sizes {QUICK_SIZES}, 10 repeats, 2 warm-ups (< 20 s)",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        default=None,
        help="also draw GB/s against size per op, dt next to raw, into FILE.png (matplotlib)",
    )
    args = p.parse_args(argv)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401  (checked before the run, drawn after it)
        except ImportError:
            p.error("--plot needs matplotlib: pip install matplotlib (or disttensor[viz])")
    if args.quick:
        args.sizes = args.sizes or QUICK_SIZES
        args.repeats = args.repeats or 10
        args.warmup = 2
    try:
        sizes = [parse_size(s) for s in (args.sizes or DEFAULT_SIZES).split(",")]
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    ops = [o.strip() for o in args.ops.split(",")]
    if bad := [o for o in ops if o not in OPS]:
        p.error(f"unknown op(s) {bad}; choose from {', '.join(OPS)}")

    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    mesh = dt.init_mesh((n,))
    per_case = args.budget / (len(sizes) * len(ops))
    start = time.perf_counter()
    load_before = os.getloadavg()[0]

    table: list[list[str]] = []
    misses: list[str] = []
    goal_rows = 0
    points: dict[str, dict[str, list[tuple[int, float]]]] = {op: {} for op in ops}
    for nbytes in sizes:
        rows = rows_for(nbytes, n)
        real = rows * COLS * np.dtype(DTYPE).itemsize
        for op in ops:
            case = make_case(op, rows, comm, mesh)
            per_call = estimate_call(comm, case.fns, args.warmup)
            case.check()
            iters = args.repeats or adaptive_iters(per_call, per_case, lo=5, hi=400)
            st: dict[str, Stats] = interleaved(comm, case.fns, iters)
            del case
            t = {k: v.median for k, v in st.items()}
            ratio = t["raw"] / t["dt"]
            pack = t.get("raw+pack")
            for variant in ("dt", "raw", "raw+pack"):
                if variant in t:
                    points[op].setdefault(variant, []).append((real, real / t[variant] / 1e9))
            table.append([
                human(real), op,
                f"{t['dt'] * 1e3:.3f}", f"{t['raw'] * 1e3:.3f}", f"{ratio:.2f}",
                f"{t['raw-pre'] * 1e3:.3f}", f"{t['raw-pre'] / t['dt']:.2f}",
                "-" if pack is None else f"{pack * 1e3:.3f}",
                "-" if pack is None else f"{pack / t['dt']:.2f}",
                f"{real / t['dt'] / 1e9:.2f}", f"{real / t['raw'] / 1e9:.2f}",
                str(len(st["dt"].times)),
                f"{max(st['dt'].spread, st['raw'].spread) * 100:.0f}%",
            ])  # fmt: skip
            if real >= GOAL_FROM:
                goal_rows += 1
                if ratio < GOAL_RATIO:
                    misses.append(f"{human(real)} {op} ({ratio:.2f})")

    if rank == 0:
        print(
            f"disttensor reshard vs raw mpi4py: {n} ranks, mesh ({n},), {os.cpu_count()} cores, "
            f"float32 (rows, {COLS}); {mpi_library()}, "
            f"mpi4py {sys.modules['mpi4py'].__version__}, numpy {np.__version__}"
        )
        print(
            "times: median over calls of the per-call max over ranks; ratio = raw / dt "
            "(dt throughput relative to raw); IQR = larger of dt's and raw's, relative\n"
        )
        headers = ["size", "op", "dt ms", "raw ms", "ratio", "raw-pre ms", "ratio-pre",
                   "raw+pack ms", "ratio-pack", "dt GB/s", "raw GB/s", "calls", "IQR"]  # fmt: skip
        print(format_table(headers, table))
        if goal_rows:
            verdict = f"NOT met for {', '.join(misses)}" if misses else "met"
            print(f"\ngoal ratio >= {GOAL_RATIO} at >= {human(GOAL_FROM)}: {verdict}")
        print(load_line(start, load_before))
        if args.plot is not None:
            title = (
                f"dt.reshard vs raw mpi4py, {n} ranks, float32 (rows, {COLS}); "
                f"{' '.join(mpi_library().split())}, {os.cpu_count()} cores"
            )
            plot(args.plot, points, title)
            print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
