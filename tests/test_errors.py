"""Bad input raises a clear exception that names the problem, on every rank, and never hangs."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

import disttensor as dt

S0, R = dt.Shard(0), dt.Replicate()


def on_every_rank(n: int, fn, *args, timeout: float = 10) -> None:
    """Run ``fn`` on ``n`` simulated ranks; each must return True (it checks its own error)."""
    assert dt.simulate(n, fn, *args, timeout=timeout) == [True] * n


# -- ProcessMesh -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ids", "names", "exc", "match"),
    [
        ([0, 1, 1], None, ValueError, r"ranks must be distinct; repeated: \[1\]"),
        ([[0, 2], [2, 0]], None, ValueError, r"repeated: \[0, 2\]"),
        ([0, -1], None, ValueError, r"ranks must be >= 0, got \[0, -1\]"),
        ([[-3]], None, ValueError, r"ranks must be >= 0"),
        ([0.0, 1.0], None, TypeError, "ranks must be integers, got float64"),
        ([0, 1.5], None, TypeError, "ranks must be integers"),
        (["0", "1"], None, TypeError, "ranks must be integers"),
        ([True, False], None, TypeError, "ranks must be integers, got bool"),
        ([[0, 1], [2]], None, ValueError, "rectangular nested list of ranks"),
        ([[0, 1], 2], None, ValueError, "rectangular nested list of ranks"),
        ([], None, ValueError, "at least one rank"),
        ([[]], None, ValueError, "at least one rank"),
        (0, None, ValueError, "at least one rank"),
        ([0, 1], ["a", "b"], ValueError, r"dim_names must be 1 strings .* got \['a', 'b'\]"),
        ([[0, 1]], ["a"], ValueError, r"dim_names must be 2 strings \(one per mesh dim of shape"),
        ([[0, 1]], [], ValueError, "dim_names must be 2 strings"),
        ([[0, 1]], ["a", "a"], ValueError, r"dim_names must be distinct, got \['a', 'a'\]"),
        ([0, 1], [0], ValueError, "dim_names must be 1 strings"),
    ],
)
def test_bad_mesh(ids, names, exc, match) -> None:
    with pytest.raises(exc, match=match):
        dt.ProcessMesh(ids, dim_names=names)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda m: m.get_dim_size("xx"), ValueError, r"'xx' is not in this mesh's dim_names \["),
        (lambda m: m.group_ranks("tp", 0), ValueError, "'tp' is not in"),
        (lambda m: m.get_dim_size(2), IndexError, "mesh dim 2 is out of range for a 2-D mesh"),
        (lambda m: m.get_dim_size(-3), IndexError, "out of range for a 2-D mesh"),
        (lambda m: m.get_dim_size(0.5), TypeError, "a mesh dim is a name or an int, got 0.5"),
        (lambda m: m.get_dim_size(None), TypeError, "a mesh dim is a name or an int"),
        (lambda m: m.group_ranks("mp", 9), ValueError, "rank 9 is not in ProcessMesh"),
        (lambda m: m.get_submesh("mp", rank=9), ValueError, "rank 9 is not in"),
    ],
)
def test_bad_mesh_lookup(call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call(dt.ProcessMesh([[0, 1], [2, 3]], dim_names=["dp", "mp"]))


def test_submesh_of_a_mesh_without_the_calling_rank() -> None:
    def f():
        with pytest.raises(ValueError, match=f"rank {dt.get_rank()} is not in"):
            dt.ProcessMesh([[5, 6], [7, 8]])["d0"]
        return True

    on_every_rank(2, f)


# -- placements ------------------------------------------------------------------------------
def test_bad_placement_values() -> None:
    with pytest.raises(ValueError, match=r"Partial\(reduce_type='mean'\) is not supported"):
        dt.Partial("mean")
    with pytest.raises(TypeError, match=r"Shard\(dim\) needs an int tensor axis, got 'a'"):
        dt.Shard("a")


MESH1 = [0, 1]
MESH2 = [[0, 1], [2, 3]]
BAD_PLACEMENTS = [
    # (mesh ids, tensor shape, placements, exception, message)
    (MESH1, (4, 4), [S0, R], ValueError, "placements has 2 entries but the mesh has 1 dims"),
    (MESH1, (4, 4), [], ValueError, "placements has 0 entries but the mesh has 1 dims"),
    (MESH2, (4, 4), [S0], ValueError, r"placements has 1 entries but the mesh has 2 dims"),
    (MESH2, (4, 4), [R, R, R], ValueError, "give one placement per mesh dim"),
    (MESH1, (4, 4), [dt.Shard(2)], ValueError, r"Shard\(dim=2\) is out of range .* 2 axes"),
    (MESH1, (4, 4), [dt.Shard(-3)], ValueError, r"Shard\(dim=-3\) is out of range"),
    (MESH1, (), [S0], ValueError, "out of range for a tensor with 0 axes"),
    (MESH2, (4,), [R, dt.Shard(1)], ValueError, r"placements\[1\] = Shard\(dim=1\) is out of"),
    (MESH1, (4,), S0, TypeError, "placements must be a list with one Placement per mesh dim"),
    (MESH1, (4,), "S0", TypeError, "placements must be a list"),
    (MESH1, (4,), {0: S0}, TypeError, "placements must be a list"),
    (MESH1, (4,), [0], TypeError, r"placements\[0\] is 0; use dt.Shard\(dim\)"),
    (MESH2, (4,), [R, "R"], TypeError, r"placements\[1\] is 'R'"),
    (MESH1, (4,), [dt.Partial("avg")], TypeError, "Partial.*'avg'.* needs a floating"),
]


@pytest.mark.parametrize(("ids", "shape", "placements", "exc", "match"), BAD_PLACEMENTS)
@pytest.mark.parametrize("entry", ["shard_tensor", "zeros", "reshard", "from_local"])
def test_bad_placements(entry, ids, shape, placements, exc, match) -> None:
    data = np.ones(shape, dtype=np.int64)  # int: Partial('avg') must be refused

    def f():
        mesh = dt.ProcessMesh(ids)
        with pytest.raises(exc, match=match):
            if entry == "shard_tensor":
                dt.shard_tensor(data, mesh, placements)
            elif entry == "zeros":
                dt.zeros(shape, dtype=np.int64, mesh=mesh, placements=placements)
            elif entry == "reshard":
                x = dt.shard_tensor(data, mesh, [R] * mesh.ndim)
                dt.reshard(x, mesh, placements)
            else:
                dt.dtensor_from_local(data, mesh, placements, global_shape=shape)
        return True

    on_every_rank(int(np.size(ids)), f)


def test_partial_avg_needs_a_float_dtype() -> None:
    def f():
        mesh = dt.ProcessMesh([0, 1])
        for dtype in (np.int32, np.int64, np.bool_, np.uint8):
            with pytest.raises(
                TypeError, match=f"needs a floating or complex dtype, got {dtype.__name__}"
            ):
                dt.ones((4,), dtype=dtype, mesh=mesh, placements=[dt.Partial("avg")])
        for dtype in (np.float32, np.float64, np.complex128):  # fine
            dt.ones((4,), dtype=dtype, mesh=mesh, placements=[dt.Partial("avg")])
        return True

    on_every_rank(2, f)


# -- wrong types -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (
            lambda m: dt.shard_tensor(np.ones(4), "mesh", [R]),
            TypeError,
            "shard_tensor: mesh must be a dt.ProcessMesh, got str",
        ),
        (
            lambda m: dt.shard_tensor(np.ones(4), [0, 1], [R]),
            TypeError,
            "mesh must be a dt.ProcessMesh, got list",
        ),
        (lambda m: dt.shard_tensor(np.ones(4), m, S0), TypeError, "placements must be a list"),
        (
            lambda m: dt.shard_tensor({"a": 1}, m, [R]),
            TypeError,
            "shard_tensor needs numeric data, got an object array",
        ),
        (
            lambda m: dt.reshard(np.ones(4), m, [R]),
            TypeError,
            "reshard needs a DistTensor, got ndarray; use dt.shard_tensor",
        ),
        (lambda m: dt.reshard([1, 2], m, [R]), TypeError, "reshard needs a DistTensor, got list"),
        (
            lambda m: dt.dtensor_from_local(np.ones(2), "mesh", [R]),
            TypeError,
            "dtensor_from_local: mesh must be a dt.ProcessMesh",
        ),
        (lambda m: dt.zeros((2,), mesh="m"), TypeError, "zeros: mesh must be a dt.ProcessMesh"),
        (
            lambda m: dt.zeros(None, mesh=m),
            TypeError,
            "zeros: shape must be an int or a sequence of ints, got None",
        ),
        (lambda m: dt.ones((-1, 2), mesh=m), ValueError, "negative dimensions are not allowed"),
        (lambda m: dt.rand((2,), dtype=int, mesh=m), TypeError, "rand: dtype must be float32"),
        (lambda m: dt.randn((2,), dtype=np.float16, mesh=m), TypeError, "randn: dtype must be"),
        (lambda m: dt.arange(0, 4, 0, mesh=m), ValueError, "arange: step must not be zero"),
    ],
)
def test_wrong_types(call, exc, match) -> None:
    def f():
        with pytest.raises(exc, match=match):
            call(dt.ProcessMesh([0, 1]))
        return True

    on_every_rank(2, f)


def test_float_shape_is_refused() -> None:
    # np.zeros((2.5, 3)) raises TypeError; dt.zeros silently makes a (2, 3) tensor.
    def f():
        with pytest.raises(TypeError, match="shape"):
            dt.zeros((2.5, 3), mesh=dt.ProcessMesh([0, 1]))
        return True

    on_every_rank(2, f)


# -- meshes that name ranks outside the world ------------------------------------------------
@pytest.mark.parametrize(
    ("world", "ids", "bad"),
    [(2, [0, 1, 2, 3, 4], "[2, 3, 4]"), (2, [[0, 5], [1, 2]], "[5, 2]"), (3, [3], "[3]")],
)
@pytest.mark.parametrize("entry", ["shard_tensor", "reshard", "zeros", "rand", "from_local"])
def test_mesh_with_ranks_outside_the_world(world, ids, bad, entry) -> None:
    def f():
        big = dt.ProcessMesh(ids)
        placements = [R] * big.ndim
        name = "dtensor_from_local" if entry == "from_local" else entry
        match = f"{name}: the mesh has ranks {re.escape(bad)} but the world has only {world} "
        with pytest.raises(ValueError, match=match):
            if entry == "shard_tensor":
                dt.shard_tensor(np.ones(4), big, placements)
            elif entry == "reshard":
                x = dt.shard_tensor(np.ones(4), dt.init_mesh(world), [S0])
                dt.reshard(x, big, placements)
            elif entry == "zeros":
                dt.zeros((4,), mesh=big, placements=placements)
            elif entry == "rand":
                dt.rand((4,), seed=0, mesh=big, placements=placements)
            else:
                dt.dtensor_from_local(np.ones(4), big, placements)
        return True

    on_every_rank(world, f)


# -- dtensor_from_local: shards that cannot form a global tensor -----------------------------------
def _local_from(table, exc=ValueError):
    """A function for dt.simulate passing ``table[rank] = (shape, dtype)``; each rank must raise."""

    def f(ids, placements, match):
        shape, dtype = table[dt.get_rank()]
        with pytest.raises(exc, match=match):
            dt.dtensor_from_local(np.zeros(shape, dtype), dt.ProcessMesh(ids), placements)
        return True

    return f


CANNOT_FORM = [
    # (per-rank (shape, dtype), mesh ids, placements, message)
    (
        [((3, 2), "f8"), ((1, 2), "f8")],
        [0, 1],
        [S0],
        r"global shape \(4, 2\) needs rank 0 to hold \(2, 2\), it has \(3, 2\); "
        r"rank 1 to hold \(2, 2\), it has \(1, 2\)",
    ),
    (  # array_split puts the longer shards first
        [((2, 3), "f8"), ((3, 3), "f8")],
        [0, 1],
        [S0],
        "cannot form a global tensor",
    ),
    ([((2, 3), "f8"), ((3, 3), "f8"), ((2, 3), "f8")], [0, 1, 2], [S0], "numpy.array_split"),
    (  # a dim that is not sharded must agree
        [((2, 3), "f8"), ((2, 4), "f8")],
        [0, 1],
        [S0],
        r"rank 1 to hold \(2, 3\), it has \(2, 4\)",
    ),
    ([((2, 3), "f8"), ((2, 4), "f8")], [0, 1], [R], r"rank 1 to hold \(2, 3\)"),
    ([((2, 3), "f8"), ((2, 4), "f8")], [0, 1], [dt.Partial()], "cannot form a global tensor"),
    (
        [((2, 2), "f8"), ((2, 2), "f4")],
        [0, 1],
        [S0],
        "different ndim or dtype: rank 0: \\(2, 2\\) float64, rank 1: \\(2, 2\\) float32",
    ),
    ([((2, 2), "i8"), ((2, 2), "f8"), ((2, 2), "i8")], [0, 1, 2], [R], "different ndim or dtype"),
    ([((2, 2), "f8"), ((2,), "f8")], [0, 1], [S0], "different ndim or dtype"),
    ([((2, 2), "f8"), ((2, 2, 1), "f8")], [0, 1], [R], "different ndim"),
    (  # 2x2 mesh: the column of mesh dim 0 must agree along axis 1
        [((2, 2), "f8"), ((2, 2), "f8"), ((2, 3), "f8"), ((2, 2), "f8")],
        [[0, 1], [2, 3]],
        [S0, S0],
        r"rank 2 to hold",
    ),
    (
        [((1, 2), "f8"), ((2, 2), "f8"), ((2, 2), "f8"), ((2, 2), "f8")],
        [[0, 1], [2, 3]],
        [S0, dt.Shard(1)],
        "cannot form a global tensor",
    ),
    (
        [((2, 2), "f8"), ((2, 2), "f8"), ((2, 2), "f8"), ((2, 1), "f8")],
        [[0, 1], [2, 3]],
        [R, dt.Shard(1)],
        r"rank 3 to hold \(2, 2\), it has \(2, 1\)",
    ),
]


@pytest.mark.parametrize(("table", "ids", "placements", "match"), CANNOT_FORM)
def test_shards_that_cannot_form_a_global_tensor(table, ids, placements, match) -> None:
    on_every_rank(len(table), _local_from(table), ids, placements, match)


@pytest.mark.parametrize(
    ("table", "placements", "match"),
    [  # rank 0's shard is fine alone; rank 1's alone breaks the placements
        ([((2, 2), "f8"), ((2,), "f8")], [dt.Shard(1)], "out of range|different ndim"),
        ([((2, 2), "f8"), ((2, 2), "i8")], [dt.Partial("avg")], "avg|different ndim or dtype"),
    ],
)
def test_locally_invalid_shard_raises_on_every_rank(table, placements, match) -> None:
    f = _local_from(table, (ValueError, TypeError))
    on_every_rank(2, f, [0, 1], placements, match, timeout=1)


@pytest.mark.parametrize(
    ("global_shape", "placements", "shapes", "wrong"),
    [
        ((5,), [S0], [(2,), (2,)], 0),  # rank 0 must hold 3
        ((4, 3), [dt.Shard(1)], [(4, 2), (4, 2)], 1),  # rank 1 must hold 1 column
        ((4,), [R], [(4,), (3,)], 1),
        ((4,), [S0], [(2, 1), (2,)], 0),  # wrong ndim
        ((0, 2), [S0], [(0, 2), (1, 2)], 1),
    ],
)
def test_wrong_local_shape_for_a_given_global_shape(global_shape, placements, shapes, wrong):
    """The ranks agree on the global shape and on whether their shards fit it (Note [Replicas
    agree] in tensor.py), so every rank raises, naming the rank whose shard is wrong."""

    def f():
        rank, mesh = dt.get_rank(), dt.ProcessMesh([0, 1])
        local = np.zeros(shapes[rank])
        bad = (
            re.escape(f"rank {wrong}: dtensor_from_local {global_shape}")
            + ".*"
            + re.escape(f"local shape {shapes[wrong]} where")
        )
        with pytest.raises(dt.RanksDiverged, match=bad):
            dt.dtensor_from_local(local, mesh, placements, global_shape)
        return True

    on_every_rank(2, f)


def test_wrong_local_shape_unchecked_raises_on_that_rank():
    """With the agreement check off (DISTTENSOR_CHECK=0) only the rank whose shard is wrong
    can know: it raises numpy-style, the others build their tensor."""
    from disttensor.comm import agree

    def f():
        rank, mesh = dt.get_rank(), dt.ProcessMesh([0, 1])
        if rank == 0:
            return dt.dtensor_from_local(np.zeros(2), mesh, [S0], (4,)).local_shape == (2,)
        with pytest.raises(ValueError, match=re.escape("rank 1 passed a local shape (3,)")):
            dt.dtensor_from_local(np.zeros(3), mesh, [S0], (4,))
        return True

    before = agree.set_checks(False)
    try:
        on_every_rank(2, f)
    finally:
        agree.set_checks(*before)


def test_from_local_outside_the_mesh_needs_global_shape() -> None:
    def f():
        mesh = dt.ProcessMesh([0])
        if dt.get_rank() == 1:
            with pytest.raises(ValueError, match=r"rank 1 is not in the mesh .* pass global_shape"):
                dt.dtensor_from_local(np.ones(2), mesh, [R])
            x = dt.dtensor_from_local(np.ones(2), mesh, [R], global_shape=(2,))
            return x.local_shape == (0,)
        return dt.dtensor_from_local(np.ones(2), mesh, [R]).shape == (2,)

    on_every_rank(2, f)


# -- no answer, or no one answer: numpy's error, RanksDiverged ------------------------------------
NO_IDENTITY = [
    (lambda x: x.max(), "zero-size array to reduction operation maximum which has no identity"),
    (
        lambda x: np.min(x, axis=0),
        "zero-size array to reduction operation minimum which has no identity",
    ),
    (lambda x: x.argmax(axis=0), "attempt to get argmax of an empty sequence"),
    (lambda x: np.argmin(x), "attempt to get argmin of an empty sequence"),
]


def test_max_of_an_empty_split_axis_raises_on_every_rank_before_any_collective() -> None:
    """Regression (was: -inf from max, +inf from min). A rank outside the tensor's mesh knows
    the global shape too, and raises the same; the ranks are in step afterwards."""

    def f():
        x = dt.shard_tensor(np.empty((0, 3)), dt.ProcessMesh([0, 1]), [S0])
        for call, text in NO_IDENTITY:
            with dt.CommCounter() as cc, pytest.raises(ValueError) as e:
                call(x)
            assert str(e.value) == text and (cc.total, cc.checks) == (0, 0)
        return float(dt.shard_tensor(np.arange(3.0), dt.ProcessMesh([0, 1, 2]), [S0]).sum()) == 3

    on_every_rank(3, f)


def test_shard_tensor_of_per_rank_data_raises_on_every_rank() -> None:
    """An unseeded draw passed to shard_tensor: RanksDiverged on every rank of the mesh, none on
    the rank outside it (it holds no shard), no data moved; the ranks are in step afterwards."""

    def f():
        rank, mesh = dt.get_rank(), dt.ProcessMesh([0, 1])
        draw = np.random.default_rng().random(4)
        with dt.CommCounter() as cc:
            if rank < 2:
                with pytest.raises(dt.RanksDiverged, match="passed shard_tensor different values"):
                    dt.shard_tensor(draw, mesh, [R])
            else:
                dt.shard_tensor(draw, mesh, [R])
        assert cc.total == 0
        return float(dt.shard_tensor(np.arange(3.0), dt.ProcessMesh([0, 1, 2]), [S0]).sum()) == 3

    on_every_rank(3, f)


# -- SPMD programs that go wrong end, and say why -------------------------------------------
def test_a_skipped_collective_times_out_naming_it() -> None:
    def f():
        x = dt.shard_tensor(np.arange(6.0), dt.ProcessMesh([0, 1]), [S0])
        if dt.get_rank() == 0:
            x.numpy()  # rank 1 never joins the all-gather

    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"all_gather on ranks \[0, 1\] waited more than 2 s"):
        dt.simulate(2, f, timeout=2)
    assert time.monotonic() - start < 30


def test_a_skipped_barrier_times_out() -> None:
    def f():
        if dt.get_rank() != 2:
            dt.barrier()

    with pytest.raises(TimeoutError, match=r"barrier .* some rank did not reach it"):
        dt.simulate(3, f, timeout=1)


def test_an_exception_on_one_rank_is_reraised() -> None:
    class Boom(Exception):
        pass

    def f():
        if dt.get_rank() == 1:
            raise Boom("boom on rank 1")
        dt.barrier()  # the other ranks are stopped here, not left waiting
        return "unreachable"

    start = time.monotonic()
    with pytest.raises(Boom, match="boom on rank 1") as info:
        dt.simulate(3, f, timeout=30)
    assert time.monotonic() - start < 10
    assert "(raised on simulated rank 1 of 3)" in getattr(info.value, "__notes__", [])


def test_simulate_arguments() -> None:
    with pytest.raises(ValueError, match="simulate needs a world_size >= 1, got 0"):
        dt.simulate(0, dt.get_rank)

    def nested():
        dt.simulate(2, dt.get_rank)

    with pytest.raises(RuntimeError, match="cannot be nested"):
        dt.simulate(1, nested)
