"""``dt.spmd.infer_forward`` says what dispatch does.

For every op with a rule that the validator can call (disttensor/spmd/validate.py's examples),
every 1-D placement of its inputs on 2 simulated ranks: the output placements dispatch gives
equal the rule's, and dispatch's collectives are exactly the moves from the inputs'
placements to the ones the rule asks for (the communicating steps of ``reshard.plan``). The
composites whose reduced axes may be split (softmax, log_softmax, logsumexp, layer_norm,
cross_entropy: Note [Row-wise rules] in spmd/nn_rules.py) are checked on 1-D and 2-D meshes
too: output placements, the inputs' moves, and their per-row statistics' all-reduces.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from op_cases import every_rank

import disttensor as dt
from disttensor.reshard import plan, size_class
from disttensor.spmd import TensorSpec, infer_forward, registered_ops
from disttensor.spmd.validate import candidates, examples, known_ops, local_values, op_table

R, S0, S1, PSUM = dt.Replicate(), dt.Shard(0), dt.Shard(1), dt.Partial("sum")
LOCAL = ("slice", "to_partial")


def moves(mesh_shape, cur, req, shape, dtype) -> int:
    """Collectives the planner uses to take a tensor from ``cur`` to ``req`` placements."""
    if tuple(cur) == tuple(req):
        return 0
    nbytes = size_class(math.prod(shape) * np.dtype(dtype).itemsize)
    return sum(s.kind not in LOCAL for s in plan(tuple(mesh_shape), tuple(cur), tuple(req), nbytes))


def statistics(name, x, p, attrs) -> int:
    """All-reduces of a composite's per-row statistics: softmax, log_softmax and logsumexp of
    an axis the input keeps split (its max, then its sum of exponentials)."""
    if name not in ("softmax", "log_softmax", "logsumexp") or not p.is_shard():
        return 0
    axis = attrs.get("axis", None if name == "logsumexp" else -1)
    axes = range(x.ndim) if axis is None else [a % x.ndim for a in np.atleast_1d(axis)]
    return 2 * (p.dim in axes)


def seen(g, p):
    """A bool Partial is shown to rules as Replicate (dispatch reduces it first)."""
    return R if g.dtype == np.bool_ and p.is_partial() else p


def _run_combos(call, ex, combos, k):
    rank, mesh, args = dt.get_rank(), dt.ProcessMesh(list(range(k))), ex.args()
    out = []
    for placements in combos:
        dargs = list(args)
        for j, (i, p) in enumerate(zip(ex.pos, placements)):
            loc = local_values(args[i], p, k, np.random.default_rng(j))[rank]
            dargs[i] = dt.dtensor_from_local(loc, mesh, [p], global_shape=args[i].shape)
        try:
            with dt.CommCounter() as cc, np.errstate(all="ignore"):
                res = call(*dargs, **ex.attrs)
        except Exception as e:  # a rule may refuse a layout: then infer_forward must too
            out.append((type(e).__name__, None))
            continue
        pls = [list(r.placements) for r in (res if isinstance(res, tuple) else (res,))]
        out.append((pls, cc.total))
    return out


OPS = sorted(set(known_ops()) & set(registered_ops()))


@pytest.mark.parametrize("name", OPS)
def test_infer_forward_is_what_dispatch_does(name):
    call = op_table()[name]
    checked = 0
    for ex in examples(name, 2):
        args = ex.args()
        tensors = [args[i] for i in ex.pos]
        combos = list(itertools.product(*[candidates(g.ndim, g.dtype) for g in tensors]))
        runs = every_rank(dt.simulate(2, _run_combos, call, ex, combos, 2))
        for combo, (got, count) in zip(combos, runs):
            specs = [TensorSpec(g.shape, [seen(g, p)], g.dtype) for g, p in zip(tensors, combo)]
            try:
                req, outs = infer_forward(
                    name, specs, (2,), pos=ex.pos, nargs=len(args), **ex.attrs
                )
            except Exception as e:
                assert count is None and got == type(e).__name__, (ex.describe(), combo, got, e)
                continue
            what = (ex.describe(), combo, req, outs)
            assert got == outs, (*what, got)
            want = sum(
                (g.dtype == np.bool_ and p.is_partial())  # reduced first, as dispatch does
                + moves((2,), [seen(g, p)], r, g.shape, g.dtype)
                for g, p, r in zip(tensors, combo, req)
            )
            want += statistics(name, tensors[0], req[0][0], ex.attrs)
            assert count == want, (*what, count, want)
            checked += 1
    assert checked


# -- composites whose reduced axes are split --------------------------------------------------
def _composite(mesh_shape, name, inputs, attrs):
    """(output placements, collectives) of dt.<name> on these (global array, placements)."""
    mesh = dt.init_mesh(mesh_shape)
    ts = [dt.shard_tensor(g, mesh, p) for g, p in inputs]
    with dt.CommCounter() as cc:
        y = getattr(dt, name)(*ts, **attrs)
    return list(y.placements), cc.counts


COMPOSITE_CASES = [
    # (mesh, op, [(shape, dtype, placements)], attrs, statistics all-reduces per split dim)
    ((2,), "softmax", [((6, 8), "f8", [S1])], {"axis": -1}, 2),
    ((2, 2), "softmax", [((6, 8), "f8", [S0, S1])], {"axis": -1}, 2),
    ((2, 2), "softmax", [((6, 8), "f8", [S1, PSUM])], {"axis": -1}, 2),
    ((2, 2), "log_softmax", [((6, 8), "f4", [S0, S1])], {"axis": 1}, 2),
    ((2,), "logsumexp", [((6, 8), "f8", [S1])], {"axis": 1}, 2),
    ((2, 2), "logsumexp", [((6, 8), "f8", [S0, S1])], {"axis": -1, "keepdims": True}, 2),
    ((2, 2), "logsumexp", [((6, 8), "f4", [S1, PSUM])], {"axis": (0, 1)}, 2),
    ((2,), "layer_norm", [((6, 8), "f8", [S1]), ((8,), "f8", [R]), ((8,), "f8", [S0])], {}, 2),
    ((2, 2), "layer_norm", [((6, 8), "f8", [S0, S1]), ((8,), "f8", [R, R])], {}, 2),
    ((2,), "cross_entropy", [((6, 8), "f8", [S1]), ((6,), "i8", [S0])], {}, 2),
    ((2, 2), "cross_entropy", [((6, 8), "f8", [R, S1]), ((6,), "i8", [S0, R])], {}, 2),
    ((2, 2), "cross_entropy", [((6, 8), "f8", [S0, S1]), ((6,), "i8", [S0, R])], {}, 2),
    ((2, 2), "cross_entropy", [((6, 8), "f4", [S1, S0]), ((6,), "i8", [R, S0])], {}, 2),
]


@pytest.mark.parametrize("case", COMPOSITE_CASES, ids=lambda c: f"{c[1]}-{c[0]}")
def test_composites_infer_what_dispatch_does(case):
    mesh_shape, name, inputs, attrs, stats = case
    rng = np.random.default_rng(3)
    arrays = [
        rng.integers(0, 8, s) if d == "i8" else rng.normal(size=s).astype(d) for s, d, _ in inputs
    ]
    given = [(a, p) for a, (_, _, p) in zip(arrays, inputs)]
    specs = [TensorSpec(a.shape, p, a.dtype) for a, p in given]
    rule_name = "cross_entropy" if name == "cross_entropy" else name
    extra = {"reduction": "mean"} if name == "cross_entropy" else {}
    req, outs = infer_forward(rule_name, specs, mesh_shape, **attrs, **extra)
    got, counts = every_rank(
        dt.simulate(math.prod(mesh_shape), _composite, mesh_shape, name, given, attrs)
    )
    assert [got] == outs, (case, got, outs)
    # the inputs move as the rule says; the statistics of each split mesh dim are all-reduces
    moved = sum(moves(mesh_shape, p, r, a.shape, a.dtype) for (a, p), r in zip(given, req))
    first = inputs[0][2]  # the reduced axis of every case is axis 1 of the first input
    split = sum(1 for p, n in zip(first, mesh_shape) if p.is_shard() and p.dim == 1 and n > 1)
    assert sum(counts.values()) == moved + stats * split, (case, counts, req)


def test_a_broadcast_bias_slices_the_replicated_operand():
    """x (Replicate) + b (split, broadcast along x's rows): slicing x locally gives a split
    output with no communication, whatever the sizes (Note [Price of a reshard])."""
    for n in (8, 4096, 1 << 20):
        req, outs = infer_forward(
            "add", [TensorSpec((n, 64), [R], "f4"), TensorSpec((64,), [S0], "f4")], (4,)
        )
        assert req == [[S1], [S0]] and outs == [[S1]], (n, req, outs)

    def f():
        mesh = dt.init_mesh((2,))
        x = dt.shard_tensor(np.ones((512, 6)), mesh, [R])
        b = dt.shard_tensor(np.arange(6.0), mesh, [S0])
        with dt.CommCounter() as cc:
            y = x + b
        return cc.total, y.placements, y.numpy()[0].tolist()

    assert every_rank(dt.simulate(2, f)) == (0, [S1], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
