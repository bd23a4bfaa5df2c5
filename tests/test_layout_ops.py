"""Layout ops (disttensor/ops/layout.py) on simulated ranks against numpy.

For meshes (1), (2), (3), (4) and (2, 2) and op_cases' placements (Shard of each axis, nested
shards on the 2-D mesh, Replicate, asymmetric Partials), even, uneven, empty-shard and
zero-size shapes: every rank's gathered result must equal numpy's (dtype, shape, values;
exactly without Partial inputs), through numpy's own names (``np.flip(x)``) and without the
replicate fallback. Then what each call moves (CommCounter): flip, roll, pad and diff of a
split axis only send boundary rows point to point, triangles and diagonals nothing, the
stacking functions nothing where the joined axis is whole, nonzero two all-gathers (the
counts, then the indices). Gradients: tests/grad_cases.py (layout_cases).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from op_cases import (
    BOOL,
    F64,
    I64,
    MESH_SHAPES,
    PMAX,
    PSUM,
    S0,
    S1,
    Grid,
    R,
    assert_grid,
    every_rank,
    make_input,
    mesh_of,
    placements,
    shapes_2d,
)

import disttensor as dt
from disttensor.spmd import TensorSpec, infer_forward
from disttensor.spmd.validate import data

MESH_IDS = [str(s) for s in MESH_SHAPES]


def ruled(fn):
    """``fn`` that must not take the replicate fallback (nor any other communication
    outside a rule)."""

    def run(*args):
        with dt.CommCounter() as cc:
            out = fn(*args)
        assert cc.fallbacks == {}, cc.fallbacks
        return out

    return run


def stacked(fn):
    """A tuple of index tensors as one array (each checked Replicate)."""

    def run(*args):
        outs = fn(*args)
        if isinstance(outs[0], dt.DistTensor):
            assert all(o.placements == [R] * o.mesh.ndim for o in outs), outs[0].placements
            outs = [o.numpy() for o in outs]
        return np.stack(outs)

    return run


def simulate(mesh_shape, fn, *args):
    mesh = mesh_of(mesh_shape)
    return dt.simulate(mesh.size, fn, mesh, *args)


def run_calls(grid: Grid, mesh, calls, g, dtypes_label: str = "", pls=None) -> None:
    for pl in pls or placements(mesh, g.ndim, g.dtype):
        for what, fn in calls:
            grid.check(mesh, ruled(fn), (g,), [pl], fn, f"{what} {g.dtype}{g.shape} {pl}")


# -- one input: every call on every placement --------------------------------------------------
def moves(r: int, c: int) -> list:
    """flip, roll, pad, diff of a (r, c) array."""
    return [
        ("flip", np.flip),
        ("flip 0", lambda a: np.flip(a, 0)),
        ("flip -1", lambda a: np.flip(a, -1)),
        ("fliplr", np.fliplr),
        ("flipud", np.flipud),
        ("roll 1 0", lambda a: np.roll(a, 1, 0)),
        ("roll -3 1", lambda a: np.roll(a, -3, 1)),
        ("roll (1, 2)", lambda a: np.roll(a, (1, 2), (0, 1))),
        ("roll (2, -1) 0", lambda a: np.roll(a, (2, -1), 0)),
        ("roll long", lambda a: np.roll(a, 2 * r + 1, 0)),
        ("roll None", lambda a: np.roll(a, 5)),
        ("pad 1", lambda a: np.pad(a, 1)),
        ("pad ((2, 0), (0, 1))", lambda a: np.pad(a, ((2, 0), (0, 1)))),
        ("pad value", lambda a: np.pad(a, (0, 3), constant_values=7)),
        ("pad values", lambda a: np.pad(a, ((1, 2), (3, 0)), constant_values=((1, 2), (3, 4)))),
        ("diff", lambda a: np.diff(a, axis=0)),
        ("diff 2 1", lambda a: np.diff(a, 2, axis=1)),
        ("diff 3 0", lambda a: np.diff(a, 3, 0)),
        ("diff past", lambda a: np.diff(a, r + 1, 0)),
        ("diff prepend", lambda a: np.diff(a, 1, 0, prepend=0.5)),
        ("diff append", lambda a: np.diff(a, axis=0, append=np.ones((1, c), a.dtype))),
        ("diff 0", lambda a: np.diff(a, 0)),
    ]


def triangles() -> list:
    return [
        ("tril", np.tril),
        ("tril 1", lambda a: np.tril(a, 1)),
        ("triu -1", lambda a: np.triu(a, -1)),
        ("triu 2", lambda a: np.triu(a, k=2)),
        ("diagonal", np.diagonal),
        ("diagonal 1", lambda a: np.diagonal(a, 1)),
        ("diagonal -1", lambda a: a.diagonal(-1)),
        ("diagonal axes 1 0", lambda a: np.diagonal(a, 1, 1, 0)),
        ("diag -2", lambda a: np.diag(a, -2)),
        ("trace", np.trace),
        ("trace 1", lambda a: a.trace(1)),
        ("tensordot 2", lambda a: np.tensordot(a, a, 2)),
        ("tensordot axes", lambda a: np.tensordot(a, a, ([0], [0]))),
        ("tensordot numpy", lambda a: np.tensordot(np.ones((2, a.shape[0])), a, 1)),
    ]


def nonzeros() -> list:
    return [
        ("nonzero", stacked(np.nonzero)),
        ("where", stacked(np.where)),
        ("method", stacked(lambda a: a.nonzero())),
        ("argwhere", np.argwhere),
        ("flatnonzero", np.flatnonzero),
    ]


def stacks() -> list:
    return [
        ("hstack", lambda a: np.hstack([a, a])),
        ("hstack numpy", lambda a: np.hstack((np.zeros((a.shape[0], 1), a.dtype), a))),
        ("vstack", lambda a: np.vstack([a, np.ones(a.shape[1], a.dtype)])),
        ("dstack", lambda a: np.dstack([a, a])),
        ("column_stack", lambda a: np.column_stack([a, a])),
        ("concat", lambda a: np.concat([a, a], axis=1)),
        ("atleast_3d", lambda a: np.atleast_3d(a)),
    ]


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_one_input_grid(mesh_shape):
    def program(mesh):
        grid, rng = Grid(), np.random.default_rng(3)
        shapes = shapes_2d(mesh)
        everything = moves(*shapes["uneven"]) + triangles() + stacks()
        g = data(shapes["uneven"], F64, rng)
        run_calls(grid, mesh, everything, g)
        for label in ("even", "empty", "zero"):
            g = data(shapes[label], F64, rng)
            light = moves(*shapes[label])[::4] + triangles()[::3] + stacks()[::4]
            run_calls(grid, mesh, light, g)
        ints = data(shapes["uneven"], I64, rng, "small")
        run_calls(grid, mesh, moves(*ints.shape)[::3] + triangles()[::4] + nonzeros(), ints)
        bools = data(shapes["empty"], BOOL, rng)
        run_calls(grid, mesh, moves(*bools.shape)[1::4] + triangles()[:4] + nonzeros(), bools)
        for label in ("even", "zero"):
            run_calls(grid, mesh, nonzeros(), data(shapes[label], I64, rng, "small"))
        return grid.result()

    assert_grid(simulate(mesh_shape, program), minimum=100)


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_other_ranks_grid(mesh_shape):
    """Vectors (diag, nonzero, roll, stacking), 3-D tensors (batched triangles and
    diagonals, flips of several axes), take_along_axis with numpy and DistTensor indices."""

    def program(mesh):
        grid, rng = Grid(), np.random.default_rng(4)
        s = mesh.size
        for n in (2 * s + 1, max(s - 1, 1), 0):
            v = data((n,), F64, rng)
            calls = [
                ("diag", np.diag),
                ("diag 2", lambda a: np.diag(a, 2)),
                ("diag -1", lambda a: np.diag(a, -1)),
                ("roll", lambda a: np.roll(a, 3)),
                ("diff", np.diff),
                ("pad", lambda a: np.pad(a, (2, 3), constant_values=-1.5)),
                ("tril", np.tril),
                ("hstack", lambda a: np.hstack([a, a])),
                ("vstack", lambda a: np.vstack([a, a])),
                ("column_stack", lambda a: np.column_stack([a, np.arange(a.shape[0])])),
                ("dstack", lambda a: np.dstack([a])),
                ("atleast_2d", np.atleast_2d),
            ]
            run_calls(grid, mesh, calls, v)
            run_calls(grid, mesh, nonzeros(), data((n,), I64, rng, "small"))
        t = data((3, s + 1, 2 * s + 1), F64, rng)
        calls = [
            ("flip (0, 2)", lambda a: np.flip(a, (0, 2))),
            ("roll", lambda a: np.roll(a, (1, -2), (1, 2))),
            ("pad", lambda a: np.pad(a, ((0, 1), (2, 0), (1, 1)))),
            ("diff", lambda a: np.diff(a, 2, 1)),
            ("tril", lambda a: np.tril(a, -1)),
            ("diagonal", lambda a: np.diagonal(a, 1, 2, 1)),
            ("diagonal batch", lambda a: np.diagonal(a, 0, 0, 2)),
            ("trace", lambda a: np.trace(a, 0, 1, 2)),
            ("tensordot", lambda a: np.tensordot(a, np.ones((a.shape[2], 2)), 1)),
            ("dstack", lambda a: np.dstack([a, a])),
            ("argwhere", lambda a: np.argwhere(a > 0.5)),
        ]
        run_calls(grid, mesh, calls, t, pls=placements(mesh, 3, F64)[:9])
        for shape in [(2 * s + 1, s + 2), (max(s - 1, 1), 3)]:
            g = data(shape, F64, rng)
            r, c = shape
            along0 = rng.integers(-r, r, (r + 1, c))
            along1 = rng.integers(-c, c, (r, 3))
            calls = [
                ("take 0", lambda a, i=along0: np.take_along_axis(a, i, 0)),
                ("take 1", lambda a, i=along1: np.take_along_axis(a, i, axis=1)),
                ("take broadcast", lambda a, i=along1[:1]: np.take_along_axis(a, i, 1)),
                ("take None", lambda a, i=along0[0]: np.take_along_axis(a, i, None)),
            ]
            run_calls(grid, mesh, calls, g)
            ints = itertools.cycle(placements(mesh, 2, I64)[::-1])
            for pa, pi in zip(placements(mesh, 2, F64), ints):
                for idx, axis in ((along0, 0), (along1, -1)):
                    grid.check(
                        mesh,
                        ruled(lambda a, i, axis=axis: np.take_along_axis(a, i, axis)),
                        (g, idx),
                        [pa, pi],
                        lambda a, i, axis=axis: np.take_along_axis(a, i, axis),
                        f"take_along_axis dt indices axis={axis} {pa} {pi} {shape}",
                    )
        return grid.result()

    assert_grid(simulate(mesh_shape, program), minimum=50)


# -- what each call moves --------------------------------------------------------------------
def _moved_bytes(mesh, shape, fn, pl):
    g = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    x = make_input(g, mesh, pl)
    with dt.CommCounter() as cc:
        y = fn(x)
    return cc.counts, cc.bytes, y.placements, y.numpy(), fn(g)


@pytest.mark.parametrize("k", [2, 4])
def test_split_axis_moves_only_boundary_rows(k):
    """A (n, m) Shard(0) array on a (k,) mesh: no collective, point-to-point sends of just
    the rows that cross a boundary (flip: each shard to its mirror rank)."""
    n, m = 8 * k + 3, 5
    rows = {  # the most rows one rank may send
        "flip": -(-n // k),
        "roll 3": 3,
        "roll -2 (and the other axis)": 2,
        "pad (2, 1)": 2,
        "diff": 1,
        "diff 3": 3,
        "diff prepend": 1,
        "crop (the gradient of a pad)": 1,
    }
    calls = {
        "flip": lambda a: np.flip(a, 0),
        "roll 3": lambda a: np.roll(a, 3, 0),
        "roll -2 (and the other axis)": lambda a: np.roll(a, (-2, 1), (0, 1)),
        "pad (2, 1)": lambda a: np.pad(a, ((2, 1), (1, 1))),
        "diff": lambda a: np.diff(a, axis=0),
        "diff 3": lambda a: np.diff(a, 3, axis=0),
        "diff prepend": lambda a: np.diff(a, axis=0, prepend=0.0),
        "crop (the gradient of a pad)": lambda a: (
            a[1:-1] if isinstance(a, np.ndarray) else dt.ops.layout.shift_axis(a, 0, -1, -1)
        ),
    }

    def program(mesh):
        out = {}
        for what, fn in calls.items():
            counts, nbytes, pls, got, want = _moved_bytes(mesh, (n, m), fn, [S0])
            assert np.array_equal(got, want), what
            assert pls == [S0], (what, pls)
            assert set(counts) <= {"send"}, (what, counts)
            out[what] = (counts.get("send", 0), nbytes.get("send", 0))
        return out

    results = dt.simulate(k, program, mesh_of((k,)))
    row = (m + 2) * 8  # pad widens the rows to m + 2
    for what in calls:
        sends = [r[what] for r in results]
        assert max(c for c, _ in sends) <= 2, (what, sends)  # at most both neighbours
        # the new length's splits move each boundary by at most one row
        assert max(b for _, b in sends) <= 2 * (rows[what] + 1) * row, (what, sends)
    assert sum(r["diff"][1] for r in results) <= 2 * k * m * 8


@pytest.mark.parametrize("mesh_shape", [(2,), (4,), (2, 2)], ids=str)
def test_local_ops_do_not_communicate(mesh_shape):
    """Triangles and diagonals of every layout, flips/rolls/pads/diffs of axes no mesh dim
    splits, stacking along a whole axis: no communication at all."""

    def program(mesh):
        g = data((7, 7), F64, np.random.default_rng(1))
        count = 0
        free = [np.tril, lambda a: np.triu(a, 1), np.diagonal, lambda a: np.diagonal(a, 2)]
        free += [lambda a: np.diag(np.diagonal(a))]
        for pl in placements(mesh, 2, F64):
            linear = all(p.reduce_type in ("sum", "avg") for p in pl if p.is_partial())
            for fn in free + [np.trace] * linear:  # a sum: Partial(max/min) is reduced first
                counts, _, _, got, want = _moved_bytes(mesh, g.shape, fn, pl)
                assert counts == {}, (pl, counts)
                count += 1
        whole_axis_1 = [
            lambda a: np.flip(a, 1),
            lambda a: np.roll(a, 2, 1),
            lambda a: np.pad(a, ((0, 0), (1, 2))),
            lambda a: np.diff(a, 2, 1),
            lambda a: np.hstack([a, a]),
            lambda a: np.column_stack([a, a]),
            lambda a: np.dstack([a, a]),
            lambda a: np.take_along_axis(a, np.zeros((7, 2), np.int64), 1),
        ]
        pl = [S0] * mesh.ndim
        for fn in whole_axis_1:
            counts, _, pls, got, want = _moved_bytes(mesh, g.shape, fn, pl)
            assert counts == {} and np.array_equal(got, want), (counts, pls)
            assert pls == pl or (pls == [S0, S0] and mesh.ndim == 2), pls
            count += 1
        return count

    assert every_rank(simulate(mesh_shape, program)) > 20


def test_diagonal_layouts():
    """Note [Diagonals of split matrices]: rows that are positions stay split; otherwise the
    diagonal is picked into zeros (Partial(sum)), never gathered."""
    cases = [
        ((6, 6), [S0], {}, [S0]),
        ((6, 6), [S1], {}, [S0]),
        ((6, 6), [S0], {"offset": 1}, [PSUM]),
        ((6, 8), [S0], {"offset": 2}, [S0]),  # 6 items, item j in row j
        ((8, 6), [S1], {"offset": -2}, [S0]),
        ((6, 6), [PMAX], {}, [PMAX]),
    ]
    for shape, pl, attrs, want in cases:
        assert infer_forward("diagonal", [TensorSpec(shape, pl)], (2,), **attrs)[1] == [want]
    got = infer_forward("diagonal", [TensorSpec((6, 6), [S0, S1])], (2, 2))
    assert got == ([[S0, S1]], [[S0, PSUM]])  # one axis keeps its split
    got = infer_forward("diag_embed", [TensorSpec((5,), [S0])], (2,), offset=1, shape=(6, 6))
    assert got == ([[R]], [[S0]])  # the vector gathered, the rows split
    got = infer_forward("diag_embed", [TensorSpec((6,), [S0])], (2,), offset=0, shape=(6, 6))
    assert got == ([[S0]], [[S0]])


def test_hstack_of_row_splits_moves_nothing():
    def program(mesh):
        g = data((7, 3), F64, np.random.default_rng(2))
        a, b = make_input(g, mesh, [S0]), make_input(2 * g, mesh, [S0])
        with dt.CommCounter() as cc:
            y = np.hstack([a, b])
        assert cc.counts == {} and y.placements == [S0]
        assert np.array_equal(y.numpy(), np.hstack([g, 2 * g]))
        return True

    assert all(simulate((4,), program))


@pytest.mark.parametrize("mesh_shape", [(2,), (4,), (2, 2)], ids=str)
def test_joins_along_a_split_axis_stay_split(mesh_shape):
    """Note [Joins along a split axis]: vstack/concatenate of row-split inputs keeps the rows
    split and moves at most about one shard per rank, point to point (the concatenate rule
    would all-gather both inputs)."""

    def program(mesh):
        rng = np.random.default_rng(9)
        g, h = data((13, 4), F64, rng), data((6, 4), F64, rng)
        pl = [S0] * mesh.ndim
        a, b = make_input(g, mesh, pl), make_input(h, mesh, pl)
        out = []
        for fn in (
            lambda p, q: np.vstack([p, q]),
            lambda p, q: np.concatenate([q, p, q]),
            lambda p, q: np.concat([p, np.ones((2, 4))], axis=0),
        ):
            with dt.CommCounter() as cc:
                y = fn(a, b)
            assert set(cc.counts) <= {"send"} and y.placements == pl, (cc.counts, y.placements)
            assert np.array_equal(y.numpy(), fn(g, h))
            out.append((cc.bytes.get("send", 0), y.to_local().nbytes))
        return out

    for sends in simulate(mesh_shape, program):
        for sent, held in sends:
            assert sent <= 2 * held + 2 * 4 * 8, sends  # about the rows it hands over


@pytest.mark.parametrize("mesh_shape", [(2,), (4,), (2, 2)], ids=str)
def test_nonzero_moves_counts_and_indices(mesh_shape):
    """Note [Nonzero of split data]: one all-gather of the per-rank counts (8 bytes each)
    and one of the indices (ndim * 8 bytes per index a rank found), or of the data where
    that is less; a Partial input is reduce-scattered first, never all-reduced."""

    def program(mesh):
        g = data((9, 6), I64, np.random.default_rng(5), "small")
        out = []
        for pl in (
            [S0] * mesh.ndim,
            [S1, R][: mesh.ndim],
            [R] * mesh.ndim,
            [PSUM, S0][-mesh.ndim :],
        ):
            x = make_input(g, mesh, pl)
            with dt.CommCounter() as cc:
                idx = np.nonzero(x)
            got = np.stack([i.numpy() for i in idx])
            assert np.array_equal(got, np.stack(np.nonzero(g))), pl
            gathers = {k: v for k, v in cc.counts.items() if k != "reduce_scatter"}
            assert gathers == {"all_gather": 2}, (pl, cc.counts)
            assert cc.counts.get("reduce_scatter", 0) <= mesh.ndim and "all_reduce" not in cc.counts
            out.append(cc.bytes["all_gather"])
        return out

    results = simulate(mesh_shape, program)
    count = np.count_nonzero(data((9, 6), I64, np.random.default_rng(5), "small"))
    size = math.prod(mesh_shape)
    smaller = min(2 * 8 * count, 9 * 6 * 8)  # the indices, or the data where less
    for i in range(4):
        assert sum(r[i] for r in results) == 8 * size + smaller


def test_dense_nonzero_gathers_the_data_instead():
    def program(mesh):
        g = np.arange(1.0, 41.0).reshape(8, 5)  # no zeros: the indices are twice the data
        with dt.CommCounter() as cc:
            idx = np.nonzero(make_input(g, mesh, [S0]))
        assert np.array_equal(np.stack([i.numpy() for i in idx]), np.stack(np.nonzero(g)))
        return cc.counts, cc.bytes

    for counts, nbytes in simulate((4,), program):
        assert counts == {"all_gather": 2} and nbytes["all_gather"] == 8 + 2 * 5 * 8


def test_take_along_a_split_axis_gathers_only_that_axis():
    def program(mesh):
        g = data((6, 8), F64, np.random.default_rng(6))
        idx = np.random.default_rng(7).integers(0, 8, (6, 3))
        x = make_input(g, mesh, [S0, S1])
        with dt.CommCounter() as cc:
            y = np.take_along_axis(x, idx, 1)
        assert np.array_equal(y.numpy(), np.take_along_axis(g, idx, 1))
        return cc.counts, cc.bytes, y.placements

    for counts, nbytes, pls in simulate((2, 2), program):
        # one collective over "m1" (it splits the axis), of at most this rank's (3, 4) block:
        # the columns gathered, or (cheaper, as here) the rows split over "m1" too
        assert counts in ({"all_gather": 1}, {"all_to_all": 1}), counts
        assert sum(nbytes.values()) <= 3 * 4 * 8 and pls in ([S0, R], [S0, S0]), pls


def test_partials_stay_partial():
    """The ops are linear or move items: Partial inputs stay Partial, with no reduction."""

    def program(mesh):
        g = data((5, 5), F64, np.random.default_rng(8))
        out = {}
        calls = {
            "flip": lambda a: np.flip(a, 0),
            "roll": lambda a: np.roll(a, 2, 0),
            "pad": lambda a: np.pad(a, 1, constant_values=3.0),
            "diff": lambda a: np.diff(a, axis=0),
            "tril": np.tril,
            "diagonal": np.diagonal,
            "diag": lambda a: np.diag(np.diagonal(a)),
            "take": lambda a: np.take_along_axis(a, np.zeros((2, 5), np.int64), 0),
            "hstack": lambda a: np.hstack([a, a]),
        }
        for pl in ([PSUM, S0], [S0, PMAX]):
            for what, fn in calls.items():
                if what == "diff" and PMAX in pl:
                    continue  # not linear: reduced first
                x = make_input(g, mesh, pl)
                with dt.CommCounter() as cc:
                    y = fn(x)
                assert not {"all_reduce", "reduce_scatter", "all_gather"} & set(cc.counts), (
                    what,
                    pl,
                    cc.counts,
                )
                assert any(p.is_partial() for p in y.placements), (what, pl, y.placements)
                np.testing.assert_allclose(y.numpy(), fn(g), rtol=1e-12, atol=1e-12)
                out[what, str(pl)] = y.placements
        return out

    every_rank(simulate((2, 2), program))


def test_ranks_outside_the_mesh():
    """Rank 2 is not in the mesh: it skips the work and holds empty shards of the right
    global shape (nonzero's count is data it does not have: an empty result there)."""

    def program():
        mesh = dt.ProcessMesh([0, 1])
        g = data((5, 4), F64, np.random.default_rng(10))
        x = make_input(g, mesh, [S0])
        calls = [
            lambda a: np.flip(a, 0),
            lambda a: np.roll(a, 2, 0),
            lambda a: np.pad(a, 1),
            lambda a: np.diff(a, 2, 0),
            np.tril,
            lambda a: np.diagonal(a, 1),
            lambda a: np.diag(a[0]),
            np.trace,
            lambda a: np.tensordot(a, a, 2),
            lambda a: np.take_along_axis(a, np.zeros((2, 4), int), 0),
            lambda a: np.vstack([a, a]),
            lambda a: np.column_stack([a, a]),
        ]
        for fn in calls:
            y, want = fn(x), fn(g)
            assert y.shape == want.shape, (y.shape, want.shape)
            if dt.get_rank() in mesh:
                np.testing.assert_allclose(y.numpy(), want, rtol=1e-12)
            else:
                assert y.to_local().size == 0 or y.ndim == 0
        idx = np.nonzero(x)
        if dt.get_rank() in mesh:
            assert np.array_equal(np.stack([i.numpy() for i in idx]), np.stack(np.nonzero(g)))
        return True

    assert dt.simulate(3, program) == [True] * 3


# -- errors and plain numpy --------------------------------------------------------------------
@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda x: np.fliplr(x[0]), ValueError, "Input must be >= 2-d"),
        (lambda x: np.flip(x, 2), np.exceptions.AxisError, "axis 2 is out of bounds"),
        (lambda x: np.roll(x, 1, 3), np.exceptions.AxisError, "axis 3 is out of bounds"),
        (lambda x: np.diff(x, -1), ValueError, "order must be non-negative"),
        (lambda x: np.pad(x, -1), ValueError, "can't contain negative values"),
        (lambda x: np.diagonal(x, 0, 1, 1), ValueError, "axis1 and axis2 cannot be the same"),
        (lambda x: np.diag(x[None]), ValueError, "Input must be 1- or 2-d"),
        (lambda x: np.take_along_axis(x, np.zeros(3, int), 0), ValueError, "same number"),
        (lambda x: np.take_along_axis(x, np.zeros((1, 1)), 0), IndexError, "integer array"),
        (lambda x: np.take_along_axis(x, np.full((1, 1), 9), 0), IndexError, "out of bounds"),
        (lambda x: np.nonzero(x[0, 0]), ValueError, "Calling nonzero on 0d arrays"),
    ],
)
def test_errors_on_every_rank(call, exc, match):
    def program(mesh):
        x = make_input(np.zeros((3, 5)), mesh, [S0])
        with pytest.raises(exc, match=match):
            call(x)
        return True

    assert all(simulate((2,), program))


