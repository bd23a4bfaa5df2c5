"""Sorting without gathering (disttensor/ops/sorting.py, disttensor/ops/unique.py) against
numpy: sort, argsort, x.sort() in place, unique, searchsorted.

For meshes (1), (2), (3), (4), (2, 2): the placement grid of the op tests (Shard of each axis,
Replicate, asymmetric Partials, nested shards on (2, 2)), even, uneven, empty and zero-size
shards, ties, NaN, -0.0 and 0.0, int/bool/complex dtypes; every rank's gathered result must be
numpy's on the gathered input, bit for bit (signs of zeros included), with ``kind="stable"``
for ties and numpy's default kind on tie-free data. Small lanes would take the gathering path
(``sorting._distributes``), so the grids run the distributed sort forced on, and the
gathering path on a smaller grid. Then the layouts of the results, the communication (none
along an unsplit axis; O(local shard) along a split one, against what the replicate fallback
moves), the gradient of sort, the errors, and a grid under mpiexec on 3 and 4 ranks.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from grad_cases import GradCase, run_grid
from op_cases import (
    MESH_SHAPES,
    PSUM,
    S0,
    S1,
    assert_grid,
    every_rank,
    make_input,
    mesh_of,
    placements,
)

import disttensor as dt
from disttensor.ops import sorting

R = dt.Replicate()
MESH_IDS = [str(s) for s in MESH_SHAPES]
mesh_shapes = pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)


def simulate_on(mesh_shape, fn, *args):
    mesh = mesh_of(mesh_shape)
    return dt.simulate(mesh.size, fn, mesh, *args)


@pytest.fixture
def distributed(monkeypatch):
    """The distributed sort even where gathering the lanes would move less."""
    monkeypatch.setattr(sorting, "_distributes", lambda *args: True)


# -- data --------------------------------------------------------------------------------------
def ties(shape, rng) -> np.ndarray:
    """float64 with many ties, -0.0 next to 0.0, NaNs and infinities."""
    g = rng.integers(-3, 4, shape).astype(float)
    g[g == 0] = np.where(rng.random(np.count_nonzero(g == 0)) < 0.5, -0.0, 0.0)
    g[g == 3] = np.nan
    g[g == -3] = -np.inf
    return g


def complex_ties(shape, rng) -> np.ndarray:
    """complex128 with numpy's NaN classes (R+nanj, nan+Rj, nan+nanj), ties and signed zeros."""
    parts = [rng.integers(-1, 2, shape).astype(float) for _ in range(2)]
    for p in parts:
        p[p == 1] = np.where(rng.random(np.count_nonzero(p == 1)) < 0.3, np.nan, 1.0)
        p[p == 0] = np.where(rng.random(np.count_nonzero(p == 0)) < 0.5, -0.0, 0.0)
    return parts[0] + 1j * parts[1]


def datasets(shape, rng) -> dict[str, np.ndarray]:
    n = int(np.prod(shape))
    return {
        "ties": ties(shape, rng),
        "distinct": (rng.permutation(n) - n // 2).reshape(shape).astype(float),
        "int64": rng.integers(-4, 4, shape),
        "bool": rng.random(shape) < 0.5,
        "complex": complex_ties(shape, rng),
        "float32": ties(shape, rng).astype(np.float32),
        "uint8": rng.integers(0, 3, shape).astype(np.uint8),
        "complex64": complex_ties(shape, rng).astype(np.complex64),
    }


def same_bits(got, want, what: str) -> None:
    """numpy's dtype, shape and values, NaNs in the same places and the signs of zeros."""
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (what, got.dtype, got.shape)
    assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), (what, got, want)
    if want.dtype.kind == "f":
        assert (np.signbit(got) == np.signbit(want)).all(), (what, got, want)
    if want.dtype.kind == "c":
        assert (np.signbit(got.real) == np.signbit(want.real)).all(), (what, got, want)
        assert (np.signbit(got.imag) == np.signbit(want.imag)).all(), (what, got, want)


class Checks:
    """Collects failures on every rank (the ranks stay in step)."""

    def __init__(self) -> None:
        self.count, self.failures = 0, []

    def run(self, what: str, fn) -> None:
        self.count += 1
        try:
            fn()
        except Exception as e:
            self.failures.append(f"{what}: {type(e).__name__}: {str(e)[:300]}")

    def result(self):
        return self.count, self.failures


