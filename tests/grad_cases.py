"""Gradient cases, their numpy oracle, and the grid runner of tests/test_grad.py.

A ``GradCase`` is a dt function, the numpy function of the same arguments, and the global
arguments. Every numpy array argument is placed on the mesh (``op_cases.make_input``: Partial
placements hold asymmetric splits, so a wrong gradient cannot pass by luck); the float ones
require a gradient, the integer and bool ones (labels, ids, conditions) are constants.
Backward starts from a random output cotangent ``cot`` (``out.backward(grad=cot)``), so each
input's gradient is that of ``sum(out * cot)``. The oracle is numpy on the global inputs, in
float64: central finite differences of ``sum(out * cot)``, or a hand-written reference where
one is easy (matmul, embedding) or where the op's convention is not a limit (ties of max/min
shared evenly). The gathered ``x.grad`` must equal it, with x's shape and dtype, on every mesh
and placement: Note [Partial gradients] in disttensor/autograd.py.

The oracle runs once per case in the calling thread (``run_grid``); the simulated ranks only
run dt. ``case_grad_*(world)`` are small gradient cases that also run under ``mpiexec``
(tests/mpi_runner.py picks them up).
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from op_cases import F64, PSUM, S0, S1, R, assert_grid, make_input, mesh_of, pairs, placements

import disttensor as dt
from disttensor.spmd.validate import DOMAINS, REFS, data

RTOL, ATOL = 1e-5, 1e-6  # float64 central differences with eps 1e-6: errors near 1e-8
EPS = 1e-6


# -- data --------------------------------------------------------------------------------------
# Where the forward op's domain or a kink needs other values than validate.DOMAINS gives:
# kinks (abs, relu) and poles (tan) stay a finite distance away, so central differences of
# step EPS never straddle them; exp-like ops keep moderate magnitudes.
GRAD_DOMAINS = {
    "abs": ("nonzero",),
    "relu": ("nonzero",),
    "tan": ("bounded",),
    "arctan2": ("nonzero", "nonzero"),
    **dict.fromkeys(("exp", "expm1", "sinh", "cosh", "gelu", "silu"), ("exponent",)),
}


def grad_data(name: str, i: int, shape, rng: np.random.Generator) -> np.ndarray:
    """float64 values for argument ``i`` of op ``name``, in the domain its gradient wants."""
    domain = (*GRAD_DOMAINS.get(name, DOMAINS.get(name, ())), "real", "real")[i]
    if domain == "bounded":
        return rng.uniform(-1.2, 1.2, shape)
    return data(shape, F64, rng, domain)


def reference(name: str) -> Callable[..., Any]:
    return REFS.get(name) or getattr(np, name)


# -- cases -------------------------------------------------------------------------------------
@dataclass(eq=False)
class GradCase:
    """``fn(*args)`` (dt) against ``ref(*args)`` (numpy); see the module docstring.

    ops: recorded ops that must be on the tape of at least one check of the grid on a mesh;
    grads: a hand-written oracle ``grads(cots, *args) -> one array per float array``
    (``cots``: the list of output cotangents), else central finite differences;
    grid: "default": op_cases.placements of one array, op_cases.pairs of two (on 1-D meshes
    those that are equal or have a Replicate side), three or more cycled together; "full":
    every pair on 1-D meshes; "light": Shards and Partial(sum) only, cycled together (for the
    cases whose point is a shape, not a placement); or ``grid(mesh) -> [placement list per
    array, ...]``. exact_only: no Partial placements (ties must survive the splits).
    """

    label: str
    fn: Callable[..., Any]
    ref: Callable[..., Any]
    args: tuple
    ops: tuple[str, ...] = ()
    grads: Callable[..., Sequence[np.ndarray]] | None = None
    grid: str | Callable[[dt.ProcessMesh], list] = "default"
    exact_only: bool = False
    _oracle: Any = field(default=None, repr=False)

    @property
    def arrays(self) -> list[np.ndarray]:
        return [a for a in self.args if isinstance(a, np.ndarray)]

    def oracle(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(output cotangents, wanted gradients), computed once."""
        if self._oracle is None:
            out = _outputs(self.ref(*self.args))
            rng = np.random.default_rng(zlib.crc32(self.label.encode()))
            cots = [rng.standard_normal(o.shape) for o in out]
            if self.grads is not None:
                want = [np.asarray(g, F64) for g in self.grads(cots, *self.args)]
            else:
                want = fd_grads(self.ref, self.args, cots)
            self._oracle = cots, want
        return self._oracle


def _outputs(out) -> list[np.ndarray]:
    return [np.asarray(o) for o in out] if isinstance(out, (list, tuple)) else [np.asarray(out)]


def fd_grads(ref, args: tuple, cots: list[np.ndarray], eps: float = EPS) -> list[np.ndarray]:
    """Central finite differences of ``sum(ref(*args) * cots)`` in each float array argument."""
    args = list(args)

    def loss() -> float:
        with np.errstate(all="ignore"):
            return float(sum(np.sum(o * c) for o, c in zip(_outputs(ref(*args)), cots)))

    grads = []
    for pos, a in enumerate(args):
        if not (isinstance(a, np.ndarray) and a.dtype.kind == "f"):
            continue
        g = np.zeros(a.shape)
        for idx in np.ndindex(a.shape):
            x = a.copy()
            args[pos] = x
            x[idx] = a[idx] + eps
            up = loss()
            x[idx] = a[idx] - eps
            g[idx] = (up - loss()) / (2 * eps)
        args[pos] = a
        grads.append(g)
    return grads


def _light(grid: list[list[dt.Placement]]) -> list[list[dt.Placement]]:
    return [pl for pl in grid if all(p.is_shard() or p == PSUM for p in pl)] or grid


def default_grid(mesh: dt.ProcessMesh, case: GradCase) -> list[tuple]:
    """The case's placement combinations on ``mesh``: one placement list per array (on a
    mesh of one rank every placement is local: the first two combinations only)."""
    if callable(case.grid):
        combos = [tuple(c) for c in case.grid(mesh)]
    else:
        arrays = case.arrays
        each = [placements(mesh, a.ndim, a.dtype) for a in arrays]
        if case.grid == "light":
            each = [_light(e) for e in each]
        if len(arrays) == 2 and case.grid != "light":
            combos = pairs(mesh, arrays[0], arrays[1], full=case.grid == "full")
        else:
            longest = max(len(e) for e in each)
            cycles = [itertools.cycle(e) for e in each]
            combos = [tuple(next(c) for c in cycles) for _ in range(longest)]
    if case.exact_only:
        combos = [c for c in combos if not any(p.is_partial() for pl in c for p in pl)]
    return combos[:2] if mesh.size == 1 else combos


# -- the check ---------------------------------------------------------------------------------
def tape(t: dt.DistTensor) -> dict[str, bool]:
    """The recorded ops ``t`` depends on (a walk of the tape): name -> whether every node of
    that name has its gradient function (backward frees them)."""
    names: dict[str, bool] = {}
    stack, seen = [t], set()
    while stack:
        u = stack.pop()
        if u._node is None or id(u._node[0]) in seen:
            continue
        node = u._node[0]
        seen.add(id(node))
        names[node.name] = names.get(node.name, True) and node.fn is not None
        stack.extend(i for i in node.inputs if i is not None)
    return names


def graph_ops(t: dt.DistTensor) -> set[str]:
    """Names of the recorded ops ``t`` depends on."""
    return set(tape(t))


