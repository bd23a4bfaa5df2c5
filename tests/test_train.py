"""Training on simulated ranks: the communication of tensor- and data-parallel layers, counted
with CommCounter, and sharded Adam training equal to the single-process run.

The single-process reference runs inside the same SPMD program: the same model (same
``dt.manual_seed``) on ``dt.ProcessMesh([rank])``, a one-rank mesh, so it never communicates.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_cases import every_rank

import disttensor as dt

D, HIDDEN, BATCH = 8, 32, 12
TOL = {np.float64: 1e-9, np.float32: 1e-5}
TP_PLAN = {"mlp.fc1": dt.nn.ColwiseParallel("mp"), "mlp.fc2": dt.nn.RowwiseParallel("mp")}


class Block(dt.nn.Module):
    """``ln2(x + mlp(ln1(x)))``: a pre-norm MLP residual branch followed by the next LayerNorm.

    With TP_PLAN, ln1 runs the fused layer norm on an input replicated along "mp", mlp.fc1 is
    column-parallel (its output split by columns), GELU is local, and mlp.fc2 row-parallel
    (its output Partial(sum)); the residual add keeps it Partial and ln2 reduces it.
    """

    def __init__(self, dtype=np.float64, final_norm: bool = True) -> None:
        super().__init__()
        self.ln1 = dt.nn.LayerNorm(D, dtype=dtype)
        self.mlp = dt.nn.MLP(D, HIDDEN, dtype=dtype)
        self.ln2 = dt.nn.LayerNorm(D, dtype=dtype) if final_norm else None

    def forward(self, x):
        y = x + self.mlp(self.ln1(x))
        return y if self.ln2 is None else self.ln2(y)


def data(steps: int, dtype, seed: int = 0):
    """The same (x, target) batches on every rank: a fixed teacher to learn."""
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((D, D))
    for _ in range(steps):
        x = rng.standard_normal((BATCH, D))
        yield x.astype(dtype), np.tanh(x @ teacher).astype(dtype)


# a fixed weighting of the block output, so that d loss / d output is not trivial
PROBE = np.random.default_rng(1).standard_normal((BATCH, D))


def batch_placements(mesh: dt.ProcessMesh) -> list:
    """The batch split over "dp" (if the mesh has it), replicated elsewhere."""
    return [dt.Shard(0) if name == "dp" else dt.Replicate() for name in mesh.dim_names]


def unpartial(placements) -> list:
    return [dt.Replicate() if p.is_partial() else p for p in placements]


def assert_close(got, want, tol: float, what: str) -> None:
    """max |got - want| <= tol * max |want|: relative to the tensor's scale."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    err = np.abs(got - want).max(initial=0.0)
    scale = np.abs(want).max(initial=0.0) or 1.0
    assert err <= tol * scale, f"{what}: max abs diff {err:.3g}, {err / scale:.3g} relative"


# -- (a) one tensor-parallel MLP block ------------------------------------------------------
def tp_block_comm(mesh_shape, names):
    mesh = dt.init_mesh(mesh_shape, dim_names=names)
    dt.manual_seed(0)
    block = dt.shard_layer(Block(), mesh, dt.nn.plan_shard_fn(TP_PLAN))
    x_global = next(data(1, np.float64))[0]
    x = dt.shard_tensor(x_global, mesh, batch_placements(mesh), requires_grad=True)
    with dt.CommCounter() as fwd:
        z = block(x)
    loss = (z * PROBE).sum()  # z is Replicate along mp: a local product and sum
    with dt.CommCounter() as bwd:
        loss.backward()
    x_grad_placements = x.grad.placements
    with dt.CommCounter() as gather:
        x_grad = dt.reshard(x.grad, mesh, unpartial(x.grad.placements))
    # the reference: the same block and input on a one-rank mesh
    dt.manual_seed(0)
    one = dt.ProcessMesh([dt.get_rank()])
    ref = dt.shard_layer(Block(), one)
    x1 = dt.shard_tensor(x_global, one, [dt.Replicate()], requires_grad=True)
    z1 = ref(x1)
    (z1 * PROBE).sum().backward()
    return {
        "fwd": fwd.counts,
        "bwd": bwd.counts,
        "gather": gather.counts,
        "z_placements": z.placements,
        "x_grad_placements": x_grad_placements,
        "z": (z.numpy(), z1.numpy()),
        "x_grad": (x_grad.numpy(), x1.grad.numpy()),
    }


