"""numpy's ufuncs on DistTensors: every one runs an op with an SPMD rule (Note [numpy's ufuncs]
in disttensor/ops/elementwise.py), except the commented exceptions below.

The ops that came with that note (the inverse trig and hyperbolic functions, cbrt, exp2, the
degree conversions, fmod, divmod, the bitwise and integer ufuncs, ...) against numpy on meshes
(1), (2), (3), (4) and (2, 2), uneven and empty shards and every placement of op_cases: the
gathered result equals numpy's on the gathered inputs, and for Shard and Replicate inputs the
output keeps the input's layout with no collective. Then numpy's dtype rules (bitwise ops on
bool and integers, numpy's TypeError with no collective), the gradients, the ufunc methods,
and a Game of Life whose board keeps its row split and moves only halo rows.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from grad_cases import ufunc_cases
from grad_cases import ufunc_data as _data
from op_cases import (
    BOOL,
    F32,
    F64,
    I64,
    MESH_SHAPES,
    PAVG,
    PMAX,
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
    pairs,
    place,
    placements,
    shapes_2d,
)

import disttensor as dt
from disttensor import autograd
from disttensor.ops import elementwise as ew
from disttensor.ops import numpy_interop
from disttensor.spmd import get_rule, registered_ops

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
MESH_IDS = [str(s) for s in MESH_SHAPES]
I8, U8, U64 = np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.uint64)


def simulate_on(mesh_shape, fn, *args):
    mesh = mesh_of(mesh_shape)
    return dt.simulate(mesh.size, fn, mesh, *args)


# -- coverage: every numpy ufunc --------------------------------------------------------------
def numpy_ufuncs() -> dict[str, np.ufunc]:
    """numpy's ufuncs by every public name (aliases too: np.acos is np.arccos)."""
    return {n: getattr(np, n) for n in dir(np) if isinstance(getattr(np, n), np.ufunc)}


# Ufuncs with no op of their own, each with the reason:
EXCEPTIONS = {
    # numpy defines it for datetime64 and timedelta64 only, dtypes no DistTensor holds
    # (dt.astype refuses them): on any DistTensor numpy raises its TypeError (the fallback's)
    "isnat",
}
# gufuncs with a core dimension: dt.einsum, whose rule splits their batch axes and contracts a
# split core axis into a Partial sum (ops/numpy_interop.py); np.matmul is dt.matmul's
EINSUM = {"vecdot", "matvec", "vecmat"}


def test_every_numpy_ufunc_runs_an_op_with_a_rule():
    missing, wrong = [], []
    for name, ufunc in numpy_ufuncs().items():
        if ufunc.__name__ in EXCEPTIONS:
            continue
        op = numpy_interop.implemented_by(ufunc)
        if op is None:
            missing.append(name)
        elif ufunc.__name__ in EINSUM:
            assert op == ufunc.__name__ and get_rule("einsum") is not None
        elif get_rule(op) is None:
            wrong.append(f"{name} -> {op}")
    assert not missing, f"numpy ufuncs on the replicate fallback: {missing}"
    assert not wrong, f"numpy ufuncs whose op has no rule: {wrong}"
    stale = {n for n in EXCEPTIONS if numpy_interop.implemented_by(getattr(np, n))}
    assert not stale, f"remove from EXCEPTIONS: {stale}"


def test_aliases_run_the_same_op():
    same = {
        "acos": "arccos", "acosh": "arccosh", "asin": "arcsin", "asinh": "arcsinh",
        "atanh": "arctanh", "bitwise_not": "invert", "bitwise_invert": "invert",
        "bitwise_left_shift": "left_shift", "bitwise_right_shift": "right_shift",
    }  # fmt: skip
    for alias, name in same.items():
        assert numpy_interop.implemented_by(getattr(np, alias)) == name, alias
    new = {*ew.UFUNC_UNARY, *ew.UFUNC_BINARY, *ew.INTERVAL_UNARY, *ew.NUMPY_ONLY}
    assert new <= set(registered_ops())


