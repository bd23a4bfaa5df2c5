"""Note [Small reductions ride together] (tensor.py) and Note [Reduced values used]
(dispatch.py): small Partial results made before any of them is read are reduced in one
all-reduce, and a Partial tensor whose reduced value is remembered is used in that form.
Counted with dt.CommCounter on every mesh, values checked against numpy, every simulated
rank returning the same."""

from __future__ import annotations

import numpy as np
import pytest
from op_cases import MESH_SHAPES, make_input
from op_cases import on_mesh as on

import disttensor as dt

S0, R = dt.Shard(0), dt.Replicate()


def rows(mesh):
    """Split by rows over the first mesh dim: a sum over axis 0 is Partial there."""
    return [S0] + [R] * (mesh.ndim - 1)


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(-5, 6, (n, 4)).astype(float), rng.integers(-5, 6, (n, 3)).astype(float)


def ranks_reducing(mesh_shape) -> bool:
    return mesh_shape[0] > 1


@pytest.mark.parametrize("n", [13, 3], ids=["uneven", "empty shard on 4"])
@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_two_pending_sums_are_reduced_in_one_all_reduce(mesh_shape, n):
    """counts and sums (k-means' pattern): the first read reduces both, the second moves
    nothing, and an op that would keep the second Partial gets its reduced value."""
    gx, gy = data(n)

    def body(mesh):
        x, y = make_input(gx, mesh, rows(mesh)), make_input(gy, mesh, rows(mesh))
        with dt.CommCounter() as cc:
            a = x.sum(axis=0)  # Partial, 4 floats
            b = y.sum(axis=0)  # Partial, 3 floats
            first = np.maximum(a, 1.0)  # reduces a, and b with it
            after_first = dict(cc.counts), dict(cc.bytes)
            second = np.sqrt(np.abs(b))  # b's reduced value: nothing moves
            scaled = b / 2.0  # a linear op that kept b Partial: now Replicate
        return (
            first.numpy(), second.numpy(), scaled.numpy(), scaled.placements, after_first,
            cc.counts,
        )  # fmt: skip

    first, second, scaled, placements, (c1, b1), c2 = on(mesh_shape, body)
    np.testing.assert_array_equal(first, np.maximum(gx.sum(0), 1.0))
    np.testing.assert_array_equal(second, np.sqrt(np.abs(gy.sum(0))))
    np.testing.assert_array_equal(scaled, gy.sum(0) / 2.0)
    if ranks_reducing(mesh_shape):
        assert c1 == {"all_reduce": 1} and b1 == {"all_reduce": 7 * 8}, (c1, b1)
        assert c2 == {"all_reduce": 1}
        assert all(p.is_replicate() for p in placements), placements
    else:
        assert c2 == {}


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (2, 2)], ids=str)
def test_what_does_not_ride(mesh_shape):
    """A consumed Partial (g of g / n), one written since it was made, another dtype or
    reduction, and one too large stay out of the batch; each is still right."""
    gx, gy = data(13)

    def body(mesh):
        x, y = make_input(gx, mesh, rows(mesh)), make_input(gy, mesh, rows(mesh))
        with dt.CommCounter() as cc:
            g = x.sum(axis=0)
            q = g / 13.0  # consumes g: only q is pending
            w = y.sum(axis=0)
            w[0] = 5.0  # written since it was made (no collective): it does not ride
            i = y.astype(np.int64).sum(axis=0)  # another dtype
            m = x.max(axis=0)  # Partial('max'): another reduction
            big = make_input(np.ones((13, 70)), mesh, rows(mesh)).sum(axis=0)  # 560 bytes
            first = np.abs(q).numpy()
            after_first = dict(cc.bytes)
            rest = [np.abs(t).numpy() for t in (g, w, i, m, big)]
        return first, rest, after_first

    first, rest, b1 = on(mesh_shape, body)
    np.testing.assert_allclose(first, np.abs(gx.sum(0) / 13.0), rtol=1e-15)  # divided first
    for got, want in zip(
        rest,
        (
            gx.sum(0),
            np.r_[5.0, gy.sum(0)[1:]],
            gy.astype(np.int64).sum(0),
            gx.max(0),
            np.full(70, 13.0),
        ),
    ):
        np.testing.assert_array_equal(got, np.abs(want))
    assert b1 == {"all_reduce": 4 * 8}, b1  # q alone


