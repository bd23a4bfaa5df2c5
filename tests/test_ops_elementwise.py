"""Elementwise ops against numpy: every op over meshes (1) (2) (3) (4) (2, 2), placements,
awkward sizes and dtypes; broadcasting, scalars, dense arrays, operators, numpy interop."""

from __future__ import annotations

import itertools
import logging
from collections import Counter

import numpy as np
import pytest
from op_cases import (
    DTYPES,
    F64,
    I64,
    MESH_SHAPES,
    PMAX,
    PSUM,
    S0,
    S1,
    Grid,
    R,
    arg_data,
    assert_close,
    assert_grid,
    every_rank,
    make_input,
    mesh_of,
    numpy_takes,
    pairs,
    placements,
    reference,
    shapes_2d,
)

import disttensor as dt
from disttensor import accounting
from disttensor.ops import elementwise as ew

MESH_IDS = [str(s) for s in MESH_SHAPES]
# Binary ops with full placement grids: one per linearity class of spmd/rules.py (linear,
# multilinear, linear in the first argument, none). The others share the rule code of their
# class, so they get the placement pairs that are equal or have a Replicate side.
FULL = {"add", "multiply", "divide", "less"}


def simulate_on(mesh_shape, fn, *args):
    """``fn(mesh, *args)`` on the ranks of the mesh; every rank's result."""
    mesh = mesh_of(mesh_shape)
    return dt.simulate(mesh.size, fn, mesh, *args)


def _unary(mesh, name):
    grid, rng = Grid(), np.random.default_rng(1)
    fn, ref = getattr(dt, name), reference(name)
    for dtype in DTYPES:
        shapes = shapes_2d(mesh) if dtype == F64 else {"uneven": shapes_2d(mesh)["uneven"]}
        shapes.pop("even", None)  # the easy case; the binary grids have it
        for label, shape in shapes.items():
            x = arg_data(name, 0, shape, dtype, rng)
            if numpy_takes(ref, (x,)):
                for pl in placements(mesh, 2, dtype):
                    grid.check(mesh, fn, (x,), [pl], ref, f"{name}({dtype}{shape} {label}) {pl}")
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
@pytest.mark.parametrize("name", list(ew.UNARY))
def test_unary(name, mesh_shape):
    assert_grid(simulate_on(mesh_shape, _unary, name))


def _binary(mesh, name):
    grid, rng = Grid(), np.random.default_rng(2)
    fn, ref, full = getattr(dt, name), reference(name), name in FULL
    for dtype in DTYPES:
        shapes = shapes_2d(mesh) if dtype == F64 else {"uneven": shapes_2d(mesh)["uneven"]}
        for label, shape in shapes.items():
            x, y = (arg_data(name, i, shape, dtype, rng) for i in (0, 1))
            if not numpy_takes(ref, (x, y)):
                continue
            if label == "uneven":
                combos = pairs(mesh, x, y, full=full)
            elif full:  # the sizes are the point: fewer placements
                combos = pairs(mesh, x, y, full=False)
            else:
                continue
            for pa, pb in combos:
                what = f"{name}({dtype}{shape} {label}) {pa} {pb}"
                grid.check(mesh, fn, (x, y), [pa, pb], ref, what)
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
@pytest.mark.parametrize("name", list(ew.BINARY))
def test_binary(name, mesh_shape):
    assert_grid(simulate_on(mesh_shape, _binary, name))


BROADCAST = [((7, 4), (4,)), ((4,), (7, 4)), ((7, 4), (7, 1)), ((7, 1), (1, 4)), ((), (7, 4))]


def _broadcast(mesh, name):
    grid, rng = Grid(), np.random.default_rng(3)
    fn, ref = getattr(dt, name), reference(name)
    for sa, sb in BROADCAST:
        x, y = arg_data(name, 0, sa, F64, rng), arg_data(name, 1, sb, F64, rng)
        for pa, pb in pairs(mesh, x, y):
            grid.check(mesh, fn, (x, y), [pa, pb], ref, f"{name} {sa}{pa} with {sb}{pb}")
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
@pytest.mark.parametrize("name", ["add", "multiply", "greater_equal"])
def test_broadcasting(name, mesh_shape):
    assert_grid(simulate_on(mesh_shape, _broadcast, name))


