"""Shape ops and basic indexing on simulated ranks against numpy.

For meshes (1), (2), (3), (4) and (2, 2), every input placement (Shard of each axis on each mesh
dim, Replicate, Partial), even and uneven shapes, shards that are empty and tensors that are:
the gathered result must equal numpy's (exactly without Partial inputs). Partial inputs hold
asymmetric local values (spmd_cases.make_source), so a wrong rule cannot pass by luck. Where
a layout allows it, the op must not communicate (CommCounter).
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import spmd_cases as cases
from op_cases import every_rank

import disttensor as dt
from disttensor import accounting
from disttensor.spmd import TensorSpec, infer_forward
from disttensor.spmd.shape_rules import canonical_key

S0, S1, S2, R = dt.Shard(0), dt.Shard(1), dt.Shard(2), dt.Replicate()
PSUM, PMAX = dt.Partial("sum"), dt.Partial("max")
MESHES = [(1,), (2,), (3,), (4,), (2, 2)]


def grid(mesh_shape, ndim: int, dtype=np.float64) -> list[list[dt.Placement]]:
    """Every placement list: all Partial types on 1-D meshes, sum and max on 2-D ones."""
    shards = [dt.Shard(d) for d in range(ndim)]
    if len(mesh_shape) == 1:
        partials = cases.PARTIALS if np.dtype(dtype).kind == "f" else [PSUM, PMAX]
        return [[p] for p in [*shards, R, *partials]]
    opts = [*shards, R, PSUM, PMAX]
    return [list(p) for p in itertools.product(opts, repeat=len(mesh_shape))]


def split_axes(mesh_shape, placements) -> set[int]:
    """Tensor axes split by a mesh dim of size > 1."""
    return {p.dim for p, k in zip(placements, mesh_shape) if p.is_shard() and k > 1}


def run(mesh_shape, f):
    """``f(mesh)`` on the simulated ranks of a mesh of that shape; returns rank 0's count."""
    world = math.prod(mesh_shape)

    def program():
        return f(dt.ProcessMesh(np.arange(world).reshape(mesh_shape)))

    n = every_rank(dt.simulate(world, program))
    assert n > 0
    return n


def check_unary(mesh, shape, calls, dtype=np.float64, placements=None) -> int:
    """Each ``(what, op, numpy_op, free)`` of ``calls`` on every placement of a tensor of
    ``shape``; ``free(placements)`` says the op must not communicate."""
    g = cases.global_value(shape, dtype, seed=sum(shape))
    n = 0
    for pl in placements or grid(mesh.shape, len(shape), dtype):
        x = cases.make_source(g, mesh, pl)
        for what, op, np_op, free in calls:
            label = f"{what} {shape} {dtype.__name__} {mesh.shape} {pl}"
            with dt.CommCounter() as cc:
                y = op(x)
            if free is not None and free(pl):
                assert cc.total == 0, (label, cc.counts, y.placements)
            exact = not any(p.is_partial() for p in pl)
            ys, wants = (y if isinstance(y, list) else [y]), np_op(g)
            assert len(ys) == len(wants), label
            for got, want in zip(ys, wants):
                cases.assert_value(got.numpy(), np.asarray(want), exact, label)
            n += 1
    return n


def same(name: str, *args, free=None):
    """A call of ``check_unary``: ``dt.<name>`` and ``np.<name>`` with the same arguments."""
    ours, theirs = getattr(dt, name), getattr(np, name)
    many = name == "split"  # a list of pieces
    return (
        f"{name}{args}",
        lambda x: ours(x, *args),
        lambda g: theirs(g, *args) if many else [theirs(g, *args)],
        free,
    )


def always(pl) -> bool:
    return True


