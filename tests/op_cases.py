"""Op SPMD cases and the grid helpers of tests/test_ops_*.py.

``case_ops_*(world)`` run on every rank of a world of that size, on simulated ranks and under
``mpiexec`` (small grids: < 20 s on 4 ranks). The helpers run an op on a mesh for placements
of its tensor inputs (Partial inputs hold asymmetric splits) and compare the gathered result
with numpy on the global inputs: the project's oracle.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
from spmd_cases import make_source

import disttensor as dt
from disttensor.spmd.validate import DOMAINS, REFS, data, split_partial

S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
PSUM, PAVG, PMAX, PMIN = (dt.Partial(t) for t in ("sum", "avg", "max", "min"))
F64, F32, I64, BOOL = (np.dtype(t) for t in (np.float64, np.float32, np.int64, np.bool_))
DTYPES = (F64, F32, I64, BOOL)
MESH_SHAPES = ((1,), (2,), (3,), (4,), (2, 2))


def mesh_of(shape: Sequence[int]) -> dt.ProcessMesh:
    """The mesh of the first prod(shape) ranks."""
    n = math.prod(shape)
    return dt.ProcessMesh(np.arange(n).reshape(shape), [f"m{i}" for i in range(len(shape))])


def fitting_meshes(world: int) -> list[dt.ProcessMesh]:
    return [mesh_of(s) for s in MESH_SHAPES if math.prod(s) <= world]


def partials(dtype) -> list[dt.Placement]:
    """Partial placements a dtype allows (avg needs floats)."""
    return [PSUM, PAVG, PMAX, PMIN] if np.dtype(dtype).kind in "fc" else [PSUM, PMAX, PMIN]


def placements(mesh: dt.ProcessMesh, ndim: int, dtype) -> list[list[dt.Placement]]:
    """Every 1-D placement on 1-D meshes; on 2-D meshes a representative subset: each kind on
    each mesh dim, both mesh dims splitting one axis (nested), two Partials."""
    if mesh.ndim == 1:
        return [[p] for p in [dt.Shard(d) for d in range(ndim)] + [R] + partials(dtype)]
    last = dt.Shard(ndim - 1) if ndim else R
    other = PAVG if np.dtype(dtype).kind in "fc" else PMIN
    subset = [[S0, S1], [S1, S0], [S0, S0], [R, last], [PSUM, S0], [last, PMAX], [other, R]]
    subset += [[PSUM, PSUM], [R, R], [PMAX, R]]
    out = []
    for pl in subset:
        if all(not p.is_shard() or p.dim < ndim for p in pl) and pl not in out:
            out.append(pl)
    return out


def pairs(mesh, a: np.ndarray, b: np.ndarray, full: bool = True) -> list[tuple[list, list]]:
    """Placement pairs of two inputs: on 1-D meshes all of them (``full``) or those that are
    equal or have a Replicate side; on 2-D meshes a subset."""
    pa, pb = placements(mesh, a.ndim, a.dtype), placements(mesh, b.ndim, b.dtype)
    if mesh.ndim == 1:
        every = list(itertools.product(pa, pb))
        return every if full else [(p, q) for p, q in every if p == q or R in p + q]
    some = list(zip(pa, itertools.cycle(pb))) + [(p, p) for p in pa if p in pb]
    return [c for i, c in enumerate(some) if c not in some[:i]]


def shapes_2d(mesh: dt.ProcessMesh) -> dict[str, tuple[int, int]]:
    """Even, uneven (2s+1), empty shards (fewer rows than ranks) and zero-size, s = mesh size."""
    s = mesh.size
    return {
        "even": (2 * s, 2 * s),
        "uneven": (2 * s + 1, s + 1),
        "empty": (max(s - 1, 1), 2),
        "zero": (0, 3),
    }


def assert_close(got, want, what: str, exact: bool = False, single: bool = False) -> None:
    """numpy's dtype and shape, and its values: exactly for integers, bools and ``exact``;
    ``single``: a float32 input (its Partial splits round) bounds a float64 result's accuracy."""
    got, want = np.asarray(got), np.asarray(want)
    assert (got.shape, got.dtype) == (want.shape, want.dtype), (
        f"{what}: got {got.dtype}{got.shape}, numpy {want.dtype}{want.shape}"
    )
    if exact or want.dtype.kind not in "fc":
        assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), (
            f"{what}: got {got}, numpy {want}"
        )
        return
    tol = 2e-4 if single or want.dtype.itemsize <= 4 else 1e-7
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=what)