def clip_max(a):
    return a.clip(a_max=2) if isinstance(a, dt.DistTensor) else a.clip(max=2)


def astype(a, dtype):
    return a.astype(dtype)


def _ternary(mesh):
    grid, rng = Grid(), np.random.default_rng(4)
    shape = shapes_2d(mesh)["uneven"]
    cond, x, y = rng.random(shape) < 0.5, arg_data("where", 1, shape, F64, rng), rng.random(shape)
    for pc, px in pairs(mesh, cond, x):
        for py in [px, [R] * mesh.ndim, placements(mesh, 2, F64)[-1]]:
            grid.check(mesh, dt.where, (cond, x, y), [pc, px, py], np.where, f"where {pc}{px}{py}")
        grid.check(mesh, dt.where, (cond, x, 0.0), [pc, px], np.where, f"where(c, x, 0) {pc}{px}")
        grid.check(mesh, dt.clip, (x, y - 0.5, 0.8), [px, pc], np.clip, f"clip {px} {pc}")
    ints = arg_data("clip", 0, shape, I64, rng)
    for pl in placements(mesh, 2, I64):
        grid.check(mesh, dt.clip, (ints, -3, None), [pl], np.clip, f"clip int {pl}")
        grid.check(mesh, clip_max, (ints,), [pl], clip_max, f"x.clip(a_max=2) {pl}")
        for dtype in DTYPES:
            grid.check(mesh, dt.astype, (ints, dtype), [pl], astype, f"astype {dtype} {pl}")
            grid.check(mesh, astype, (x, dtype), [pl], astype, f"x.astype({dtype}) {pl}")
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_where_clip_astype(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _ternary))


# -- scalars, dense arrays, operators ------------------------------------------------------
SCALARS = [2, 2.5, True, np.float64(1.5), np.float32(0.5)]


def _scalars(mesh):
    grid, rng = Grid(), np.random.default_rng(5)
    for dtype in DTYPES:
        cycle = itertools.cycle(placements(mesh, 2, dtype))
        for name, s in itertools.product(ew.BINARY, SCALARS):
            x, ref = arg_data(name, 0, (5, 3), dtype, rng), reference(name)
            for args in ((x, s), (s, x)):
                if numpy_takes(ref, args):  # numpy's dtype wins: float32 + 1.0 stays float32
                    pl = next(cycle)
                    what = f"{name}({args[0]!r:.12}, {args[1]!r:.12}) {dtype} {pl}"
                    grid.check(mesh, getattr(dt, name), args, [pl], ref, what)
    return grid.result()


@pytest.mark.parametrize("mesh_shape", [(2,), (3,)], ids=str)
def test_python_and_numpy_scalars(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _scalars), minimum=500)


def test_scalar_keeps_float32():
    def body(mesh):
        x = make_input(np.ones((5, 3), np.float32), mesh, [S0])
        kinds = [(x + 1.0).dtype, (2.0 * x).dtype, (x / 3).dtype, (x**2).dtype, (1 - x).dtype]
        return kinds, (x + np.float64(1)).dtype, (make_input(np.ones(3, bool), mesh, [R]) + 1).dtype

    kinds, with_np64, bool_plus_int = every_rank(simulate_on((2,), body))
    assert kinds == [np.float32] * 5
    assert with_np64 == np.float64  # a numpy scalar is typed (NEP 50), as numpy does
    assert bool_plus_int == np.int64


