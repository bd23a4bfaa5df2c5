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
    place,
    placements,
)

import disttensor as dt
from disttensor import accounting
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


def _linear(mesh, dtype):
    """dt.linear against x @ w + b: every (x, w) pair of the matmul grid with each bias
    placement (every combination for the 2-D case on 1-D meshes), uneven, empty and batched
    inputs."""
    grid, rng = Grid(), np.random.default_rng(14)
    s = mesh.size
    n, c, m = 2 * s + 1, s + 2, s + 1

    def ref(x, w, b):
        return x @ w + b

    for sx in [(n, c), (max(s - 1, 1), c), (0, c), (c,), (2, n, c)]:
        x, w, b = data(sx, dtype, rng), data((c, m), dtype, rng), data((m,), dtype, rng)
        bias_pls = placements(mesh, 1, dtype)
        full = sx == (n, c) and mesh.ndim == 1
        for i, (px, pw) in enumerate(pairs(mesh, x, w, full=len(sx) < 3)):
            for pb in bias_pls if full else [bias_pls[i % len(bias_pls)]]:
                what = f"linear {sx} {dtype} {px} {pw} {pb}"
                grid.check(mesh, dt.linear, (x, w, b), [px, pw, pb], ref, what)
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
def test_linear(dtype, mesh_shape):
    assert_grid(simulate_on(mesh_shape, _linear, dtype))


LINEAR_LAYOUTS = {  # (x, weight, bias) -> (output, collectives): Note [Bias of a linear]
    "data parallel": ((S0, R, R), S0, {}),
    "column parallel": ((R, S1, S0), S1, {}),
    "row parallel": ((S1, S0, R), PSUM, {}),
    "Partial x": ((PSUM, R, R), PSUM, {}),
    "Partial bias": ((R, R, PSUM), PSUM, {}),
    "Partial x and bias": ((PSUM, R, PSUM), PSUM, {}),
    "column weight, whole bias": ((R, S1, R), S1, {}),
    "split bias only": ((R, R, S0), S1, {}),
}


@pytest.mark.parametrize("layout", LINEAR_LAYOUTS, ids=str)
def test_linear_layouts_communicate_as_matmul_and_add_would(layout):
    """The layouts of data and tensor parallel layers: the output placement and the
    collectives (none), the same as ``x @ w + b`` gives."""
    pls, out, counts = LINEAR_LAYOUTS[layout]
    rng = np.random.default_rng(3)
    args = data((5, 3), F64, rng), data((3, 4), F64, rng), data((4,), F64, rng)

    def body(mesh):
        xs, ws, bs = place(mesh, args, [[p] for p in pls])
        with dt.CommCounter() as fused:
            y = dt.linear(xs, ws, bs)
        with dt.CommCounter() as apart:
            z = xs @ ws + bs
        return y.placements, fused.counts, z.placements, apart.counts, y.numpy()

    got = every_rank(simulate_on((2,), body))
    assert got[:4] == ([out], counts, [out], counts)
    np.testing.assert_allclose(got[4], args[0] @ args[1] + args[2], rtol=1e-12)


def test_linear_other_shapes_compute_the_expression():
    """A bias that is not (out,) or a weight that is not 2-D: x @ w + bias, broadcast as in
    numpy (no fused op)."""

    def body(mesh):
        x = make_input(np.arange(6.0).reshape(2, 3), mesh, [S0])
        got = [
            dt.linear(x, np.ones((3, 2)), np.ones((2, 2))).numpy(),
            dt.linear(x, np.ones(3), 5.0).numpy(),
            dt.linear(x, np.ones((3, 2)), None).numpy(),
        ]
        return got

    a = np.arange(6.0).reshape(2, 3)
    want = [a @ np.ones((3, 2)) + np.ones((2, 2)), a @ np.ones(3) + 5.0, a @ np.ones((3, 2))]
    for got, ref in zip(every_rank(simulate_on((2,), body)), want):
        np.testing.assert_array_equal(got, ref)


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
        before = Counter(accounting.FALLBACKS)
        np.matmul(a, np.ones((3, 2)))
        np.ones((2, 4)) @ a
        return accounting.FALLBACKS - before

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


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128, np.int64, np.float16])
def test_the_host_matmul_kernel_is_numpys_matmul(dtype):
    """The kernel calls np.dot for vectors and matrices of one BLAS dtype (np.matmul's BLAS
    call without its dispatch) and np.matmul for the rest: numpy's matmul values, strided
    operands, mixed dtypes and stacks included; ``plain`` names what it calls."""
    from disttensor.ops import linalg

    g = np.random.default_rng(3)

    def arr(*shape):
        a = g.standard_normal(shape) * 4
        return (a + 1j * g.standard_normal(shape) if dtype is np.complex128 else a).astype(dtype)

    M, N, v, w, T = arr(5, 7), arr(7, 3), arr(7), arr(5), arr(2, 5, 7)
    cases = [(v, v), (M, v), (w, M), (M, N), (M[:, ::2], v[::2]), (M.T, w), (T, v), (T, N)]
    cases.append((M, np.real(v).astype(np.float32 if dtype is np.float64 else np.float64)))
    blas = np.dtype(dtype).char in "fdFD"
    for x, y in cases:
        want, got = np.matmul(x, y), linalg._matmul(x, y)
        assert np.asarray(got).dtype == np.asarray(want).dtype and np.shape(got) == np.shape(want)
        if np.dtype(dtype).kind in "iu":
            np.testing.assert_array_equal(got, want)
        else:
            tol = 1e-2 if dtype is np.float16 else 1e-5 if dtype is np.float32 else 1e-12
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)
        by_dot = blas and x.ndim <= 2 and y.ndim <= 2 and x.dtype == y.dtype
        assert linalg._by_dot(x, y) is (np.dot if by_dot else np.matmul), (x.shape, y.shape)


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
        with pytest.raises(ValueError, match=r"matmul: .* \(size 4 is different from 3\)"):
            dt.matmul(x, np.ones((4, 2)))  # numpy's message (np.ones((4, 3)) @ np.ones((4, 2)))
        with pytest.raises(ValueError):
            dt.einsum("ij,jk", x, np.ones((4, 2)))
        return True

    assert simulate_on((3,), body) == [True] * 3