def reference(name: str) -> Callable[..., Any]:
    return REFS.get(name) or getattr(np, name)


def numpy_takes(ref, args, kwargs=None) -> bool:
    """Whether numpy accepts the call (np.negative refuses bools, ...): else no oracle."""
    try:
        with np.errstate(all="ignore"):
            ref(*args, **(kwargs or {}))
    except (TypeError, ValueError):
        return False
    return True


class Grid:
    """Runs checks on every rank and collects the failures instead of stopping at the first
    (every rank decides alike, so the ranks stay in step)."""

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []

    def check(self, mesh, fn, args, pls, ref, what: str, exact: bool = False, **kw) -> None:
        """``fn(*args, **kw)`` with the arrays in ``args`` placed as ``pls`` on ``mesh``."""
        with np.errstate(all="ignore"):
            want = np.asarray(ref(*args, **kw))
        self.count += 1
        try:
            with np.errstate(all="ignore"):
                out = fn(*place(mesh, args, pls, seed=self.count), **kw)
            if dt.get_rank() in mesh:
                got = out.numpy() if isinstance(out, dt.DistTensor) else out
                single = any(np.asarray(a).dtype == F32 for a in args if a is not None)
                assert_close(got, want, what, exact, single)
        except Exception as e:
            self.failures.append(f"{what}: {type(e).__name__}: {str(e)[:300]}")

    def result(self) -> tuple[int, list[str]]:
        return self.count, self.failures


def make_input(g: np.ndarray, mesh, pls, seed: int = 1) -> dt.DistTensor:
    """spmd_cases.make_source with the validator's splits, whose Partial sums of integer-valued
    floats are exact: comparisons, floor and friends of a Partial input must see the value."""
    return make_source(g, mesh, pls, seed, split=split_partial)


def place(mesh, args, pls, seed: int = 1) -> list:
    """``args`` with each numpy array replaced by a DistTensor placed as the next of ``pls``."""
    it = iter(pls)
    return [make_input(a, mesh, next(it), seed) if isinstance(a, np.ndarray) else a for a in args]


def assert_grid(
    results: list[tuple[int, list[str]]], minimum: int = 1, ranks: list[int] | None = None
) -> int:
    """Every rank's (count, failures) from a grid: a ``dt.simulate`` result, or under mpiexec
    ``[mine]`` with ``ranks=[dt.get_rank()]`` (each rank asserts its own). No rank failed,
    every rank ran the same checks, enough of them: a failure seen by one rank only fails."""
    ranks = list(range(len(results))) if ranks is None else ranks
    failures = [f"rank {r}: {f}" for r, (_, fs) in zip(ranks, results) for f in fs]
    counts = [count for count, _ in results]
    summary = " | ".join(f"rank {r}: {len(fs)} of {c} failed" for r, (c, fs) in zip(ranks, results))
    assert not failures, f"{summary}\n" + "\n".join(failures[:12])
    assert len(set(counts)) == 1, f"the ranks ran different numbers of checks: {counts}"
    assert counts[0] >= minimum, f"only {counts[0]} checks ran"
    return counts[0]


def on_mesh(mesh_shape: Sequence[int], fn) -> Any:
    """``fn(mesh)`` on simulated ranks of the mesh ``mesh_shape`` (``mesh_of``): the one result
    every rank returns (``every_rank``)."""
    return every_rank(dt.simulate(math.prod(mesh_shape), lambda: fn(mesh_of(mesh_shape))))


def every_rank(results: list) -> Any:
    """The one result of a ``dt.simulate`` run whose ranks must all return the same (global
    values, placements, counts): rank 0's, after checking every other rank's equals it."""
    for r, got in enumerate(results[1:], 1):
        assert same(got, results[0]), f"simulated rank {r} returned {got!r}, rank 0 {results[0]!r}"
    return results[0]


def same(a: Any, b: Any) -> bool:
    """Exact equality through tuples, lists and dicts; arrays by dtype, shape and value."""
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        a, b = np.asarray(a), np.asarray(b)
        nan = a.dtype.kind in "fc" and b.dtype.kind in "fc"
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=nan)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def arg_data(name: str, i: int, shape, dtype, rng) -> np.ndarray:
    """Values in the domain op ``name`` wants for argument ``i`` (positive for log, ...)."""
    domains = (*DOMAINS.get(name, ()), "real", "real")
    return data(shape, dtype, rng, domains[i])


