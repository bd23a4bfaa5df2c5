"""dt.save / dt.load: round trips on every placement against numpy, loads into other meshes,
world sizes and placements, bytes written and read per rank, resumed training, crash safety
under SIGKILL, corruption, errors, and Optimizer.load_state_dict.

Values are small multiples of 1/4, so Partial splits add up exactly and every comparison is
bit for bit. Shards are checked against tests/oracle.py, which shares no code with spec.py.
"""

from __future__ import annotations

import logging
import math
import os
import sys

import numpy as np
import pytest
from checkpoint_cases import (
    LONG,
    PSUM,
    S0,
    S1,
    TENSORS,
    R,
    check_loaded,
    check_long,
    long_on,
    long_template,
    state_on,
    template_on,
    value,
)
from mpirun import ROOT, mpiexec, run
from op_cases import MESH_SHAPES, assert_grid, make_input, mesh_of, placements
from oracle import local_shard

import disttensor as dt
from disttensor.checkpoint import CheckpointError, IOCounter, loading
from disttensor.checkpoint.files import read_region
from disttensor.checkpoint.tiles import span, touched, view2d

C128 = np.dtype(np.complex128)
DTYPES = [np.dtype(t) for t in (np.float64, np.float32, np.int64, np.bool_, np.complex128)]


def no_mpiexec() -> bool:
    try:
        mpiexec()
    except RuntimeError:
        return True
    return False


# -- round trips on every layout ----------------------------------------------------------------
def layouts(mesh: dt.ProcessMesh, ndim: int, dtype: np.dtype) -> list[list[dt.Placement]]:
    """op_cases' placements (every kind per mesh dim, nested shards, two Partials), without
    max/min Partials of complex values (numpy orders complex numbers, MPI does not)."""
    out = placements(mesh, ndim, dtype if dtype != C128 else np.float64)
    if dtype == C128:
        out = [p for p in out if not any(q.is_partial() and q.reduce_type in "maxmin" for q in p)]
    return out


def placed(g: np.ndarray, mesh: dt.ProcessMesh, pls, seed: int) -> dt.DistTensor:
    """``g`` on ``mesh``: Partials hold op_cases' asymmetric splits (complex values, which
    those splits do not take, hold the value on coordinate 0 and zeros elsewhere)."""
    if g.dtype == C128:
        return dt.shard_tensor(g, mesh, pls)
    return make_input(g, mesh, pls, seed=seed)


def shapes(mesh: dt.ProcessMesh) -> list[tuple[int, ...]]:
    """Even, uneven, fewer rows than ranks (empty shards), zero-size, 1-D and 0-d."""
    s = mesh.size
    return [(2 * s, 2 * s), (2 * s + 1, s + 1), (max(s - 1, 1), 2), (0, 3), (3 * s + 2,), ()]


def round_trip(mesh_shape: tuple[int, ...], directory: str) -> tuple[int, list[str]]:
    """Save every (shape, dtype, placements) tensor of the grid in one checkpoint, load it
    into the same layout and into Replicate, and compare with numpy's value and the oracle's
    shards. Runs on 4 ranks, so smaller meshes leave ranks outside."""
    mesh = mesh_of(mesh_shape)
    rank = dt.get_rank()
    cases = []
    for dtype in DTYPES:
        for shape in shapes(mesh) if dtype == np.float64 else shapes(mesh)[1::2]:
            for pls in layouts(mesh, len(shape), dtype):
                cases.append((shape, dtype, pls))
    want = [value(shape, dtype, i) for i, (shape, dtype, _) in enumerate(cases)]
    state = {
        "t": [placed(g, mesh, pls, seed=i) for i, (g, (_, _, pls)) in enumerate(zip(want, cases))]
    }
    path = os.path.join(directory, f"grid{len(mesh_shape)}{mesh.size}")
    dt.save(state, path)
    same = dt.load({"t": [dt.zeros(s, d, mesh=mesh, placements=p) for s, d, p in cases]}, path)
    repl = [R] * mesh.ndim
    whole = dt.load({"t": [dt.zeros(s, d, mesh=mesh, placements=repl) for s, d, _ in cases]}, path)
    failures = []
    for i, (shape, dtype, pls) in enumerate(cases):
        what = f"{mesh_shape} {shape} {dtype} {pls}"
        x, y = same["t"][i], whole["t"][i]
        if rank not in mesh:
            if x.local_shape != (0,) * len(shape) and shape:
                failures.append(f"{what}: a rank outside the mesh holds {x.local_shape}")
            continue
        got = x.numpy()
        if got.dtype != dtype or not np.array_equal(got, want[i]):
            failures.append(f"{what}: loaded into the saved layout, the value differs")
        if x.placements != list(pls):
            failures.append(f"{what}: placements {x.placements}")
        if not any(p.is_partial() for p in pls):
            if not np.array_equal(x.to_local(), local_shard(want[i], mesh, pls, rank)):
                failures.append(f"{what}: this rank's shard is not its box")
        if not np.array_equal(y.to_local(), want[i]) or y.to_local().dtype != dtype:
            failures.append(f"{what}: loaded as Replicate, the value differs")
    return len(cases), failures


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_round_trip_every_layout(mesh_shape, tmp_path):
    assert_grid(dt.simulate(4, round_trip, mesh_shape, str(tmp_path)), minimum=40)


