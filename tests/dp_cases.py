"""dt.DataParallel SPMD cases, their plain-numpy reference, and an mpiexec entry point.

``train(layout, cfg)`` runs one data-parallel training (``dt.DataParallel`` around a
``dt.nn.MLP``, float64, MSE loss, a dt optimizer) on every rank and records the losses, the
gradients after every optimizer step, the final parameters, the bucket layout and the
collectives of every forward, backward and optimizer call. ``check_training`` compares all of
it with ``reference``: tests/numpy_models.py (a hand-written forward/backward and SGD/Adam
that share no code with disttensor) on the WHOLE global batch of each step (the k
micro-batches concatenated; ``avg=False`` is k times its mean-loss gradient), and checks the
collectives against the layout. Failures are collected per rank (``Checks``), so a failure
seen by one rank only fails ``op_cases.assert_grid`` too.

The ``case_dp_*(world)`` functions run on simulated ranks (tests/test_parallel.py) and under
mpiexec: ``mpiexec -n N python tests/dp_cases.py [CASE ...]`` prints one line per case on
rank 0 and a closing 'N passed, 0 failed'; a failing check raises on its rank, which ends the
job through disttensor's abort hook.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy_models as ref
from op_cases import assert_grid

import disttensor as dt

D, HIDDEN, SEED, LR = 6, 8, 3, 0.05
TOL = 1e-9  # float64, relative to the tensor's scale
MiB = 1 << 20
TINY = 1e-4  # MiB, ~105 bytes: (nearly) every gradient of the MLP gets its own bucket
SMALL = (100 / MiB, 500 / MiB)  # (first, other) caps that fuse some gradients and not others
F, T = False, True


# -- what runs --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """A mesh, its data-parallel dims, and whether "mp" is tensor-parallel (fc1 column-,
    fc2 row-parallel). ``fwd_all_reduces``: the model's own all-reduces per forward."""

    shape: tuple[int, ...]
    names: tuple[str, ...]
    dp: tuple[str, ...]
    tp: bool = False
    fwd_all_reduces: int = 0

    def mesh(self) -> dt.ProcessMesh:
        return dt.ProcessMesh(np.arange(math.prod(self.shape)).reshape(self.shape), self.names)

    @property
    def dim(self) -> str | list[str]:
        return self.dp[0] if len(self.dp) == 1 else list(self.dp)

    def batch_placements(self) -> list:
        return [dt.Shard(0) if n in self.dp else dt.Replicate() for n in self.names]

    def __str__(self) -> str:
        what = "x".join(f"{n}{s}" for n, s in zip(self.names, self.shape))
        return what + (" tp" if self.tp else "") + f" dim={self.dim}"


def dp_mesh(world: int) -> Layout:
    return Layout((world,), ("dp",), ("dp",))


# the fc2 output is Partial(sum) over "mp" and the loss needs it whole: one mp all-reduce
DP_MP = Layout((2, 2), ("dp", "mp"), ("dp",), tp=True, fwd_all_reduces=1)
MP_DP = Layout((2, 2), ("mp", "dp"), ("dp",), tp=True, fwd_all_reduces=1)  # dp the inner dim
DP_DP = Layout((2, 2), ("dp", "dp2"), ("dp", "dp2"))  # both mesh dims data-parallel

STEP, DROP, DROP_MODEL = "step", "drop", "drop_model"  # after a step's passes: opt.step(),
# opt.zero_grad() without a step, or dp_model.zero_grad() without a step


@dataclass(frozen=True)
class Config:
    """One training run. ``schedule``: per optimizer step, (one flag per backward pass: the
    "extra" layer is used in that pass, the action after the passes); empty: ``steps``
    steps of ``k`` passes. ``model``: "mlp"; "extra" (an MLP plus a Linear used only in the
    flagged passes); "zero" (fc1.weight Shard(0) over the dp dims, ZeRO-style)."""

    k: int = 1
    avg: bool = True
    fuse: bool = True
    overlap: bool = True
    bucket_mb: float = 25.0
    first_mb: float = 1.0
    opt: str = "SGD"
    batch: int = 10  # global micro-batch rows: uneven on 3 and 4 ranks; 3 rows: an empty shard on 4
    steps: int = 3
    schedule: tuple = ()
    model: str = "mlp"

    def plan(self) -> tuple:
        return self.schedule or tuple(((F,) * self.k, STEP) for _ in range(self.steps))

    def __str__(self) -> str:
        default = Config()
        diff = {k: v for k, v in vars(self).items() if k != "schedule" and v != vars(default)[k]}
        if self.schedule:
            diff["schedule"] = [(sum(1 for _ in u), a) for u, a in self.schedule]
        return "Config(" + ", ".join(f"{k}={v}" for k, v in diff.items()) + ")"


