"""TSQR decompositions on simulated ranks and under mpiexec, against numpy
(disttensor/ops/decompositions.py): np.linalg.qr, svd, svdvals, lstsq of tall-skinny matrices.

For meshes (1), (2), (3), (4), (2, 2): the placement grid of the op tests (Shard of either
axis, Replicate, asymmetric Partials, nested shards on (2, 2)), float64, float32 and complex128,
tall, short-shard (every rank fewer rows than columns), empty-shard and square shapes: Q and R
must be numpy's, signs included (Note [Householder signs]), Q split like the rows and R
Replicate; singular values numpy's, U and Vh numpy's up to the sign of each singular pair;
lstsq numpy's x, residuals, rank and s; and no call may take the fallback. Then the one
all-gather of O(P n^2) bytes each call makes, LAPACK's sign special cases, rank-deficient
systems, the layouts that keep the fallback, numpy's errors, and a few cases under mpiexec.

Run as a script (``mpiexec -n N python tests/test_decompositions.py``) it checks the cases of
``case_decompositions`` on the real world.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from op_cases import (
    F32,
    F64,
    MESH_SHAPES,
    PMAX,
    PSUM,
    S0,
    S1,
    R,
    assert_close,
    assert_grid,
    every_rank,
    fitting_meshes,
    make_input,
    mesh_of,
    placements,
)

import disttensor as dt

C128 = np.dtype(np.complex128)
MESH_IDS = [str(s) for s in MESH_SHAPES]


def simulate_on(mesh_shape, fn, *args):
    mesh = mesh_of(mesh_shape)
    return dt.simulate(mesh.size, fn, mesh, *args)


def matrix(shape, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.normal(size=shape)
    if np.dtype(dtype).kind == "c":
        g = g + 1j * rng.normal(size=shape)
    return g.astype(dtype)


def row_form(mesh, pls) -> list:
    """The placements of Q and U: Shard(0) where ``a``'s mesh dims split or reduce, except
    outside a later mesh dim that splits the rows (Replicate there), Replicate elsewhere."""
    out, inner = list(pls), False
    for m in reversed(range(mesh.ndim)):
        if out[m] != S0 and not out[m].is_replicate():
            out[m] = R if inner else S0
        inner |= out[m] == S0 and mesh.shape[m] > 1
    return out


def phases(got_vh: np.ndarray, want_vh: np.ndarray) -> np.ndarray:
    """Per singular pair, the unit factor c with got_vh[i] * c ~ want_vh[i] (read at the largest
    item of want's row)."""
    j = np.argmax(np.abs(want_vh), axis=1)
    rows = np.arange(len(j))
    c = want_vh[rows, j] / got_vh[rows, j]
    return c / np.abs(c)


# -- values: the grid --------------------------------------------------------------------------
class Outside(Exception):
    """A rank outside the mesh: it made the call (holding empty shards), compares nothing."""


class Checks:
    """Collects failures instead of stopping at the first (every rank runs the same checks)."""

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []

    def run(self, what: str, fn) -> None:
        self.count += 1
        try:
            fn()
        except Outside:
            pass
        except Exception as e:
            self.failures.append(f"{what}: {type(e).__name__}: {str(e)[:400]}")

    def result(self) -> tuple[int, list[str]]:
        return self.count, self.failures


def check_all(checks: Checks, mesh, g: np.ndarray, pls, what: str, seed: int) -> None:
    """qr (reduced, r, complete when square), svd, svdvals and lstsq of g placed as ``pls``."""
    single = g.dtype == F32
    m, n = g.shape
    rows = row_form(mesh, pls)
    rep = [R] * mesh.ndim

    def call(fn):
        x = make_input(g, mesh, pls, seed=seed)
        with dt.CommCounter() as cc:
            out = fn(x)
        assert cc.fallbacks == {}, cc.fallbacks
        if dt.get_rank() not in mesh:  # under mpiexec: empty shards, nothing to compare
            assert cc.total == 0, cc.counts
            raise Outside
        return out

    def qr():
        q, r = call(np.linalg.qr)
        assert (q.placements, r.placements) == (rows, rep), (q.placements, r.placements)
        want = np.linalg.qr(g)
        assert_close(q.numpy(), want.Q, "Q", single=single)
        assert_close(r.numpy(), want.R, "R", single=single)

    def qr_r():
        assert_close(call(lambda x: np.linalg.qr(x, mode="r")).numpy(), np.linalg.qr(g, "r"), "R")

    def qr_complete():
        q, r = call(lambda x: np.linalg.qr(x, mode="complete"))
        want = np.linalg.qr(g, mode="complete")
        assert_close(q.numpy(), want.Q, "Q", single=single)
        assert_close(r.numpy(), want.R, "R", single=single)

    def svd():
        u, s, vh = call(lambda x: np.linalg.svd(x, full_matrices=False))
        assert (u.placements, s.placements, vh.placements) == (rows, rep, rep)
        want = np.linalg.svd(g, full_matrices=False)
        assert_close(s.numpy(), want.S, "S", single=single)
        got_u, got_vh = u.numpy(), vh.numpy()
        c = phases(got_vh, want.Vh)
        assert_close(got_vh * c[:, None], want.Vh, "Vh up to signs", single=single)
        assert_close(got_u * c.conj(), want.U, "U up to signs", single=single)

    def svdvals():
        s = call(np.linalg.svdvals)
        assert_close(s.numpy(), np.linalg.svd(g, compute_uv=False), "svdvals", single=single)

    def lstsq(b: np.ndarray, b_pls):
        def run():
            def solve(x):
                rhs = make_input(b, mesh, b_pls, seed=seed + 1) if b_pls is not None else b
                return np.linalg.lstsq(x, rhs)

            x, res, rank, s = call(solve)
            wx, wres, wrank, ws = np.linalg.lstsq(g, b)
            assert x.placements == rep and res.placements == rep, (x.placements, res.placements)
            assert_close(x.numpy(), wx, "x", single=single)
            assert_close(res.numpy(), wres, "residuals", single=single)
            assert_close(s.numpy(), ws, "s", single=single)
            assert type(rank) is type(wrank) and rank == wrank, (rank, wrank)

        return run

    checks.run(f"qr {what}", qr)
    checks.run(f"qr mode=r {what}", qr_r)
    if m == n:
        checks.run(f"qr mode=complete {what}", qr_complete)
    checks.run(f"svd {what}", svd)
    checks.run(f"svdvals {what}", svdvals)
    b1 = matrix((m,), g.dtype, seed + 2)
    b2 = matrix((m, 2), F64, seed + 3)  # float64 b: numpy's result type of the pair
    checks.run(f"lstsq 1-D numpy b {what}", lstsq(b1, None))
    checks.run(f"lstsq 2-D b like a {what}", lstsq(b2, [p if p.is_shard() else R for p in pls]))


def shapes(mesh) -> dict[str, tuple[int, int]]:
    """Tall, short shards (every rank of a 1-D mesh holds fewer rows than n), empty shards
    (fewer rows than ranks) and square."""
    s = mesh.size
    return {
        "tall": (4 * s + 3, 3),
        "short": (s + 3, 4),
        "empty": (max(s - 1, 1), max(s - 1, 1)),
        "square": (s + 1, s + 1),
    }


def _grid(mesh):
    checks = Checks()
    seed = 0
    for dtype in (F64, F32, C128):
        pls_list = placements(mesh, 2, dtype)
        if dtype.kind == "c":  # Partial(max) of complex numbers has no order to keep
            pls_list = [p for p in pls_list if not any(q.is_partial() for q in p) or PSUM in p]
        for i, pls in enumerate(pls_list):
            kinds = list(shapes(mesh).items())
            if dtype != F64:  # the other dtypes on half the shapes each
                kinds = kinds[i % 2 :: 2]
            for kind, shape in kinds:
                seed += 1
                g = matrix(shape, dtype, seed)
                check_all(checks, mesh, g, pls, f"{kind} {shape} {dtype} {pls}", seed)
    return checks.result()


@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")  # complex Partial splits
@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_decompositions_against_numpy(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _grid), minimum=100)


