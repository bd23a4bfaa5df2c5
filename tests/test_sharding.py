"""dt.shard_optimizer, ShardingStage1/2/3 and dt.memory_report (disttensor/parallel/sharding.py):
the cases of tests/sharding_cases.py on simulated ranks and under mpiexec."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import sharding_cases as cases
from mpirun import run
from test_device import DEVICES

import disttensor as dt

WORLDS = [1, 2, 3, 4]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", [c.__name__ for c in cases.MPI_CASES])
def test_case_on_simulated_ranks(case, world):
    fn = getattr(cases, case)
    dt.simulate(world, lambda: fn(world), timeout=120)


def test_memory_report_counts_each_array_once():
    def body():
        mesh = dt.ProcessMesh([0, 1], dim_names=["dp"])
        w = dt.nn.Parameter(dt.shard_tensor(np.zeros((6, 3)), mesh, [dt.Replicate()]))
        opt = dt.shard_optimizer(dt.optim.Adam([w, w]), dt.ShardingStage1("dp"))
        before = dt.memory_report([w, w], opt)
        (w * w).sum().backward()
        opt.step()
        return before, dt.memory_report([w], opt)

    (before, after), _ = dt.simulate(2, body)
    assert before == {
        "parameters": 144, "gradients": 0, "optimizer_state": 2 * 72, "buffers": 0, "total": 288
    }  # fmt: skip
    # the all-gather's scratch: every rank's block (144 bytes) and this rank's (72)
    assert after == {
        "parameters": 144, "gradients": 144, "optimizer_state": 144, "buffers": 216, "total": 648
    }  # fmt: skip


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_under_mpiexec(n):
    code, out = run(n, ["tests/sharding_cases.py"], timeout=300)
    assert code == 0, out
    assert f"{len(cases.MPI_CASES)} passed, 0 failed" in out, out


def test_checkpoint_at_one_stage_and_world_loads_at_another(tmp_path):
    """Stage 2 on 2 ranks saves parameters and sharded state (no data gathered); stage 1 on 3
    ranks and stage 3 on 4 load them and go on: the same parameters as the one-process run."""
    path = str(tmp_path / "ckpt")
    want = dt.simulate(1, lambda: cases.reference("Adam", steps=4))[0]

    def first():
        res = cases.train((2,), ("dp",), "Adam", dt.ShardingStage2, steps=2)
        with dt.CommCounter() as cc:
            dt.save({"model": res["model"].state_dict(), "opt": res["opt"].state_dict()}, path)
        return cc.counts

    counts = dt.simulate(2, first)[0]
    assert "all_gather" not in counts and "all_reduce" not in counts, counts

    def resume(world, stage):
        def body():
            mesh = dt.ProcessMesh(list(range(world)), dim_names=["dp"])
            model = cases.Scaled(mesh)
            opt = dt.shard_optimizer(cases.optimizer("Adam", list(model.parameters())), stage("dp"))
            got = dt.load({"model": model.state_dict(), "opt": opt.state_dict()}, path)
            with dt.no_grad():
                for n, p in model.named_parameters():
                    p[...] = got["model"][n]
            opt.load_state_dict(got["opt"])
            for step in (2, 3):
                x, y = cases.data(step)
                xs = dt.shard_tensor(x, mesh, [dt.Shard(0)])
                ys = dt.shard_tensor(y, mesh, [dt.Shard(0)])
                ((model(xs) - ys) ** 2).mean().backward()
                opt.step()
                opt.zero_grad()
            return {n: p.numpy() for n, p in model.named_parameters()}

        return dt.simulate(world, body)

    for world, stage in ((3, dt.ShardingStage1), (4, dt.ShardingStage3)):
        for got in resume(world, stage):
            cases.close(got, want, f"resumed with {stage.__name__} on {world} ranks")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stage", cases.STAGES, ids=lambda s: s.__name__)
def test_stages_on_a_device(stage, device):
    """Device shards (tests/fake_device.py's stand-in; CuPy where there is a GPU): the state,
    the gradient slices and the buckets live on the device, and the run equals the host's
    (bit for bit on the stand-in, which computes with numpy)."""
    from disttensor import backend

    def body(dev):
        dt.set_device(dev)
        res = cases.train((3,), ("dp",), "Adam", stage, dp=True)
        kinds = {type(t.to_local()) for e in res["opt"].state.values() for t in e.values()}
        kinds |= {type(p.to_local()) for p in res["model"].parameters()}
        return res["params"], kinds, backend.current().array_type

    host = dt.simulate(3, lambda: body("cpu"))
    dev = dt.simulate(3, lambda: body(device))
    for (hp, _, _), (dp_, kinds, want) in zip(host, dev):
        assert kinds == {want}, kinds
        for n, v in hp.items():
            got = dp_[n]
            if device == "fake":
                assert np.array_equal(got, v), n
            else:
                assert np.allclose(got, v, rtol=1e-9, atol=1e-12), n


def test_memory_report_traces_the_step_peak():
    """``step=``: the step runs under tracemalloc; its peak counts what it allocated (here a
    512 KiB temporary beside the gradients), and tracing is left as it was."""
    import tracemalloc

    def body():
        mesh = dt.ProcessMesh([0, 1], dim_names=["dp"])
        w = dt.nn.Parameter(dt.shard_tensor(np.ones((256, 64)), mesh, [dt.Replicate()]))
        opt = dt.shard_optimizer(dt.optim.SGD([w], lr=0.1), dt.ShardingStage2("dp"))

        def step():
            scratch = np.zeros(65536)  # 512 KiB held while the step runs
            (w * w).sum().backward()
            opt.step()
            return scratch.size

        return dt.memory_report([w], opt, step=step)

    for report in dt.simulate(2, body):
        assert report["step_peak"] >= 65536 * 8 + 256 * 64 * 8, report  # scratch + a gradient
        assert report["gradients"] == 128 * 64 * 8, report  # the slice, after the step
        assert report["buffers"] == 256 * 64 * 8 + 128 * 64 * 8, report  # scratch: flat, mine
    assert not tracemalloc.is_tracing()
    with pytest.raises(TypeError, match="function of no arguments"):
        dt.memory_report([1], step=3)


def _three_layers(mesh):
    """Linear(6, 10), Tanh, Linear(10, 10), Tanh, Linear(10, 4), float64, seeded: each layer's
    weight and bias fit in 1000 bytes, the model does not."""
    dt.manual_seed(3)
    pairs = itertools.pairwise((6, 10, 10, 4))
    layers = [dt.nn.Linear(a, b, mesh=mesh, dtype=np.float64) for a, b in pairs]
    return dt.nn.Sequential(layers[0], dt.nn.Tanh(), layers[1], dt.nn.Tanh(), layers[2])


@pytest.mark.parametrize("after", [True, False])
def test_stage3_gathers_a_group_for_its_forward_and_backward(after):
    """ShardingStage3(reshard_after_forward=True): with buckets smaller than the model, each
    layer (a group: its parameters fit in a bucket, the model's do not) is whole only while
    its forward or backward runs, then a slice again; one all-gather per layer for forward,
    one for backward; the values are one process's. False: the model is gathered at the
    outermost call and stays whole until the step."""
    make = _three_layers

    def whole(model):
        return [p.placements[0] == dt.Replicate() for p in model.parameters()]

    def body():
        mesh = dt.init_mesh((2,), dim_names=["dp"])
        model = make(mesh)
        cap = 1000 / 2**20  # a layer's weight and bias fit (at most 880 bytes), not the model
        stage = dt.ShardingStage3("dp", bucket_size_mb=cap, reshard_after_forward=after)
        opt = dt.shard_optimizer(dt.optim.Adam(list(model.parameters()), lr=0.1), stage)
        seen = []  # which parameters are whole as each layer's forward starts
        for i in (0, 2, 4):
            inner = model[i].forward

            def watch(x, inner=inner):
                seen.append(whole(model))
                return inner(x)

            model[i].forward = watch
        x = dt.shard_tensor(np.random.default_rng(1).normal(size=(8, 6)), mesh, [dt.Shard(0)])
        with dt.CommCounter() as fwd:
            loss = (model(x) ** 2).mean()
        after_forward = whole(model)
        with dt.CommCounter() as bwd:
            loss.backward()
        after_backward = whole(model)
        opt.step()
        return (
            seen,
            after_forward,
            after_backward,
            fwd.counts,
            bwd.counts,
            [p.numpy() for p in model.parameters()],
        )

    def reference():
        mesh = dt.init_mesh((1,), dim_names=["dp"])
        model = make(mesh)
        opt = dt.optim.Adam(list(model.parameters()), lr=0.1)
        x = dt.shard_tensor(np.random.default_rng(1).normal(size=(8, 6)), mesh, [dt.Replicate()])
        (model(x) ** 2).mean().backward()
        opt.step()
        return [p.numpy() for p in model.parameters()]

    seen, after_forward, after_backward, fwd, bwd, got = dt.simulate(2, body)[0]
    want = dt.simulate(1, reference)[0]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
    if after:
        # layer i's two parameters are whole in its own forward only
        assert seen == [[j // 2 == i for j in range(6)] for i in range(3)], seen
        assert not any(after_forward) and not any(after_backward)
        assert fwd.get("all_gather") == 3 and bwd.get("all_gather") == 3, (fwd, bwd)
    else:
        assert all(all(s) for s in seen) and all(after_forward) and all(after_backward)
        # the model at the outermost call, in buckets of at most 1000 whole bytes: a layer each
        assert fwd.get("all_gather") == 3 and "all_gather" not in bwd, (fwd, bwd)


@pytest.mark.parametrize("world", [2, 3])
def test_stage3_gathers_the_next_group_ahead(world):
    """Note [Groups gathered ahead]: from the second step on, each layer's all-gathers for
    forward (but the first layer's) and for backward (but the last layer's) were started
    ahead and are taken; the collectives per step are the same as without (one all-gather
    per layer for forward, one for backward); the values are one process's after 4 steps,
    with Adam, uneven slices on 3 ranks, and a layer called twice in one forward."""
    make = _three_layers

    def batch(step, mesh, placements):
        x = np.random.default_rng(step).normal(size=(12, 6))
        return dt.shard_tensor(x, mesh, placements)

    def forward(model, x, step):  # the last step calls the middle layers twice
        if step < 3:
            return model(x)
        return model[2](model[1](model[2](model[1](model[0](x)))))

    def body(n):
        mesh = dt.init_mesh((n,), dim_names=["dp"])
        model = make(mesh)
        cap = 1000 / 2**20  # a layer's weight and bias fit, not the model
        stage = dt.ShardingStage3("dp", bucket_size_mb=cap)
        opt = dt.shard_optimizer(dt.optim.Adam(list(model.parameters()), lr=0.1), stage)
        counts, taken = [], []
        for step in range(4):
            x = batch(step, mesh, [dt.Shard(0)] if n > 1 else [dt.Replicate()])
            before = getattr(opt, "_taken", 0)
            with dt.CommCounter() as cc:
                loss = (forward(model, x, step) ** 2).mean()
                loss.backward()
            opt.step()
            opt.zero_grad()
            counts.append(cc.counts.get("all_gather", 0))
            taken.append(getattr(opt, "_taken", 0) - before)
        return counts, taken, [p.numpy() for p in model.parameters()]

    def reference():
        mesh = dt.init_mesh((1,), dim_names=["dp"])
        model = make(mesh)
        opt = dt.optim.Adam(list(model.parameters()), lr=0.1)
        for step in range(4):
            x = batch(step, mesh, [dt.Replicate()])
            (forward(model, x, step) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        return [p.numpy() for p in model.parameters()]

    want = dt.simulate(1, reference)[0]
    for counts, taken, got in dt.simulate(world, body, world):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-13)
        # the first step's collectives, which gathers nothing ahead (a layer each, forward
        # and backward, and the loss's), in the steps that do
        assert counts[1:3] == [counts[0]] * 2 and counts[0] >= 6, counts
        # the first forward learns the order, which its backward uses (2 of 3 layers); then
        # 2 of 3 forward and 2 of 3 backward
        assert taken[:3] == [2, 4, 4], taken


def _one_step(model, opt, mesh, step):
    """One training step of ``_three_layers`` on batch ``step`` (split by rows over ``mesh``)."""
    x = np.random.default_rng(step).normal(size=(12, 6))
    x = dt.shard_tensor(x, mesh, [dt.Shard(0)] if mesh.size > 1 else [dt.Replicate()])
    (model(x) ** 2).mean().backward()
    opt.step()
    opt.zero_grad()


class _PerParameterSGD(dt.optim.SGD):
    """SGD with an ``update`` of its own: the sharded optimizer keeps it per parameter."""

    def update(self, p, w, g, lr):
        w -= lr * g


@pytest.mark.parametrize("stage", [dt.ShardingStage1, dt.ShardingStage2])
def test_stages_1_and_2_update_each_bucket_in_one_call(stage):
    """Note [Slices updated end to end]: Adam's apply runs once per bucket per step (the model
    is one bucket), its state tensors are views of one array per state name, a state loaded
    from a state_dict (new arrays) is taken in, and the values are one process's after 3
    steps; an optimizer with an update of its own is still called per parameter."""

    def body(n, per_param):
        mesh = dt.init_mesh((n,), dim_names=["dp"])
        model = _three_layers(mesh)
        params = list(model.parameters())
        inner = _PerParameterSGD(params, lr=0.1) if per_param else dt.optim.Adam(params, lr=0.1)
        calls = {"apply": 0, "update": 0}
        for name in calls:
            method = getattr(inner, name)

            def counted(*a, method=method, name=name):
                calls[name] += 1
                return method(*a)

            setattr(inner, name, counted)
        opt = dt.shard_optimizer(inner, stage("dp")) if n > 1 else inner
        for step in range(3):
            _one_step(model, opt, mesh, step)
            if step == 1 and n > 1 and not per_param:  # a round trip through a state_dict
                state = opt.state_dict()
                fresh = {k: {m: t.copy() if hasattr(t, "copy") else t for m, t in v.items()}
                         for k, v in state["state"].items()}  # fmt: skip
                opt.load_state_dict({**state, "state": fresh})
        bases = set()
        if not per_param:
            for p in params:
                for t in inner.state[id(p)].values():
                    bases.add(id(t.to_local().base))
        return [p.numpy() for p in params], dict(calls), len(bases)

    for per_param in (False, True):
        want, _, _ = dt.simulate(1, body, 1, per_param)[0]
        for got, calls, bases in dt.simulate(2, body, 2, per_param):
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
            if per_param:
                assert calls["update"] == 3 * 6, calls  # 6 parameters, 3 steps
            else:
                assert calls["apply"] == 3, calls  # one bucket, 3 steps
                assert bases == 2, bases  # exp_avg and exp_avg_sq: one array each


class _SignMomentum(dt.optim.Optimizer):
    """An optimizer written as the base class says: its state named, its elementwise apply."""

    state_names = ("buf",)

    def apply(self, w, g, state, lr):
        (buf,) = state
        buf *= 0.5
        buf += np.sign(g)
        w -= lr * buf


def test_a_new_optimizer_with_apply_runs_unsharded_and_sharded():
    """dt.optim.Optimizer's extension point: ``state_names`` and ``apply`` alone give an
    optimizer that steps as it is and under every sharding stage (its apply on a bucket's
    slices end to end), with the same values after 3 steps, and a state_dict of its state."""

    def body(n, stage):
        mesh = dt.init_mesh((n,), dim_names=["dp"])
        model = _three_layers(mesh)
        opt = _SignMomentum(list(model.parameters()), lr=0.05)
        if stage is not None:
            opt = dt.shard_optimizer(opt, stage("dp"))
        for step in range(3):
            _one_step(model, opt, mesh, step)
        names = {tuple(v) for v in opt.state_dict()["state"].values()}
        return [p.numpy() for p in model.parameters()], names

    want, names = dt.simulate(1, body, 1, None)[0]
    assert names == {("buf",)}
    for stage in (dt.ShardingStage1, dt.ShardingStage2, dt.ShardingStage3):
        for got, got_names in dt.simulate(2, body, 2, stage):
            assert got_names == names
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