def caps(first_mb: float, bucket_mb: float) -> dict:
    return {"first_mb": first_mb, "bucket_mb": bucket_mb}


# -- the model, dt and numpy ------------------------------------------------------------------
class WithExtra(dt.nn.Module):
    """``mlp(x)``, plus ``extra(x)`` in the passes that ask for it."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = dt.nn.MLP(D, HIDDEN, dtype=np.float64, seed=SEED)
        self.extra = dt.nn.Linear(D, D, dtype=np.float64, seed=SEED + 7)

    def forward(self, x, use_extra: bool = False):
        y = self.mlp(x)
        return y + self.extra(x) if use_extra else y


def build(model: str) -> dt.nn.Module:
    if model == "extra":
        return WithExtra()
    return dt.nn.MLP(D, HIDDEN, dtype=np.float64, seed=SEED)


def numpy_loss(p: dict, x: np.ndarray, y: np.ndarray, use_extra: bool) -> tuple[float, dict]:
    """MSE of the MLP (plus the extra layer) and every used parameter's gradient, in numpy."""
    pre = "mlp." if "mlp.fc1.weight" in p else ""
    grads: dict = {}
    h, back_fc1 = ref.linear(x, p, pre + "fc1", grads)
    g, back_gelu = ref.gelu(h)
    out, back_fc2 = ref.linear(g, p, pre + "fc2", grads)
    if use_extra:
        e, back_extra = ref.linear(x, p, "extra", grads)
        out = out + e
    loss, dout = ref.mse(out, y)
    back_fc1(back_gelu(back_fc2(dout)))
    if use_extra:
        back_extra(dout)
    return loss, grads


def batches(cfg: Config) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per step, per pass, the global micro-batch (x, y): a fixed teacher to learn."""
    rng = np.random.default_rng(11)
    teacher = rng.standard_normal((D, D))
    out = []
    for uses, _ in cfg.plan():
        step = []
        for _ in uses:
            x = rng.standard_normal((cfg.batch, D))
            step.append((x, np.tanh(x @ teacher)))
        out.append(step)
    return out


def reference(cfg: Config, init: dict) -> dict:
    """The single-process run in numpy: each step's gradient from the whole batch of its
    passes (the mean loss over all their rows; the sum of the passes' gradients when
    ``avg=False``); passes that differ in the layers they use are summed pass by pass."""
    p = {n: np.array(v, np.float64) for n, v in init.items()}
    opt = ref.SGD(LR) if cfg.opt == "SGD" else ref.Adam(LR)
    losses, step_losses, grads = [], [], []
    for (uses, action), step in zip(cfg.plan(), batches(cfg)):
        passes = [numpy_loss(p, x, y, u) for u, (x, y) in zip(uses, step)]
        losses += [loss for loss, _ in passes]
        if action != STEP:
            continue
        n = len(uses)
        if len(set(uses)) == 1:  # the whole batch at once
            xs, ys = np.concatenate([x for x, _ in step]), np.concatenate([y for _, y in step])
            loss, g = numpy_loss(p, xs, ys, uses[0])
            g = g if cfg.avg else {k: n * v for k, v in g.items()}
        else:
            loss, g = float(np.mean([loss for loss, _ in passes])), {}
            for _, gj in passes:
                for k, v in gj.items():
                    g[k] = g.get(k, 0.0) + v
            g = {k: v / n for k, v in g.items()} if cfg.avg else g
        step_losses.append(loss)
        grads.append(g)
        opt.step(p, g)
    return {"losses": losses, "step_losses": step_losses, "grads": grads, "params": p}


# -- the data-parallel run --------------------------------------------------------------------
def zero_fn(layout: Layout):
    """shard_layer's shard_fn putting fc1.weight Shard(0) over the dp dims (ZeRO-style)."""

    def fn(name, sub, mesh):
        if name == "fc1":
            pl = [dt.Shard(0) if n in layout.dp else dt.Replicate() for n in layout.names]
            sub.weight = dt.nn.Parameter(dt.shard_tensor(sub.weight, mesh, pl))

    return fn


def make_optimizer(name: str, params) -> dt.optim.Optimizer:
    return dt.optim.SGD(params, lr=LR) if name == "SGD" else dt.optim.Adam(params, lr=LR)