OPERATORS = {
    "x + y": lambda x, y: x + y,
    "x - y": lambda x, y: x - y,
    "x * y": lambda x, y: x * y,
    "x / y": lambda x, y: x / y,
    "x ** 2": lambda x, y: x**2,
    "2 ** y": lambda x, y: 2.0**y,
    "x // y": lambda x, y: x // y,
    "x % y": lambda x, y: x % y,
    "x @ dense": lambda x, y: x @ np.ones((3, 2)),
    "-x": lambda x, y: -x,
    "+x": lambda x, y: +x,
    "abs(x)": lambda x, y: abs(x),
    "1 - x": lambda x, y: 1 - x,
    "1 / y": lambda x, y: 1 / y,
    "7 // y": lambda x, y: 7 // y,
    "x == y": lambda x, y: x == y,
    "x != y": lambda x, y: x != y,
    "x < y": lambda x, y: x < y,
    "x <= y": lambda x, y: x <= y,
    "x > 0": lambda x, y: x > 0,
    "0 >= y": lambda x, y: y <= 0,
    "x + dense": lambda x, y: x + np.arange(3.0),
    "dense * x": lambda x, y: np.arange(3.0) * x,
    "dense - y (2-D)": lambda x, y: np.ones((5, 3)) - y,
    "dt.add(dense, y)": lambda x, y: dt.add(np.full((5, 3), 0.5), y),
    "np.add(x, dense)": lambda x, y: np.add(x, np.ones(3)),
}


def _operators(mesh):
    grid, rng = Grid(), np.random.default_rng(6)
    x = rng.integers(-4, 5, (5, 3)).astype(np.float64)
    y = rng.integers(1, 5, (5, 3)) * rng.choice([-1.0, 1.0], (5, 3))
    combos = pairs(mesh, x, y, full=mesh.shape == (3,))
    for (text, fn), (px, py) in itertools.product(OPERATORS.items(), combos):
        grid.check(mesh, fn, (x, y), [px, py], fn, f"{text} {px} {py}")
    return grid.result()


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (2, 2)], ids=str)
def test_operators(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _operators))


def test_scalar_mod_tensor():
    """Regression (was: no __rmod__, `3 % x` raised TypeError)."""

    def body(mesh):
        return (3 % make_input(np.arange(1.0, 6.0), mesh, [S0])).numpy()

    assert_close(every_rank(simulate_on((2,), body)), 3 % np.arange(1.0, 6.0), "3 % x")


# -- numpy interop and the fallback ----------------------------------------------------------
def test_numpy_ufuncs_use_the_op_set():
    def body(mesh):
        g = np.linspace(-2, 3, 15).reshape(5, 3)
        x = make_input(g, mesh, [S1])
        before = Counter(accounting.FALLBACKS)
        pairs_ = [
            (np.exp(x), np.exp(g)),
            (np.add(x, 1.0), g + 1.0),
            (np.maximum(x, 0), np.maximum(g, 0)),
            (np.where(x > 0, x, 0.0), np.where(g > 0, g, 0.0)),
            (np.clip(x, -1, 1), np.clip(g, -1, 1)),
            (np.round(x, 1), np.round(g, 1)),
            (np.abs(x), np.abs(g)),
        ]
        for got, want in pairs_:
            assert isinstance(got, dt.DistTensor)
            assert_close(got.numpy(), want, "numpy ufunc")
        return accounting.FALLBACKS - before

    assert every_rank(simulate_on((2,), body)) == Counter()


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (4,), (2, 2)])
def test_one_reshard_per_distinct_input(mesh_shape):
    """Note [One move per input]: an op whose operands are the same tensor moves it once
    (``d * d`` on a Partial d: one all-reduce per Partial mesh dim, not one per operand)."""
    g = np.linspace(-2, 3, 35).reshape(7, 5)  # uneven on every mesh

    def body(mesh):
        pls = [PSUM] * mesh.ndim
        counts = {}
        for name, fn, ref in [
            ("d * d", lambda d: d * d, g * g),
            ("multiply(d, d)", lambda d: dt.multiply(d, d), g * g),
            ("where(m, d * d, d)", lambda d: dt.where(g > 0, d * d, d), np.where(g > 0, g * g, g)),
            ("maximum(d, d)", lambda d: dt.maximum(d, d), g),
        ]:
            # a new d each time: one reduced before would be reused across ops as well (Note
            # [One move per tensor]: tests/test_reshard_memo.py)
            d = make_input(g, mesh, pls)
            with dt.CommCounter() as cc:
                y = fn(d)
            counts[name] = cc.counts
            assert_close(y.numpy(), ref, name)
        x = make_input(g, mesh, [S1] + [R] * (mesh.ndim - 1), seed=2)
        with dt.CommCounter() as cc:
            y = x @ x.T
        counts["x @ x.T"] = cc.counts
        assert_close(y.numpy(), g @ g.T, "x @ x.T")
        return counts

    counts = every_rank(simulate_on(mesh_shape, body))
    reduce = {"all_reduce": len(mesh_shape)}
    assert counts["d * d"] == counts["multiply(d, d)"] == counts["maximum(d, d)"] == reduce
    assert counts["where(m, d * d, d)"] == reduce  # d reduced once; where keeps d Partial
    assert counts["x @ x.T"] == {}  # S(1) @ S(0) contracts the split axis: Partial, no move