def test_plain_numpy_inputs_and_other_modes():
    a = np.arange(12.0).reshape(3, 4)
    assert np.array_equal(dt.flip(a), np.flip(a)) and np.array_equal(dt.roll(a, 1), np.roll(a, 1))
    assert np.array_equal(dt.tril(a, 1), np.tril(a, 1)) and np.array_equal(dt.diag(a), np.diag(a))
    assert np.array_equal(dt.nonzero(a)[1], np.nonzero(a)[1])

    def program(mesh):
        x = make_input(a, mesh, [S0])
        with dt.CommCounter() as cc:
            y = np.pad(x, 1, mode="edge")  # other modes: numpy's, through the fallback
        assert [op for op, _ in cc.fallbacks] == ["pad"]
        assert np.array_equal(y.numpy(), np.pad(a, 1, mode="edge"))
        return True

    assert all(simulate((2,), program))


def _diff_gradients(n: int, shape, axis: int, placements):
    mesh = dt.ProcessMesh([0, 1])
    g = np.arange(math.prod(shape), dtype=float).reshape(shape)
    x = dt.shard_tensor(g, mesh, placements).requires_grad_()
    y = np.diff(x, n, axis=axis)
    (y * 2.0).sum().backward()
    return y.shape, x.grad.numpy()


