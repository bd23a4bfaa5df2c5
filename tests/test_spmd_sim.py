"""The SPMD cases on simulated ranks (dt.simulate): the large grids live here."""

from __future__ import annotations

import numpy as np
import oracle
import pytest
import spmd_cases as cases

import disttensor as dt


@pytest.mark.parametrize(
    "mesh_shape,world,extra",
    [
        ((1,), 1, {}),
        ((2,), 2, {}),
        ((3,), 3, {}),
        ((4,), 4, {}),
        ((2,), 3, {"dtypes": [np.float64]}),  # rank 2 is outside the mesh
        ((2, 2), 4, {}),
        ((2, 3), 6, {"nd_shapes": 3}),
        ((3, 2), 6, {"nd_dtypes": [np.float32], "nd_shapes": 3}),
        # mesh dims of size 1 split nothing: nested shards over them must not block a plan
        ((2, 1), 2, {"nd_dtypes": [np.float64], "nd_shapes": 2}),
        ((1, 2), 2, {"nd_dtypes": [np.float64], "nd_shapes": 2}),
    ],
)
def test_reshard_grid(mesh_shape, world, extra):
    n = dt.simulate(world, cases.case_reshard_grid, world, mesh_shapes=(mesh_shape,), **extra)
    assert n[0] > 0


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize(
    "case",
    [c for c in cases.ALL if c is not cases.case_reshard_grid],
    ids=lambda c: c.__name__.removeprefix("case_"),
)
def test_case(case, world):
    if case is cases.case_reshard_other_ndims and world not in (3, 4, 8):
        pytest.skip("meshes (2,) (3,) (2,2) are all covered with worlds 3, 4 and 8")
    dt.simulate(world, case, world)


# -- the oracle itself (tests/oracle.py), against boxes and counts written out by hand -------
def _rows(mesh_shape, placements, n, ndim=1):
    shape = (n,) + (3,) * (ndim - 1)
    return [
        oracle.local_box(shape, mesh_shape, tuple(placements), tuple(c))[0]
        for c in np.ndindex(*mesh_shape)
    ]


def test_oracle_boxes():
    S0, S1, R, P = dt.Shard(0), dt.Shard(1), dt.Replicate(), dt.Partial()
    assert _rows((3,), [S0], 7) == [slice(0, 3), slice(3, 5), slice(5, 7)]  # first n % k: +1
    assert _rows((4,), [S0], 2)[:2] == [slice(0, 1), slice(1, 2)]
    assert [b.stop - b.start for b in _rows((4,), [S0], 2)] == [1, 1, 0, 0]  # empty shards
    assert _rows((2, 2), [S0, S0], 7) == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 7)]
    nested = _rows((2, 2, 2), [S0] * 3, 9)  # 9 -> 5 | 4 -> 3, 2 | 2, 2 -> 2, 1 | 1, 1 | ...
    assert [(b.start, b.stop) for b in nested] == [
        (0, 2),
        (2, 3),
        (3, 4),
        (4, 5),
        (5, 6),
        (6, 7),
        (7, 8),
        (8, 9),
    ]
    assert _rows((2, 3), [R, S0], 7) == [slice(0, 3), slice(3, 5), slice(5, 7)] * 2
    assert _rows((2, 3), [P, S1], 7, ndim=2) == [slice(0, 7)] * 6
    boxes = [oracle.local_box((7, 5), (2, 3), (S1, S0), c) for c in np.ndindex(2, 3)]
    assert boxes[4] == (slice(3, 5), slice(3, 5))  # coord (1, 1): rows by m1, columns by m0
    assert oracle.local_box((7, 5), (2,), (S0,), None) == (slice(0, 0), slice(0, 0))
    assert oracle.coord_of([[4, 2], [0, 1]], 0) == (1, 0)
    assert oracle.coord_of([[4, 2], [0, 1]], 3) is None


def test_oracle_counts():
    S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
    ps, pm, pa = dt.Partial("sum"), dt.Partial("max"), dt.Partial("avg")
    for mesh_shape, src, dst, want in [
        ((2, 2), [S0, S1], [S1, S0], 2),  # per-dim table: every dim moves once
        ((2, 2), [S0, S0], [S0, R], 1),  # the innermost split of axis 0 moves alone
        ((2, 2), [S0, S0], [R, S0], 2),  # m1 must gather first, then slice back
        ((2, 2), [R, S0], [S0, S0], 1),  # ranks need rows they do not hold: m1 gathers
        ((2, 1), [R, S0], [S0, S0], 0),  # a size-1 mesh dim splits nothing
        ((2, 2), [pm, ps], [R, ps], 2),  # max and sum do not commute: m1 reduces first
        ((2, 2), [pa, ps], [R, ps], 1),  # avg and sum commute
        ((2, 2, 2), [ps, pm, pa], [R, pm, pa], 3),  # forced in a chain: m0 -> m1 -> m2
        ((2, 2), [R, R], [ps, S0], 0),
        ((2, 2, 2), [S0, S0, S0], [S1, S1, S1], 3),
    ]:
        assert oracle.reshard_count(mesh_shape, tuple(src), tuple(dst), 2) == want, (src, dst)
    assert oracle.reshard_kinds((2, 2), (S0, ps), (R, S1), 2) == {
        "all_gather": 1,
        "reduce_scatter": 1,
    }
    assert oracle.reshard_kinds((2, 2), (S0, S1), (S1, S0), 2) is None  # order-constrained
