"""dt.save / dt.load of device tensors (Note [Checkpoints of device tensors] in
disttensor/checkpoint/__init__.py) on the "fake" device (tests/fake_device.py), against the
same programs on the CPU: the files a device save writes are a host save's byte for byte,
loads make device shards equal to the host's bit for bit, with one host copy per piece
written and one device copy per tensor loaded (IOCounter), and the collectives of the host
run. Host checkpoints load onto the device and device checkpoints onto the host, into other
world sizes and layouts; training state (a model and Adam) resumes on the device.

Run as a script under mpiexec with the stand-in (the MPI backend stages its buffers through
host memory): ``mpiexec -n 4 python tests/test_device_checkpoint.py save DIR`` saves
checkpoint_cases' state on a (2, 2) mesh of device tensors, ``mpiexec -n K python
tests/test_device_checkpoint.py load DIR`` loads it on K ranks onto the device and checks
every shard; rank 0 prints ``OK device ...``.
"""

from __future__ import annotations

import math
import os
import sys

import fake_device
import numpy as np
import pytest
from checkpoint_cases import TENSORS, check_loaded, state_on, template_on, value
from mpirun import run
from op_cases import every_rank, mesh_of, same
from oracle import local_shard
from test_checkpoint import DTYPES, OPTIMIZERS, layouts, no_mpiexec, placed, resume_case, shapes
from test_device import on

import disttensor as dt
from disttensor import backend
from disttensor.checkpoint import IOCounter
from disttensor.checkpoint.files import METADATA, read_metadata

fake_device.install()  # the "fake" device
S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
KIND = {"fake": fake_device.FakeArray, "cpu": np.ndarray}


def _to_host(state):
    """``state`` with every DistTensor copied to the host, and the types of their shards."""
    kinds = set()

    def walk(s):
        if isinstance(s, dict):
            return {k: walk(v) for k, v in s.items()}
        if isinstance(s, (list, tuple)):
            return type(s)(walk(v) for v in s)
        if isinstance(s, dt.DistTensor):
            kinds.add(type(s.to_local()))
            return s.to_device("cpu")
        return s

    return walk(state), kinds


def _same_files(a: str, b: str) -> int:
    """Two checkpoint directories hold the same files byte for byte; their metadata differs
    only in the save's id. Returns the number of pieces."""
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b))
    for name in names:
        if name == METADATA:
            ma, mb = read_metadata(a), read_metadata(b)
            assert ma.pop("id") != mb.pop("id")
            assert ma == mb
        else:
            with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
                assert fa.read() == fb.read(), name
    return len(names) - 1


# -- the grid: every layout of test_checkpoint's round trip, saved and loaded on each device ------
def _grid(mesh_shape, directory: str):
    """test_checkpoint's grid (dtypes, even, uneven, empty and 0-d shapes, every placement,
    Partials) saved on the selected device, loaded into the saved layout and as Replicate.
    Per rank: the collectives and IOCounters of the save and the loads, and per tensor the
    shard's type, this rank's shard and the global value (host copies)."""
    mesh = mesh_of(mesh_shape)
    cases = [
        (shape, dtype, pls)
        for dtype in DTYPES
        for shape in (shapes(mesh) if dtype == np.float64 else shapes(mesh)[1::2])
        for pls in layouts(mesh, len(shape), dtype)
    ]
    state = {
        "t": [placed(value(s, d, i), mesh, p, seed=i) for i, (s, d, p) in enumerate(cases)],
        "array": np.arange(6, dtype=np.int32),
        "step": 3,
    }
    path = os.path.join(directory, dt.get_device())
    with dt.CommCounter() as cc, IOCounter() as io:
        dt.save(state, path)
    meta = os.path.getsize(os.path.join(path, METADATA))  # its length varies with the save's id
    if dt.get_rank() == 0:  # the pieces' bytes
        io.bytes_written -= meta
    out = {"save": (cc.counts, io.bytes_written, io.device_copies, io.device_bytes)}
    repl = [R] * mesh.ndim
    for name, pls_of in (("same", lambda p: p), ("whole", lambda p: repl)):
        template = {"t": [dt.zeros(s, d, mesh=mesh, placements=pls_of(p)) for s, d, p in cases]}
        with dt.CommCounter() as cc, IOCounter() as io:
            got = dt.load(template, path)["t"]
        shards = [(type(x.to_local()), backend.to_host(x.to_local()), x.numpy()) for x in got]
        out[name] = (cc.counts, io.bytes_read - meta, io.device_copies, shards)
    rank = dt.get_rank()
    out["want"] = [
        None if any(q.is_partial() for q in p) else local_shard(value(s, d, i), mesh, p, rank)
        for i, (s, d, p) in enumerate(cases)
    ]
    return out