def train(layout: Layout, cfg: Config) -> dict:
    """Run ``cfg`` on ``layout``'s mesh; every rank of the world takes part."""
    mesh = layout.mesh()
    model = build(cfg.model)
    init = {n: p.numpy() for n, p in model.named_parameters()}  # replicated: local copies
    if layout.tp:
        plan = {"fc1": dt.nn.ColwiseParallel("mp"), "fc2": dt.nn.RowwiseParallel("mp")}
        dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(plan))
    else:
        dt.shard_layer(model, mesh, zero_fn(layout) if cfg.model == "zero" else None)
    dp_model = dt.DataParallel(
        model,
        mesh,
        dim=layout.dim,
        bucket_size_mb=cfg.bucket_mb,
        first_bucket_size_mb=cfg.first_mb,
        overlap=cfg.overlap,
        k_steps=cfg.k,
        avg=cfg.avg,
        fuse=cfg.fuse,
    )
    assert dp_model.module is model and dp_model.buckets["buckets"] == []
    dp_idx = [layout.names.index(n) for n in layout.dp]
    named = list(model.named_parameters())
    bucketed = [n for n, p in named if all(p.placements[m] == dt.Replicate() for m in dp_idx)]
    opt = make_optimizer(cfg.opt, dp_model.parameters())
    pls = layout.batch_placements()
    rec: dict[str, Any] = {"losses": [], "steps": [], "init": init, "bucketed": bucketed}
    rec["bucketed_bytes"] = sum(p.to_local().nbytes for n, p in named if n in bucketed)
    loss_fn = dt.nn.MSELoss()
    for (uses, action), step in zip(cfg.plan(), batches(cfg)):
        fwd, bwd, losses = [], [], []
        for use, (xg, yg) in zip(uses, step):
            x, y = dt.shard_tensor(xg, mesh, pls), dt.shard_tensor(yg, mesh, pls)
            with dt.CommCounter() as cf:
                loss = loss_fn(dp_model(x, use_extra=True) if use else dp_model(x), y)
            with dt.CommCounter() as cb:
                loss.backward()
            fwd.append(cf)
            bwd.append(cb)
            losses.append(loss)
        with dt.CommCounter() as ca:
            if action == STEP:
                opt.step()
            elif action == DROP:
                opt.zero_grad()
            else:
                dp_model.zero_grad()
        info: dict[str, Any] = {"action": action, "passes": len(uses), "fwd": fwd, "bwd": bwd}
        info["act"] = ca
        if action == STEP:  # the finished gradients, before they are dropped
            info["grads"] = {n: None if p.grad is None else p.grad.numpy() for n, p in named}
            info["grad_placements"] = {
                n: None if p.grad is None else p.grad.placements for n, p in named
            }
            info["param_placements"] = {n: p.placements for n, p in named}
            with dt.CommCounter() as cz:
                opt.zero_grad()
            info["zero"] = cz
        info["buckets"] = dp_model.buckets
        rec["steps"].append(info)
        rec["losses"] += [float(loss) for loss in losses]  # collective: outside the counters
    rec["params"] = {n: p.numpy() for n, p in named}
    return rec


# -- checks -----------------------------------------------------------------------------------
class Checks:
    """Collects failures instead of stopping at the first (every rank decides alike)."""

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []

    def that(self, ok: bool, what: str) -> None:
        self.count += 1
        if not ok:
            self.failures.append(what)

    def equal(self, got: Any, want: Any, what: str) -> None:
        self.that(got == want, f"{what}: got {got!r}, want {want!r}")

    def close(self, got, want, what: str, tol: float = TOL) -> None:
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.shape != want.shape:
            self.that(False, f"{what}: shape {got.shape}, want {want.shape}")
            return
        err = float(np.abs(got - want).max(initial=0.0))
        scale = float(np.abs(want).max(initial=0.0)) or 1.0
        self.that(err <= tol * scale, f"{what}: max abs diff {err:.3g} ({err / scale:.3g} rel)")

    def result(self) -> tuple[int, list[str]]:
        return self.count, self.failures