def sorted_layout(x: dt.DistTensor, axis) -> list:
    """The placements of a sort's result: the input's (Partials reduced), or for axis=None
    Shard(0) on the mesh dims that split the input."""
    if axis is not None:
        return [R if p.is_partial() else p for p in x.placements]
    return [S0 if p.is_shard() and x.mesh.shape[m] > 1 else R for m, p in enumerate(x.placements)]


def _sort_checks(checks: Checks, mesh, name: str, g: np.ndarray, pl, seed: int) -> None:
    x = make_input(g, mesh, pl, seed=seed)
    inside = dt.get_rank() in mesh  # ranks outside the mesh run the ops on empty shards
    value = x.numpy() if inside else None  # numpy's oracle sees the gathered input
    for axis in (*range(g.ndim), None):
        what = f"{name} {g.shape} {pl} axis={axis}"

        def check(axis=axis):
            kinds = [{"kind": "stable"}] + ([{}] if name == "distinct" else [])
            for kw in kinds:  # default kind: only on tie-free data
                s, i = np.sort(x, axis=axis, **kw), np.argsort(x, axis=axis, **kw)
                assert s.placements == i.placements == sorted_layout(x, axis), s.placements
                if inside:
                    same_bits(s.numpy(), np.sort(value, axis=axis, **kw), f"sort {kw}")
                    same_bits(i.numpy(), np.argsort(value, axis=axis, **kw), f"argsort {kw}")

        checks.run(what, check)


def _sort_grid(mesh, full: bool):
    checks, rng = Checks(), np.random.default_rng(mesh.size)
    s = mesh.size
    shapes = [(2 * s + 1, s + 1), (max(s - 1, 1), 3), (2 * s + 3,), (max(s - 1, 1),), (0, 2)]
    for shape in shapes if full else shapes[:3]:
        for name, g in datasets(shape, rng).items():
            grid = placements(mesh, g.ndim, g.dtype)
            if name in ("distinct", "bool"):  # default kind, 1-byte keys: a few layouts
                grid = grid[:4]
            elif name not in ("ties", "int64"):  # complex, narrow: a few, on two shapes
                grid = [pl for pl in grid if not any(p.is_partial() for p in pl)]
                grid = grid[:3] if shape in (shapes[0], shapes[2]) else []
            if not full:
                grid = grid[:4]
            for pl in grid:
                _sort_checks(checks, mesh, name, g, pl, seed=checks.count)
    return checks.result()


@mesh_shapes
def test_sort_and_argsort_distributed(mesh_shape, distributed):
    assert_grid(simulate_on(mesh_shape, _sort_grid, True), minimum=20)


@pytest.mark.parametrize("mesh_shape", [(3,), (2, 2)], ids=str)
def test_sort_and_argsort_gathering_short_lanes(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _sort_grid, False), minimum=20)


def _other_dtypes(mesh):
    checks, rng = Checks(), np.random.default_rng(9)
    extremes = {
        "int8": np.array([-128, 127, 0, -1, 5, -128, 127, 3, 0, -7, 1], np.int8),
        "int16": rng.integers(-(2**15), 2**15, 11).astype(np.int16),
        "int32": rng.integers(-3, 3, 11).astype(np.int32),
        "uint64": np.array([2**64 - 1, 0, 2**63, 2**63 - 1, 5, 2**64 - 1, 1, 0, 9, 2**63, 3], "u8"),
        "int64": np.array([-(2**63), 2**63 - 1, 0, -1, 1, -(2**63), 7, 2**63 - 1, 0, -5, 2]),
        "float16": ties((11,), rng).astype(np.float16),
    }
    for name, g in extremes.items():
        for pl in ([S0], [R]):
            _sort_checks(checks, mesh, name, g, pl, seed=checks.count)
            _unique_check(checks, mesh, g, pl, FLAGS[0], True, name)
    return checks.result()


def test_every_key_width(distributed):
    """Note [Sort keys]: 1, 2, 4 and 8-byte keys, signed extremes, unsigned top bits."""
    assert_grid(simulate_on((3,), _other_dtypes), minimum=20)


