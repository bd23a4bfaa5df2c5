"""Scans and statistics on simulated ranks against numpy (disttensor/ops/scan.py,
disttensor/ops/statistics.py, disttensor/ops/order_stats.py): cumsum/cumprod (and the reverse
cumsum of cumsum's gradient), np.linalg.norm, isclose/allclose/array_equal/array_equiv,
cov/corrcoef, count_nonzero, histogram.

For meshes (1), (2), (3), (4), (2, 2): the placement grid of the op tests (Shard of each axis,
Replicate, asymmetric Partials, nested shards on (2, 2)), even, uneven, empty and zero-size
shapes; every rank's gathered result must be numpy's (values, dtype, shape) and no call may
take the replicate fallback. Then the communication each one promises (CommCounter), the
gradients of the composites (central differences, tests/grad_cases.py), the arguments that
still take the fallback, and numpy's result types.
"""

from __future__ import annotations

import numpy as np
import pytest
from grad_cases import GradCase, run_grid
from op_cases import (
    BOOL,
    F32,
    F64,
    I64,
    MESH_SHAPES,
    PSUM,
    S0,
    S1,
    Grid,
    R,
    assert_close,
    assert_grid,
    every_rank,
    make_input,
    mesh_of,
    placements,
    shapes_2d,
)

import disttensor as dt
from disttensor.ops import order_stats
from disttensor.ops import scan as scan_ops
from disttensor.spmd.validate import data

MESH_IDS = [str(s) for s in MESH_SHAPES]
mesh_shapes = pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)


def simulate_on(mesh_shape, fn, *args):
    mesh = mesh_of(mesh_shape)
    return dt.simulate(mesh.size, fn, mesh, *args)


# -- values: the grid --------------------------------------------------------------------------
def _scans(grid: Grid, mesh, kind: str, shape, rng) -> None:
    g = data(shape, F64, rng)
    ints = data(shape, I64, rng, "small")
    bools = data(shape, BOOL, rng)
    for pl in placements(mesh, 2, F64):
        for axis in (0, 1, None):
            for name in ("cumsum", "cumprod"):
                f = getattr(np, name)
                grid.check(mesh, f, (g,), [pl], f, f"{name} {kind} axis={axis} {pl}", axis=axis)
        grid.check(
            mesh,
            lambda a: a.cumsum(axis=1, dtype=np.float32),
            (g,),
            [pl],
            lambda a: a.cumsum(axis=1, dtype=np.float32),
            f"x.cumsum dtype=float32 {kind} {pl}",
        )
        grid.check(
            mesh,
            lambda a: np.cumulative_prod(a, axis=0),
            (g,),
            [pl],
            lambda a: np.cumulative_prod(a, axis=0),
            f"cumulative_prod {kind} {pl}",
        )
    # the scan from the end: only cumsum's gradient runs it otherwise (a wrong end of the
    # shards' totals, or of the pieces added, showed only as a wrong gradient)
    for pl in placements(mesh, 2, F64):
        for axis in (0, 1, None):
            what = f"reverse cumsum {kind} axis={axis} {pl}"
            grid.check(mesh, _reverse, (g,), [pl], _reverse_np, what, axis=axis)
        what = f"reverse cumsum dtype=float32 {kind} {pl}"
        grid.check(mesh, _reverse, (g,), [pl], _reverse_np, what, axis=0, dtype=np.float32)
    for pl in placements(mesh, 2, I64):
        what = f"int reverse cumsum {kind} {pl}"
        grid.check(mesh, _reverse, (ints,), [pl], _reverse_np, what, axis=0)
        grid.check(mesh, dt.cumsum, (ints,), [pl], np.cumsum, f"int cumsum {kind} {pl}", axis=0)
        grid.check(mesh, dt.cumprod, (ints,), [pl], np.cumprod, f"int cumprod {kind} {pl}", axis=1)
        i32 = ints.astype(np.int32)  # widens to int64, as numpy: Partials reduced first
        grid.check(mesh, dt.cumsum, (i32,), [pl], np.cumsum, f"int32 cumsum {kind} {pl}", axis=0)
    for pl in placements(mesh, 2, BOOL):
        grid.check(mesh, dt.cumsum, (bools,), [pl], np.cumsum, f"bool cumsum {kind} {pl}", axis=0)
    if kind == "uneven":  # a split middle axis of a 3-D tensor
        t = data((2, shape[0], 3), F64, rng)
        for pl in placements(mesh, 3, F64):
            for axis in (1, 2):
                what = f"3-D cumsum axis={axis} {pl}"
                grid.check(mesh, np.cumsum, (t,), [pl], np.cumsum, what, axis=axis)
            what = f"3-D reverse cumsum axis=1 {pl}"
            grid.check(mesh, _reverse, (t,), [pl], _reverse_np, what, axis=1)