# -- every ufunc once, with no fallback and the layout kept ----------------------------------
def _operands(ufunc: np.ufunc, rng) -> list | None:
    """Global operands numpy takes for ``ufunc``: float64, else int64, else bool."""
    for dtype in (F64, I64, BOOL):
        if ufunc.__name__ == "matmul":
            args = [rng.normal(size=(5, 3)), rng.normal(size=(3, 3))]
        elif ufunc.__name__ == "matvec":
            args = [rng.normal(size=(5, 3, 3)), rng.normal(size=(5, 3))]
        elif ufunc.__name__ == "vecmat":
            args = [rng.normal(size=(5, 3)), rng.normal(size=(5, 3, 3))]
        else:
            args = [_data("small" if dtype != F64 else "unit", (5, 3), dtype, rng)]
            args *= ufunc.nin
        try:
            with np.errstate(all="ignore"):
                ufunc(*args)
        except TypeError:
            continue
        return args
    return None


def _every_ufunc(mesh):
    grid, rng = Grid(), np.random.default_rng(0)
    for name, ufunc in sorted(numpy_ufuncs().items()):
        if ufunc.__name__ in EXCEPTIONS or name != ufunc.__name__:
            continue  # aliases are the same objects
        args = _operands(ufunc, rng)
        grid.count += 1
        try:
            pls = [[S0], [R] if name == "matmul" else [S0]][: len(args)]
            xs = place(mesh, args, pls)
            with dt.CommCounter() as cc, np.errstate(all="ignore"):
                out = ufunc(*xs)
                want = ufunc(*args)
            outs, wants = (out, want) if ufunc.nout > 1 else ((out,), (want,))
            for o, w in zip(outs, wants, strict=True):
                assert_close(o.numpy(), w, name)
                assert o.placements == [S0], f"{name}: {o.placements}"
            assert not cc.fallbacks and not cc.total, f"{name}: {cc.counts} {cc.fallbacks}"
        except Exception as e:
            grid.failures.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
    return grid.result()


def test_every_ufunc_keeps_a_row_split():
    assert_grid(simulate_on((2,), _every_ufunc), minimum=80)


# -- the new ops against numpy on the placement grid ------------------------------------------
FLOATS = (F64, F32, I64, BOOL)  # numpy decides which it takes (numpy_takes)
INTS = (I64, BOOL, I8, U8, U64)
# op -> (argument domains, dtypes)
UNARY = {
    **dict.fromkeys(("arccos", "arcsin", "arctanh"), (("unit",), FLOATS)),
    "arccosh": (("above1",), FLOATS),
    **{n: (("real",), FLOATS) for n in ew.UFUNC_UNARY if n != "modf"},
    "modf": (("away",), FLOATS),
    "invert": (("small",), INTS),
    "bitwise_count": (("small",), INTS),
}
BINARY = {
    **{n: (("real", "real"), FLOATS) for n in ew.UFUNC_BINARY},
    "divmod": (("real", "nonzero"), FLOATS),
    "fmod": (("real", "nonzero"), FLOATS),
    "float_power": (("positive", "real"), FLOATS),
    "ldexp": (("real", "shift"), (F64, F32)),  # the exponent an int64 array (below)
    **dict.fromkeys(("bitwise_and", "bitwise_or", "bitwise_xor"), (("small", "small"), INTS)),
    **dict.fromkeys(("left_shift", "right_shift"), (("small", "shift"), INTS)),
    **dict.fromkeys(("gcd", "lcm"), (("small", "small"), (I64, I8, U8))),
}
assert set(UNARY) | set(BINARY) == {
    *ew.UFUNC_UNARY, *ew.UFUNC_BINARY, *ew.INTERVAL_UNARY, *ew.NUMPY_ONLY
}  # fmt: skip


def _ufunc(name: str) -> np.ufunc:
    return getattr(np, name)


class LayoutGrid(Grid):
    """Grid checks that also hold the layout: for Shard and Replicate inputs the outputs are
    placed as input ``keep`` is (an index among the array arguments) and no collective is
    made."""

    def check_layout(self, mesh, fn, args, pls, ref, what: str, keep: int | None = None) -> None:
        with np.errstate(all="ignore"):
            want = ref(*args)
        self.count += 1
        try:
            xs = place(mesh, args, pls, seed=self.count)
            tensors = [x for x in xs if isinstance(x, dt.DistTensor)]
            with dt.CommCounter() as cc, np.errstate(all="ignore"):
                out = fn(*xs)
            outs, wants = (out, want) if isinstance(want, tuple) else ((out,), (want,))
            assert isinstance(outs, tuple) and len(outs) == len(wants), f"{what}: {out!r}"
            for o, w in zip(outs, wants):
                assert isinstance(o, dt.DistTensor), f"{what}: got {type(o).__name__}"
                single = any(getattr(a, "dtype", None) == F32 for a in args)
                assert_close(o.numpy(), w, what, single=single)
                if keep is not None:
                    got_pl, want_pl = _layout(o), _layout(tensors[keep])
                    assert got_pl == want_pl, f"{what}: placed {got_pl}, not {want_pl}"
            if keep is not None:
                assert cc.total == 0, f"{what}: collectives {cc.counts}"
        except Exception as e:
            self.failures.append(f"{what}: {type(e).__name__}: {str(e)[:300]}")