# -- x.sort() in place ---------------------------------------------------------------------------
def _in_place(mesh):
    checks, rng = Checks(), np.random.default_rng(7)
    g = ties((2 * mesh.size + 1, 3), rng)
    for pl in placements(mesh, 2, g.dtype):
        for axis in (0, 1, -1):

            def check(pl=pl, axis=axis):
                x = make_input(g, mesh, pl, seed=checks.count)
                want = np.sort(x.numpy(), axis=axis)  # the gathered value, sorted
                alias = x
                alias.sort(axis=axis)
                assert x.placements == pl, x.placements  # a write keeps the layout
                got = x.numpy()
                if dt.get_rank() in mesh:
                    same_bits(got, want, "x.sort()")

            checks.run(f"x.sort(axis={axis}) {pl}", check)
    return checks.result()


@pytest.mark.parametrize("mesh_shape", [(3,), (2, 2)], ids=str)
def test_sort_in_place_writes_every_alias(mesh_shape, distributed):
    assert_grid(simulate_on(mesh_shape, _in_place), minimum=10)


# -- unique --------------------------------------------------------------------------------------
FLAGS = [(True, True, True), (False, False, False), (False, True, False), (False, False, True)]
UNIQUE_SETS = ("ties", "int64", "bool", "complex", "float32")


def _unique_grid(mesh, full: bool):
    checks, rng = Checks(), np.random.default_rng(11)
    s = mesh.size
    for shape in [(2 * s + 1, 3), (max(s - 1, 1),), (0,)] if full else [(4 * s + 2,)]:
        sets = {k: v for k, v in datasets(shape, rng).items() if k in UNIQUE_SETS}
        # many groups: the result is split, not gathered (Note [Unique of split data])
        sets["wide"] = rng.permutation(int(np.prod(shape))).reshape(shape) % (2 * s + 3)
        for name, g in sets.items():
            grid = placements(mesh, g.ndim, g.dtype)
            if name not in ("ties", "wide"):
                grid = [pl for pl in grid if not any(p.is_partial() for p in pl)][:2]
            for pl in grid:
                for flags in FLAGS if name == "ties" else FLAGS[:2]:
                    for equal_nan in (True, False) if name in ("ties", "complex") else (True,):
                        _unique_check(checks, mesh, g, pl, flags, equal_nan, name)
    return checks.result()


def _unique_check(checks, mesh, g, pl, flags, equal_nan, name) -> None:
    def check():
        x = make_input(g, mesh, pl, seed=checks.count)
        got = np.unique(x, *flags, equal_nan=equal_nan)
        if dt.get_rank() not in mesh:  # ran on empty shards
            return
        value = x.numpy()
        want = np.unique(value, *flags, equal_nan=equal_nan)
        got, want = (got, want) if any(flags) else ((got,), (want,))
        assert type(got) is tuple and len(got) == len(want)
        inverse = 1 + flags[0] if flags[1] else None
        for i, (a, w) in enumerate(zip(got, want)):
            if i == inverse:
                assert a.placements == [R if p.is_partial() else p for p in x.placements]
            else:
                layout = sorted_layout(x, None)  # Note [Unique of split data]
                k = int(np.prod([mesh.shape[m] for m, p in enumerate(layout) if p == S0]))
                small = len(w) * k <= g.size or k == 1
                assert a.placements == ([R] * mesh.ndim if small else layout), a.placements
            got_i = a.numpy()
            if i == 0 and not flags[0]:  # numpy's quicksort picks any of -0.0, 0.0
                assert np.array_equal(got_i, w, equal_nan=True) and got_i.dtype == w.dtype
            elif i == inverse and not equal_nan and not flags[0]:
                # each NaN its own group, numbered in the order numpy's quicksort left them:
                # any order rebuilds the input, with one group per NaN
                values = got[0].numpy()
                assert np.array_equal(values[got_i], value, equal_nan=True)
                nan = np.isnan(value)
                assert len(set(got_i[nan].tolist())) == np.count_nonzero(nan)
                assert np.array_equal(got_i[~nan], w[~nan]) and got_i.dtype == w.dtype
            else:
                same_bits(got_i, w, f"output {i}")

    checks.run(f"unique {name} {g.shape} {pl} {flags} equal_nan={equal_nan}", check)


