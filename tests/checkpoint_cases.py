"""Checkpoint cases shared by tests/test_checkpoint.py, and a script for real processes.

``mpiexec -n 4 python tests/checkpoint_cases.py save DIR`` saves STATE on a (2, 2) "dp" x
"mp" mesh; ``mpiexec -n K python tests/checkpoint_cases.py load DIR`` (K = 1..4) loads it into
other placements on a 1-D mesh of K ranks and checks every rank's shard and the global values
bit for bit (LONG's tensors too: saved by 1, 2 or 3 of the 4 ranks, loaded split another
way); ``python tests/checkpoint_cases.py crash DIR ROUNDS SEED`` runs the SIGKILL loop
(``crash_rounds``). Each prints one ``OK ...`` line on rank 0 and exits non-zero on a failure.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import numpy as np
from op_cases import make_input
from oracle import coord_of, local_shard

import disttensor as dt

S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
PSUM, PMAX = dt.Partial("sum"), dt.Partial("max")


def value(shape, dtype, seed: int) -> np.ndarray:
    """Global test values: small multiples of 1/4 (so Partial splits add up exactly)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    ints = rng.integers(-40, 41, shape)
    if dtype.kind == "c":
        return ((ints + 1j * rng.integers(-40, 41, shape)) / 4).astype(dtype)
    return (ints / 4).astype(dtype) if dtype.kind == "f" else ints.astype(dtype)


# name: (global shape, dtype, placements on the (2, 2) save mesh, placements on a 1-D load mesh)
TENSORS = {
    "w": ((7, 5), np.float64, [S0, S1], [S1]),
    "b": ((5,), np.float32, [R, S0], [R]),
    "nested": ((9, 3), np.int64, [S0, S0], [S1]),
    "partial": ((6, 4), np.float64, [PSUM, S1], [S0]),
    "flags": ((3, 2), np.bool_, [S1, R], [PMAX]),
    "z": ((4, 3), np.complex128, [R, R], [S0]),
    "empty": ((1, 4), np.float64, [S0, S1], [S0]),
}


# Long rows read in strips (Note [Reading only what overlaps]): pieces whose rows hold several
# checksum strips (tiles.py: 4 KiB at least, aiming at 64 KiB tiles), loaded so that a rank's
# box starts mid-row, at a strip other than the piece's first; a read of one row's strips is one
# positioned read (tiles.span), a read of columns of several rows goes through a memory map.
# name: (global shape, dtype, saved by ranks 0..n-1 as a 1-D mesh, its placements there,
# placements on the 1-D load mesh of every rank). Most lengths are odd: uneven splits.
LONG = {
    # 512 KiB saved by one rank, one piece of 8 strips: on 3 ranks boxes start mid-strip, on 2
    # rank 1's box is strips 4 to 7 exactly (read straight into the result)
    "line": ((65536,), np.float64, 1, [S0], [S0]),
    # halves of 6 strips loaded in thirds, thirds of 4 strips loaded in halves
    "halves": ((100003,), np.float64, 2, [S0], [S0]),
    "thirds": ((100003,), np.float64, 3, [S0], [S0]),
    # bands of 2 rows by 3 strips: a box of columns of them is strided (the memory map)
    "wide": ((3, 40001), np.float32, 1, [R], [S1]),
    # pieces of one band of 2 rows by 3 strips: strided too, though in one band
    "band": ((4, 12289), np.float64, 2, [S0], [S1]),
    # one-row pieces of 4 strips: a box of columns of one is one read
    "rows": ((3, 40001), np.float64, 3, [S0], [S1]),
    # rows of 4 strips loaded as rows: on 3 ranks rank 2's box is empty
    "tall": ((2, 40001), np.float64, 1, [R], [S0]),
}


def long_on() -> dict:
    """LONG's tensors, each on the ranks that save it (the others hold none)."""
    return {
        name: dt.shard_tensor(value(shape, dtype, 100 + i), dt.ProcessMesh(list(range(n))), pls)
        for i, (name, (shape, dtype, n, pls, _)) in enumerate(LONG.items())
    }


def long_template(mesh: dt.ProcessMesh) -> dict:
    """Zeros in LONG's load placements on ``mesh``."""
    return {
        name: dt.zeros(shape, dtype, mesh=mesh, placements=pls)
        for name, (shape, dtype, _, _, pls) in LONG.items()
    }


def check_long(got: dict, mesh: dt.ProcessMesh) -> int:
    """Each of LONG's loaded tensors equals its value bit for bit, each rank's shard its box."""
    rank = dt.get_rank()
    for i, (name, (shape, dtype, _, _, pls)) in enumerate(LONG.items()):
        x, want = got[name], value(shape, dtype, 100 + i)
        assert x.placements == pls and x.mesh == mesh and x.dtype == want.dtype, name
        assert np.array_equal(x.numpy(), want), name
        assert np.array_equal(x.to_local(), local_shard(want, mesh, pls, rank)), name
    return len(LONG)


def state_on(mesh: dt.ProcessMesh) -> dict:
    """STATE with its tensors laid out on ``mesh`` (2-D) as TENSORS says."""
    tensors = {
        name: make_input(value(shape, dtype, i), mesh, pls, seed=i)
        for i, (name, (shape, dtype, pls, _)) in enumerate(TENSORS.items())
    }
    return {
        "model": {k: tensors.pop(k) for k in ("w", "b")},
        "optim": {"step": 3, "state": {0: {"m": tensors.pop("nested")}}},
        "rest": tensors,
        "array": np.arange(10, dtype=np.int32).reshape(2, 5),
        "python": [1, 2.5, "three", None, True, (4, {"five": -0.0})],
    }