def _written(directory: str, rank: int) -> tuple[int, int]:
    """(pieces, bytes) of the DistTensors that ``rank`` wrote, from the metadata."""
    sizes = [
        math.prod(p["shape"]) * np.lib.format.descr_to_dtype(t["dtype"]).itemsize
        for t in read_metadata(directory)["tensors"]
        if t["kind"] == "dtensor"
        for p in t["pieces"]
        if p["rank"] == rank
    ]
    return len(sizes), sum(sizes)


@pytest.mark.parametrize("mesh_shape", [(1,), (2,), (3,), (2, 2)], ids=str)
def test_device_round_trip_equals_the_host_run_and_writes_its_files(mesh_shape, tmp_path):
    n = math.prod(mesh_shape)
    host = on("cpu", n, _grid, mesh_shape, str(tmp_path))
    dev = on("fake", n, _grid, mesh_shape, str(tmp_path))
    assert _same_files(str(tmp_path / "fake"), str(tmp_path / "cpu")) > n
    for rank, (d, h) in enumerate(zip(dev, host)):
        counts, written, copies, nbytes = d["save"]
        assert (counts, written) == h["save"][:2] and h["save"][2:] == (0, 0)
        assert (copies, nbytes) == _written(str(tmp_path / "fake"), rank)  # one per piece
        for name in ("same", "whole"):
            (counts, read, copies, shards), (hcounts, hread, hcopies, hshards) = d[name], h[name]
            assert (counts, read) == (hcounts, hread) and hcopies == 0
            assert copies == len(shards)  # one copy onto the device per tensor
            assert {k for k, _, _ in shards} == {fake_device.FakeArray}
            assert {k for k, _, _ in hshards} == {np.ndarray}
            assert same([s[1:] for s in shards], [s[1:] for s in hshards])  # bit for bit
        for (_, local, _), want in zip(d["same"][3], d["want"]):
            assert want is None or same(local, want)  # this rank's box of the value


# -- other worlds, other devices ---------------------------------------------------------------
def _save_cases(path: str) -> None:
    mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
    dt.save(state_on(mesh), path)


def _load_cases(path: str):
    """checkpoint_cases' state loaded on a 1-D mesh of every rank: its checks (on host
    copies), the shards' types and the copies onto the device."""
    mesh = dt.init_mesh((dt.get_world_size(),))
    with IOCounter() as io:
        state = dt.load(template_on(mesh), path)
    host, kinds = _to_host(state)
    return check_loaded(host, mesh), kinds, io.device_copies


@pytest.mark.parametrize("saved, loaded", [("fake", "fake"), ("cpu", "fake"), ("fake", "cpu")])
def test_save_on_4_load_on_2_and_3_across_devices(saved, loaded, tmp_path):
    path = str(tmp_path / "ckpt")
    on(saved, 4, _save_cases, path)
    for k in (2, 3):
        checks, kinds, copies = every_rank(on(loaded, k, _load_cases, path))
        assert checks == len(TENSORS) + 1 and kinds == {KIND[loaded]}
        assert copies == (len(TENSORS) if loaded == "fake" else 0)


def _template_decides(path: str):
    """A template tensor's device wins over the selected one; tensors the template has none
    for go to the selected device."""
    mesh = dt.init_mesh((2,))
    w = dt.zeros((7, 5), mesh=mesh, placements=[S1])
    other = "cpu" if dt.get_device() == "fake" else "fake"
    state = dt.load({"model": {"w": w.to_device(other)}, "rest": None}, path)
    return type(state["model"]["w"].to_local()), _to_host(state["rest"])[1]