def backward(out, cots: list[np.ndarray]) -> set[str]:
    """Backward from ``out`` with the cotangents: ``out.backward(grad=cot)``, or for several
    outputs (split) the loss ``sum(out_i * cot_i)``. Returns the ops on the tape."""
    if not isinstance(out, (list, tuple)):
        ops = graph_ops(out)
        out.backward(grad=cots[0])
        return ops
    loss = None
    for o, c in zip(out, cots, strict=True):
        term = (o * c).sum()
        loss = term if loss is None else loss + term
    ops = graph_ops(loss)
    loss.backward()
    return ops


class GradGrid:
    """Runs gradient checks on every rank, collecting failures (every rank decides alike, so
    the ranks stay in step)."""

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []
        self.seen: set[str] = set()  # names of the ops recorded on the tapes of the checks

    def run(self, mesh: dt.ProcessMesh, case: GradCase) -> None:
        """The case over its placement grid; its ``ops`` must each be on some check's tape."""
        self.seen = set()
        combos = default_grid(mesh, case)
        for pls in combos:
            self.check(mesh, case, pls)
        missing = set(case.ops) - self.seen
        if combos and missing:
            self.failures.append(f"{case.label} on {mesh.shape}: {sorted(missing)} never ran")

    def check(self, mesh: dt.ProcessMesh, case: GradCase, pls: Sequence) -> None:
        what = f"{case.label} on {mesh.shape} {' '.join(map(str, pls))}"
        self.count += 1
        seed = zlib.crc32(what.encode())  # the same on every rank (ranks may skip meshes)
        cots, want = case.oracle()
        try:
            it = iter(pls)
            xs, leaves = [], []
            for a in case.args:
                if isinstance(a, np.ndarray):
                    t = make_input(a, mesh, next(it), seed=seed)
                    if a.dtype.kind == "f":
                        leaves.append(t.requires_grad_())
                    xs.append(t)
                else:
                    xs.append(a)
            with np.errstate(all="ignore"):
                self.seen |= backward(case.fn(*xs), cots)
            for i, (t, w) in enumerate(zip(leaves, want, strict=True)):
                g = t.grad
                assert g is not None, f"input {i} got no gradient"
                assert (g.shape, g.dtype) == (t.shape, t.dtype), (
                    f"input {i}: gradient {g.dtype}{g.shape} for a {t.dtype}{t.shape} input"
                )
                assert g.mesh == mesh, f"input {i}: gradient on {g.mesh}"
                np.testing.assert_allclose(
                    g.numpy(), w, rtol=RTOL, atol=ATOL, err_msg=f"input {i} {g.placements}"
                )
        except Exception as e:
            self.failures.append(f"{what}: {type(e).__name__}: {str(e)[:400]}")

    def result(self) -> tuple[int, list[str]]:
        return self.count, self.failures


def _program(mesh: dt.ProcessMesh, cases: Sequence[GradCase]) -> tuple[int, list[str]]:
    grid = GradGrid()
    for case in cases:
        grid.run(mesh, case)
    return grid.result()


def run_grid(mesh_shape: Sequence[int], cases: Sequence[GradCase], minimum: int = 1) -> int:
    """Every case over its placement grid on simulated ranks of a mesh of that shape; the
    oracles are computed here first (once, in this thread)."""
    for case in cases:
        case.oracle()
    mesh = mesh_of(mesh_shape)
    return assert_grid(dt.simulate(mesh.size, _program, mesh, cases), minimum)


# -- shapes ------------------------------------------------------------------------------------
# Fixed shapes (so one oracle serves every mesh): on meshes of 2, 3 and 4 ranks
# EVEN (4, 6) splits evenly on 2, 4 and (2, 2) (axis 1 on 3), UNEVEN (5, 7) unevenly on all,
# EMPTY (2, 3) leaves empty shards on 3 and 4 ranks (axis 0) and on 4 (axis 1).
EVEN, UNEVEN, EMPTY = (4, 6), (5, 7), (2, 3)
SHAPES = {"even": EVEN, "uneven": UNEVEN, "empty": EMPTY}
ZERO = (0, 3)
ZERO_SIZE = {"exp", "sqrt", "tanh", "relu", "add", "multiply", "sum"}  # zero-size tensors too


# -- elementwise -------------------------------------------------------------------------------
def unary_cases(name: str) -> list[GradCase]:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    fn, ref = getattr(dt, name), reference(name)
    out = []
    shapes = {"uneven": UNEVEN, "empty": EMPTY}  # even: the binary grids have it
    if name in ZERO_SIZE:
        shapes["zero"] = ZERO
    for label, shape in shapes.items():
        x = grad_data(name, 0, shape, rng)
        grid = "default" if label == "uneven" else "light"
        out.append(GradCase(f"{name} {label}{shape}", fn, ref, (x,), (name,), grid=grid))
    return out


BROADCAST = [((5, 7), (7,)), ((5, 1), (1, 7)), ((), (5, 7))]
SCALAR_EXPONENT = {"power": 1.5, "mod": 2.5, "divide": 2.5, "true_divide": -2.5}


def binary_cases(name: str, full: bool) -> list[GradCase]:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    fn, ref = getattr(dt, name), reference(name)
    out = []
    shapes = dict(SHAPES) if full else {"uneven": UNEVEN, "empty": EMPTY}
    if name in ZERO_SIZE:
        shapes["zero"] = ZERO
    for label, shape in shapes.items():
        x, y = grad_data(name, 0, shape, rng), grad_data(name, 1, shape, rng)
        grid = ("full" if full else "default") if label == "uneven" else "light"
        out.append(GradCase(f"{name} {label}{shape}", fn, ref, (x, y), (name,), grid=grid))
    for sa, sb in BROADCAST:  # the placement grid for one op per linearity class
        x, y = grad_data(name, 0, sa, rng), grad_data(name, 1, sb, rng)
        grid = "default" if full else "light"
        out.append(GradCase(f"{name} {sa} with {sb}", fn, ref, (x, y), (name,), grid=grid))
    # a Python scalar on either side
    x, y = grad_data(name, 0, UNEVEN, rng), grad_data(name, 1, UNEVEN, rng)
    s = SCALAR_EXPONENT.get(name, 1.75)
    left = 2.5 if name != "mod" else 7.5
    out.append(
        GradCase(f"{name} x, {s}", lambda a: fn(a, s), lambda a: ref(a, s), (x,), ops=(name,))
    )
    out.append(
        GradCase(
            f"{name} {left}, y", lambda b: fn(left, b), lambda b: ref(left, b), (y,), ops=(name,)
        )
    )
    if not full:
        _lighten(out[-2:])
    if name in ("maximum", "minimum"):  # ties split the gradient evenly, as central differences
        t = np.where(rng.random(UNEVEN) < 0.4, x, y)
        out.append(
            GradCase(f"{name} ties", fn, ref, (x, t), ops=(name,), grid="full", exact_only=True)
        )
    return out


def where_cases() -> list[GradCase]:
    rng = np.random.default_rng(11)
    c, x, y = rng.random(UNEVEN) < 0.5, rng.normal(size=UNEVEN), rng.normal(size=UNEVEN)
    cases = [GradCase("where", dt.where, np.where, (c, x, y), ops=("where",))]
    c1, row = rng.random((5, 1)) < 0.5, rng.normal(size=(7,))
    cases.append(GradCase("where broadcast", dt.where, np.where, (c1, x, row), ops=("where",)))
    cases.append(
        GradCase(
            "where scalar",
            lambda c, a: dt.where(c, a, 0.0),
            lambda c, a: np.where(c, a, 0.0),
            (c, x),
            ops=("where",),
            grid="full",
        )
    )
    return cases