# -- reshape ---------------------------------------------------------------------------------
def reshape_cases(k: int):
    """(input shape, output shape): merges and splits, even, uneven, empty shards, size-1 axes
    and zero-size tensors."""
    return [
        ((2 * k, 3), (6 * k,)),
        ((4 * k, 3), (2 * k, 6)),
        ((2 * k + 1, 3), (3, 2 * k + 1)),
        ((2 * k + 1, 4), (2 * k + 1, 2, 2)),
        ((6 * k + 3,), (2 * k + 1, 3)),
        ((6 * k,), (-1, 3)),
        ((1, 2 * k + 1), (2 * k + 1, 1)),
        ((max(k - 1, 1), 3), (-1,)),
        ((2, k + 1, 3), (2, 3 * (k + 1))),
        ((2, k + 1, 3), (-1, 3)),
        ((0, 3), (3, 0)),
    ]


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_reshape_grid(mesh_shape):
    def f(mesh):
        def unsplit(pl):  # Replicate and Partial only: never any communication
            return not split_axes(mesh.shape, pl)

        n = 0
        for src, dst in reshape_cases(max(mesh.shape)):
            flatten = ("flatten", dt.flatten, lambda g: [g.reshape(-1)], unsplit)
            n += check_unary(mesh, src, [same("reshape", dst, free=unsplit), flatten])
        n += check_unary(mesh, (2, 7), [same("reshape", (7, 2)), same("ravel")], dtype=np.int64)
        return n

    run(mesh_shape, f)


# (mesh, input shape, placements, target shape, required input placements, output placements)
RESHAPE_LAYOUTS = [
    ((4,), (8, 3), [S0], (24,), [S0], [S0]),
    ((4,), (24,), [S0], (8, 3), [S0], [S0]),
    ((4,), (6, 3), [S0], (18,), [R], [R]),  # rows 2, 2, 1, 1 are not 5, 5, 4, 4 items
    ((3,), (12,), [S0], (3, 4), [S0], [S0]),
    ((2,), (12,), [S0], (3, 4), [R], [R]),  # items 0-5 are no whole rows of 4
    ((4,), (8, 3), [S1], (24,), [R], [R]),  # strided items are no range of the output
    ((2,), (5, 8), [S1], (5, 2, 4), [S1], [S1]),
    ((4,), (5, 8), [S1], (5, 2, 4), [R], [R]),  # 2 items each are not 1, 1, 0, 0 rows of 4
    ((3,), (1, 7), [S0], (7, 1), [S0], [S1]),  # size-1 axis: only coordinate 0 holds it
    ((3,), (1, 7), [S0], (7,), [R], [R]),
    ((2, 2), (8, 3), [S0, S0], (24,), [S0, S0], [S0, S0]),
    ((2, 2), (6, 3), [S0, S0], (18,), [S0, R], [S0, R]),  # outer split fits, inner does not
    ((2, 2), (8, 6), [S0, S1], (8, 2, 3), [S0, S1], [S0, S1]),
    ((2, 2), (8, 6), [PSUM, S0], (4, 12), [PSUM, S0], [PSUM, S0]),
    ((2, 2), (8, 6), [PMAX, S1], (48,), [PMAX, R], [PMAX, R]),
    ((1,), (8, 6), [S1], (48,), [R], [R]),  # a mesh dim of size 1: relabelled, free
]


@pytest.mark.parametrize("mesh_shape,shape,src,target,ins,outs", RESHAPE_LAYOUTS)
def test_reshape_layout(mesh_shape, shape, src, target, ins, outs):
    got = infer_forward("reshape", [TensorSpec(shape, src)], mesh_shape, shape=target)
    assert got == ([ins], [outs])

    def f(mesh):
        g = cases.global_value(shape, np.int64)
        x = cases.make_source(g, mesh, src)
        with dt.CommCounter() as cc:
            y = dt.reshape(x, target)
        moved = any(a != b and k > 1 for a, b, k in zip(src, ins, mesh_shape))
        assert (cc.total > 0) == moved, cc.counts
        assert y.placements == outs
        assert np.array_equal(y.numpy(), g.reshape(target))
        return 1

    run(mesh_shape, f)