def test_python_values_and_arrays_as_saved(tmp_path):
    """Nested dicts (keys of every JSON type), lists, tuples, Python values of every kind
    (big ints, -0.0, nan, inf, unicode), numpy arrays of other dtypes and numpy scalars come
    back exactly, with their types."""
    state = {
        "ints": [0, -1, 2**80, True, False],
        "floats": (0.1, -0.0, float("inf"), float("nan"), 1e-310),
        "text": "grüße ✓",
        "none": None,
        "keys": {1: "one", 2.5: "float", None: "none", False: "bool", "": "empty"},
        "arrays": [np.array(["ab", "cde"]), np.arange(6, dtype=np.uint16).reshape(2, 3)],
        "scalars": (np.float32(1.5), np.int8(-3), np.bool_(True), np.complex64(1 - 2j)),
        "empty": {"list": [], "tuple": (), "dict": {}, "array": np.zeros((0, 4))},
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    }
    path = str(tmp_path / "ckpt")
    dt.simulate(2, dt.save, state, path)
    for got in dt.simulate(2, dt.load, {k: None for k in state}, path):
        for k in state:
            assert type(got[k]) is type(state[k]), k
        assert got["ints"] == state["ints"] and type(got["ints"][3]) is bool
        assert str(got["floats"]) == str(state["floats"]) and math.copysign(1, got["floats"][1]) < 0
        assert got["text"] == state["text"] and got["none"] is None
        assert list(got["keys"].items()) == list(state["keys"].items())
        assert [type(k) for k in got["keys"]] == [type(k) for k in state["keys"]]
        for a, b in zip(got["arrays"] + [got["fortran"]], state["arrays"] + [state["fortran"]]):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        for a, b in zip(got["scalars"], state["scalars"]):
            assert type(a) is type(b) and a == b
        assert got["empty"] == {"list": [], "tuple": (), "dict": {}, "array": got["empty"]["array"]}
        assert got["empty"]["array"].shape == (0, 4)


# -- other meshes, world sizes and placements ----------------------------------------------------
def saved_2x2(directory: str) -> str:
    path = os.path.join(directory, "ckpt")
    dt.simulate(4, lambda: dt.save(state_on(dt.init_mesh((2, 2), dim_names=["dp", "mp"])), path))
    return path


def load_cross(path: str, k: int) -> tuple[int, list[str]]:
    """Load the (2, 2) checkpoint on k ranks: TENSORS' 1-D placements on a mesh of all k
    ranks, then under every placement of op_cases' grid on every mesh that fits the world
    (a subset of the ranks, nested shards, Partials): load j gives each tensor the j-th
    placement of its grid."""
    checks = check_loaded(dt.load(template_on(dt.init_mesh((k,))), path), dt.init_mesh((k,)))
    failures, rank = [], dt.get_rank()
    for mesh in [mesh_of(s) for s in MESH_SHAPES if math.prod(s) <= k]:
        grids = {n: layouts(mesh, len(t[0]), np.dtype(t[1])) for n, t in TENSORS.items()}
        for j in range(max(map(len, grids.values()))):
            pls = {n: g[j % len(g)] for n, g in grids.items()}
            flat = {
                n: dt.zeros(t[0], t[1], mesh=mesh, placements=pls[n]) for n, t in TENSORS.items()
            }
            got = dt.load(nest(flat), path)
            for i, (name, (shape, dtype, _, _)) in enumerate(TENSORS.items()):
                x, want, what = unnest(got)[name], value(shape, dtype, i), f"{name} {pls[name]}"
                checks += 1
                if x.placements != pls[name] or x.mesh != mesh:
                    failures.append(f"{what} on {mesh.shape}: came back as {x.placements}")
                if rank not in mesh:
                    continue
                if not np.array_equal(x.numpy(), want):
                    failures.append(f"{what} on {mesh.shape}: the value differs")
                if not any(p.is_partial() for p in pls[name]):
                    if not np.array_equal(x.to_local(), local_shard(want, mesh, pls[name], rank)):
                        failures.append(f"{what} on {mesh.shape}: the shard differs")
    return checks, failures