def _reverse(a, axis, dtype=None):
    """The scan from the end (``reverse=True``: internal, the gradient of cumsum)."""
    return scan_ops.scan("sum", a, axis, dtype, reverse=True)


def _reverse_np(a, axis, dtype=None):
    """numpy has no reverse scan: flip, scan, flip back."""
    if axis is None:
        a, axis = a.ravel(), 0
    return np.flip(np.cumsum(np.flip(a, axis), axis, dtype=dtype), axis)


NORMS = [  # (ord, axis, keepdims)
    (None, None, False),
    (None, None, True),
    (None, 0, False),
    (2, 1, True),
    (1, 0, False),
    (np.inf, 1, False),
    (-np.inf, 0, True),
    (0, 1, False),
    (3, 0, False),
    (-1.5, 1, False),
    ("fro", None, False),
    (1, None, False),
    (np.inf, None, True),
    (-1, (1, 0), False),
    (-np.inf, (0, 1), True),
]


def _norms(grid: Grid, mesh, kind: str, shape, rng) -> None:
    g = data(shape, F64, rng, "nonzero")
    c = (g + 1j * data(shape, F64, rng)).astype(np.complex128)
    ints = data(shape, I64, rng, "small")
    for i, pl in enumerate(placements(mesh, 2, F64)):
        for ord, axis, keep in NORMS[i % 2 :: 2] if mesh.size > 1 else NORMS:  # half each
            if 0 in shape and (ord in (-np.inf, -1) or (ord == -1.5 and axis == 1)):
                continue  # numpy raises (a minimum of nothing), or divides by zero
            what = f"norm ord={ord} axis={axis} keepdims={keep} {kind} {pl}"
            kw = {"ord": ord, "axis": axis, "keepdims": keep}
            grid.check(mesh, np.linalg.norm, (g,), [pl], np.linalg.norm, what, **kw)
        what = f"complex norm {kind} {pl}"
        grid.check(mesh, np.linalg.norm, (c,), [pl], np.linalg.norm, what, axis=1)
    for pl in placements(mesh, 2, I64):
        grid.check(mesh, np.linalg.norm, (ints,), [pl], np.linalg.norm, f"int norm {kind} {pl}")
    if kind == "uneven":
        t = data((2, shape[0], 3), F64, rng)
        for pl in placements(mesh, 3, F64):
            for ord, axis in (("fro", (0, 2)), (1, (2, 0)), (None, 1)):
                what = f"3-D norm ord={ord} axis={axis} {pl}"
                grid.check(
                    mesh, np.linalg.norm, (t,), [pl], np.linalg.norm, what, ord=ord, axis=axis
                )


