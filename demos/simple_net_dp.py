"""Data parallelism on the semi-auto parallel papers' demo net: two matmuls and an MSE loss.

    mpiexec -n 4 python demos/simple_net_dp.py [--dtype float64|float32] [--steps 5]

The input batch is split by rows (Shard(0)) over all ranks; both weights are replicated.
Forward and backward run with no communication: each weight's gradient comes out
Partial(sum) (every rank holds its batch rows' share), and SGD's step all-reduces it. The
same program on one process must give the same losses, gradients and parameters.
"""

from __future__ import annotations

from _simple_net import main

import disttensor as dt

# the batch split by rows; both weights replicated
PLACEMENTS = {"x": dt.Shard(0), "w0": dt.Replicate(), "w1": dt.Replicate()}

if __name__ == "__main__":
    main(__doc__, "dp", PLACEMENTS, "data parallel")