def _layout(t: dt.DistTensor) -> list:
    """The placements, Replicate on mesh dims of one rank (where a Shard is the same)."""
    return [R if n == 1 else p for p, n in zip(t.placements, t.mesh.shape)]


def _takes(ref, args) -> bool:
    try:
        with np.errstate(all="ignore"):
            ref(*args)
    except TypeError:
        return False
    return True


def _partial(pl) -> bool:
    return any(p.is_partial() for p in pl)


def _placements(mesh, dtype) -> list:
    """op_cases.placements, without Partial(max/min) for unsigned integers: the helper's
    split of those (a little less and more than the value) wraps around."""
    every = placements(mesh, 2, dtype)
    return [pl for pl in every if np.dtype(dtype).kind != "u" or not _extreme(pl)]


def _extreme(pl) -> bool:
    return any(p.is_partial() and p.reduce_type in ("max", "min") for p in pl)


def _unary_grid(mesh, names):
    grid, rng = LayoutGrid(), np.random.default_rng(11)
    shapes = shapes_2d(mesh)
    for name in names:
        (domain,), dtypes = UNARY[name]
        fn = _ufunc(name)
        for dtype, label in [(d, "uneven") for d in dtypes] + [(dtypes[0], "empty")]:
            x = _data(domain, shapes[label], dtype, rng)
            if not _takes(fn, (x,)):
                continue
            pls = _placements(mesh, dtype)
            if (dtype, label) != (dtypes[0], "uneven"):  # the other dtypes and sizes: fewer
                pls = [*pls[:2], pls[-1]]
            for pl in pls:
                keep = None if _partial(pl) else 0
                what = f"{name}({dtype}{x.shape} {label}) {pl}"
                grid.check_layout(mesh, fn, (x,), [pl], fn, what, keep)
    return grid.result()


def _binary_grid(mesh, names):
    grid, rng = LayoutGrid(), np.random.default_rng(12)
    shapes = shapes_2d(mesh)
    for name in names:
        (d0, d1), dtypes = BINARY[name]
        fn = _ufunc(name)
        for dtype, label in [(d, "uneven") for d in dtypes] + [(dtypes[0], "empty")]:
            shape = shapes[label]
            x = _data(d0, shape, dtype, rng)
            y = _data(d1, shape, I64 if name == "ldexp" else dtype, rng)
            if not _takes(fn, (x, y)):
                continue
            combos = pairs(mesh, x, y, full=False)
            if (dtype, label) != (dtypes[0], "uneven"):  # the other dtypes and sizes: fewer
                combos = [(pa, pb) for pa, pb in combos if pa == pb]
                combos = [*combos[:2], combos[-1]]
            for pa, pb in combos:
                if dtype.kind == "u" and (_extreme(pa) or _extreme(pb)):
                    continue  # _placements
                keep = None
                if not _partial(pa) and not _partial(pb):
                    keep = (
                        0 if pb in (pa, [R] * mesh.ndim) else 1 if pa == [R] * mesh.ndim else None
                    )
                what = f"{name}({dtype}{shape} {label}) {pa} {pb}"
                grid.check_layout(mesh, fn, (x, y), [pa, pb], fn, what, keep)
        # a Python scalar on either side, a broadcast row
        x = _data(d0, shapes["uneven"], dtypes[0], rng)
        s = 3 if dtypes[0].kind in "biu" or name == "ldexp" else 1.5
        for pl in placements(mesh, 2, dtypes[0])[:3]:
            left = s if name != "ldexp" else 2.5
            for args, f in [
                ((x,), lambda a, fn=fn, s=s: fn(a, s)),
                ((x,), lambda a, fn=fn, s=left: fn(s, a)),
            ]:
                if _takes(f, args):
                    grid.check_layout(mesh, f, args, [pl], f, f"{name} with {s} {pl}", 0)
            row = _data(d1, shapes["uneven"][1:], I64 if name == "ldexp" else dtypes[0], rng)
            grid.check_layout(mesh, fn, (x, row), [pl, [R] * mesh.ndim], fn, f"{name} bcast {pl}")
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_new_unary_ops(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _unary_grid, list(UNARY)), minimum=200)


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_new_binary_ops(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _binary_grid, list(BINARY)), minimum=200)