@mesh_shapes
def test_unique(mesh_shape, distributed):
    assert_grid(simulate_on(mesh_shape, _unique_grid, True), minimum=50)


def test_unique_gathering_short_lanes():
    assert_grid(simulate_on((2, 2), _unique_grid, False), minimum=20)


# -- searchsorted --------------------------------------------------------------------------------
def _searchsorted_grid(mesh):
    checks, rng = Checks(), np.random.default_rng(5)
    s = mesh.size
    for n in (3 * s + 1, max(s - 1, 1), 0):
        a = np.sort(rng.integers(-4, 5, n).astype(float))
        v = np.array([[-9.0, -0.0, 2.0], [2.5, 4.0, np.nan]])
        for pa in placements(mesh, 1, a.dtype):
            for pv in [None, *placements(mesh, 2, v.dtype)[:4]]:
                for side in ("left", "right"):

                    def check(a=a, v=v, pa=pa, pv=pv, side=side):
                        x = make_input(a, mesh, pa, seed=checks.count)
                        vv = v if pv is None else make_input(v, mesh, pv, seed=checks.count)
                        got = np.searchsorted(x, vv, side=side)
                        keep = [R] * mesh.ndim if pv is None else pv
                        assert got.placements == [R if p.is_partial() else p for p in keep]
                        scalar = np.searchsorted(x, 2.0, side)  # a 0-d result
                        got, scalar, av = got.numpy(), scalar.numpy(), x.numpy()
                        if dt.get_rank() in mesh:
                            same_bits(got, np.searchsorted(av, v, side), "searchsorted")
                            same_bits(scalar, np.asarray(np.searchsorted(av, 2.0, side)), "0-d")

                    checks.run(f"searchsorted n={n} {pa} {pv} {side}", check)
    return checks.result()


@mesh_shapes
def test_searchsorted(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _searchsorted_grid), minimum=10)


def test_searchsorted_of_a_numpy_array_and_the_method():
    a = np.array([1.0, 2.0, 2.0, 5.0])

    def program(mesh):
        v = make_input(np.array([2.0, 0.0, 7.0, 5.0, 2.0]), mesh, [S0])
        with dt.CommCounter() as cc:
            got = np.searchsorted(a, v, side="right")  # a whole on every rank: local
        x = make_input(a, mesh, [S0])
        return cc.counts, got.placements, got.numpy(), x.searchsorted(v).numpy()

    counts, pls, got, method = every_rank(simulate_on((3,), program))
    assert counts == {} and pls == [S0]
    np.testing.assert_array_equal(got, np.searchsorted(a, [2.0, 0.0, 7.0, 5.0, 2.0], "right"))
    np.testing.assert_array_equal(method, np.searchsorted(a, [2.0, 0.0, 7.0, 5.0, 2.0]))


# -- communication -------------------------------------------------------------------------------
def _moves(mesh):
    g = np.random.default_rng(0).standard_normal(100_000)
    x = make_input(g, mesh, [S0])
    local = x.to_local().nbytes
    with dt.CommCounter() as values:
        y = np.sort(x)
    with dt.CommCounter() as indices:
        i = np.argsort(x)
    rows = make_input(g.reshape(1000, 100), mesh, [S0])
    with dt.CommCounter() as unsplit:
        np.sort(rows, axis=1)
        np.sort(make_input(g.reshape(100, 1000), mesh, [S1]), axis=0)
        np.unique(make_input(g[:1000], mesh, [R]))
    short = make_input(g[:40], mesh, [S0])
    with dt.CommCounter() as gathered:
        z = np.sort(short)
    counts = (values.counts, indices.counts, unsplit.counts, gathered.counts)
    sent = (values.bytes, indices.bytes, local)
    ok = (
        np.array_equal(y.numpy(), np.sort(g))
        and np.array_equal(i.numpy(), np.argsort(g, kind="stable"))
        and np.array_equal(z.numpy(), np.sort(g[:40]))
    )
    return counts, sent, (y.placements, y.local_shape, z.placements), ok


