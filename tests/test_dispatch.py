"""dispatch.py's decision cache (Note [Dispatch fast path]): entries keyed by the identity of
live specs, gone with them, so a long training loop that makes new tensors every step keeps
the cache (and the memory it holds) flat, and a cached call still decides as a fresh one."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from mpirun import run_script

import disttensor as dt
from disttensor import dispatch
from disttensor.tensor import DistTensor


def _train(steps: int) -> list[int]:
    """A data-parallel MLP on 2 simulated ranks with a new input tensor every step; the
    decision cache's size every 50 steps (both ranks collect at the same step)."""

    def body():
        mesh = dt.init_mesh((2,), dim_names=["dp"])
        dt.manual_seed(0)
        model = dt.nn.Sequential(
            dt.nn.Linear(8, 8, mesh=mesh), dt.nn.Tanh(), dt.nn.Linear(8, 8, mesh=mesh)
        )
        wrapped = dt.DataParallel(model, mesh, dim="dp")
        opt = dt.optim.Adam(model.parameters(), lr=1e-3)
        sizes = []
        for step in range(steps):
            data = np.random.default_rng(step).standard_normal((6, 8)).astype(np.float32)
            x = dt.shard_tensor(data, mesh, [dt.Shard(0)])  # a new spec object each step
            loss = (wrapped(x) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            float(loss)
            if step % 50 == 0:  # both ranks between steps, after the cyclic collector
                dt.barrier()
                gc.collect()
                dt.barrier()
                sizes.append(len(dispatch._cache))
                dt.barrier()
        return sizes

    return dt.simulate(2, body)[0]


def test_the_decision_cache_stays_flat_over_a_training_run(monkeypatch):
    monkeypatch.setattr(dispatch, "_cache", {})
    gc.collect()
    sizes = _train(401)  # a spec kept per step would add about 1,200 entries
    # after the first steps the cache holds the entries of live tensors only: no growth
    assert max(sizes[2:]) <= sizes[1] + 10, sizes


def test_an_entry_dies_with_its_spec_and_a_new_tensor_decides_again(monkeypatch):
    monkeypatch.setattr(dispatch, "_cache", {})

    def body():
        mesh = dt.ProcessMesh([0, 1])
        # the first spec of a value stays: the decision by value keeps it in its key
        first = dt.shard_tensor(np.arange(6.0), mesh, [dt.Shard(0)])
        first * 2
        spec = first._spec.replace()  # an equal spec, a new object
        assert spec == first._spec and spec is not first._spec
        x = DistTensor(first.to_local().copy(), spec)
        del spec  # x holds it alone
        y = x * 2
        dt.barrier()  # the ranks share the cache: both past the product, then both past del
        before = len(dispatch._cache)
        dt.barrier()
        del x, y
        dt.barrier()
        after = len(dispatch._cache)
        z = dt.shard_tensor(np.arange(6.0), mesh, [dt.Replicate()])  # may reuse x's id
        return before, after, (z * 2).numpy(), list((z * 2).placements)

    before, after, value, placements = dt.simulate(2, body)[0]
    assert after < before  # x's spec freed: its identity entry removed
    np.testing.assert_array_equal(value, np.arange(6.0) * 2)
    assert placements == [dt.Replicate()]


def test_moves_that_relabel_size_one_mesh_dims_are_no_moves():
    """A rule that wants Replicate where a size-1 mesh dim is Shard or Partial gets the same
    local array: the plan moves nothing, so the fast path takes the next call; the values are
    numpy's, and nothing communicates."""

    def body():
        mesh = dt.init_mesh((2, 1), dim_names=["a", "b"])
        g = np.arange(24.0).reshape(6, 4)
        x = dt.shard_tensor(g, mesh, [dt.Replicate(), dt.Shard(0)])
        p = dt.shard_tensor(g, mesh, [dt.Replicate(), dt.Partial()])
        with dt.CommCounter() as cc:
            out = [x[1:-1, 1], x[1:-1, 1], np.exp(p), np.exp(p), p[2:, ::2]]
        mine = (x._spec, p._spec)  # the entries of these calls, not other tests'
        plans = [
            e.plan[3]
            for e in list(dispatch._cache.values())
            if isinstance(e, dispatch._Entry) and any(r() in mine for r in e.refs)
        ]
        return [o.numpy() for o in out], cc.counts, plans

    for values, counts, plans in dt.simulate(2, body):
        g = np.arange(24.0).reshape(6, 4)
        want = [g[1:-1, 1], g[1:-1, 1], np.exp(g), np.exp(g), g[2:, ::2]]
        for got, w in zip(values, want):
            np.testing.assert_allclose(got, w)
        assert counts == {}
        assert plans and all(m is None for m in plans), plans


FAST_MOVES = r"""
import numpy as np
import disttensor as dt
from disttensor import dispatch
from disttensor.tensor import DistTensor

calls = []
general = dispatch._general
dispatch._general = lambda op, *a: calls.append(op.name) or general(op, *a)
world = dt.get_world_size()
meshes = [(dt.ProcessMesh(list(range(world))), [[dt.Shard(0)]])]
if world == 4:  # (2, 2): split over either mesh dim, or over both
    grid = dt.ProcessMesh(np.arange(4).reshape(2, 2))
    split = [[dt.Shard(0), dt.Replicate()], [dt.Replicate(), dt.Shard(0)], [dt.Shard(0)] * 2]
    meshes.append((grid, split))
rng = np.random.default_rng(3)
configs = 0
for mesh, layouts in meshes:
    for placements in layouts:
        for n in (5, 3):  # uneven on 2 to 4 ranks; 3 on 4 ranks leaves a shard empty
            gA, gp, gq = rng.standard_normal((n, n)), rng.standard_normal(n), rng.standard_normal(n)
            A = dt.shard_tensor(gA, mesh, placements)
            rs = dt.shard_tensor(np.float64(2.0), mesh, [dt.Replicate()] * mesh.ndim)
            p = dt.shard_tensor(gp, mesh, placements)
            q = dt.shard_tensor(gq, mesh, placements)
            d0 = gp @ gq
            want = [2.0 / d0, d0 * d0, gA @ gp, gA @ gp, 2.0 / d0]
            before = (calls.count("divide"), calls.count("matmul"))
            counts = []
            for step in range(4):
                pi = DistTensor(p.to_local().copy(), p._spec)  # a new tensor of the same spec
                with dt.CommCounter() as cc:
                    d = pi @ q  # Partial: nothing moves
                    out = [rs / d, d * d, A @ pi, A @ pi, rs / d]
                counts.append(dict(cc.counts))
                if mesh.ndim == 1 and n == 5:  # the CG shapes: d reduced once (d * d and the
                    # second rs / d reuse it), pi gathered once, every step
                    assert counts[-1] == {"all_reduce": 1, "all_gather": 1}, (n, counts)
                for got, w in zip(out, want):
                    assert np.allclose(got.numpy(), w, rtol=1e-12, atol=0), (placements, n, step)
            # the fast path's steps move as the general path's first one did, less what the
            # first step moved of A, which A remembers (Note [One move per tensor])
            assert all(c == counts[1] for c in counts[2:]), (placements, n, counts)
            assert all(counts[0].get(k, 0) >= v for k, v in counts[1].items()), (n, counts)
            assert counts[1].get("all_reduce", 0) >= 1, (placements, n, counts)  # d, each step
            # the general path decided each call shape once: later calls moved on the fast path
            after = (calls.count("divide"), calls.count("matmul"))
            assert after == (before[0] + 1, before[1] + 2), (placements, n, before, after)
            configs += 1
assert configs == (2 if world != 4 else 8), configs
print("FAST MOVES OK", dt.get_rank())
"""


@pytest.mark.mpi
def test_the_fast_path_moves_inputs_as_the_general_path_does(tmp_path):
    """A plan that moves inputs in one step takes the fast path from its second call on
    (Note [Dispatch fast path]): each new tensor is still moved as on the first call (the
    Partial divisor reduced, the split vector gathered), a tensor already moved is not moved
    again, the values are numpy's, and the general path runs once per decision; on meshes
    (2), (3), (4) and (2, 2), uneven and empty shards. Under mpiexec: the simulated ranks of
    dt.simulate share one cache and take turns in its entries."""
    run_script(tmp_path / "script.py", FAST_MOVES, (2, 3, 4), "FAST MOVES OK")


def test_operators_take_the_fast_path_as_the_general_path_does(monkeypatch):
    """dispatch.binary (the operators' entry): repeated ``x + y``, ``2 * x``, ``x / d`` and the
    comparisons give numpy's values, dtypes and placements on every call, whether the call
    takes the operators' shortcut or not (the first call decides; a new dtype from the same
    specs and a gradient to record go through ``_call``), and a repeated call that moves
    nothing does not reach ``_call``."""
    g = np.arange(-3.0, 4.0)  # 7: uneven on 2 ranks
    generic = threading.local()  # per simulated rank
    real_call = dispatch._call

    def counting(*args, **attrs):
        generic.names.append(args[0].name)
        return real_call(*args, **attrs)

    def body():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(g, mesh, [dt.Shard(0)])
        y = dt.shard_tensor(g[::-1].copy(), mesh, [dt.Shard(0)])
        i = dt.shard_tensor(np.arange(7), mesh, [dt.Shard(0)])
        d = dt.shard_tensor(np.float64(2.5), mesh, [dt.Replicate()])
        calls = {
            "x + y": lambda: x + y, "x - y": lambda: x - y, "x * y": lambda: x * y,
            "x / y": lambda: x / y, "x ** 2": lambda: x**2, "2 ** x": lambda: 2**x,
            "2 * x": lambda: 2 * x, "1 - x": lambda: 1 - x, "3 / x": lambda: 3 / x,
            "x / d": lambda: x / d, "d * d": lambda: d * d, "i + 1": lambda: i + 1,
            "i + 1.5": lambda: i + 1.5, "i * 2": lambda: i * 2, "x < y": lambda: x < y,
            "x <= 0": lambda: x <= 0, "x > y": lambda: x > y, "x >= 1": lambda: x >= 1,
        }  # fmt: skip
        out = {}
        with np.errstate(divide="ignore", invalid="ignore"):
            for name, fn in calls.items():
                got = [fn() for _ in range(3)]
                out[name] = [(r.numpy(), r.dtype, r.placements) for r in got]
        w = dt.shard_tensor(g, mesh, [dt.Shard(0)], requires_grad=True)
        for _ in range(3):
            loss = (w * 2.0 + w).sum()
        loss.backward()
        out["grad"] = w.grad.numpy()
        generic.names = []
        dt.barrier()
        if dt.get_rank() == 0:
            monkeypatch.setattr(dispatch, "_call", counting)
        dt.barrier()
        x + y, 2 * x, x / d, d * d, 1 - x, x < y, i * 2  # the repeated calls once more
        out["generic"] = generic.names
        generic.names = []
        w * 2.0  # a gradient to record
        out["with grad"] = generic.names
        dt.barrier()
        return out

    for result in dt.simulate(2, body):
        with np.errstate(divide="ignore", invalid="ignore"):
            want = {
                "x + y": g + g[::-1], "x - y": g - g[::-1], "x * y": g * g[::-1],
                "x / y": g / g[::-1], "x ** 2": g**2, "2 ** x": 2**g, "2 * x": 2 * g,
                "1 - x": 1 - g, "3 / x": 3 / g, "x / d": g / 2.5, "d * d": np.float64(6.25),
                "i + 1": np.arange(7) + 1, "i + 1.5": np.arange(7) + 1.5,
                "i * 2": np.arange(7) * 2, "x < y": g < g[::-1], "x <= 0": g <= 0,
                "x > y": g > g[::-1], "x >= 1": g >= 1,
            }  # fmt: skip
        for name, value in want.items():
            for got, dtype, placements in result[name]:
                np.testing.assert_array_equal(got, value, err_msg=name)
                assert dtype == np.asarray(value).dtype, (name, dtype)
                assert placements == result[name][0][2], name
        np.testing.assert_array_equal(result["grad"], np.full(7, 3.0))
        assert result["generic"] == [] and result["with grad"] == ["multiply"], result


@pytest.mark.parametrize("mesh_shape", [(1,), (2,), (3,), (4,), (2, 2)])
def test_array_operands_take_the_fast_path_with_numpys_values(mesh_shape, monkeypatch):
    """A numpy array among an op's arguments (Note [Array operands of one spec]): repeated
    calls give numpy's values, dtypes and the first call's placements and lineage, and after
    the first they do not reach the general path, nor, through an operator (either side),
    ``_call``'s generic argument handling (``binary`` converts the array itself); a call with
    a gradient to record keeps it (its gradient is numpy's), and an array of another shape or
    dtype decides again."""
    labels = np.array([0, 2, 1, 4, 4, 3, 0])  # 7 rows: uneven, and an empty shard on 4 ranks
    X = np.arange(21.0).reshape(7, 3)
    k = np.arange(5)[None, :]
    mask = np.triu(np.full((3, 3), -1.0), k=1)
    general = threading.local()
    general.n = 0
    real = dispatch._general

    def counting(*args):
        general.n = getattr(general, "n", 0) + 1
        return real(*args)

    monkeypatch.setattr(dispatch, "_general", counting)
    generic = threading.local()
    real_call = dispatch._call

    def calling(*args, **attrs):
        generic.n = getattr(generic, "n", 0) + 1
        return real_call(*args, **attrs)

    monkeypatch.setattr(dispatch, "_call", calling)  # binary's fallback (Op() calls keep theirs)
    size = int(np.prod(mesh_shape))

    def body():
        mesh = dt.ProcessMesh(np.arange(size).reshape(mesh_shape))
        first = [dt.Shard(0)] + [dt.Replicate()] * (len(mesh_shape) - 1)
        lab = dt.shard_tensor(labels, mesh, first)
        x = dt.shard_tensor(X, mesh, first)
        s = dt.shard_tensor(X.T @ X, mesh, [dt.Replicate()] * len(mesh_shape))
        calls = {
            "onehot": (lambda: lab[:, None] == k, labels[:, None] == k),
            "masked": (lambda: s + mask, X.T @ X + mask),
            "reversed": (lambda: mask * s, mask * (X.T @ X)),
            "where": (lambda: np.where(mask < 0, s, mask), np.where(mask < 0, X.T @ X, mask)),
            "float32": (lambda: x - np.ones(3, np.float32), X - np.ones(3, np.float32)),
            "int row": (lambda: x * np.arange(3), X * np.arange(3)),
        }
        out = {}
        for name, (fn, want) in calls.items():
            got = [fn()]
            general.n = generic.n = 0
            got += [fn(), fn()]
            out[name] = (general.n, generic.n, want,
                         [(r.numpy(), r.dtype, r.placements, r._lin) for r in got])  # fmt: skip
        w = dt.shard_tensor(X, mesh, first, requires_grad=True)
        (w * np.arange(3.0)).sum().backward()
        out["grad"] = w.grad.numpy()
        return out

    for result in dt.simulate(size, body):
        for name, (decided, generic, want, got) in (
            (n, r) for n, r in result.items() if n != "grad"
        ):
            assert decided == 0, (name, decided)  # the first call alone decided
            assert generic == 0 or name == "where", (name, generic)  # operators: binary alone
            for value, dtype, placements, lin in got:
                np.testing.assert_array_equal(value, want, err_msg=name)
                assert dtype == want.dtype, (name, dtype)
                assert (placements, lin) == got[0][2:], name
        np.testing.assert_array_equal(result["grad"], np.tile(np.arange(3.0), (7, 1)))


@pytest.mark.parametrize("mesh_shape", [(1,), (2,), (3,), (4,), (2, 2)])
def test_repeated_slices_skip_the_op_call_with_numpys_values(mesh_shape, monkeypatch):
    """A repeated basic-index getitem (``u[1:-1, 1:-1]``, ``x[:, None]``, a pick of a split
    axis) takes its route's kept dispatch entry (dispatch.keyed): after the first call it
    reaches neither the general path nor ``_call``, and every call gives numpy's values and
    dtype with the first call's placements and lineage, on split, uneven and empty shards,
    Replicate and Partial inputs; a tensor that requires a gradient keeps ``_call`` and gets
    numpy's gradient."""
    U = np.arange(63.0).reshape(7, 9)  # 7 rows: uneven, and an empty shard on 4 ranks
    counts = {"general": threading.local(), "call": threading.local()}
    real_general, real_call = dispatch._general, dispatch._call

    def counting(name, real):
        def call(*args, **attrs):
            counts[name].n = getattr(counts[name], "n", 0) + 1
            return real(*args, **attrs)

        return call

    monkeypatch.setattr(dispatch, "_general", counting("general", real_general))
    monkeypatch.setattr(dispatch, "_call", counting("call", real_call))
    monkeypatch.setattr(dispatch.Op, "__call__", counting("call", real_call))  # Op() calls
    size = int(np.prod(mesh_shape))

    def body():
        mesh = dt.ProcessMesh(np.arange(size).reshape(mesh_shape))
        rest = [dt.Replicate()] * (len(mesh_shape) - 1)
        u = dt.shard_tensor(U, mesh, [dt.Shard(0)] + rest)
        r = dt.shard_tensor(U, mesh, [dt.Replicate()] + rest)
        p = dt.dtensor_from_local(
            U / mesh_shape[0], mesh,
            [dt.Partial()] + rest, global_shape=U.shape,
        )  # fmt: skip
        calls = {
            "interior": (lambda: u[1:-1, 1:-1], U[1:-1, 1:-1]),
            "columns": (lambda: u[:, 2:], U[:, 2:]),
            "new axis": (lambda: u[:, None], U[:, None]),
            "pick": (lambda: u[3], U[3]),
            "replicate": (lambda: r[None, 1:, ::2], U[None, 1:, ::2]),
            "partial": (lambda: p[2:5, 1], U[2:5, 1]),
        }
        out = {}
        for name, (fn, want) in calls.items():
            got = [fn()]
            counts["general"].n = counts["call"].n = 0
            got += [fn(), fn()]
            out[name] = (counts["general"].n, counts["call"].n, want,
                         [(r.numpy(), r.dtype, r.placements, r._lin) for r in got])  # fmt: skip
        w = dt.shard_tensor(U, mesh, [dt.Shard(0)] + rest, requires_grad=True)
        for _ in range(2):
            w.grad = None
            (w[1:-1, 1:-1] * 2.0).sum().backward()
        out["grad"] = w.grad.numpy()
        return out

    for result in dt.simulate(size, body):
        for name, (decided, called, want, got) in (
            (n, r) for n, r in result.items() if n != "grad"
        ):
            assert decided == 0 and called == 0, (name, decided, called)
            for value, dtype, placements, lin in got:
                np.testing.assert_allclose(value, want, rtol=1e-12, err_msg=name)
                assert dtype == want.dtype, (name, dtype)
                assert (placements, lin) == got[0][2:], name
        grad = np.zeros_like(U)
        grad[1:-1, 1:-1] = 2.0
        np.testing.assert_array_equal(result["grad"], grad)


@pytest.mark.parametrize("mesh_shape", [(1,), (2,), (3,), (4,), (2, 2)])
def test_list_and_tuple_operands_are_numpys_arrays(mesh_shape):
    """Note [Lists are arrays]: a list or tuple among an op's data arguments is the array
    numpy makes of it, laid against the global tensor (not each rank's shard): operators,
    reflected operators, numpy's ufuncs, np.where and np.clip on split, uneven and empty
    shards, with numpy's values and dtypes and a gradient through one; a list of a shard's
    length where numpy refuses it raises numpy's ValueError on every rank; a list of
    strings stays numpy's TypeError."""
    g = np.arange(7.0)  # 7 rows: uneven, and an empty shard on 4 ranks
    m = np.arange(14.0).reshape(7, 2)
    row, col = [10.0, 20.0], [[1], [2], [3], [4], [5], [6], [7]]
    cases = {
        "x + list": (lambda x, y: x + list(range(7)), g + list(range(7))),
        "list - x": (lambda x, y: list(range(7)) - x, list(range(7)) - g),
        "x * tuple": (lambda x, y: x * tuple(range(7)), g * tuple(range(7))),
        "x == list": (lambda x, y: x == list(range(7)), g == list(range(7))),
        "np.maximum": (lambda x, y: np.maximum(x, [3] * 7), np.maximum(g, [3] * 7)),
        "np.where": (lambda x, y: np.where(x > 2, x, list(range(7))), np.where(g > 2, g, range(7))),
        "np.clip": (lambda x, y: np.clip(x, 1, [5] * 7), np.clip(g, 1, [5] * 7)),
        "int list": (lambda x, y: x // [2] * 7, g // [2] * 7),
        "row": (lambda x, y: y + row, m + row),
        "column": (lambda x, y: y * col, m * col),
    }

    def body(mesh):
        first = [dt.Shard(0)] + [dt.Replicate()] * (mesh.ndim - 1)
        x = dt.shard_tensor(g, mesh, first)
        y = dt.shard_tensor(m, mesh, first)
        out = {name: (fn(x, y).numpy(), fn(x, y).dtype) for name, (fn, _) in cases.items()}
        errors = []
        for bad in ([1.0, 2.0], ["a"] * 7):  # numpy: a broadcast error, a ufunc type error
            try:
                x + bad
                errors.append(None)
            except (ValueError, TypeError) as e:
                errors.append(type(e).__name__)
        w = dt.shard_tensor(g, mesh, first, requires_grad=True)  # the gradient's path
        (w * list(range(7))).sum().backward()
        return out, errors, w.grad.numpy()

    from op_cases import on_mesh

    out, errors, grad = on_mesh(mesh_shape, body)
    np.testing.assert_array_equal(grad, np.arange(7.0))
    for name, (_, want) in cases.items():
        value, dtype = out[name]
        np.testing.assert_array_equal(value, want, err_msg=name)
        assert dtype == np.asarray(want).dtype, (name, dtype)
    assert errors[0] == "ValueError", errors
    assert errors[1] is not None, errors


def test_a_string_operand_raises_numpys_error_before_any_move():
    """Note [Lists are arrays]: a string among an op's data is checked on 0-d stand-ins
    first, so numpy's error comes on every rank before a Partial operand is reduced."""
    a = np.arange(6.0)
    try:
        np.add(a, "a")
    except TypeError as e:
        want = (type(e), str(e))

    def body():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(a, mesh, [dt.Partial()])
        out = []
        for f in (
            lambda: np.add(x, "a"),
            lambda: x + "a",
            lambda: "a" * x,
            lambda: x - b"a",
            lambda: x + np.str_("a"),
            lambda: np.maximum(x, np.datetime64("2020-01-01")),
            lambda: x * ["a", "b", "c", "d", "e", "f"],
        ):
            with dt.CommCounter() as cc:
                try:
                    f()
                    got = None
                except TypeError as e:
                    got = (type(e), str(e))
            out.append((got, cc.total))
        return out

    for results in dt.simulate(2, body):
        assert results[0] == (want, 0), results
        assert all(got is not None and total == 0 for got, total in results), results


@pytest.mark.parametrize("n", [7, 3])  # uneven shards; 3 elements: an empty shard on 4 ranks
@pytest.mark.parametrize("mesh_shape", [(1,), (2,), (3,), (4,), (2, 2)])
def test_equality_with_an_operand_numpy_cannot_compare(mesh_shape, n):
    """Note [Comparisons numpy cannot make]: ``x == "a"`` is numpy's all-False array (``!=``
    all True) of the broadcast shape, on split, uneven, empty and Partial shards, with no
    communication; shapes that do not broadcast raise numpy's ValueError; ``np.equal``
    keeps numpy's TypeError."""
    g = np.arange(float(n))
    operands = ["a", b"x", np.datetime64("2020-01-01"), np.array([["a"], ["b"]]), ["a"] * n]

    def body(mesh):
        rest = [dt.Replicate()] * (mesh.ndim - 1)
        out = []
        for first in (dt.Shard(0), dt.Replicate(), dt.Partial()):
            x = dt.shard_tensor(g / mesh.size if first.is_partial() else g, mesh, [first, *rest])
            for o in operands:
                for f in ("__eq__", "__ne__"):
                    with dt.CommCounter() as cc:
                        got = getattr(x, f)(o)
                    out.append((str(first), repr(o), f, cc.total, got.numpy(), got.dtype))
            errors = []
            for bad in (lambda x=x: x == np.array(["a", "b"]), lambda x=x: np.equal(x, "a")):
                try:
                    bad()
                    errors.append(None)
                except (ValueError, TypeError) as e:
                    errors.append(type(e).__name__)
            out.append(errors)
        return out

    from op_cases import on_mesh

    out = on_mesh(mesh_shape, body)
    k = 0
    for _ in range(3):
        for o in operands:
            for f in ("__eq__", "__ne__"):
                first, name, fn, total, value, dtype = out[k]
                want = getattr(g, f)(np.asarray(o) if isinstance(o, list) else o)
                assert total == 0, (first, name, fn)
                assert dtype == want.dtype, (first, name, fn)
                np.testing.assert_array_equal(value, want, err_msg=f"{first} {name} {fn}")
                assert value.shape == want.shape
                k += 1
        assert out[k] == ["ValueError", "UFuncTypeError"], out[k]
        k += 1


@pytest.mark.parametrize("n", [7, 3])  # uneven shards; 3 rows: an empty shard on 4 ranks
@pytest.mark.parametrize("mesh_shape", [(1,), (2,), (3,), (4,), (2, 2)])
def test_operators_whose_operand_moves_stay_on_the_operators_path(mesh_shape, n, monkeypatch):
    """Note [Dispatch fast path]: an operator whose operand moves (``A @ p`` with a new split
    p each call, ``s / d`` and ``2 - d`` with d a new Partial scalar) moves it itself on
    ``binary``'s path from its second call, reaching neither ``_call`` nor the general path:
    numpy's values and the first call's placements and lineage each call, the same
    collectives in every call after the first (which may also move A, once: Note [One move
    per tensor]); with a gradient, numpy's gradient."""
    A = np.arange(n * n, dtype=float).reshape(n, n) / 10 + np.eye(n)
    p = np.linspace(1.0, 2.0, n)
    counts = threading.local()
    real_call, real_general = dispatch._call, dispatch._general

    def count(name, fn):
        def counted(*args, **kwargs):
            setattr(counts, name, getattr(counts, name, 0) + 1)
            return fn(*args, **kwargs)

        return counted

    monkeypatch.setattr(dispatch, "_call", count("call", real_call))
    monkeypatch.setattr(dispatch, "_general", count("general", real_general))

    def body(mesh):
        first = [dt.Shard(0)] + [dt.Replicate()] * (mesh.ndim - 1)
        At = dt.shard_tensor(A, mesh, first)
        pt = dt.shard_tensor(p, mesh, first)
        calls = {
            "A @ p": (lambda: At @ (pt * 1.0), A @ p),  # a new p each call, as in a loop
            "s / d": (lambda: (pt @ pt) / (pt @ (pt * 0.5)), (p @ p) / (p @ (p * 0.5))),
            "2 - d": (lambda: 2.0 - pt @ pt, 2.0 - p @ p),
        }
        out = {}
        for name, (fn, want) in calls.items():
            with dt.CommCounter() as cc:
                r = fn()
            got = [(r.numpy(), r.placements, r._lin, cc.total)]
            counts.call = counts.general = 0
            for _ in range(2):
                with dt.CommCounter() as cc:
                    r = fn()
                got.append((r.numpy(), r.placements, r._lin, cc.total))
            out[name] = (counts.call, counts.general, want, got)
        w = dt.shard_tensor(p, mesh, first, requires_grad=True)
        (At @ w).sum().backward()
        out["grad"] = w.grad.numpy()
        return out

    from op_cases import on_mesh

    result = on_mesh(mesh_shape, body)
    np.testing.assert_allclose(result.pop("grad"), A.sum(axis=0), rtol=1e-13)
    for name, (calls, general, want, got) in result.items():
        assert (calls, general) == (0, 0), (name, calls, general)
        for value, placements, lin, _ in got:
            np.testing.assert_allclose(value, want, rtol=1e-13, err_msg=name)
            assert (placements, lin) == got[0][1:3], name
        assert got[1][3] == got[2][3] <= got[0][3], name
        if int(np.prod(mesh_shape)) > 1 and (name != "A @ p" or n == 7):
            assert got[1][3] > 0, name  # the operand moved, each call (3 rows on 4 ranks:
            # the rule moves A instead, once)
