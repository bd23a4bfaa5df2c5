"""Gradients of every differentiable op on simulated ranks against numpy.

For meshes (1), (2), (3), (4) and (2, 2), the placement grid of the op tests (Shard of each
axis, Replicate, asymmetric Partials), even, uneven and empty shards: the gathered gradient of
``sum(op(inputs) * cot)`` must equal the single-process numpy gradient (central differences
in float64 or a hand-written reference), see tests/grad_cases.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from grad_cases import (
    astype_cases,
    binary_cases,
    case_grad_models,
    clip_cases,
    composite_cases,
    constant_cases,
    internal_cases,
    layout_cases,
    linalg_cases,
    mpi_cases,
    nn_cases,
    reduction_cases,
    reshard_cases,
    run_grid,
    scan_cases,
    shape_cases,
    softmax_cases,
    ufunc_cases,
    unary_cases,
    where_cases,
)
from op_cases import MESH_SHAPES, S0, R

import disttensor as dt
from disttensor import autograd
from disttensor.ops import elementwise as ew

MESH_IDS = [str(s) for s in MESH_SHAPES]
mesh_shapes = pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)

UNARY = [n for n in ew.UNARY if n not in autograd.NOT_DIFFERENTIABLE]
BINARY = [n for n in ew.BINARY if n not in autograd.NOT_DIFFERENTIABLE]
# Binary ops with every placement pair on 1-D meshes: one per linearity class of spmd/rules.py
# (linear, multilinear, linear in the first argument); the others get the pairs that are
# equal or have a Replicate side, as in tests/test_ops_elementwise.py.
FULL = {"add", "multiply", "divide"}
REDUCTIONS = ["sum", "mean", "max", "min", "prod"]

# group name -> the cases (built once, oracles cached on them across meshes)
GROUPS = {
    **{f"unary-{n}": unary_cases(n) for n in UNARY},
    **{f"binary-{n}": binary_cases(n, full=n in FULL) for n in BINARY},
    "where": where_cases(),
    "clip": clip_cases(),
    "astype": astype_cases(),
    "constants": constant_cases(),
    "linalg": linalg_cases(),
    **{f"reduce-{n}": reduction_cases(n) for n in REDUCTIONS},
    "composites": composite_cases(),
    "ufuncs": ufunc_cases(),  # numpy's ufuncs that gained rules (tests/test_ufuncs.py)
    "softmax": softmax_cases(),
    "scan": scan_cases(),
    "shape": shape_cases(),
    "internal": internal_cases(),
    "nn": nn_cases(),
    "reshard": reshard_cases(),
    "layout": layout_cases(),
}


@mesh_shapes
@pytest.mark.parametrize("group", list(GROUPS))
def test_gradients(group, mesh_shape):
    run_grid(mesh_shape, GROUPS[group])


def test_every_gradient_has_cases():
    """Each op with a registered gradient is on the tape of some case (checked per case)."""
    every = [*(c for cases in GROUPS.values() for c in cases), *mpi_cases()]
    covered = {op for c in every for op in c.ops}
    missing = set(autograd.GRADIENTS) - covered
    assert not missing, f"gradients without a case: {sorted(missing)}"


# -- data parallelism: Note [Partial gradients] -------------------------------------------------
def _data_parallel(mesh):
    rng = np.random.default_rng(40)
    xg, wg = rng.normal(size=(6, 3)), rng.normal(size=(3, 2))
    x = dt.shard_tensor(xg, mesh, [S0])
    w = dt.shard_tensor(wg, mesh, [R], requires_grad=True)
    with dt.CommCounter() as cc:
        loss = ((x @ w) ** 2).mean()
    forward = cc.total
    loss.backward()
    want = 2 * xg.T @ (xg @ wg) / (xg @ wg).size
    return forward, w.grad.placements, w.grad.numpy(), want


def test_data_parallel_weight_gradient_is_partial():
    """x Shard(0) over dp, w replicated: the forward of mean((x @ w)^2) moves nothing but
    the loss, and w.grad comes out Partial(sum) (no gradient all-reduce)."""
    mesh = dt.ProcessMesh([0, 1], ["dp"])
    for forward, pls, got, want in dt.simulate(2, _data_parallel, mesh):
        assert pls == [dt.Partial("sum")]
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert forward == 0


@pytest.mark.parametrize("world", [3, 4])
def test_mpi_case_on_simulated_ranks(world):
    """The gradient case tests/mpi_runner.py runs under mpiexec (grad_cases.mpi_cases) on
    the meshes (1), (2), (3), (4), (2, 2) that fit; ranks outside a mesh skip it."""
    counts = dt.simulate(world, case_grad_models, world)
    assert counts[0] > 0