# -- Partial inputs: passed through where exact, reduced first elsewhere ------------------------
def _partials(mesh):
    rng = np.random.default_rng(21)
    g = rng.normal(0, 3, (5, 3))
    i = rng.integers(-3, 4, (5, 3))
    out = {}
    for label, fn, args, pls in [
        ("deg2rad of Partial(sum)", np.deg2rad, (g,), [[PSUM]]),  # linear
        ("radians of Partial(avg)", np.radians, (g,), [[PAVG]]),
        ("cbrt of Partial(max)", np.cbrt, (g,), [[PMAX]]),  # non-decreasing on [-inf, inf]
        ("logaddexp of Partial(max), Replicate", np.logaddexp, (g, g[::-1]), [[PMAX], [R]]),
        ("ldexp of Partial(sum), Replicate", np.ldexp, (g, i), [[PSUM], [R]]),  # linear in x
        ("arccos of Partial(sum)", np.arccos, (g / 10,), [[PSUM]]),  # reduced first
        ("fmax of Partial(max), Replicate", np.fmax, (g, g[::-1]), [[PMAX], [R]]),  # NaN drops
        ("bitwise_and of Partial(sum)", np.bitwise_and, (i, i[::-1]), [[PSUM], [PSUM]]),
    ]:
        xs = place(mesh, args, pls, seed=3)
        with dt.CommCounter() as cc, np.errstate(all="ignore"):
            y = fn(*xs)
        out[label] = (y.placements, cc.counts)
        with np.errstate(all="ignore"):
            assert_close(y.numpy(), fn(*args), label)
    return out


def test_partial_inputs():
    got = every_rank(simulate_on((2,), _partials))
    for label in got:
        if label.startswith(("deg2rad", "radians", "cbrt", "logaddexp", "ldexp")):
            placement = [PAVG] if "avg" in label else [PSUM] if "sum" in label else [PMAX]
            assert got[label] == (placement, {}), (label, got[label])
        else:  # a rank's value of a Partial is not the value: reduced, then computed
            pls, counts = got[label]
            assert pls == [R] and counts == {"all_reduce": 1 + label.startswith("bitwise")}, (
                label,
                got[label],
            )


# -- dtypes: numpy's rules, numpy's errors before any collective --------------------------------
BITWISE_DTYPES = [(BOOL, BOOL), (I8, I8), (I64, I64), (U8, U8), (U64, U64), (BOOL, I8), (I8, U8)]


def _bitwise_dtypes(mesh):
    grid, rng = LayoutGrid(), np.random.default_rng(31)
    for (da, db), name in itertools.product(
        BITWISE_DTYPES, ("bitwise_and", "bitwise_or", "bitwise_xor")
    ):
        x, y = _data("small", (7, 3), da, rng), _data("small", (7, 3), db, rng)
        grid.check_layout(
            mesh, _ufunc(name), (x, y), [[S0], [S0]], _ufunc(name), f"{name} {da} {db}", 0
        )
    ops = {
        "x & y": lambda a, b: a & b,
        "x | y": lambda a, b: a | b,
        "x ^ y": lambda a, b: a ^ b,
        "~x": lambda a, b: ~a,
        "x << y": lambda a, b: a << b,
        "x >> y": lambda a, b: a >> b,
        "divmod(x, y)": lambda a, b: divmod(a, b),
        "x & 1": lambda a, b: a & 1,
        "1 | y": lambda a, b: 1 | b,
        "3 ^ x": lambda a, b: 3 ^ a,
        "1 << y": lambda a, b: 1 << b,
        "x >> 1": lambda a, b: a >> 1,
        "100 >> y": lambda a, b: 100 >> b,
        "divmod(7, y)": lambda a, b: divmod(7, b),
        "np.bitwise_not(x)": lambda a, b: np.bitwise_not(a),
        "np.bitwise_left_shift(x, y)": lambda a, b: np.bitwise_left_shift(a, b),
        "np.gcd(x, y)": lambda a, b: np.gcd(a, b),
        "np.lcm(x, 6)": lambda a, b: np.lcm(a, 6),
        "np.bitwise_count(x)": lambda a, b: np.bitwise_count(a),
    }
    for dtype in (BOOL, I8, I64, U8, U64):
        x, y = _data("small", (7, 3), dtype, rng), _data("shift", (7, 3), dtype, rng)
        y = np.where(y == 0, 1, y).astype(dtype) if dtype != BOOL else y | True
        for text, f in ops.items():
            if _takes(f, (x, y)):
                grid.check_layout(mesh, f, (x, y), [[S0], [S0]], f, f"{text} {dtype}", 0)
    return grid.result()