@pytest.mark.parametrize(
    "world,mesh_shape,names", [(2, (2,), ["mp"]), (4, (2, 2), ["dp", "mp"])], ids=["mp2", "dp2xmp2"]
)
def test_tp_mlp_block_one_all_reduce(world, mesh_shape, names):
    r = every_rank(dt.simulate(world, tp_block_comm, mesh_shape, names))
    # forward: ln1 (fused: its input is Replicate along mp), fc1 (column-parallel), GELU and
    # fc2 (row-parallel) communicate nothing; fc2's output is Partial(sum), the residual add
    # keeps it Partial, and ln2 needs its input whole: the block's one all-reduce.
    assert r["fwd"] == {"all_reduce": 1}
    assert r["z_placements"][-1] == dt.Replicate()
    # backward: ln2's input was reduced in forward (saved Replicate), so dL/dy is Replicate;
    # fc2's and fc1's gradients are local; fc1's input gradient is Partial(sum) along mp and
    # stays so (Note [Partial gradients]): no collective at all.
    assert set(r["bwd"]) <= {"all_reduce"}
    assert r["bwd"] == {}
    assert r["x_grad_placements"][-1] == dt.Partial()
    # the one backward all-reduce is paid when x.grad is needed whole
    assert r["gather"] == {"all_reduce": 1}
    assert_close(*r["z"], 1e-12, "block output")
    assert_close(*r["x_grad"], 1e-12, "x.grad")


def stacked_tp_blocks_comm():
    """Two pre-norm MLP residual blocks, then a LayerNorm; TP along a 1-D mesh of 2."""
    mesh = dt.ProcessMesh([0, 1], dim_names=["mp"])
    dt.manual_seed(0)
    model = dt.nn.Sequential(
        Block(final_norm=False), Block(final_norm=False), dt.nn.LayerNorm(D, dtype=np.float64)
    )
    plan = {"*.mlp.fc1": dt.nn.ColwiseParallel("mp"), "*.mlp.fc2": dt.nn.RowwiseParallel("mp")}
    dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(plan))
    x = dt.shard_tensor(next(data(1, np.float64))[0], mesh, [dt.Replicate()], requires_grad=True)
    with dt.CommCounter() as fwd:
        z = model(x)
    with dt.CommCounter() as bwd:
        (z * PROBE).sum().backward()
    with dt.CommCounter() as gather:
        dt.reshard(x.grad, mesh, [dt.Replicate()])
    return fwd.counts, bwd.counts, gather.counts


def test_stacked_tp_mlp_blocks_one_all_reduce_per_block():
    fwd, bwd, gather = every_rank(dt.simulate(2, stacked_tp_blocks_comm))
    # forward: block 2's ln1 reduces block 1's Partial output, the final LayerNorm block 2's
    assert fwd == {"all_reduce": 2}
    # backward: block 2 is local and leaves the residual-stream gradient Partial(sum); block 1's
    # fc2 (row-parallel) needs it whole: one all-reduce, shared by fc2's input and weight
    # gradients (reshards are memoized within a gradient function), not one each
    assert bwd == {"all_reduce": 1}
    assert gather == {"all_reduce": 1}  # block 1's own, paid when x.grad is needed whole


