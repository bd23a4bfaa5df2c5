"""Reductions and their composites against numpy: every axis choice, keepdims, placement,
mesh, awkward size and dtype; methods and numpy interop."""

from __future__ import annotations

import itertools
from functools import partial

import numpy as np
import pytest
from op_cases import (
    BOOL,
    F32,
    F64,
    I64,
    MESH_SHAPES,
    PMAX,
    PMIN,
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
    numpy_takes,
    placements,
    same,
    shapes_2d,
)

import disttensor as dt
from disttensor.spmd.validate import REFS, data

pytestmark = pytest.mark.filterwarnings("ignore:.*(empty slice|Degrees of freedom):RuntimeWarning")
MESH_IDS = [str(s) for s in MESH_SHAPES]
AXES = [None, 0, -1, (-1, 0)]
DTYPES = {  # name -> dtypes numpy reduces (bools: sum counts, max is any, ...)
    "sum": (F64, F32, I64, BOOL),
    "mean": (F64, F32, I64, BOOL),
    "max": (F64, I64, BOOL),
    "min": (F64, I64, BOOL),
    "prod": (F64, I64),
    "argmax": (F64, I64),
    "argmin": (F64, I64),
    "all": (F64, I64, BOOL),
    "any": (F64, I64, BOOL),
}


def simulate_on(mesh_shape, fn, *args):
    mesh = mesh_of(mesh_shape)
    return dt.simulate(mesh.size, fn, mesh, *args)


def _reduction(mesh, name):
    grid, rng = Grid(), np.random.default_rng(20)
    fn, ref = getattr(dt, name), getattr(np, name)
    axes = [a for a in AXES if not isinstance(a, tuple)] if name.startswith("arg") else AXES
    domain = "small" if name in ("all", "any", "prod") else "real"  # zeros; no overflow
    for dtype in DTYPES[name]:
        shapes = shapes_2d(mesh) if dtype == F64 else {"uneven": shapes_2d(mesh)["uneven"]}
        shapes.pop("even", None)  # the easy case: the method tests have it
        for label, shape in shapes.items():
            x = data(shape, dtype, rng, domain)
            for pl in placements(mesh, 2, dtype):
                for axis, keepdims in [(a, False) for a in axes] + [(1, True)]:
                    kw = {"axis": axis, "keepdims": keepdims}
                    if numpy_takes(ref, (x,), kw):  # max of a zero-size axis raises
                        what = f"{name}({dtype}{shape} {label}, {kw}) {pl}"
                        grid.check(mesh, fn, (x,), [pl], ref, what, **kw)
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
@pytest.mark.parametrize("name", list(DTYPES))
def test_reduction(name, mesh_shape):
    assert_grid(simulate_on(mesh_shape, _reduction, name))


def _cube(mesh):
    """3-D inputs: a tuple axis that skips the middle, every placement of all three axes."""
    grid, rng = Grid(), np.random.default_rng(21)
    x = data((mesh.size + 1, 3, 2 * mesh.size + 1), F64, rng)
    for pl in placements(mesh, 3, F64):
        for name in ("sum", "mean", "max", "min", "prod"):
            ref = getattr(np, name)
            grid.check(mesh, getattr(dt, name), (x,), [pl], ref, f"{name} {pl}", axis=(0, 2))
        grid.check(mesh, dt.argmin, (x,), [pl], np.argmin, f"argmin {pl}", axis=1)
        grid.check(mesh, dt.softmax, (x,), [pl], REFS["softmax"], f"softmax {pl}", axis=1)
        grid.check(mesh, dt.var, (x,), [pl], np.var, f"var {pl}", axis=(0, 2), ddof=1)
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_3d_inputs(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _cube))


COMPOSITES = {  # name -> (reference, keyword variants)
    "var": (np.var, [{"axis": a, "ddof": d} for a in (None, 0, 1, (0, 1)) for d in (0, 1)]),
    "std": (np.std, [{"axis": None}, {"axis": 0, "ddof": 1}, {"axis": -1, "keepdims": True}]),
    "logsumexp": (
        REFS["logsumexp"],
        [{"axis": None}, {"axis": 0}, {"axis": 1, "keepdims": True}, {"axis": (0, 1)}],
    ),
    "softmax": (REFS["softmax"], [{"axis": a} for a in (0, 1, -1, -2, None, (0, 1))]),
    "log_softmax": (REFS["log_softmax"], [{"axis": a} for a in (0, 1, -1, -2, None, (1, 0))]),
}
# the fused ops of Note [Fused or composite] (disttensor/ops/nn.py): zero-size inputs and
# float32 too, on the placements that split the reduced axes (composite) and those that do not
FUSED = ("logsumexp", "softmax", "log_softmax")