def nest(flat: dict) -> dict:
    """TENSORS' tensors by name placed where STATE keeps them."""
    flat = dict(flat)
    model = {k: flat.pop(k) for k in ("w", "b")}
    return {"model": model, "optim": {"state": {0: {"m": flat.pop("nested")}}}, "rest": flat}


def unnest(state: dict) -> dict:
    return {**state["model"], "nested": state["optim"]["state"][0]["m"], **state["rest"]}


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_load_on_other_worlds_and_placements(k, tmp_path):
    """Saved on 4 ranks as (2, 2) dp x mp, loaded on 1, 2, 3 and 4 ranks into other meshes
    and placements: bit-identical values, each rank holding exactly its box."""
    path = saved_2x2(str(tmp_path))
    assert_grid(dt.simulate(k, load_cross, path, k), minimum=40)


# -- long rows read in strips ------------------------------------------------------------------
def read_kind(piece: dict, region: tuple[slice, ...]) -> str:
    """How files.read_region reads ``region`` of ``piece``, for a region that starts at a
    column strip other than the first: "one read" (tiles.span), "straight" (that read lands
    in the result: the region is its bytes exactly) or "memory map" (of strips of one band or
    of several); else "from strip 0"."""
    shape, (rt, cw) = tuple(piece["shape"]), piece["tile"]
    tiles = touched(shape, region, rt, cw)
    if not tiles or min(s for _, s in tiles) == 0:
        return "from strip 0"
    found = span(shape, tiles, rt, cw)
    if found is None:  # one band of several rows is no more contiguous than several bands
        return "memory map" if len({b for b, _ in tiles}) > 1 else "memory map, one band"
    r0, r1, c0, c1 = found
    cols = view2d(shape)[1]
    start = sum(s.start * math.prod(shape[j + 1 :]) for j, s in enumerate(region))
    size = math.prod(s.stop - s.start for s in region)
    exact = start == r0 * cols + c0 and size == (r1 - r0 - 1) * cols + c1 - c0
    return "straight" if exact else "one read"


@pytest.mark.parametrize(
    "k,kinds",
    [
        (2, {"one read", "straight", "memory map", "memory map, one band"}),
        (3, {"one read", "memory map", "memory map, one band"}),
        (4, {"one read", "straight", "memory map", "memory map, one band"}),
    ],
    ids=["on 2", "on 3", "on 4"],
)
def test_long_rows_load_from_mid_row_strips(k, kinds, tmp_path, monkeypatch):
    """checkpoint_cases.LONG: 1-D arrays of 512 and 781 KiB and wide 2-D ones saved by 1, 2
    or 3 ranks, loaded on k ranks split another way (rank 2's box of "tall" on 3 is empty):
    bit-identical values and shards, no error. Rank boxes start mid-row, at a column strip
    other than a piece's first, read by each of read_region's ways; the reads are recorded
    and their kinds asserted, so that a change of the tiling that stops making such reads
    fails here instead of leaving the case testing less."""
    path = str(tmp_path / "ckpt")
    dt.simulate(3, lambda: dt.save(long_on(), path))
    reads = []

    def recorded(directory, piece, dtype, region, out=None):
        reads.append(read_kind(piece, region))
        return read_region(directory, piece, dtype, region, out)

    monkeypatch.setattr(loading, "read_region", recorded)

    def load():
        mesh = dt.init_mesh((k,))
        return check_long(dt.load(long_template(mesh), path), mesh)

    assert dt.simulate(k, load) == [len(LONG)] * k
    assert kinds <= set(reads), reads


# -- bytes written and read per rank --------------------------------------------------------------
BIG = (128, 4096)  # float64, 4 MiB; on (2, 2) four 1 MiB pieces of 64 rows of 16 KiB
MIB = 1 << 20
WHOLE = 4 * MIB
HEADER = 128  # an .npy header of these shapes


def save_counted(path: str):
    """Save three 4 MiB tensors on (2, 2): Shard x Shard, Replicate x Shard, Partial x Shard;
    returns this rank's (IOCounter, CommCounter counts) of the save."""
    mesh = dt.init_mesh((2, 2))
    state = {
        "x": dt.shard_tensor(value(BIG, np.float64, 0), mesh, [S0, S1]),
        "r": dt.shard_tensor(value(BIG, np.float64, 1), mesh, [R, S1]),
        "p": make_input(value(BIG, np.float64, 2), mesh, [PSUM, S1], seed=2),
    }
    with IOCounter() as io, dt.CommCounter() as cc:
        dt.save(state, path)
    return io, cc.counts


