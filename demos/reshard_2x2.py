"""Shard, reshard and print tensors on a 2x2 mesh, checking every result against numpy.

mpiexec -n 4 python demos/reshard_2x2.py
"""

from __future__ import annotations

import numpy as np

import disttensor as dt

mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
rank = dt.get_rank()


def step(title: str, x: dt.DistTensor, placements, want: np.ndarray, target=mesh) -> dt.DistTensor:
    """Reshard x, show which collectives it took, and check the global value against numpy."""
    with dt.CommCounter() as cc:
        y = dt.reshard(x, target, placements)
    if rank in target and not np.allclose(y.numpy(), want):
        raise AssertionError(f"{title}: the global value differs from numpy")
    dt.print0(f"{title:<44} {cc.counts or 'no communication'}")
    return y


g = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)  # 7 rows over 2 ranks: uneven shards

x = dt.shard_tensor(g, mesh, [dt.Shard(0), dt.Shard(1)])
dt.print0("A 7x5 tensor sharded by rows over 'dp' and by columns over 'mp':")
dt.print0(x)  # printing is collective: every rank formats x, rank 0 prints it
shapes = dt.comm.world().allgather_object(x.local_shape)
dt.print0("local shards: " + ", ".join(f"rank {r}: {s}" for r, s in enumerate(shapes)))

dt.print0("\nReshards (each checked against numpy):")
y = step("[S(0), S(1)] -> [Replicate, S(1)]", x, [dt.Replicate(), dt.Shard(1)], g)
y = step("[Replicate, S(1)] -> [S(1), S(0)]", y, [dt.Shard(1), dt.Shard(0)], g)
y = step("[S(1), S(0)] -> [Replicate, Replicate]", y, [dt.Replicate(), dt.Replicate()], g)
p = dt.reshard(y, mesh, [dt.Partial(), dt.Replicate()])  # local: no communication
dt.print0("[Replicate, Replicate] -> [Partial(sum), Replicate]  no communication")
y = step("[Partial(sum), Replicate] -> [S(0), Replicate]", p, [dt.Shard(0), dt.Replicate()], g)
line = dt.ProcessMesh([3, 2, 1, 0], dim_names=["pp"])
step("2x2 mesh -> 1-D mesh [3, 2, 1, 0], Shard(1)", y, [dt.Shard(1)], g, target=line)

dt.print0("\nA Partial tensor prints its reduced value:")
dt.print0(p)

big = dt.randn((4096, 1024), seed=0, mesh=mesh, placements=[dt.Shard(0), dt.Shard(1)])
with dt.CommCounter() as cc:
    text = repr(big)
dt.print0(f"\nA 4096x1024 random tensor (32 MiB) prints; rank 0 sent only {cc.total_bytes} bytes:")
dt.print0(text)
first = (
    dt.randn((4096, 1024), seed=0, mesh=dt.ProcessMesh([0])).to_local()[:2, :3]
    if rank == 0
    else None
)
if rank == 0:
    shown = big.to_local()[:2, :3]  # rank 0 holds the top-left shard
    if not np.array_equal(shown, first):
        raise AssertionError("seeded randn must equal the one-process draw on every layout")
dt.print0("\nOK: every result equals numpy / the one-process run.")