def test_one_reshard_per_input_with_gradients():
    """The same with autograd recording: x * x on a Partial leaf reduces x once forward, and
    its gradient is 2 x."""

    def body(mesh):
        x = make_input(np.arange(6.0).reshape(3, 2), mesh, [PSUM])
        x.requires_grad = True
        with dt.CommCounter() as cc:
            y = (x * x).sum()
        y.backward()
        return cc.counts, x.grad.numpy()

    counts, grad = every_rank(simulate_on((2,), body))
    assert counts == {"all_reduce": 1}
    assert_close(grad, 2 * np.arange(6.0).reshape(3, 2), "grad of x * x")


def test_fallback_counts_and_logs_once(caplog):
    """A numpy function dt does not implement: the replicate fallback, exact, counted per
    call (with its bytes) and logged once per (op, reason), by rank 0 only."""
    key = ("unwrap", "no dt implementation: inputs gathered, computed whole on every rank")
    accounting.FALLBACKS.pop("unwrap", None)
    accounting.FALLBACK_LOG.pop(key, None)
    accounting._LOGGED.discard(key)  # logged once: start from unseen

    def body(mesh):
        g = np.arange(10.0).reshape(5, 2) ** 2
        x = make_input(g, mesh, [PSUM])
        with dt.CommCounter() as cc:
            out = [np.unwrap(x), np.unwrap(x, axis=0)]
        assert all(isinstance(o, dt.DistTensor) and o.placements == [R] for o in out)
        assert_close(out[0].numpy(), np.unwrap(g), "unwrap")
        assert_close(out[1].numpy(), np.unwrap(g, axis=0), "unwrap axis=0")
        return cc.fallbacks, cc.total_bytes

    with caplog.at_level(logging.WARNING, logger="disttensor"):
        seen = simulate_on((2,), body)
    assert accounting.FALLBACKS["unwrap"] == 2 * 2  # two calls on each of two ranks
    assert accounting.FALLBACK_LOG[key] == [4, sum(b for _, b in seen)]  # calls, bytes
    assert all(f == {key: 2} for f, _ in seen)
    logged = [r for r in caplog.records if "unwrap" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING, logged
    assert logged[0].threadName == "dt-rank-0"
    assert key[1] in logged[0].getMessage()


def test_concatenate_interop():
    """np.concatenate on DistTensors: a shape op's rule or the replicate fallback, exact."""

    def body(mesh):
        g = np.arange(10.0).reshape(5, 2)
        both = np.concatenate([make_input(g, mesh, [PSUM]), make_input(g + 1, mesh, [S0])])
        assert_close(both.numpy(), np.concatenate([g, g + 1]), "concatenate", exact=True)

    simulate_on((2,), body)


def test_python_scalars_of_0d_results():
    def body(mesh):
        x = make_input(np.array([[1.5, -2.0, 4.0]]).repeat(3, 0), mesh, [PMAX])
        total = x.sum()
        return bool(total > 0), float(total), int(x.max()), float(x.mean()), (x < 0).any().item()

    for got in simulate_on((3,), body):
        assert got == (True, 10.5, 4, 3.5 / 3, True)


def test_operands_on_two_meshes_raise_on_every_rank():
    def body(_mesh):
        a = dt.ones((4, 2), mesh=dt.ProcessMesh([0, 1]), placements=[S0])
        b = dt.ones((4, 2), mesh=dt.ProcessMesh([1, 0]), placements=[S0])
        with pytest.raises(ValueError, match="different meshes"):
            a + b
        with pytest.raises(ValueError, match="different meshes"):
            dt.where(a > 0, a, b)
        return True

    assert simulate_on((2,), body) == [True, True]


def test_rank_outside_the_mesh():
    """A rank outside the operands' mesh skips the kernel and still gets the output's dtype."""

    def body():
        mesh = dt.ProcessMesh([0, 1])
        x = make_input(np.arange(6.0).reshape(3, 2), mesh, [S0])
        y = (x > 2) * 1.5 + dt.exp(x)
        if dt.get_rank() in mesh:
            g = np.arange(6.0).reshape(3, 2)
            assert_close(y.numpy(), (g > 2) * 1.5 + np.exp(g), "outside the mesh")
        return y.dtype, y.local_shape

    got = dt.simulate(3, body)
    assert got[2] == (np.float64, (0, 0))


def test_bool_partial_kinds():
    """Partial(sum) of bools is a logical or; ops that keep bools are exact on it."""

    def body(mesh):
        grid, rng = Grid(), np.random.default_rng(7)
        a, b = rng.random((5, 3)) < 0.5, rng.random((5, 3)) < 0.5
        for pa, pb in pairs(mesh, a, b):
            for name in ("logical_and", "logical_or", "add", "multiply", "maximum", "equal"):
                ref, what = getattr(np, name), f"{name} {pa}{pb}"
                grid.check(mesh, getattr(dt, name), (a, b), [pa, pb], ref, what)
        return grid.result()

    assert_grid(simulate_on((3,), body))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x + np.arange(3),
        lambda x: x * 3,
        lambda x: x / 2,
        lambda x: dt.conjugate(x),
        lambda x: x - np.ones(3, np.int64),
    ],
    ids=["add int", "multiply 3", "divide 2", "conjugate", "subtract int"],
)
def test_bool_partial_sum_promoted(fn):
    """Regression: a bool Partial(sum) is a logical or; an op that promotes it to a number must
    not add up the ranks' Trues (was: linear rules kept it Partial(sum))."""

    def body(mesh):
        x = dt.dtensor_from_local(np.ones((2, 3), bool), mesh, [PSUM], global_shape=(2, 3))
        return fn(x).numpy()  # the true value is all True: or(True, True)

    got = every_rank(simulate_on((2,), body))
    assert_close(got, np.asarray(fn(np.ones((2, 3), bool))), "bool Partial(sum)")


@pytest.mark.parametrize(
    "fn",
    [dt.add, dt.subtract, lambda b, i: dt.where(np.ones((2, 3), bool), b, i)],
    ids=["add", "subtract", "where"],
)
def test_bool_partial_sum_with_another_partial_sum(fn):
    def body(mesh):
        b = dt.dtensor_from_local(np.ones((2, 3), bool), mesh, [PSUM], global_shape=(2, 3))
        i = dt.dtensor_from_local(np.full((2, 3), 2 + dt.get_rank()), mesh, [PSUM], (2, 3))
        return fn(b, i).numpy(), fn(b.numpy(), i.numpy())  # true values: all True and 5

    got, want = every_rank(simulate_on((2,), body))
    assert_close(got, want, "bool Partial(sum) with an int Partial(sum)")
