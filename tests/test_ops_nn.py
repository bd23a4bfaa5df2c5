"""nn ops (layer_norm, embedding, cross_entropy, attention_softmax) and the nn rules, against
numpy in float64.

Each grid runs on simulated ranks over meshes (1), (2), (3), (4), (2, 2): every input placement
the op admits (Shard of each axis, Replicate, asymmetric Partials), even, uneven and empty
shards. Collectives are asserted where the design promises none, or only per-row statistics.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from op_cases import every_rank
from spmd_cases import make_source

import disttensor as dt
from disttensor.spmd import TensorSpec, infer_forward

S0, S1, S2, R, P = dt.Shard(0), dt.Shard(1), dt.Shard(2), dt.Replicate(), dt.Partial()
MESHES = [(1,), (2,), (3,), (4,), (2, 2)]


def _mesh(shape) -> dt.ProcessMesh:
    return dt.ProcessMesh(np.arange(math.prod(shape)).reshape(shape))


def _grid(ndim: int, mesh: dt.ProcessMesh, partials=("sum",)) -> list[list]:
    """Every placement list: Shard of each axis, Replicate, and (on 1-D meshes, where they
    are cheap to enumerate) the given Partials; Partial(sum) on 2-D meshes."""
    opts = [dt.Shard(d) for d in range(ndim)] + [R]
    opts += [dt.Partial(t) for t in (partials if mesh.ndim == 1 else partials[:1])]
    return [list(p) for p in itertools.product(opts, repeat=mesh.ndim)]


def _close(got, want, what) -> None:
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=str(what))


def _sim(mesh_shape, case) -> int:
    """Run ``case(mesh)`` on as many simulated ranks as the mesh has; the number of checks."""
    return every_rank(dt.simulate(math.prod(mesh_shape), lambda: case(_mesh(mesh_shape))))


# -- numpy references -------------------------------------------------------------------------
def ref_layer_norm(x, w, b, begin, eps):
    axes = tuple(range(begin, x.ndim))
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def ref_cross_entropy(logits, labels, axis, reduction):
    m = logits.max(axis, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(axis, keepdims=True)) + m
    picked = np.take_along_axis(logits - lse, np.expand_dims(labels, axis), axis)
    loss = -picked.squeeze(axis)
    return loss if reduction == "none" else getattr(loss, reduction)()


# -- layer_norm -------------------------------------------------------------------------------
def case_layer_norm(mesh: dt.ProcessMesh) -> int:
    k, n = max(mesh.shape), 0
    rng = np.random.default_rng(0)
    shapes = [((2 * k, 4), -1), ((k + 1, 5), 1), ((1, k + 1), -1), ((0, 3), 1)]
    shapes += [((3, k + 1, 2), 1), ((2, 3, k + 1), -1)]
    for shape, begin in shapes:
        g = rng.normal(2, 3, shape)
        w, b = rng.normal(size=g.shape[begin:]), rng.normal(size=g.shape[begin:])
        for src in _grid(g.ndim, mesh):
            # take turns: no affine; weight Replicate; weight split on its first axis. The
            # bias is a plain numpy array (so Replicate) whenever there is a weight.
            turn = n % 3
            wt = None if turn == 0 else dt.shard_tensor(w, mesh, [(R, R, S0)[turn]] * mesh.ndim)
            bt = None if turn == 0 else b
            x = make_source(g, mesh, src, seed=n)
            got = dt.layer_norm(x, wt, bt, begin_norm_axis=begin, epsilon=1e-3)
            want = ref_layer_norm(g, None if turn == 0 else w, bt, begin % g.ndim, 1e-3)
            _close(got.numpy(), want, (mesh.shape, shape, begin, src, turn))
            n += 1
    return n


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_layer_norm_grid(mesh_shape):
    assert _sim(mesh_shape, case_layer_norm) > 0


def case_layer_norm_comm(mesh: dt.ProcessMesh) -> None:
    rows, hidden = 6, 64 * mesh.size
    g = np.random.default_rng(1).normal(size=(rows, hidden))
    w = dt.shard_tensor(np.ones(hidden), mesh, [R])
    # batch split: the fused op runs locally
    x = dt.shard_tensor(g, mesh, [S0])
    with dt.CommCounter() as cc:
        y = dt.layer_norm(x, w)
    assert cc.total == 0 and y.placements == [S0], cc
    # hidden split: the composite keeps it split; only per-row statistics travel
    x = dt.shard_tensor(g, mesh, [S1])
    with dt.CommCounter() as cc:
        y = dt.layer_norm(x, w)
    assert y.placements == [S1] and 0 < cc.total_bytes <= 4 * rows * 8, cc
    _close(y.numpy(), ref_layer_norm(g, None, None, 1, 1e-5), "hidden split")


def test_layer_norm_communication():
    dt.simulate(4, case_layer_norm_comm, _mesh((4,)))


# -- embedding --------------------------------------------------------------------------------
def case_embedding(mesh: dt.ProcessMesh) -> int:
    k, n = max(mesh.shape), 0
    rng = np.random.default_rng(2)
    # vocab even / uneven / fewer rows than ranks (empty row shards); dim 3 splits unevenly
    for vocab, ids_shape in [(2 * k, (k + 1,)), (k + 1, (2, k + 1)), (max(k - 1, 1), (3, 1))]:
        table = rng.normal(size=(vocab, 3))
        ids = rng.integers(-vocab, vocab, ids_shape)  # negatives count from the end, as numpy
        for ids_src, w_src in itertools.product(
            _grid(ids.ndim, mesh), _grid(2, mesh, ("sum", "avg"))
        ):
            got = dt.embedding(make_source(ids, mesh, ids_src), make_source(table, mesh, w_src))
            _close(got.numpy(), table[ids], (mesh.shape, ids_shape, vocab, ids_src, w_src))
            n += 1
    return n


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_embedding_grid(mesh_shape):
    assert _sim(mesh_shape, case_embedding) > 0


def case_embedding_comm(mesh: dt.ProcessMesh) -> None:
    table = np.arange(30.0).reshape(5, 6)  # 5 rows over 4 ranks: one empty row shard
    ids = np.array([[4, 0, 3], [1, 1, 2]])
    for w_src, out in [([S1], [S2]), ([S0], [P])]:
        w = dt.shard_tensor(table, mesh, w_src)
        with dt.CommCounter() as cc:
            y = dt.embedding(ids, w)
        assert cc.total == 0 and y.placements == out, (w_src, cc, y.placements)
        _close(y.numpy(), table[ids], w_src)


def test_embedding_communication():
    dt.simulate(4, case_embedding_comm, _mesh((4,)))


# -- cross_entropy ----------------------------------------------------------------------------
def case_cross_entropy(mesh: dt.ProcessMesh) -> int:
    k, n = max(mesh.shape), 0
    rng = np.random.default_rng(3)
    # (logits shape, class axis): even / uneven classes, fewer classes than ranks (empty class
    # shards), the class axis first or in the middle, an empty batch
    cases = [((2 * k, 2 * k + 1), 1), ((k + 1, max(k - 1, 1)), 1), ((k + 1, 3), 0)]
    cases += [((2, k + 1, 3), 1), ((0, k), 1)]
    for shape, axis in cases:
        g = rng.normal(0, 3, shape)
        classes = shape[axis]
        labels = rng.integers(-classes, classes, shape[:axis] + shape[axis + 1 :])
        grid = itertools.product(_grid(g.ndim, mesh, ("sum", "max")), _grid(labels.ndim, mesh))
        for x_src, l_src in grid:
            red = ("mean", "sum", "none")[n % 3] if g.size else "sum"  # mean of nothing: nan
            x, lab = make_source(g, mesh, x_src), make_source(labels, mesh, l_src, seed=n)
            got = dt.cross_entropy(x, lab, axis=axis - g.ndim * (n % 2), reduction=red)
            want = np.asarray(ref_cross_entropy(g, labels, axis, red))
            _close(got.numpy(), want, (mesh.shape, shape, axis, x_src, l_src, red))
            n += 1
    return n


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_cross_entropy_grid(mesh_shape):
    assert _sim(mesh_shape, case_cross_entropy) > 0


def case_cross_entropy_comm(mesh: dt.ProcessMesh) -> None:
    """Vocabulary-parallel: the logits stay put, only O(batch) statistics move."""
    batch, classes = 8, 256
    g = np.random.default_rng(4).normal(size=(batch, classes))
    labels = np.arange(batch) * 31 % classes
    x = dt.shard_tensor(g, mesh, [S1])
    with dt.CommCounter() as cc:
        loss = dt.cross_entropy(x, labels)
    assert cc["all_to_all"] == 0 and 0 < cc.total_bytes <= 6 * batch * 8, cc
    _close(loss.numpy(), ref_cross_entropy(g, labels, -1, "mean"), "vocabulary-parallel")
    # batch split, classes whole: the fused op, no communication until the mean is read
    x = dt.shard_tensor(g, mesh, [S0])
    with dt.CommCounter() as cc:
        loss = dt.cross_entropy(x, dt.shard_tensor(labels, mesh, [S0]), reduction="none")
    assert cc.total == 0 and loss.placements == [S0], cc


def test_cross_entropy_communication():
    dt.simulate(4, case_cross_entropy_comm, _mesh((4,)))


# -- edges: ranks outside the mesh, plain numpy inputs, bad input ------------------------------
def case_outside_mesh(world: int) -> None:
    """Rank 2 is not in the (2,) mesh: it skips the kernels and gets empty shards."""
    mesh = dt.ProcessMesh([0, 1])
    g = np.random.default_rng(5).normal(size=(3, 5))
    labels = np.array([4, 0, 2])
    outs = [
        (dt.layer_norm(dt.shard_tensor(g, mesh, [S1])), ref_layer_norm(g, None, None, 1, 1e-5)),
        (dt.embedding(labels % 3, dt.shard_tensor(g, mesh, [S0])), g[labels % 3]),
        (
            dt.cross_entropy(dt.shard_tensor(g, mesh, [S1]), labels),
            ref_cross_entropy(g, labels, 1, "mean"),
        ),
        (
            dt.cross_entropy(dt.shard_tensor(g, mesh, [S0]), labels),
            ref_cross_entropy(g, labels, 1, "mean"),
        ),
    ]
    for i, (got, want) in enumerate(outs):
        if dt.get_rank() in mesh:
            _close(got.numpy(), np.asarray(want), i)
        else:
            assert got.local_shape == (0,) * got.ndim


def test_outside_mesh():
    dt.simulate(3, case_outside_mesh, 3)


def test_plain_numpy_inputs():
    """With no DistTensor the ops are plain numpy functions."""
    g = np.random.default_rng(6).normal(size=(4, 6))
    labels = np.array([5, 0, -1, 2])
    _close(dt.layer_norm(g, np.ones(6), np.zeros(6)), ref_layer_norm(g, None, None, 1, 1e-5), "")
    _close(dt.embedding([[1, 3]], g), g[[[1, 3]]], "")
    for red in ("mean", "sum", "none"):
        _close(
            np.asarray(dt.cross_entropy(g, labels, reduction=red)),
            np.asarray(ref_cross_entropy(g, labels, 1, red)),
            red,
        )


def case_bad_input(_: int) -> None:
    mesh = dt.ProcessMesh([0, 1])
    x = dt.shard_tensor(np.zeros((4, 6)), mesh, [S0])
    rep = dt.shard_tensor(np.zeros((4, 6)), mesh, [R])  # every rank checks every index
    bad = [
        (ValueError, "normalized shape", lambda: dt.layer_norm(x, np.ones(4))),
        (ValueError, "out of range", lambda: dt.layer_norm(x, begin_norm_axis=2)),
        (TypeError, "integer", lambda: dt.embedding(np.array([0.5]), x)),
        (ValueError, "2-D", lambda: dt.embedding(np.array([0]), np.zeros(3))),
        (ValueError, "reduction", lambda: dt.cross_entropy(x, np.zeros(4, int), reduction="avg")),
        (ValueError, "without the class axis", lambda: dt.cross_entropy(x, np.zeros(6, int))),
        (TypeError, "integer", lambda: dt.cross_entropy(x, np.zeros(4))),
        (IndexError, "out of range", lambda: dt.cross_entropy(rep, np.array([0, 1, 6, 2]))),
        (IndexError, "out of range", lambda: dt.embedding(np.array([[4]]), x)),
    ]
    for exc, words, call in bad:
        with pytest.raises(exc, match=words):
            call()


def test_bad_input():
    """Clear errors, raised alike on every rank (argument checks come before any collective;
    the index checks are local, on indices every rank holds here)."""
    dt.simulate(2, case_bad_input, 2)


# -- attention_softmax ---------------------------------------------------------------------------
def ref_attention(s, scale, causal):
    v = s * scale
    if causal:
        v = np.where(np.tril(np.ones(s.shape[-2:], bool)), v, -np.inf)
    e = np.exp(v - v.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def case_attention(mesh: dt.ProcessMesh) -> int:
    """Every placement of (batch, heads, queries, keys) scores, causal or not, square or not:
    the values; and no collective at all, forward and backward, where no mesh dim splits
    what the rule needs whole (the keys; the queries too under the causal mask) and nothing
    is Partial (Note [Attention scores] in ops/nn.py)."""
    k, n = max(mesh.shape), 0
    rng = np.random.default_rng(5)
    for shape, causal in (
        ((2, k + 1, 5, 5), True),
        ((k + 1, 2, 3, 4), False),
        ((1, k, 1, 1), True),
    ):
        g = rng.normal(0, 2, shape)
        cot = rng.normal(size=shape)
        whole = (2, 3) if causal else (3,)
        for src in _grid(4, mesh):
            x = make_source(g, mesh, src, seed=n).requires_grad_()
            with dt.CommCounter() as cc:
                y = dt.ops.nn.attention_softmax(x, 0.25, causal)
                y.backward(grad=cot)
            what = (mesh.shape, shape, causal, src)
            _close(y.numpy(), ref_attention(g, 0.25, causal), what)
            moved = [
                p.is_partial() or (p.is_shard() and p.dim in whole)
                for p, size in zip(src, mesh.shape)
                if size > 1
            ]
            if not any(moved):  # heads and batch stay split; nothing moves
                kept = [p if size > 1 else R for p, size in zip(src, mesh.shape)]
                assert cc.total == 0 and y.placements == kept, (what, cc.counts)
            n += 1
    return n


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_attention_softmax_grid(mesh_shape):
    assert _sim(mesh_shape, case_attention) > 0


def case_attention_block(mesh: dt.ProcessMesh):
    """dt.nn.MultiHeadAttention runs scale, mask and softmax as one op and its gradient as
    one: no where, no mask table, no separate softmax on the tape."""
    attn = dt.nn.MultiHeadAttention(8, 2, seed=0, dtype=np.float64, mesh=mesh)
    x = dt.shard_tensor(np.random.default_rng(6).normal(size=(2, 5, 8)), mesh, [R])
    y = attn(x)
    names, stack = set(), [y]
    while stack:
        t = stack.pop()
        if t._node is not None and t._node[0].name not in names:
            names.add(t._node[0].name)
            stack.extend(i for i in t._node[0].inputs if i is not None)
    return names


def test_attention_block_uses_the_fused_op():
    names = dt.simulate(1, case_attention_block, _mesh((1,)))[0]
    assert "attention_softmax" in names and not {"where", "softmax", "multiply"} & names, names


# -- the rules, in a single process --------------------------------------------------------------
def _infer(op, specs, mesh_shape, **attrs):
    ins, outs = infer_forward(op, [TensorSpec(s, p) for s, p in specs], mesh_shape, **attrs)
    return ins, outs


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_rules(op):
    assert _infer(op, [((8, 6), [S0])], (2,), axis=-1) == ([[S0]], [[S0]])
    # a split softmax axis stays split: the composite all-reduces per-row statistics
    # (Note [Row-wise rules] in spmd/nn_rules.py)
    assert _infer(op, [((8, 6), [S1])], (2,), axis=-1) == ([[S1]], [[S1]])
    ins, outs = _infer(op, [((8, 6), [P])], (2,), axis=1)  # not linear: Partial resolved
    assert not ins[0][0].is_partial() and ins[0][0] != S1 and outs == ins
    assert _infer(op, [((8, 6), [S0, S1])], (2, 2), axis=1) == ([[S0, S1]], [[S0, S1]])
    assert _infer(op, [((8, 6), [S1, P])], (2, 2), axis=1) == ([[S1, R]], [[S1, R]])
    assert _infer(op, [((8, 6), [S0])], (4,), axis=None) == ([[S0]], [[S0]])  # composite
    assert _infer(op, [((8, 6, 4), [S1])], (4,), axis=(0, 2)) == ([[S1]], [[S1]])


def test_logsumexp_and_gradient_rules():
    assert _infer("logsumexp", [((8, 6), [S0])], (2,), axis=1) == ([[S0]], [[S0]])
    assert _infer("logsumexp", [((8, 6), [S0])], (2,), axis=-1, keepdims=True) == (
        [[S0]],
        [[S0]],
    )
    # a split reduced axis stays split (the composite); the output is Replicate there
    assert _infer("logsumexp", [((8, 6), [S1])], (2,), axis=1) == ([[S1]], [[R]])
    assert _infer("logsumexp", [((8, 6), [S0, S1])], (2, 2), axis=None) == ([[S0, S1]], [[R, R]])
    assert _infer("logsumexp", [((8, 6, 4), [S1, S0])], (2, 2), axis=(0, 2)) == (
        [[S1, S0]],
        [[S0, R]],
    )
    ins, outs = _infer("logsumexp", [((8, 6), [P])], (2,), axis=0)
    assert not ins[0][0].is_partial() and not outs[0][0].is_partial()
    # the fused gradients: the reduced axes whole, a Partial gradient resolved
    g = ((8, 6), [P])
    ins, outs = _infer("softmax_grad", [g, ((8, 6), [S0])], (2,), axis=1)
    assert ins == [[S0], [S0]] and outs == [[S0]]
    ins, _ = _infer("log_softmax_grad", [((8, 6), [S1]), ((8, 6), [S1])], (2,), axis=1)
    assert S1 not in ins[0] + ins[1]
    rows = ((8,), [S0])
    assert _infer("logsumexp_grad", [rows, ((8, 6), [S0]), rows], (2,), axis=1) == (
        [[S0], [S0], [S0]],
        [[S0]],
    )
    kept = ((8, 1), [S0])
    assert _infer("logsumexp_grad", [kept, ((8, 6), [R]), kept], (2,), axis=1, keepdims=True) == (
        [[S0], [S0], [S0]],
        [[S0]],
    )


def test_attention_softmax_rule():
    heads = ((2, 4, 6, 6), [S1])
    assert _infer("attention_softmax", [heads], (2,), causal=True) == ([[S1]], [[S1]])
    assert _infer("attention_softmax", [((2, 4, 6, 6), [S0, S1])], (2, 2), causal=True) == (
        [[S0, S1]],
        [[S0, S1]],
    )
    # split queries: kept without the mask, made whole with it; keys are always made whole
    assert _infer("attention_softmax", [((2, 4, 6, 6), [S2])], (2,), causal=False)[1] == [[S2]]
    for src, causal in ((S2, True), (dt.Shard(3), False), (P, True)):
        ins, outs = _infer("attention_softmax", [((2, 4, 6, 6), [src])], (2,), causal=causal)
        p = ins[0][0]
        assert not p.is_partial() and p not in (S2, dt.Shard(3)) and outs == ins, (src, p)
    with pytest.raises(ValueError, match="two axes"):
        _infer("attention_softmax", [((6,), [R])], (2,))


def test_layer_norm_rule():
    x, w = ((4, 6, 8), [S0, S1]), ((8,), [R, R])
    assert _infer("layer_norm", [x, w, w], (2, 2), begin_norm_axis=2) == (
        [[S0, S1], [R, R], [R, R]],
        [[S0, S1]],
    )
    # normalized axes split by mesh dim 1: kept split there (the composite route), the
    # weight split alike; mesh dim 0 decides as the fused kernel would
    ins, outs = _infer("layer_norm", [x, ((6, 8), [R, S0])], (2, 2), begin_norm_axis=1)
    assert ins == [[S0, S1], [R, S0]] and outs == [[S0, S1]]
    ins, outs = _infer("layer_norm", [((4, 6), [S1]), ((6,), [R])], (2,))
    assert ins == [[S1], [S0]] and outs == [[S1]]
    ins, outs = _infer("layer_norm", [((4, 6), [P])], (2,))
    assert not ins[0][0].is_partial() and ins[0][0] != S1 and outs == ins
    with pytest.raises(ValueError, match="normalized shape"):
        _infer("layer_norm", [((4, 6), [R]), ((4,), [R])], (2,))


def test_embedding_rule():
    ids, table = ((5, 7), [R]), ((100, 16), [S0])
    assert _infer("embedding", [ids, table], (4,)) == ([[R], [S0]], [[P]])
    assert _infer("embedding", [ids, ((100, 16), [S1])], (4,)) == ([[R], [S1]], [[S2]])
    assert _infer("embedding", [((5, 7), [S1]), ((100, 16), [R])], (4,)) == (
        [[S1], [R]],
        [[S1]],
    )
    # data parallel ids on "dp", vocabulary-parallel table on "mp"
    assert _infer("embedding", [((5, 7), [S0, R]), ((100, 16), [R, S0])], (2, 2)) == (
        [[S0, R], [R, S0]],
        [[S0, P]],
    )
    # Partial ids are indices, not values: resolved first; a Partial table passes through
    assert not _infer("embedding", [((5, 7), [P]), ((100, 16), [R])], (2,))[0][0][0].is_partial()
    assert _infer("embedding", [((5, 7), [R]), ((100, 16), [P])], (2,))[1] == [[P]]


def test_cross_entropy_rules():
    logits, labels = ((8, 50), [S0]), ((8,), [R])
    assert _infer("cross_entropy", [logits, labels], (2,)) == ([[S0], [S0]], [[S0]])
    assert _infer("cross_entropy", [logits, labels], (2,), reduction="mean")[1] == [
        [dt.Partial("avg")]
    ]
    # vocabulary-parallel: the logits stay split, the labels are whole, the loss Partial(sum)
    assert _infer("cross_entropy", [((8, 50), [S1]), labels], (2,), axis=-1) == (
        [[S1], [R]],
        [[P]],
    )
    assert _infer("cross_entropy", [((8, 50), [R, S1]), ((8,), [S0, R])], (2, 2)) == (
        [[S0, S1], [S0, R]],
        [[S0, P]],
    )
    # the vocabulary-parallel pick of the composite: the owner of each class picks
    assert _infer("take_labels", [((8, 50), [S1]), labels], (2,), axis=1) == (
        [[S1], [R]],
        [[P]],
    )
    with pytest.raises(ValueError, match="without the class axis"):
        _infer("cross_entropy", [((8, 50), [R]), ((50,), [R])], (2,))


def test_registered():
    assert {
        *("cross_entropy", "embedding", "layer_norm", "log_softmax", "softmax", "logsumexp"),
        *("softmax_grad", "log_softmax_grad", "logsumexp_grad", "attention_softmax"),
    } <= set(dt.spmd.registered_ops())
