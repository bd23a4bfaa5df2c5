"""The machinery of the bad-input and fault table (rows in tests/fault_cases.py and
tests/fault_ranks.py): misuse must end clearly, the same on every rank, and never hang.

Each row is a small SPMD program, called with the world size on every rank, and runs the same
way on simulated ranks (tests/test_faults.py, in process) and under mpiexec (one launch per
world size runs every row in sequence and prints one verdict line per row):

* ``raises`` rows: every rank raises the exception type with a message holding the fragments
  (and none of the ``absent`` ones). Then the runner checks that the ranks are still in step:
  it gathers every rank's outcome and moves a tensor between all of them.
* ``like_numpy`` rows: edge values (NaN, inf, ties, -0.0) give exactly numpy's result, dtype,
  shape and signs included; under MPI the MPI library does the combining.
* ``ends_job`` programs end the whole job (``sys.exit``, ``SystemExit``, a rank that leaves
  early, an uncaught error, a skipped point-to-point transfer): one launch each; the exit code,
  the rank the output names and the time to the end are checked.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import disttensor as dt
from disttensor import comm

S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
NAN, INF = np.nan, np.inf

Fragment = str | Callable[[int], str]  # a text, or one that depends on the world size


@dataclass(frozen=True)
class Row:
    """One row: ``fn(world)`` runs on every rank. ``exc`` None: a like_numpy row, whose
    ``fn`` returns (label, got, want) triples. ``xfail``: a known library bug (the reason);
    the row is expected to fail until it is fixed."""

    name: str
    fn: Callable[[int], Any]
    exc: type[BaseException] | None = None
    says: tuple[Fragment, ...] = ()
    absent: tuple[Fragment, ...] = ()
    xfail: str = ""


ROWS: list[Row] = []


def raises(exc: type[BaseException], *says: Fragment, absent=(), xfail: str = ""):
    """Decorator: a row whose every rank must raise ``exc`` saying each of ``says``."""

    def deco(fn):
        ROWS.append(Row(fn.__name__, fn, exc, says, tuple(absent), xfail))
        return fn

    return deco


def like_numpy(fn):
    """Decorator: a row returning (label, got, want) triples that must match exactly."""
    ROWS.append(Row(fn.__name__, fn))
    return fn


# -- running a row ----------------------------------------------------------------------------
def run_row(row: Row, world: int) -> tuple[str, str, bool]:
    """Run ``row`` on this rank and judge every rank's outcome (collective over the world):
    (verdict "PASS" or "FAIL", why, whether the ranks are still in step)."""
    dt.manual_seed(0)  # rows that reseed must not change the draws of later rows
    mine = _outcome(row, world)
    try:
        everyone = comm.world().allgather_object((row.name, mine))
        _still_moves(world)
    except Exception as e:
        return "FAIL", f"ranks out of step after the row: {type(e).__name__}: {e}", False
    if {name for name, _ in everyone} != {row.name}:
        return "FAIL", f"ranks out of step: they finished rows {[n for n, _ in everyone]}", False
    bad = [f"rank {r}: {o}" for r, (_, o) in enumerate(everyone) if o != "ok"]
    return ("FAIL", "; ".join(bad), True) if bad else ("PASS", "", True)


def _outcome(row: Row, world: int) -> str:
    """This rank's outcome: "ok", or what went otherwise."""
    try:
        with np.errstate(all="ignore"):
            got = row.fn(world)
            if row.exc is None:
                return _same_as_numpy(got)
    except Exception as e:
        if row.exc is None or not isinstance(e, row.exc):
            return f"raised {type(e).__name__}: {e}"
        text = str(e)
        missing = [f for f in (_text(f, world) for f in row.says) if f not in text]
        present = [f for f in (_text(f, world) for f in row.absent) if f in text]
        if missing or present:
            return f"{type(e).__name__}: {text!r} lacks {missing} or has {present}"
        return "ok"
    return f"raised nothing, {row.exc.__name__} expected (returned {got!r:.80})"


def _text(fragment: Fragment, world: int) -> str:
    return fragment(world) if callable(fragment) else fragment