def check_training(checks: Checks, layout: Layout, cfg: Config, rec: dict) -> None:
    """``rec`` (a ``train`` run) against the numpy reference and the layout's collectives."""
    want = reference(cfg, rec["init"])
    tag = f"{layout} {cfg}"
    checks.close(rec["losses"], want["losses"], f"{tag}: per-pass losses")
    done = [s for s in rec["steps"] if s["action"] == STEP]
    got_step_losses, i = [], 0
    for s in rec["steps"]:
        if s["action"] == STEP:
            got_step_losses.append(np.mean(rec["losses"][i : i + s["passes"]]))
        i += s["passes"]
    checks.close(got_step_losses, want["step_losses"], f"{tag}: whole-batch losses")
    for t, (s, g_want) in enumerate(zip(done, want["grads"])):
        for name, g in s["grads"].items():
            if name not in g_want:
                checks.that(g is None, f"{tag}: step {t}: {name} has a gradient but no use")
                continue
            checks.close(g, g_want[name], f"{tag}: step {t}: {name}.grad")
            # Replicate over dp, as the parameter elsewhere (a layer new to the layout is
            # left Partial to the optimizer, Note [Gradient buckets]: checked in case_dp_edges)
            if name in rec["bucketed"] and not name.startswith("extra."):
                pl, ppl = s["grad_placements"][name], s["param_placements"][name]
                checks.equal(pl, ppl, f"{tag}: step {t}: {name}.grad placements")
    for name, w in want["params"].items():
        checks.close(rec["params"][name], w, f"{tag}: final {name}")
    check_comm(checks, layout, cfg, rec, tag)


def check_comm(checks: Checks, layout: Layout, cfg: Config, rec: dict, tag: str) -> None:
    """The collectives: every forward has only the model's own (tensor-parallel) ones; the
    passes before the k-th communicate nothing else; the k-th pass's backward (overlap) or
    the step (no overlap) makes one all-reduce per bucket moving every bucketed gradient's
    bytes once; dropping communicates nothing."""
    layout_ = rec["steps"][-1]["buckets"]
    buckets = layout_["buckets"]
    nb, n = len(buckets), len(rec["bucketed"])
    if math.prod(layout.shape[layout.names.index(d)] for d in layout.dp) == 1:
        n = 0  # one data-parallel rank: no gradient is Partial, nothing to reduce
        rec = {**rec, "bucketed_bytes": 0}
    checks.equal(layout_["gradients"], n, f"{tag}: gradients in buckets")
    checks.equal(sum(b["bytes"] for b in buckets), rec["bucketed_bytes"], f"{tag}: bucket bytes")
    checks.that(
        all(b["dims"] == list(layout.dp) and b["reduce"] == "sum" for b in buckets),
        f"{tag}: bucket dims/reduce {buckets}",
    )
    if not cfg.fuse:
        checks.equal([b["gradients"] for b in buckets], [1] * n, f"{tag}: fuse=False buckets")
    elif cfg.bucket_mb >= 1 and cfg.first_mb >= 1:
        checks.equal(nb, min(n, 1), f"{tag}: buckets with caps far above the model")
    if cfg.model != "mlp":
        return  # changing layouts and ZeRO shards add the optimizer's own collectives
    mp = {"all_reduce": layout.fwd_all_reduces} if layout.fwd_all_reduces else {}
    reduce = {"all_reduce": nb} if nb else {}
    for t, s in enumerate(rec["steps"]):
        where = f"{tag}: step {t} ({s['action']}, {s['passes']} passes)"
        for j, (cf, cb) in enumerate(zip(s["fwd"], s["bwd"])):
            checks.equal(cf.counts, mp, f"{where}: forward {j} collectives")
            kth = j == cfg.k - 1
            checks.equal(cb.counts, reduce if kth and cfg.overlap else {}, f"{where}: bwd {j}")
        if s["action"] != STEP:
            checks.equal(s["act"].counts, {}, f"{where}: dropping communicates")
            continue
        reduced_in_bwd = s["passes"] == cfg.k and cfg.overlap
        checks.equal(s["act"].counts, {} if reduced_in_bwd else reduce, f"{where}: step() comm")
        checks.equal(s["zero"].counts, {}, f"{where}: zero_grad after step() comm")
        moved = s["act"].bytes.get("all_reduce", 0)
        moved += sum(c.bytes.get("all_reduce", 0) for c in s["bwd"])
        checks.equal(moved, rec["bucketed_bytes"], f"{where}: all-reduce bytes of the step")


# -- cases ------------------------------------------------------------------------------------
# Covering the options pairwise rather than all combinations: every value of every option,
# and the interactions that matter (merge x avg x overlap, fusion x caps), on every mesh.
GRID = [
    Config(),
    Config(k=2, opt="Adam", **caps(TINY, TINY)),
    Config(k=4, avg=F, overlap=F, **caps(*SMALL)),
    Config(k=4, fuse=F),
    Config(k=2, avg=F, fuse=F, overlap=F, opt="Adam"),
    Config(avg=F, overlap=F, opt="Adam", **caps(*SMALL)),
    Config(k=4, opt="Adam", batch=7, **caps(TINY, TINY)),
    Config(k=2, fuse=F, **caps(TINY, TINY)),
    Config(k=2, avg=F, batch=3),
    Config(k=4, overlap=F, steps=2),
]