def test_bitwise_dtypes_and_operators():
    assert_grid(simulate_on((3,), _bitwise_dtypes), minimum=100)


def test_inplace_bitwise_operators():
    def body(mesh):
        g = np.arange(12).reshape(6, 2)
        x = make_input(g.copy(), mesh, [S0])
        b = make_input(g % 3 == 0, mesh, [S0])
        with dt.CommCounter() as cc:
            x &= 6
            x |= 1
            x ^= 3
            x <<= 2
            x >>= 1
            b &= ~b
        return cc.counts, x.placements, x.numpy(), b.numpy()

    counts, pls, got, flags = every_rank(simulate_on((2,), body))
    want = np.arange(12).reshape(6, 2)
    want &= 6
    want |= 1
    want ^= 3
    want <<= 2
    want >>= 1
    assert counts == {} and pls == [S0]
    assert_close(got, want, "in place") and not flags.any()


# (call, dtypes of its two arguments): numpy raises TypeError (or OverflowError) for them
C128 = np.dtype(np.complex128)
REFUSED = [
    ("np.bitwise_and(floats, floats)", lambda a, b: np.bitwise_and(a, b), F64, F64),
    ("np.bitwise_or(floats, 1)", lambda a, b: np.bitwise_or(a, 1), F64, F64),
    ("floats & ints", lambda a, b: a & b, F64, I64),
    ("~floats", lambda a, b: ~a, F32, F32),
    ("floats << 1", lambda a, b: a << 1, F64, F64),
    ("ints >> 1.5", lambda a, b: a >> 1.5, I64, I64),
    ("np.invert(floats)", lambda a, b: np.invert(a), F64, F64),
    ("np.gcd(floats, ints)", lambda a, b: np.gcd(a, b), F64, I64),
    ("np.lcm(bools, bools)", lambda a, b: np.lcm(a, b), BOOL, BOOL),
    ("np.bitwise_count(floats)", lambda a, b: np.bitwise_count(a), F64, F64),
    ("np.ldexp(floats, 1.5)", lambda a, b: np.ldexp(a, 1.5), F64, F64),
    ("np.ldexp(floats, floats)", lambda a, b: np.ldexp(a, b), F64, F64),
    ("np.fabs(complex)", lambda a, b: np.fabs(a), C128, F64),
    ("np.fmod(complex, floats)", lambda a, b: np.fmod(a, b), C128, F64),
    ("np.signbit(complex)", lambda a, b: np.signbit(a), C128, F64),
    ("np.heaviside(complex, floats)", lambda a, b: np.heaviside(a, b), C128, F64),
    ("np.bitwise_and(int8, 300)", lambda a, b: np.bitwise_and(a, 300), I8, I8),
]


def _refused(mesh):
    rng = np.random.default_rng(41)
    out = []
    for text, f, da, db in REFUSED:
        a, b = (_data("small", (5, 3), d, rng) for d in (da, db))
        if da == C128:
            a = a + 1j * _data("small", (5, 3), F64, rng)
        try:
            f(a, b)
        except (TypeError, OverflowError) as e:
            want = (type(e), str(e))
        else:
            raise AssertionError(f"numpy takes {text}")
        for pa, pb in [([S0], [S0]), ([R], [S0]), ([PSUM], [PSUM])]:
            if BOOL in (da, db) and pa == [PSUM]:
                continue  # a bool Partial is reduced before any op (dispatch)
            x, y = place(mesh, (a, b), [pa, pb], seed=2)
            with dt.CommCounter() as cc:
                try:
                    f(x, y)
                except (TypeError, OverflowError) as e:
                    got = (type(e), str(e))
                else:
                    got = None
            out.append((text, pa, pb, got == want, cc.total, got))
    return out


def test_numpys_errors_before_any_collective():
    for text, pa, pb, same, total, got in every_rank(simulate_on((2,), _refused)):
        assert same, f"{text} {pa} {pb}: {got}"
        assert total == 0, f"{text} {pa} {pb}: {total} collectives before the error"


