"""Writes as numpy does (disttensor/ops/mutation.py): the grid of tests/mutation_cases.py on
simulated ranks, and the accounting of communication outside rules."""

from __future__ import annotations

import logging

import mutation_cases
import numpy as np
import pytest
from op_cases import S0, every_rank, make_input

import disttensor as dt
from disttensor import accounting


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_mutation_grid(world):
    """Meshes (1), (2), (3), (4), (2, 2) (those fitting the world), every target placement."""
    counts = dt.simulate(world, mutation_cases.case_mutation, world, exact_size=True)
    assert min(counts) > 100


def test_partial_target_written_as_its_value():
    """Note [Writes keep the layout]: a Partial(sum) target stays Partial(sum) and reads back
    the written value (off coordinate 0 the written region holds zeros)."""

    def body():
        mesh = dt.ProcessMesh([0, 1])
        x = make_input(np.arange(12.0).reshape(4, 3), mesh, [dt.Partial()])
        x[1:3, 1] = np.array([-1.0, -2.0])
        return x.placements, x.to_local()[1:3, 1].tolist(), x.numpy()

    (p0, local0, value), (p1, local1, _) = dt.simulate(2, body)
    want = np.arange(12.0).reshape(4, 3)
    want[1:3, 1] = [-1.0, -2.0]
    assert p0 == p1 == [dt.Partial()]
    assert local0 == [-1.0, -2.0] and local1 == [0.0, 0.0]
    np.testing.assert_array_equal(value, want)


def test_operator_updates_write_in_place_with_one_reduction():
    """``w -= lr * g`` with g Partial (a gradient before its reduction) and w Replicate: one
    all-reduce, the result written into w's own array (views of it see the update, its
    spec stays), the values numpy's; ``x *= 2`` on a split x and ``x /= y`` communicate
    nothing; a float into an int target raises a casting TypeError, as numpy does."""

    def body():
        mesh = dt.ProcessMesh([0, 1])
        w = dt.shard_tensor(np.arange(6.0), mesh, [dt.Replicate()])
        g = dt.shard_tensor(np.full(6, 0.5), mesh, [dt.Partial()])  # the value 0.5
        x = dt.shard_tensor(np.arange(8.0), mesh, [dt.Shard(0)])
        y = dt.shard_tensor(np.arange(8.0) + 1, mesh, [dt.Shard(0)])
        local, spec, view = w.to_local(), w._spec, w[1:3]
        counts = []
        for _ in range(3):
            with dt.CommCounter() as cc:
                w -= 0.1 * g
                x *= 2
                x /= y
            counts.append(dict(cc.counts))
        try:
            i = dt.shard_tensor(np.arange(4), mesh, [dt.Shard(0)])
            i += 0.5
            err = None
        except Exception as e:  # the type is the assertion
            err = type(e).__name__
        return (w.to_local() is local, w._spec is spec, w.numpy(), view.numpy(), x.numpy(),
                counts, err)  # fmt: skip

    want_w = np.arange(6.0) - 3 * 0.1 * 0.5
    want_x = np.arange(8.0)
    for _ in range(3):
        want_x = want_x * 2 / (np.arange(8.0) + 1)
    for same, spec, w, view, x, counts, err in dt.simulate(2, body):
        assert same and spec
        np.testing.assert_allclose(w, want_w, rtol=1e-15)
        np.testing.assert_allclose(view, want_w[1:3], rtol=1e-15)
        np.testing.assert_allclose(x, want_x, rtol=1e-15)
        assert counts == [{"all_reduce": 1}] * 3, counts
        assert err in ("TypeError", "UFuncTypeError"), err  # numpy: a TypeError subclass


