"""The demo net of the semi-auto parallel papers, shared by simple_net_dp.py and
simple_net_mp.py: ``x @ w0 @ w1`` and an MSE loss (subtract, square, mean), trained with SGD
on a 1-D mesh of every rank with the placements the demo gives, then again on one process."""

from __future__ import annotations

import numpy as np
from _common import check, data_parallel, fit, ok, options, perturb, single_mesh

import disttensor as dt

BATCH, IN, HIDDEN, OUT = 32, 16, 64, 8


def weight(shape, seed: int, mesh, placement, dtype) -> dt.DistTensor:
    """A weight drawn from N(0, 1/fan_in), placed as asked: the same values on every mesh."""
    with dt.no_grad():
        w = dt.randn(shape, dtype, seed=seed, mesh=mesh, placements=[placement])
        w = w * (1 / np.sqrt(shape[0]))
    return dt.nn.Parameter(w)


def loss_fn(x, y, w0, w1):
    h = dt.matmul(x, w0)  # matmul 1
    out = dt.matmul(h, w1)  # matmul 2
    return dt.mean(dt.square(dt.subtract(out, y)))  # MSE: subtract, square, mean


def train(
    mesh, placements: dict, steps: int, dtype, show: bool = False, bad: bool = False, dp="plain"
):
    """Train on ``mesh`` with ``placements`` ("x", "w0", "w1"; a one-rank mesh: Replicate);
    ``dp`` "fused" reduces the gradients with dt.DataParallel (on a "dp" mesh)."""
    if mesh.size == 1:
        placements = dict.fromkeys(placements, dt.Replicate())
    w0 = weight((IN, HIDDEN), 1, mesh, placements["w0"], dtype)
    w1 = weight((HIDDEN, OUT), 2, mesh, placements["w1"], dtype)
    if bad:
        perturb(w0)
    opt = dt.optim.SGD([w0, w1], lr=0.05)
    weights = dt.nn.Module()  # DataParallel takes a Module: this one only holds the weights
    weights.w0, weights.w1 = w0, w1
    wrapper = data_parallel(weights, mesh, dp) if "dp" in mesh.dim_names else False
    rng = np.random.default_rng(0)  # the same batches on every rank

    def loss_of(batch):  # the target is split like the input
        x, y = (dt.shard_tensor(a.astype(dtype), mesh, [placements["x"]]) for a in batch)
        return loss_fn(x, y, w0, w1)

    data = (
        (rng.standard_normal((BATCH, IN)), rng.standard_normal((BATCH, OUT))) for _ in range(steps)
    )
    return fit(opt, data, loss_of, lambda: [("w0", w0), ("w1", w1)], steps, show, wrapper)


def main(doc: str, dim_name: str, placements: dict, what: str) -> None:
    args = options(doc, steps=5, mesh=False, data_parallel=dim_name == "dp").parse_args()
    world = dt.get_world_size()
    mesh = dt.ProcessMesh(list(range(world)), dim_names=[dim_name])
    dt.print0(
        f"x({BATCH}, {IN}) @ w0({IN}, {HIDDEN}) @ w1({HIDDEN}, {OUT}), MSE loss, SGD, "
        f"{args.dtype}\n{what} on {world} rank(s): "
        + ", ".join(f"{k} {p}" for k, p in placements.items())
    )
    dtype = np.dtype(args.dtype)
    mode = getattr(args, "dp", "plain")
    sharded = train(mesh, placements, args.steps, dtype, show=True, bad=args.perturb, dp=mode)
    single = train(single_mesh(), placements, args.steps, dtype)
    ok(check(sharded, single, args.dtype), args.dtype)
