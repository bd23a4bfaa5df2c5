"""Helpers shared by the training demos: mesh and dtype options, the training loop, the self-check.

Every demo trains a model sharded over the mesh, then trains the same model again on a
one-rank mesh of its own rank (the single-process program, no communication) and compares
losses, gradients and parameters with ``check``.

That check cannot see a bug the two runs share (a wrong local kernel, gradient or optimizer
term), so the hidden option ``--record PATH`` saves the sharded run for a replay in plain
numpy (tests/numpy_models.py, tests/test_demos.py): see ``fit``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable

import numpy as np

import disttensor as dt

# relative agreement a sharded run must reach with the single-process run
TOLERANCE = {"float64": 1e-9, "float32": 1e-5}

# where ``fit`` records the training run it shows (set by the hidden --record option)
_record_path: str | None = None


class _Record(argparse.Action):
    """--record PATH: remember PATH for ``fit`` (every rank parses the same command line)."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        global _record_path
        _record_path = value
        setattr(namespace, self.dest, value)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"needs at least 1, got {n}")
    return n


def options(
    doc: str, steps: int, mesh: bool = True, data_parallel: bool = True
) -> argparse.ArgumentParser:
    """The common command line: --dtype, --steps, (for 2-D demos) --mesh DPxMP, and (for
    demos with a "dp" mesh dim) --dp fused|plain."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--dtype", choices=sorted(TOLERANCE, reverse=True), default="float64")
    p.add_argument("--steps", type=_positive, default=steps, help=f"default {steps}")
    if mesh:
        p.add_argument("--mesh", default=None, help="DPxMP, e.g. 2x2 (default: from the world)")
    if data_parallel:
        p.add_argument(
            "--dp",
            choices=["fused", "plain"],
            default="fused",
            help="fused (default): dt.DataParallel reduces the gradients in buckets during "
            "backward; plain: opt.step() all-reduces the gradients, one all-reduce per group "
            "of mesh dims, after backward",
        )
    # hidden: add 1e-3 to one rank's shard of one parameter, to see the self-check fail
    p.add_argument("--perturb", action="store_true", help=argparse.SUPPRESS)
    # hidden: save the sharded run's training to an .npz for a plain-numpy replay (``fit``)
    p.add_argument("--record", action=_Record, metavar="PATH", help=argparse.SUPPRESS)
    return p


def fail(message: str, code: int = 2) -> None:
    """Exit every rank with ``code``; rank 0 prints ``message`` (every rank must call this)."""
    dt.print0(message, file=sys.stderr)
    raise SystemExit(code)


def mesh_2d(text: str | None) -> dt.ProcessMesh:
    """A (dp, mp) mesh of every rank: ``text`` "DPxMP", or 4 ranks -> 2x2, 2 -> 1x2, 1 -> 1x1
    (mp is 2 when the world size is even)."""
    world = dt.get_world_size()
    if text is None:
        mp = 2 if world % 2 == 0 else 1
        shape = (world // mp, mp)
    else:
        try:
            shape = tuple(int(n) for n in text.lower().split("x"))
        except ValueError:
            shape = ()
        if len(shape) != 2 or min(shape) < 1:
            fail(f"--mesh must look like 2x2 (dp x mp), got {text!r}")
        if shape[0] * shape[1] != world:
            fail(f"--mesh {text} needs {shape[0] * shape[1]} ranks, this run has {world}")
    return dt.init_mesh(shape, dim_names=["dp", "mp"])


def single_mesh() -> dt.ProcessMesh:
    """A mesh of this rank alone: ops on it run the single-process program, no communication."""
    return dt.ProcessMesh([dt.get_rank()])


def progress(step: int, steps: int, loss: float, seconds: float) -> None:
    """The rank-0 line of one training step."""
    width = len(str(steps))
    dt.print0(f"step {step:>{width}}/{steps}  loss {loss:.6f}  {seconds * 1e3:7.1f} ms")


def collectives(**phases: dt.CommCounter) -> str:
    """The counters of one step's phases as "forward 1 all_reduce | backward none | ..."."""

    def one(cc: dt.CommCounter) -> str:
        return ", ".join(f"{n} {kind}" for kind, n in sorted(cc.counts.items())) or "none"

    return " | ".join(f"{phase} {one(cc)}" for phase, cc in phases.items())


