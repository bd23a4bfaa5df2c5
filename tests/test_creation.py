"""Factories (zeros, ones, full, empty, arange, rand, randn): local shards only, numpy's values;
shard_tensor's agreement on the values every rank passes.

Every check runs on simulated ranks: each rank compares its shard with the box that nested
numpy.array_split gives (computed here, independently of spec.py) and its gathered value with
numpy's.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest

import disttensor as dt
from disttensor.comm import agree

S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
P, PMAX, PMIN = dt.Partial("sum"), dt.Partial("max"), dt.Partial("min")

MESHES = {"1": [0], "2": [0, 1], "3": [0, 1, 2], "4": [0, 1, 2, 3], "2x2": [[0, 1], [2, 3]]}
LAYOUTS = [  # (mesh, placements): every 1-D placement, and every 2x2 pair
    *[(m, [p]) for m in ("1", "2", "3", "4") for p in (S0, S1, R, P, PMAX)],
    *[("2x2", list(ps)) for ps in itertools.product([S0, S1, R, P], repeat=2)],
]
SHAPES = [(7, 5), (4, 6), (1, 2), (0, 3), (3, 0)]  # uneven, even, empty shards, empty tensors


def _id(layout) -> str:
    mesh, placements = layout
    return f"{mesh}-" + ",".join(repr(p) for p in placements)


def local_index(shape, ids, placements, rank):
    """Per axis, the global indices this rank holds: nested array_split in mesh-dim order."""
    ids = np.asarray(ids)
    coord = [int(c[0]) for c in np.nonzero(ids == rank)]
    index = [np.arange(n) for n in shape]
    for m, p in enumerate(placements):
        if p.is_shard():
            index[p.dim] = np.array_split(index[p.dim], ids.shape[m])[coord[m]]
    return index


def check(x, expected, ids, placements, *, values=True) -> None:
    """This rank's ``x`` against the global numpy array ``expected``."""
    ids_mesh = dt.ProcessMesh(ids)
    index = local_index(expected.shape, ids, placements, dt.get_rank())
    local = x.to_local()
    assert (x.shape, x.dtype, x.mesh, x.placements) == (
        expected.shape,
        expected.dtype,
        ids_mesh,
        placements,
    )
    assert local.shape == x.local_shape == tuple(len(i) for i in index)
    assert local.dtype == expected.dtype
    owner = local
    while owner.base is not None and isinstance(owner.base, np.ndarray):
        owner = owner.base
    assert owner.nbytes == local.nbytes, "more than the local shard was allocated"
    if values:
        if not any(p.is_partial() for p in placements):
            np.testing.assert_array_equal(local, expected[np.ix_(*index)])
        got = x.numpy()
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected, strict=True)


def run(n: int, fn) -> None:
    assert dt.simulate(n, fn) == [True] * n


def _size(ids) -> int:
    return int(np.size(ids))


# -- zeros / ones / full / empty -----------------------------------------------------------------
FILLS = {
    "zeros": (lambda s, **kw: dt.zeros(s, **kw), lambda s: np.zeros(s)),
    "zeros-i4": (lambda s, **kw: dt.zeros(s, np.int32, **kw), lambda s: np.zeros(s, np.int32)),
    "ones": (lambda s, **kw: dt.ones(s, **kw), lambda s: np.ones(s)),
    "ones-f4": (lambda s, **kw: dt.ones(s, np.float32, **kw), lambda s: np.ones(s, np.float32)),
    "full-float": (lambda s, **kw: dt.full(s, 2.5, **kw), lambda s: np.full(s, 2.5)),
    "full-int": (lambda s, **kw: dt.full(s, -7, **kw), lambda s: np.full(s, -7)),
    "full-bool": (lambda s, **kw: dt.full(s, True, **kw), lambda s: np.full(s, True)),
    "full-c16": (
        lambda s, **kw: dt.full(s, 1 - 2j, np.complex128, **kw),
        lambda s: np.full(s, 1 - 2j, np.complex128),
    ),
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=_id)
@pytest.mark.parametrize("fill", FILLS)
def test_fill_factories(fill, layout) -> None:
    mesh_name, placements = layout
    ids = MESHES[mesh_name]
    make, ref = FILLS[fill]

    def f():
        mesh = dt.ProcessMesh(ids)
        for shape in SHAPES:
            check(make(shape, mesh=mesh, placements=placements), ref(shape), ids, placements)
        return True

    run(_size(ids), f)