def run_grid(layout: Layout, configs: list[Config]) -> tuple[int, list[str]]:
    checks = Checks()
    for cfg in configs:
        check_training(checks, layout, cfg, train(layout, cfg))
    return checks.result()


def case_dp_grid(world: int, configs: list[Config] | None = None) -> tuple[int, list[str]]:
    """Equivalence and collectives on the 1-D "dp" mesh of every rank."""
    return run_grid(dp_mesh(world), GRID if configs is None else configs)


def case_dp_mp(world: int, configs: list[Config] | None = None) -> tuple[int, list[str]]:
    """Equivalence and collectives on the 2x2 dp x mp mesh with tensor parallelism."""
    if world != 4:
        return 0, []
    return run_grid(DP_MP, GRID if configs is None else configs)


EXTRA = ((F,), STEP), ((T,), STEP), ((T,), STEP), ((F,), STEP)  # unused, new, used, absent


def edge_configs(world: int) -> list[tuple[Layout, Config]]:
    """Unused parameters, steps after fewer than k passes, zero_grad dropping accumulation,
    a ZeRO-style parameter (Shard(0) over dp) left out of the buckets."""
    one = dp_mesh(world)
    extra = EXTRA
    extra2 = ((T, F), STEP), ((F, T), STEP), ((T, T), STEP), ((F, F), STEP), ((T, F), STEP)
    short = (
        ((F,) * 4, STEP),
        ((F,) * 2, STEP),
        ((F,) * 3, DROP),
        ((F,) * 4, STEP),
        ((F,), STEP),
        ((F,) * 2, DROP_MODEL),
        ((F,) * 3, STEP),
    )
    first_short = (((F,) * 2, STEP), ((F,) * 4, STEP))  # no layout before the short step
    return [
        (one, Config(model="extra", schedule=extra)),
        (one, Config(model="extra", schedule=extra, overlap=F, **caps(TINY, TINY))),
        (one, Config(model="extra", k=2, schedule=extra2)),
        (one, Config(model="extra", k=2, avg=F, overlap=F, schedule=extra2, **caps(*SMALL))),
        (one, Config(k=4, schedule=short, **caps(*SMALL))),
        (one, Config(k=4, avg=F, overlap=F, schedule=short)),
        (one, Config(k=4, schedule=first_short, fuse=F)),
        (one, Config(model="zero", opt="Adam")),
        (one, Config(model="zero", k=2, **caps(TINY, TINY))),
        (one, Config(model="zero", k=2, avg=F, overlap=F)),
    ]


def case_dp_edges(world: int) -> tuple[int, list[str]]:
    checks = Checks()
    for layout, cfg in edge_configs(world):
        rec = train(layout, cfg)
        check_training(checks, layout, cfg, rec)
        tag, steps = f"{layout} {cfg}", rec["steps"]
        if world == 1:
            continue  # nothing is Partial, nothing bucketed (check_comm)
        if cfg.model == "zero":  # fc1.weight is not in a bucket and keeps its own layout
            checks.equal(steps[-1]["buckets"]["gradients"], 3, f"{tag}: bucketed gradients")
            checks.that("fc1.weight" not in rec["bucketed"], f"{tag}: fc1.weight bucketed")
            pl = steps[-1]["grad_placements"]["fc1.weight"]
            checks.that(pl != [dt.Replicate()], f"{tag}: fc1.weight.grad {pl}")
        if cfg.model == "extra" and cfg.k == 1:  # extra: unused, new (left to the optimizer,
            # the layout rebuilt at the next reduction), bucketed, unused (no gradient)
            got = [s["buckets"]["gradients"] for s in steps]
            checks.equal(got, [4, 4, 6, 6], f"{tag}: bucketed gradients per step")
            got = [s["grad_placements"]["extra.weight"] for s in steps]
            want = [None, [dt.Replicate()], [dt.Replicate()], None]  # step 1: the step's
            checks.equal(got, want, f"{tag}: extra.weight.grad placements per step")
            # one all-reduce per bucket each step; in step 1 the optimizer also reduces the
            # new layer's two gradients itself, together (Note [Gradients reduced at the step])
            got = [sum(c["all_reduce"] for c in [*s["bwd"], s["act"]]) for s in steps]
            want = [len(s["buckets"]["buckets"]) + (t == 1) for t, s in enumerate(steps)]
            checks.equal(got, want, f"{tag}: all-reduces per step")
    return checks.result()