def _comparisons(grid: Grid, mesh, kind: str, shape, rng) -> None:
    g = data(shape, F64, rng, "small")  # integer-valued: exact through Partial splits
    g = np.where(rng.random(shape) < 0.1, rng.choice([np.nan, np.inf, -np.inf], shape), g)
    h = np.where(rng.random(shape) < 0.5, g, g + rng.normal(0, 1e-6, shape))
    h = np.where(rng.random(shape) < 0.2, np.nan, h)
    ints = data(shape, I64, rng, "small")
    row = g[:1]
    for pl in placements(mesh, 2, F64):
        rep = [R] * mesh.ndim
        for name, equal_nan, same in (
            ("isclose", False, False),
            ("isclose", True, False),
            ("allclose", True, True),
            ("allclose", False, False),
            ("array_equal", False, True),
            ("array_equal", True, True),
            ("array_equal", True, False),
        ):
            f = getattr(np, name)
            what = f"{name} equal_nan={equal_nan} same={same} {kind} {pl}"
            args, pls = ((g, g), [pl, rep]) if same else ((g, h), [pl, pl])
            grid.check(mesh, f, args, pls, f, what, equal_nan=equal_nan)
        grid.check(mesh, np.isclose, (g,), [pl], np.isclose, f"isclose numpy b {pl}", b=h)
        grid.check(
            mesh,
            lambda a: np.allclose(a, 0.5, rtol=0.1, atol=np.float32(2)),
            (g,),
            [pl],
            lambda a: np.allclose(a, 0.5, rtol=0.1, atol=np.float32(2)),
            f"allclose scalar {kind} {pl}",
        )
        if g.shape[0]:
            bcast = np.broadcast_to(row, shape).copy()
            what = f"array_equiv {kind} {pl}"
            grid.check(
                mesh, np.array_equiv, (bcast, row), [pl, [R] * mesh.ndim], np.array_equiv, what
            )
    for pl in placements(mesh, 2, I64):
        what = f"int isclose {kind} {pl}"
        grid.check(mesh, np.isclose, (ints, ints + 1), [pl, pl], np.isclose, what, atol=1)
        grid.check(mesh, np.array_equal, (ints, ints), [pl, pl], np.array_equal, what)


def _statistics(grid: Grid, mesh, kind: str, shape, rng) -> None:
    g = data(shape, F64, rng)
    w = data(shape, F64, rng, "positive")
    ints = data(shape, I64, rng, "small")
    col = g[:, 0].copy()
    variants = ({}, {"bias": True}, {"ddof": 2}, {"dtype": np.float32})
    for i, pl in enumerate(placements(mesh, 2, F64)):
        for rowvar in (False, True):
            kw = variants[(i + rowvar) % len(variants)]  # each variant on some placements
            what = f"cov rowvar={rowvar} {kw} {kind} {pl}"
            grid.check(mesh, np.cov, (g,), [pl], np.cov, what, rowvar=rowvar, **kw)
            what = f"corrcoef rowvar={rowvar} {kind} {pl}"
            grid.check(mesh, np.corrcoef, (g,), [pl], np.corrcoef, what, rowvar=rowvar)
        for label, kw in (
            ("bins=5", {"bins": 5}),
            ("edges", {"bins": [-3.0, -1.0, 0.0, 0.5, 4.0]}),
            ("range", {"bins": 4, "range": (-1, 2)}),
            ("density", {"bins": 3, "density": True}),
        ):
            f = lambda a, kw=kw: np.histogram(a, **kw)[0]  # noqa: E731
            grid.check(mesh, f, (g,), [pl], f, f"histogram {label} {kind} {pl}")
        f = lambda a: np.histogram(a, 5)[1]  # noqa: E731
        grid.check(mesh, f, (g,), [pl], f, f"histogram edges {kind} {pl}")
        f = lambda a, b: np.histogram(a, 4, weights=b)[0]  # noqa: E731
        grid.check(mesh, f, (g, w), [pl, pl], f, f"histogram weights {kind} {pl}")
    for pl in placements(mesh, 2, I64):
        for axis, keep in ((None, False), (0, False), (1, True), (None, True), ((0, 1), False)):
            what = f"count_nonzero axis={axis} keepdims={keep} {kind} {pl}"
            kw = {"axis": axis, "keepdims": keep}
            grid.check(mesh, np.count_nonzero, (ints,), [pl], np.count_nonzero, what, **kw)
        for i in (0, 1):
            f = lambda a, i=i: np.histogram(a, 3)[i]  # noqa: E731
            grid.check(mesh, f, (ints,), [pl], f, f"int histogram [{i}] {kind} {pl}", exact=True)
    for pl in placements(mesh, 1, F64):
        grid.check(mesh, np.cov, (col,), [pl], np.cov, f"1-D cov {kind} {pl}")
        grid.check(mesh, np.corrcoef, (col,), [pl], np.corrcoef, f"1-D corrcoef {kind} {pl}")
        grid.check(mesh, np.cov, (col,), [pl], np.cov, f"1-D cov {kind} {pl}", rowvar=False)