def test_the_template_tensor_decides_the_device(tmp_path):
    path = str(tmp_path / "ckpt")
    on("fake", 4, _save_cases, path)
    assert every_rank(on("cpu", 2, _template_decides, path)) == (
        fake_device.FakeArray,
        {np.ndarray},
    )
    assert every_rank(on("fake", 2, _template_decides, path)) == (
        np.ndarray,
        {fake_device.FakeArray},
    )


# -- training state -------------------------------------------------------------------------------
def test_resumed_training_on_device_equals_the_host_run(tmp_path):
    """test_checkpoint's resume case (model and Adam state saved on a (2, 2) mesh, a fresh
    model and optimizer load it and train on) on the device: bit for bit the host run."""
    args = ((2, 2), ["dp", "mp"], (4,), ["mp"])
    host = on("cpu", 4, resume_case, str(tmp_path / "host"), *args)
    dev = on("fake", 4, resume_case, str(tmp_path / "dev"), *args)
    assert same(dev, host)
    _same_files(str(tmp_path / "dev"), str(tmp_path / "host"))


def _optimizer(name: str, path: str):
    """An optimizer's state saved on the device and loaded into a fresh one whose parameter
    has another placement: the state's shard types and the parameters after 2 more steps."""
    mesh = dt.init_mesh((2,))
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 6))
    grads = [rng.standard_normal((4, 6)) for _ in range(4)]

    def steps(p, opt, gs):
        for g in gs:
            p.grad = dt.shard_tensor(g, p.mesh, p.placements)
            opt.step()
            opt.zero_grad()

    p = dt.nn.Parameter(dt.shard_tensor(w0, mesh, [S1]))
    opt = OPTIMIZERS[name]([p])
    steps(p, opt, grads[:2])
    dt.save(opt.state_dict(), path)
    q = dt.nn.Parameter(dt.shard_tensor(p.numpy(), mesh, [S0]))
    opt2 = OPTIMIZERS[name]([q])
    opt2.load_state_dict(dt.load(opt2.state_dict(), path))
    kinds = {type(t.to_local()) for s in opt2.state.values() for t in s.values()}
    steps(p, opt, grads[2:])
    steps(q, opt2, grads[2:])
    return kinds, p.numpy(), q.numpy()


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_state_round_trip_on_device(name, tmp_path):
    dev = every_rank(on("fake", 2, _optimizer, name, str(tmp_path / "dev")))
    host = every_rank(on("cpu", 2, _optimizer, name, str(tmp_path / "host")))
    stateful = name != "SGD"
    assert dev[0] == ({fake_device.FakeArray} if stateful else set())
    assert same(dev[1:], host[1:])
    _same_files(str(tmp_path / "dev"), str(tmp_path / "host"))


# -- real processes -------------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.skipif(no_mpiexec(), reason="mpiexec not found (pip install mpich)")
def test_under_mpiexec_save_on_4_load_on_2(tmp_path):
    """Device tensors saved by 4 processes and loaded by 2 (the MPI backend's host staging);
    the files are a simulated host save's."""
    for n, what in [(4, "save"), (2, "load")]:
        code, out = run(n, ["tests/test_device_checkpoint.py", what, str(tmp_path)], timeout=120)
        assert code == 0 and f"OK device {what} on {n} ranks" in out, out
    on("cpu", 4, _save_cases, str(tmp_path / "host"))
    _same_files(str(tmp_path / "ckpt"), str(tmp_path / "host"))


def main(argv: list[str]) -> None:
    what, path = argv[0], os.path.join(argv[1], "ckpt")
    dt.set_device("fake")
    if what == "save":
        _save_cases(path)
        checks = 1
    else:
        checks, kinds, copies = _load_cases(path)
        assert kinds == {fake_device.FakeArray} and copies == len(TENSORS), (kinds, copies)
    dt.barrier()
    if dt.get_rank() == 0:
        print(f"OK device {what} on {dt.get_world_size()} ranks, {checks} checks", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