def test_a_split_axis_moves_the_local_shard_once():
    """Note [Distributed sort]: one all-to-all of the shard (values, or values and indices),
    a few small all-reduces and one small all-gather; no all-gather of data. An unsplit axis
    communicates nothing; short lanes are gathered over the group instead."""
    for (counts, sent, layout, ok), rank in zip(simulate_on((4,), _moves), range(4)):
        (values, indices, unsplit, gathered), (vb, ib, local) = counts, sent
        assert ok
        assert layout == ([S0], (25_000,), [S0])
        assert values["all_to_all"] == indices["all_to_all"] == 1, values
        assert values["all_gather"] == indices["all_gather"] == 1, values
        assert set(values) == set(indices) == {"all_to_all", "all_gather", "all_reduce"}
        assert 0.6 * local < vb["all_to_all"] <= local, (vb, local)  # what leaves the rank
        assert ib["all_to_all"] == 2 * vb["all_to_all"], (vb, ib)  # values and indices
        small = [b[k] for b in (vb, ib) for k in ("all_gather", "all_reduce")]
        assert max(small) <= 16 * 1024 < local / 10, (rank, vb, ib)  # vs 800 kB gathered
        assert unsplit == {}
        assert gathered == {"all_gather": 1}


def _searchsorted_moves(mesh, n):
    a = make_input(np.sort(np.random.default_rng(1).standard_normal(n)), mesh, [S0])
    v = make_input(np.linspace(-2, 2, 64).reshape(8, 8), mesh, [S1])
    with dt.CommCounter() as cc:
        np.searchsorted(a, v)
        np.searchsorted(a, [0.5, 1.0])
    return cc.counts, cc.bytes


def test_searchsorted_moves_bytes_of_v_only():
    """The counts of v's items are summed over the ranks of a: the same collectives and bytes
    for any length of a."""
    short, long = (every_rank(simulate_on((4,), _searchsorted_moves, n)) for n in (40, 40_000))
    assert short == long, (short, long)
    assert short[0] == {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 1}, short


def _no_fallback(mesh):
    _ = dt.fallback_report(reset=True) if dt.get_rank() == 0 else None
    g = ties((7, 5), np.random.default_rng(2))
    x = make_input(g, mesh, [S1, S0])
    with dt.CommCounter() as cc:
        calls = [np.sort(x, axis=0), np.argsort(x, axis=None), np.sort(x.ravel())]
        calls += list(np.unique(x, return_index=True, return_inverse=True, return_counts=True))
        calls += [np.searchsorted(calls[2], x), x.argsort(axis=1)]
        y = x.copy()
        y.sort(axis=0)
    with dt.CommCounter() as rows:  # rows compared as records: numpy's through the fallback
        np.unique(x, axis=0)
    return cc.fallbacks, [op for op, _ in rows.fallbacks]


def test_the_calls_take_no_fallback(distributed):
    before = {r.op for r in dt.fallback_report().rows}
    fallbacks, rows = every_rank(simulate_on((2, 2), _no_fallback))
    assert fallbacks == {} and rows == ["unique"]
    after = {r.op for r in dt.fallback_report().rows}
    assert after - before <= {"unique"}, after - before


# -- gradients -----------------------------------------------------------------------------------
def _scatter(cot: np.ndarray, x: np.ndarray, axis) -> np.ndarray:
    """d sum(sort(x) * cot) / dx: cot put back where each sorted item came from."""
    perm = np.argsort(x, axis=axis, kind="stable")
    g = np.zeros(x.size if axis is None else x.shape)
    if axis is None:
        g[perm] = cot
        return g.reshape(x.shape)
    np.put_along_axis(g, perm, cot, axis)
    return g


def grad_cases() -> list[GradCase]:
    x = ties((5, 7), np.random.default_rng(3))
    x = np.where(np.isfinite(x), x, 2.0)  # ties and signed zeros; finite gradients
    cases = [
        GradCase(
            f"sort axis={axis}",
            lambda a, axis=axis: dt.sort(a, axis=axis),
            lambda a, axis=axis: np.sort(a, axis=axis, kind="stable"),
            (x,),
            ops=("sort",),
            grads=lambda cots, a, axis=axis: [_scatter(cots[0], a, axis)],
        )
        for axis in (0, 1, None)
    ]
    w = np.random.default_rng(4).standard_normal(x.size)  # a cotangent of any layout
    cases.append(
        GradCase(
            "sort(axis=None) * w",
            lambda a, b: dt.sort(a, axis=None) * b,
            lambda a, b: np.sort(a, axis=None, kind="stable") * b,
            (x, w),
            ops=("sort",),
            grads=lambda cots, a, b: [
                _scatter(cots[0] * b, a, None),
                np.sort(a, axis=None, kind="stable") * cots[0],
            ],
        )
    )
    return cases