def _order(grid: Grid, mesh, kind: str, shape, rng) -> None:
    """median/quantile/percentile; integer-valued floats (ties, exact through Partial splits)
    and NaNs are compared exactly, other floats exactly where no Partial rounds them."""
    ties = data(shape, F64, rng, "small")
    nans = np.where(rng.random(shape) < 0.1, np.nan, ties)
    f32 = data(shape, F32, rng)
    ints = data(shape, I64, rng)
    whole = kind == "zero"  # (0, 3): only along axis 1 is a lane not empty
    for pl in placements(mesh, 2, F64):
        exact = not any(p.is_partial() for p in pl)
        for axis, keep in ((1, True),) if whole else ((None, False), (0, False), (1, True)):
            what = f"median axis={axis} keepdims={keep} {kind} {pl}"
            grid.check(
                mesh, np.median, (ties,), [pl], np.median, what, True, axis=axis, keepdims=keep
            )
        axis = 1 if whole else 0
        q = [0.1, 0.5, 0.93]
        what = f"quantile NaN axis={axis} {kind} {pl}"
        grid.check(mesh, np.quantile, (nans,), [pl], np.quantile, what, True, q=q, axis=axis)
        what = f"percentile float32 lower {kind} {pl}"
        kw = {"q": 37.5, "method": "lower", "axis": 1 if whole else None}
        grid.check(mesh, np.percentile, (f32,), [pl], np.percentile, what, exact, **kw)
    for pl in placements(mesh, 2, I64):
        what = f"int quantile hazen {kind} {pl}"
        kw = {"q": 0.77, "axis": 1, "method": "hazen"}
        grid.check(mesh, np.quantile, (ints,), [pl], np.quantile, what, True, **kw)


FAMILIES = {
    "scan": _scans,
    "norm": _norms,
    "compare": _comparisons,
    "stats": _statistics,
    "order": _order,
}


def _values(mesh, family: str):
    grid, rng = Grid(), np.random.default_rng(len(family))
    with dt.CommCounter() as cc, np.errstate(all="ignore"):
        for kind, shape in shapes_2d(mesh).items():
            FAMILIES[family](grid, mesh, kind, shape, rng)
    return grid.result(), cc.fallbacks


@mesh_shapes
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's (and ours) on degenerate input
def test_against_numpy(family, mesh_shape, monkeypatch):
    if family == "order":  # select even where gathering the short test lanes would be cheaper
        monkeypatch.setattr(order_stats, "_selects", lambda *_: True)
    runs = simulate_on(mesh_shape, _values, family)
    assert_grid([r for r, _ in runs], minimum=40)
    assert every_rank([f for _, f in runs]) == {}, "no call may take the replicate fallback"


# -- communication -----------------------------------------------------------------------------
N, M, D = 203, 16, 5  # uneven on 2 and 4 ranks


def _counted(fn):
    with dt.CommCounter() as cc:
        out = fn()
    return out, (cc.counts, cc.bytes, cc.fallbacks)