@pytest.mark.parametrize("mesh_shape", [(1,), (2,), (3,), (4,), (2, 2)])
def test_repeated_in_place_operators_skip_the_out_of_place_op(mesh_shape, monkeypatch):
    """From the second ``x += y`` of one pair of tensors (or of a tensor and a Python scalar)
    on, the kept decision writes numpy's in-place ufunc into x's own buffer: no op call (no
    out-of-place result to copy), no communication, numpy's values; a Partial x with a
    Partial y of its layout too. The first call decides through the op."""
    from disttensor import dispatch

    calls = []
    real = dispatch.Op.__call__

    def counted(op, *args, **attrs):
        calls.append(dt.get_rank())  # the simulated ranks are threads: each counts its own
        return real(op, *args, **attrs)

    def body():
        mesh = dt.ProcessMesh(np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape))
        rest = [dt.Replicate()] * (mesh.ndim - 1)
        x = make_input(np.arange(35.0).reshape(7, 5), mesh, [S0] + rest)
        y = make_input(np.full((7, 5), 2.0), mesh, [S0] + rest)
        p = make_input(np.ones((7, 5)), mesh, [dt.Partial()] + rest)
        q = make_input(np.full((7, 5), 0.5), mesh, [dt.Partial()] + rest)
        local, plocal = x._local, p._local
        x += y  # each decided through the op
        x -= 1.5
        x *= 3
        x /= y
        p += q
        before = calls.count(dt.get_rank())
        with dt.CommCounter() as cc:
            for _ in range(2):
                x += y
                x -= 1.5
                x *= 3
                x /= y
                p += q
        ops = calls.count(dt.get_rank()) - before
        return x.numpy(), p.numpy(), ops, cc.counts, x._local is local, p._local is plocal

    monkeypatch.setattr(dispatch.Op, "__call__", counted)
    want = np.arange(35.0).reshape(7, 5)
    for _ in range(3):
        want = (want + 2 - 1.5) * 3 / 2
    for x, p, ops, counts, same, psame in dt.simulate(int(np.prod(mesh_shape)), body):
        np.testing.assert_allclose(x, want, rtol=1e-15)
        np.testing.assert_allclose(p, np.full((7, 5), 2.5), rtol=1e-15)  # 1 + 3 * 0.5
        assert ops == 0, f"{ops} op calls in the repeated in-place operators"
        assert counts == {} and same and psame, (counts, same, psame)


@pytest.mark.parametrize("mesh_shape", [(1,), (2,), (3,), (4,), (2, 2)])
def test_in_place_operators_reduce_a_partial_operand_first(mesh_shape):
    """``w -= u``, ``w += u``, ``w *= u``, ``w /= u`` with u Partial (sum or max) and w not
    Partial, of one float dtype: u is reduced to w's layout first (numpy's order: the value
    of u, then the op), one collective, an all-reduce into a whole target and a
    reduce-scatter into a split one (uneven and empty shards included; nothing on one
    rank); the result is written into w's own array and its values are numpy's on the
    gathered inputs, bit for bit. An int target and a float Partial raise numpy's casting
    error before any move."""
    from op_cases import on_mesh

    rng = np.random.default_rng(5)
    ops = {"-=": np.subtract, "+=": np.add, "*=": np.multiply, "/=": np.true_divide}
    cases = [  # (shape, target is split, Partial kind, operator, w's value, u's value)
        (shape, split, kind, name, rng.standard_normal(shape) + 3.0,
         np.round(rng.standard_normal(shape) * 8) / 8 + 4.0)  # Partial sums of it are exact
        for shape in ((7,), (1, 3))  # (1, 3) split by rows: empty shards
        for split in (False, True)
        for kind in ("sum", "max")
        for name in ops
    ]  # fmt: skip

    def body(mesh):
        rest = [dt.Replicate()] * (mesh.ndim - 1)
        out = []
        for _, split, kind, name, wv, uv in cases:
            target = [dt.Shard(0) if split else dt.Replicate(), *rest]
            w = make_input(wv, mesh, target)
            u = make_input(uv, mesh, [dt.Partial(kind), *rest])
            local = w.to_local()
            with dt.CommCounter() as cc:
                if name == "-=":
                    w -= u
                elif name == "+=":
                    w += u
                elif name == "*=":
                    w *= u
                else:
                    w /= u
            out.append((w.to_local() is local, w.placements == target, dict(cc.counts),
                        w.numpy()))  # fmt: skip
        # an int target and a float Partial: numpy's casting error, before anything moves
        i = make_input(np.arange(7), mesh, [dt.Replicate(), *rest])
        u = make_input(np.full(7, 0.5), mesh, [dt.Partial(), *rest])
        with dt.CommCounter() as cc:
            try:
                i -= u
                err = None
            except TypeError as e:  # numpy's UFuncTypeError is one
                err = str(e)
        return out, (err, cc.total, i.numpy())

    got, (err, total, unchanged) = on_mesh(mesh_shape, body)
    assert err is not None and "Cannot cast" in err and total == 0, (err, total)
    np.testing.assert_array_equal(unchanged, np.arange(7))
    for (shape, split, kind, name, wv, uv), (same, kept, counts, value) in zip(cases, got):
        where = f"{name} {shape} {'split' if split else 'whole'} target, Partial({kind!r})"
        assert same and kept, where
        np.testing.assert_array_equal(value, ops[name](wv, uv), err_msg=where)
        moves = "reduce_scatter" if split and mesh_shape[0] > 1 else "all_reduce"
        assert counts == ({} if mesh_shape == (1,) else {moves: 1}), (where, counts)


