"""Rows of the fault table about many ranks (tests/fault_table.py says how rows run): ranks
that diverge (each gets RanksDiverged with every rank's call), NaN/inf/ties/signed zeros against
numpy (under MPI the MPI library combines them), and programs that end the whole job.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from fault_table import (
    INF,
    NAN,
    S0,
    R,
    early,
    ends_job,
    like_numpy,
    mesh,
    param,
    raises,
    rank,
    xs,
)

import disttensor as dt

# -- ranks that diverge: every rank gets RanksDiverged with each rank's call --------------------
DIFFERENT_CALLS = "were about to make different collective calls"


@raises(dt.RanksDiverged, DIFFERENT_CALLS, "rank 1: print (repr) > numpy()", "rank 0: barrier (")
def print_on_one_rank(world):
    x = xs(world)
    if rank() == 1:
        print(x)
    dt.barrier()


@raises(dt.RanksDiverged, DIFFERENT_CALLS, "rank 1: float() > numpy()")
def float_of_the_loss_on_one_rank(world):
    loss = (xs(world) * 2).sum()
    if rank() == 1:
        float(loss)
    dt.barrier()


@raises(dt.RanksDiverged, DIFFERENT_CALLS, "rank 0: numpy() > reshard")
def numpy_on_one_rank(world):
    x = xs(world)
    if rank() == 0:
        x.numpy()
    dt.barrier()


@raises(dt.RanksDiverged, DIFFERENT_CALLS, lambda w: f"rank {w - 1}: barrier (call")
def barrier_on_one_rank(world):
    x = xs(world)
    if rank() == world - 1:
        dt.barrier()
    x.numpy()


@raises(dt.RanksDiverged, "optimizer step", "rank 1: optimizer step gradients 1")
def backward_on_one_rank_then_a_step(world):
    w = param(world, [R], (2 * world,))  # its Shard(0) gradient is gathered by the step
    opt = dt.optim.SGD([w], lr=0.1)
    loss = (xs(world) * w).sum()
    if rank() == 1:
        loss.backward()
    opt.step()
    dt.barrier()


@raises(dt.RanksDiverged, "optimizer step", "gradients")
def backward_on_one_rank_sharded_parameters(world):
    w = param(world, [S0], (2 * world,))
    opt = dt.optim.SGD([w], lr=0.1)
    loss = (xs(world) * w).sum()
    if rank() == 1:
        loss.backward()
    opt.step()


@raises(
    dt.RanksDiverged, DIFFERENT_CALLS, "all_reduce float64, 1, sum", "all_reduce float64, 1, max"
)
def different_reductions_per_rank(world):
    x = xs(world)
    float(x.sum() if rank() == 0 else x.max())


@raises(dt.RanksDiverged, DIFFERENT_CALLS, "float32", "float64")
def different_dtypes_per_rank(world):
    x = xs(world)
    float((x.astype(np.float32) if rank() == 0 else x).sum())


@raises(dt.RanksDiverged, "passed shard_tensor different values", "(5,), float64")
def shard_tensor_of_other_shapes(world):
    dt.shard_tensor(np.ones(4 + rank()), mesh(world), [S0])


@raises(dt.RanksDiverged, "passed shard_tensor different values", "(Replicate(),)")
def shard_tensor_with_other_placements(world):
    dt.shard_tensor(np.ones(4), mesh(world), [S0 if rank() else R])


@raises(dt.RanksDiverged, "passed shard_tensor different values", "values crc32")
def shard_tensor_of_other_values(world):
    dt.shard_tensor(np.full(4, float(rank())), mesh(world), [S0])


@raises(dt.RanksDiverged, "passed shard_tensor different values", "values crc32")
def shard_tensor_of_an_unseeded_draw_replicated(world):
    dt.shard_tensor(np.random.default_rng().random(4), mesh(world), [R])


@like_numpy
def shard_tensor_opt_out_and_source(world):
    """check=False keeps each rank's data as passed; src=r takes rank r's on every rank."""
    mine = np.full(4, float(rank()))
    x = dt.shard_tensor(mine, mesh(world), [R], check=False)
    y = dt.shard_tensor(mine if rank() else None, mesh(world), [R], src=world - 1)
    return [("check=False", x.to_local(), mine), ("src", y.to_local(), np.full(4, world - 1.0))]


@raises(
    dt.RanksDiverged,
    "passed dtensor_from_local different values",
    lambda w: f"rank 1: dtensor_from_local ({2 * w + 1},), float64",
)
def from_local_with_other_global_shapes(world):
    n = 2 * world + (rank() == 1)
    dt.dtensor_from_local(np.ones(2), mesh(world), [S0], global_shape=(n,))


@raises(dt.RanksDiverged, "passed dtensor_from_local different values", "float32")
def from_local_with_other_dtypes(world):
    local = np.ones(2, np.float32 if rank() == 1 else np.float64)
    dt.dtensor_from_local(local, mesh(world), [S0], global_shape=(2 * world,))


@raises(ValueError, "ranks passed shards of different ndim or dtype", "rank 1: (2,) float32")
def from_local_with_other_dtypes_inferred(world):
    local = np.ones(2, np.float32 if rank() == 1 else np.float64)
    dt.dtensor_from_local(local, mesh(world), [S0])


@raises(dt.RanksDiverged, "passed random draw different values", "seed 0", "seed 1", "manual_seed")
def seeded_by_rank(world):
    dt.manual_seed(rank())
    dt.rand((2 * world,), mesh=mesh(world), placements=[S0])


@raises(dt.RanksDiverged, DIFFERENT_CALLS, "rank 0: reshard [Shard(dim=0)] -> [Replicate()]")
def reshard_to_other_placements_per_rank(world):
    y = dt.reshard(xs(world), mesh(world), [R if rank() == 0 else S0])
    dt.barrier()
    return y


@raises(ValueError, lambda w: f"shard_tensor: src must be a rank of the world (0..{w - 1})")
def shard_tensor_from_a_missing_source(world):
    dt.shard_tensor(np.ones(4), mesh(world), [S0], src=world)


# -- reductions with no identity: numpy's error on every rank, before any collective ------------
@raises(ValueError, "zero-size array to reduction operation maximum which has no identity")
def max_of_an_empty_split_axis(world):
    x = dt.shard_tensor(np.empty((0, 3)), mesh(world), [S0])
    early(lambda: x.max(axis=0))


@raises(ValueError, "attempt to get argmin of an empty sequence")
def argmin_of_an_empty_split_axis(world):
    x = dt.shard_tensor(np.empty(0), mesh(world), [S0])
    early(lambda: np.argmin(x))


@like_numpy
def max_min_of_empty_axes_with_initial(world):
    g = np.empty((0, 3))
    x = dt.shard_tensor(g, mesh(world), [S0])
    return [
        ("max initial=", np.max(x, axis=0, initial=-1.0), np.max(g, axis=0, initial=-1.0)),
        ("min of axis 1", x.min(axis=1), g.min(axis=1)),
    ]


# -- NaN, inf, ties and signs against numpy ------------------------------------------------------
def split(world: int, g: np.ndarray, placements=(S0,)) -> dt.DistTensor:
    """The global ``g`` on ``mesh(world)``, split along axis 0 by default."""
    return dt.shard_tensor(g, mesh(world), list(placements))


def with_nan_at(world: int, where: int) -> np.ndarray:
    """-world .. world - 1 (negatives and positives on different ranks), NaN at ``where``."""
    g = np.arange(2.0 * world) - world
    g[where] = NAN
    return g


@like_numpy
def max_min_with_a_nan_on_each_rank(world):
    out = []
    for where in range(0, 2 * world, 2):  # the first item of each rank's shard
        g = with_nan_at(world, where)
        x = split(world, g)
        out += [
            (f"max, NaN at {where}", x.max(), g.max()),
            (f"min, NaN at {where}", x.min(), g.min()),
        ]
    return out


@like_numpy
def argmax_argmin_with_a_nan_after_the_extreme(world):
    g = np.arange(2.0 * world)[::-1].copy()  # the largest first, on rank 0
    g[-1] = NAN  # numpy's argmax/argmin point at the first NaN
    x = split(world, g)
    return [("argmax", x.argmax(), g.argmax()), ("argmin", x.argmin(), g.argmin())]


@like_numpy
def argmax_ties_across_ranks(world):
    g = np.zeros(2 * world)
    g[1::2] = INF  # one +inf per rank: numpy takes the first
    x = split(world, g)
    return [("argmax", x.argmax(), g.argmax()), ("argmin of -g", (-x).argmin(), (-g).argmin())]


@like_numpy
def infinities(world):
    g = np.arange(2.0 * world)
    g[0], g[-1] = INF, -INF
    x = split(world, g)
    return [
        ("max", x.max(), g.max()),
        ("min", x.min(), g.min()),
        ("sum", x.sum(), g.sum()),
        ("mean", x.mean(), g.mean()),
        ("argmin", x.argmin(), g.argmin()),
    ]


@like_numpy
def all_nan(world):
    g = np.full(2 * world, NAN)
    x = split(world, g)
    return [
        ("max", x.max(), g.max()),
        ("argmax", x.argmax(), g.argmax()),
        ("sum", x.sum(), g.sum()),
    ]


@like_numpy
def columns_with_nan_over_a_split_axis(world):
    g = np.arange(4.0 * world).reshape(2 * world, 2)
    g[2 * world - 1, 0] = NAN  # on the last rank
    g[0, 1] = NAN  # on rank 0
    x = split(world, g)
    return [
        ("max axis 0", x.max(axis=0), g.max(axis=0)),
        ("min axis 0", x.min(axis=0), g.min(axis=0)),
        ("argmax axis 0", x.argmax(axis=0), g.argmax(axis=0)),
        ("argmin axis 1", x.argmin(axis=1), g.argmin(axis=1)),
    ]


def partial_locals(world: int) -> list[np.ndarray]:
    """Every rank's local value of a Partial tensor: a NaN on rank 1, +-inf on the last."""
    out = [np.array([1.0 * r, -1.0 * r, 0.5, 2.0 * r]) for r in range(world)]
    out[1][0] = NAN
    out[-1][2], out[-1][3] = INF, -INF
    return out


