"""Integer-array and boolean keys without gathering x (Note [Gathers by index] in
disttensor/ops/indexing.py): numpy's values, the splits kept, gradients that accumulate
repeated indices, and at most the requested items moved, point to point."""

from __future__ import annotations

import numpy as np
import pytest
from op_cases import MESH_SHAPES, PSUM, assert_close, every_rank, make_input, mesh_of

import disttensor as dt

R = dt.Replicate()
N, D = 11, 6  # uneven over every mesh
G = np.random.default_rng(4).normal(size=(N, D))
KEYS = {  # of x's global value g (several sizes: SIZES)
    "rows": lambda g: np.array([3 % len(g), 0, -1, 3 % len(g), -len(g)]),  # repeated, < 0
    "rows 2-D": lambda g: np.array([[1, 2], [-2, -2], [0, 5]]) % len(g),
    "list": lambda g: [1 % len(g), len(g) - 1],
    "pick": lambda g: (np.arange(len(g)), np.arange(len(g)) % g.shape[1]),  # every row
    "mask": lambda g: g[:, 0] > 0,
    "mask 2-D": lambda g: g > 0,
    "none": lambda g: np.array([], dtype=np.int64),
    "rows, all columns": lambda g: (np.array([2, -3]) % len(g), slice(None)),
}
# Shapes (rows, columns) per mesh: the owner of an index (indexing._owner_coordinate) is
# numpy.array_split's arithmetic, and each mesh's shapes make every step of it matter: one
# long part before several short ones (the short parts' divisor), several long parts (the
# long parts' divisor), even splits, fewer items than parts (empty shards). Nested splits on
# (2, 2) ([Shard(0), Shard(0)], [Shard(1), Shard(1)]): the inner split takes each outer
# part's start and length, and whether a length one off moves an owner depends on its
# parity, so the sizes take both: 13 -> 7, 6 -> 4, 3, 3, 3 (a remainder on every level),
# 8 -> 4, 4 -> 2, 2, 2, 2 (none), 9 -> 5, 4 -> 3, 2, 2, 2, 6 -> 3, 3 -> 2, 1, 2, 1 and
# 3 -> 2, 1 -> 1, 1, 1, 0. One size for all (11 rows) let an off-by-one owner pass on (2, 2).
SIZES = {
    (1,): [(N, D), (2, 3)],
    (2,): [(N, D), (4, 5), (1, 3)],
    (3,): [(N, D), (7, 5), (9, 3), (2, 4)],
    (4,): [(N, D), (6, 7), (10, 5), (3, 2)],
    (2, 2): [(13, 9), (8, 5), (9, 6), (6, 13), (3, 8), (N, D)],
}