@pytest.mark.parametrize("layout", LAYOUTS, ids=_id)
def test_empty_allocates_the_local_shard_only(layout) -> None:
    mesh_name, placements = layout
    ids = MESHES[mesh_name]

    def f():
        mesh = dt.ProcessMesh(ids)
        for shape, dtype in itertools.product(SHAPES, [np.float64, np.int16]):
            x = dt.empty(shape, dtype, mesh=mesh, placements=placements)
            check(x, np.empty(shape, dtype), ids, placements, values=False)
        return True

    run(_size(ids), f)


@pytest.mark.parametrize("ids", [[0, 1], [0, 1, 2], [[0, 1], [2, 3]]])
@pytest.mark.parametrize("p", [R, P, PMAX, dt.Partial("avg")])
def test_zero_dim(ids, p) -> None:
    placements = [p] * np.ndim(ids)

    def f():
        mesh = dt.ProcessMesh(ids)
        check(dt.full((), 4.0, mesh=mesh, placements=placements), np.full((), 4.0), ids, placements)
        check(dt.zeros((), mesh=mesh, placements=placements), np.zeros(()), ids, placements)
        return True

    run(_size(ids), f)


def test_full_dtype_follows_numpy() -> None:
    def f():
        mesh = dt.ProcessMesh([0, 1])
        for value, dtype in [(3, None), (3.0, None), (True, None), (3, np.float32), (2.7, int)]:
            x = dt.full((3, 2), value, dtype, mesh=mesh, placements=[S0])
            check(x, np.full((3, 2), value, dtype), [0, 1], [S0])
        return True

    run(2, f)


def test_default_mesh_is_the_world_replicated() -> None:
    def f():
        for x in (dt.zeros(4), dt.ones((2, 3)), dt.rand(3, seed=0), dt.arange(5)):
            assert x.mesh == dt.ProcessMesh([0, 1, 2])
            assert x.placements == [R]
            assert x.local_shape == x.shape
        return True

    run(3, f)


@pytest.mark.parametrize("shape", [5, np.int64(5), [5], (5,), np.array([5, 2])])
def test_shape_forms(shape) -> None:
    def f():
        x = dt.zeros(shape, mesh=dt.ProcessMesh([0, 1]), placements=[S0])
        check(x, np.zeros(shape), [0, 1], [S0])
        return True

    run(2, f)


# -- arange ----------------------------------------------------------------------------------
ARANGES = [
    ((10,), {}),
    ((0,), {}),
    ((3, 17), {}),
    ((0, 10, 3), {}),
    ((10, 0, -3), {}),
    ((-5, 5), {}),
    ((5, 1), {}),  # empty
    ((3, 3), {}),  # empty
    ((0, 10), {"dtype": np.int32}),
    ((0, 10, 3), {"dtype": np.float64}),
    ((-3, 3), {"dtype": np.int8}),
    ((0, 1, 0.1), {}),
    ((0, 0.3, 0.1), {}),
    ((0.0, 10.0), {}),
    ((0.5, 9.7, 0.3), {}),
    ((1.5, -2, -0.25), {}),
    ((1.0, 0.0, -0.1), {}),
    ((10, -10, -0.3), {}),
    ((-1, 1, 0.25), {}),
    ((0, 100, 0.7), {}),
    ((1e10, 1e10 + 100, 7.3), {}),
    ((0, 1, 0.1), {"dtype": np.float32}),
    ((0, 3, 0.1), {"dtype": np.float32}),
    ((0, 5, 0.5), {"dtype": int}),
]
ARANGE_LAYOUTS = [
    *[(m, [p]) for m in ("1", "2", "3", "4") for p in (S0, R, P, PMAX)],
    *[("2x2", ps) for ps in ([S0, S0], [S0, R], [R, S0], [P, S0], [R, R])],
]