def load_counted(path: str, mesh_shape, pls):
    """Load "x" (saved Shard x Shard) into ``pls`` on a mesh; returns (the rank's box bytes,
    IOCounter, CommCounter counts, whether the shard is right)."""
    mesh = mesh_of(mesh_shape)
    with IOCounter() as io, dt.CommCounter() as cc:
        got = dt.load({"x": dt.zeros(BIG, mesh=mesh, placements=pls)}, path)["x"]
    want = local_shard(value(BIG, np.float64, 0), mesh, pls, dt.get_rank())
    return got.to_local().nbytes, io, cc.counts, np.array_equal(got.to_local(), want)


def test_each_rank_writes_only_its_own_bytes(tmp_path):
    """Every piece is written once, by one of its holders: per rank at most its own boxes;
    all ranks together the tensors' bytes exactly (a replicated box once, not per replica).
    The Partial tensor costs one reduce-scatter, not an all-reduce."""
    path = str(tmp_path / "ckpt")
    results = dt.simulate(4, save_counted, path)
    meta = os.path.getsize(os.path.join(path, "metadata.json"))
    quarter, half = WHOLE // 4, WHOLE // 2
    for rank, (io, counts) in enumerate(results):
        # x: its quarter; r: its half if it is the writer of that half; p: a quarter
        own = quarter + half + quarter + 3 * HEADER + (meta if rank == 0 else 0)
        assert io.bytes_written <= own, (rank, io)
        assert counts == {"reduce_scatter": 1, "all_gather_object": 3}, counts
    total = sum(io.bytes_written for io, _ in results)
    files = sum(io.files_written for io, _ in results)
    assert files == 4 + 2 + 4 + 1  # x, r (two halves, each once), p, metadata
    assert total == 3 * WHOLE + (files - 1) * HEADER + meta
    assert len(os.listdir(path)) == files


@pytest.mark.parametrize(
    "mesh_shape,pls,world",
    [((2, 2), [S0, S1], 4), ((4,), [S0], 4), ((3,), [S0], 3), ((2,), [S1], 2), ((3,), [S1], 3)],
    ids=["same layout", "rows on 4", "rows on 3", "columns on 2", "columns on 3"],
)
def test_load_reads_only_the_needed_slices(tmp_path, mesh_shape, pls, world):
    """A load reads the metadata, the header of each piece that overlaps the rank's box and
    the checksum tiles that hold the overlap, and moves no tensor data between ranks (two
    small all-gathers of errors). Where the box is aligned with the tiles (the saved layout,
    rows on 4, columns on 2): exactly the rank's own bytes; else its box rounded out to whole
    tiles, and never the whole tensor."""
    path = str(tmp_path / "ckpt")
    dt.simulate(4, save_counted, path)
    meta = os.path.getsize(os.path.join(path, "metadata.json"))
    # a 1 MiB piece has 16 tiles: 4 bands of 16 rows x 4 strips of 512 columns (256 KiB each
    # way), so an overlap is rounded out by less than 256 KiB at each end
    aligned = pls == [S0, S1] or mesh_shape in ((4,), (2,))
    for box, io, counts, right in dt.simulate(world, load_counted, path, mesh_shape, pls):
        assert right and counts == {"all_gather_object": 2}, counts
        pieces = io.files_read - 1
        data = io.bytes_read - meta - pieces * HEADER
        if pls == [S0, S1]:
            assert pieces == 1, io
        if aligned:
            assert data == box, io
        else:
            assert box < data < box + pieces * 2 * (256 << 10), io
        assert data <= 3 * WHOLE // 4, "a Shard layout must never read the whole tensor"


def test_load_into_replicate_reads_the_tensor_once_per_rank(tmp_path):
    path = str(tmp_path / "ckpt")
    dt.simulate(4, save_counted, path)
    for box, io, _, right in dt.simulate(2, load_counted, path, (2,), [R]):
        assert right and box == WHOLE and io.files_read == 5


# -- resumed training -----------------------------------------------------------------------------
D, H, BATCH = 8, 16, 8
PLAN = {"0": dt.nn.ColwiseParallel("mp"), "2": dt.nn.RowwiseParallel("mp")}


def batches(n: int):
    rng = np.random.default_rng(5)
    return [(rng.standard_normal((BATCH, D)), rng.standard_normal((BATCH, D))) for _ in range(n)]


def make_model(mesh: dt.ProcessMesh, seed: int):
    """Linear -> GELU -> Linear -> LayerNorm in float64: Megatron column/row split over "mp"
    where the mesh has it, data parallel over "dp"; Adam with a schedule (its step count
    matters) and weight decay."""
    dt.manual_seed(seed)
    model = dt.nn.Sequential(
        dt.nn.Linear(D, H, dtype=np.float64),
        dt.nn.GELU(),
        dt.nn.Linear(H, D, dtype=np.float64),
        dt.nn.LayerNorm(D, dtype=np.float64),
    )
    plan = {k: v for k, v in PLAN.items() if "mp" in mesh.dim_names}
    dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(plan))
    return model, dt.optim.Adam(model.parameters(), lr=lambda t: 0.01 / t, weight_decay=0.1)