# -- (b) data parallelism ---------------------------------------------------------------------
def dp_training(world, steps=3):
    mesh = dt.ProcessMesh(list(range(world)), dim_names=["dp"])
    one = dt.ProcessMesh([dt.get_rank()])
    out = {}
    for name, m in (("dp", mesh), ("single", one)):
        dt.manual_seed(0)
        model = dt.shard_layer(Block(), m)  # every parameter Replicate
        opt = dt.optim.Adam(model.parameters(), lr=1e-2)
        counts, placements = [], None
        for xg, tg in data(steps, np.float64):
            x = dt.shard_tensor(xg, m, batch_placements(m))
            t = dt.shard_tensor(tg, m, batch_placements(m))
            with dt.CommCounter() as fwd:
                loss = dt.nn.MSELoss()(model(x), t)
            with dt.CommCounter() as bwd:
                loss.backward()
            placements = {n: p.grad.placements for n, p in model.named_parameters()}
            with dt.CommCounter() as upd:
                opt.step()
            opt.zero_grad()
            counts.append((fwd.counts, bwd.counts, upd.counts))
        out[name] = {
            "counts": counts,
            "grad_placements": placements,
            "params": {n: p.numpy() for n, p in model.named_parameters()},
            "n_params": len(list(model.parameters())),
        }
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_dp_no_communication_until_the_optimizer(world):
    r = every_rank(dt.simulate(world, dp_training, world))
    dp, single = r["dp"], r["single"]
    for fwd, bwd, upd in dp["counts"]:
        assert fwd == {}  # every op is local on its batch rows; the mean is Partial
        assert bwd == {}  # weight gradients are sums over batch rows: Partial(sum), no comm
        # step() reduces every gradient once, all together (Note [Gradients reduced at the step])
        assert upd == {"all_reduce": 1} and dp["n_params"] > 1
    assert all(p == [dt.Partial()] for p in dp["grad_placements"].values()), dp["grad_placements"]
    for name, want in single["params"].items():
        assert_close(dp["params"][name], want, 1e-12, name)


# -- (c) a Megatron transformer block ---------------------------------------------------------
def megatron_block_comm(mesh_shape, names):
    mesh = dt.init_mesh(mesh_shape, dim_names=names)
    dt.manual_seed(0)
    # the block, then the next layer's norm (or the final one); megatron_plan("0") matches
    # the block's sub-layers "0.attn.q", ..., "0.mlp.fc2"
    model = dt.nn.Sequential(
        dt.nn.TransformerBlock(D, 2, dtype=np.float64), dt.nn.LayerNorm(D, dtype=np.float64)
    )
    dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(dt.nn.megatron_plan("0", "mp")))
    block, norm = model
    assert block.attn.q.weight.placements[-1] == dt.Shard(1)
    xg = np.random.default_rng(0).standard_normal((2, 5, D))
    x = dt.shard_tensor(xg, mesh, batch_placements(mesh), requires_grad=True)
    with dt.CommCounter() as fwd_block:
        h = block(x)
    with dt.CommCounter() as fwd_norm:
        z = norm(h)
    probe = np.random.default_rng(1).standard_normal(xg.shape)
    with dt.CommCounter() as bwd:
        (z * probe).sum().backward()
    x_grad_placements = x.grad.placements
    with dt.CommCounter() as gather:
        x_grad = dt.reshard(x.grad, mesh, unpartial(x.grad.placements))
    # reference on one rank
    dt.manual_seed(0)
    one = dt.ProcessMesh([dt.get_rank()])
    block1 = dt.shard_layer(dt.nn.TransformerBlock(D, 2, dtype=np.float64), one)
    norm1 = dt.shard_layer(dt.nn.LayerNorm(D, dtype=np.float64), one)
    x1 = dt.shard_tensor(xg, one, [dt.Replicate()], requires_grad=True)
    z1 = norm1(block1(x1))
    (z1 * probe).sum().backward()
    return {
        "fwd_block": fwd_block.counts,
        "fwd_norm": fwd_norm.counts,
        "h_placements": h.placements,
        "bwd": bwd.counts,
        "gather": gather.counts,
        "x_grad_placements": x_grad_placements,
        "z": (z.numpy(), z1.numpy()),
        "x_grad": (x_grad.numpy(), x1.grad.numpy()),
    }


MEGATRON_MESHES = [(2, (2,), ["mp"]), (4, (2, 2), ["dp", "mp"])]