# -- communication -----------------------------------------------------------------------------
def _counted(mesh, shape, pls, fn, dtype=F64):
    g = matrix(shape, dtype, 7)
    x = make_input(g, mesh, pls)
    with dt.CommCounter() as cc:
        fn(x)
    return cc.counts, cc.bytes, cc.fallbacks


def qr_bytes(m: int, n: int, size: int, rank: int, itemsize: int = 8) -> int:
    """What a rank of a 1-D row split sends: its R (min(k, n) rows) and its rows of Q among the
    first n of the matrix (for the signs)."""
    sizes = [len(r) for r in np.array_split(np.arange(m), size)]
    start, k = sum(sizes[:rank]), sizes[rank]
    r, top = min(k, n), min(max(n - start, 0), k)
    return (r * n + top * r) * itemsize


def test_qr_is_one_all_gather_of_the_small_factors():
    """Shard(0): one all-gather of R_i and (on the ranks holding the first n rows) their rows of
    Q: at most 2 n^2 items per rank, the same for 10x the rows; never O(m n)."""
    n = 5
    for m in (40, 400):
        got = dt.simulate(4, _counted, mesh_of((4,)), (m, n), [S0], np.linalg.qr)
        for rank, (counts, nbytes, fallbacks) in enumerate(got):
            assert counts == {"all_gather": 1} and fallbacks == {}, (counts, fallbacks)
            assert nbytes["all_gather"] == qr_bytes(m, n, 4, rank) <= 2 * n * n * 8
    # short shards: each rank sends its whole k x n R (k < n) and, for the top rows, k x k of Q
    got = dt.simulate(3, _counted, mesh_of((3,)), (7, 4), [S0], np.linalg.qr)
    assert [b["all_gather"] for _, b, _ in got] == [qr_bytes(7, 4, 3, r) for r in range(3)]