@pytest.mark.parametrize("mesh_shape", [(3,), (2, 2)], ids=str)
def test_sort_gradient_scatters_back(mesh_shape, distributed):
    run_grid(mesh_shape, grad_cases(), minimum=20)


def test_unique_has_no_gradient():
    def program(mesh):
        x = make_input(np.array([3.0, 1.0, 3.0]), mesh, [S0]).requires_grad_()
        loss = np.unique(x).sum()
        with pytest.raises(NotImplementedError, match="unique has no gradient"):
            loss.backward()
        return True

    assert all(simulate_on((2,), program))


# -- errors: numpy's, on every rank, before any collective ---------------------------------------
ERRORS = [
    (lambda x: np.sort(x, kind="bogus"), ValueError, "sort kind"),
    (lambda x: np.argsort(x, kind="stable", stable=True), ValueError, "at the same time"),
    (lambda x: np.sort(x, axis=2), np.exceptions.AxisError, "out of bounds"),
    (lambda x: np.searchsorted(x, 1.0, side="middle"), ValueError, "left' or 'right"),
    (lambda x: np.searchsorted(x.reshape(2, 3), 1.0), ValueError, "too deep"),
    (lambda x: np.unique(x, axis=1), np.exceptions.AxisError, "out of bounds"),
    (lambda x: x.sort(axis=None), TypeError, "NoneType"),
]


def _errors(mesh):
    x = make_input(np.arange(6.0), mesh, [PSUM])
    seen = []
    for call, exc, match in ERRORS:
        with dt.CommCounter() as cc, pytest.raises(exc, match=match):
            call(x)
        seen.append(cc.counts)
    return seen


def test_errors_on_every_rank_before_any_collective():
    assert every_rank(simulate_on((2,), _errors)) == [{}] * len(ERRORS)


# -- under mpiexec -------------------------------------------------------------------------------
def case_sorting(world: int) -> int:
    """A small grid of every call on every mesh that fits the world (MPI's own all-to-all,
    reductions and groups), the distributed sort forced on."""
    sorting._distributes = lambda *args: True
    checks = Checks()
    for shape in MESH_SHAPES:
        if np.prod(shape) > world:
            continue
        mesh = mesh_of(shape)
        rng = np.random.default_rng(len(shape))
        for name, g in datasets((2 * mesh.size + 1, 3), rng).items():
            if name in ("ties", "complex"):
                for pl in placements(mesh, 2, g.dtype)[:3]:
                    _sort_checks(checks, mesh, name, g, pl, seed=checks.count)
                    _unique_check(checks, mesh, g, pl, FLAGS[0], True, name)
        a = make_input(np.sort(ties((3 * mesh.size,), rng)), mesh, [S0] * mesh.ndim)

        def search(a=a, mesh=mesh):
            v = np.array([-1.0, 0.0, 2.5, np.nan])
            got = np.searchsorted(a, v, side="right")
            if dt.get_rank() in mesh:
                same_bits(got.numpy(), np.searchsorted(a.numpy(), v, "right"), "searchsorted")

        checks.run(f"searchsorted {shape}", search)
    return assert_grid([checks.result()], minimum=20, ranks=[dt.get_rank()])


@pytest.mark.mpi
def test_under_mpiexec():
    from mpirun import run

    code, out = run(4, ["tests/test_sorting.py"], timeout=300)
    assert code == 0, out
    assert "sorting: OK" in out, out


if __name__ == "__main__":  # mpiexec -n 4 python tests/test_sorting.py
    count = case_sorting(dt.get_world_size())
    dt.barrier()
    if dt.get_rank() == 0:
        print(f"sorting: OK ({count} checks on {dt.get_world_size()} ranks)", file=sys.stdout)
