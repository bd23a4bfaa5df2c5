"""Device shards under mpiexec: ``mpiexec -n N python tests/device_cases.py DEVICE``.

DEVICE is "fake" (tests/fake_device.py: the MPI backend stages its arrays through host memory,
Note [Host staging] in disttensor/comm/mpi.py) or "gpu" (CuPy: NCCL where it serves the
groups, else host staging; Note [Device communicators] in disttensor/comm/__init__.py).
Every collective of the communicator interface on device buffers (in place and
non-blocking too), a reshard grid, and the mlp_dp_mp model trained with fused data-parallel
buckets, against the host run (bit for bit on the stand-in). Rank 0 prints "device cases
passed"; a failing rank ends the job (disttensor's abort hook).
"""

from __future__ import annotations

import sys
from pathlib import Path

import fake_device
import numpy as np
import spmd_cases as cases

import disttensor as dt
from disttensor import backend, comm


def _collectives(xp) -> None:
    """Each collective on device buffers equals the same collective on host buffers."""
    w = comm.world()
    rank, n = w.rank, w.size
    host = cases.global_value((n, 6), np.float64, seed=7)
    mine = xp.asarray(host[rank])
    out = xp.empty(6, np.float64)
    w.allreduce(mine, out, "sum")
    assert np.allclose(backend.to_host(out), host.sum(0))
    buf = xp.asarray(host[rank])
    w.allreduce(buf, buf, "max")  # in place
    assert np.array_equal(backend.to_host(buf), host.max(0))
    buf = xp.asarray(host[rank])
    work = w.iallreduce(buf, buf, "sum")  # non-blocking, in place: copied back at the wait
    work.wait()
    assert np.allclose(backend.to_host(buf), host.sum(0))
    counts = [(i % 2) + 1 for i in range(n)]
    out = xp.empty(sum(counts), np.float64)
    w.allgather(xp.full(counts[rank], float(rank)), out, counts)
    assert np.array_equal(backend.to_host(out), np.repeat(np.arange(n, dtype=float), counts))
    out = xp.empty(counts[rank], np.float64)
    full = cases.global_value((n, sum(counts)), np.float64, seed=8)
    w.reduce_scatter(xp.asarray(full[rank]), out, counts, "sum")
    start = sum(counts[:rank])
    assert np.allclose(backend.to_host(out), full.sum(0)[start : start + counts[rank]])
    send = xp.asarray(np.arange(n, dtype=np.float64) + 10 * rank)
    out = xp.empty(n, np.float64)
    w.alltoall(send, None, out, None)
    assert np.array_equal(backend.to_host(out), 10 * np.arange(n) + rank)
    buf = xp.asarray(host[n - 1]) if rank == n - 1 else xp.empty(6, np.float64)
    w.broadcast(buf, root=n - 1)
    assert np.array_equal(backend.to_host(buf), host[n - 1])
    if n > 1:
        out = xp.empty(6, np.float64)
        recv = w.irecv(out, (rank - 1) % n, tag=5)
        w.isend(xp.asarray(host[rank]), (rank + 1) % n, tag=5).wait()
        recv.wait()
        assert np.array_equal(backend.to_host(out), host[(rank - 1) % n])


def _reshards(world: int) -> int:
    exact = cases.assert_value

    def on_host(got, want, exact_, what):
        if not isinstance(got, np.ndarray):
            assert type(got) is backend.current().array_type, what
            got = backend.to_host(got)
        exact(got, want, exact_, what)

    cases.assert_value = on_host
    try:
        return cases.case_reshard_grid(
            world, dtypes=[np.float64, np.bool_], mesh_shapes=((world,),)
        ) + cases.case_reshard_other_ndims(world)
    finally:
        cases.assert_value = exact


def _train(device: str, world: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "demos"))
    import mlp_dp_mp

    mesh = dt.init_mesh((world, 1), dim_names=["dp", "mp"], device=device)
    return mlp_dp_mp.train(mesh, 2, np.float64, dp="fused")


def main(device: str) -> None:
    fake_device.install()
    world = dt.get_world_size()
    be = dt.set_device(device)
    _collectives(be.xp)
    n = _reshards(world)
    dev = _train(device, world)
    host = _train("cpu", world)
    for key in ("gradients", "parameters"):
        for name, want in host[key].items():
            got = dev[key][name]
            if device == "fake":  # the stand-in computes with numpy: bit for bit
                assert np.array_equal(got, want), (key, name)
            else:
                assert np.allclose(got, want, rtol=1e-9, atol=1e-12), (key, name)
    dt.barrier()
    if dt.get_rank() == 0:
        print(f"{n} reshards; device cases passed on {world} ranks ({device})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