def clip_cases() -> list[GradCase]:
    rng = np.random.default_rng(12)
    x = rng.normal(0, 2, UNEVEN)
    lo, hi = rng.normal(size=(5, 1)) - 1, rng.normal(size=(7,)) + 1
    lo[0, 0], hi[0] = 0.5, -0.5  # the row and column where lo > hi (numpy: the result is hi)
    lo_rows = rng.normal(size=(5, 1)) - 1
    return [
        GradCase(
            "clip scalars",
            lambda a: dt.clip(a, -1.0, 2.0),
            lambda a: np.clip(a, -1.0, 2.0),
            (x,),
            ops=("clip",),
        ),
        GradCase(
            "clip upper only",
            lambda a: dt.clip(a, None, 0.5),
            lambda a: np.clip(a, None, 0.5),
            (x,),
            ops=("clip",),
        ),
        GradCase(
            "clip tensor bounds", dt.clip, lambda a, b, c: np.clip(a, b, c), (x, lo, hi), ("clip",)
        ),
        GradCase(
            "clip lower tensor",
            lambda a, b: dt.clip(a, b, None),
            lambda a, b: np.clip(a, b, None),
            (x, lo_rows),
            ops=("clip",),
        ),
    ]


def astype_cases() -> list[GradCase]:
    """Through float32 central differences are noise: a hand-written oracle (the identity)."""
    rng = np.random.default_rng(13)
    x = rng.normal(size=UNEVEN)
    x32 = x.astype(np.float32)
    return [
        GradCase(
            "astype float32",
            lambda a: dt.astype(a, np.float32),
            lambda a: a.astype(np.float32),
            (x,),
            ops=("astype",),
            grads=lambda cots, a: [cots[0]],
        ),
        GradCase(
            "astype of a float32 input",
            lambda a: dt.tanh(a.astype(np.float64)),
            lambda a: np.tanh(a.astype(np.float64)),
            (x32,),
            ops=("astype", "tanh"),
            grads=lambda cots, a: [cots[0] * (1 - np.tanh(a.astype(np.float64)) ** 2)],
        ),
        GradCase(
            "astype float64 (a copy)",
            lambda a: dt.astype(a, np.float64) * 3,
            lambda a: a * 3,
            (x,),
            ops=("astype",),
        ),
    ]


def constant_cases() -> list[GradCase]:
    """Ops of autograd.NOT_DIFFERENTIABLE are constants: no gradient flows through them."""
    rng = np.random.default_rng(14)
    x = rng.normal(0, 2, UNEVEN) + 0.25  # no integers, so floor/round are not at a jump
    y = rng.normal(0, 2, UNEVEN)
    return [
        GradCase(
            "sign, floor, ceil, round, comparisons are constants",
            lambda a, b: (
                (dt.sign(a) + dt.floor(b) + dt.ceil(a) + dt.round(b)) * a
                + dt.where(dt.greater(a, b), a, b) * dt.floor_divide(a, 1.5)
            ),
            lambda a, b: (
                (np.sign(a) + np.floor(b) + np.ceil(a) + np.round(b)) * a
                + np.where(np.greater(a, b), a, b) * np.floor_divide(a, 1.5)
            ),
            (x, y),
        )
    ]


# -- linalg ------------------------------------------------------------------------------------
def _mm_grads(trans_x: bool, trans_y: bool):
    """Hand-written 2-D matmul gradients: out = X Y, X = x or x^T, Y = y or y^T."""

    def grads(cots, x, y):
        g = cots[0]
        xm, ym = (x.T if trans_x else x), (y.T if trans_y else y)
        gx, gy = g @ ym.T, xm.T @ g
        return [gx.T if trans_x else gx, gy.T if trans_y else gy]

    return grads


def linalg_cases() -> list[GradCase]:
    rng = np.random.default_rng(15)

    def n(*shape):
        return rng.normal(size=shape)

    a, b = n(5, 3), n(3, 4)
    mm = reference("matmul")
    cases = [
        GradCase(
            "matmul (5,3)@(3,4)", dt.matmul, np.matmul, (a, b), ("matmul",), _mm_grads(False, False)
        ),
        GradCase("matmul (4,6)@(6,2)", dt.matmul, np.matmul, (n(4, 6), n(6, 2)), ("matmul",)),
    ]
    cases[1].grid = "light"
    cases[0].grid = "full"
    for tx, ty in ((True, False), (False, True), (True, True)):
        x = a.T.copy() if tx else a
        y = b.T.copy() if ty else b
        cases.append(
            GradCase(
                f"matmul trans_x={tx} trans_y={ty}",
                lambda p, q, tx=tx, ty=ty: dt.matmul(p, q, trans_x=tx, trans_y=ty),
                lambda p, q, tx=tx, ty=ty: mm(p, q, trans_x=tx, trans_y=ty),
                (x, y),
                ("matmul",),
                _mm_grads(tx, ty),
            )
        )
    for sa, sb in [((3,), (3, 4)), ((5, 3), (3,)), ((3,), (3,)), ((2, 5, 3), (3, 4))]:
        cases.append(
            GradCase(f"matmul {sa}@{sb}", dt.matmul, np.matmul, (n(*sa), n(*sb)), ("matmul",))
        )
    for sa, sb in [((5, 3), (2, 3, 4)), ((2, 1, 2, 3), (3, 3, 2))]:  # broadcast batch axes
        cases.append(
            GradCase(
                f"matmul {sa}@{sb}",
                dt.matmul,
                np.matmul,
                (n(*sa), n(*sb)),
                ("matmul",),
                grid="light",
            )
        )

    def linear_grads(cots, x, w, bias):  # hand-written: x @ w + bias, x 2-D
        g = cots[0]
        return [g @ w.T, x.T @ g, g.sum(axis=0)]

    cases.append(
        GradCase(
            "linear (5,3)@(3,4)+(4,)",
            dt.linear,
            lambda x, w, bias: x @ w + bias,
            (a, b, n(4)),
            ("linear",),
            linear_grads,
        )
    )
    for sa in [(3,), (2, 5, 3), (0, 3)]:  # a 1-D input, batch axes, no rows
        cases.append(
            GradCase(
                f"linear {sa}@(3,4)+(4,)",
                dt.linear,
                lambda x, w, bias: x @ w + bias,
                (n(*sa), b, n(4)),
                ("linear",),
            )
        )
    for sa, sb in [
        ((5, 3), (3,)),
        ((3,), (3,)),
        ((5, 3), (3, 4)),
        ((2, 5, 3), (3, 4)),
        ((5, 3), ()),
    ]:
        cases.append(GradCase(f"dot {sa}.{sb}", dt.dot, np.dot, (n(*sa), n(*sb)), ("dot",)))
    for eq, shapes in [
        ("ij,jk->ik", [(5, 3), (3, 4)]),
        ("ij,jk->k", [(5, 3), (3, 4)]),
        ("bij,jk->bik", [(2, 5, 3), (3, 4)]),
        ("ij->j", [(5, 7)]),
        ("ij->ji", [(5, 7)]),
        ("i,i->", [(5,), (5,)]),
        ("ij,ij->ij", [(5, 3), (5, 3)]),
        ("ij,k->i", [(5, 3), (4,)]),  # k only in the second operand, j only in the first
        ("ij,jk,kl->il", [(5, 3), (3, 4), (4, 2)]),
    ]:
        cases.append(
            GradCase(
                f"einsum {eq}",
                lambda *ops, eq=eq: dt.einsum(eq, *ops),
                lambda *ops, eq=eq: np.einsum(eq, *ops),
                tuple(n(*s) for s in shapes),
                ("einsum",),
            )
        )
    for sa, sb in [((5,), (3,)), ((2, 3), (4,))]:
        cases.append(GradCase(f"outer {sa} {sb}", dt.outer, np.outer, (n(*sa), n(*sb)), ("outer",)))
    keep = {"matmul (5,3)@(3,4)", "matmul trans_x=True trans_y=True", "matmul (3,)@(3, 4)"}
    keep |= {"matmul (2, 5, 3)@(3, 4)", "dot (5, 3).(3,)", "einsum ij,jk->k", "einsum ij,k->i"}
    keep |= {"linear (5,3)@(3,4)+(4,)", "linear (2, 5, 3)@(3,4)+(4,)"}
    return _lighten_all_but(cases, keep | {"outer (5,) (3,)"})