def _same_as_numpy(triples) -> str:
    """ "ok" when each (label, got, want) has numpy's shape, dtype, values, NaNs and signs,
    else what differs; DistTensors are gathered (collective: every rank has the same list)."""
    wrong = []
    for label, got, want in triples:
        got = got.numpy() if isinstance(got, dt.DistTensor) else np.asarray(got)
        want = np.asarray(want)
        if (got.shape, got.dtype) != (want.shape, want.dtype):
            wrong.append(f"{label}: {got.dtype}{got.shape}, numpy {want.dtype}{want.shape}")
        elif not np.array_equal(got, want, equal_nan=want.dtype.kind in "fc") or (
            want.dtype.kind == "f" and not np.array_equal(np.signbit(got), np.signbit(want))
        ):
            wrong.append(f"{label}: {got.tolist()}, numpy {want.tolist()}")
    return "; ".join(wrong) or "ok"


def _still_moves(world: int) -> None:
    """A tensor resharded over every rank and a reduction come back right: no rank is left
    behind in a collective, no stale message is waiting to be matched."""
    g = np.arange(2.0 * world)
    x = dt.shard_tensor(g, dt.init_mesh((world,)), [S0])
    if not np.array_equal(x.numpy(), g) or float(x.sum()) != g.sum():
        raise RuntimeError("a tensor moved between the ranks came back wrong")


# -- helpers of the rows ----------------------------------------------------------------------
def mesh(world: int) -> dt.ProcessMesh:
    """Every rank of the world in one mesh dim, "dp"."""
    return dt.init_mesh((world,), dim_names=["dp"])


def xs(world: int) -> dt.DistTensor:
    """arange(2 * world) split over every rank, two items each."""
    return dt.shard_tensor(np.arange(2.0 * world), mesh(world), [S0])


def rank() -> int:
    """This rank (rows branch on it to diverge)."""
    return dt.get_rank()


def early(call: Callable[[], Any]) -> Any:
    """``call()``, whose error must come before any communication: the error it raises, or
    an AssertionError when it communicated (or checked with the other ranks) first."""
    with dt.CommCounter() as cc:
        try:
            return call()
        except Exception as e:
            if cc.total or cc.checks:
                raise AssertionError(f"communicated {cc.counts} before raising {e!r}") from e
            raise


def param(world: int, placements=(R,), shape=(4,)) -> dt.DistTensor:
    """A parameter of ones on ``mesh(world)``."""
    return dt.nn.Parameter(dt.ones(shape, mesh=mesh(world), placements=list(placements)))


# -- programs that end the whole job -----------------------------------------------------------
@dataclass(frozen=True)
class Exit:
    """A program ending the job; ``code`` None: any non-zero exit code."""

    name: str
    fn: Callable[[int], None]
    code: int | None
    says: tuple[str, ...]
    absent: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    world: int = 3


EXITS: list[Exit] = []
ABORTS = ("unreachable",)  # printed by a rank that got past the point where it must stop


def ends_job(code: int | None, *says: str, absent=(), env=None):
    """Decorator: a job-ending program and what its launch must show."""

    def deco(fn):
        EXITS.append(Exit(fn.__name__, fn, code, says, (*ABORTS, *absent), env or {}))
        return fn

    return deco


# -- the entry point under mpiexec (tests/fault_cases.py calls it) -------------------------------
def main(argv: list[str]) -> None:
    world = dt.get_world_size()
    if argv[:1] == ["exit"]:
        (job,) = [e for e in EXITS if e.name == argv[1]]
        job.fn(world)
        return
    passed = 0
    for row in ROWS:
        t = time.perf_counter()
        verdict, why, in_step = run_row(row, world)
        passed += verdict == "PASS"
        if rank() == 0:
            ms = 1000 * (time.perf_counter() - t)
            print(f"ROW {row.name} {verdict} {ms:.0f} ms {why!r}", flush=True)
        if not in_step:  # later rows would only report the same breakage
            sys.exit(1)
    if rank() == 0:
        print(f"TABLE {len(ROWS)} rows on {world} ranks, {passed} passed", flush=True)
