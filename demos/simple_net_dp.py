"""Data parallelism on the semi-auto parallel papers' demo net: two matmuls and an MSE loss.

    mpiexec -n 4 python demos/simple_net_dp.py [--dtype float64|float32] [--steps 5]

The input batch is split by rows (Shard(0)) over all ranks; both weights are replicated.
Forward and backward run with no communication: each weight's gradient comes out
Partial(sum) (every rank holds its batch rows' share), and SGD's step all-reduces it. The
same program on one process must give the same losses, gradients and parameters.
"""

from __future__ import annotations

import numpy as np
from _common import (
    Stopwatch,
    check,
    collectives,
    grads,
    ok,
    options,
    params,
    perturb,
    progress,
    say,
    single_mesh,
)

import disttensor as dt

BATCH, IN, HIDDEN, OUT = 32, 16, 64, 8


def weight(shape, seed: int, mesh, dtype) -> dt.DistTensor:
    """A replicated weight drawn from N(0, 1/fan_in): the same values on every mesh."""
    with dt.no_grad():
        w = dt.randn(shape, dtype, seed=seed, mesh=mesh, placements=[dt.Replicate()])
        w = w * (1 / np.sqrt(shape[0]))
    return dt.nn.Parameter(w)


def loss_fn(x, y, w0, w1):
    h = dt.matmul(x, w0)  # matmul 1
    out = dt.matmul(h, w1)  # matmul 2
    return dt.mean(dt.square(dt.subtract(out, y)))  # MSE: subtract, square, mean


def train(mesh: dt.ProcessMesh, steps: int, dtype, show: bool = False, bad: bool = False):
    w0, w1 = weight((IN, HIDDEN), 1, mesh, dtype), weight((HIDDEN, OUT), 2, mesh, dtype)
    if bad:
        perturb(w0)
    opt = dt.optim.SGD([w0, w1], lr=0.05)
    rng = np.random.default_rng(0)  # the same batches on every rank
    losses = []
    for step in range(1, steps + 1):
        x, y = rng.standard_normal((BATCH, IN)), rng.standard_normal((BATCH, OUT))
        opt.zero_grad()
        with Stopwatch() as t:
            x = dt.shard_tensor(x.astype(dtype), mesh, [dt.Shard(0)])  # split the batch
            y = dt.shard_tensor(y.astype(dtype), mesh, [dt.Shard(0)])
            with dt.CommCounter() as fwd:
                loss = loss_fn(x, y, w0, w1)
            with dt.CommCounter() as bwd:
                loss.backward()
            with dt.CommCounter() as upd:
                opt.step()
            losses.append(float(loss))
        if show:
            progress(step, steps, losses[-1], t.seconds)
    if show:
        say("collectives per step: " + collectives(forward=fwd, backward=bwd, optimizer=upd))
    named = [("w0", w0), ("w1", w1)]
    return {
        "losses": dict(enumerate(losses, 1)),
        "gradients": grads(named),
        "parameters": params(named),
    }


def main() -> None:
    args = options(__doc__, steps=5, mesh=False).parse_args()
    world = dt.get_world_size()
    mesh = dt.ProcessMesh(list(range(world)), dim_names=["dp"])
    say(
        f"x({BATCH}, {IN}) @ w0({IN}, {HIDDEN}) @ w1({HIDDEN}, {OUT}), MSE loss, SGD, "
        f"{args.dtype}\ndata parallel on {world} rank(s): x split by rows, w0 and w1 replicated"
    )
    sharded = train(mesh, args.steps, np.dtype(args.dtype), show=True, bad=args.perturb)
    single = train(single_mesh(), args.steps, np.dtype(args.dtype))
    ok(check(sharded, single, args.dtype), args.dtype)


if __name__ == "__main__":
    main()