def test_writes_report_what_gathers():
    """Note [Communication outside rules]: a write whose key or value has no rule shows in
    CommCounter().fallbacks and dt.fallback_report(); a local write shows nothing."""

    def body():
        mesh = dt.ProcessMesh([0, 1])
        x = make_input(np.arange(12.0).reshape(4, 3), mesh, [S0])
        with dt.CommCounter() as local:
            x[x > 5] = 0.0
            x[1:3] = 2.0
        with dt.CommCounter() as gathered:
            x[np.array([0, 3]), np.array([1, 2])] = make_input(np.ones(2), mesh, [S0])
            w = np.zeros(3)
            w += x[0]
        return local.fallbacks, gathered.fallbacks

    local, gathered = every_rank(dt.simulate(2, body))
    assert local == {}
    assert ("setitem", "the value of an integer-array or boolean write: gathered") in gathered
    assert ("add (out=)", "a numpy output array: the global value gathered") in gathered
    report = dt.fallback_report()
    assert any(r.op == "setitem" and r.calls >= 2 for r in report.rows)
    assert "reason" in str(report)


def test_fallback_logged_once_per_op_and_reason_on_rank_0(caplog):
    def body():
        mesh = dt.ProcessMesh([0, 1, 2])
        x = make_input(np.arange(9.0), mesh, [S0])
        np.unwrap(x)
        np.unwrap(x)
        np.unwrap(x, discont=2.0)

    accounting._LOGGED.discard(
        ("unwrap", "no dt implementation: inputs gathered, computed whole on every rank")
    )
    with caplog.at_level(logging.WARNING, logger="disttensor"):
        dt.simulate(3, body)
    logged = [r for r in caplog.records if "unwrap" in r.getMessage()]
    assert len(logged) == 1 and logged[0].threadName == "dt-rank-0", logged


@pytest.mark.parametrize(
    "write,exc,match",
    [
        (lambda x: x.__setitem__((slice(None), 0), np.ones(3)), ValueError, "could not broadcast"),
        (lambda x: x.__setitem__(9, 1.0), IndexError, "out of bounds"),
        (lambda x: x.__setitem__(np.array([0, 9]), 1.0), IndexError, "out of bounds"),
        (lambda x: x.__iadd__(np.ones((2, 4, 3))), ValueError, "non-broadcastable output"),
        (lambda x: np.add(x, 1, out=np.zeros((2, 3))), ValueError, "non-broadcastable output"),
    ],
)
def test_bad_writes_raise_on_every_rank_and_change_nothing(write, exc, match):
    def body():
        mesh = dt.ProcessMesh([0, 1])
        x = make_input(np.arange(12.0).reshape(4, 3), mesh, [S0])
        with pytest.raises(exc, match=match):
            write(x)
        return x.numpy()

    got = every_rank(dt.simulate(2, body))
    np.testing.assert_array_equal(got, np.arange(12.0).reshape(4, 3))