def _communication(mesh):
    rng = np.random.default_rng(7)
    g, obs = rng.normal(size=(N, M)), rng.normal(size=(N, D))
    x = make_input(g, mesh, [S0])
    out = {}
    y, out["cumsum split"] = _counted(lambda: np.cumsum(x, axis=0))
    out["cumsum split placements"] = y.placements
    _, out["cumprod split"] = _counted(lambda: np.cumprod(x, axis=0))
    _, out["reverse cumsum split"] = _counted(lambda: _reverse(x, axis=0))
    y, out["cumsum local"] = _counted(lambda: x.cumsum(axis=1))
    out["cumsum local placements"] = y.placements
    y, out["norm axis=1"] = _counted(lambda: np.linalg.norm(x, axis=1))
    out["norm axis=1 placements"] = y.placements
    _, out["norm axis=0"] = _counted(lambda: np.linalg.norm(x, axis=0))
    _, out["norm"] = _counted(lambda: np.linalg.norm(x))
    X = make_input(obs, mesh, [S0])
    c, out["cov"] = _counted(lambda: dt.reshard(np.cov(X, rowvar=False), mesh, [R]))
    assert_close(c.numpy(), np.cov(obs, rowvar=False), "cov")
    c, out["corrcoef"] = _counted(lambda: np.corrcoef(X, rowvar=False))
    out["corrcoef placements"] = c.placements
    z = make_input(g + 1e-9, mesh, [S0])
    _, out["allclose"] = _counted(lambda: np.allclose(x, z))
    _, out["array_equal"] = _counted(lambda: np.array_equal(x, z))
    _, out["count_nonzero"] = _counted(lambda: np.count_nonzero(x > 0))
    (h, _), out["histogram"] = _counted(lambda: np.histogram(x, bins=10))
    _, out["histogram read"] = _counted(h.numpy)
    return out


@pytest.mark.parametrize("k", [2, 4])
def test_communication(k):
    """What each function hands to collectives on a (k,) mesh, observations split by rows:
    cumsum along the split axis gathers only the shards' last rows (at most k * M * 8 bytes
    per rank), a reverse one (cumsum's gradient) their first rows; along the other axis, and
    norm along it, nothing moves; a norm over the split axis is one all-reduce of its result;
    cov is one all-reduce of the D means and one of the D x D result, corrcoef the same;
    allclose, array_equal and count_nonzero one all-reduce of one element; histogram one of
    (max, -min), then one of the counts when they are read. None takes the fallback."""
    got = every_rank(simulate_on((k,), _communication))
    assert got.pop("cumsum split placements") == got.pop("cumsum local placements") == [S0]
    assert got.pop("norm axis=1 placements") == [S0]
    assert got.pop("corrcoef placements") == [R]
    assert got["cumsum split"][1]["all_gather"] <= k * M * 8
    want = {
        "cumsum split": ({"all_gather": 1}, {"all_gather": M * 8}),
        "cumprod split": ({"all_gather": 1}, {"all_gather": M * 8}),
        "reverse cumsum split": ({"all_gather": 1}, {"all_gather": M * 8}),
        "cumsum local": ({}, {}),
        "norm axis=1": ({}, {}),
        "norm axis=0": ({"all_reduce": 1}, {"all_reduce": M * 8}),
        "norm": ({"all_reduce": 1}, {"all_reduce": 8}),
        "cov": ({"all_reduce": 2}, {"all_reduce": (D + D * D) * 8}),
        "corrcoef": ({"all_reduce": 2}, {"all_reduce": (D + D * D) * 8}),
        "allclose": ({"all_reduce": 1}, {"all_reduce": 1}),
        "array_equal": ({"all_reduce": 1}, {"all_reduce": 1}),
        "count_nonzero": ({"all_reduce": 1}, {"all_reduce": 8}),
        "histogram": ({"all_reduce": 1}, {"all_reduce": 16}),
        "histogram read": ({"all_reduce": 1}, {"all_reduce": 80}),
    }
    for name, (counts, nbytes) in want.items():
        assert got[name] == (counts, nbytes, {}), (name, got[name])


def _order_communication(mesh):
    rng = np.random.default_rng(11)
    big, small = rng.normal(size=(20001, 4)), rng.normal(size=(N, M))
    x, y = make_input(big, mesh, [S0]), make_input(small, mesh, [S0])
    out = {}
    for name, fn in {
        "median axis=0": lambda a: np.median(a, axis=0),
        "quantile": lambda a: np.quantile(a, 0.3),
        "median axis=1": lambda a: np.median(a, axis=1),
    }.items():
        got, counted = _counted(lambda fn=fn: fn(x))
        assert_close(got.numpy(), fn(big), name, exact=True)
        out[name] = counted
    got, counted = _counted(lambda: np.median(y, axis=0))
    assert_close(got.numpy(), np.median(small, axis=0), "median short lanes", exact=True)
    out["median short lanes"] = counted[0], counted[2]
    return out