# -- SPMD cases (simulated and mpiexec) --------------------------------------------------------
def case_ops_elementwise(world: int) -> int:
    """Unary and binary ops, broadcasting and scalars on every mesh that fits the world."""
    grid, rng = Grid(), np.random.default_rng(5)
    for mesh in fitting_meshes(world):
        shape = shapes_2d(mesh)["uneven"]
        x = arg_data("exp", 0, shape, F64, rng)
        pos = arg_data("log", 0, shape, F32, rng)
        for pl in placements(mesh, 2, F64):
            grid.check(mesh, dt.exp, (x,), [pl], np.exp, f"exp {mesh.shape} {pl}")
            grid.check(mesh, dt.log, (pos,), [pl], np.log, f"log {mesh.shape} {pl}")
            grid.check(
                mesh, lambda a: -a * 2.5 + 1, (x,), [pl], lambda a: -a * 2.5 + 1, f"affine {pl}"
            )
        y, row = arg_data("add", 1, shape, F64, rng), arg_data("add", 1, shape[1:], F64, rng)
        ints = arg_data("add", 0, shape, I64, rng)
        for (pa, pb), op in itertools.product(pairs(mesh, x, y), ("add", "multiply", "maximum")):
            grid.check(mesh, getattr(dt, op), (x, y), [pa, pb], getattr(np, op), f"{op} {pa} {pb}")
        for pa, pb in pairs(mesh, x, row):
            grid.check(mesh, dt.subtract, (x, row), [pa, pb], np.subtract, f"bcast {pa} {pb}")
        for pl in placements(mesh, 2, I64):
            grid.check(
                mesh,
                lambda a: a // 3 + (a > 0),
                (ints,),
                [pl],
                lambda a: a // 3 + (a > 0),
                f"int ops {pl}",
                exact=True,
            )
    return assert_grid([grid.result()], ranks=[dt.get_rank()])


def case_ops_matmul(world: int) -> int:
    """matmul (2-D, 1-D, batched), einsum and dot on every mesh that fits the world."""
    grid, rng = Grid(), np.random.default_rng(6)
    for mesh in fitting_meshes(world):
        s = mesh.size
        a, b = data((2 * s + 1, s + 2), F64, rng), data((s + 2, s + 1), F64, rng)
        for pa, pb in pairs(mesh, a, b):
            grid.check(mesh, dt.matmul, (a, b), [pa, pb], np.matmul, f"matmul {pa} {pb}")
        v = data((s + 2,), F64, rng)
        for pa, pb in pairs(mesh, a, v):
            grid.check(mesh, dt.matmul, (a, v), [pa, pb], np.matmul, f"matvec {pa} {pb}")
        batch, w = data((2, 2 * s + 1, s + 2), F32, rng), b.astype(np.float32)
        for pa, pb in pairs(mesh, batch, w):
            eq = "bij,jk->bik"
            grid.check(
                mesh,
                partial(dt.einsum, eq),
                (batch, w),
                [pa, pb],
                partial(np.einsum, eq),
                f"einsum {eq} {pa} {pb}",
            )
        for pa, pb in pairs(mesh, v, v):
            grid.check(mesh, dt.dot, (v, v), [pa, pb], np.dot, f"dot {pa} {pb}")
    return assert_grid([grid.result()], ranks=[dt.get_rank()])


def case_ops_reduction(world: int) -> int:
    """Reductions over every axis choice, softmax, on every mesh that fits the world."""
    grid, rng = Grid(), np.random.default_rng(7)
    for mesh in fitting_meshes(world):
        x = data(shapes_2d(mesh)["uneven"], F64, rng)
        ints = data(shapes_2d(mesh)["empty"], I64, rng, "small")
        for pl in placements(mesh, 2, F64):
            for name, axis in itertools.product(("sum", "mean", "max"), (None, 0, -1, (0, 1))):
                grid.check(
                    mesh,
                    getattr(dt, name),
                    (x,),
                    [pl],
                    getattr(np, name),
                    f"{name} axis={axis} {pl}",
                    axis=axis,
                )
            grid.check(mesh, dt.softmax, (x,), [pl], REFS["softmax"], f"softmax {pl}", axis=0)
        for pl in placements(mesh, 2, I64):
            for name in ("sum", "min", "argmax", "any"):
                grid.check(
                    mesh,
                    getattr(dt, name),
                    (ints,),
                    [pl],
                    getattr(np, name),
                    f"{name} int {pl}",
                    axis=0,
                )
    return assert_grid([grid.result()], ranks=[dt.get_rank()])


ALL = [case_ops_elementwise, case_ops_matmul, case_ops_reduction]
