"""Slices of split axes keep the split and move only boundary rows (Note [Slices of split axes]
in disttensor/ops/shape.py): values, layout, gradients and communication volume."""

from __future__ import annotations

import numpy as np
import pytest
from op_cases import MESH_SHAPES, assert_close, every_rank, make_input, mesh_of

import disttensor as dt

KEYS = {
    "x[2:]": (slice(2, None),),
    "x[:-2]": (slice(None, -2),),
    "x[1:-1, 1:-1]": (slice(1, -1), slice(1, -1)),
    "x[::2]": (slice(None, None, 2),),
    "x[::-1]": (slice(None, None, -1),),
    "x[-2:0:-3, None, 1]": (slice(-2, 0, -3), None, 1),
    "x[3:4]": (slice(3, 4),),
    "x[5:5]": (slice(5, 5),),
}


def _layouts(mesh):
    n = mesh.ndim
    R = dt.Replicate()
    out = [[dt.Shard(0)] + [R] * (n - 1), [dt.Shard(1)] + [R] * (n - 1)]
    if n == 2:
        out += [[dt.Shard(0), dt.Shard(1)], [dt.Shard(0), dt.Shard(0)], [dt.Shard(1), dt.Shard(0)]]
    return out


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_slices_of_split_axes(mesh_shape):
    """Every key on every split layout: numpy's value on every rank, the splits kept (on the
    slice's own length), and the gradient (a write of g into zeros) equal to numpy's."""
    g = np.random.default_rng(2).normal(size=(2 * 4 + 3, 5))  # uneven on every mesh

    def body():
        mesh = mesh_of(mesh_shape)
        out = []
        for pl in _layouts(mesh):
            for label, key in KEYS.items():
                x = make_input(g, mesh, pl)
                x.requires_grad = True
                y = x[key]
                kept = [p for p in y.placements if p.is_shard()]
                cot = np.arange(y.size, dtype=float).reshape(y.shape) + 1
                (y * cot).sum().backward()
                out.append((label, str(pl), y.numpy(), len(kept), x.grad.numpy()))
        return out

    for label, pl, got, kept, grad in every_rank(dt.simulate(mesh_of(mesh_shape).size, body)):
        key = KEYS[label]
        want = g[key]
        assert_close(got, want, f"{label} {pl}")
        if 1 not in key and mesh_shape != (1,):  # no int on an axis: every split kept
            assert kept == pl.count("Shard"), (label, pl, kept)
        cot = np.arange(want.size, dtype=float).reshape(want.shape) + 1
        want_grad = np.zeros_like(g)
        want_grad[key] = cot
        assert_close(grad, want_grad, f"gradient of {label} {pl}")


@pytest.mark.parametrize("k", [2, 3, 4])
def test_stencil_step_moves_boundary_rows(k):
    """One step of a 2-D heat stencil on a plate split by rows over k ranks: every rank hands
    at most a few boundary rows per shifted slice to its neighbours (point to point), never
    the plate; the plate keeps its layout; the values are numpy's."""
    n, m = 40, 9
    g = np.random.default_rng(3).normal(size=(n, m))

    def step(u):
        u[1:-1, 1:-1] = u[1:-1, 1:-1] + 0.2 * (
            u[2:, 1:-1] - 2 * u[1:-1, 1:-1] + u[:-2, 1:-1] + u[1:-1, 2:] - 2 * u[1:-1, 1:-1]
            + u[1:-1, :-2]
        )  # fmt: skip

    def body():
        mesh = dt.init_mesh((k,))
        u = dt.shard_tensor(g, mesh, [dt.Shard(0)])
        with dt.CommCounter() as cc:
            step(u)
        return cc.counts, cc.bytes, u.placements, u.numpy()

    want = g.copy()
    step(want)
    row = m * 8
    for counts, nbytes, placements, value in dt.simulate(k, body):
        assert set(counts) <= {"send"}, counts  # no collective at all: neighbours only
        # 7 slices and 1 write; each moves at most 2 rows to a neighbour (the splits of n and
        # n - 2 rows differ by at most 2 rows at each boundary)
        assert nbytes.get("send", 0) <= 8 * 2 * row, nbytes
        assert placements == [dt.Shard(0)]
        assert_close(value, want, "stencil step")