# -- reductions --------------------------------------------------------------------------------
AXES = [(None, False), (0, False), (-1, False), ((0, 1), False), (1, True), (None, True)]


def _ties_grads(kind: str, axis):
    """max/min: the items equal to the result share its gradient evenly."""

    def grads(cots, x):
        m = getattr(np, kind)(x, axis=axis, keepdims=True)
        hit = (x == m).astype(F64)
        g = np.reshape(cots[0], m.shape)
        return [hit * g / hit.sum(axis=axis, keepdims=True)]

    return grads


def reduction_cases(name: str) -> list[GradCase]:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    fn, ref = getattr(dt, name), getattr(np, name)
    out = []
    shapes = {"uneven": UNEVEN, "empty": EMPTY, **({"zero": ZERO} if name in ZERO_SIZE else {})}
    for label, shape in shapes.items():
        x = rng.uniform(-2, 2, shape) if name == "prod" else rng.normal(size=shape)
        for axis, keep in AXES:
            what = f"{name} {label}{shape} axis={axis} keepdims={keep}"
            case = bound(what, fn, ref, (x,), (name,), axis=axis, keepdims=keep)
            case.grid = "default" if label == "uneven" and not keep else "light"
            out.append(case)
    if name == "prod":  # one zero in a row, two in another: exact (products of the others)
        x = rng.uniform(-2, 2, UNEVEN)
        x[0, 3] = x[2, 1] = x[2, 5] = 0.0
        for axis in (1, None):
            out.append(
                GradCase(
                    f"prod with zeros axis={axis}",
                    lambda a, axis=axis: dt.prod(a, axis=axis),
                    lambda a, axis=axis: np.prod(a, axis=axis),
                    (x,),
                    ("prod",),
                )
            )
    if name in ("max", "min"):  # integer values: ties, kept exact by the Partial splits
        x = rng.integers(-2, 3, UNEVEN).astype(F64)
        for axis in (0, 1, None):
            out.append(
                GradCase(
                    f"{name} ties axis={axis}",
                    lambda a, axis=axis: fn(a, axis=axis),
                    lambda a, axis=axis: ref(a, axis=axis),
                    (x,),
                    (name,),
                    grads=_ties_grads(name, axis),
                )
            )
    return out


def bound(label: str, fn, ref, args: tuple, ops: tuple[str, ...] = (), **kw) -> GradCase:
    """``fn(*args, **kw)`` against ``ref(*args, **kw)``."""
    return GradCase(label, lambda *a: fn(*a, **kw), lambda *a: ref(*a, **kw), args, ops)


def _lighten(cases: list[GradCase]) -> list[GradCase]:
    for c in cases:
        c.grid = "light"
    return cases


def _lighten_all_but(cases: list[GradCase], keep: set[str]) -> list[GradCase]:
    """The cases of ``keep`` (labels) keep their grids; the others get the light one."""
    assert keep <= {c.label for c in cases}, keep - {c.label for c in cases}
    _lighten([c for c in cases if c.label not in keep])
    return cases


def composite_cases() -> list[GradCase]:
    rng = np.random.default_rng(16)
    out = []
    for label, shape in (("uneven", UNEVEN), ("empty", EMPTY), ("3-D", (2, 5, 3))):
        x = rng.normal(size=shape)
        nd = len(shape)
        these = []
        for axis, keep, ddof in [(None, 0, 0), (0, 1, 1), (-1, 0, 0), ((0, nd - 1), 0, 1)]:
            keep = bool(keep)
            for name in ("var", "std"):
                what = f"{name} {label} axis={axis} ddof={ddof} keepdims={keep}"
                kw = {"axis": axis, "ddof": ddof, "keepdims": keep}
                these.append(bound(what, getattr(dt, name), getattr(np, name), (x,), **kw))
            what = f"logsumexp {label} axis={axis} keepdims={keep}"
            kw = {"axis": axis, "keepdims": keep}
            # the fused op where no mesh dim splits the reduced axes, else the composite
            these.append(bound(what, dt.logsumexp, REFS["logsumexp"], (x,), ("logsumexp",), **kw))
        for axis in (0, -1):
            for name in ("softmax", "log_softmax"):
                what = f"{name} {label} axis={axis}"
                fn, ref = getattr(dt, name), REFS[name]
                these.append(bound(what, fn, ref, (x,), (name,), axis=axis))
        if label == "uneven":  # the whole grid where one axis is reduced
            _lighten([c for c in these if "axis=None" in c.label or "axis=(" in c.label])
        else:
            _lighten(these)
        out += these
    return out


# -- the fused softmax gradients and the attention score path ---------------------------------
def np_attention_softmax(s, scale, causal):
    """softmax(where(causal mask, s * scale, -inf)) over the last axis, the plain way."""
    v = s * scale
    if causal:
        v = np.where(np.tril(np.ones(s.shape[-2:], bool)), v, -np.inf)
    return REFS["softmax"](v, axis=-1)


def softmax_cases() -> list[GradCase]:
    """The fused gradient ops of softmax, log_softmax and logsumexp (disttensor/ops/reduction.py)
    on any (g, y), their gradients written with dt ops; and attention_softmax (ops/nn.py):
    causal and not, square, one query, more keys than queries and fewer, on every layout
    (the rule gathers what it needs whole; heads and batch stay split)."""
    from disttensor.ops import nn
    from disttensor.ops import reduction as red

    rng = np.random.default_rng(23)
    g, y = rng.normal(size=UNEVEN), rng.uniform(0.05, 1, UNEVEN)
    lg, x = rng.normal(size=(5,)), rng.normal(size=UNEVEN)
    out = rng.normal(size=(5,))

    def sm_grad(a, b, axis=1, scale=1.0):
        return scale * b * (a - (a * b).sum(axis, keepdims=True))

    cases = [
        GradCase(
            "softmax_grad axis=1",
            lambda a, b: red.SOFTMAX_GRAD(a, b, axis=1),
            sm_grad,
            (g, y),
            ops=("softmax_grad",),
        ),
        GradCase(
            "softmax_grad axis=0 scale=0.5",
            lambda a, b: red.SOFTMAX_GRAD(a, b, axis=0, scale=0.5),
            lambda a, b: sm_grad(a, b, 0, 0.5),
            (g, y),
            ops=("softmax_grad",),
        ),
        GradCase(
            "log_softmax_grad axis=-1",
            lambda a, b: red.LOG_SOFTMAX_GRAD(a, b, axis=-1),
            lambda a, b: a - np.exp(b) * a.sum(-1, keepdims=True),
            (g, np.log(y)),
            ops=("log_softmax_grad",),
        ),
        GradCase(
            "logsumexp_grad axis=1",
            lambda a, b, c: red.LOGSUMEXP_GRAD(a, b, c, axis=1),
            lambda a, b, c: a[:, None] * np.exp(b - c[:, None]),
            (lg, x, out),
            ops=("logsumexp_grad",),
        ),
        GradCase(
            "logsumexp_grad axis=(0, 1) keepdims",
            lambda a, b, c: red.LOGSUMEXP_GRAD(a, b, c, axis=(0, 1), keepdims=True),
            lambda a, b, c: a * np.exp(b - c),
            (rng.normal(size=(1, 1)), x, rng.normal(size=(1, 1))),
            ops=("logsumexp_grad",),
            grid="light",
        ),
    ]
    for shape, causal in (
        ((2, 3, 4, 4), True),
        ((3, 5, 5), False),
        ((3, 1, 1), True),
        ((2, 5, 3), True),
        ((2, 3, 5), True),
    ):
        s = rng.normal(0, 2, shape)
        cases.append(
            GradCase(
                f"attention_softmax {shape} causal={causal}",
                lambda a, c=causal: nn.attention_softmax(a, 0.35, causal=c),
                lambda a, c=causal: np_attention_softmax(a, 0.35, c),
                (s,),
                ops=("attention_softmax",),
                grid="default" if shape == (2, 3, 4, 4) else "light",
            )
        )
    return cases