def test_svd_lstsq_and_layouts_communicate_as_designed():
    def body(mesh):
        m, n = 60, 4
        sv = _counted(mesh, (m, n), [S0, S0], lambda x: np.linalg.svd(x, compute_uv=False))
        b = matrix((m, 3), F64, 8)

        def solve(x):
            return np.linalg.lstsq(x, make_input(b, mesh, [S0, S0]))

        ls = _counted(mesh, (m, n), [S0, S0], solve)
        nested = _counted(mesh, (m, n), [S0, R], np.linalg.qr)  # one all-gather per row group
        rep = _counted(mesh, (m, n), [R, R], lambda x: np.linalg.svd(x, full_matrices=False))
        cols = _counted(mesh_of((4,)), (m, n), [S1], np.linalg.qr)
        outer = _counted(mesh, (m, n), [S1, S0], np.linalg.qr)
        part = _counted(mesh, (m, n), [PSUM, S0], np.linalg.qr)
        inner = _counted(mesh, (m, n), [S0, PSUM], np.linalg.qr)
        return sv, ls, nested, rep, cols, outer, part, inner

    got = dt.simulate(4, body, mesh_of((2, 2)))
    for rank, (sv, ls, nested, rep, cols, outer, part, inner) in enumerate(got):
        rows = 15  # 60 rows over 4 ranks (nested), each R 4 x 4
        assert sv == ({"all_gather": 1}, {"all_gather": 16 * 8}, {}), sv  # R only: no signs
        # lstsq: the 7 x 7 R of [a | b] (4 + 3 columns); Q never formed
        assert ls[0] == {"all_gather": 1} and ls[1] == {"all_gather": 7 * 7 * 8}, ls
        assert nested[0] == {"all_gather": 1}, nested
        assert nested[1]["all_gather"] == qr_bytes(60, 4, 2, rank // 2), nested
        assert rep[0] == {} and rep[2] == {}, rep  # the whole matrix on every rank: numpy's
        # a column split becomes a row split (one all-to-all), a Partial one (a reduce-scatter);
        # outside a later row split they become Replicate (one all-gather or all-reduce)
        assert cols[0] == {"all_to_all": 1, "all_gather": 1} and cols[2] == {}, cols
        assert inner[0] == {"reduce_scatter": 1, "all_gather": 1} and inner[2] == {}, inner
        assert outer[0] == {"all_gather": 2} and outer[2] == {}, outer
        assert part[0] == {"all_reduce": 1, "all_gather": 1} and part[2] == {}, part
        assert rows * 4 * 8 > max(sv[1]["all_gather"], ls[1]["all_gather"])


# -- LAPACK's sign special cases, rank deficiency ----------------------------------------------
def structured(m: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    g = rng.normal(size=(m, n))
    zero_top, zero_rows, first = g.copy(), g.copy(), g.copy()
    zero_top[:n] = 0  # zero pivots: LAPACK's diagonal is negative
    zero_rows[::2] = 0
    first[1:, 0] = 0  # a column already zero below its diagonal: not reflected
    perm = np.eye(m, n)[rng.permutation(m)]
    return {
        "identity": np.eye(m, n) * 3,
        "diagonal": np.eye(m, n) * np.array([2.0, -1.0, 0.5, -4.0])[:n],
        "upper triangular": np.triu(g),
        "zero top rows": zero_top,
        "zero even rows": zero_rows,
        "first column e0": first,
        "permutation": perm,
        "complex first column": first * (1 + 2j),
        "integers": np.round(g * 2).astype(np.int64),  # zeros (+0.0 once converted) as pivots
    }


def _structured(mesh):
    checks = Checks()
    for name, g in structured(13, 4).items():
        for pls in ([S0], [R]):

            def same_as_numpy(g=g, pls=pls):
                q, r = np.linalg.qr(make_input(g, mesh, pls))
                want = np.linalg.qr(g)
                assert_close(q.numpy(), want.Q, "Q")
                assert_close(r.numpy(), want.R, "R")

            checks.run(f"{name} {pls}", same_as_numpy)
    return checks.result()


@pytest.mark.parametrize("mesh_shape", [(3,), (4,)], ids=str)
def test_structured_matrices_get_numpys_signs(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _structured), minimum=16)


def _deficient(mesh):
    rng = np.random.default_rng(4)
    g = rng.normal(size=(11, 4))
    g[:, 2] = g[:, 0] - 2 * g[:, 1]  # rank 3
    b = rng.normal(size=11)
    x = make_input(g, mesh, [S0])
    q, r = np.linalg.qr(x)
    q, r = q.numpy(), r.numpy()
    sol, res, rank, s = np.linalg.lstsq(x, b)
    loose = np.linalg.lstsq(x, b, rcond=1e-20)  # numpy's "rank 4" of rounding-level noise
    neg = np.linalg.lstsq(x, b, rcond=-1)
    return q, r, (sol.numpy(), res.numpy(), rank, s.numpy()), loose[2], neg[2]


def test_rank_deficient_matrices():
    """QR of a rank-deficient matrix: Q R = a and Q^H Q = I (R's rows past the rank depend on
    rounding, numpy's too); lstsq: numpy's minimum-norm solution, rank and rcond rule."""
    rng = np.random.default_rng(4)
    g = rng.normal(size=(11, 4))
    g[:, 2] = g[:, 0] - 2 * g[:, 1]
    b = rng.normal(size=11)
    want = np.linalg.lstsq(g, b)
    for q, r, (sol, res, rank, s), loose, neg in simulate_on((3,), _deficient):
        np.testing.assert_allclose(q @ r, g, atol=1e-12)
        np.testing.assert_allclose(q.T @ q, np.eye(4), atol=1e-12)
        assert_close(sol, want[0], "x")
        assert res.shape == (0,) and rank == want[2] == 3
        assert_close(s, want[3], "s")
        assert loose == np.linalg.lstsq(g, b, rcond=1e-20)[2]
        assert neg == np.linalg.lstsq(g, b, rcond=-1)[2]


def _signed_zero(mesh):
    g = np.array([[-0.0, 1.0], [3.0, 1.0], [4.0, 2.0], [0.0, 5.0]])
    q, r = np.linalg.qr(make_input(g, mesh, [S0]))
    return q.numpy(), r.numpy()


def test_a_negative_zero_pivot_may_flip_a_row():
    """LAPACK reads the sign bit of an exactly zero pivot; TSQR sees it only to rounding, so
    that row of R may have the other sign (Note [Householder signs]): Q R = a still."""
    g = np.array([[-0.0, 1.0], [3.0, 1.0], [4.0, 2.0], [0.0, 5.0]])
    want = np.linalg.qr(g)
    for q, r in simulate_on((2,), _signed_zero):
        d = np.sign(np.diagonal(r)) * np.sign(np.diagonal(want.R))
        assert_close(d[:, None] * r, want.R, "R up to row signs")
        assert_close(q * d, want.Q, "Q up to column signs")
        np.testing.assert_allclose(q @ r, g, atol=1e-12)


def _whole(mesh, g, b):
    x = make_input(g, mesh, [R] * mesh.ndim)
    with dt.CommCounter() as cc:
        out = (*np.linalg.qr(x), *np.linalg.svd(x, full_matrices=False), *np.linalg.lstsq(x, b))
    return [o.numpy() if isinstance(o, dt.DistTensor) else o for o in out], cc.counts


def test_a_whole_matrix_is_numpys_own_bit_for_bit():
    """Replicate (or a one-rank mesh): numpy's own functions on every rank, no communication."""
    g, b = matrix((9, 4), C128, 13), matrix((9, 2), C128, 14)
    want = [*np.linalg.qr(g), *np.linalg.svd(g, full_matrices=False), *np.linalg.lstsq(g, b)]
    for mesh_shape in ((1,), (3,)):
        for got, counts in simulate_on(mesh_shape, _whole, g, b):
            assert counts == {}, counts
            for i, (a, w) in enumerate(zip(got, want)):
                assert_close(a, w, f"output {i}", exact=True)
    assert_close(dt.qr(g).R, np.linalg.qr(g).R, "numpy a", exact=True)


def _zeros(mesh, shape):
    g, b = np.zeros(shape), np.ones((shape[0], 2))
    x = make_input(g, mesh, [S0])
    with dt.CommCounter() as cc:
        out = (*np.linalg.qr(x), *np.linalg.svd(x, full_matrices=False), *np.linalg.lstsq(x, b))
    return [o.numpy() if isinstance(o, dt.DistTensor) else o for o in out], cc.fallbacks


@pytest.mark.parametrize("shape", [(5, 0), (0, 0), (7, 3)], ids=str)
def test_zero_size_and_zero_matrices(shape):
    g, b = np.zeros(shape), np.ones((shape[0], 2))
    want = [*np.linalg.qr(g), *np.linalg.svd(g, full_matrices=False), *np.linalg.lstsq(g, b)]
    for got, fallbacks in simulate_on((3,), _zeros, shape):
        assert fallbacks == {}, fallbacks
        for i, (a, w) in enumerate(zip(got, want)):
            assert_close(a, w, f"output {i}")


# -- what keeps the fallback ---------------------------------------------------------------------
FALLBACK = {
    "wide": ((3, 7), lambda x: np.linalg.qr(x), "np.linalg.qr"),
    "complete m > n": ((9, 3), lambda x: np.linalg.qr(x, mode="complete"), "np.linalg.qr"),
    "raw": ((9, 3), lambda x: np.linalg.qr(x, mode="raw"), "np.linalg.qr"),
    "full_matrices": ((9, 3), lambda x: np.linalg.svd(x), "np.linalg.svd"),
    "hermitian": ((4, 4), lambda x: np.linalg.svd(x @ x.T, hermitian=True), "np.linalg.svd"),
    "batched": ((2, 9, 3), lambda x: np.linalg.qr(x), "np.linalg.qr"),
    "wide lstsq": ((3, 7), lambda x: np.linalg.lstsq(x, np.ones(3)), "np.linalg.lstsq"),
}


def _fallbacks(mesh):
    out = {}
    for name, (shape, fn, op) in FALLBACK.items():
        g = matrix(shape, F64, 9)
        with dt.CommCounter() as cc:
            got = fn(make_input(g, mesh, [S0]))
        want = fn(g)
        ok = all(
            np.allclose(a.numpy(), b) for a, b in zip(got, want) if isinstance(a, dt.DistTensor)
        )
        out[name] = (sorted({o for o, _ in cc.fallbacks}) == [op], ok)
    return out


def test_other_layouts_take_the_counted_fallback():
    got = every_rank(simulate_on((2,), _fallbacks))
    assert got == {name: (True, True) for name in FALLBACK}, got


# -- numpy's errors ----------------------------------------------------------------------------
def _numpy_error(fn, *args) -> str:
    try:
        fn(*args)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _errors(mesh):
    rng = np.random.default_rng(5)
    g, v = rng.normal(size=(9, 3)), rng.normal(size=9)
    nan = g.copy()
    nan[4, 1] = np.nan
    cases = {
        "qr 1-D": (np.linalg.qr, (v,), [S0]),
        "svd 1-D": (np.linalg.svd, (v,), [S0]),
        "qr mode": (lambda x: np.linalg.qr(x, mode="thin"), (g,), [S0]),
        "lstsq 1-D a": (np.linalg.lstsq, (v, v), [S0, S0]),
        "lstsq 3-D b": (np.linalg.lstsq, (g, np.ones((9, 2, 2))), [S0, None]),
        "lstsq rows": (np.linalg.lstsq, (g, np.ones(8)), [S0, None]),
        "svd NaN": (lambda x: np.linalg.svd(x, compute_uv=False), (nan,), [S0]),
        "lstsq NaN": (np.linalg.lstsq, (nan, v), [S0, S0]),
        "float16": (np.linalg.qr, (g.astype(np.float16),), [S0]),
    }
    out = {}
    for name, (fn, args, pls) in cases.items():
        placed = [a if p is None else make_input(a, mesh, [p]) for a, p in zip(args, pls)]
        with dt.CommCounter() as cc:
            got = _numpy_error(fn, *placed)
        out[name] = (got, cc.total)
    return out


def test_numpys_errors_on_every_rank():
    """numpy's exception and text, on every rank; shape errors before any collective (errors
    of the values, NaN, after the one all-gather; float16 is numpy's own, through the
    fallback)."""
    got = every_rank(simulate_on((3,), _errors))
    rng = np.random.default_rng(5)
    g, v = rng.normal(size=(9, 3)), rng.normal(size=9)
    nan = g.copy()
    nan[4, 1] = np.nan
    want = {
        "qr 1-D": _numpy_error(np.linalg.qr, v),
        "svd 1-D": _numpy_error(np.linalg.svd, v),
        "qr mode": _numpy_error(np.linalg.qr, g, "thin"),
        "lstsq 1-D a": _numpy_error(np.linalg.lstsq, v, v),
        "lstsq 3-D b": _numpy_error(np.linalg.lstsq, g, np.ones((9, 2, 2))),
        "lstsq rows": _numpy_error(np.linalg.lstsq, g, np.ones(8)),
        "svd NaN": _numpy_error(np.linalg.svd, nan),
        "lstsq NaN": _numpy_error(np.linalg.lstsq, nan, v),
        "float16": _numpy_error(np.linalg.qr, g.astype(np.float16)),
    }
    for name, (text, collectives) in got.items():
        assert text == want[name] and text != "no error", (name, text, want[name])
        if "NaN" not in name and name != "float16":
            assert collectives == 0, (name, collectives)


def _backward(mesh):
    x = make_input(matrix((9, 3), F64, 6), mesh, [S0]).requires_grad_()
    r = np.linalg.qr(x).R
    try:
        r.sum().backward()
    except NotImplementedError as e:
        return str(e)
    return None


def test_decompositions_have_no_gradient():
    for msg in simulate_on((2,), _backward):
        assert msg is not None and msg.startswith("qr has no gradient"), msg


# -- under mpiexec -----------------------------------------------------------------------------
def case_decompositions(world: int) -> int:
    """A small grid on every mesh that fits the world, each rank asserting its own checks."""
    checks = Checks()
    for mesh in fitting_meshes(world):
        for dtype, pls in ((F64, [S0] * mesh.ndim), (C128, [R] * (mesh.ndim - 1) + [S0])):
            for kind in ("tall", "short"):
                shape = shapes(mesh)[kind]
                check_all(checks, mesh, matrix(shape, dtype, 11), pls, f"{kind} {pls}", 11)
        check_all(checks, mesh, matrix((9, 3), F64, 12), [PMAX] + [S1] * (mesh.ndim - 1), "", 12)
    return assert_grid([checks.result()], minimum=10, ranks=[dt.get_rank()])


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_under_mpiexec(n):
    from mpirun import run

    code, out = run(n, ["tests/test_decompositions.py"], timeout=120)
    assert code == 0, out
    assert f"decompositions on {n} ranks: OK" in out, out


if __name__ == "__main__":
    count = case_decompositions(dt.get_world_size())
    dt.barrier()
    if dt.get_rank() == 0:
        print(f"decompositions on {dt.get_world_size()} ranks: OK ({count} checks)", flush=True)
    sys.exit(0)