def _composite(mesh, name):
    grid, rng = Grid(), np.random.default_rng(22)
    ref, variants = COMPOSITES[name]
    labels = ("uneven", "empty", "zero") if name in FUSED else ("uneven", "empty")
    cases = [(label, F64) for label in labels if name != "std" or label == "uneven"]
    cases += [("uneven", F32)] if name in FUSED else []
    for label, dtype in cases:
        x = data(shapes_2d(mesh)[label], dtype, rng)
        for pl in placements(mesh, 2, dtype):
            for kw in variants:
                what = f"{name} {dtype} {label} {kw} {pl}"
                grid.check(mesh, getattr(dt, name), (x,), [pl], ref, what, **kw)
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
@pytest.mark.parametrize("name", list(COMPOSITES))
def test_composite(name, mesh_shape):
    assert_grid(simulate_on(mesh_shape, _composite, name))


def _fused_moves_nothing(mesh):
    """Over axes no mesh dim splits, each is one fused op (the output's recorded op) with no
    collective in forward or backward, and the batch axis stays split in both."""
    rng = np.random.default_rng(23)
    g = rng.normal(size=(2 * mesh.size + 1, 5, 3))
    calls = {
        "softmax": lambda t: dt.softmax(t, axis=1),
        "log_softmax": lambda t: dt.log_softmax(t, axis=(1, 2)),
        "logsumexp": lambda t: dt.logsumexp(t, axis=-1, keepdims=True),
    }
    out = []
    for pl in map(list, itertools.product([S0, dt.Replicate()], repeat=mesh.ndim)):
        for name, call in calls.items():
            x = dt.shard_tensor(g, mesh, pl, requires_grad=True)
            with dt.CommCounter() as cc:
                y = call(x)
                op = y._node[0].name
                y.backward(grad=np.ones(y.shape))
            out.append((name, op, cc.total, y.placements == pl, x.grad.placements == pl))
    return out


@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)], ids=str)
def test_fused_softmax_moves_nothing(mesh_shape):
    for name, op, total, kept, grad_kept in every_rank(
        simulate_on(mesh_shape, _fused_moves_nothing)
    ):
        assert (op, total, kept, grad_kept) == (name, 0, True, True), (name, op, total)


def test_softmax_is_stable_for_large_values():
    g = np.array([[1000.0, 1001.0, 999.0], [-1000.0, 0.0, 5.0]])

    def body(mesh):
        x = make_input(g, mesh, [S1])
        return dt.softmax(x).numpy(), dt.logsumexp(x, axis=1).numpy()

    soft, lse = every_rank(simulate_on((3,), body))
    shifted = g - g.max(axis=1, keepdims=True)
    assert np.isfinite(soft).all() and np.isfinite(lse).all()
    assert_close(soft, np.exp(shifted) / np.exp(shifted).sum(1, keepdims=True), "softmax")
    assert_close(lse, g.max(1) + np.log(np.exp(shifted).sum(1)), "logsumexp")


METHODS = {
    "x.sum(axis=0)": lambda x: x.sum(axis=0),
    "x.sum(axis=[0, 1])": lambda x: x.sum(axis=[0, 1]) if isinstance(x, dt.DistTensor) else x.sum(),
    "x.mean()": lambda x: x.mean(),
    "x.max(1, keepdims)": lambda x: x.max(1, keepdims=True),
    "x.min(-1)": lambda x: x.min(-1),
    "x.prod(0)": lambda x: x.prod(0),
    "x.argmax()": lambda x: x.argmax(),
    "x.argmin(0)": lambda x: x.argmin(0),
    "x.var(ddof=1)": lambda x: x.var(ddof=1),
    "x.std(axis=1)": lambda x: x.std(axis=1),
    "(x > 0).all(0)": lambda x: (x > 0).all(0),
    "(x > 0).any()": lambda x: (x > 0).any(),
    "np.sum(x, axis=0)": lambda x: np.sum(x, axis=0),
    "np.sum keepdims": lambda x: np.sum(x, axis=1, keepdims=True),
    "np.mean(x)": lambda x: np.mean(x),
    "np.var(x, ddof=1)": lambda x: np.var(x, ddof=1),
    "np.max(x, axis=1)": lambda x: np.max(x, axis=1),
    "np.argmax(x, axis=0)": lambda x: np.argmax(x, axis=0),
    "np.add.reduce(x)": lambda x: np.add.reduce(x),
    "np.add.reduce(x, axis=1)": lambda x: np.add.reduce(x, axis=1),
    "np.maximum.reduce(x, axis=None)": lambda x: np.maximum.reduce(x, axis=None),
    "np.minimum.reduce(x, 1, keepdims)": lambda x: np.minimum.reduce(x, axis=1, keepdims=True),
    "np.multiply.reduce(x)": lambda x: np.multiply.reduce(x),
    "np.logical_or.reduce(x > 0)": lambda x: np.logical_or.reduce(x > 0),
}