@like_numpy
def partial_max_min_resharded(world):
    locs, out = partial_locals(world), []
    for kind, ufunc in (("max", np.maximum), ("min", np.minimum)):
        want = ufunc.reduce(np.stack(locs))
        p = dt.dtensor_from_local(locs[rank()], mesh(world), [dt.Partial(kind)])
        out += [
            (f"Partial({kind}) -> Replicate", dt.reshard(p, mesh(world), [R]), want),
            (f"Partial({kind}) -> Shard(0)", dt.reshard(p, mesh(world), [S0]), want),
            (f"argmax of Partial({kind})", p.argmax(), want.argmax()),
            (f"argmin of Partial({kind})", p.argmin(), want.argmin()),
            (f"max of Partial({kind})", p.max(), want.max()),
        ]
    return out


@like_numpy
def partial_sum_avg_of_infinities(world):
    locs = partial_locals(world)
    locs[0][3] = INF  # +inf on rank 0 and -inf on the last rank: NaN
    total = np.sum(np.stack(locs), axis=0)
    out = []
    for kind, want in (("sum", total), ("avg", total / world)):
        p = dt.dtensor_from_local(locs[rank()], mesh(world), [dt.Partial(kind)])
        out.append((f"Partial({kind})", dt.reshard(p, mesh(world), [R]), want))
    return out