class Stopwatch:
    """``with Stopwatch() as t: ...``; ``t.seconds`` afterwards."""

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.start


def data_parallel(model: dt.nn.Module, mesh: dt.ProcessMesh, mode: str):
    """``model`` wrapped in dt.DataParallel over "dp" when ``mode`` is "fused" and the mesh
    has a "dp" dim, else None (the optimizer reduces the gradients together in its step)."""
    if mode != "fused" or "dp" not in mesh.dim_names:
        return None
    return dt.DataParallel(model, mesh, dim="dp")


def describe_buckets(dp, opt) -> str:
    """How the data-parallel gradients were reduced, for the collectives line."""
    if dp is None:
        r = opt.reductions
        return (
            f"data parallel: {r['gradients']} gradients all-reduced together in opt.step() "
            f"with {r['all_reduces']} all-reduce(s) (--dp plain)"
        )
    layout = dp.buckets
    if not layout["buckets"]:
        return "data parallel: nothing to reduce (dp is 1)"
    sizes = ", ".join(f"{b['bytes'] / 2**20:.2f} MiB" for b in layout["buckets"])
    return (
        f"data parallel: {layout['gradients']} gradient all-reduces fused into "
        f"{len(layout['buckets'])} bucket(s) ({sizes}), started during backward"
    )


def fit(opt, batches, loss_of, named, steps: int, show: bool = False, dp=False) -> dict:
    """The training loop of every demo: per batch, ``loss_of(batch)`` (forward), backward and
    ``opt.step()``, timed and with each phase's collectives counted; rank 0 prints a line per
    step when ``show``. ``named()`` gives the (name, parameter) pairs; ``dp`` is the run's
    dt.DataParallel wrapper, whose buckets the summary names (None: --dp plain; False: the
    demo has no data parallelism). Returns what ``check``
    compares: losses, the last step's gradients, the final parameters.

    With ``--record PATH``, the run that shows its progress (the sharded one: each demo's
    single-process run does not show) is saved by rank 0 with ``np.savez`` for a replay in
    plain numpy: ``initial:NAME`` (the global parameters before the first step, after any
    --perturb), ``batch:STEP:I`` (item I of each step's batch as given to ``loss_of``),
    ``losses``, ``gradient:NAME`` (the last step's), ``final:NAME`` and ``meta`` (a JSON
    string: the script, world size, optimizer and its settings). Every rank gathers the same
    tensors (``.numpy()`` is collective), so the collectives stay the same on every rank.
    """
    record = _record_path if show else None
    initial = params(named()) if record is not None else None
    recorded_batches = []
    losses = []
    for step, batch in enumerate(batches, 1):
        if record is not None:
            recorded_batches.append(tuple(np.array(a) for a in batch))
        opt.zero_grad()
        with Stopwatch() as t:
            with dt.CommCounter() as fwd:
                loss = loss_of(batch)
            with dt.CommCounter() as bwd:
                loss.backward()
            with dt.CommCounter() as upd:
                opt.step()
            losses.append(float(loss))
        if show:
            progress(step, steps, losses[-1], t.seconds)
    if show:
        dt.print0("collectives per step: " + collectives(forward=fwd, backward=bwd, optimizer=upd))
        if dp is not False:
            dt.print0(describe_buckets(dp, opt))
    pairs = list(named())
    result = {
        "losses": dict(enumerate(losses, 1)),
        "gradients": grads(pairs),
        "parameters": params(pairs),
    }
    if record is not None:
        save_record(record, opt, initial, recorded_batches, result)
    return result


