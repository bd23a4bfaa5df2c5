"""The SPMD cases on simulated ranks (dt.simulate): the large grids live here."""

from __future__ import annotations

import numpy as np
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