def train(model, opt, mesh: dt.ProcessMesh, data) -> None:
    batch = [dt.Shard(0) if n == "dp" else R for n in mesh.dim_names]
    for x, y in data:
        x, y = (dt.shard_tensor(a, mesh, batch) for a in (x, y))
        loss = dt.nn.MSELoss()(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()


def resume_case(path: str, mesh_shape, names, resume_shape, resume_names):
    """3 steps, checkpoint (model + Adam state + step), 3 more steps: the uninterrupted run.
    A fresh model and optimizer (other initial weights) on the resume mesh load the
    checkpoint (the fresh optimizer's empty state takes the saved one) and run the same 3
    steps. Returns both runs' final parameters as global values."""
    mesh = dt.init_mesh(mesh_shape, dim_names=names)
    data = batches(6)
    model, opt = make_model(mesh, seed=0)
    train(model, opt, mesh, data[:3])
    dt.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}, path)
    train(model, opt, mesh, data[3:])
    straight = {k: p.numpy() for k, p in model.state_dict().items()}

    other = dt.init_mesh(resume_shape, dim_names=resume_names)
    model2, opt2 = make_model(other, seed=1)
    template = {"model": model2.state_dict(), "optim": opt2.state_dict(), "epoch": 0}
    state = dt.load(template, path)
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optim"])
    assert state["epoch"] == 3 and opt2.step_count == 3
    train(model2, opt2, other, data[3:])
    return straight, {k: p.numpy() for k, p in model2.state_dict().items()}


def test_resumed_training_is_bit_identical(tmp_path):
    """Same mesh and layout: the resumed run ends bit for bit where the uninterrupted one does."""
    path = str(tmp_path / "ckpt")
    args = ((2, 2), ["dp", "mp"])
    for straight, resumed in dt.simulate(4, resume_case, path, *args, *args):
        assert straight.keys() == resumed.keys()
        for k in straight:
            assert np.array_equal(straight[k], resumed[k]), k


def test_resumed_training_on_another_layout(tmp_path):
    """Saved on (2, 2) dp x mp, resumed on 4 ranks as (4,) mp only: every tensor is moved (the
    Adam moments too); the sums run in another order, so equal to float64 rounding."""
    path = str(tmp_path / "ckpt")
    for straight, resumed in dt.simulate(4, resume_case, path, (2, 2), ["dp", "mp"], (4,), ["mp"]):
        for k in straight:
            np.testing.assert_allclose(resumed[k], straight[k], rtol=1e-12, atol=1e-14, err_msg=k)


# -- crash safety -------------------------------------------------------------------------------
def test_sigkill_at_random_points_leaves_a_loadable_checkpoint(tmp_path):
    """40 times: a process saving in a loop is killed with SIGKILL after a random delay; the
    checkpoint at the path (or the previous one an interrupted commit had moved aside) loads,
    whole, and never older than the one loaded before (checkpoint_cases.crash_rounds)."""
    code, out = _python(["tests/checkpoint_cases.py", "crash", str(tmp_path), "40", "7"])
    assert code == 0 and "OK crash: 40 kills" in out, out


def _python(args: list[str]) -> tuple[int, str]:
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "tests"))
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_a_commit_interrupted_between_its_renames_is_recovered(tmp_path, caplog):
    """The state a crash between the commit's two renames leaves (the previous checkpoint
    moved aside, the new one not yet in place) loads the previous checkpoint; the next save
    puts a new one at the path and removes the aside copy and a crashed save's leftovers."""
    path = str(tmp_path / "ckpt")
    mesh1 = dt.ProcessMesh([0])
    dt.simulate(1, lambda: dt.save({"v": dt.full((3,), 1.0, mesh=mesh1)}, path))
    dt.simulate(1, lambda: dt.save({"v": dt.full((3,), 2.0, mesh=mesh1)}, path))
    assert os.listdir(tmp_path) == ["ckpt"]
    os.rename(path, tmp_path / ".ckpt.old-00000000000000000001-1")  # commit step (1) done
    os.mkdir(tmp_path / ".ckpt.tmp-00000000000000000002-1")  # a save that never finished
    template = {"v": None}
    with caplog.at_level(logging.WARNING, logger="disttensor"):
        got = dt.simulate(1, dt.load, template, path)[0]
    assert np.array_equal(got["v"].to_local(), [2.0, 2.0, 2.0])
    assert "moved aside" in caplog.text
    dt.simulate(1, lambda: dt.save({"v": dt.full((3,), 3.0, mesh=mesh1)}, path))
    assert os.listdir(tmp_path) == ["ckpt"]
    assert np.array_equal(dt.simulate(1, dt.load, template, path)[0]["v"].to_local(), [3.0] * 3)


