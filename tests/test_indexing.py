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
KEYS = {
    "rows": lambda: np.array([3, 0, 10, 3, -1]),  # repeated and negative
    "rows 2-D": lambda: np.array([[1, 2], [9, 9], [0, 5]]),
    "list": lambda: [1, 7],
    "pick": lambda: (np.arange(N), np.arange(N) % D),
    "mask": lambda: G[:, 0] > 0,
    "mask 2-D": lambda: G > 0,
    "none": lambda: np.array([], dtype=np.int64),
    "rows, all columns": lambda: (np.array([2, 8]), slice(None)),
}


def _layouts(mesh):
    n = mesh.ndim
    rest = [R] * (n - 1)
    out = [[dt.Shard(0), *rest], [dt.Shard(1), *rest], [R] * n, [PSUM, *rest]]
    if n == 2:
        out += [[dt.Shard(0), dt.Shard(1)], [dt.Shard(0), dt.Shard(0)], [dt.Shard(1), PSUM]]
    return out


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_values_layouts_and_gradients(mesh_shape):
    def body():
        mesh = mesh_of(mesh_shape)
        out = []
        for pl in _layouts(mesh):
            for label, make in KEYS.items():
                x = make_input(G, mesh, pl)
                x.requires_grad = True
                with dt.CommCounter() as cc:
                    y = x[make()]
                cot = np.arange(1.0, y.size + 1).reshape(y.shape)
                (y * cot).sum().backward()
                out.append((label, str(pl), y.numpy(), y.placements, cc.fallbacks, x.grad.numpy()))
        return out

    for label, pl, got, placements, fallbacks, grad in every_rank(
        dt.simulate(mesh_of(mesh_shape).size, body)
    ):
        key = KEYS[label]()
        want = G[key]
        assert_close(got, want, f"{label} {pl}")
        assert fallbacks == {}, (label, pl, fallbacks)
        assert len(placements) == len(mesh_shape)
        cot = np.arange(1.0, want.size + 1).reshape(want.shape)
        want_grad = np.zeros_like(G)
        np.add.at(want_grad, key, cot)  # repeated indices accumulate
        assert_close(grad, want_grad, f"gradient of {label} {pl}")


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