@like_numpy
def narrow_floats_with_nan(world):
    out = []
    for dtype in (np.float32, np.float16):  # float16: reduced in float32 under MPI
        g = with_nan_at(world, 2 * world - 1).astype(dtype)
        x = split(world, g)
        out += [
            (f"{dtype.__name__} max", x.max(), g.max()),
            (f"{dtype.__name__} min", x.min(), g.min()),
        ]
        p = dt.dtensor_from_local(g[:2] + rank(), mesh(world), [dt.Partial("max")])
        want = np.maximum.reduce(np.stack([g[:2] + r for r in range(world)]))
        out.append((f"{dtype.__name__} Partial(max)", dt.reshard(p, mesh(world), [R]), want))
    return out


@like_numpy
def signed_zeros(world):
    g = np.full(2 * world, -1.0)
    g[-1] = -0.0
    x = split(world, g)
    return [("max of -0.0", x.max(), g.max()), ("sum", x.sum(), g.sum())]


@like_numpy
def nan_ignoring_reductions(world):
    g = with_nan_at(world, 0)
    g[-1] = NAN
    x = split(world, g)
    return [
        ("nanmax", np.nanmax(x), np.nanmax(g)),
        ("nanargmin", np.nanargmin(x), np.nanargmin(g)),
        ("fmax.reduce", np.fmax.reduce(x), np.fmax.reduce(g)),
        ("nansum", np.nansum(x), np.nansum(g)),
    ]