# -- eigh, eigvalsh (Note [Eigenproblems of whole matrices]) -------------------------------------
def _symmetric(shape, seed):
    """Integer-valued symmetric matrices (Partial splits sum exactly: numpy's input bits)."""
    a = np.round(8 * np.random.default_rng(seed).normal(size=shape))
    return a + np.swapaxes(a, -1, -2)


def _eigh_layouts(mesh, ndim):
    """(placements, the results' placements, collectives allowed)."""
    last = dt.Shard(ndim - 1)
    if mesh.ndim == 1:
        out = [([R], [R], set()), ([S0], [R], {"all_gather"}), ([last], [R], {"all_gather"})]
        out += [([PSUM], [R], {"all_reduce"}), ([dt.Partial("max")], [R], {"all_reduce"})]
        if ndim == 3:
            out.append(([S0], [S0], set()))  # a stack split by matrices: each rank its own
        return [o for o in out if not (ndim == 3 and o[0] == [S0] and o[1] == [R])]
    batch = S0 if ndim == 3 else R  # Shard(0) of a stack splits the matrices: kept
    out = [([S0, last], [batch, R], {"all_gather"}), ([R, PSUM], [R, R], {"all_reduce"})]
    if ndim == 3:
        out += [([S0, S0], [S0, S0], set()), ([S0, dt.Shard(1)], [S0, R], {"all_gather"})]
    return out


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_eigh_against_numpy(mesh_shape):
    """numpy's eigenvalues and eigenvectors on every placement: no communication for a
    Replicate matrix or a stack split by matrices (uneven and empty shards), one all-gather
    or all-reduce for a matrix split along its own axes or Partial; eigvalsh alike."""
    mats = {"5 x 5": _symmetric((5, 5), 1), "2 x 2": _symmetric((2, 2), 2)}
    mats["stack of 3"] = _symmetric((3, 4, 4), 3)

    def body(mesh):
        out = []
        for label, a in mats.items():
            for pls, _, allowed in _eigh_layouts(mesh, a.ndim):
                x = make_input(a, mesh, pls)
                with dt.CommCounter() as cc:
                    w, v = np.linalg.eigh(x)
                    lam = np.linalg.eigvalsh(x, UPLO="U")
                placements = [w.placements, v.placements, lam.placements]
                ok = set(cc.counts) <= allowed and not cc.fallbacks
                out.append((label, str(pls), w.numpy(), v.numpy(), lam.numpy(), placements, ok))
        return out

    mesh = mesh_of(mesh_shape)
    results = every_rank(simulate_on(mesh_shape, body))
    layouts = [(label, lay) for label, a in mats.items() for lay in _eigh_layouts(mesh, a.ndim)]
    for (label, (_, want_pls, _)), (_, pls, w, v, lam, got_pls, ok) in zip(layouts, results):
        want = np.linalg.eigh(mats[label])
        what = f"{label} {pls}"
        assert_close(w, want.eigenvalues, what)
        assert_close(v, want.eigenvectors, what)
        assert_close(lam, np.linalg.eigvalsh(mats[label], UPLO="U"), what)
        assert got_pls == [want_pls] * 3, (what, got_pls)
        assert ok, what


def test_eigh_errors_and_no_gradient():
    """numpy's errors on every rank; backward through eigh raises naming it."""

    def body(mesh):
        errors = []
        for bad, kw in ((np.ones(4), {}), (np.ones((4, 3)), {}), (np.eye(4), {"UPLO": "X"})):
            try:
                np.linalg.eigh(make_input(bad, mesh, [S0]), **kw)
            except (np.linalg.LinAlgError, ValueError) as e:
                errors.append(f"{type(e).__name__}: {e}")
        x = make_input(_symmetric((4, 4), 4), mesh, [R])
        x.requires_grad = True
        try:
            np.linalg.eigh(x).eigenvalues.sum().backward()
        except NotImplementedError as e:
            errors.append(str(e))
        return errors

    for errors in simulate_on((2,), body):
        assert errors[:3] == [
            "LinAlgError: 1-dimensional array given. Array must be at least two-dimensional",
            "LinAlgError: Last 2 dimensions of the array must be square",
            "ValueError: UPLO argument must be 'L' or 'U'",
        ], errors
        assert len(errors) == 4 and errors[3].startswith("eigh has no gradient"), errors
