"""Run the SPMD cases under mpiexec: ``mpiexec -n N python tests/mpi_runner.py [CASE ...]``.

Prints one line per case on rank 0 and a closing 'N passed, 0 failed'. A failing rank's
uncaught exception ends the whole job through disttensor's abort hook (non-zero exit code).
"""

from __future__ import annotations

import sys
import time

import grad_cases
import mutation_cases
import numpy as np
import op_cases
import reliability_cases
import spmd_cases as cases

import disttensor as dt

# Under MPI the grids are smaller than on simulated ranks (collectives cost more with
# oversubscribed ranks); every case still runs, on every mesh that fits the world.
ARGS = {
    "case_reshard_grid": {
        "dtypes": [np.float64, np.int64, np.bool_, np.float32],
        "nd_dtypes": [np.float64],
        "mesh_shapes": ((1,), (2,), (3,), (4,), (2, 2)),
        "nd_shapes": 3,
    },
    "case_mutation": {"light": True},
}


def main(names: list[str]) -> None:
    world, rank = dt.get_world_size(), dt.get_rank()
    every = cases.ALL + [
        f
        for m in (op_cases, grad_cases, mutation_cases, reliability_cases)
        for n, f in vars(m).items()
        if n.startswith("case_")
    ]
    chosen = [c for c in every if not names or c.__name__ in names]
    for case in chosen:
        t = time.perf_counter()
        out = case(world, **ARGS.get(case.__name__, {}))
        dt.barrier()
        if rank == 0:
            extra = f", {out} checks" if isinstance(out, int) else ""
            print(
                f"PASS {case.__name__} on {world} ranks ({time.perf_counter() - t:.1f} s{extra})",
                flush=True,
            )
    if rank == 0:
        print(f"{len(chosen)} passed, 0 failed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