# -- scans (disttensor/ops/scan.py) -----------------------------------------------------------
def scan_cases() -> list[GradCase]:
    """cumsum and cumprod along each axis and raveled: the local op where the axis is whole,
    the scan of a split axis (Note [Scans of a split axis]) where it is not; cumprod with
    zeros (the first zero along the axis gets the product of the others)."""
    rng = np.random.default_rng(22)
    x, e = rng.normal(size=UNEVEN), rng.normal(size=EMPTY)
    z = rng.normal(size=UNEVEN)
    z[1, 2] = z[3, 2] = z[0, 4] = z[2, 0] = 0.0  # two zeros in a column, one in rows 0 and 2
    out = []
    for axis in (0, 1, None):
        for name in ("cumsum", "cumprod"):
            fn, ref = getattr(dt, name), getattr(np, name)
            out.append(bound(f"{name} axis={axis}", fn, ref, (x,), (name,), axis=axis))
            out.append(_lighten([bound(f"{name} empty axis={axis}", fn, ref, (e,), axis=axis)])[0])
        out.append(bound(f"cumprod zeros axis={axis}", dt.cumprod, np.cumprod, (z,), axis=axis))
    out.append(
        bound("cumsum dtype=float32", dt.cumsum, np.cumsum, (x,), ("cumsum",), axis=0, dtype="f4")
    )
    out[-1].grads = lambda cots, a: [np.cumsum(cots[0][::-1], axis=0)[::-1]]
    return _lighten_all_but(out, {"cumsum axis=0", "cumprod axis=1", "cumprod zeros axis=0"})


# -- shape ops ---------------------------------------------------------------------------------
def _same(name: str, x: np.ndarray, *args, ops: tuple[str, ...] | None = None) -> GradCase:
    """``dt.<name>(x, *args)`` against ``np.<name>(x, *args)``."""
    ours, theirs = getattr(dt, name), getattr(np, name)
    return GradCase(
        f"{name}{args} of {x.shape}",
        lambda a: ours(a, *args),
        lambda a: theirs(a, *args),
        (x,),
        ops=(name,) if ops is None else ops,
    )


GETITEM_KEYS = {
    "int": 2,
    "negative int": -1,
    "stepped slice, int": (slice(1, 4, 2), 2),
    "None and an open slice": (slice(None), None, slice(1, None)),
    "Ellipsis, int": (Ellipsis, 1),
    "negative step": (slice(None, None, -2),),
    "int, Ellipsis, None": (1, Ellipsis, None),
    "reversed range": (slice(None), slice(5, 1, -2)),
    "empty slice": (slice(3, 3),),
}


def shape_cases() -> list[GradCase]:
    rng = np.random.default_rng(17)
    x, e, t = rng.normal(size=UNEVEN), rng.normal(size=EMPTY), rng.normal(size=(2, 5, 3))
    cases = [
        _same("reshape", x, (35,)),
        _same("reshape", x, (7, 5)),
        _same("reshape", x, (5, 7, 1)),
        _same("reshape", t, (10, 3)),
        _same("reshape", t, (2, -1)),
        _same("reshape", e, (3, 2)),
        GradCase(f"flatten {t.shape}", dt.flatten, lambda a: a.reshape(-1), (t,), ops=("reshape",)),
        GradCase(f"ravel {x.shape}", dt.ravel, np.ravel, (x,), ops=("reshape",)),
        _same("transpose", x),
        _same("transpose", t, (1, 0, 2)),
        _same("transpose", t, (2, 0, 1)),
        _same("transpose", t, (-1, 0, 1)),
        _same("swapaxes", x, 0, 1),
        _same("swapaxes", t, 0, -1),
        _same("expand_dims", x, 0),
        _same("expand_dims", x, -1),
        _same("expand_dims", e, (0, 2)),
        _same("squeeze", x[:, None, :].copy()),
        _same("squeeze", x[:, None, :].copy(), 1),
        _same("squeeze", rng.normal(size=(1, 5)), 0),
        _same("broadcast_to", rng.normal(size=(7,)), UNEVEN),
        _same("broadcast_to", rng.normal(size=(5, 1)), UNEVEN),
        _same("broadcast_to", e, (4, 2, 3)),
        _same("tile", x, 2),
        _same("tile", e, (2, 1)),
        _same("tile", e, (2, 1, 2)),
        _same("repeat", x, 2, 0),
        _same("repeat", x, [1, 0, 3, 1, 2, 1, 1], 1),
        _same("repeat", e, 2, ops=("repeat", "reshape")),
        GradCase(
            f"split into 3 sections {t.shape}",
            lambda a: dt.split(a, 3, 2),
            lambda a: np.split(a, 3, 2),
            (t,),
            ops=("split",),
        ),
        GradCase(
            f"split at [1, 3] {x.shape}",
            lambda a: dt.split(a, [1, 3], 1),
            lambda a: np.split(a, [1, 3], 1),
            (x,),
            ops=("split",),
        ),
    ]
    two, three = rng.normal(size=(2, 7)), rng.normal(size=(5, 3))
    cases += [
        GradCase(
            "concatenate axis 0",
            lambda a, b: dt.concatenate([a, b], 0),
            lambda a, b: np.concatenate([a, b], 0),
            (x, two),
            ops=("concatenate",),
        ),
        GradCase(
            "concatenate axis 1, three inputs",
            lambda a, b, c: dt.concatenate([a, b, c], 1),
            lambda a, b, c: np.concatenate([a, b, c], 1),
            (x, three, x[:, :2].copy()),
            ops=("concatenate",),
        ),
        GradCase(
            "concatenate with a constant",
            lambda a: dt.concatenate([a, np.ones((1, 7))], -2),
            lambda a: np.concatenate([a, np.ones((1, 7))], -2),
            (x,),
            ops=("concatenate",),
        ),
    ]
    y = rng.normal(size=UNEVEN)
    for axis in (0, 1, -1):
        cases.append(
            GradCase(
                f"stack axis {axis}",
                lambda a, b, axis=axis: dt.stack([a, b], axis),
                lambda a, b, axis=axis: np.stack([a, b], axis),
                (x, y),
                ops=("stack",),
            )
        )
    for label, key in GETITEM_KEYS.items():
        cases.append(
            GradCase(
                f"getitem [{label}]",
                lambda a, key=key: a[key],
                lambda a, key=key: a[key],
                (x,),
                ops=("getitem",),
            )
        )
    cases.append(
        GradCase(
            "getitem 3-D [0, ..., 1:3]",
            lambda a: a[0, ..., 1:3],
            lambda a: a[0, ..., 1:3],
            (t,),
            ops=("getitem",),
        )
    )
    _lighten([c for c in cases if c.label in ("stack axis 1", "stack axis -1")])
    return cases