def _methods(mesh):
    grid, rng = Grid(), np.random.default_rng(23)
    x = data((8, 4), F64, rng)  # even shards on 2 and 2 x 2 ranks, uneven on 3
    for pl in placements(mesh, 2, F64):
        for text, fn in METHODS.items():
            grid.check(mesh, fn, (x,), [pl], fn, f"{text} {pl}")
    return grid.result()


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (2, 2)], ids=str)
def test_methods_and_numpy_interop(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _methods))


def test_reduction_errors():
    def body(mesh):
        x = make_input(np.ones((4, 3)), mesh, [S0])
        with pytest.raises(np.exceptions.AxisError):
            x.sum(axis=2)
        with pytest.raises(ValueError, match="duplicate"):
            x.sum(axis=(0, 0))
        return True

    assert simulate_on((2,), body) == [True, True]


# -- regressions -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sum", "mean"])
@pytest.mark.parametrize("axis", [None, 0])
def test_sum_of_bool_partial_sum(name, axis):
    """Regression (was: sum/mean kept a bool Partial(sum), a logical or, as a sum of counts)."""

    def body(mesh):
        x = dt.dtensor_from_local(np.ones((2, 3), bool), mesh, [PSUM], global_shape=(2, 3))
        return getattr(dt, name)(x, axis=axis).numpy()  # the true value is all True

    want = getattr(np, name)(np.ones((2, 3), bool), axis=axis)
    assert_close(every_rank(simulate_on((2,), body)), want, f"{name} of bool Partial(sum)")


@pytest.mark.parametrize(
    "name,locals_,kind",
    [
        ("all", [[-2.0, 3.0], [0.0, 3.0]], PMIN),  # true value [-2, 3]: all True
        ("any", [[-3, 0], [0, 0]], PMAX),  # true value [0, 0]: any False
    ],
    ids=["all Partial(min) float", "any Partial(max) int"],
)
def test_all_any_of_numeric_partial(name, locals_, kind):
    """Regression (was: all/any kept Partial(min/max) inputs Partial, exact for bools only:
    nonzero-ness of numbers is not monotone)."""

    def body(mesh):
        local = np.asarray(locals_[dt.get_rank()])
        x = dt.dtensor_from_local(local, mesh, [kind], global_shape=local.shape)
        return getattr(dt, name)(x).numpy(), getattr(np, name)(x.numpy())

    got, want = every_rank(simulate_on((2,), body))
    assert_close(got, want, f"{name} of a numeric {kind}")


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # numpy warns too
def test_var_with_ddof_of_a_single_element():
    """Regression (was: ZeroDivisionError for ddof >= n; numpy gives nan/inf)."""

    def body(mesh):
        return dt.var(make_input(np.ones((1, 3)), mesh, [S1]), axis=0, ddof=1).numpy()

    with np.errstate(all="ignore"):
        want = np.var(np.ones((1, 3)), axis=0, ddof=1)
    assert_close(every_rank(simulate_on((2,), body)), want, "var ddof=1 of one element")


def test_mean_of_uneven_shards_is_exact():
    """Partial(avg) from a mean over a sharded axis: exact whatever the split."""

    def body(mesh):
        g = np.arange(7.0) ** 2
        x = make_input(g, mesh, [S0])
        m = x.mean()
        return m.placements, m.numpy(), dt.mean(make_input(g[:2], mesh, [S0])).numpy()

    for pl, got, tiny in simulate_on((3,), body):
        assert pl == [dt.Partial("avg")]
        assert_close(got, np.mean(np.arange(7.0) ** 2), "mean uneven", exact=True)
        assert_close(tiny, np.float64(0.5), "mean with an empty shard", exact=True)