def _layouts(mesh):
    n = mesh.ndim
    rest = [R] * (n - 1)
    out = [[dt.Shard(0), *rest], [dt.Shard(1), *rest], [R] * n, [PSUM, *rest]]
    if n == 2:
        out += [[dt.Shard(0), dt.Shard(1)], [dt.Shard(0), dt.Shard(0)], [dt.Shard(1), PSUM]]
        out += [[dt.Shard(1), dt.Shard(1)]]
    return out


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_values_layouts_and_gradients(mesh_shape):
    grids = [np.random.default_rng(n).normal(size=(n, d)) for n, d in SIZES[mesh_shape]]

    def body():
        mesh = mesh_of(mesh_shape)
        out = []
        for g in grids:
            for pl in _layouts(mesh):
                for label, make in KEYS.items():
                    x = make_input(g, mesh, pl)
                    x.requires_grad = True
                    with dt.CommCounter() as cc:
                        y = x[make(g)]
                    cot = np.arange(1.0, y.size + 1).reshape(y.shape)
                    (y * cot).sum().backward()
                    out.append(
                        (label, str(pl), y.numpy(), y.placements, cc.fallbacks, x.grad.numpy())
                    )
        return out

    results = every_rank(dt.simulate(mesh_of(mesh_shape).size, body))
    per_grid = len(results) // len(grids)
    for i, (label, pl, got, placements, fallbacks, grad) in enumerate(results):
        g = grids[i // per_grid]
        key = KEYS[label](g)
        want = g[key]
        what = f"{label} {pl} {g.shape}"
        assert_close(got, want, what)
        assert fallbacks == {}, (what, fallbacks)
        assert len(placements) == len(mesh_shape)
        cot = np.arange(1.0, want.size + 1).reshape(want.shape)
        want_grad = np.zeros_like(g)
        np.add.at(want_grad, key, cot)  # repeated indices accumulate
        assert_close(grad, want_grad, f"gradient of {what}")


@pytest.mark.parametrize("k", [2, 3, 4])
def test_row_lookup_moves_at_most_the_requested_rows(k):
    """A vocabulary-split table (Shard(0)) looked up by token ids: each rank receives at most
    its own rows of the result, each sender sends each requested row at most once; no
    collective, no fallback."""
    table = np.random.default_rng(5).normal(size=(50, 8))
    ids = np.random.default_rng(6).integers(0, 50, size=(4, 7))

    def body():
        mesh = dt.init_mesh((k,))
        w = dt.shard_tensor(table, mesh, [dt.Shard(0)])
        with dt.CommCounter() as cc:
            y = w[ids]
        return cc.counts, cc.bytes.get("send", 0), cc.fallbacks, y.placements, y.numpy()

    for counts, sent, fallbacks, placements, value in dt.simulate(k, body):
        assert set(counts) <= {"send"} and fallbacks == {}, (counts, fallbacks)
        assert sent <= ids.size * 8 * 8  # never more than the requested rows
        assert placements == [dt.Shard(0)]
        assert_close(value, table[ids], "lookup")


def test_pick_aligned_with_the_split_moves_nothing():
    """``probs[np.arange(N), y]`` with probs split by rows: every pick is local."""

    def body():
        mesh = dt.init_mesh((3,))
        probs = dt.shard_tensor(G, mesh, [dt.Shard(0)])
        y = dt.shard_tensor(np.arange(N) % D, mesh, [dt.Shard(0)])
        with dt.CommCounter() as cc:
            picked = probs[np.arange(N), y]
        return cc.counts, picked.placements, picked.numpy()

    for counts, placements, value in dt.simulate(3, body):
        # y (a DistTensor index) is gathered: its bytes only; the picks themselves are local
        assert set(counts) <= {"all_gather"}, counts
        assert placements == [dt.Shard(0)]
        assert_close(value, G[np.arange(N), np.arange(N) % D], "pick")


def test_bad_indices_raise_as_numpy_on_every_rank():
    def body():
        mesh = dt.init_mesh((2,))
        x = dt.shard_tensor(G, mesh, [dt.Shard(0)])
        with pytest.raises(IndexError, match="out of bounds"):
            x[np.array([0, N])]
        with pytest.raises(IndexError, match="boolean index"):
            x[np.ones(N + 1, bool)]
        return True

    assert all(dt.simulate(2, body))


# -- Note [Lookups in unsplit tensors] -------------------------------------------------------------
GI = np.round(8 * G)  # integer-valued: Partial splits sum exactly, alike on every replica
UNSPLIT_KEYS = {
    "columns by array": lambda: (slice(None), np.array([4, 0, 4, -1])),
    "rows and columns": lambda: (np.array([1, 3, 3]), np.array([0, 5, 2])),
    "mask among slices": lambda: (slice(2, 9), GI[0] > 0),
    "rows reversed": lambda: (np.array([[-1, 0], [2, 2]]), slice(None, None, -1)),
    "mask 2-D": lambda: GI > 0,
    "none": lambda: (slice(None), np.array([], dtype=np.int64)),
}


def _unsplit_layouts(mesh):
    n = mesh.ndim
    out = [[R] * n, [PSUM, *[R] * (n - 1)], [dt.Partial("max"), *[R] * (n - 1)]]
    if mesh.size == 1:
        out.append([dt.Shard(1)] * n)  # a split over one rank is no split
    if n == 2:
        out += [[R, PSUM], [PSUM, PSUM]]
    return out


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_unsplit_tensors_index_locally(mesh_shape):
    """No mesh dim splits x: every numpy key (arrays after slices, masks among slices) is
    numpy's indexing of the local value, with no communication; Partials stay Partial, the
    gradient adds into zeros of x's layout."""

    def body():
        mesh = mesh_of(mesh_shape)
        out = []
        for pl in _unsplit_layouts(mesh):
            for label, make in UNSPLIT_KEYS.items():
                x = make_input(GI, mesh, pl)
                grads = not any(p.is_partial() and p.reduce_type == "max" for p in pl)
                x.requires_grad = grads
                with dt.CommCounter() as cc:
                    y = x[make()]
                grad = None
                if grads:
                    (y * np.arange(1.0, y.size + 1).reshape(y.shape)).sum().backward()
                    grad = x.grad.numpy()
                counts = dict(cc.counts)
                out.append((label, str(pl), y.numpy(), y.placements, counts, cc.fallbacks, grad))
        return out

    mesh = mesh_of(mesh_shape)
    results = every_rank(dt.simulate(mesh.size, body))
    for (label, pl, got, placements, counts, fallbacks, grad), layout in zip(
        results, [p for p in _unsplit_layouts(mesh) for _ in UNSPLIT_KEYS]
    ):
        key = UNSPLIT_KEYS[label]()
        assert_close(got, GI[key], f"{label} {pl}")
        assert counts == {} and fallbacks == {}, (label, pl, counts, fallbacks)
        assert placements == [p if p.is_partial() else R for p in layout], (label, pl)
        if grad is not None:
            cot = np.arange(1.0, GI[key].size + 1).reshape(GI[key].shape)
            want = np.zeros_like(GI)
            np.add.at(want, key, cot)
            assert_close(grad, want, f"gradient of {label} {pl}")


IDS_LAYOUTS = {  # mesh ndim -> (table placements, ids placements, result placements)
    1: [([R], [dt.Shard(0)], [dt.Shard(0)]), ([R], [dt.Shard(1)], [dt.Shard(1)]), ([R], [R], [R])],
    2: [
        ([R, R], [dt.Shard(0), dt.Shard(1)], [dt.Shard(0), dt.Shard(1)]),
        ([R, R], [dt.Shard(0), dt.Shard(0)], [dt.Shard(0), dt.Shard(0)]),
        ([R, PSUM], [dt.Shard(1), R], [dt.Shard(1), PSUM]),
    ],
}
IDS = {
    "uneven": np.array([[3, 0, 6], [6, 6, 1], [-1, 2, 5], [0, 0, 0], [4, 3, 2]]),
    "empty shards": np.array([[2, 5]]),  # one row, two columns: empty shards from 2 ranks up
}


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_split_ids_look_up_an_unsplit_table_locally(mesh_shape):
    """``wte[ids]`` with the table whole on every rank and the ids split: each rank looks up
    its own ids, the result split like them, with no communication at all (the ids are not
    gathered); the table's gradient is Partial(sum) over the mesh dims that split the ids."""
    table = np.round(8 * np.random.default_rng(7).normal(size=(7, 3)))  # Partial sums exact

    def body():
        mesh = mesh_of(mesh_shape)
        out = []
        for tpl, ipl, _ in IDS_LAYOUTS[mesh.ndim]:
            for name, ids in IDS.items():
                w = make_input(table, mesh, tpl)
                w.requires_grad = True
                i = make_input(ids, mesh, ipl)
                with dt.CommCounter() as cc:
                    y = w[i]
                placements = y.placements
                (y * np.arange(1.0, y.size + 1).reshape(y.shape)).sum().backward()
                out.append((name, y.numpy(), placements, dict(cc.counts), w.grad.numpy()))
        return out

    mesh = mesh_of(mesh_shape)
    results = every_rank(dt.simulate(mesh.size, body))
    cases = [(lay, name) for lay in IDS_LAYOUTS[mesh.ndim] for name in IDS]
    for ((_, ipl, want_pl), name), (_, got, placements, counts, grad) in zip(cases, results):
        ids = IDS[name]
        assert_close(got, table[ids], f"{name} {ipl}")
        assert placements == want_pl, (name, ipl, placements)
        assert counts == {}, (name, ipl, counts)
        want = np.zeros_like(table)
        np.add.at(want, ids, np.arange(1.0, ids.size * 3 + 1).reshape(*ids.shape, 3))
        assert_close(grad, want, f"gradient {name} {ipl}")


def test_split_ids_out_of_bounds_raise_numpys_error():
    """An id out of bounds raises numpy's IndexError on the rank that holds it."""

    def body():
        mesh = dt.init_mesh((2,))
        w = dt.shard_tensor(np.ones((4, 2)), mesh, [R])
        ids = dt.shard_tensor(np.array([[0, 4], [1, 2]]), mesh, [dt.Shard(0)])
        return w[ids]

    with pytest.raises(IndexError, match="index 4 is out of bounds for axis 0 with size 4"):
        dt.simulate(2, body, timeout=10)