def _arange_id(case) -> str:
    args, kw = case
    return ",".join(map(str, args)) + "".join(f",{k}={np.dtype(v)}" for k, v in kw.items())


@pytest.mark.parametrize("layout", ARANGE_LAYOUTS, ids=_id)
def test_arange(layout) -> None:
    mesh_name, placements = layout
    ids = MESHES[mesh_name]

    def f():
        mesh = dt.ProcessMesh(ids)
        for args, kw in ARANGES:
            x = dt.arange(*args, **kw, mesh=mesh, placements=placements)
            check(x, np.arange(*args, **kw), ids, placements)
        return True

    run(_size(ids), f)


@pytest.mark.parametrize("case", [((5.0,), {}), ((1, 2.5), {}), ((0, 4.0, 1), {})], ids=_arange_id)
def test_arange_float_stop_gives_float(case) -> None:
    # np.arange(5.0) is float64; dt.arange(5.0) is int64 (the dtype comes from
    # np.arange(start, start + 2 * step, step), which never sees the float stop).
    args, kw = case

    def f():
        x = dt.arange(*args, **kw, mesh=dt.ProcessMesh([0, 1]), placements=[S0])
        check(x, np.arange(*args, **kw), [0, 1], [S0])
        return True

    run(2, f)


@pytest.mark.parametrize(
    "case",
    [((0.3, 77.7, 0.37), {"dtype": np.float32}), ((0.2, 50, 0.3), {"dtype": np.float32})],
    ids=_arange_id,
)
def test_arange_float32_matches_numpy(case) -> None:
    # numpy fills element i >= 2 as start + i * delta in float32; creation.arange computes
    # first + i * delta with an int64 index array (so in float64) and rounds afterwards.
    args, kw = case

    def f():
        x = dt.arange(*args, **kw, mesh=dt.ProcessMesh([0]), placements=[S0])
        check(x, np.arange(*args, **kw), [0], [S0])
        return True

    run(1, f)


# -- rand / randn ----------------------------------------------------------------------------
RANDOM = {"rand": dt.rand, "randn": dt.randn}


@functools.cache
def one_rank(kind: str, shape, seed: int, dtype=np.float64) -> np.ndarray:
    """What one process draws: the reference for every mesh and placement."""

    def f():
        x = RANDOM[kind](shape, dtype, seed=seed, mesh=dt.ProcessMesh([0]), placements=[R])
        return x.to_local()

    (out,) = dt.simulate(1, f)
    out.flags.writeable = False
    return out


@pytest.mark.parametrize("layout", [*LAYOUTS, ("2", [PMIN]), ("3", [PMIN])], ids=_id)
@pytest.mark.parametrize("kind", RANDOM)
def test_seeded_random_is_the_same_global_tensor_everywhere(kind, layout) -> None:
    mesh_name, placements = layout
    ids = MESHES[mesh_name]
    refs = {(s, d): one_rank(kind, s, 1234, d) for s in SHAPES for d in (np.float64, np.float32)}

    def f():
        mesh = dt.ProcessMesh(ids)
        for (shape, dtype), ref in refs.items():
            x = RANDOM[kind](shape, dtype, seed=1234, mesh=mesh, placements=placements)
            check(x, ref, ids, placements)
        return True

    run(_size(ids), f)


@pytest.mark.parametrize("ids", [MESHES["2"], MESHES["3"], MESHES["4"], MESHES["2x2"]])
def test_seeded_random_with_partial_avg(ids) -> None:
    # (x + x + x) / 3 need not round back to x, so Partial('avg') is equal to float tolerance.
    placements = [dt.Partial("avg")] * np.ndim(ids)
    ref = one_rank("randn", (7, 5), 3)

    def f():
        x = dt.randn((7, 5), seed=3, mesh=dt.ProcessMesh(ids), placements=placements)
        np.testing.assert_allclose(x.numpy(), ref, rtol=1e-15, atol=0)
        return True

    run(_size(ids), f)


