"""matmul, dot, einsum and outer against numpy over meshes, placements, sizes and dtypes."""

from __future__ import annotations

from collections import Counter
from functools import partial

import numpy as np
import pytest
from op_cases import (
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
    pairs,
)

import disttensor as dt
from disttensor import dispatch
from disttensor.spmd.validate import REFS, data

MESH_IDS = [str(s) for s in MESH_SHAPES]


def simulate_on(mesh_shape, fn, *args):
    mesh = mesh_of(mesh_shape)
    return dt.simulate(mesh.size, fn, mesh, *args)


def matmul_cases(s: int) -> dict[str, tuple]:
    """label -> (x shape, y shape, attrs); s is the mesh size (uneven 2s+1, empty s-1)."""
    n, c, m, b = 2 * s + 1, s + 2, s + 1, s + 1
    return {
        "2-D": ((n, c), (c, m), {}),
        "empty rows": ((max(s - 1, 1), c), (c, m), {}),
        "1-D @ 2-D": ((c,), (c, m), {}),
        "2-D @ 1-D": ((n, c), (c,), {}),
        "1-D @ 1-D": ((c,), (c,), {}),
        "batched": ((b, n, c), (b, c, m), {}),
        "batch broadcast": ((b, 1, n, c), (2, c, m), {}),
        "batched @ 2-D": ((b, n, c), (c, m), {}),
        "trans_x": ((c, n), (c, m), {"trans_x": True}),
        "trans_y": ((n, c), (m, c), {"trans_y": True}),
        "trans both": ((b, c, n), (m, c), {"trans_x": True, "trans_y": True}),
    }


def _matmul(mesh, dtype, labels):
    grid, rng = Grid(), np.random.default_rng(10)
    for label, (sx, sy, attrs) in matmul_cases(mesh.size).items():
        if label not in labels:
            continue
        x, y = data(sx, dtype, rng), data(sy, dtype, rng)
        for px, py in pairs(mesh, x, y):
            what = f"matmul {label} {dtype} {px} {py} {attrs}"
            grid.check(mesh, dt.matmul, (x, y), [px, py], REFS["matmul"], what, **attrs)
    return grid.result()


ALL_CASES = tuple(matmul_cases(2))


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
@pytest.mark.parametrize(
    "dtype,labels",
    [(F64, ALL_CASES), (F32, ("2-D", "batch broadcast")), (I64, ("2-D", "1-D @ 1-D"))],
    ids=["float64", "float32", "int64"],
)
def test_matmul(dtype, labels, mesh_shape):
    assert_grid(simulate_on(mesh_shape, _matmul, dtype, labels))


def _operators(mesh):
    grid, rng = Grid(), np.random.default_rng(11)
    x, y, dense = data((5, 4), F64, rng), data((4, 3), F64, rng), data((3, 2), F64, rng)
    for px, py in pairs(mesh, x, y):
        grid.check(mesh, lambda a, b: a @ b, (x, y), [px, py], np.matmul, f"a @ b {px} {py}")
        grid.check(
            mesh,
            lambda a, b: a @ b @ dense,
            (x, y),
            [px, py],
            lambda a, b: a @ b @ dense,
            f"a @ b @ dense {px} {py}",
        )
        grid.check(mesh, lambda a, b: np.dot(a, b), (x, y), [px, py], np.dot, f"np.dot {px}")
        grid.check(
            mesh, lambda a, b: np.matmul(a, b), (x, y), [px, py], np.matmul, f"np.matmul {px} {py}"
        )
    return grid.result()


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (2, 2)], ids=str)
def test_matmul_operator_and_numpy(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _operators))


def test_np_matmul_uses_the_rule():
    """Regression (was: np.matmul, a ufunc, and `ndarray @ DistTensor` took the replicate
    fallback)."""

    def body(mesh):
        a = make_input(np.ones((4, 3)), mesh, [S0])
        before = Counter(dispatch.FALLBACKS)
        np.matmul(a, np.ones((3, 2)))
        np.ones((2, 4)) @ a
        return dispatch.FALLBACKS - before

    assert every_rank(simulate_on((2,), body)) == Counter()