# -- axis moves: transpose, swapaxes, expand_dims, squeeze ----------------------------------
@pytest.mark.parametrize("mesh_shape", MESHES)
def test_axis_moves_grid(mesh_shape):
    def f(mesh):
        k = max(mesh.shape)
        moves = [
            same("transpose", free=always),
            same("transpose", (1, 0, 2), free=always),
            same("transpose", [-1, 0, 1], free=always),
            same("swapaxes", 0, -1, free=always),
            same("expand_dims", 0, free=always),
            same("expand_dims", (1, -1), free=always),
        ]
        n = 0
        for shape in [(2, k + 1, 3), (2 * k + 1, 1, max(k - 1, 1)), (0, 2, k)]:
            n += check_unary(mesh, shape, moves)

        def free(axis):  # a split size-1 axis is free while a size-1 axis stays in the output
            out = np.squeeze(np.empty((1, 2 * k + 1, 1)), axis)
            return lambda pl: 1 in out.shape or not split_axes(mesh.shape, pl) & {0, 2}

        squeezes = [same("squeeze", a, free=free(a)) for a in (None, 0, 2, (0, 2), -1)]
        n += check_unary(mesh, (1, 2 * k + 1, 1), squeezes)
        n += check_unary(mesh, (1, 2 * k + 1, 1), squeezes[:2], dtype=np.int64)
        return n

    run(mesh_shape, f)


# -- broadcast_to, tile, repeat --------------------------------------------------------------
@pytest.mark.parametrize("mesh_shape", MESHES)
def test_broadcast_tile_repeat_grid(mesh_shape):
    def f(mesh):
        k = max(mesh.shape)
        m = 2 * k + 1

        def whole(*axes):  # no split axis is broadcast or tiled: no communication
            return lambda pl: not split_axes(mesh.shape, pl) & set(axes)

        row = [
            same("broadcast_to", (3, m), free=whole(0)),
            same("broadcast_to", (2, 1, m), free=always),
            same("tile", (2, 1), free=whole(0)),
        ]
        column = [
            same("broadcast_to", (2, m, 4), free=whole(1)),
            same("tile", 3, free=whole(1)),
            same("tile", (2, 1, 1), free=always),
        ]
        n = check_unary(mesh, (1, m), row) + check_unary(mesh, (m, 1), column)
        repeats = [(2, 0), (3, 1), ((1, 0, 2), 1), ([2], 0), (2, None), (0, 0)]
        for shape in [(2 * k, 3), (m, 3), (max(k - 1, 1), 3)]:
            n += check_unary(mesh, shape, [same("repeat", r, a) for r, a in repeats])
        return n

    run(mesh_shape, f)


def test_repeat_keeps_even_shards():
    spec = TensorSpec((8, 3), [S0])
    assert infer_forward("repeat", [spec], (4,), repeats=3, axis=0) == ([[S0]], [[S0]])
    spec = TensorSpec((6, 3), [S0])  # rows 2, 2, 1, 1 times 3 are not array_split of 18
    assert infer_forward("repeat", [spec], (4,), repeats=3, axis=0) == ([[R]], [[R]])
    assert infer_forward("tile", [spec], (4,), reps=(1, 2)) == ([[S0]], [[S0]])


# -- split -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mesh_shape", MESHES)
def test_split_grid(mesh_shape):
    def f(mesh):
        k = max(mesh.shape)

        def whole(axis):  # the split axis is not split over ranks: no communication
            return lambda pl: axis % 2 not in split_axes(mesh.shape, pl)

        args = [(3, 1), ([1, 3], 0), ((-2, 100), 0), ([2, 1], -1), (1, 0)]
        splits = [same("split", s, a, free=whole(a)) for s, a in args]
        n = 0
        for shape in [(2 * k + 1, 6), (max(k - 1, 1), 3), (0, 6)]:
            n += check_unary(mesh, shape, splits)
        return n

    run(mesh_shape, f)


# -- getitem ---------------------------------------------------------------------------------
def keys(shape):
    """Ints (negative too), slices with every kind of step, None, Ellipsis, empty picks."""
    n0 = shape[0]
    return [
        0,
        -1,
        n0 // 2,
        slice(1, None),
        slice(None, None, -1),
        slice(None, None, 2),
        slice(-2, None, -3),
        slice(3, 1),
        (Ellipsis, 1),
        (slice(None), slice(1, 4)),
        (None, 0, slice(None, None, -2)),
        (slice(None), None, -2),
        (Ellipsis, None),
        (n0 - 1, -1),
        (slice(None, None, -2), slice(None)),
        (slice(None), slice(None, None, 3)),
        (),
    ]