# -- bucket layout ----------------------------------------------------------------------------
def expected_layout(order, nbytes, dtypes, first: int, rest: int) -> list[list[str]]:
    """Greedy buckets in arrival order: per dtype, a bucket takes gradients up to its cap
    (the first bucket of a dtype the first cap), or one gradient larger than the cap; the
    buckets still open at the end of backward are closed in the order they were opened."""
    closed, open_, seen = [], {}, set()
    for name in order:
        key = dtypes[name]
        b = open_.get(key)
        if b is not None:
            cap = rest if key in seen else first
            if sum(nbytes[m] for m in b) + nbytes[name] > cap:
                closed.append(open_.pop(key))
                seen.add(key)
                b = None
        if b is None:
            b = open_[key] = []
        b.append(name)
    return closed + list(open_.values())  # dicts keep insertion order: opened first


def buffer_of(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory."""
    while a.base is not None:
        a = a.base
    return a


def mixed_model() -> dt.nn.Module:
    """float32 then float64 layers; the float32 layer's gradients stay float32."""
    return dt.nn.Sequential(
        dt.nn.Linear(D, HIDDEN, dtype=np.float32, seed=SEED),
        dt.nn.Tanh(),
        dt.nn.Linear(HIDDEN, D, dtype=np.float64, seed=SEED + 1),
    )


def layout_run(world: int, model_name: str, first: int, rest: int, short: bool = False) -> dict:
    """Two SGD steps; per step, the all-reduces already started when each gradient of the
    last pass became final (our hooks run before DataParallel's), the collectives of the
    last backward and of step(), and the finished gradients' placements and local arrays.
    ``short``: k_steps=2 and the first step after one pass (the layout decided in step())."""
    mesh = dt.ProcessMesh(list(range(world)), dim_names=["dp"])
    model = mixed_model() if model_name == "mixed" else build("mlp")
    dt.shard_layer(model, mesh)
    named = list(model.named_parameters())
    arrivals: list[tuple[str, int]] = []  # (gradient final, all-reduces started before)
    counter: list[dt.CommCounter] = []
    for n, p in named:
        p.register_post_accumulate_grad_hook(
            lambda _, n=n: arrivals.append((n, counter[-1]["all_reduce"]))
        )
    dp_model = dt.DataParallel(
        model, mesh, first_bucket_size_mb=first / MiB, bucket_size_mb=rest / MiB, k_steps=1 + short
    )
    opt = dt.optim.SGD(dp_model.parameters(), lr=LR)
    rng = np.random.default_rng(5)
    pls = [dt.Shard(0)]
    out: dict[str, Any] = {}
    xtype = np.float32 if model_name == "mixed" else np.float64
    for step in range(2):
        earlier = []
        for _ in range(1 + (short and step == 1)):
            x = dt.shard_tensor(rng.standard_normal((10, D)).astype(xtype), mesh, pls)
            y = dt.shard_tensor(rng.standard_normal((10, D)), mesh, pls)
            loss = dt.nn.MSELoss()(dp_model(x), y)
            arrivals.clear()
            with dt.CommCounter() as cb:
                counter.append(cb)
                loss.backward()
            earlier.append(cb.counts)
        with dt.CommCounter() as cc:
            opt.step()
        out[f"step{step}"] = {
            "arrivals": list(arrivals),
            "earlier": earlier[:-1],
            "backward": earlier[-1],
            "counts": cc.counts,
            "placements": {n: p.grad.placements for n, p in named},
            "locals": {n: p.grad.to_local() for n, p in named},
        }
        opt.zero_grad()
    out["order"] = [n for n, _ in out["step0"]["arrivals"]]
    out["nbytes"] = {n: p.to_local().nbytes for n, p in named}
    out["dtypes"] = {n: p.dtype.str for n, p in named}
    out["buckets"] = dp_model.buckets
    return out


LAYOUT_CAPS = [  # (first, other) caps in bytes; the MLP's gradients: 48, 384, 64, 384 bytes
    (100, 500),
    (500, 100),
    (104, 104),
    (MiB, 25 * MiB),
    (432, 100),  # a bucket exactly at its cap is kept
    (48, 448),
]


def case_dp_layout(world: int) -> tuple[int, list[str]]:
    """Buckets never mix dtypes, respect their caps (the first bucket the first cap), follow
    the backward order (the last layer's gradients first), and hold the reduced gradients
    as views of one buffer per bucket, Replicate over dp. Needs 2 ranks or more."""
    checks = Checks()
    if world == 1:
        return checks.result()
    runs = [("mlp", c, False) for c in LAYOUT_CAPS]
    runs += [("mlp", (100, 500), True), ("mlp", (104, 104), True)]  # first step short
    runs += [("mixed", (100, 500), False), ("mixed", (MiB, MiB), False)]
    for model_name, (first, rest), short in runs:
        r = layout_run(world, model_name, first, rest, short)
        tag = f"{model_name} caps={first},{rest}" + (" first step short" if short else "")
        order, nbytes, dtypes = r["order"], r["nbytes"], r["dtypes"]
        want = expected_layout(order, nbytes, dtypes, first, rest)
        checks.that(order[0].startswith(("fc2.", "2.")), f"{tag}: backward order {order}")
        checks.that(order[0] in want[0], f"{tag}: first bucket {want[0]}, order {order}")
        got = r["buckets"]["buckets"]
        checks.equal(
            [(b["bytes"], b["gradients"], b["dtype"]) for b in got],
            [(sum(nbytes[n] for n in b), len(b), dtypes[b[0]]) for b in want],
            f"{tag}: layout, expected {want}",
        )
        for i, b in enumerate(got):  # the caps, independently of the greedy order
            cap = rest if any(x["dtype"] == b["dtype"] for x in got[:i]) else first
            checks.that(b["bytes"] <= cap or b["gradients"] == 1, f"{tag}: bucket {i} cap")
        checks.that(
            bool(got) and (got[0]["bytes"] <= first or got[0]["gradients"] == 1), f"{tag}: 1st cap"
        )
        if model_name == "mixed":
            checks.equal(sorted({b["dtype"] for b in got}), ["<f4", "<f8"], f"{tag}: dtypes")
        for step in ("step0", "step1"):
            s = r[step]
            nb = {"all_reduce": len(want)}
            in_step = short and step == "step0"  # one pass of two: step() reduces
            checks.equal(s["counts"], nb if in_step else {}, f"{tag}: {step}: step() comm")
            checks.equal(s["backward"], {} if in_step else nb, f"{tag}: {step}: backward")
            checks.equal(s["earlier"], [{}] * len(s["earlier"]), f"{tag}: {step}: 1st pass")
            if model_name == "mlp" and not in_step:  # overlap: a bucket starts while
                # backward still runs, when its last gradient is final (layout known), or
                # when the next gradient no longer fits (first backward, layout forming)
                pos = {n: i for i, n in enumerate(order)}
                ends = [pos[b[-1]] + (step == "step0") for b in want]
                started = [sum(e < i for e in ends) for i in range(len(order))]
                checks.equal([c for _, c in s["arrivals"]], started, f"{tag}: {step}: started")
            for n, pl in s["placements"].items():
                checks.equal(pl, [dt.Replicate()], f"{tag}: {step} {n}.grad placements")
            locs = s["locals"]
            for b in want:  # views of one buffer per bucket, disjoint
                bufs = [buffer_of(locs[n]) for n in b]
                checks.that(
                    all(locs[n].dtype.str == dtypes[b[0]] for n in b), f"{tag}: dtypes in {b}"
                )
                checks.that(all(x is bufs[0] for x in bufs), f"{tag}: {step} {b}: one buffer")
                nbytes_i = sum(nbytes[n] for n in b)
                checks.equal(bufs[0].nbytes, nbytes_i, f"{tag}: {step} {b}: buffer bytes")
                checks.that(
                    all(np.shares_memory(bufs[0], locs[n]) for n in b), f"{tag}: {step} views"
                )
                for other in want:
                    share = [buffer_of(locs[n]) is bufs[0] for n in other]
                    checks.equal(share, [other is b] * len(other), f"{tag}: {step} {b} buffer")
                overlap = [np.shares_memory(locs[m], locs[n]) for m in b for n in b if m < n]
                checks.that(not any(overlap), f"{tag}: {step} {b}: gradients overlap")
    return checks.result()


# -- errors -----------------------------------------------------------------------------------
def case_dp_errors(world: int) -> list:
    """Every misuse raises on every rank before any collective; returns, per attempt, the
    exception's type and message and the collectives counted around it."""
    mesh = dt.ProcessMesh(list(range(world)), dim_names=["dp"])
    model = dt.shard_layer(build("mlp"), mesh)
    elsewhere = dt.ProcessMesh(np.arange(world).reshape(1, world), dim_names=["pp", "dp"])
    zero = dt.shard_layer(build("mlp"), mesh)
    for sub in (zero.fc1, zero.fc2):  # every parameter Shard(0) over dp
        for name in ("weight", "bias"):
            p = getattr(sub, name)
            setattr(sub, name, dt.nn.Parameter(dt.shard_tensor(p, mesh, [dt.Shard(0)])))
    attempts = {
        "model type": lambda: dt.DataParallel(lambda x: x, mesh),
        "mesh type": lambda: dt.DataParallel(model, [0, 1]),
        "unknown dim": lambda: dt.DataParallel(model, mesh, dim="nope"),
        "no dim": lambda: dt.DataParallel(model, mesh, dim=[]),
        "bucket 0": lambda: dt.DataParallel(model, mesh, bucket_size_mb=0),
        "bucket -1": lambda: dt.DataParallel(model, mesh, bucket_size_mb=-1.0),
        "first bucket 0": lambda: dt.DataParallel(model, mesh, first_bucket_size_mb=0),
        "k_steps 0": lambda: dt.DataParallel(model, mesh, k_steps=0),
        "k_steps 1.5": lambda: dt.DataParallel(model, mesh, k_steps=1.5),
        "k_steps True": lambda: dt.DataParallel(model, mesh, k_steps=True),
        "other mesh": lambda: dt.DataParallel(model, elsewhere),
        "all ZeRO": lambda: dt.DataParallel(zero, mesh),
        "no parameters": lambda: dt.DataParallel(dt.nn.GELU(), mesh),
    }
    out = []
    for what, fn in attempts.items():
        with dt.CommCounter() as cc:
            try:
                fn()
                out.append((what, None, "", cc.counts))
            except Exception as e:
                out.append((what, type(e).__name__, str(e), cc.counts))
    dp_model = dt.DataParallel(model, mesh)  # the failures left nothing behind
    with dt.CommCounter() as cc:
        try:
            dt.DataParallel(model, mesh)
            out.append(("twice", None, "", cc.counts))
        except Exception as e:
            out.append(("twice", type(e).__name__, str(e), cc.counts))
    x = dt.shard_tensor(np.ones((4, D)), mesh, [dt.Shard(0)])
    with dt.CommCounter() as cc:
        dp_model(x).sum().backward()
        dp_model.finish_gradients()
    out.append(("wrapped once", None, "", cc.counts))
    return out


ERRORS = {  # attempt -> (exception, a fragment of its message)
    "model type": (TypeError, "dt.nn.Module"),
    "mesh type": (TypeError, "ProcessMesh"),
    "unknown dim": (ValueError, "'nope'"),
    "no dim": (ValueError, "dim"),
    "bucket 0": (ValueError, "bucket_size_mb"),
    "bucket -1": (ValueError, "bucket_size_mb"),
    "first bucket 0": (ValueError, "first_bucket_size_mb"),
    "k_steps 0": (ValueError, "k_steps"),
    "k_steps 1.5": (ValueError, "k_steps"),
    "k_steps True": (ValueError, "k_steps"),
    "other mesh": (ValueError, "no parameter"),
    "all ZeRO": (ValueError, "no parameter"),
    "no parameters": (ValueError, "no parameter"),
    "twice": (ValueError, "already wrapped"),
}


def check_errors(checks: Checks, world: int, got: list) -> None:
    """``case_dp_errors``'s attempts: each raised the expected error with a clear message
    and no collective; afterwards the model wrapped once and reduced its gradient."""
    *failed, (last, _, _, counts) = got
    checks.equal([what for what, *_ in failed], list(ERRORS), "attempts")
    for what, kind, message, cc in failed:
        want_kind, fragment = ERRORS.get(what, (None, ""))
        checks.equal(kind, want_kind.__name__, f"{what}: raised ({message!r})")
        clear = fragment in message and ("DataParallel" in message or what == "unknown dim")
        checks.that(clear, f"{what}: unclear message {message!r}")
        checks.equal(cc, {}, f"{what}: collectives before the error")
    want = {"all_reduce": 1} if world > 1 else {}
    checks.equal((last, counts), ("wrapped once", want), "wrapping after the failures")


def case_dp_errors_grid(world: int) -> tuple[int, list[str]]:
    checks = Checks()
    check_errors(checks, world, case_dp_errors(world))
    return checks.result()


# -- mpiexec ----------------------------------------------------------------------------------
MPI_CASES = [case_dp_grid, case_dp_edges, case_dp_layout, case_dp_errors_grid, case_dp_mp]


def main(names: list[str]) -> None:
    world, rank = dt.get_world_size(), dt.get_rank()
    chosen = [c for c in MPI_CASES if not names or c.__name__ in names]
    total = 0
    for case in chosen:
        t = time.perf_counter()
        count = assert_grid([case(world)], minimum=0, ranks=[rank])
        total += count
        dt.barrier()
        if rank == 0:
            took = time.perf_counter() - t
            print(f"PASS {case.__name__} on {world} ranks ({took:.1f} s, {count} checks)")
    assert total > 0, f"no check ran on {world} ranks"
    if rank == 0:
        print(f"{len(chosen)} passed, 0 failed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
