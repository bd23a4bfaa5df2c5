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

Reported: the median step time of each and the speed-ups ``dt 1 rank / dt 2 ranks`` (the
issue's goal: at least 1.8x) and ``numpy / dt 1 rank`` (dt's overhead on one rank).
"""

from __future__ import annotations

import argparse
import os
import sys

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import format_table, interleaved  # noqa: E402

import disttensor as dt  # noqa: E402

C = float(np.sqrt(2 / np.pi))  # a Python float: keeps float32 arrays float32


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

    def step(self, x: np.ndarray, target: np.ndarray) -> float:
        w1, b1, w2, b2 = self.p
        h = x @ w1 + b1
        a = _gelu(h)
        d = a @ w2 + b2 - target
        loss = float((d * d).mean())
        gy = d * (2 / d.size)
        grads = [None, None, a.T @ gy, gy.sum(0)]
        gh = (gy @ w2.T) * _gelu_grad(h)
        grads[0], grads[1] = x.T @ gh, gh.sum(0)
        self.t += 1
        for p, g, m, v in zip(self.p, grads, self.m, self.v):
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * (g * g)
            p -= (self.lr / (1 - 0.9**self.t)) * m / (np.sqrt(v / (1 - 0.999**self.t)) + 1e-8)
        return loss


def make_dt(mesh: dt.ProcessMesh, args, tp: bool):
    dt.manual_seed(0)
    model = dt.nn.MLP(args.dim, args.hidden, dtype=args.dtype)
    plan = {"fc1": dt.nn.ColwiseParallel(), "fc2": dt.nn.RowwiseParallel()} if tp else {}
    dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(plan))
    opt = dt.optim.Adam(model.parameters(), lr=1e-4)
    loss_fn = dt.nn.MSELoss()

    def step(x, target):
        loss = loss_fn(model(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss)

    return model, step


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

    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((args.batch, args.dim)).astype(args.dtype)
    t_np = rng.standard_normal((args.batch, args.dim)).astype(args.dtype)

    one = dt.ProcessMesh([0])
    two = dt.ProcessMesh([0, 1], dim_names=["mp"])
    model1, step1 = make_dt(one, args, tp=False)
    model2, step2 = make_dt(two, args, tp=True)
    x1, t1 = (dt.shard_tensor(a, one, [dt.Replicate()]) for a in (x_np, t_np))
    x2, t2 = (dt.shard_tensor(a, two, [dt.Replicate()]) for a in (x_np, t_np))
    ref = NumpyMLP([p.to_local() for p in model1.parameters()], 1e-4) if rank == 0 else None

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

    # the three copies of the model took the same steps: they must agree
    first = [p.numpy() for p in model2.parameters()]
    if rank == 0:
        for a, b, c in zip(first, [p.to_local() for p in model1.parameters()], ref.p):
            tol = 1e-3 if args.dtype == np.float32 else 1e-9
            if not (
                np.allclose(a, b, rtol=tol, atol=tol) and np.allclose(b, c, rtol=tol, atol=tol)
            ):
                sys.exit("train_step: the three variants diverged; the benchmark is invalid")
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
