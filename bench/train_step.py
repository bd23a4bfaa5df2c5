"""Training step time of an MLP: 1 rank against 2 ranks of tensor parallelism, in one run.

Run (2 ranks; each rank one thread)::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/train_step.py
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/train_step.py --quick   # smoke run, seconds

The model is ``Linear(dim, hidden) -> GELU -> Linear(hidden, dim)``, an MSE loss and an Adam
step (dim 1024, hidden 4096, batch 64, float32 by default). One step is forward, backward,
``opt.step()`` and ``zero_grad()``; the loss is read with ``float()`` (a collective) so
every step ends synchronized. Three variants, interleaved in rounds (bench/_timing.py):

    numpy      the same step written by hand in numpy on rank 0 (rank 1 idles): the floor
    dt 1 rank  dt on a 1-rank mesh on rank 0 (rank 1 idles)
    dt 2 ranks dt on a 1-D mesh of 2: fc1 column-parallel, fc2 row-parallel (Megatron); the
               batch is Replicate; one all-reduce of the (batch, dim) output per step

Before the timing, in ``--quick`` too, an agreement check (float64 whatever ``--dtype``, at
the run's sizes) builds the three variants afresh from the same initial parameters (the
1-rank model's must equal the 2-rank model's, gathered, exactly) and takes 3 steps, a new
batch each. Rank 1 compares dt 2 ranks with numpy (written independently of dt), rank 0
dt 1 rank with dt 2 ranks:

* every step's loss, to a relative 1e-10: a loss off by a factor fails;
* every step's gradients, read after ``backward()``, to 1e-10 of each tensor's largest
  element: a gradient off by a factor fails, which Adam, normalizing the gradient's scale
  away, would show only through its epsilon; so do gradients left to accumulate;
* the parameters after the 3 steps, to 1e-8 of how far each tensor moved (``max|p_a -
  p_b| <= 1e-8 * max|p_b - p_initial|``), and every variant must have moved every tensor:
  a skipped ``opt.step()`` or a wrong Adam update (a dropped bias correction) fails.

On a mismatch every rank exits non-zero and rank 0 prints what differed and by how much;
no time is reported. The timed models are built by the same code at the timing dtype.

Reported: the median step time of each and the speed-ups ``dt 1 rank / dt 2 ranks`` (the
issue's goal: at least 1.8x) and ``numpy / dt 1 rank`` (dt's overhead on one rank).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import format_table, interleaved  # noqa: E402

import disttensor as dt  # noqa: E402

C = float(np.sqrt(2 / np.pi))  # a Python float: keeps float32 arrays float32
LR = 1e-4
CHECK_STEPS = 3
LOSS_TOL = 1e-10  # |loss_a - loss_b| / |loss_b|, every step
GRAD_TOL = 1e-10  # max|g_a - g_b| / max|g_b|, per tensor, every step
PARAM_TOL = 1e-8  # max|p_a - p_b| / max|p_b - p_initial|, per tensor, at the end


def _gelu(h):
    return 0.5 * h * (1 + np.tanh(C * (h + 0.044715 * h**3)))


def _gelu_grad(h):
    t = np.tanh(C * (h + 0.044715 * h**3))
    return 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * C * (1 + 3 * 0.044715 * h * h)


class NumpyMLP:
    """The same model and Adam step, by hand (the baseline a user could write on one rank)."""

    def __init__(self, params: list[np.ndarray], lr: float) -> None:
        self.p = [a.copy() for a in params]
        self.m = [np.zeros_like(a) for a in params]
        self.v = [np.zeros_like(a) for a in params]
        self.t, self.lr = 0, lr

    def step(self, x: np.ndarray, target: np.ndarray, grads_out: list | None = None) -> float:
        w1, b1, w2, b2 = self.p
        h = x @ w1 + b1
        a = _gelu(h)
        d = a @ w2 + b2 - target
        loss = float((d * d).mean())
        gy = d * (2 / d.size)
        grads = [None, None, a.T @ gy, gy.sum(0)]
        gh = (gy @ w2.T) * _gelu_grad(h)
        grads[0], grads[1] = x.T @ gh, gh.sum(0)
        if grads_out is not None:  # the agreement check
            grads_out.extend(grads)
        self.t += 1
        for p, g, m, v in zip(self.p, grads, self.m, self.v):
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * (g * g)
            p -= (self.lr / (1 - 0.9**self.t)) * m / (np.sqrt(v / (1 - 0.999**self.t)) + 1e-8)
        return loss


def make_dt(mesh: dt.ProcessMesh, args, tp: bool, dtype: np.dtype):
    dt.manual_seed(0)
    # drawn on the mesh it trains on: the 1-rank model is built by rank 0 alone, and a draw
    # on every rank's mesh by one rank would leave the others behind (RanksDiverged)
    model = dt.nn.MLP(args.dim, args.hidden, dtype=dtype, mesh=mesh if mesh.size == 1 else None)
    plan = {"fc1": dt.nn.ColwiseParallel(), "fc2": dt.nn.RowwiseParallel()} if tp else {}
    dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(plan))
    opt = dt.optim.Adam(model.parameters(), lr=LR)
    loss_fn = dt.nn.MSELoss()

    def step(x, target, grads_out: list | None = None):
        loss = loss_fn(model(x), target)
        loss.backward()
        if grads_out is not None:  # the agreement check: gather the gradients (collective)
            grads_out.extend(p.grad.numpy() for p in model.parameters())
        opt.step()
        opt.zero_grad()
        return float(loss)

    return model, step


def _rel(a: np.ndarray, b: np.ndarray, scale: float) -> float:
    """max|a - b| / scale (inf when scale is 0 and a != b)."""
    diff = float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def agreement_check(comm, args, one: dt.ProcessMesh, two: dt.ProcessMesh) -> None:
    """The three variants, afresh in float64, take CHECK_STEPS steps and must agree (module
    docstring); on a mismatch every rank exits non-zero.

    Both ranks run the 2-rank model's steps and ``.numpy()`` gathers (collectives on ``two``)
    in the same order, so both hold its results. Between them rank 0 runs the 1-rank-mesh
    model and rank 1, in parallel, the numpy step (from the 2-rank model's gathered initial
    parameters). Rank 0 compares dt 1 rank with dt 2 ranks, rank 1 dt 2 ranks with numpy;
    an allgather brings every rank the verdict and rank 0 prints it."""
    rank = comm.Get_rank()
    start = time.perf_counter()
    f64 = np.dtype(np.float64)
    model1, step1 = make_dt(one, args, tp=False, dtype=f64) if rank == 0 else (None, None)
    model2, step2 = make_dt(two, args, tp=True, dtype=f64)
    names = [n for n, _ in model2.named_parameters()]
    init = [p.numpy() for p in model2.parameters()]  # collective on `two`
    init1 = [p.numpy() for p in model1.parameters()] if rank == 0 else None
    # this rank's other variant: the 1-rank-mesh model on rank 0, the numpy step on rank 1;
    # rank 0 compares it (a) with dt 2 ranks (b), rank 1 dt 2 ranks (a) with it (b)
    mine = "dt 1 rank" if rank == 0 else "numpy"
    a, b = (mine, "dt 2 ranks") if rank == 0 else ("dt 2 ranks", mine)
    ref = NumpyMLP(init, LR) if rank == 1 else None
    failures: list[str] = []
    worst = {"loss": 0.0, "gradients": 0.0, "parameters": 0.0}

    def check(kind: str, what: str, r: float, tol: float) -> None:
        worst[kind] = max(worst[kind], r)
        if not r <= tol:
            failures.append(f"{what}: relative difference {r:.3g} > tolerance {tol:g}")

    def compare(what: str, fn, *fn_args) -> None:
        try:  # a comparison that cannot run is a failure too (and the collectives go on)
            fn(*fn_args)
        except Exception as e:
            failures.append(f"rank {rank}: comparing {what} raised {e!r}")

    def compare_step(s: int, loss: dict, grads: dict) -> None:
        check(
            "loss",
            f"step {s} loss, {a} ({loss[a]!r}) vs {b} ({loss[b]!r})",
            _rel(loss[a], loss[b], abs(loss[b])),
            LOSS_TOL,
        )
        for name, ga, gb in zip(names, grads[a], grads[b], strict=True):
            scale = float(np.max(np.abs(gb)))
            check(
                "gradients",
                f"step {s} gradient of {name}, {a} vs {b} "
                f"(max|g {a}| {np.max(np.abs(ga)):.3g}, max|g {b}| {scale:.3g})",
                _rel(ga, gb, scale),
                GRAD_TOL,
            )

    def compare_params(final: dict) -> None:
        if rank == 0:
            for name, p1, p2 in zip(names, init1, init, strict=True):
                r = _rel(p1, p2, 1.0)
                check("parameters", f"initial {name}, dt 1 rank vs dt 2 ranks", r, 0.0)
        for i, name in enumerate(names):
            moved = {v: float(np.max(np.abs(final[v][i] - init[i]))) for v in (a, b)}
            for v in (a, b) if rank == 0 else (mine,):
                if not moved[v] > 0:
                    failures.append(f"{name} of {v} did not change in {CHECK_STEPS} steps")
            check(
                "parameters",
                f"{name} after {CHECK_STEPS} steps, {a} vs {b} "
                f"(relative to the change max|p_{b} - p_initial| {moved[b]:.3g})",
                _rel(final[a][i], final[b][i], moved[b]),
                PARAM_TOL,
            )

    rng = np.random.default_rng(1)
    for s in range(1, CHECK_STEPS + 1):
        x_np, t_np = rng.standard_normal((2, args.batch, args.dim))
        loss: dict[str, float] = {}
        grads: dict[str, list[np.ndarray]] = {mine: [], "dt 2 ranks": []}
        if rank == 0:
            x1, t1 = (dt.shard_tensor(v, one, [dt.Replicate()]) for v in (x_np, t_np))
            loss[mine] = step1(x1, t1, grads[mine])
        else:
            loss[mine] = ref.step(x_np, t_np, grads[mine])
        x2, t2 = (dt.shard_tensor(v, two, [dt.Replicate()]) for v in (x_np, t_np))
        loss["dt 2 ranks"] = step2(x2, t2, grads["dt 2 ranks"])
        compare(f"step {s}", compare_step, s, loss, grads)
    final = {"dt 2 ranks": [p.numpy() for p in model2.parameters()]}  # collective on `two`
    final[mine] = [p.numpy() for p in model1.parameters()] if rank == 0 else ref.p
    compare("the parameters", compare_params, final)
    verdicts = comm.allgather((failures, worst))
    failures = [f for fs, _ in verdicts for f in fs]
    if failures:
        if rank == 0:
            print(
                "train_step: agreement check FAILED (float64, the three variants must agree; "
                "the benchmark is invalid):",
                *(f"  {f}" for f in failures),
                sep="\n",
                flush=True,
            )
            sys.exit(1)
        sys.exit(f"train_step rank {rank}: agreement check failed (rank 0 printed what differed)")
    if rank == 0:
        worst = {k: max(w[k] for _, w in verdicts) for k in worst}
        print(
            f"agreement check (float64, {CHECK_STEPS} steps): losses, gradients and parameters "
            f"agree (max rel diff: loss {worst['loss']:.1e}, gradients "
            f"{worst['gradients']:.1e}, parameters {worst['parameters']:.1e}; tolerances "
            f"{LOSS_TOL:g}, {GRAD_TOL:g}, {PARAM_TOL:g}; {time.perf_counter() - start:.2f} s)",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, a few steps")
    args = ap.parse_args()
    if args.quick:
        args.dim, args.hidden, args.batch, args.steps, args.rounds = 32, 64, 8, 4, 2
    args.dtype = np.dtype(args.dtype)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size != 2:
        sys.exit("bench/train_step.py compares 1 rank with 2: run it with mpiexec -n 2")

    one = dt.ProcessMesh([0])
    two = dt.ProcessMesh([0, 1], dim_names=["mp"])
    agreement_check(comm, args, one, two)

    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((args.batch, args.dim)).astype(args.dtype)
    t_np = rng.standard_normal((args.batch, args.dim)).astype(args.dtype)
    model1, step1 = make_dt(one, args, tp=False, dtype=args.dtype)
    _, step2 = make_dt(two, args, tp=True, dtype=args.dtype)
    x1, t1 = (dt.shard_tensor(a, one, [dt.Replicate()]) for a in (x_np, t_np))
    x2, t2 = (dt.shard_tensor(a, two, [dt.Replicate()]) for a in (x_np, t_np))
    ref = NumpyMLP([p.to_local() for p in model1.parameters()], LR) if rank == 0 else None

    def on_rank0(fn):
        return (lambda: fn()) if rank == 0 else (lambda: None)

    fns = {
        "numpy": on_rank0(lambda: ref.step(x_np, t_np)),
        "dt 1 rank": on_rank0(lambda: step1(x1, t1)),
        "dt 2 ranks": lambda: step2(x2, t2),
    }
    for fn in fns.values():  # warm-up: caches, allocations
        comm.Barrier()
        fn()
    stats = interleaved(comm, fns, args.steps, args.rounds)

    if rank == 0:
        rows = [[name, f"{s.median * 1e3:.2f}", f"{s.spread:.0%}"] for name, s in stats.items()]
        print(
            f"MLP {args.dim}-{args.hidden}-{args.dim}, batch {args.batch}, {args.dtype.name}, "
            f"Adam; {len(stats['numpy'].times)} steps per variant, 1 thread per rank"
        )
        print(format_table(["variant", "step ms (median)", "IQR"], rows))
        speedup = stats["dt 1 rank"].median / stats["dt 2 ranks"].median
        overhead = stats["dt 1 rank"].median / stats["numpy"].median
        print(f"speed-up, 2 ranks TP over 1 rank: {speedup:.2f}x (goal >= 1.8x)")
        print(f"dt 1 rank / hand-written numpy:   {overhead:.2f}x")


if __name__ == "__main__":
    main()
