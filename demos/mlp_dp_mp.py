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
    check,
    data_parallel,
    fit,
    mesh_2d,
    ok,
    options,
    perturb,
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


def train(
    mesh: dt.ProcessMesh, steps: int, dtype, show: bool = False, bad: bool = False, dp="plain"
):
    """Train on ``mesh`` (2-D: sharded; one rank: the single-process program); ``dp``
    "fused" reduces the data-parallel gradients with dt.DataParallel."""
    dt.manual_seed(0)  # the same initial weights on every mesh
    model = Net(dtype)
    sharded = mesh.ndim == 2
    dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(PLAN) if sharded else None)
    if bad:
        perturb(model.fc1.weight)
    opt = dt.optim.Adam(model.parameters(), lr=1e-2)
    placements = [dt.Shard(0), dt.Replicate()] if sharded else [dt.Replicate()]
    wrapper = data_parallel(model, mesh, dp)
    net = wrapper or model  # the wrapper's forward is the model's

    def loss_of(batch):
        x, y = (dt.shard_tensor(a, mesh, placements) for a in batch)
        return dt.nn.MSELoss()(net(x), y)

    return fit(opt, batches(steps, dtype), loss_of, model.named_parameters, steps, show, wrapper)


def main() -> None:
    args = options(__doc__, steps=10).parse_args()
    mesh = mesh_2d(args.mesh)
    dtype = np.dtype(args.dtype)
    dp, mp = mesh.shape
    dt.print0(
        f"Linear({IN}, {HIDDEN}) -> LayerNorm -> Linear({HIDDEN}, {OUT}), Adam, {dtype}, "
        f"batch {BATCH}\nmesh {dp}x{mp} (dp x mp): batch split {dp} ways, "
        f"fc1 column- and fc2 row-parallel {mp} ways"
    )
    sharded = train(mesh, args.steps, dtype, show=True, bad=args.perturb, dp=args.dp)
    single = train(single_mesh(), args.steps, dtype)
    ok(check(sharded, single, args.dtype), args.dtype)


if __name__ == "__main__":
    main()
