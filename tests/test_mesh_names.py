"""Meshes that differ only in their dim names (Note [Mesh identity] in disttensor/mesh.py).

They stay two meshes: an op refuses operands on both, before any collective, and its message
says where each operand lives, that only the names differ and how to put both on one mesh (a
``dt.reshard`` to the other mesh re-labels without communicating). ``dt.DataParallel`` adopts
the parameters of a model built on the default mesh (dim "d0") when its own mesh has the same
ranks and shape: their spec's mesh changes, their shards do not, and an INFO line says so.
Everything runs on simulated ranks.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from op_cases import every_rank

import disttensor as dt
from disttensor.mesh import names_clash, names_differ, same_grid

DP2 = "ProcessMesh(shape=(2,), process_ids=[0, 1], dim_names=['dp'])"
D02 = "ProcessMesh(shape=(2,), process_ids=[0, 1], dim_names=['d0'])"


def attempt(fn) -> tuple[str, str, dict]:
    """(exception type, message, collectives counted around the call) of ``fn()``."""
    with dt.CommCounter() as cc:
        try:
            fn()
            return "ok", "", cc.counts
        except Exception as e:
            return type(e).__name__, str(e), cc.counts


# -- the helpers ----------------------------------------------------------------------------------
def test_same_grid_and_names():
    a = dt.ProcessMesh([[0, 1], [2, 3]])
    assert same_grid(a, dt.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"]))
    assert not same_grid(a, dt.ProcessMesh([[0, 2], [1, 3]]))  # other ranks per position
    assert not same_grid(a, dt.ProcessMesh([0, 1, 2, 3]))  # another shape
    assert a != dt.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"])  # names are part of a mesh
    dp_mp = dt.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"])
    assert names_clash(dp_mp, dt.ProcessMesh([[0, 1], [2, 3]], ["mp", "dp"])) == ["dp", "mp"]
    assert names_clash(dp_mp, dt.ProcessMesh([[0, 1], [2, 3]], ["dp", "x"])) == []
    assert names_differ(a, a) == "" and names_differ(a, dt.ProcessMesh([[0, 2], [1, 3]])) == ""
    assert names_differ(a, dp_mp) == (
        "the two meshes hold the same ranks [0, 1, 2, 3] in the same shape (2, 2) and differ "
        "only in their dim names (['d0', 'd1'] vs ['dp', 'mp']); the names are part of a mesh "
        "(placements and dim= refer to them), so these are two meshes"
    )


# -- ops ------------------------------------------------------------------------------------------
def ops_on_renamed_meshes():
    named = dt.ProcessMesh([0, 1], dim_names=["dp"])
    x = dt.shard_tensor(np.arange(4.0), named, [dt.Shard(0)])
    y = dt.ones((4,))  # the default mesh: every rank, dim "d0"
    out = {
        "add": attempt(lambda: x + y),
        "radd": attempt(lambda: y + x),
        "fallback": attempt(lambda: np.convolve(x, y)),  # the replicate fallback's check
    }
    g = dt.ones((4,))
    w = dt.zeros((4,), mesh=named, requires_grad=True)

    def assign():
        w.grad = g

    out["grad"] = attempt(assign)
    # the fix the messages name: dt.reshard onto the other mesh re-labels, sending nothing
    with dt.CommCounter() as cc:
        y2 = dt.reshard(y, x.mesh, y.placements)
        z = x + y2
    out["fix"] = (cc.counts, y2.mesh == named, y2.placements, z.placements)
    out["value"] = z.numpy()
    return out


def test_ops_say_that_only_the_names_differ():
    got = every_rank(dt.simulate(2, ops_on_renamed_meshes))
    names = (
        "the two meshes hold the same ranks [0, 1] in the same shape (2,) and differ only in "
        "their dim names (['dp'] vs ['d0']); the names are part of a mesh (placements and dim= "
        "refer to them), so these are two meshes: build both on one mesh (mesh=...), or "
        "re-label one with dt.reshard(x, mesh, x.placements) (each rank keeps its shard; "
        "nothing is sent unless x is Partial)"
    )
    assert got["add"] == (
        "ValueError",
        f"add: operands live on different meshes: operand 0 on {DP2}, operand 1 on {D02}; {names}",
        {},
    )
    kind, msg, counts = got["radd"]
    assert (kind, counts) == ("ValueError", {})
    assert msg.startswith(f"add: operands live on different meshes: operand 0 on {D02}, ")
    assert "differ only in their dim names (['d0'] vs ['dp'])" in msg
    kind, msg, counts = got["fallback"]
    assert (kind, counts) == ("ValueError", {})
    assert msg.startswith(
        f"convolve: operands live on different meshes: one operand on {DP2}, another on {D02}; "
    ), msg
    assert "differ only in their dim names" in msg and "dt.reshard(x, mesh, x.placements)" in msg
    kind, msg, counts = got["grad"]
    assert (kind, counts) == ("ValueError", {})
    assert msg == (
        f"assigned grad lives on {D02}, but the tensor on {DP2}; the two meshes hold the same "
        "ranks [0, 1] in the same shape (2,) and differ only in their dim names (['d0'] vs "
        "['dp']); the names are part of a mesh (placements and dim= refer to them), so these "
        "are two meshes: re-label the grad with dt.reshard(g, x.mesh, g.placements)"
    )
    assert got["fix"] == ({}, True, [dt.Replicate()], [dt.Shard(0)])
    np.testing.assert_array_equal(got["value"], np.arange(4.0) + 1)


def ops_on_other_ranks():
    x = dt.ones((4,), mesh=dt.ProcessMesh([1, 0]))
    y = dt.ones((4,))  # [0, 1]: the same names and shape, other ranks per position
    z = dt.ones((4,), mesh=dt.ProcessMesh([[0, 1]]))  # the same ranks, another shape
    return attempt(lambda: x * y), attempt(lambda: y * z)


def test_ops_on_other_ranks_keep_the_plain_advice():
    (k1, m1, c1), (k2, m2, c2) = every_rank(dt.simulate(2, ops_on_other_ranks))
    assert (k1, c1, k2, c2) == ("ValueError", {}, "ValueError", {})
    assert m1 == (
        "multiply: operands live on different meshes: operand 0 on ProcessMesh(shape=(2,), "
        f"process_ids=[1, 0], dim_names=['d0']), operand 1 on {D02}; move one with "
        "dt.reshard(x, mesh, placements)"
    )
    assert m2.endswith("; move one with dt.reshard(x, mesh, placements)")
    assert "dim names" not in m1 + m2


# -- DataParallel adopts a model built on the default mesh -----------------------------------------
def adopt(world: int):
    mesh = dt.init_mesh((world,), dim_names=["dp"])
    model = dt.nn.Linear(8, 4, dtype=np.float64, seed=1)  # no mesh=: the default one, "d0"
    ref = dt.nn.Linear(8, 4, dtype=np.float64, seed=1, mesh=mesh)
    before = [(p.to_local(), p.placements) for p in model.parameters()]
    with dt.CommCounter() as cc:
        dp_model = dt.DataParallel(model, mesh, dim="dp")
    params = list(model.parameters())
    kept = all(
        p.to_local() is local and p.placements == pls
        for p, (local, pls) in zip(params, before, strict=True)
    )
    x = dt.shard_tensor(np.arange(48.0).reshape(6, 8) / 10, mesh, [dt.Shard(0)])
    with dt.CommCounter() as step:
        dp_model(x).sum().backward()
        dp_model.finish_gradients()
    ref(x).sum().backward()
    same = [
        np.array_equal(p.grad.numpy(), q.grad.numpy())
        for p, q in zip(params, ref.parameters(), strict=True)
    ]
    return {
        "wrap": cc.counts,
        "kept": kept,
        "meshes": [p.mesh == mesh for p in params],
        "step": step.counts,
        "grads": same,
        "placements": [p.grad.placements for p in params],
        "buckets": [b["dims"] for b in dp_model.buckets["buckets"]],
    }


@pytest.mark.parametrize("world", [1, 2, 3])
def test_data_parallel_adopts_a_model_on_the_default_mesh(world, caplog):
    """``dt.nn.Linear(8, 4)`` (the default mesh, dim "d0") wrapped with ``DataParallel(model,
    mesh, dim="dp")``: no communication, the same shards, now on ``mesh``; one INFO line per
    rank; the step's one all-reduce and the gradients of a model built on ``mesh``."""
    with caplog.at_level(logging.INFO, logger="disttensor"):
        got = every_rank(dt.simulate(world, adopt, world))
    assert got == {
        "wrap": {},
        "kept": True,
        "meshes": [True, True],
        "step": {"all_reduce": 1} if world > 1 else {},
        "grads": [True, True],
        "placements": [[dt.Replicate()]] * 2,
        "buckets": [["dp"]] if world > 1 else [],  # one rank: nothing is Partial
    }
    logged = [r for r in caplog.records if "re-labelled" in r.getMessage()]
    assert sorted(r.threadName for r in logged) == [f"dt-rank-{r}" for r in range(world)]
    ids = list(range(world))
    for r in logged:
        assert r.levelno == logging.INFO and r.name == "disttensor"
        assert r.getMessage() == (
            f"DataParallel: 2 parameters on ProcessMesh(shape=({world},), process_ids={ids}, "
            f"dim_names=['d0']) re-labelled onto ProcessMesh(shape=({world},), "
            f"process_ids={ids}, dim_names=['dp']) (the same ranks and shape, other dim "
            "names; no data moved)"
        )