@pytest.mark.parametrize("k", [2, 4])
def test_order_statistics_communication(k):
    """Note [Distributed selection]: the median of each of 4 columns of 20001 rows split over
    k ranks is 8 all-reduces of 4 lanes x 2 positions (the middle, the last for NaNs) x 256
    int32 counts; a quantile of all 80004 values 8 of 1 x 3 positions x 256; along the axis that
    is whole nothing moves; short lanes (203 rows) are gathered instead (one all-gather)."""
    got = every_rank(simulate_on((k,), _order_communication))
    assert got == {
        "median axis=0": ({"all_reduce": 8}, {"all_reduce": 8 * 4 * 2 * 256 * 4}, {}),
        "quantile": ({"all_reduce": 8}, {"all_reduce": 8 * 3 * 256 * 4}, {}),
        "median axis=1": ({}, {}, {}),
        "median short lanes": ({"all_gather": 1}, {}),
    }


def _nested(mesh):
    g = np.random.default_rng(8).normal(size=(4 * 5 + 3, M))
    x = make_input(g, mesh, [S0, S0])  # both mesh dims split the rows
    y, counted = _counted(lambda: np.cumsum(x, axis=0))
    assert_close(y.numpy(), np.cumsum(g, axis=0), "nested cumsum")
    p = make_input(g, mesh, [PSUM, S0])  # a Partial stays Partial through cumsum
    q, partial = _counted(lambda: np.cumsum(p, axis=0))
    assert_close(q.numpy(), np.cumsum(g, axis=0), "Partial cumsum")
    return counted, y.placements, partial, q.placements


def test_nested_and_partial_scans():
    """On a (2, 2) mesh with both dims splitting the scanned axis, the totals are gathered
    over each (inner first): 2 all-gathers, at most 4 * M * 8 bytes per rank; a Partial(sum)
    input keeps its Partial, and gathers only over the mesh dim that splits the axis."""
    counted, pls, partial, ppls = every_rank(simulate_on((2, 2), _nested))
    assert counted[0] == {"all_gather": 2} and counted[1]["all_gather"] <= 4 * M * 8
    assert counted[2] == {} and pls == [S0, S0]
    assert partial == ({"all_gather": 1}, {"all_gather": M * 8}, {}) and ppls == [PSUM, S0]


# -- gradients of the composites -------------------------------------------------------------
def _stat_cases() -> list[GradCase]:
    rng = np.random.default_rng(23)
    x = rng.normal(size=(5, 7))
    cases = [
        GradCase(
            f"norm ord={o} axis={a}",
            lambda t, o=o, a=a: np.linalg.norm(t, o, a),
            lambda t, o=o, a=a: np.linalg.norm(t, o, a),
            (x,),
            grid="light",
        )
        for o, a in ((None, None), (None, 0), (None, 1), (1, 0), (np.inf, 1), (3, 0), (1, None))
    ]
    cases += [
        GradCase(
            f"{f.__name__} rowvar={rv}",
            lambda t, f=f, rv=rv: f(t, rowvar=rv),
            lambda t, f=f, rv=rv: f(t, rowvar=rv),
            (x,),
            grid="light",
        )
        for f in (np.cov, np.corrcoef)
        for rv in (False, True)
    ]
    return cases


STAT_CASES = _stat_cases()


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (2, 2)], ids=str)
def test_gradients_of_composites(mesh_shape):
    """norm, cov and corrcoef are dt ops all the way: their gradients are the primitives'."""
    run_grid(mesh_shape, STAT_CASES, minimum=20)