@pytest.mark.parametrize(
    "n, shape, axis, placements",
    [(2, (1, 3), 0, [dt.Shard(1)]), (3, (3, 2), 0, [dt.Shard(0)]), (5, (3, 2), 0, [dt.Shard(0)]),
     (4, (2, 5), 1, [dt.Shard(1)]), (2, (4, 3), 0, [dt.Shard(0)])],
)  # fmt: skip
def test_diff_gradient_when_n_reaches_the_axis_length(n, shape, axis, placements):
    """n >= the axis length: an empty result, a zero gradient of x's shape (numpy's diff is
    empty there); below it the gradient of sum(2 * diff) in closed form."""
    got_shape, grad = every_rank(dt.simulate(2, _diff_gradients, n, shape, axis, placements))
    want = np.diff(np.zeros(shape), n, axis=axis)
    assert got_shape == want.shape
    length = shape[axis]
    coeff = np.zeros(length)
    if n < length:  # d/dx of sum(diff(x, n)) along the axis: its adjoint applied to ones
        ones = np.ones(length - n)
        for _ in range(n):
            ones = -np.diff(np.concatenate([[0.0], ones, [0.0]]))
        coeff = 2.0 * ones
    want_grad = np.broadcast_to(np.expand_dims(coeff, 1 - axis), shape)
    np.testing.assert_array_equal(grad, want_grad)