def template_on(mesh: dt.ProcessMesh) -> dict:
    """A template with the 1-D placements of TENSORS on ``mesh``, other values as placeholders."""
    t = {
        name: dt.zeros(shape, dtype, mesh=mesh, placements=pls)
        for name, (shape, dtype, _, pls) in TENSORS.items()
    }
    return {
        "model": {k: t.pop(k) for k in ("w", "b")},
        "optim": {"step": 0, "state": {0: {"m": t.pop("nested")}}},
        "rest": t,
        "array": None,
        "python": None,
    }


def check_loaded(state: dict, mesh: dt.ProcessMesh) -> int:
    """Every loaded tensor equals its global value bit for bit, each rank's shard is its box
    of it (oracle.local_shard), and the Python values and arrays are as saved."""
    rank = dt.get_rank()
    flat = {**state["model"], "nested": state["optim"]["state"][0]["m"], **state["rest"]}
    checks = 0
    for i, (name, (shape, dtype, _, pls)) in enumerate(TENSORS.items()):
        x, want = flat[name], value(shape, dtype, i)
        assert x.placements == pls and x.mesh == mesh and x.dtype == want.dtype, name
        got = x.numpy()
        assert got.dtype == want.dtype and np.array_equal(got, want), name
        if not any(p.is_partial() for p in pls):
            assert np.array_equal(x.to_local(), local_shard(want, mesh, pls, rank)), name
        elif coord_of(mesh.mesh, rank) is not None:  # Partial(max) holds the value everywhere
            assert np.array_equal(x.to_local(), want), name
        checks += 1
    assert state["optim"]["step"] == 3
    assert np.array_equal(state["array"], np.arange(10, dtype=np.int32).reshape(2, 5))
    assert state["array"].dtype == np.int32
    assert state["python"] == [1, 2.5, "three", None, True, (4, {"five": -0.0})]
    assert np.copysign(1.0, state["python"][5][1]["five"]) == -1.0
    return checks + 1


# -- the SIGKILL loop ------------------------------------------------------------------------
def crash_state(k: int) -> dict:
    """Save number k: every value says k, so a torn checkpoint cannot pass for a whole one."""
    mesh = dt.ProcessMesh([0])
    return {
        "model": {f"w{i}": dt.full((64, 48), float(k), mesh=mesh) for i in range(6)},
        "opt": {"m": dt.full((300,), k, dtype=np.int64, mesh=mesh, placements=[S0])},
        "array": np.full(100, k),
        "step": k,
    }


def _verify(path: str) -> int:
    """Load the checkpoint at path; every value must be the same save number."""
    template = {"model": {f"w{i}": None for i in range(6)}, "opt": None, "array": None, "step": 0}
    state = dt.simulate(1, dt.load, template, path)[0]
    k = state["step"]
    for w in state["model"].values():
        assert np.all(w.to_local() == k), f"a weight of save {k} holds other values"
    assert np.all(state["opt"]["m"].to_local() == k) and np.all(state["array"] == k)
    return k


def _slow(rename):
    """``rename`` with a millisecond before and after: widens the commit's windows."""

    def slow_rename(a, b):
        time.sleep(0.001)
        rename(a, b)
        time.sleep(0.001)

    return slow_rename


def crash_rounds(directory: str, rounds: int, seed: int) -> str:
    """Fork a child that saves crash_state(k), k = 1, 2, ..., in a loop into one path, kill it
    with SIGKILL after a random delay, and load what is there: ``rounds`` times. The renames
    of the commit are slowed down by a millisecond each in the child, so that kills also
    land between them. Returns a summary; raises if any load fails or goes back in time."""
    rng = random.Random(seed)
    path = os.path.join(directory, "ckpt")
    dt.simulate(1, dt.save, crash_state(0), path)
    last, recovered, seen = 0, 0, set()
    for r in range(rounds):
        start = (r + 1) * 100_000
        pid = os.fork()
        if pid == 0:  # the child: save until killed
            try:
                os.rename = _slow(os.rename)
                k = start
                while True:
                    dt.simulate(1, dt.save, crash_state(k), path)
                    k += 1
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 0.04))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        recovered += not os.path.exists(path)
        k = _verify(path)
        if k < last:
            raise AssertionError(f"round {r}: loaded save {k}, older than save {last} seen before")
        seen.add(k)
        last = k
    dt.simulate(1, dt.save, crash_state(10**9), path)  # a clean save removes every leftover
    left = sorted(os.listdir(directory))
    if left != ["ckpt"] or _verify(path) != 10**9:
        raise AssertionError(f"after a clean save the directory holds {left}")
    return f"{rounds} kills, {len(seen)} distinct saves loaded, {recovered} from the aside copy"


def main(argv: list[str]) -> None:
    what, directory = argv[0], argv[1]
    if what == "crash":
        print("OK crash:", crash_rounds(directory, int(argv[2]), int(argv[3])), flush=True)
        return
    n = dt.get_world_size()
    path = os.path.join(directory, "ckpt")
    # LONG rides along here, not in STATE: tests/test_device_checkpoint.py counts STATE's
    # tensors, and test_checkpoint loads LONG on its own on simulated ranks
    if what == "save":
        mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
        dt.save({**state_on(mesh), "long": long_on()}, path)
        checks = 1
    else:
        mesh = dt.init_mesh((n,))
        state = dt.load({**template_on(mesh), "long": long_template(mesh)}, path)
        checks = check_loaded(state, mesh) + check_long(state["long"], mesh)
    dt.barrier()
    if dt.get_rank() == 0:
        print(f"OK {what} on {n} ranks, {checks} checks", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