# -- the fallback, errors, result types ------------------------------------------------------
FALLBACK = {  # numpy arguments these functions do not take: numpy's result, counted
    "cumulative_sum": lambda a: np.cumulative_sum(a, axis=0, include_initial=True),
    "quantile": lambda a: np.quantile(a, 0.5, method="inverted_cdf", weights=np.ones(a.shape)),
    "np.linalg.norm": lambda a: np.linalg.norm(a, "nuc"),
    "cov": lambda a: np.cov(a, a[::-1]),
    "histogram": lambda a: np.histogram(a, "auto")[0],
}


def _fallbacks(mesh):
    g = np.random.default_rng(9).normal(size=(7, 3))
    out = {}
    for name, fn in FALLBACK.items():
        x = make_input(g, mesh, [S0])
        with dt.CommCounter() as cc:
            got = fn(x)
        assert_close(got.numpy(), fn(g), name)
        out[name] = sorted({op for op, _ in cc.fallbacks})
    return out


def test_arguments_dt_does_not_take_go_to_the_fallback():
    got = every_rank(simulate_on((2,), _fallbacks))
    for name in FALLBACK:
        assert name in got[name], (name, got[name])


def _errors(mesh):
    g = np.arange(12.0).reshape(4, 3)
    x = make_input(g, mesh, [S0])
    caught = []
    for fn in (
        lambda a: np.cumsum(a, axis=2),
        lambda a: np.linalg.norm(a, "bad"),
        lambda a: np.linalg.norm(a, axis=(0, 0)),
        lambda a: np.histogram(np.where(a > 5, np.nan, a)),
        lambda a: np.cov(a, ddof=1.5),
    ):
        try:
            fn(g)
            want = None
        except Exception as e:
            want = (type(e), str(e))
        try:
            fn(x)
            caught.append((want, None))
        except Exception as e:
            caught.append((want, (type(e), str(e))))
    return caught


def test_errors_are_numpys():
    for want, got in every_rank(simulate_on((2,), _errors)):
        assert want is not None and got == want


def _types(mesh):
    g = np.random.default_rng(10).normal(size=(5, 3))
    x = make_input(g, mesh, [S1])
    h, e = np.histogram(x)
    return (
        type(np.allclose(x, x)),
        type(np.array_equal(x, g)),
        type(np.array_equiv(x, g[0])),
        type(np.count_nonzero(x)),
        (type(h), type(e), h.dtype, e.dtype),
        (type(np.isclose(x, g)), np.isclose(x, g).dtype),
        type(np.linalg.norm(x)),
    )


def test_result_types_are_numpys():
    """Python bools for allclose/array_equal/array_equiv, numpy's np.intp scalar for
    count_nonzero(axis=None), DistTensors where numpy returns arrays (hist and bin_edges
    with numpy's dtypes) and for a 0-d norm, as np.sum of a DistTensor gives."""
    got = every_rank(simulate_on((2,), _types))
    g = np.ones((5, 3))
    h, e = np.histogram(g)
    assert got == (
        bool,
        bool,
        bool,
        type(np.count_nonzero(g)),
        (dt.DistTensor, dt.DistTensor, h.dtype, e.dtype),
        (dt.DistTensor, np.dtype(bool)),
        dt.DistTensor,
    )


def test_plain_numpy_arguments_are_numpys():
    a = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(dt.cumsum(a, axis=1), np.cumsum(a, axis=1))
    np.testing.assert_array_equal(_reverse(a, axis=1), _reverse_np(a, axis=1))
    np.testing.assert_array_equal(dt.isclose(a, a + 1, atol=1), np.ones((2, 3), bool))
    assert dt.count_nonzero(a) == 5 and dt.allclose(a, a) is True


def _median_backward(mesh):
    x = make_input(np.arange(7.0), mesh, [S0]).requires_grad_()
    m = np.median(x)
    try:
        m.backward()
    except NotImplementedError as e:
        return str(e)
    return None


def test_order_statistics_have_no_gradient():
    """A median is a selection, not a composition of dt ops: backward refuses, naming it."""
    for msg in simulate_on((2,), _median_backward):
        assert msg is not None and msg.startswith("median has no gradient")
