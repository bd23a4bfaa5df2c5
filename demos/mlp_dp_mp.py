"""Train Linear -> LayerNorm -> Linear with Adam on a dp x mp mesh; check it against one process.

    mpiexec -n 4 python demos/mlp_dp_mp.py [--mesh 2x2] [--dtype float64|float32] [--steps 10]

The batch is split over "dp" (data parallel); the first Linear is column-parallel and the second
row-parallel over "mp" (tensor parallel). The same model is then trained on one process and
the losses, the last step's gradients and the final parameters must agree (relative 1e-9 in
float64, 1e-5 in float32).
"""

from __future__ import annotations

import numpy as np
from _common import (
    Stopwatch,
    check,
    collectives,
    grads,
    mesh_2d,
    ok,
    options,
    params,
    perturb,
    progress,
    say,
    single_mesh,
)

import disttensor as dt

BATCH, IN, HIDDEN, OUT = 64, 32, 64, 16


class Net(dt.nn.Module):
    def __init__(self, dtype) -> None:
        super().__init__()
        self.fc1 = dt.nn.Linear(IN, HIDDEN, dtype=dtype)
        self.norm = dt.nn.LayerNorm(HIDDEN, dtype=dtype)
        self.fc2 = dt.nn.Linear(HIDDEN, OUT, dtype=dtype)

    def forward(self, x):
        return self.fc2(self.norm(self.fc1(x)))


PLAN = {"fc1": dt.nn.ColwiseParallel("mp"), "fc2": dt.nn.RowwiseParallel("mp")}


def batches(steps: int, dtype):
    """The same (x, y) batches on every rank: a noisy linear teacher to regress."""
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((IN, OUT)) / np.sqrt(IN)
    for _ in range(steps):
        x = rng.standard_normal((BATCH, IN))
        y = x @ teacher + 0.1 * rng.standard_normal((BATCH, OUT))
        yield x.astype(dtype), y.astype(dtype)


def train(mesh: dt.ProcessMesh, steps: int, dtype, show: bool = False, bad: bool = False):
    """Train on ``mesh`` (2-D: sharded; one rank: the single-process program)."""
    dt.manual_seed(0)  # the same initial weights on every mesh
    model = Net(dtype)
    sharded = mesh.ndim == 2
    dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(PLAN) if sharded else None)
    if bad:
        perturb(model.fc1.weight)
    opt = dt.optim.Adam(model.parameters(), lr=1e-2)
    batch = [dt.Shard(0), dt.Replicate()] if sharded else [dt.Replicate()]
    losses = []
    for step, (x, y) in enumerate(batches(steps, dtype), 1):
        opt.zero_grad()
        with Stopwatch() as t:
            x, y = dt.shard_tensor(x, mesh, batch), dt.shard_tensor(y, mesh, batch)
            with dt.CommCounter() as fwd:
                loss = dt.nn.MSELoss()(model(x), y)
            with dt.CommCounter() as bwd:
                loss.backward()
            with dt.CommCounter() as upd:
                opt.step()
            losses.append(float(loss))
        if show:
            progress(step, steps, losses[-1], t.seconds)
    if show:
        say("collectives per step: " + collectives(forward=fwd, backward=bwd, optimizer=upd))
    named = list(model.named_parameters())
    return {
        "losses": dict(enumerate(losses, 1)),
        "gradients": grads(named),
        "parameters": params(named),
    }


def main() -> None:
    args = options(__doc__, steps=10).parse_args()
    mesh = mesh_2d(args.mesh)
    dtype = np.dtype(args.dtype)
    dp, mp = mesh.shape
    say(
        f"Linear({IN}, {HIDDEN}) -> LayerNorm -> Linear({HIDDEN}, {OUT}), Adam, {dtype}, "
        f"batch {BATCH}\nmesh {dp}x{mp} (dp x mp): batch split {dp} ways, "
        f"fc1 column- and fc2 row-parallel {mp} ways"
    )
    sharded = train(mesh, args.steps, dtype, show=True, bad=args.perturb)
    single = train(single_mesh(), args.steps, dtype)
    ok(check(sharded, single, args.dtype), args.dtype)


if __name__ == "__main__":
    main()