def test_random_values() -> None:
    u = one_rank("rand", (50, 40), 7)
    assert u.dtype == np.float64 and u.min() >= 0 and u.max() < 1
    assert len(np.unique(u)) == u.size
    u32 = one_rank("rand", (50, 40), 7, np.float32)
    assert u32.dtype == np.float32 and u32.min() >= 0 and u32.max() < 1
    z = one_rank("randn", (50, 40), 7)
    assert abs(z.mean()) < 0.1 and 0.9 < z.std() < 1.1


@pytest.mark.parametrize("kind", RANDOM)
def test_different_seeds_differ(kind) -> None:
    a, b, c = (one_rank(kind, (6, 4), s) for s in (0, 1, 2**40))
    assert not np.array_equal(a, b) and not np.array_equal(a, c) and not np.array_equal(b, c)
    assert (a != b).mean() > 0.9
    assert not np.array_equal(one_rank("rand", (6, 4), 5), one_rank("randn", (6, 4), 5))


@pytest.mark.parametrize("ids", [MESHES["2"], MESHES["3"], MESHES["2x2"]])
def test_unseeded_calls_follow_manual_seed(ids) -> None:
    placements = [S0] + [S1] * (np.ndim(ids) - 1)

    def f():
        mesh = dt.ProcessMesh(ids)

        def draws(layout):
            return [
                dt.rand((5, 3), mesh=mesh, placements=layout).numpy(),
                dt.randn((5, 3), mesh=mesh, placements=layout).numpy(),
                dt.rand((5, 3), mesh=mesh, placements=layout).numpy(),
            ]

        dt.manual_seed(42)
        first = draws(placements)
        dt.manual_seed(42)
        again = draws([R] * mesh.ndim)  # the n-th call draws the same, whatever the layout
        dt.manual_seed(43)
        other = draws(placements)
        for a, b, c in zip(first, again, other):
            np.testing.assert_array_equal(a, b)
            assert not np.array_equal(a, c)
        assert not np.array_equal(first[0], first[2])  # each call takes a new stream
        seeded = dt.rand((5, 3), seed=42, mesh=mesh, placements=placements).numpy()
        assert not np.array_equal(first[0], seeded)
        return [a.tobytes() for a in first]

    results = dt.simulate(_size(ids), f)
    assert all(r == results[0] for r in results)  # every rank drew the same


def test_unseeded_calls_agree_across_ranks_without_manual_seed() -> None:
    def f():
        x = dt.rand((4, 4), mesh=dt.ProcessMesh([0, 1, 2]), placements=[R])
        return x.to_local().tobytes()

    results = dt.simulate(3, f)
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize("kind", RANDOM)
def test_random_dtype(kind) -> None:
    ref = one_rank(kind, (5, 3), 9, np.float32)

    def f():
        mesh = dt.ProcessMesh([0, 1])
        x = RANDOM[kind]((5, 3), np.float32, seed=9, mesh=mesh, placements=[S0])
        check(x, ref, [0, 1], [S0])
        for bad in (int, np.int32, np.float16, bool, np.complex128):
            with pytest.raises(TypeError, match=f"{kind}: dtype must be float32 or float64"):
                RANDOM[kind]((5, 3), bad, seed=9, mesh=mesh, placements=[S0])
        return True

    run(2, f)


# -- shard_tensor: the ranks agree on the values (Note [Replicas agree] in tensor.py) ----------
def _per_rank(shape, dtype, rank: int) -> np.ndarray:
    """The same array on every rank but one element on the last rank, in the first row: outside
    that rank's own shard wherever axis 0 is split, so cutting shards hides the difference."""
    g = np.arange(math.prod(shape)).reshape(shape).astype(dtype)
    if rank == dt.get_world_size() - 1:
        g.flat[0] = not g.flat[0] if dtype is bool else g.flat[0] + 1
    return g


AGREE_LAYOUTS = [("2", [R]), ("2", [S0]), ("3", [S1]), ("2x2", [S0, R]), ("2x2", [R, P])]


