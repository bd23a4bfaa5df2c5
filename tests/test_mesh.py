"""ProcessMesh: construction, lookups, sub-meshes, value semantics, and dt.init_mesh."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import disttensor as dt

GRID = [[0, 1], [2, 3]]


@pytest.fixture
def mesh() -> dt.ProcessMesh:
    return dt.ProcessMesh(GRID, dim_names=["dp", "mp"])


# -- construction ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ids", "shape", "process_ids"),
    [
        ([0], (1,), [0]),
        ([3, 1, 2], (3,), [3, 1, 2]),
        (GRID, (2, 2), [0, 1, 2, 3]),
        ([[0, 1, 2], [3, 4, 5]], (2, 3), [0, 1, 2, 3, 4, 5]),
        ([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], (2, 2, 2), list(range(8))),
        (np.arange(6).reshape(3, 2), (3, 2), list(range(6))),
        (np.array([[5, 4], [7, 6]], dtype=np.int32), (2, 2), [5, 4, 7, 6]),
        (np.arange(4, dtype=np.uint8), (4,), [0, 1, 2, 3]),
        ([np.int64(2), np.int64(0)], (2,), [2, 0]),
    ],
)
def test_construction(ids, shape, process_ids) -> None:
    mesh = dt.ProcessMesh(ids)
    assert mesh.shape == shape
    assert mesh.ndim == len(shape)
    assert mesh.size == len(process_ids)
    assert mesh.process_ids == process_ids
    assert all(type(r) is int for r in mesh.process_ids)
    assert mesh.dim_names == [f"d{i}" for i in range(len(shape))]
    np.testing.assert_array_equal(mesh.mesh, np.asarray(ids))


def test_named_dims(mesh) -> None:
    assert mesh.dim_names == ["dp", "mp"]
    assert mesh.get_dim_size("dp") == 2
    assert mesh.get_dim_size("mp") == 2
    m = dt.ProcessMesh(np.arange(6).reshape(2, 3), dim_names=("x", "y"))
    assert m.dim_names == ["x", "y"]
    assert [m.get_dim_size(d) for d in ("x", "y", 0, 1, -1, -2)] == [2, 3, 2, 3, 3, 2]


def test_copy_from_another_mesh(mesh) -> None:
    copy = dt.ProcessMesh(mesh, dim_names=["dp", "mp"])
    assert copy == mesh
    assert dt.ProcessMesh(mesh).dim_names == ["d0", "d1"]


def test_is_immutable(mesh) -> None:
    with pytest.raises(ValueError):
        mesh.mesh[0, 0] = 7
    names = mesh.dim_names
    names.append("zz")  # a copy: the mesh is unchanged
    assert mesh.dim_names == ["dp", "mp"]


def test_process_ids_cannot_be_changed_through_the_returned_list(mesh) -> None:
    mesh.process_ids.append(99)
    assert mesh.process_ids == [0, 1, 2, 3]
    assert repr(mesh) == repr(dt.ProcessMesh(GRID, dim_names=["dp", "mp"]))


def test_input_array_is_not_aliased() -> None:
    ids = np.array([0, 1, 2, 3])
    mesh = dt.ProcessMesh(ids)
    ids[0] = 9
    assert mesh.process_ids == [0, 1, 2, 3]


# -- lookups ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rank", "coord"), [(0, (0, 0)), (1, (0, 1)), (2, (1, 0)), (3, (1, 1)), (4, None), (-1, None)]
)
def test_get_coord(mesh, rank, coord) -> None:
    assert mesh.get_coord(rank) == coord
    assert (rank in mesh) == (coord is not None)


def test_get_coord_permuted() -> None:
    mesh = dt.ProcessMesh([[7, 2, 5], [0, 3, 9]])
    for coord, rank in np.ndenumerate(mesh.mesh):
        assert mesh.get_coord(int(rank)) == coord


@pytest.mark.parametrize(
    ("dim", "rank", "ranks"),
    [
        ("mp", 0, (0, 1)),
        ("mp", 3, (2, 3)),
        ("dp", 1, (1, 3)),
        ("dp", 2, (0, 2)),
        (1, 2, (2, 3)),
        (0, 3, (1, 3)),
        (-1, 1, (0, 1)),
    ],
)
def test_group_ranks(mesh, dim, rank, ranks) -> None:
    assert mesh.group_ranks(dim, rank) == ranks


def test_group_ranks_3d() -> None:
    mesh = dt.ProcessMesh(np.arange(24).reshape(2, 3, 4), dim_names=["a", "b", "c"])
    assert mesh.group_ranks("a", 17) == (5, 17)
    assert mesh.group_ranks("b", 17) == (13, 17, 21)
    assert mesh.group_ranks("c", 17) == (16, 17, 18, 19)


# -- sub-meshes: mesh[dim] holds the calling rank ------------------------------------------------
def _submeshes():
    mesh = dt.ProcessMesh(GRID, dim_names=["dp", "mp"])
    return mesh["dp"], mesh["mp"], mesh[0], mesh[-1]


def test_getitem_is_the_submesh_of_the_calling_rank() -> None:
    results = dt.simulate(4, _submeshes)
    rows = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    cols = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    for rank, (dp, mp, by_index0, by_index_last) in enumerate(results):
        assert dp == dt.ProcessMesh(cols[rank], dim_names=["dp"])
        assert mp == dt.ProcessMesh(rows[rank], dim_names=["mp"])
        assert (dp.ndim, dp.shape, mp.shape) == (1, (2,), (2,))
        assert by_index0 == dp
        assert by_index_last == mp
        assert rank in dp and rank in mp


def test_getitem_3d() -> None:
    def f():
        mesh = dt.ProcessMesh(np.arange(8).reshape(2, 2, 2), dim_names=["a", "b", "c"])
        return mesh["a"].process_ids, mesh["b"].process_ids, mesh["c"].process_ids

    results = dt.simulate(8, f)
    assert results[5] == ([1, 5], [5, 7], [4, 5])
    assert results[0] == ([0, 4], [0, 2], [0, 1])


def test_get_submesh_of_another_rank(mesh) -> None:
    assert mesh.get_submesh("mp", rank=3) == dt.ProcessMesh([2, 3], dim_names=["mp"])


# -- value semantics -------------------------------------------------------------------------
def test_equal_and_hash_by_value(mesh) -> None:
    same = [
        dt.ProcessMesh([[0, 1], [2, 3]], dim_names=["dp", "mp"]),
        dt.ProcessMesh(np.arange(4).reshape(2, 2), dim_names=("dp", "mp")),
        dt.ProcessMesh(np.array(GRID, dtype=np.int16), dim_names=["dp", "mp"]),
        pickle.loads(pickle.dumps(mesh)),
    ]
    for other in same:
        assert other == mesh
        assert (other != mesh) is False
        assert hash(other) == hash(mesh)
    assert len({mesh, *same}) == 1
    assert {mesh: "v"}[same[0]] == "v"


@pytest.mark.parametrize(
    "other",
    [
        dt.ProcessMesh(GRID, dim_names=["dp", "tp"]),  # another name
        dt.ProcessMesh(GRID, dim_names=["mp", "dp"]),  # names swapped
        dt.ProcessMesh(GRID),  # default names
        dt.ProcessMesh([[1, 0], [2, 3]], dim_names=["dp", "mp"]),  # another order
        dt.ProcessMesh([[0, 2], [1, 3]], dim_names=["dp", "mp"]),  # transposed
        dt.ProcessMesh([[0, 1, 2, 3]], dim_names=["dp", "mp"]),  # another shape
        dt.ProcessMesh([[0, 1], [2, 4]], dim_names=["dp", "mp"]),  # another rank
    ],
)
def test_not_equal(mesh, other) -> None:
    assert mesh != other
    assert (mesh == other) is False


def test_not_equal_to_other_types(mesh) -> None:
    assert mesh != [[0, 1], [2, 3]]
    assert mesh != "mesh"
    assert dt.ProcessMesh([0, 1]) != dt.ProcessMesh([[0, 1]])


def test_repr(mesh) -> None:
    text = "ProcessMesh(shape=(2, 2), process_ids=[0, 1, 2, 3], dim_names=['dp', 'mp'])"
    assert repr(mesh) == text
    assert str(mesh) == text
    assert repr(dt.ProcessMesh([3])) == "ProcessMesh(shape=(1,), process_ids=[3], dim_names=['d0'])"


def test_pickle_round_trip(mesh) -> None:
    for m in (mesh, dt.ProcessMesh([[[0], [1]], [[2], [3]]]), dt.ProcessMesh([5])):
        back = pickle.loads(pickle.dumps(m))
        assert back == m and hash(back) == hash(m)
        assert repr(back) == repr(m)
        assert back.get_coord(m.process_ids[-1]) == m.get_coord(m.process_ids[-1])
        assert not back.mesh.flags.writeable


# -- init_mesh -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("world", "shape", "names", "expected"),
    [
        (1, (1,), None, dt.ProcessMesh([0])),
        (3, 3, None, dt.ProcessMesh([0, 1, 2])),
        (4, (4,), ["x"], dt.ProcessMesh([0, 1, 2, 3], dim_names=["x"])),
        (4, (2, 2), ["dp", "mp"], dt.ProcessMesh(GRID, dim_names=["dp", "mp"])),
        (4, [1, 4], None, dt.ProcessMesh([[0, 1, 2, 3]])),
        (6, (3, 2), ["a", "b"], dt.ProcessMesh([[0, 1], [2, 3], [4, 5]], dim_names=["a", "b"])),
    ],
)
def test_init_mesh(world, shape, names, expected) -> None:
    results = dt.simulate(world, dt.init_mesh, shape, names)
    assert results == [expected] * world


@pytest.mark.parametrize(("world", "shape"), [(3, (2, 2)), (4, (2,)), (2, 3), (4, (2, 2, 2))])
def test_init_mesh_needs_the_world_size(world, shape) -> None:
    def f():
        with pytest.raises(ValueError, match=rf"needs \d+ ranks but the world has {world}"):
            dt.init_mesh(shape)
        return True

    assert dt.simulate(world, f) == [True] * world