def adopt_tensor_parallel():
    """A 2x2 model made tensor-parallel over the default mesh's "d1", wrapped on dp x mp."""
    plain = dt.ProcessMesh([[0, 1], [2, 3]])
    mesh = dt.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"])
    model = dt.nn.MLP(6, 8, dtype=np.float64, seed=3)
    plan = {"fc1": dt.nn.ColwiseParallel("d1"), "fc2": dt.nn.RowwiseParallel("d1")}
    dt.shard_layer(model, plain, dt.nn.plan_shard_fn(plan))
    placements = [p.placements for p in model.parameters()]
    with dt.CommCounter() as cc:
        dp_model = dt.DataParallel(model, mesh)  # dim: "dp"
    x = dt.shard_tensor(np.ones((4, 6)), mesh, [dt.Shard(0), dt.Replicate()])
    with dt.CommCounter() as fwd:
        loss = dt.nn.MSELoss()(dp_model(x), x)
    loss.backward()
    dp_model.finish_gradients()
    return (
        cc.counts,
        [p.mesh == mesh for p in model.parameters()],
        [p.placements for p in model.parameters()] == placements,
        fwd.counts,
        [b["dims"] for b in dp_model.buckets["buckets"]],
    )


def test_data_parallel_adopts_a_tensor_parallel_model_on_2x2():
    wrap, meshes, kept, fwd, dims = every_rank(dt.simulate(4, adopt_tensor_parallel))
    assert wrap == {} and meshes == [True] * 4 and kept
    assert fwd == {"all_reduce": 1}  # the model's own mp reduction, as on a "dp", "mp" mesh
    assert dims == [["dp"]]


