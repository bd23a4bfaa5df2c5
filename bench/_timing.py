"""Timing helpers shared by the bench/ scripts that run under ``mpiexec``.

Method (the same for every variant of a comparison, so the ratio is fair):

* every timed call starts right after a barrier, and its time is the max over ranks of
  that one call (an element-wise MAX all-reduce of the per-call times, done after the block);
* the variants are interleaved in rounds, with the order rotated each round, so drift and
  noise on a shared machine hit all of them alike;
* the result of a call is dropped only after the clock stops, so freeing it is not timed;
* the reported number is the median over all timed calls, with the quartiles as spread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI


@dataclass(frozen=True)
class Stats:
    """Per-call times in seconds, already max over ranks."""

    times: np.ndarray

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def spread(self) -> float:
        """Inter-quartile range relative to the median."""
        return spread(self.times)


def mpi_library() -> str:
    """The first line of the MPI library's version (Open MPI's ends in a NUL byte)."""
    return MPI.Get_library_version().rstrip("\x00").splitlines()[0].strip()


def spread(times: np.ndarray) -> float:
    """Inter-quartile range of ``times`` relative to their median."""
    q1, q3 = np.percentile(times, [25, 75])
    return float((q3 - q1) / np.median(times))


def load_line(start: float, load_before: float) -> str:
    """The closing line of a benchmark: wall time and the 1-minute load before and after."""
    return (
        f"total {time.perf_counter() - start:.1f} s; 1-min load average "
        f"{load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )


def timed_block(
    comm: MPI.Comm, fn: Callable[[], Any], n: int, before: Callable[[], Any] | None = None
) -> np.ndarray:
    """``n`` times of ``fn()``, each started after ``before()`` (default: a barrier), max over
    the ranks of ``comm``."""
    before = comm.Barrier if before is None else before
    times = np.empty(n)
    for i in range(n):
        before()
        t0 = time.perf_counter()
        result = fn()
        times[i] = time.perf_counter() - t0
        del result
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return times


def estimate_call(comm: MPI.Comm, fns: Mapping[str, Callable[[], Any]], warmup: int) -> float:
    """Run each variant ``warmup`` times; wall seconds of one call of every variant, barriers
    included, max over ranks (so every rank derives the same repeat count from it)."""
    t0 = time.perf_counter()
    for fn in fns.values():
        timed_block(comm, fn, warmup)
    wall = (time.perf_counter() - t0) / max(warmup, 1)
    return float(comm.allreduce(wall, op=MPI.MAX))


def adaptive_iters(per_call: float, budget_s: float, lo: int, hi: int) -> int:
    """Timed calls per variant so that one case takes about ``budget_s`` seconds."""
    return max(lo, min(hi, int(budget_s / max(per_call, 1e-9))))


def interleaved(
    comm: MPI.Comm,
    fns: Mapping[str, Callable[[], Any]],
    iters: int,
    rounds: int = 8,
    befores: Mapping[str, Callable[[], Any] | None] | None = None,
) -> dict[str, Stats]:
    """``iters`` timed calls of every variant, in ``rounds`` rounds with the order rotated;
    ``befores[k]`` replaces the barrier before each call of variant ``k`` (timed_block)."""
    befores = befores or {}
    rounds = max(1, min(rounds, iters))
    names = list(fns)
    samples: dict[str, list[np.ndarray]] = {k: [] for k in names}
    for r in range(rounds):
        per_round = iters // rounds + (r < iters % rounds)
        order = names[r % len(names) :] + names[: r % len(names)]
        for k in order:
            samples[k].append(timed_block(comm, fns[k], per_round, befores.get(k)))
    return {k: Stats(np.concatenate(v)) for k, v in samples.items()}


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Right-aligned columns, first column left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))])

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])