@like_numpy
def statistics_of_nan_and_inf(world):
    g = np.arange(2.0 * world)
    g[1] = INF
    h = with_nan_at(world, 2 * world - 1)
    x, y = split(world, g), split(world, h)
    return [
        ("var with inf", x.var(), g.var()),
        ("std with NaN", y.std(), h.std()),
        ("any with NaN", y.any(), h.any()),
        ("cumsum with inf", np.cumsum(x), np.cumsum(g)),
    ]


@like_numpy
def replicated_nan_max(world):
    g = with_nan_at(world, 1)
    x = split(world, g, (R,))
    return [("max", x.max(), g.max()), ("maximum", np.maximum(x, 0.0), np.maximum(g, 0.0))]


# -- programs that end the whole job: one mpiexec launch each ---------------------------------
@ends_job(None, "rank 1 left the job", "sys.exit")
def sys_exit_3_on_one_rank(world):
    x = xs(world)
    if rank() == 1:
        sys.exit(3)
    x.numpy()  # the others wait for rank 1 here
    print("unreachable", flush=True)


@ends_job(None, "rank 2 gives up: no data", "rank 2 left the job")
def system_exit_with_a_message(world):
    loss = (xs(world) * 2).sum()
    if rank() == 2:
        raise SystemExit("rank 2 gives up: no data")
    float(loss)
    print("unreachable", flush=True)


@ends_job(0, "rank 0 done", absent=("disttensor:", "Traceback", "Abort"))
def clean_exit_on_every_rank(world):
    total = float(xs(world).sum())
    dt.barrier()
    if rank() == 0:
        print(f"rank 0 done {total}", flush=True)
    sys.exit(0)


@ends_job(None, "rank 2 left the job")
def one_rank_returns_early(world):
    loss = (xs(world) * 2).sum()
    if rank() == 2:
        return  # the script ends there: rank 2 leaves
    float(loss)
    print("unreachable", flush=True)


@ends_job(None, "uncaught IndexError on rank 1", "cross_entropy: labels: an index is out of range")
def label_out_of_range_on_one_rank(world):
    logits = dt.shard_tensor(np.zeros((2 * world, 3)), mesh(world), [S0])
    labels = dt.shard_tensor(np.array([0, 1, 2, 3, 0, 1][: 2 * world]), mesh(world), [S0])
    float(dt.cross_entropy(logits, labels))  # label 3 is in rank 1's shard: it raises alone
    print("unreachable", flush=True)


@ends_job(None, "in sendrecv from rank 0", env={"DISTTENSOR_TIMEOUT": "3"})
def source_skips_a_cross_mesh_reshard(world):
    one = dt.ProcessMesh([0])
    x = dt.dtensor_from_local(np.arange(6.0) if rank() == 0 else np.zeros(0), one, [R], (6,))
    if rank() != 0:  # rank 0 holds the data but skips the reshard that sends it
        dt.reshard(x, mesh(world), [S0])
    else:  # and reaches its next collective a second later: the receivers' waits time out
        time.sleep(1.0)  # first (the watchdog looks twice a second), whatever the load
    dt.barrier()
    print("unreachable", flush=True)