def refusals():
    """What DataParallel does not adopt, and a failed wrap changes nothing."""
    mesh = dt.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"])
    swapped = dt.nn.Linear(4, 2, mesh=dt.ProcessMesh([[0, 1], [2, 3]], ["mp", "dp"]), seed=1)
    other = dt.nn.Linear(4, 2, mesh=dt.ProcessMesh([[0, 2], [1, 3]]), seed=1)
    out = {
        "swapped": attempt(lambda: dt.DataParallel(swapped, mesh)),
        "other ranks": attempt(lambda: dt.DataParallel(other, mesh)),
        "no parameters": attempt(lambda: dt.DataParallel(dt.nn.GELU(), mesh)),
    }
    out["swapped kept"] = [p.mesh.dim_names for p in swapped.parameters()]
    # wrapped (and adopted) once: a second wrapper on yet another naming is refused and
    # re-labels nothing
    model = dt.nn.Linear(4, 2, mesh=dt.ProcessMesh([[0, 1], [2, 3]]), seed=1)
    dp_model = dt.DataParallel(model, mesh)
    again = dt.ProcessMesh([[0, 1], [2, 3]], ["a", "b"])
    out["twice"] = attempt(lambda: dt.DataParallel(model, again, dim="a"))
    out["twice kept"] = [p.mesh == mesh for p in model.parameters()]
    del dp_model
    return out


def test_data_parallel_refusals_say_where_the_parameters_live():
    got = every_rank(dt.simulate(4, refusals))
    head = (
        "DataParallel: no parameter of the model lives on ProcessMesh(shape=(2, 2), "
        "process_ids=[0, 1, 2, 3], dim_names=['dp', 'mp']) replicated over ['dp']"
    )
    tail = (
        "Build the model on this mesh (e.g. Linear(..., mesh=mesh)) or place it with "
        "dt.shard_layer(model, mesh) first; parameters Shard over a data-parallel dim "
        "(ZeRO-style) are left to the optimizer"
    )
    assert got["swapped"] == (
        "ValueError",
        f"{head}; its parameters: 2 parameters (e.g. 'weight') on ProcessMesh(shape=(2, 2), "
        "process_ids=[0, 1, 2, 3], dim_names=['mp', 'dp']) as [Replicate(), Replicate()]. The "
        "two meshes hold the same ranks [0, 1, 2, 3] in the same shape (2, 2) and differ only "
        "in their dim names (['mp', 'dp'] vs ['dp', 'mp']); the names are part of a mesh "
        "(placements and dim= refer to them), so these are two meshes; DataParallel re-labels "
        "parameters onto its mesh only where no dim name means another dim in the other mesh, "
        f"and here ['mp', 'dp'] do. {tail}",
        {},
    )
    assert got["swapped kept"] == [["mp", "dp"]] * 2
    assert got["other ranks"] == (
        "ValueError",
        f"{head}; its parameters: 2 parameters (e.g. 'weight') on ProcessMesh(shape=(2, 2), "
        "process_ids=[0, 2, 1, 3], dim_names=['d0', 'd1']) as [Replicate(), Replicate()]. "
        f"{tail}",
        {},
    )
    assert got["no parameters"] == ("ValueError", f"{head}: the model has no parameters", {})
    kind, msg, counts = got["twice"]
    assert (kind, counts) == ("ValueError", {}) and "already wrapped" in msg
    assert got["twice kept"] == [True, True]