def getitem_call(mesh_shape, shape, key):
    picks = [e for e in canonical_key(shape, key) if e is not None]

    def whole(pl):  # the split axes are taken whole: no communication
        return all(picks[d] == range(shape[d]) for d in split_axes(mesh_shape, pl))

    return (f"[{key}]", lambda x: dt.getitem(x, key), lambda g: [g[key]], whole)


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_getitem_grid(mesh_shape):
    def f(mesh):
        k = max(mesh.shape)
        n = 0
        for shape, dtype in [((2 * k + 1, 5), np.float64), ((4 * k, 5), np.int64), ((k, 5), bool)]:
            calls = [getitem_call(mesh.shape, shape, key) for key in keys(shape)]
            n += check_unary(mesh, shape, calls, dtype=dtype)
        g = cases.global_value((k + 1, 3), np.float64)
        x = cases.make_source(g, mesh, [S0] + [R] * (mesh.ndim - 1))
        for key in [[0, -1], (slice(None), np.array([2, 0])), g[:, 0] > 0, (True,)]:
            assert np.array_equal(dt.getitem(x, key).numpy(), g[key])  # the replicate fallback
        # counted (shared by the ranks); on one rank nothing is split and numpy indexes the
        # local value (Note [Lookups in unsplit tensors] in ops/indexing.py)
        assert accounting.FALLBACKS["getitem[advanced]"] > 0 or mesh.size == 1
        return n

    run(mesh_shape, f)


def test_getitem_layout():
    """A small pick from a sharded axis stays local (Partial(sum)); a large one gathers."""
    spec = TensorSpec((8, 6), [S0, S1])
    picks = [
        ((0,), ([S0, S1], [PSUM, S0])),  # a row: its owner keeps it, the others hold zeros
        ((slice(None), 2), ([S0, S1], [S0, PSUM])),
        ((slice(2, 3), slice(None, None, -1)), ([S0, S1], [PSUM, PSUM])),
        ((slice(None), slice(1, 3), None), ([S0, S1], [S0, PSUM])),
        ((Ellipsis, None), ([S0, S1], [S0, S1])),  # whole axes keep their Shards
        ((slice(1, None),), ([R, S1], [R, S1])),  # over half of the input: gathered instead
    ]
    for key, want in picks:
        got = infer_forward("getitem", [spec], (2, 2), key=key)
        assert got == ([want[0]], [want[1]]), key

    def f(mesh):
        g = cases.global_value((8, 6), np.int64)
        x = cases.make_source(g, mesh, [S0, S1])
        with dt.CommCounter() as cc:
            y = dt.getitem(x, (5, slice(1, 3)))
        assert cc.total == 0 and y.placements == [PSUM, PSUM]
        assert np.array_equal(y.numpy(), g[5, 1:3])
        return 1

    run((2, 2), f)


# -- concatenate and stack -------------------------------------------------------------------
def join_placements(mesh_shape, ndim: int, count: int, limit: int) -> list:
    """Placement lists for ``count`` inputs: all combinations, or ``limit`` of them."""
    combos = list(itertools.product(grid(mesh_shape, ndim), repeat=count))
    return combos if len(combos) <= limit else random.Random(0).sample(combos, limit)


def check_join(mesh, shapes, axis, limit: int = 200) -> int:
    gs = [cases.global_value(s, np.float64, seed=i) for i, s in enumerate(shapes)]
    n = 0
    for pls in join_placements(mesh.shape, len(shapes[0]), len(shapes), limit):
        xs = [cases.make_source(g, mesh, pl, seed=i + 1) for i, (g, pl) in enumerate(zip(gs, pls))]
        label = f"{mesh.shape} {shapes} {axis} {pls}"
        whole = axis % len(shapes[0]) not in split_axes(mesh.shape, pls[0])
        exact = not any(p.is_partial() for pl in pls for p in pl)
        with dt.CommCounter() as cc:
            y = dt.concatenate(xs, axis)
        if len({tuple(pl) for pl in pls}) == 1 and whole:
            assert cc.total == 0, (label, cc.counts)  # they agree and the axis is whole: free
        cases.assert_value(y.numpy(), np.concatenate(gs, axis), exact, label)
        if len({g.shape for g in gs}) == 1:
            z = dt.stack(xs, axis - 1)
            cases.assert_value(z.numpy(), np.stack(gs, axis - 1), exact, f"stack {label}")
        n += 1
    return n


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_concatenate_stack_grid(mesh_shape):
    def f(mesh):
        k = max(mesh.shape)
        m = 2 * k + 1
        n = check_join(mesh, [(m, 3), (m, 3)], 1)
        n += check_join(mesh, [(m, 3), (1, 3)], 0)
        n += check_join(mesh, [(2, k - 1 or 1), (2, 2 * k)], -1)
        n += check_join(mesh, [(3, m), (0, m), (2, m)], 0, limit=60)
        return n

    run(mesh_shape, f)