def internal_cases() -> list[GradCase]:
    """The scatter ops gradients are made of are linear; their own gradients are gathers."""
    from disttensor.ops import nn
    from disttensor.ops import shape as sh
    from disttensor.ops.elementwise import GRAD_OPS
    from disttensor.spmd.shape_rules import canonical_key

    rng = np.random.default_rng(18)
    key = (slice(1, 4, 2), slice(None), None)
    canonical = canonical_key(UNEVEN, key)  # the form getitem records
    g = rng.normal(size=(2, 7, 1))

    def scatter(a, key=key):
        out = np.zeros(UNEVEN)
        out[key] = a
        return out

    ids = np.array([[0, 5, -1], [2, 2, 1]])
    rows = rng.normal(size=(2, 3, 4))
    signs = np.random.default_rng(19).choice([-1.0, 1.0], UNEVEN)  # rng's draws unchanged
    relu_x = signs * np.random.default_rng(20).uniform(0.1, 2.0, UNEVEN)

    def scatter_add(i, r):
        out = np.zeros((6, 4))
        np.add.at(out, np.where(i < 0, i + 6, i), r)
        return out

    return [
        GradCase(
            "getitem_grad (scatter)",
            lambda a: sh.OPS["getitem_grad"](a, key=canonical, shape=UNEVEN),
            scatter,
            (g,),
            ops=("getitem_grad",),
        ),
        GradCase(
            "embedding_grad (scatter-add)",
            lambda i, r: nn.EMBEDDING_GRAD(i, r, vocab=6),
            scatter_add,
            (ids, rows),
            ops=("embedding_grad",),
        ),
        # the fused gradients of tanh and sigmoid, from (g, out)
        GradCase(
            "tanh_grad",
            lambda a, o: GRAD_OPS["tanh_grad"](a, o),
            lambda a, o: a * (1 - o * o),
            (rng.normal(size=UNEVEN), np.tanh(rng.normal(size=UNEVEN))),
            ops=("tanh_grad",),
        ),
        GradCase(
            "sigmoid_grad",
            lambda a, o: GRAD_OPS["sigmoid_grad"](a, o),
            lambda a, o: a * (o * (1 - o)),
            (rng.normal(size=UNEVEN), rng.uniform(0.05, 0.95, size=UNEVEN)),
            ops=("sigmoid_grad",),
        ),
        # a mean's gradient: the broadcast and the 1/count scale in one op
        GradCase(
            "broadcast_to scaled (mean's gradient)",
            lambda a: sh.OPS["broadcast_to"](a, shape=(6, 5, 7), scale=0.25),
            lambda a: np.broadcast_to(a, (6, 5, 7)) * 0.25,
            (rng.normal(size=(5, 1)),),
            ops=("broadcast_to",),
        ),
        # the fused gradients of gelu and silu, from (g, x): differentiable in both
        GradCase(
            "gelu_grad",
            lambda a, x: GRAD_OPS["gelu_grad"](a, x),
            lambda a, x: a * np_gelu_derivative(x),
            (rng.normal(size=UNEVEN), 2 * rng.normal(size=UNEVEN)),
            ops=("gelu_grad",),
        ),
        GradCase(
            "silu_grad",
            lambda a, x: GRAD_OPS["silu_grad"](a, x),
            lambda a, x: a * np_silu_derivative(x),
            (rng.normal(size=UNEVEN), 3 * rng.normal(size=UNEVEN)),
            ops=("silu_grad",),
        ),
        # relu's: in x zero almost everywhere (no gradient), so x is a constant here
        GradCase(
            "relu_grad",
            lambda a: GRAD_OPS["relu_grad"](a, relu_x),
            lambda a: np.where(relu_x > 0, a, 0.0),
            (rng.normal(size=UNEVEN),),
            ops=("relu_grad",),
        ),
    ]


