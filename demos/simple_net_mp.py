"""Tensor (model) parallelism on the semi-auto parallel papers' demo net: two matmuls, MSE.

    mpiexec -n 4 python demos/simple_net_mp.py [--dtype float64|float32] [--steps 5]

The first weight is split by columns (Shard(1)), the second by rows (Shard(0)); the input is
replicated. The first matmul gives a column-split activation with no communication, the
second a Partial(sum) output, reduced once where the loss needs it. The same program on one
process must give the same losses, gradients and parameters.
"""

from __future__ import annotations

from _simple_net import main

import disttensor as dt

# w0 split by columns (column-parallel), w1 by rows (row-parallel)
PLACEMENTS = {"x": dt.Replicate(), "w0": dt.Shard(1), "w1": dt.Shard(0)}

if __name__ == "__main__":
    main(__doc__, "mp", PLACEMENTS, "tensor parallel")