def test_concatenate_layout():
    spec = TensorSpec((8, 6), [S0, PSUM])
    rep = TensorSpec((8, 2), [S0, R])
    got = infer_forward("concatenate", [spec, rep], (2, 2), axis=1)
    assert got == ([[S0, PSUM], [S0, PSUM]], [[S0, PSUM]])  # Replicate -> Partial is free
    rows = TensorSpec((3, 6), [S0, R])
    got = infer_forward("concatenate", [spec, rows], (2, 2), axis=0)
    assert got == ([[S1, PSUM], [S1, PSUM]], [[S1, PSUM]])  # the joined axis is never split
    got = infer_forward("stack", [spec, spec], (2, 2), axis=0)
    assert got == ([[S0, PSUM], [S0, PSUM]], [[S1, PSUM]])
    pmax = TensorSpec((8, 6), [R, PMAX])
    got = infer_forward("concatenate", [pmax, pmax], (2, 2), axis=0)
    assert got == ([[R, PMAX], [R, PMAX]], [[R, PMAX]])  # selection: exact for max too


# -- rules in one process, plain numpy, interop, errors -------------------------------------
def test_infer_forward_moves():
    spec = TensorSpec((4, 5, 6), [S0, PMAX])
    assert infer_forward("transpose", [spec], (2, 2)) == ([[S0, PMAX]], [[S2, PMAX]])
    assert infer_forward("swapaxes", [spec], (2, 2), axis1=0, axis2=1)[1] == [[S1, PMAX]]
    assert infer_forward("expand_dims", [spec], (2, 2), axis=0)[1] == [[S1, PMAX]]
    assert infer_forward("broadcast_to", [spec], (2, 2), shape=(3, 4, 5, 6))[1] == [[S1, PMAX]]
    ones = TensorSpec((1, 5, 1), [S0, S2])
    assert infer_forward("squeeze", [ones], (2, 2), axis=0) == ([[S0, S2]], [[S1, S1]])
    assert infer_forward("squeeze", [ones], (2, 2)) == ([[R, R]], [[R, R]])
    assert infer_forward("split", [spec], (2, 2), indices_or_sections=2, axis=0) == (
        [[R, PMAX]],
        [[R, PMAX], [R, PMAX]],
    )
    assert all(
        op in dt.spmd.registered_ops()
        for op in ["reshape", "transpose", "concatenate", "stack", "split", "getitem", "squeeze"]
    )


def test_plain_numpy_and_interop():
    a = np.arange(12).reshape(3, 4)
    assert np.array_equal(dt.reshape(a, (4, -1)), a.reshape(4, 3))
    assert np.array_equal(dt.getitem(a, (Ellipsis, slice(None, None, -1))), a[..., ::-1])
    assert np.array_equal(dt.broadcast_to(a[:1], (2, 4)), np.broadcast_to(a[:1], (2, 4)))
    assert [p.shape for p in dt.split(a, [1], 1)] == [(3, 1), (3, 3)]

    def f():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(a, mesh, [S1])
        with dt.CommCounter() as cc:
            y = np.concatenate([x, x], axis=0)  # numpy's name reaches the op, not the fallback
            z = np.transpose(np.reshape(x, (3, 2, 2)))
        assert cc.total == 0 and y.placements == [S1] and z.placements == [S1]
        assert np.array_equal(y.numpy(), np.concatenate([a, a])) and z.shape == (2, 2, 3)
        assert np.array_equal(
            dt.concatenate([x, a], axis=None).numpy(), np.concatenate([a, a], None)
        )
        return True

    assert dt.simulate(2, f) == [True, True]