def test_a_pending_tensor_dropped_on_one_rank_still_rides_on_every_rank():
    """The pending list holds what the program's ops made, not what is alive: a tensor one
    rank drops (its own reference gone) rides on every rank alike, so the ranks agree."""
    gx, gy = data(13)

    def body(mesh):
        x, y = make_input(gx, mesh, rows(mesh)), make_input(gy, mesh, rows(mesh))
        a, b = x.sum(axis=0), y.sum(axis=0)
        if dt.get_rank() == 0:
            del b
        with dt.CommCounter() as cc:
            out = np.abs(a).numpy()
        return out, cc.counts, cc.bytes

    out, counts, nbytes = on((2,), body)
    np.testing.assert_array_equal(out, np.abs(gx.sum(0)))
    assert counts == {"all_reduce": 1} and nbytes == {"all_reduce": 7 * 8}


def test_reduced_values_are_not_used_for_views_or_gradients():
    """A view op (getitem) of a reduced Partial tensor stays Partial (a write into the view
    must reach the tensor), and so does an op on a tensor that requires a gradient."""
    gx, gy = data(13)

    def body(mesh):
        x, y = make_input(gx, mesh, rows(mesh)), make_input(gy, mesh, rows(mesh))
        a, b = x.sum(axis=0), y.sum(axis=0)
        np.abs(a)  # both reduced
        view = b[1:]
        c = y.sum(axis=0)
        c.requires_grad = True
        np.abs(c)  # reduced, remembered
        half = c / 2.0
        return view.placements, half.placements, view.numpy(), half.numpy()

    vp, hp, view, half = on((2,), body)
    assert vp == [dt.Partial()] and hp == [dt.Partial()]
    np.testing.assert_array_equal(view, gy.sum(0)[1:])
    np.testing.assert_array_equal(half, gy.sum(0) / 2.0)


def test_meshes_of_some_ranks_keep_their_own_pending_reductions():
    """One list per mesh: results and moves on a mesh of ranks 0 and 1 (made there only, as
    documented) neither push a tensor of the whole world's mesh off the list of ranks 0 and 1
    nor empty it, so every rank of the world reduces alike; and a rank outside a mesh agrees
    with its ranks on a result's placements (no reduced value is used there)."""

    def body():
        world, pair = dt.ProcessMesh([0, 1, 2, 3]), dt.ProcessMesh([0, 1])
        z = dt.ones((2,), mesh=world, placements=[dt.Partial()]) * 2.0
        kept = [dt.ones((2,), mesh=pair, placements=[dt.Partial()]) * (i + 1.0) for i in range(5)]
        if dt.get_rank() in (0, 1):
            kept[0].numpy()  # collective over the pair, made there
        y = dt.ones((2,), mesh=world, placements=[dt.Partial()]) * 3.0
        with dt.CommCounter() as cc:
            total = float(y.sum())
        s = dt.ones((2,), mesh=pair, placements=[dt.Partial()]) * 3.0
        dt.reshard(kept[1], pair, [R])  # s rides along on ranks 0 and 1
        half = s / 2.0
        return (
            total,
            z.numpy().tolist(),
            cc.counts,
            half.placements,
            dt.reshard(half, world, [R]).numpy().tolist(),
        )

    for got in dt.simulate(4, body):
        assert got[:3] == (6.0, [2.0, 2.0], {"all_reduce": 1}), got
        assert got[3] == [dt.Partial()] and got[4] == [1.5, 1.5], got


def test_a_view_of_a_reduced_partial_is_a_view_of_the_tensor():
    """np.real returns a view, as in numpy: a write into it reaches the Partial tensor, not the
    remembered reduced value that an earlier reshard returned."""

    def body():
        mesh = dt.ProcessMesh([0, 1])
        p = dt.ones((3,), mesh=mesh, placements=[dt.Partial()]) * 3.0
        whole = dt.reshard(p, mesh, [R])
        r = np.real(p)
        r[0] = 100.0
        return whole.numpy().tolist(), p.numpy().tolist(), r.placements

    for got in dt.simulate(2, body):
        assert got == ([3.0, 3.0, 3.0], [100.0, 3.0, 3.0], [dt.Partial()]), got