# -- corruption -----------------------------------------------------------------------------------
def saved_for_corruption(directory) -> str:
    path = os.path.join(str(directory), "ckpt")
    mesh = dt.ProcessMesh([0, 1])

    def save():
        x = dt.shard_tensor(value((40, 30), np.float64, 0), mesh, [S0])
        dt.save({"x": x, "step": 4}, path)

    dt.simulate(2, save)
    return path


def load_errors(path: str, template=None) -> list[str]:
    """Load on 2 ranks (each reads one piece) and return every rank's error."""
    template = template or {"x": None, "step": 0}

    def attempt():
        try:
            dt.load(template, path)
        except CheckpointError as e:
            return str(e)
        return "no error"

    return dt.simulate(2, attempt)


def flip(name: str, offset: int, mask: int = 0x10) -> None:
    """Flip bits ``mask`` of the byte at ``offset`` of file ``name``."""
    with open(name, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


@pytest.mark.parametrize(
    "how", ["data byte", "header byte", "truncated", "missing", "metadata digit", "metadata brace"]
)
def test_corruption_is_detected_on_every_rank_naming_the_file(tmp_path, how):
    """One flipped byte (the array data of a shard file, its .npy header, a digit or a brace
    of the metadata), a truncated or a missing shard file: every rank raises a
    CheckpointError naming the file, also the rank that did not read it."""
    path = saved_for_corruption(tmp_path)
    shard = os.path.join(path, "t00000.0001.npy")  # rank 1's piece
    meta = os.path.join(path, "metadata.json")
    if how == "data byte":
        flip(shard, os.path.getsize(shard) - 100)
    elif how == "header byte":
        flip(shard, 20)
    elif how == "truncated":
        os.truncate(shard, os.path.getsize(shard) - 1)
    elif how == "missing":
        os.remove(shard)
    else:
        with open(meta) as f:
            text = f.read()
        if "digit" in how:  # 40 -> 50 rows: still valid JSON, caught by the body's crc32
            flip(meta, text.index('"shape": [40') + 10, 0x01)
        else:
            flip(meta, text.rindex("}"))
    errors = load_errors(path)
    name = meta if how.startswith("metadata") else shard
    for e in errors:
        assert name in e, errors
    words = {"truncated": "truncated", "missing": "missing"}.get(how, "checksum")
    assert words in errors[0] or how == "metadata brace", errors


def test_a_rank_that_reads_only_sound_pieces_raises_too(tmp_path):
    """Rank 1's piece is corrupt. A template that reads no tensor loads; one where rank 0
    reads only its own (sound) piece raises on rank 0 as well, naming rank 1's file."""
    path = saved_for_corruption(tmp_path)
    flip(os.path.join(path, "t00000.0001.npy"), 300)
    assert dt.simulate(2, lambda: dt.load({"step": 0}, path)) == [{"step": 4}] * 2

    def attempt():
        x = dt.zeros((40, 30), mesh=dt.ProcessMesh([0, 1]), placements=[S0])
        with IOCounter() as io:
            try:
                dt.load({"x": x}, path)
            except CheckpointError as e:
                return io.files_read, str(e)
        return io.files_read, "no error"

    (files0, error0), (_, error1) = dt.simulate(2, attempt)
    assert files0 == 2  # the metadata and its own piece
    assert "t00000.0001.npy" in error0 and "read by ranks [1]" in error0 and error0 == error1


# -- errors ---------------------------------------------------------------------------------------
def every_rank_raises(n: int, fn, *args) -> list[tuple[type, str]]:
    """Each rank's (exception type, message) from ``fn(*args)`` (fails if one returns)."""

    def attempt():
        try:
            fn(*args)
        except Exception as e:
            return type(e), str(e)
        raise AssertionError("no error")

    return dt.simulate(n, attempt)


def _zeros(shape, dtype=np.float64):
    return lambda: dt.zeros(shape, dtype, mesh=dt.ProcessMesh([0, 1]))


@pytest.mark.parametrize(
    "template,error,says",
    [
        ({"x": _zeros((40, 31))}, ValueError, "(40, 30) float64 in the checkpoint"),
        ({"x": _zeros((40, 30), np.float32)}, ValueError, "the template has (40, 30) float32"),
        ({"x": None, "y": 0}, KeyError, "the checkpoint has no state['y']"),
        ({"step": [0]}, TypeError, "state['step'] is a Python value"),
        ({"step": _zeros((1,))}, TypeError, "state['step'] is a DistTensor in the template"),
        ({"x": {"a": 1}}, TypeError, "state['x'] is a tensor in the checkpoint"),
    ],
    ids=[
        "shape",
        "dtype",
        "missing key",
        "list for a value",
        "tensor for a value",
        "dict for a tensor",
    ],
)
def test_a_template_that_does_not_fit_raises_before_reading(tmp_path, template, error, says):
    """On every rank, naming the entry, with nothing read but the metadata."""
    path = saved_for_corruption(tmp_path)

    def attempt():
        made = {k: v() if callable(v) else v for k, v in template.items()}
        with IOCounter() as io:
            try:
                dt.load(made, path)
            except Exception as e:
                return type(e), str(e), io.files_read
        return None, "no error", io.files_read

    for kind, msg, files in dt.simulate(2, attempt):
        assert kind is error and says in msg and files == 1, msg


def test_missing_checkpoint_and_bad_paths(tmp_path):
    missing = str(tmp_path / "nothing")
    for kind, msg in every_rank_raises(2, dt.load, {}, missing):
        assert kind is FileNotFoundError and "no checkpoint at" in msg and missing in msg
    for kind, msg in every_rank_raises(2, dt.load, {}, str(tmp_path)):
        assert kind is CheckpointError and "metadata.json" in msg
    state = {"a": np.zeros(2)}
    for kind, msg in every_rank_raises(2, dt.save, state, str(tmp_path / "no" / "ckpt")):
        assert kind is FileNotFoundError and "does not exist" in msg
    (tmp_path / "file").write_text("")
    for kind, msg in every_rank_raises(2, dt.save, state, str(tmp_path / "file")):
        assert kind is FileExistsError and "is not a checkpoint directory" in msg
    assert sorted(os.listdir(tmp_path)) == ["file"]  # nothing left behind


@pytest.mark.parametrize(
    "bad,says",
    [
        ({"opt": {"lr": 0.1, "fn": len}}, "state['opt']['fn'] is a builtin_function_or_method"),
        ({"s": {1, 2}}, "state['s'] is a set"),
        ({"k": {(1, 2): 0}}, "has a key (1, 2) of type tuple"),
        ({"o": np.array([None, 1])}, "array of Python objects"),
        ({"b": b"bytes"}, "state['b'] is a bytes"),
    ],
    ids=["function", "set", "tuple key", "object array", "bytes"],
)
def test_values_a_checkpoint_cannot_hold(tmp_path, bad, says):
    """A TypeError on every rank, naming the entry, before any collective; nothing written."""
    path = str(tmp_path / "ckpt")

    def attempt():
        with dt.CommCounter() as cc:
            try:
                dt.save({"fine": 1, **bad}, path)
            except TypeError as e:
                return str(e), cc.total
        return "no error", cc.total

    for msg, collectives in dt.simulate(2, attempt):
        assert says in msg and collectives == 0, msg
    assert os.listdir(tmp_path) == []


def test_ranks_that_save_different_states(tmp_path):
    path = str(tmp_path / "ckpt")

    def save():
        dt.save({"a": np.zeros(dt.get_rank() + 1)}, path)

    for kind, msg in every_rank_raises(3, save):
        assert kind is ValueError and "ranks [1, 2]" in msg
    assert os.listdir(tmp_path) == []


# -- Optimizer.load_state_dict -------------------------------------------------------------------
OPTIMIZERS = {
    "SGD": lambda ps: dt.optim.SGD(ps, lr=0.1, weight_decay=0.01),
    "Momentum": lambda ps: dt.optim.Momentum(ps, lr=0.1, nesterov=True),
    "Adam": lambda ps: dt.optim.Adam(ps, lr=0.1),
    "AdamW": lambda ps: dt.optim.AdamW(ps, lr=lambda t: 0.1 / t),
}


def optimizer_case(name: str, path: str):
    """Two parameters ([S1] and [R]) on 2 ranks, 2 steps, state saved and loaded into a
    fresh optimizer whose parameters sit on (2,) as [R] and [S0]: both continue 2 steps from
    equal parameter values and must stay equal to float64 rounding; the state follows the
    new parameters' placements."""
    mesh = dt.init_mesh((2,))
    rng = np.random.default_rng(0)
    w0, b0 = rng.standard_normal((4, 6)), rng.standard_normal(6)
    grads = [(rng.standard_normal((4, 6)), rng.standard_normal(6)) for _ in range(4)]

    def steps(params, opt, grads):
        for gw, gb in grads:
            for p, g in zip(params, (gw, gb)):
                p.grad = dt.shard_tensor(g, p.mesh, p.placements)
            opt.step()
            opt.zero_grad()

    ps = [
        dt.nn.Parameter(dt.shard_tensor(w0, mesh, [S1])),
        dt.nn.Parameter(dt.shard_tensor(b0, mesh, [R])),
    ]
    opt = OPTIMIZERS[name](ps)
    steps(ps, opt, grads[:2])
    dt.save(opt.state_dict(), path)
    qs = [dt.nn.Parameter(dt.shard_tensor(p.numpy(), mesh, pl)) for p, pl in zip(ps, ([R], [S0]))]
    opt2 = OPTIMIZERS[name](qs)
    opt2.load_state_dict(dt.load(opt2.state_dict(), path))
    names = type(opt2).state_names
    assert all(opt2.state[id(q)].keys() == set(names) for q in qs) if names else not opt2.state
    for q in qs if names else ():  # the state moved to the new parameters' layout
        assert all(t.spec == q.spec for t in opt2.state[id(q)].values())
    steps(ps, opt, grads[2:])
    steps(qs, opt2, grads[2:])
    return [p.numpy() for p in ps], [q.numpy() for q in qs], opt2.step_count


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_load_state_dict_in_another_layout(name, tmp_path):
    for want, got, steps in dt.simulate(2, optimizer_case, name, str(tmp_path / "ckpt")):
        assert steps == 4
        for a, b in zip(want, got):
            np.testing.assert_allclose(b, a, rtol=1e-13, atol=0)


def test_optimizer_load_state_dict_errors_change_nothing():
    def case():
        mesh = dt.ProcessMesh([0, 1])
        ps = [dt.nn.Parameter(dt.ones((3, 2), mesh=mesh, placements=[S0])) for _ in range(2)]
        opt = dt.optim.Adam(ps)
        for p in ps:
            p.grad = dt.ones_like(p)
        opt.step()
        before = opt.state_dict()
        m = np.zeros((3, 2))
        bad = [
            ({"step": 1}, 'keys "step" and "state"'),
            ({"step": -1, "state": {}}, "step must be an int >= 0"),
            ({"step": 1.5, "state": {}}, "step must be an int >= 0"),
            ({"step": 1, "state": {2: {"exp_avg": m, "exp_avg_sq": m}}}, "has 2 parameters"),
            ({"step": 1, "state": {"x": {}}}, "names parameter 'x'"),
            ({"step": 1, "state": {0: {"velocity": m}}}, "keeps ['exp_avg', 'exp_avg_sq']"),
            ({"step": 1, "state": {0: {"exp_avg": m, "exp_avg_sq": np.zeros(6)}}}, "(6,) float64"),
        ]
        out = []
        for state, says in bad:
            try:
                opt.load_state_dict(state)
                out.append(f"no error for {state}")
            except (ValueError, TypeError) as e:
                if says not in str(e):
                    out.append(f"{says!r} not in {e}")
            after = opt.state_dict()
            same = after["step"] == before["step"] and all(
                after["state"][i][k] is before["state"][i][k]
                for i in (0, 1)
                for k in before["state"][i]
            )
            if not same:
                out.append(f"{state} changed the optimizer")
        # a JSON round trip turns integer keys into strings: accepted
        opt.load_state_dict({"step": 7, "state": {"1": {"exp_avg": m, "exp_avg_sq": m + 1}}})
        if opt.step_count != 7 or list(opt.state_dict()["state"]) != [1]:
            out.append("string keys not accepted")
        return out

    assert dt.simulate(2, case) == [[], []]


# -- real processes -------------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.skipif(no_mpiexec(), reason="mpiexec not found (pip install mpich)")
def test_save_on_4_processes_load_on_2_and_3(tmp_path):
    """Under mpiexec: (2, 2) dp x mp save on 4 processes (checkpoint_cases.LONG's tensors by
    1 to 3 of them), loads on 2 and 3 into 1-D layouts, every rank checking its shard and the
    global values bit for bit (checkpoint_cases)."""
    for n, what in [(4, "save"), (2, "load"), (3, "load")]:
        code, out = run(n, ["tests/checkpoint_cases.py", what, str(tmp_path)], timeout=120)
        assert code == 0 and f"OK {what} on {n} ranks" in out, out


@pytest.mark.mpi
@pytest.mark.skipif(no_mpiexec(), reason="mpiexec not found (pip install mpich)")
def test_checkpoint_benchmark_runs():
    """bench/checkpoint.py --quick checks a load against the saved values, then times; the
    numbers are not asserted."""
    code, out = run(2, ["bench/checkpoint.py", "--quick"], timeout=120)
    assert code == 0, out
    assert "dt.save" in out and "dt.load T cold" in out and "raw save" in out, out
