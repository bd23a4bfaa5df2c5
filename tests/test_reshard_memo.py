"""Note [One move per tensor] (tensor.moved): a tensor moved to a layout is not moved there
again until it, or the moved value, is written; the same decision on every rank. Counted with
dt.CommCounter on every mesh, values checked against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpirun import run_script
from op_cases import MESH_SHAPES, make_input
from op_cases import on_mesh as on

import disttensor as dt
from disttensor import tensor as dt_tensor

S0, R, PSUM = dt.Shard(0), dt.Replicate(), dt.Partial()
G = np.arange(1.0, 8.0)  # 7: uneven on every mesh


def counted(fn):
    with dt.CommCounter() as cc:
        out = fn()
    return out, cc.counts


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_a_partial_scalar_used_twice_is_reduced_once(mesh_shape):
    def body(mesh):
        p = make_input(G, mesh, [S0] * mesh.ndim)
        s = p @ p  # Partial over the mesh dims that split p
        first, c1 = counted(lambda: 1.0 / s)
        second, c2 = counted(lambda: (2.0 / s) + s)
        return first.numpy(), second.numpy(), c1, c2

    first, second, c1, c2 = on(mesh_shape, body)
    norm = G @ G
    np.testing.assert_allclose(first, 1 / norm, rtol=1e-14)
    np.testing.assert_allclose(second, 2 / norm + norm, rtol=1e-14)
    split = sum(n > 1 for n in mesh_shape)
    assert c1 == ({"all_reduce": split} if split else {})
    assert c2 == {}  # reused


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_a_gathered_vector_is_gathered_once_and_again_after_a_write(mesh_shape):
    def body(mesh):
        p = make_input(G, mesh, [S0] * mesh.ndim)
        whole = [R] * mesh.ndim
        # values read at once: a reshard may share memory with p (on one rank it is p's)
        y1, c1 = counted(lambda: dt.reshard(p, mesh, whole).to_local().copy())
        y2, c2 = counted(lambda: (dt.reshard(p, mesh, whole) * 2).to_local().copy())
        p[0] = 100.0  # a write: the gathered p is stale
        y3, c3 = counted(lambda: dt.reshard(p, mesh, whole).to_local().copy())
        view = p[1:3]  # a view of p's shards: writing it writes p
        view[...] = -1.0
        y4, c4 = counted(lambda: dt.reshard(p, mesh, whole).to_local().copy())
        return [y1, y2, y3, y4], [c1, c2, c3, c4]

    ys, counts = on(mesh_shape, body)
    v = G.copy()
    want = [v.copy(), 2 * v]
    v[0] = 100.0
    want.append(v.copy())
    v[1:3] = -1.0
    want.append(v.copy())
    for got, exp in zip(ys, want):
        np.testing.assert_array_equal(got, exp)
    gathers = counts[0]  # p gathered (nothing to move on one rank)
    assert (gathers == {}) == (math.prod(mesh_shape) == 1)
    assert counts[1] == {} and counts[2] == gathers and counts[3] == gathers


def test_writing_a_reshard_result_does_not_leak_into_later_moves():
    """dt.reshard may hand out the remembered array: a write into its result through dt makes
    the memory stale, so the next move of the source communicates again, with p's values."""

    def body(mesh):
        p = make_input(G, mesh, [S0])
        r = dt.reshard(p, mesh, [R])
        r[0] = 9.0
        again, c = counted(lambda: dt.reshard(p, mesh, [R]))
        host = p.numpy()
        host[0] = 50.0  # numpy() returns a copy: this changes nothing of p
        return r.numpy(), again.numpy(), p.numpy(), c

    r, again, p, c = on((2,), body)
    assert r[0] == 9.0 and again[0] == G[0] and p[0] == G[0]
    assert c == {"all_gather": 1}


def test_large_gathers_are_not_remembered(monkeypatch):
    """A sharded tensor is not kept whole beside its shard: gathers of more than
    MEMO_GATHER_BYTES (global) move every time; reductions (no bigger than the source) are
    remembered at any size."""
    monkeypatch.setattr(dt_tensor, "MEMO_GATHER_BYTES", 8 * 6)

    def body(mesh):
        p = make_input(G, mesh, [S0])  # 7 floats: 56 bytes, over the limit
        q = make_input(G[:6], mesh, [S0])  # 48 bytes: at the limit
        s = make_input(G, mesh, [PSUM])
        out = []
        for t, layout in ((p, [R]), (q, [R]), (s, [R])):
            _, c1 = counted(lambda t=t, layout=layout: dt.reshard(t, mesh, layout))
            _, c2 = counted(lambda t=t, layout=layout: dt.reshard(t, mesh, layout))
            out.append((c1, c2))
        return out

    (p1, p2), (q1, q2), (s1, s2) = on((2,), body)
    assert p1 == p2 == {"all_gather": 1}
    assert q1 == {"all_gather": 1} and q2 == {}
    assert s1 == {"all_reduce": 1} and s2 == {}