def test_max_min_of_partial_and_empty_shards():
    def body(mesh):
        grid, rng = Grid(), np.random.default_rng(24)
        tiny = data((2, 3), I64, rng)  # 4 ranks: two hold empty row shards
        for pl in ([S0], [PMAX], [PMIN], [S1]):
            for name in ("max", "min", "argmax", "sum"):
                ref = partial(getattr(np, name), axis=0)
                grid.check(
                    mesh, partial(getattr(dt, name), axis=0), (tiny,), [pl], ref, f"{name} {pl}"
                )
        return grid.result()

    assert_grid(simulate_on((4,), body))


# -- empty axes: numpy's error, or numpy's value (Note [Empty reductions]) -------------------------
EMPTY_FORMS = {  # spelling -> (call on a DistTensor or a numpy array, whether dt computes it)
    "x.max": (lambda x, **kw: x.max(**kw), True),
    "x.min": (lambda x, **kw: x.min(**kw), True),
    "np.amax": (lambda x, **kw: np.amax(x, **kw), True),
    "np.min": (lambda x, **kw: np.min(x, **kw), True),
    "np.maximum.reduce": (lambda x, axis=None, **kw: np.maximum.reduce(x, axis=axis, **kw), True),
    "x.argmax": (lambda x, **kw: x.argmax(**kw), True),
    "np.argmin": (lambda x, **kw: np.argmin(x, **kw), True),
    # numpy's own function (the replicate fallback), which gets a zero-size tensor's value
    # without a gather: its errors come before any communication too
    "np.ptp": (lambda x, **kw: np.ptp(x, **kw), True),
    "np.nanmax": (lambda x, **kw: np.nanmax(x, **kw), True),
    "np.max initial=": (lambda x, **kw: np.max(x, initial=-1.0, **kw), True),
    "np.min where= initial=": (
        lambda x, **kw: np.min(x, where=np.ones(x.shape, bool), initial=5.0, **kw),
        True,
    ),
}
EMPTY_PLACEMENTS = {1: [[S0], [S1], [R], [PMAX]], 2: [[S0, S1], [S1, S0], [S0, S0], [R, PMAX]]}


def _outcome(fn, x, kw):
    """``fn(x, **kw)``: ("ok", its value) or (exception type, message)."""
    try:
        with np.errstate(all="ignore"):
            got = fn(x, **kw)
    except Exception as e:
        return type(e), str(e)
    return "ok", got.numpy() if isinstance(got, dt.DistTensor) else np.asarray(got)


def _empty_axes(mesh):
    """Zero-size tensors (and one whose shards are empty on some ranks only) reduced over every
    axis, split or not: numpy's exception type and text on every rank, before any
    communication where dt computes the reduction itself, or numpy's value."""
    failures, count = [], 0
    for shape in [(0,), (0, 3), (3, 0), (0, 0), (1, 2)]:
        g = np.zeros(shape)
        axes = [None, 0, -1] + ([(0, 1)] if len(shape) == 2 else [])
        kws = [{"axis": a} for a in axes] + [{"axis": 0, "keepdims": True}]
        for pl in EMPTY_PLACEMENTS[mesh.ndim]:
            if any(p.is_shard() and p.dim >= len(shape) for p in pl):
                continue
            x = make_input(g, mesh, pl)
            for text, (fn, ours) in EMPTY_FORMS.items():
                for kw in kws:
                    if text[-6:] in ("argmax", "argmin") and isinstance(kw["axis"], tuple):
                        continue  # numpy's arg reductions take one axis
                    what = f"{text}({shape}, {kw}) {pl}"
                    want = _outcome(fn, g, kw)
                    with dt.CommCounter() as cc:
                        got = _outcome(fn, x, kw)
                    count += 1
                    if want[0] == "ok" or got[0] == "ok":
                        if not same(got, want):
                            failures.append(f"{what}: {got}, numpy {want}")
                    elif got != want:
                        failures.append(f"{what}: raised {got}, numpy {want}")
                    elif ours and (cc.total or cc.checks):
                        failures.append(f"{what}: communicated {cc.counts} before raising")
    return failures, count


@pytest.mark.filterwarnings("ignore:All-NaN:RuntimeWarning")
@pytest.mark.parametrize("mesh_shape", [(1,), (2,), (3,), (4,), (2, 2)], ids=str)
def test_empty_axes_raise_numpys_error(mesh_shape):
    """Regression (was: max/min over an empty split axis returned -inf/+inf, the identity the
    local reductions start from, where numpy raises)."""
    failures, count = every_rank(simulate_on(mesh_shape, _empty_axes))
    assert count > 300 and not failures, "\n".join(failures[:20])
