"""dt.shard_optimizer (ShardingStage1/2/3) SPMD cases and an mpiexec entry point.

Each case trains a small MLP (float64, MSE loss, the batch Shard(0) over "dp") for a few
steps with a sharded optimizer and checks, on every rank: the parameters equal the
one-process run of the same training on the whole batch (relative 1e-9; with
``DataParallel(k_steps=2)`` the one-process step on the doubled batch); the collectives each
stage may make (stage 1: all-reduce and all-gather; stages 2 and 3: reduce-scatter and
all-gather, no all-reduce; stage 3: each group of modules' parameters gathered in one bucket
for its forward and one for its backward, not per parameter); and the memory each stage
promises (the optimizer state, the gradients after the step, the parameters between steps:
this rank's slice, at most ceil(n / N) of a split dim).

The ``case_*(world)`` functions run on simulated ranks (tests/test_sharding.py) and under
mpiexec: ``mpiexec -n N python tests/sharding_cases.py`` prints one line per case on rank 0
and a closing 'N passed, 0 failed'; a failing check raises on its rank and ends the job.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

import disttensor as dt

DIMS = (7, 5, 3)  # 7 and 5 split unevenly over 2, 3, 4 ranks; a 3-element bias < 4 ranks
BATCH = 12
TOL = 1e-9
STAGES = (dt.ShardingStage1, dt.ShardingStage2, dt.ShardingStage3)
OPTIMIZERS = ("SGD", "Momentum", "Adam", "AdamW")


class Scaled(dt.nn.Module):
    """An MLP whose output is multiplied by a 0-d parameter (a parameter with no dim to
    split: its state stays whole)."""

    def __init__(self, mesh: dt.ProcessMesh) -> None:
        super().__init__()
        self.fc1 = dt.nn.Linear(DIMS[0], DIMS[1], dtype=np.float64, mesh=mesh, seed=1)
        self.act = dt.nn.Tanh()
        self.fc2 = dt.nn.Linear(DIMS[1], DIMS[2], dtype=np.float64, mesh=mesh, seed=2)
        self.scale = dt.nn.Parameter(
            dt.shard_tensor(np.float64(1.5), mesh, [dt.Replicate()] * mesh.ndim)
        )

    def forward(self, x: Any) -> Any:
        return self.fc2(self.act(self.fc1(x))) * self.scale


def data(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((BATCH, DIMS[0])), rng.standard_normal((BATCH, DIMS[2]))


def optimizer(name: str, params: list) -> Any:
    kw = {"lr": 0.05}
    if name == "Momentum":
        kw["momentum"] = 0.8
    if name in ("Adam", "AdamW"):
        kw["weight_decay"] = 0.01
    return getattr(dt.optim, name)(params, **kw)


def train(
    shape: tuple[int, ...],
    names: tuple[str, ...],
    opt_name: str,
    stage: Any = None,
    dp: bool = False,
    k: int = 1,
    tp: bool = False,
    steps: int = 3,
) -> dict:
    """``steps`` optimizer steps of ``k`` micro-batches each; returns the parameters' global
    values, the collectives per step and what each rank held."""
    mesh = dt.ProcessMesh(np.arange(math.prod(shape)).reshape(shape), list(names))
    model = Scaled(mesh)
    if tp:  # fc1 column-, fc2 row-parallel over "mp"
        plan = {"fc1": dt.nn.ColwiseParallel("mp"), "fc2": dt.nn.RowwiseParallel("mp")}
        dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(plan))
    run = dt.DataParallel(model, mesh, dim="dp", k_steps=k) if dp else model
    opt = optimizer(opt_name, list(model.parameters()))
    if stage is not None:
        opt = dt.shard_optimizer(opt, stage("dp"))
    batch = [dt.Replicate()] * mesh.ndim
    if "dp" in names:
        batch[names.index("dp")] = dt.Shard(0)
    counts, held = [], []
    for step in range(steps):
        with dt.CommCounter() as cc:
            for micro in range(k):
                x, y = data(step * k + micro)
                xs, ys = dt.shard_tensor(x, mesh, batch), dt.shard_tensor(y, mesh, batch)
                loss = ((run(xs) - ys) ** 2).mean()
                loss.backward()
            opt.step()
        held.append(_held(model, opt))
        opt.zero_grad()
        counts.append(dict(cc.counts))
    return {
        "params": {n: p.numpy() for n, p in model.named_parameters()},
        "counts": counts,
        "held": held,
        "mesh": mesh,
        "model": model,
        "opt": opt,
    }


def _held(model: dt.nn.Module, opt: Any) -> dict:
    """Per parameter name: (parameter spec, gradient spec or None, state specs)."""
    inner = getattr(opt, "optimizer", opt)
    out = {}
    for n, p in model.named_parameters():
        state = inner.state.get(id(p), {})
        out[n] = (
            p.spec,
            p.grad.spec if p.grad is not None else None,
            {s: t.spec for s, t in state.items()},
            p.to_local().shape,
            {s: t.to_local().shape for s, t in state.items()},
        )
    return out


def reference(opt_name: str, k: int = 1, steps: int = 3) -> dict:
    """The one-process run: the same training, every micro-batch of a step concatenated
    (the mean loss over the whole batch: what DataParallel(k_steps=k, avg=True) computes)."""
    mesh = dt.ProcessMesh([dt.get_rank()], ["dp"])  # this rank alone: no communication
    model = Scaled(mesh)
    opt = optimizer(opt_name, list(model.parameters()))
    for step in range(steps):
        xs = [data(step * k + m) for m in range(k)]
        x = dt.shard_tensor(np.concatenate([a for a, _ in xs]), mesh, [dt.Replicate()])
        y = dt.shard_tensor(np.concatenate([b for _, b in xs]), mesh, [dt.Replicate()])
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    return {n: p.numpy() for n, p in model.named_parameters()}


# -- checks -----------------------------------------------------------------------------------
def close(got: dict, want: dict, what: str) -> None:
    for n, w in want.items():
        scale = max(1.0, float(np.max(np.abs(w))))
        err = float(np.max(np.abs(got[n] - w))) / scale
        assert err <= TOL, f"{what}: parameter {n} differs from one process by {err:.2e}"


def check_counts(res: dict, stage: int, what: str, modules: int = 2, k: int = 1) -> None:
    """The collectives of every step (``k`` micro-batches) after the first (the first may set
    up layouts)."""
    for counts in res["counts"][1:]:
        kinds = set(counts) - {"check"}
        if stage == 1:
            assert kinds <= {"all_reduce", "all_gather"}, f"{what}: {counts}"
        else:  # the 0-d parameter has no dim to split: its gradient alone is all-reduced
            assert counts.get("all_reduce", 0) <= 1, f"{what}: {counts}"
            assert kinds <= {"reduce_scatter", "all_gather", "all_reduce"}, f"{what}: {counts}"
            assert counts.get("reduce_scatter", 0) >= 1 or res["mesh"].size == 1, (
                f"{what}: {counts}"
            )
        if stage == 3:  # each of the ``modules`` with split parameters gathers its own,
            # for its forward and again for its backward (reshard_after_forward)
            assert counts.get("all_gather", 0) <= 2 * modules * k, f"{what}: {counts}"


def check_held(res: dict, stage: int, what: str) -> None:
    """State (stages 1-3), gradients after the step (2-3) and parameters between steps (3)
    are slices: Shard over dp, at most ceil(n / N) along the split dim."""
    mesh = res["mesh"]
    m = mesh.dim_names.index("dp")
    n_dp = mesh.shape[m]
    for name, (pspec, gspec, states, _pshape, sshapes) in res["held"][-1].items():
        split = pspec.placements[m]
        if stage < 3:
            assert split == dt.Replicate(), f"{what}: {name} is {pspec.placements}"
        # a dim no later mesh dim splits can be split over dp (else the state stays whole:
        # the 0-d scale, and on dp x mp fc1's bias, which mp splits)
        later = {p.dim for p in pspec.placements[m + 1 :] if isinstance(p, dt.Shard)}
        splittable = any(d not in later for d in range(len(pspec.shape)))
        for s, spec in states.items():
            d = spec.placements[m]
            if not splittable:
                assert d == dt.Replicate(), f"{what}: {name}.{s} is {spec.placements}"
                continue
            assert isinstance(d, dt.Shard), f"{what}: {name}.{s} is {spec.placements}"
            whole = spec.with_placement(m, dt.Replicate()).local_shape(
                mesh.get_coord(dt.get_rank())
            )
            bound = math.ceil(whole[d.dim] / n_dp)
            assert sshapes[s][d.dim] <= bound, f"{what}: {name}.{s} holds {sshapes[s]}"
        if stage >= 2 and gspec is not None:
            want = dt.Shard if splittable else dt.Replicate
            assert isinstance(gspec.placements[m], want), f"{what}: {name} grad {gspec}"
        if stage == 3 and splittable:
            assert isinstance(split, dt.Shard), f"{what}: {name} is {pspec.placements}"


def case_stages(world: int) -> int:
    """Every stage and optimizer on the 1-D mesh of ``world`` ranks, with and without
    DataParallel: values, collectives, memory."""
    checks = 0
    for opt_name in OPTIMIZERS:
        want = reference(opt_name)
        for stage in STAGES:
            for dp in (False, True):
                what = f"{stage.__name__} {opt_name} dp={dp} on {world} ranks"
                res = train((world,), ("dp",), opt_name, stage, dp=dp)
                close(res["params"], want, what)
                check_counts(res, stage.stage, what)
                check_held(res, stage.stage, what)
                checks += 1
    return checks


def case_merge(world: int) -> int:
    """DataParallel(k_steps=2) with each stage: the step on the doubled batch."""
    checks = 0
    for opt_name in ("SGD", "Adam"):
        want = reference(opt_name, k=2)
        for stage in STAGES:
            what = f"{stage.__name__} {opt_name} k_steps=2 on {world} ranks"
            res = train((world,), ("dp",), opt_name, stage, dp=True, k=2)
            close(res["params"], want, what)
            check_counts(res, stage.stage, what, k=2)
            checks += 1
    return checks


def case_dp_mp(world: int) -> int:
    """The 2 x 2 dp x mp mesh, fc1 column- and fc2 row-parallel over mp: parameters already
    split over mp are split further over dp (a vector split by mp keeps its state whole)."""
    if world != 4:
        return 0
    checks = 0
    for opt_name in ("SGD", "AdamW"):
        want = reference(opt_name)
        for stage in STAGES:
            for dp in (False, True):
                what = f"{stage.__name__} {opt_name} dp={dp} on the 2x2 dp x mp mesh"
                res = train((2, 2), ("dp", "mp"), opt_name, stage, dp=dp, tp=True)
                close(res["params"], want, what)
                check_held(res, stage.stage, what)
                checks += 1
    return checks


def case_state_dict(world: int) -> int:
    """The state is DistTensors split over dp; load_state_dict takes it back (from any
    layout) and the next steps are those of the uninterrupted run."""
    checks = 0
    for stage in STAGES:
        full = train((world,), ("dp",), "Adam", stage, steps=4)
        part = train((world,), ("dp",), "Adam", stage, steps=2)
        state = part["opt"].state_dict()
        for entry in state["state"].values():
            for t in entry.values():
                if t.shape:
                    assert isinstance(t.placements[0], dt.Shard), t.placements
        # a fresh run from the saved parameters and state, the state given as global arrays
        mesh = part["mesh"]
        model = Scaled(mesh)
        with dt.no_grad():
            for (_n, p), q in zip(model.named_parameters(), part["model"].parameters()):
                p[...] = q.numpy()
        opt = dt.shard_optimizer(optimizer("Adam", list(model.parameters())), stage("dp"))
        opt.load_state_dict(
            {
                "step": state["step"],
                "state": {
                    i: {s: t.numpy() for s, t in e.items()} for i, e in state["state"].items()
                },
            }
        )
        for step in range(2, 4):
            x, y = data(step)
            xs = dt.shard_tensor(x, mesh, [dt.Shard(0)])
            ys = dt.shard_tensor(y, mesh, [dt.Shard(0)])
            ((model(xs) - ys) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        close(
            {n: p.numpy() for n, p in model.named_parameters()},
            full["params"],
            f"{stage.__name__} resumed from its state_dict on {world} ranks",
        )
        checks += 1
    return checks


def case_errors(world: int) -> int:
    """Misuse raises on every rank before any collective."""
    mesh = dt.ProcessMesh(list(range(world)), dim_names=["dp"])
    other = dt.ProcessMesh(list(range(world)), dim_names=["x"])
    checks = 0
    attempts = [
        (
            ValueError,
            "not in this mesh",
            lambda p: dt.shard_optimizer(dt.optim.SGD(p), dt.ShardingStage1("mp")),
        ),
        (
            TypeError,
            "dt.optim optimizer",
            lambda p: dt.shard_optimizer(object(), dt.ShardingStage2("dp")),
        ),
        (TypeError, "ShardingStage1, 2 or 3", lambda p: dt.shard_optimizer(dt.optim.SGD(p), "dp")),
        (
            ValueError,
            "sharding mesh",
            lambda p: dt.shard_optimizer(dt.optim.SGD(p), dt.ShardingStage3("x", mesh=other)),
        ),
        (ValueError, "bucket_size_mb", lambda p: dt.ShardingStage1("dp", bucket_size_mb=0)),
    ]
    for kind, text, attempt in attempts:
        model = Scaled(mesh)
        before = [p.spec for p in model.parameters()]
        with dt.CommCounter() as cc:
            try:
                attempt(list(model.parameters()))
            except kind as e:
                assert text in str(e), f"{kind.__name__} without {text!r}: {e}"
            else:
                raise AssertionError(f"no {kind.__name__} ({text})")
        assert not cc.counts, f"communicated before raising: {cc.counts}"
        assert [p.spec for p in model.parameters()] == before, "parameters changed"
        checks += 1
    opt = dt.shard_optimizer(dt.optim.SGD(list(Scaled(mesh).parameters())), dt.ShardingStage1("dp"))
    try:
        dt.shard_optimizer(opt.optimizer, dt.ShardingStage2("dp"))
    except ValueError as e:
        assert "already sharded" in str(e), e
    else:
        raise AssertionError("sharded twice")
    return checks + 1


def case_scattered_in_backward(world: int) -> int:
    """Stages 2 and 3 with small buckets (Note [Gradients scattered in backward]), under
    DataParallel and without: the reduce-scatters run during backward (the k-th pass with
    gradient merge), the step makes none, every split gradient is a slice when backward
    ends, and the parameters equal one process's."""
    checks = 0
    for k, dp in ((1, True), (2, True), (1, False)):
        want = reference("Adam", k=k)
        for stage in (dt.ShardingStage2, dt.ShardingStage3):
            what = f"{stage.__name__} k_steps={k} dp={dp} on {world} ranks, in backward"
            mesh = dt.ProcessMesh(list(range(world)), ["dp"])
            model = Scaled(mesh)
            tiny = 64 / 2**20  # 64 bytes: a bucket per gradient or two
            run = model
            if dp:
                run = dt.DataParallel(
                    model, mesh, dim="dp", k_steps=k, bucket_size_mb=tiny,
                    first_bucket_size_mb=tiny,
                )  # fmt: skip
            opt = optimizer("Adam", list(model.parameters()))
            opt = dt.shard_optimizer(opt, stage("dp", bucket_size_mb=tiny))
            for step in range(3):
                backward: dict = {}
                for micro in range(k):
                    x, y = data(step * k + micro)
                    xs = dt.shard_tensor(x, mesh, [dt.Shard(0)])
                    ys = dt.shard_tensor(y, mesh, [dt.Shard(0)])
                    loss = ((run(xs) - ys) ** 2).mean()
                    with dt.CommCounter() as cc:
                        loss.backward()
                    backward = dict(cc.counts)
                sliced = [  # the 0-d scale has no dim to split: all-reduced at the step
                    isinstance(p.grad.placements[0], dt.Shard) for p in model.parameters() if p.ndim
                ]
                with dt.CommCounter() as cc:
                    opt.step()
                at_step = dict(cc.counts)
                opt.zero_grad()
                if world > 1:
                    assert backward.get("reduce_scatter", 0) >= 2, f"{what}: {backward}"
                    assert "reduce_scatter" not in at_step, f"{what}: {at_step}"
                    assert all(sliced), f"{what}: a whole gradient after backward"
            close({n: p.numpy() for n, p in model.named_parameters()}, want, what)
            checks += 1
    return checks


MPI_CASES = [
    case_stages,
    case_merge,
    case_dp_mp,
    case_state_dict,
    case_errors,
    case_scattered_in_backward,
]


def main(names: list[str]) -> None:
    world, rank = dt.get_world_size(), dt.get_rank()
    chosen = [c for c in MPI_CASES if not names or c.__name__ in names]
    for case in chosen:
        n = case(world)
        if rank == 0:
            print(f"PASS {case.__name__} ({n} checks)", flush=True)
    if rank == 0:
        print(f"{len(chosen)} passed, 0 failed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