@pytest.mark.parametrize("dtype", [np.float64, np.int32, bool])
@pytest.mark.parametrize("layout", AGREE_LAYOUTS, ids=_id)
def test_shard_tensor_of_data_that_differs_by_rank_raises_on_every_rank(layout, dtype) -> None:
    """Regression (was: every rank kept a shard of its own data, a "replica" that differed by
    rank, with no error)."""
    ids, placements = MESHES[layout[0]], layout[1]

    def f():
        data = _per_rank((6, 4), dtype, dt.get_rank())
        with dt.CommCounter() as cc, pytest.raises(dt.RanksDiverged) as e:
            dt.shard_tensor(data, dt.ProcessMesh(ids), placements)
        assert "passed shard_tensor different values" in str(e.value)
        assert str(e.value).count("values crc32 0x") == _size(ids)  # each rank's checksum
        assert (cc.total, cc.checks) == (0, 1), "data moved, or a check more than the one"
        return True

    run(_size(ids), f)


@pytest.mark.parametrize("layout", AGREE_LAYOUTS, ids=_id)
def test_shard_tensor_of_equal_data_costs_one_check(layout) -> None:
    ids, placements = MESHES[layout[0]], layout[1]
    g = _per_rank((6, 4), np.float64, -1)

    def f():
        with dt.CommCounter() as cc:
            x = dt.shard_tensor(g.copy(), dt.ProcessMesh(ids), placements)
        assert (cc.total, cc.checks) == (0, 1)  # the values ride in the one agreement
        check(x, g, ids, placements)
        return True

    run(_size(ids), f)


def test_shard_tensor_check_false_keeps_each_ranks_data() -> None:
    """The documented opt-out for data known to agree: no values compared (so per-rank data
    is kept as passed), shape, dtype and placements still agreed."""

    def f():
        rank, mesh = dt.get_rank(), dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(np.full(3, float(rank)), mesh, [R], check=False)
        np.testing.assert_array_equal(x.to_local(), np.full(3, float(rank)))
        with pytest.raises(dt.RanksDiverged, match=r"rank 1: shard_tensor \(4,\)"):
            dt.shard_tensor(np.ones(3 + rank), mesh, [R], check=False)
        return True

    run(2, f)


@pytest.mark.parametrize("src", [0, 2])
@pytest.mark.parametrize("placements", [[R], [S0]], ids=str)
def test_shard_tensor_src_takes_one_ranks_data(src, placements) -> None:
    """PyTorch's default, asked for by name: rank ``src``'s data, whatever the others pass."""
    want = np.arange(12.0).reshape(4, 3) + 100 * src

    def f():
        rank = dt.get_rank()
        data = np.arange(12.0).reshape(4, 3) + 100 * rank if rank != 1 else None
        x = dt.shard_tensor(data, dt.ProcessMesh([0, 1, 2]), placements, src=src)
        check(x, want, [0, 1, 2], placements)
        return True

    run(3, f)


def test_shard_tensor_value_check_follows_the_agreement_switch() -> None:
    """DISTTENSOR_CHECK=0 (here agree.set_checks(False)) turns the values off with the rest of
    the agreement; check=True compares them even then."""

    def f():
        rank, mesh = dt.get_rank(), dt.ProcessMesh([0, 1])
        with dt.CommCounter() as cc:
            x = dt.shard_tensor(np.full(2, float(rank)), mesh, [S0])
        assert cc.checks == 0 and x.to_local().tolist() == [float(rank)]
        with pytest.raises(dt.RanksDiverged, match="values crc32"):
            dt.shard_tensor(np.full(2, float(rank)), mesh, [S0], check=True)
        return True

    before = agree.set_checks(on=False)
    try:
        run(2, f)
    finally:
        agree.set_checks(*before)


def test_shard_tensor_hashes_on_the_mesh_only(monkeypatch) -> None:
    """A 1-rank mesh compares nothing, and a rank outside the mesh hashes nothing: the pass
    over the data is paid only where a check is made."""
    from disttensor import tensor

    hashed: list[int] = []
    crc32 = tensor._crc32
    monkeypatch.setattr(tensor, "_crc32", lambda v: hashed.append(dt.get_rank()) or crc32(v))

    def f():
        dt.shard_tensor(np.ones(4), dt.ProcessMesh([dt.get_rank()]), [S0])
        dt.shard_tensor(np.ones(4), dt.ProcessMesh([0, 1]), [R])
        return True

    run(3, f)
    assert sorted(hashed) == [0, 1]