def test_the_replicate_fallback_reuses_a_gather():
    def body(mesh):
        p = make_input(G, mesh, [S0])
        _, c1 = counted(lambda: np.unwrap(p))  # no dt implementation: gathered
        _, c2 = counted(lambda: np.unwrap(p))
        return c1, c2

    c1, c2 = on((2,), body)
    assert c1 == {"all_gather": 1} and c2 == {}


CG = """
import numpy as np, disttensor as dt
mesh = dt.init_mesh((dt.get_world_size(),))
rng = np.random.default_rng(0)
m = rng.standard_normal((48, 48)); a0 = m @ m.T + 48 * np.eye(48); b0 = rng.standard_normal(48)
a = dt.shard_tensor(a0, mesh, [dt.Shard(0)])
b = dt.shard_tensor(b0, mesh, [dt.Shard(0)])
def cg(a, b, iters):  # textbook conjugate gradient in plain numpy
    x = b * 0; r = b - a @ x; p = r; rs = r @ r
    for _ in range(iters):
        ap = a @ p
        alpha = rs / (p @ ap)
        x = x + alpha * p
        r = r - alpha * ap
        rs_new = r @ r
        p = r + (rs_new / rs) * p
        rs = rs_new
    return x
with dt.CommCounter() as cc:
    x = cg(a, b, 10)
assert np.allclose(x.numpy(), cg(a0, b0, 10), rtol=1e-10, atol=1e-12), "not numpy's iterates"
# the hand-written count: one all-gather of p and two all-reduces of scalars per iteration
# (and the setup's: r's all-gather for a @ x); the setup's rs rides with the first p @ ap
# (Note [Small reductions ride together]), where the hand-written code reduces it alone
assert cc.counts == {"all_gather": 11, "all_reduce": 20}, cc.counts
print("CG OK", dt.get_rank(), cc.counts)
"""


@pytest.mark.mpi
def test_conjugate_gradient_makes_the_hand_written_collectives_under_mpiexec(tmp_path):
    run_script(tmp_path / "script.py", CG, (2, 3), "CG OK")


def test_reshard_targets_are_kept_on_the_spec():
    """Note [Reshard targets kept on the spec]: a repeated dt.reshard of tensors of one spec
    finds its target there, with the right values and one collective each; bad placements
    raise every time; the spec keeps a bounded number of targets."""

    def body():
        mesh = dt.init_mesh((2,))
        x = make_input(G, mesh, [PSUM])
        values, counts = [], []
        for _ in range(3):
            y, c = counted(lambda: dt.reshard(dt.DistTensor(x._local, x._spec), mesh, [R]))
            values.append(y.numpy())
            counts.append(c)
        same = dt.reshard(x, mesh, (PSUM,)) is x  # the same layout: x itself
        errors = []
        for bad in ([dt.Shard(3)], [R, R], "R", [None]):
            for _ in range(2):
                try:
                    dt.reshard(x, mesh, bad)
                except (TypeError, ValueError) as e:
                    errors.append(type(e).__name__)
        y = make_input(G, mesh, [S0])
        for _ in range(3):  # more targets than a spec keeps: still right
            for pl in ([R], [S0], [PSUM], [dt.Partial("max")]) * 3:
                dt.reshard(dt.DistTensor(y._local, y._spec), mesh, pl)
        kept = len(y._spec.__dict__.get("_to", {}))
        return values, counts, same, errors, kept

    values, counts, same, errors, kept = on((2,), lambda mesh: body())
    for v in values:
        np.testing.assert_allclose(v, G)  # make_input: a Partial whose value is G
    assert counts == [{"all_reduce": 1}] * 3
    assert same
    assert len(errors) == 8, errors
    assert 1 <= kept <= 8