def test_partial_and_int_keys_keep_the_rule():
    """An int on a split axis, or a Partial input: the getitem rule (no boundary exchange)."""

    def body():
        mesh = dt.init_mesh((2,))
        x = make_input(np.arange(12.0).reshape(4, 3), mesh, [dt.Shard(0)])
        p = make_input(np.arange(12.0).reshape(4, 3), mesh, [dt.Partial()])
        return x[1].placements, p[1:3].placements, x[1].numpy(), p[1:3].numpy()

    pl_int, pl_partial, a, b = every_rank(dt.simulate(2, body))
    assert pl_partial == [dt.Partial()]
    assert_close(a, np.arange(12.0).reshape(4, 3)[1], "x[1]")
    assert_close(b, np.arange(12.0).reshape(4, 3)[1:3], "p[1:3]")
    assert pl_int in ([dt.Partial()], [dt.Replicate()])


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (2, 2)], ids=str)
def test_slice_plans_are_kept_on_the_spec(mesh_shape):
    """Note [Slice plans kept on the spec]: a repeated slice reuses its plan (its output has
    the same spec object), reads the data the tensor holds now (two tensors of one spec,
    and one written in place between slices), and the plans a spec keeps stay few."""
    g = np.random.default_rng(4).normal(size=(11, 7))  # uneven on every mesh

    def body():
        mesh = mesh_of(mesh_shape)
        u = make_input(g, mesh, [dt.Shard(0)] + [dt.Replicate()] * (mesh.ndim - 1))
        a, b = u * 1.0, u * 2.0  # one cached output spec, two tensors
        same = a._spec is b._spec
        first, second = a[2:, 1:-1], b[2:, 1:-1]
        reused = first._spec is second._spec
        a[3:5] = 0.0  # a write between two slices of a
        third = a[2:, 1:-1]
        for k in range(40):  # many keys: the spec keeps at most a bounded number of plans
            a[k % 9 :, 1:]
        routes = a._spec.__dict__.get("_routes", {}).values()  # the plans live in the routes
        kept = sum(1 for route in routes if route[3])
        return same, reused, first.numpy(), second.numpy(), third.numpy(), kept

    written = g.copy()
    written[3:5] = 0.0
    same, reused, first, second, third, kept = every_rank(
        dt.simulate(mesh_of(mesh_shape).size, body)
    )
    assert same and reused
    assert_close(first, g[2:, 1:-1], "a[2:, 1:-1]")
    assert_close(second, 2 * g[2:, 1:-1], "b[2:, 1:-1]")
    assert_close(third, written[2:, 1:-1], "a[2:, 1:-1] after a write")
    assert 1 <= kept <= 64  # shape._ROUTES_PER_SPEC


def test_float_slice_bounds_still_raise_after_int_ones():
    """canonical_key remembers plain keys; slice(1.0, 3) equals slice(1, 3) as a dict key but
    numpy refuses it, and so does dt, before and after the int key was seen."""

    def body():
        mesh = dt.init_mesh((2,))
        x = make_input(np.arange(12.0).reshape(6, 2), mesh, [dt.Shard(0)])
        errors = []
        for key in (slice(1.0, 3), slice(1, 3), slice(1.0, 3), (slice(1, 3), 1.0)):
            try:
                x[key]
            except (TypeError, IndexError) as e:
                errors.append(type(e).__name__)
            else:
                errors.append(None)
        return errors

    errors = every_rank(dt.simulate(2, body))
    assert errors[0] is not None and errors[2] is not None, errors
    assert errors[1] is None, errors
    assert errors[3] is not None, errors