# -- gradients ---------------------------------------------------------------------------------
GRAD_CASES = ufunc_cases()  # run on every mesh by tests/test_grad.py (group "ufuncs")


def test_gradients_registered():
    """Every new op has a gradient or is a constant for autograd, not both."""
    ours = {*ew.UFUNC_UNARY, *ew.UFUNC_BINARY, *ew.INTERVAL_UNARY, *ew.NUMPY_ONLY}
    grads, consts = ours & set(autograd.GRADIENTS), ours & autograd.NOT_DIFFERENTIABLE
    assert grads | consts == ours and not grads & consts
    tested = {op for c in GRAD_CASES for op in c.ops}
    assert grads == tested, f"gradients without a case here: {sorted(grads - tested)}"


def test_constants_carry_no_gradient():
    def body(mesh):
        g = np.linspace(-2.3, 2.9, 12).reshape(4, 3)
        x = make_input(g, mesh, [S0]).requires_grad_()
        i = make_input(np.arange(12).reshape(4, 3), mesh, [S0])
        outs = [
            np.rint(x), np.trunc(x), np.spacing(x), np.signbit(x), np.heaviside(x, 0.5),
            np.nextafter(x, 0.0), *np.frexp(x), np.gcd(i, 4), i & 5, ~i, i << 1,
        ]  # fmt: skip
        return [o.requires_grad for o in outs]

    assert not any(every_rank(simulate_on((2,), body)))


# -- ufunc methods -------------------------------------------------------------------------------
def _methods(mesh):
    grid, rng = LayoutGrid(), np.random.default_rng(61)
    x, y = rng.normal(0, 3, (7, 4)), rng.normal(0, 3, (5,))
    ints, flags = rng.integers(-9, 10, (7, 4)), rng.random((7, 4)) < 0.5
    cases = [
        # reduce: dt.sum/prod/max/min/all/any (Partial over a split axis), bool bitwise
        ("np.add.reduce", lambda a: np.add.reduce(a), (x,), None),
        ("np.maximum.reduce axis=1", lambda a: np.maximum.reduce(a, axis=1), (x,), None),
        ("np.bitwise_or.reduce bool", lambda a: np.bitwise_or.reduce(a), (flags,), None),
        (
            "np.bitwise_and.reduce bool keepdims",
            lambda a: np.bitwise_and.reduce(a, 1, keepdims=True),
            (flags,),
            None,
        ),
        # accumulate: dt.cumsum/cumprod; along an axis no mesh dim splits, no collective
        ("np.add.accumulate", lambda a: np.add.accumulate(a), (x,), [S1]),
        (
            "np.multiply.accumulate axis=1",
            lambda a: np.multiply.accumulate(a, axis=1),
            (ints,),
            [S0],
        ),
        ("np.add.accumulate bool", lambda a: np.add.accumulate(a), (flags,), [S1]),
        # outer: the pointwise rule on a reshaped first operand, which keeps its split
        ("np.add.outer", lambda a, b: np.add.outer(a, b), (x, y), None),
        ("np.hypot.outer", lambda a, b: np.hypot.outer(a, b), (x, y), [S1]),
        ("np.divmod.outer", lambda a, b: np.divmod.outer(a, b), (x, y), [S1]),
        ("np.bitwise_and.outer", lambda a, b: np.bitwise_and.outer(a, b), (ints, ints[0]), None),
        # the fallback: exact, placed Replicate
        ("np.bitwise_xor.reduce ints", lambda a: np.bitwise_xor.reduce(a), (ints,), None),
        ("np.fmax.reduce", lambda a: np.fmax.reduce(a, axis=1), (x,), None),
        ("np.gcd.accumulate", lambda a: np.gcd.accumulate(a), (ints,), None),
        ("np.maximum.accumulate", lambda a: np.maximum.accumulate(a, axis=1), (x,), None),
        ("np.add.reduceat", lambda a: np.add.reduceat(a, [0, 2, 5]), (x,), None),
        ("np.logaddexp.reduceat", lambda a: np.logaddexp.reduceat(a, [0, 3], axis=1), (x,), None),
        (
            "np.add.outer with dtype=",
            lambda a, b: np.add.outer(a, b, dtype=np.float32),
            (x, y),
            None,
        ),
        ("np.hypot.reduce", lambda a: np.hypot.reduce(a), (x,), None),
    ]
    for text, f, args, keep in cases:
        for pls in ([[S0], [S0]], [[S1], [R]], [[PSUM], [R]]):
            if args[0].dtype == BOOL and pls[0] == [PSUM]:
                continue
            pls = pls[: len(args)]
            k = 0 if pls[0] == keep else None
            grid.check_layout(mesh, f, args, pls, f, f"{text} {pls}", k)
    return grid.result()