def _dot_outer(mesh):
    grid, rng = Grid(), np.random.default_rng(12)
    s = mesh.size
    n, c, m = 2 * s + 1, s + 2, s + 1
    for sx, sy in [((n, c), (c, m)), ((c,), (c,)), ((2, n, c), (2, c, m)), ((), (n, m))]:
        x, y = data(sx, F64, rng), data(sy, F64, rng)
        for px, py in pairs(mesh, x, y, full=len(sx) < 3):
            grid.check(mesh, dt.dot, (x, y), [px, py], np.dot, f"dot {sx}{px} {sy}{py}")
    x, y = data((n,), F64, rng), data((m,), I64, rng)
    for px, py in pairs(mesh, x, y):
        grid.check(mesh, dt.outer, (x, y), [px, py], np.outer, f"outer {px} {py}")
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_dot_and_outer(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _dot_outer))


def einsum_cases(s: int) -> dict[str, tuple]:
    n, c, m, b = 2 * s + 1, s + 2, s + 1, s + 1
    return {
        "ij,jk->ik": ((n, c), (c, m)),
        "ij,jk": ((n, c), (c, m)),  # implicit output: 'ik'
        "ii->i": ((n, n),),
        "ii": ((n, n),),  # trace
        "ij->ji": ((n, m),),
        "ij->": ((n, m),),
        "ijk->kj": ((b, n, c),),
        "i,i->": ((n,), (n,)),
        "i,j->ij": ((n,), (m,)),
        "ij,ij->ij": ((n, m), (n, m)),
        "ij,j": ((n, m), (m,)),
        "bij,bjk->bik": ((b, n, c), (b, c, m)),
        "...ij,...jk->...ik": ((b, n, c), (c, m)),
        "...j,j->...": ((b, n, m), (m,)),
        "bi,bi->b": ((n, c), (n, c)),
    }


def _einsum(mesh, equations):
    grid, rng = Grid(), np.random.default_rng(13)
    for eq, shapes in einsum_cases(mesh.size).items():
        if eq not in equations:
            continue
        args = tuple(data(s, F64, rng) for s in shapes)
        if len(args) == 1:
            combos = [[p] for (p, _) in pairs(mesh, args[0], args[0], full=False)]
            combos = list({repr(c): c for c in combos}.values())
        else:
            combos = [list(c) for c in pairs(mesh, *args)]
        for pl in combos:
            grid.check(
                mesh, partial(dt.einsum, eq), args, pl, partial(np.einsum, eq), f"einsum {eq} {pl}"
            )
    return grid.result()


EQUATIONS = tuple(einsum_cases(2))


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
@pytest.mark.parametrize("part", [EQUATIONS[:7], EQUATIONS[7:]], ids=["unary", "binary"])
def test_einsum(part, mesh_shape):
    assert_grid(simulate_on(mesh_shape, _einsum, part))


def test_einsum_needs_a_string_equation():
    with pytest.raises(TypeError, match="equation as a string first"):
        dt.einsum(np.ones(2), "i->")


@pytest.mark.parametrize("px", [[S0], [S1], [R]], ids=str)
def test_outer_of_2d_input(px):
    """Regression (was: outer_rule passed N-D specs unflattened: wrong shape, internal error)."""

    g = np.arange(6.0).reshape(3, 2)

    def body(mesh):
        return dt.outer(make_input(g, mesh, px), np.arange(4.0)).numpy()

    assert_close(every_rank(simulate_on((2,), body)), np.outer(g, np.arange(4.0)), "outer 2-D")


def test_einsum_ellipsis_broadcast():
    """Regression (was: ellipsis axes of length 1 against n raised ValueError)."""

    a, b = np.arange(12.0).reshape(3, 1, 4), np.arange(20.0).reshape(5, 4)

    def body(mesh):
        x = make_input(a, mesh, [S0])
        return dt.einsum("...j,...j->...", x, b).numpy()

    assert_close(
        every_rank(simulate_on((2,), body)), np.einsum("...j,...j->...", a, b), "einsum ..."
    )


def test_matmul_0d_operand_error():
    """Regression (was: 'not enough values to unpack' from matmul_rule)."""

    def body(mesh):
        with pytest.raises(ValueError, match="matmul"):
            dt.matmul(make_input(np.ones((2, 2)), mesh, [S0]), np.float64(2.0))
        return True

    assert simulate_on((2,), body) == [True, True]


def test_matmul_mismatch_raises_on_every_rank():
    def body(mesh):
        x = make_input(np.ones((4, 3)), mesh, [PSUM])
        with pytest.raises(ValueError, match="axis 'k' has length 3 in one operand and 4"):
            dt.matmul(x, np.ones((4, 2)))
        with pytest.raises(ValueError):
            dt.einsum("ij,jk", x, np.ones((4, 2)))
        return True

    assert simulate_on((3,), body) == [True] * 3