def test_ranks_outside_the_mesh():
    """Rank 2 is not in the mesh: it skips the kernels and holds empty shards."""

    def f():
        mesh = dt.ProcessMesh([0, 1])
        g = cases.global_value((5, 4), np.float64)
        x = cases.make_source(g, mesh, [S0])
        got = [
            dt.reshape(x, (4, 5)),
            dt.transpose(x),
            dt.squeeze(dt.expand_dims(x, 0)),
            dt.broadcast_to(dt.getitem(x, (slice(0, 1), slice(None))), (3, 4)),
            dt.getitem(x, (3, slice(None, None, -2))),
            dt.concatenate([x, x], 1),
            dt.stack([x, x]),
            dt.tile(x, 2),
            dt.repeat(x, 2, 0),
            *dt.split(x, [1, 3], 1),
        ]
        want = [
            g.reshape(4, 5),
            g.T,
            g,
            np.broadcast_to(g[:1], (3, 4)),
            g[3, ::-2],
            np.concatenate([g, g], 1),
            np.stack([g, g]),
            np.tile(g, 2),
            np.repeat(g, 2, 0),
            *np.split(g, [1, 3], 1),
        ]
        assert len(got) == len(want)
        for y, w in zip(got, want):
            assert y.shape == w.shape
            if dt.get_rank() in mesh:
                assert np.array_equal(y.numpy(), w)
            else:
                assert y.to_local().size == 0
        return True

    assert dt.simulate(3, f) == [True] * 3


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda x: dt.reshape(x, (4, 4)), ValueError, r"cannot reshape array of size 15 into"),
        (lambda x: dt.reshape(x, (-1, -1)), ValueError, "only specify one unknown dimension"),
        (lambda x: dt.transpose(x, (0, 0)), ValueError, "not a permutation"),
        (lambda x: dt.squeeze(x, 0), ValueError, "cannot squeeze axis 0"),
        (lambda x: dt.expand_dims(x, 3), np.exceptions.AxisError, "axis 3 is out of bounds"),
        (lambda x: dt.broadcast_to(x, (2, 5)), ValueError, r"cannot broadcast .* \(2, 5\)"),
        (lambda x: dt.split(x, 2), ValueError, "does not result in an equal division"),
        (lambda x: dt.concatenate([x, dt.getitem(x, 0)]), ValueError, "must have the same shape"),
        (lambda x: dt.getitem(x, 5), IndexError, "index 5 is out of bounds for axis 0 with"),
        (lambda x: dt.getitem(x, (0, 0, 0)), IndexError, "too many indices"),
        (lambda x: dt.getitem(x, (..., 0, ...)), IndexError, "single ellipsis"),
        (lambda x: dt.getitem(x, slice(0, 2, 0)), ValueError, "slice step cannot be zero"),
    ],
)
def test_errors_on_every_rank(call, exc, match):
    def f():
        x = dt.shard_tensor(np.zeros((3, 5)), dt.ProcessMesh([0, 1]), [S0])
        with pytest.raises(exc, match=match):
            call(x)
        return True

    assert dt.simulate(2, f, timeout=10) == [True, True]


def test_functions_on_python_scalars_and_lists_are_numpys():
    """A dt function called on values that are not tensors (a Python scalar, a list) runs its
    host kernel on them as they are: numpy's result, or numpy's error (the kernels call an
    array's method, which Python scalars do not have)."""
    calls = [
        ("ravel", (5,)), ("squeeze", (2.5,)), ("expand_dims", (2.0, 0)), ("repeat", (3, 2)),
        ("reshape", (5, (1,))), ("reshape", ([[1, 2], [3, 4]], (4,))), ("transpose", (7,)),
        ("swapaxes", ([[1, 2]], 0, 1)), ("clip", (5, 0, 3)), ("argmin", ([3, 1, 2],)),
        ("argmax", (4.0,)), ("prod", ([2, 3],)), ("all", (1,)), ("any", ([0, 0],)),
        ("squeeze", (3, 2)), ("reshape", (3, 2)),
    ]  # fmt: skip
    for name, args in calls:
        try:
            want, err = getattr(np, name)(*args), None
        except Exception as e:
            want, err = None, type(e)
        if err is not None:
            with pytest.raises(err):
                getattr(dt, name)(*args)
            continue
        got = getattr(dt, name)(*args)
        got = got.numpy() if isinstance(got, dt.DistTensor) else np.asarray(got)
        np.testing.assert_array_equal(got, want, err_msg=f"{name}{args}")
        assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want), (name, args)