def test_ufunc_methods():
    assert_grid(simulate_on((3,), _methods), minimum=50)


def test_methods_with_rules_make_no_fallback():
    def body(mesh):
        g = np.arange(1.0, 29.0).reshape(7, 4)
        x, v = make_input(g, mesh, [S0]), make_input(g[0], mesh, [R])
        b = make_input(g % 3 == 0, mesh, [S0])
        with dt.CommCounter() as cc:
            outs = [
                np.add.reduce(x), np.multiply.reduce(x, axis=1), np.bitwise_or.reduce(b),
                np.add.accumulate(x), np.multiply.accumulate(x, axis=1), np.hypot.outer(x[:, 0], v),
                *np.divmod.outer(x[:, 0], v),
            ]  # fmt: skip
        outer = np.hypot.outer(x[:, 0], v)
        return cc.fallbacks, outer.placements, [o.shape for o in outs]

    fallbacks, pls, _ = every_rank(simulate_on((2,), body))
    assert fallbacks == {} and pls == [S0]


def test_ufunc_at_writes_in_place():
    def body(mesh):
        g = np.arange(12.0).reshape(6, 2)
        x = make_input(g.copy(), mesh, [S0])
        alias = x
        np.add.at(x, ([0, 0, 5], [1, 1, 0]), 1.0)
        np.bitwise_or.at(i := make_input(np.arange(6), mesh, [S0]), [1, 3], 8)
        return x.numpy(), alias.numpy(), x.placements, i.numpy()

    got, alias, pls, ints = every_rank(simulate_on((2,), body))
    want = np.arange(12.0).reshape(6, 2)
    np.add.at(want, ([0, 0, 5], [1, 1, 0]), 1.0)
    assert_close(got, want, "np.add.at")
    assert_close(alias, want, "the alias sees the write")
    want_i = np.arange(6)
    np.bitwise_or.at(want_i, [1, 3], 8)
    assert_close(ints, want_i, "np.bitwise_or.at") and pls == [S0]


# -- gufuncs: einsum ---------------------------------------------------------------------------
def _gufuncs(mesh):
    grid, rng = LayoutGrid(), np.random.default_rng(71)
    a, b = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    c = a + 1j * rng.normal(size=(7, 5))
    m, v = rng.normal(size=(7, 3, 5)), rng.normal(size=(7, 5))
    cases = [
        ("np.vecdot", np.vecdot, (a, b)),
        ("np.vecdot complex", np.vecdot, (c, b + 0.5j)),
        ("np.vecdot broadcast", np.vecdot, (a, b[0])),
        ("np.vecdot axis=-1", lambda x, y: np.vecdot(x, y, axis=-1), (a, b)),
        ("np.vecdot axis=0 (fallback)", lambda x, y: np.vecdot(x, y, axis=0), (a, b)),
        ("np.matvec", np.matvec, (m, v)),
        ("np.vecmat", np.vecmat, (v, np.swapaxes(m, 1, 2))),
        ("np.vecdot ints", np.vecdot, (a.astype(np.int64), b.astype(np.int64))),
    ]
    for text, f, args in cases:
        for pls in ([[S0], [S0]], [[S1], [S1]], [[R], [S0]], [[PSUM], [R]]):
            if (pls[0] == [S1] and args[0].ndim == 3) or (pls[1] == [S1] and args[1].ndim == 1):
                continue
            if pls[0] == [PSUM] and args[0].dtype.kind == "c":
                continue  # op_cases' Partial splits are real
            # a split batch axis stays split with no collective
            keep = 0 if pls[0] == [S0] and "fallback" not in text and args[1].ndim > 1 else None
            grid.check_layout(mesh, f, args, pls, f, f"{text} {pls}", keep)
    return grid.result()


def test_vecdot_matvec_vecmat():
    assert_grid(simulate_on((2,), _gufuncs), minimum=25)