@pytest.mark.parametrize("world,mesh_shape,names", MEGATRON_MESHES, ids=["mp2", "dp2xmp2"])
def test_megatron_block_forward_two_all_reduces(world, mesh_shape, names):
    r = every_rank(dt.simulate(world, megatron_block_comm, mesh_shape, names))
    # Attention branch: ln1 is fused on the Replicate residual stream; q, k, v column-parallel
    # split the heads, so scores, the causal mask, softmax and att @ v are local per head;
    # proj (row-parallel) gives a Partial(sum) output, the residual add keeps it Partial, and
    # ln2 needs its input whole: all-reduce #1, inside the block.
    # MLP branch: fc1 column-, fc2 row-parallel, local; the block's output x + mlp(...) is
    # left Partial(sum) (nothing inside the block needs it whole) ...
    assert r["fwd_block"] == {"all_reduce": 1}
    assert r["h_placements"][-1] == dt.Partial()
    # ... and the next LayerNorm pays its reduction: all-reduce #2. One per residual branch.
    assert r["fwd_norm"] == {"all_reduce": 1}
    assert_close(*r["z"], 1e-12, "block + norm output")


@pytest.mark.parametrize("world,mesh_shape,names", MEGATRON_MESHES, ids=["mp2", "dp2xmp2"])
def test_megatron_block_backward_one_all_reduce_per_branch(world, mesh_shape, names):
    r = every_rank(dt.simulate(world, megatron_block_comm, mesh_shape, names))
    # The next LayerNorm's input was reduced in forward (saved Replicate): dL/dh is Replicate.
    # MLP branch: fc2, GELU, fc1 local; fc1's input gradient is Partial(sum), so is ln2's, and
    # the residual-stream gradient dh + that is Partial too. Attention branch: attn.proj
    # (row-parallel) needs it whole for its column-split input gradient: all-reduce #1; then
    # the heads' softmax and matmuls are local, and q/k/v give a Partial input gradient ...
    assert r["bwd"] == {"all_reduce": 1}
    assert r["x_grad_placements"][-1] == dt.Partial()
    # ... reduced when x.grad is needed whole: all-reduce #2. One per residual branch.
    assert r["gather"] == {"all_reduce": 1}
    assert_close(*r["x_grad"], 1e-12, "x.grad")


# -- (d) sharded Adam training equals one process -------------------------------------------
def adam_training(mesh_shape, names, dtype, steps=10):
    mesh = dt.init_mesh(mesh_shape, dim_names=names)
    one = dt.ProcessMesh([dt.get_rank()])
    out = {}
    for key, m in (("sharded", mesh), ("single", one)):
        dt.manual_seed(0)
        model = Block(dtype)
        plan = dt.nn.plan_shard_fn(TP_PLAN) if "mp" in m.dim_names else None
        dt.shard_layer(model, m, plan)
        opt = dt.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for step, (xg, tg) in enumerate(data(steps, dtype)):
            if step:
                opt.zero_grad()
            x = dt.shard_tensor(xg, m, batch_placements(m))
            t = dt.shard_tensor(tg, m, batch_placements(m))
            loss = dt.nn.MSELoss()(model(x), t)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        named = list(model.named_parameters())
        out[key] = {
            "losses": np.array(losses),
            "grads": {n: p.grad.numpy() for n, p in named},
            "params": {n: p.numpy() for n, p in named},
            "placements": {n: p.placements for n, p in named},
        }
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize(
    "world,mesh_shape,names",
    [
        (2, (2,), ["mp"]),
        (2, (2,), ["dp"]),
        (4, (4,), ["mp"]),
        (4, (4,), ["dp"]),
        (4, (2, 2), ["dp", "mp"]),
    ],
    ids=["mp2", "dp2", "mp4", "dp4", "dp2xmp2"],
)
def test_adam_sharded_equals_single_process(world, mesh_shape, names, dtype):
    r = every_rank(dt.simulate(world, adam_training, mesh_shape, names, dtype))
    sharded, single, tol = r["sharded"], r["single"], TOL[dtype]
    if "mp" in names:
        assert sharded["placements"]["mlp.fc1.weight"][-1] == dt.Shard(1)
        assert sharded["placements"]["mlp.fc2.weight"][-1] == dt.Shard(0)
    assert single["losses"][-1] < single["losses"][0]  # it trains
    np.testing.assert_allclose(sharded["losses"], single["losses"], rtol=tol)
    for name in single["params"]:
        assert_close(sharded["grads"][name], single["grads"][name], tol, f"grad {name}")
        assert_close(sharded["params"][name], single["params"][name], tol, f"param {name}")