def np_gelu_derivative(x):
    """d/dx of GELU's tanh approximation, by hand."""
    c = math.sqrt(2 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * c * (1 + 3 * 0.044715 * x**2)


def np_silu_derivative(x):
    s = 1 / (1 + np.exp(-x))
    return s + x * s * (1 - s)


# -- nn ----------------------------------------------------------------------------------------
def np_layer_norm(x, w=None, b=None, begin=-1, eps=1e-5):
    axes = tuple(range(begin % x.ndim, x.ndim))
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def np_cross_entropy(logits, labels, axis=-1, reduction="mean"):
    n = logits.shape[axis]
    labels = np.where(labels < 0, labels + n, labels)
    m = logits.max(axis, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(axis, keepdims=True)) + m
    loss = -np.take_along_axis(logits - lse, np.expand_dims(labels, axis), axis).squeeze(axis)
    return loss if reduction == "none" else getattr(loss, reduction)()


def _embedding_grads(cots, ids, w):
    g = np.zeros_like(w)
    np.add.at(g, np.where(ids < 0, ids + w.shape[0], ids), cots[0])
    return [g]


def _ce_grid(shape, reduction: str) -> str:
    if reduction != "mean":  # the reductions differ after the op: its layouts are the mean's
        return "light"
    return "full" if shape == (5, 6) else "default"


def nn_cases() -> list[GradCase]:
    rng = np.random.default_rng(19)
    cases = []
    # layer_norm: normalized axes whole (fused) or split (composite), weight and bias
    for shape, begin in (((5, 7), -1), ((2, 5, 3), 1), ((2, 5, 3), 2), ((2, 3), 1)):
        x = rng.normal(1, 2, shape)
        ns = shape[begin:]
        w, b = rng.normal(size=ns), rng.normal(size=ns)
        cases += [
            GradCase(
                f"layer_norm {shape} begin={begin}",
                lambda a, begin=begin: dt.layer_norm(a, begin_norm_axis=begin),
                lambda a, begin=begin: np_layer_norm(a, begin=begin),
                (x,),
                ops=("layer_norm",),
            ),
            GradCase(
                f"layer_norm {shape} begin={begin} weight, bias",
                lambda a, p, q, begin=begin: dt.layer_norm(a, p, q, begin_norm_axis=begin),
                lambda a, p, q, begin=begin: np_layer_norm(a, p, q, begin=begin),
                (x, w, b),
                ops=("layer_norm",),
            ),
        ]
    cases.append(
        GradCase(
            "layer_norm (5,7) weight only, epsilon=0.1",
            lambda a, p: dt.layer_norm(a, p, None, epsilon=0.1),
            lambda a, p: np_layer_norm(a, p, None, eps=0.1),
            (rng.normal(size=UNEVEN), rng.normal(size=(7,))),
        )
    )
    # embedding: vocabulary-sharded, column-sharded, ids sharded; repeated and negative ids
    for vocab, ids_shape in ((6, (2, 3)), (5, (5,)), (3, (2, 2))):
        w = rng.normal(size=(vocab, 4))
        ids = rng.integers(-vocab, vocab, ids_shape)
        ids.reshape(-1)[:2] = ids.reshape(-1)[-1]  # repeats accumulate
        cases.append(
            GradCase(
                f"embedding vocab={vocab} ids{ids_shape}",
                dt.embedding,
                lambda i, t: t[i],
                (ids, w),
                ops=("embedding",),
                grads=_embedding_grads,
                grid="full" if vocab == 6 else "default",
            )
        )
    # cross_entropy: fused (class axis whole) and vocabulary-parallel (class axis split)
    for shape, axis in (((5, 6), -1), ((6, 5), 0), ((2, 3, 5), -1), ((2, 3), 1)):
        logits = rng.normal(0, 2, shape)
        n = shape[axis]
        labels = rng.integers(-n, n, shape[: axis % len(shape)] + shape[axis % len(shape) + 1 :])
        for reduction in ("mean", "sum", "none"):
            cases.append(
                GradCase(
                    f"cross_entropy {shape} axis={axis} {reduction}",
                    lambda lg, lb, axis=axis, r=reduction: dt.cross_entropy(lg, lb, axis, r),
                    lambda lg, lb, axis=axis, r=reduction: np_cross_entropy(lg, lb, axis, r),
                    (logits, labels),
                    ops=("cross_entropy",),
                    grid=_ce_grid(shape, reduction),
                )
            )

    def vocab_parallel(mesh):  # every placement pair that splits the class axis
        grid = [([S1], [S0]), ([S1], [R]), ([S1], [PSUM])]
        return grid if mesh.ndim == 1 else [([S0, S1], [S0, R]), ([S1, S1], [R, R])]

    logits, labels = rng.normal(0, 2, (5, 6)), rng.integers(-6, 6, (5,))
    for reduction in ("mean", "sum", "none"):
        cases.append(
            GradCase(
                f"cross_entropy vocabulary-parallel {reduction}",
                lambda lg, lb, r=reduction: dt.cross_entropy(lg, lb, reduction=r),
                lambda lg, lb, r=reduction: np_cross_entropy(lg, lb, reduction=r),
                (logits, labels),
                ops=("take_labels",),
                grid=lambda mesh: vocab_parallel(mesh) if mesh.size > 1 else [],
            )
        )
    return cases


# -- reshard -----------------------------------------------------------------------------------
RESHARD_TARGETS_1D = [[S0], [S1], [R], [PSUM]]
RESHARD_TARGETS_2D = [[S0, S1], [R, S0], [PSUM, R], [S1, PSUM], [R, R]]


def reshard_cases() -> list[GradCase]:
    rng = np.random.default_rng(20)
    out = []
    for label, shape in (("uneven", UNEVEN), ("empty", EMPTY)):
        x = rng.normal(size=shape)
        for i in range(len(RESHARD_TARGETS_2D)):

            def fn(a, i=i):
                targets = RESHARD_TARGETS_1D if a.mesh.ndim == 1 else RESHARD_TARGETS_2D
                dst = targets[i % len(targets)]
                return dt.sin(dt.reshard(a, a.mesh, dst)) * 2

            out.append(
                GradCase(
                    f"reshard {label} to target {i}",
                    fn,
                    lambda a: np.sin(a) * 2,
                    (x,),
                    ("reshard",),
                )
            )
    return out


# -- SPMD cases for mpiexec (tests/mpi_runner.py) and simulated ranks -----------------------------
def _mpi_run(world: int, cases: list[GradCase], shapes=((1,), (2,), (3,), (4,), (2, 2))) -> int:
    """The cases on each listed mesh that fits the world; ranks outside a mesh skip it."""
    grid = GradGrid()
    for shape in shapes:
        if math.prod(shape) > world:
            continue
        mesh = mesh_of(shape)
        if dt.get_rank() not in mesh:
            continue
        for case in cases:
            grid.run(mesh, case)
    return assert_grid([grid.result()], minimum=0, ranks=[dt.get_rank()])


def _on(one_d: list, two_d: list):
    """A grid: ``one_d`` on 1-D meshes, ``two_d`` on 2-D ones."""
    return lambda mesh: one_d if mesh.ndim == 1 else two_d


def mpi_cases() -> list[GradCase]:
    """An MLP-style matmul chain (data parallel; column then row parallel), layer_norm with
    split normalized axes, vocabulary-parallel cross entropy, a sharded embedding."""
    rng = np.random.default_rng(21)
    x, w1, w2 = rng.normal(size=(5, 4)), rng.normal(size=(4, 6)), rng.normal(size=(6, 3))
    mlp = GradCase(
        "MLP tanh(x @ w1) @ w2",
        lambda a, b, c: dt.tanh(a @ b) @ c,
        lambda a, b, c: np.tanh(a @ b) @ c,
        (x, w1, w2),
        ops=("matmul", "tanh"),
        grid=_on(
            [([S0], [R], [R]), ([R], [S1], [S0]), ([PSUM], [R], [S1])],
            [([S0, R], [R, S1], [R, S0]), ([S0, S1], [R, R], [S1, R])],
        ),
    )
    t, w, b = rng.normal(size=(2, 5, 3)), rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    ln = GradCase(
        "layer_norm (2, 5, 3) begin=1, hidden split, weight, bias",
        lambda a, p, q: dt.layer_norm(a, p, q, begin_norm_axis=1),
        lambda a, p, q: np_layer_norm(a, p, q, begin=1),
        (t, w, b),
        grid=_on([([S1], [S0], [R]), ([S0], [R], [R])], [([S0, S1], [R, S0], [R, R])]),
    )
    logits, labels = rng.normal(0, 2, (5, 6)), rng.integers(-6, 6, (5,))
    ce = GradCase(
        "cross_entropy (5, 6) mean",
        lambda lg, lb: dt.cross_entropy(lg, lb),
        np_cross_entropy,
        (logits, labels),
        grid=_on([([S1], [R]), ([S1], [S0])], [([S0, S1], [S0, R])]),
    )
    table, ids = rng.normal(size=(6, 4)), np.array([[0, 5, -1], [2, 2, 1]])
    emb = GradCase(
        "embedding",
        dt.embedding,
        lambda i, tb: tb[i],
        (ids, table),
        ops=("embedding",),
        grads=_embedding_grads,
        grid=_on(
            [([R], [S0]), ([S0], [S1]), ([S1], [S0])], [([S0, R], [R, S1]), ([R, S1], [S0, R])]
        ),
    )
    return [mlp, ln, ce, emb]


def case_grad_models(world: int) -> int:
    """mpi_cases() on the meshes (1), (2), (3), (4), (2, 2) that fit the world."""
    return _mpi_run(world, mpi_cases())


# -- layout ops (disttensor/ops/layout.py) ---------------------------------------------------------
def layout_cases() -> list[GradCase]:
    """flip, roll, pad (remap: the inverse map back), diff, tril/triu, diagonals (diagonal and
    diag_embed, each the other's gradient), trace, take_along_axis (a scatter-add back, and
    that scatter's own gradient), tensordot and the stacking functions (composites)."""
    from disttensor.ops import layout

    rng = np.random.default_rng(23)
    x, e, sq = rng.normal(size=UNEVEN), rng.normal(size=EMPTY), rng.normal(size=(5, 5))
    v = rng.normal(size=(4,))
    rows = rng.integers(-5, 5, (6, 7))  # along axis 0 of UNEVEN: repeated and negative
    cols = rng.integers(0, 7, (5, 3))
    g = rng.normal(size=(5, 3))

    def scatter(a, i):
        out = np.zeros(UNEVEN)
        np.add.at(out, (np.arange(5)[:, None], i), a)
        return out

    def one(label, fn, arr, ops, grid="light"):
        return GradCase(label, fn, fn, (arr,), ops=ops, grid=grid)

    cases = [
        one("flip axis 0", lambda a: np.flip(a, 0), x, ("remap",), grid="default"),
        one("flip empty", np.flip, e, ("remap",)),
        one("roll 2 axis 0", lambda a: np.roll(a, 2, 0), x, ("remap",), grid="default"),
        one("roll (1, -3) axes (0, 1)", lambda a: np.roll(a, (1, -3), (0, 1)), x, ("remap",)),
        one(
            "pad ((1, 2), (0, 1)) value 0.5",
            lambda a: np.pad(a, ((1, 2), (0, 1)), constant_values=0.5),
            x,
            ("remap",),
            grid="default",
        ),
        one("diff axis 0", lambda a: np.diff(a, axis=0), x, ("diff",), grid="default"),
        one("diff 2 axis 1 prepend", lambda a: np.diff(a, 2, 1, prepend=1.0), x, ("remap", "diff")),
        one("diff empty", lambda a: np.diff(a, axis=0), e, ("diff",)),
        one("tril 1", lambda a: np.tril(a, 1), x, ("tril",), grid="default"),
        one("triu -1", lambda a: np.triu(a, -1), x, ("triu",)),
        one("diagonal square", np.diagonal, sq, ("diagonal",), grid="default"),
        one("diagonal 1", lambda a: np.diagonal(a, 1), x, ("diagonal",), grid="default"),
        one("trace -1", lambda a: np.trace(a, -1), x, ("diagonal",)),
        one("diag of a vector", lambda a: np.diag(a, 1), v, ("diag_embed",), grid="default"),
        one("diag of a vector, no offset", np.diag, v, ("diag_embed",)),
        one("tensordot", lambda a: np.tensordot(a, a, ([0], [0])), x, ("einsum",)),
        one(
            "hstack vstack",
            lambda a: np.vstack([np.hstack([a, a]), a[:1].repeat(2, 1)]),
            x,
            ("concatenate",),
        ),
        GradCase(
            "vstack along a split axis (join)",
            lambda a, b: np.vstack([a, b]),
            lambda a, b: np.vstack([a, b]),
            (x, rng.normal(size=(2, 7))),
            ops=("join",),
            grid=lambda mesh: (
                []
                if mesh.size == 1
                else _on(
                    [([S0], [S0])],
                    [([S0, S1], [S0, S1]), ([S1, S0], [S1, S0]), ([PSUM, S0], [PSUM, S0])],
                )(mesh)
            ),
        ),
        GradCase(
            "take_along_axis axis 0",
            lambda a, i: np.take_along_axis(a, i, 0),
            lambda a, i: np.take_along_axis(a, i, 0),
            (x, rows),
            ops=("take_along_axis",),
        ),
        GradCase(
            "take_along_axis axis 1, broadcast",
            lambda a, i: np.take_along_axis(a, i, 1),
            lambda a, i: np.take_along_axis(a, i, 1),
            (rng.normal(size=(1, 7)), cols),
            ops=("take_along_axis",),
            grid="light",
        ),
        GradCase(
            "take_along_axis_grad (scatter-add)",
            lambda a, i: layout.OPS["take_along_axis_grad"](a, i, axis=1, length=7),
            scatter,
            (g, cols),
            ops=("take_along_axis_grad",),
        ),
    ]
    return cases


# -- numpy's ufuncs (tests/test_ufuncs.py) -----------------------------------------------------
def ufunc_data(domain: str, shape, dtype, rng) -> np.ndarray:
    """Values of ``domain`` for an argument: real, unit (inside (-1, 1)), above1, nonzero,
    positive, small (integers near 0), shift (0 to 5), away (nonzero, off the integers)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo, hi = {"shift": (0, 6), "positive": (1, 10), "nonzero": (1, 10)}.get(domain, (-9, 10))
        if dtype.kind == "u":
            lo = max(lo, 0)
        return rng.integers(lo, hi, shape).astype(dtype)
    if domain == "unit":
        v = rng.uniform(-0.95, 0.95, shape)
    elif domain == "above1":
        v = rng.uniform(1.05, 5.0, shape)
    elif domain in ("nonzero", "positive", "away"):
        v = rng.uniform(0.5, 4.0, shape)
        if domain != "positive":
            v *= rng.choice([-1.0, 1.0], shape)
        if domain == "away":
            v = np.trunc(v) + np.copysign(rng.uniform(0.2, 0.8, shape), v)
    elif domain in ("small", "shift"):
        v = rng.integers(-3, 4, shape).astype(np.float64)
    else:
        v = rng.normal(0.0, 3.0, shape)
    return v.astype(dtype)


def ufunc_cases() -> list[GradCase]:
    """float64 arguments in each op's domain, away from its kinks and jumps (central
    differences of step 1e-6 must not straddle one); numpy's entry points for the ops dt does
    not export (np.fmod, np.float_power, np.ldexp) and for a few that it does."""
    rng = np.random.default_rng(51)
    shape = (5, 7)

    def d(domain):
        return ufunc_data(domain, shape, F64, rng)

    y = d("nonzero")
    q = y * (rng.integers(-3, 4, shape) + rng.uniform(0.2, 0.8, shape))  # x / y off integers
    unary = {
        **dict.fromkeys(("arccos", "arcsin", "arctanh"), "unit"),
        "arccosh": "above1",
        **dict.fromkeys(("arcsinh", "exp2", "deg2rad", "degrees", "rad2deg", "radians"), "real"),
        **dict.fromkeys(("cbrt", "fabs"), "nonzero"),
        "modf": "away",
    }
    cases = [
        GradCase(n, getattr(dt, n), getattr(np, n), (d(dom),), (n,)) for n, dom in unary.items()
    ]
    cases += [
        GradCase("np.arccos", np.arccos, np.arccos, (d("unit"),), ("arccos",)),
        GradCase("np.cbrt", np.cbrt, np.cbrt, (d("nonzero"),), ("cbrt",)),
    ]
    binary = {
        "hypot": (d("real"), d("real")),
        "logaddexp": (d("real"), d("real")),
        "logaddexp2": (d("real"), d("real")),
        "copysign": (d("nonzero"), d("nonzero")),
        "fmax": (d("real"), d("real")),
        "fmin": (d("real"), d("real")),
        "divmod": (q, y),
    }
    cases += [GradCase(n, getattr(dt, n), getattr(np, n), args, (n,)) for n, args in binary.items()]
    for n, args in {
        "fmod": (q, y),
        "float_power": (d("positive"), rng.uniform(-2, 2, shape)),
        "ldexp": (d("real"), rng.integers(-3, 4, shape)),
    }.items():
        cases.append(GradCase(f"np.{n}", getattr(np, n), getattr(np, n), args, (n,)))
    cases += [
        GradCase("np.hypot(x, row)", np.hypot, np.hypot, (d("real"), d("real")[0]), ("hypot",)),
        GradCase(
            "np.fmax(x, 0.5)",
            lambda a: np.fmax(a, 0.5),
            lambda a: np.fmax(a, 0.5),
            (d("real"),),
            ("fmax",),
        ),
        GradCase(
            "np.ldexp(x, 3)",
            lambda a: np.ldexp(a, 3),
            lambda a: np.ldexp(a, 3),
            (d("real"),),
            ("ldexp",),
        ),
        GradCase(
            "2.5 ** y (float_power)",
            lambda b: np.float_power(2.5, b),
            lambda b: np.float_power(2.5, b),
            (d("real"),),
            ("float_power",),
        ),
    ]
    for c in cases:
        c.grid = "light"
    return cases