def test_vecdot_of_a_split_core_axis_is_a_partial_sum():
    def body(mesh):
        g = np.arange(12.0).reshape(3, 4)
        x = make_input(g, mesh, [S1])
        with dt.CommCounter() as cc:
            y = np.vecdot(x, x)
        return y.placements, cc.counts, cc.fallbacks, y.numpy()

    pls, counts, fallbacks, got = every_rank(simulate_on((2,), body))
    assert pls == [PSUM] and counts == {} and fallbacks == {}
    g = np.arange(12.0).reshape(3, 4)
    assert_close(got, np.vecdot(g, g), "vecdot")


# -- a numpy program: the Game of Life on a row-split board -------------------------------------
def life_step(board):
    """One generation, as numpy programs write it: neighbours by np.roll, rules by & and |."""
    n = sum(
        np.roll(np.roll(board, i, axis=0), j, axis=1)
        for i in (-1, 0, 1)
        for j in (-1, 0, 1)
        if (i, j) != (0, 0)
    )
    return (n == 3) | (board & (n == 2))


def _life(mesh, generations):
    rng = np.random.default_rng(81)
    g = rng.random((121, 64)) < 0.35  # uneven rows on 2, 3 and 4 ranks
    board = make_input(g, mesh, [S0])
    want, sent, layouts = g, [], []
    for _ in range(generations):
        with dt.CommCounter() as cc:
            board = life_step(board)
        sent.append((cc.total_bytes, cc.fallbacks))
        layouts.append(board.placements)
        want = life_step(want)
    return np.array_equal(board.numpy(), want), board.dtype, layouts, sent, g.nbytes, g[0].nbytes


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (4,)], ids=str)
def test_game_of_life_keeps_its_row_split(mesh_shape):
    for same, dtype, layouts, sent, board, row in simulate_on(mesh_shape, _life, 4):
        assert same and dtype == np.bool_
        assert all(pl == [S0] for pl in layouts), layouts
        for nbytes, fallbacks in sent:
            assert not fallbacks, fallbacks
            # each rank sends its boundary rows: 6 rolls across the split axis, a row or two
            # each (the row counts of an int64 neighbour sum stay local)
            assert nbytes <= 12 * row and nbytes < board / 4, (nbytes, board)


# -- dt.<name> for every ufunc name ------------------------------------------------------------
def test_every_ufunc_name_is_a_dt_function():
    """numpy's ufunc names as dt functions (isnat takes datetimes, which no DistTensor holds):
    aliases are the functions they alias; the integer ones, fmod, float_power, ldexp and the
    gufuncs give numpy's values on split tensors and keep the split."""
    names = {n for n in dir(np) if isinstance(getattr(np, n), np.ufunc)} - {"isnat"}
    assert not [n for n in names if not callable(getattr(dt, n, None))]
    assert dt.acos is dt.arccos and dt.pow is dt.power and dt.bitwise_not is dt.invert

    rng = np.random.default_rng(62)
    x, y = rng.normal(0, 3, (7, 4)), rng.uniform(0.5, 2, (7, 4))
    i, j = rng.integers(-9, 10, (7, 4)), rng.integers(1, 5, (7, 4))
    calls = {
        "fmod": (lambda m, a, b: m.fmod(a, b), x, y),
        "float_power": (lambda m, a, b: m.float_power(b, a), x, y),
        "ldexp": (lambda m, a, b: m.ldexp(a, b), x, j),
        "bitwise_xor": (lambda m, a, b: m.bitwise_xor(a, b), i, j),
        "gcd": (lambda m, a, b: m.gcd(a, b), i, j),
        "right_shift": (lambda m, a, b: m.right_shift(a, b), i, j),
        "bitwise_count": (lambda m, a, b: m.bitwise_count(a), i, j),
        "atan2": (lambda m, a, b: m.atan2(a, b), x, y),
        "vecdot": (lambda m, a, b: m.vecdot(a, b), x, y),
    }

    def body(mesh):
        out = {}
        for name, (f, a, b) in calls.items():
            got = f(dt, make_input(a, mesh, [S0]), make_input(b, mesh, [S0]))
            out[name] = (got.numpy(), got.placements)
        return out

    got = every_rank(simulate_on((2,), body))
    for name, (f, a, b) in calls.items():
        value, placements = got[name]
        want = f(np, a, b)
        assert value.dtype == want.dtype, name
        np.testing.assert_allclose(value, want, rtol=1e-12, err_msg=name)
        assert placements == [S0], (name, placements)