# -- Note [Picks read from their root] -------------------------------------------------------
@pytest.mark.parametrize("n", [13, 3], ids=["uneven", "empty shard on 4"])
@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_element_loops_read_picks_from_their_root(mesh_shape, n):
    """A double loop reading every element of a row-split matrix (A[i][j]) gathers the matrix
    once instead of reducing each element: a few collectives, numpy's values; a write into
    the matrix is seen by the reads after it."""
    g = np.random.default_rng(5).normal(size=(n, n))  # 13: uneven on every mesh

    def body(mesh):
        A = make_input(g, mesh, [S0] + [R] * (mesh.ndim - 1))
        with dt.CommCounter() as cc:
            first = [[float(A[i][j]) for j in range(n)] for i in range(n)]
        A[n // 2, n - 1] = 100.0  # a write: the gathered value is stale
        with dt.CommCounter() as cc2:
            second = [float(A[i, j]) for i in range(n) for j in range(n)]
        return first, second, cc.total, cc2.total

    first, second, c1, c2 = on(mesh_shape, body)
    np.testing.assert_array_equal(np.array(first), g)
    w = g.copy()
    w[n // 2, n - 1] = 100.0
    np.testing.assert_array_equal(np.array(second).reshape(n, n), w)
    # n * n reads (169), one small reduction each before; a 3 x 3 matrix is gathered at once
    assert c1 <= min(16, n * n) and c2 <= min(16, n * n), (c1, c2)


def test_a_pick_of_a_partial_tensor_reduces_its_root_once():
    """counts[:, None] > 0 then np.maximum(counts, 1) (k-means): one all-reduce of counts,
    which both uses read; a pick written in place keeps its own value."""

    def body(mesh):
        counts = make_input(np.arange(5.0), mesh, [PSUM])
        with dt.CommCounter() as cc:
            a = counts[:, None] > 0
            b = np.maximum(counts, 1)
        c = make_input(np.arange(5.0), mesh, [PSUM])
        pick = c[1:3]
        pick[0] = 10.0  # written: read as itself, not from c
        return a.numpy(), b.numpy(), cc.counts, pick.numpy(), c.numpy()

    a, b, counts, pick, c = on((2,), body)
    np.testing.assert_array_equal(a.ravel(), np.arange(5.0) > 0)
    np.testing.assert_array_equal(b, np.maximum(np.arange(5.0), 1))
    assert counts == {"all_reduce": 1}
    np.testing.assert_array_equal(pick, [10.0, 2.0])
    np.testing.assert_array_equal(c, [0.0, 10.0, 2.0, 3.0, 4.0])  # numpy: the view writes c


def test_a_pick_outlives_its_root():
    """A pick holds its root weakly: with the root gone it reduces itself."""
    import gc

    def body(mesh):
        A = make_input(np.arange(12.0).reshape(4, 3), mesh, [S0])
        v = A[2][1]
        del A
        gc.collect()
        return float(v)

    assert on((2,), body) == 7.0


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (4,), (2, 2), (1, 2)], ids=str)
def test_a_pick_is_a_copy_on_every_rank(mesh_shape):
    """A pick of a split axis (``x[1:-1, 2]`` with the columns split) is Partial: the rank
    holding the column has its values, the others zeros. It is a copy on every rank, so a
    later write into x changes it on no rank (as docs/concepts.md says of copies) and every
    rank agrees that its remembered value still holds: it had been a view of x's shard on
    the holding rank alone, whose value followed x's write while the others kept theirs,
    and whose move memo was dropped there alone (that rank reduced it again while the
    others did not: a hang, or another rank's data)."""

    def body(mesh):
        split = [dt.Shard(1) if n > 1 else R for n in mesh.shape]
        x = make_input(np.arange(30.0).reshape(6, 5), mesh, split)
        y = x[1:-1, 2]
        y[...] = -7.0  # written through to x
        first = y.numpy()
        x[...] = x * 2 + 1
        with dt.CommCounter() as cc:
            second = y.numpy()
        z = x[2:4, 4]
        before = z.numpy()
        x[...] = 0.0
        return first, second, cc.counts, before, z.numpy(), x.numpy()

    first, second, counts, before, after, x = on(mesh_shape, body)
    np.testing.assert_array_equal(first, [-7.0] * 4)
    np.testing.assert_array_equal(second, [-7.0] * 4)  # a copy: x's later write is not seen
    assert counts == {}  # its reduced value still holds, on every rank
    np.testing.assert_array_equal(before, [29.0, 39.0])  # (2 * [14, 19] + 1)
    np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(x, np.zeros((6, 5)))