def save_record(path: str, opt, initial: dict, batches: list, result: dict) -> None:
    """Rank 0 writes the record of ``fit`` (see there) to ``path``; the others do nothing."""
    if dt.get_rank() != 0:
        return
    settings = {
        k: v
        for k, v in vars(opt).items()
        if k in ("beta1", "beta2", "eps", "weight_decay", "momentum", "nesterov")
    }
    meta = {
        "script": sys.argv[0],
        "world": dt.get_world_size(),
        "steps": len(batches),
        "optimizer": type(opt).__name__,
        "lr": opt.lr,
        **settings,
    }
    arrays = {
        "meta": np.array(json.dumps(meta)),
        "losses": np.array(list(result["losses"].values())),
    }
    arrays.update({f"initial:{name}": v for name, v in initial.items()})
    for step, batch in enumerate(batches, 1):
        arrays.update({f"batch:{step}:{i}": a for i, a in enumerate(batch)})
    arrays.update({f"gradient:{name}": v for name, v in result["gradients"].items()})
    arrays.update({f"final:{name}": v for name, v in result["parameters"].items()})
    np.savez(path, **arrays)


def grads(named: Iterable[tuple[str, dt.DistTensor]]) -> dict[str, np.ndarray]:
    """Global gradients by parameter name (collective: a Partial gradient is reduced)."""
    return {name: p.grad.numpy() for name, p in named}


def params(named: Iterable[tuple[str, dt.DistTensor]]) -> dict[str, np.ndarray]:
    """Global parameter values by name (collective)."""
    return {name: p.numpy() for name, p in named}


def rel_diff(got, want, floor: float = 0.0) -> float:
    """max |got - want| / max(max |want|, floor): one number for a whole tensor."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = max(float(np.abs(want).max(initial=0.0)), floor) or 1.0
    return float(np.abs(got - want).max(initial=0.0)) / scale


def check(sharded: dict, single: dict, dtype: str) -> float:
    """Compare the sharded run with the single-process run and stop the demo on a mismatch.

    ``sharded``/``single`` map a group ("losses", "gradients", "parameters") to a dict of
    name -> array. Each tensor is compared relative to its largest value, but at least 1% of
    the group's largest value: a gradient that is zero in exact arithmetic (attention's key
    bias: softmax ignores a constant added to a row) is rounding noise in both runs.

    Every rank computes the differences, then all agree on the worst one (one small
    all-gather), so every rank exits the same way: 1 with a message on rank 0 if a difference
    exceeds the dtype's tolerance, else the worst difference is returned.
    """
    tol = TOLERANCE[dtype]
    diffs = {}
    for group, values in single.items():
        floor = 1e-2 * max((float(np.abs(v).max(initial=0.0)) for v in values.values()), default=0)
        for name, want in values.items():
            diffs[group, name] = rel_diff(sharded[group][name], want, floor)
    bad = sorted((d, key) for key, d in diffs.items() if not d <= tol)
    worst = max(diffs.values(), default=0.0)
    everyone = dt.comm.world().allgather_object((worst, bad))
    worst = max(w for w, _ in everyone)
    bad = max((b for _, b in everyone), key=len)
    if bad:
        lines = [f"  {group} {name}: rel diff {d:.3g}" for d, (group, name) in bad[::-1]]
        fail(
            f"MISMATCH: the sharded run differs from the single process (max rel diff "
            f"{worst:.3g} > tolerance {tol:g} for {dtype}):\n" + "\n".join(lines[:10]),
            code=1,
        )
    return worst


def ok(worst: float, dtype: str) -> None:
    dt.print0(
        f"OK: matches single process (max rel diff {worst:.2g}, tolerance {TOLERANCE[dtype]:g})"
    )


def perturb(p: dt.DistTensor) -> None:
    """Add 1e-3 to the last rank's local shard of ``p`` (for the failing self-check test)."""
    if dt.get_rank() == dt.get_world_size() - 1:
        p.to_local()[...] += 1e-3
