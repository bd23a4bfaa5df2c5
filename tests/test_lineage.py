"""Tensor lineage (Note [Lineage names the tensor] in disttensor/tensor.py): the hash of how the
program made a tensor, which the agreement check folds into a moved tensor's fingerprint.

* It must not depend on anything a rank holds alone, or correct programs would raise
  RanksDiverged: the same calls give the same lineage on the dispatch fast path and on the
  general path, and in processes with different string hash seeds.
* It must tell apart what the program made differently: other data, another op, other
  attributes or Python scalars, a write in place; and keep it where the value is the same
  (``reshard``, ``copy``, ``detach``).

The divergence cases themselves (rank 0 gathers a while rank 1 gathers b of the same spec,
on simulated ranks and under mpiexec) are tests/test_agree.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from mpirun import ROOT

import disttensor as dt
from disttensor import dispatch

MESH = dt.ProcessMesh([0])


def _x(values=None, placements=None):
    data = np.arange(12.0).reshape(3, 4) if values is None else values
    return dt.shard_tensor(data, MESH, placements or [dt.Shard(0)])


# (name, call): each runs three times on the same inputs, the first through the general path
# and the next two through a fast path, covering every form the fast path hashes
CALLS = {
    "binary tensors": lambda x, y: x + y,
    "binary scalar": lambda x, y: x * 2.5,
    "binary scalar first": lambda x, y: 1 - x,
    "binary nan": lambda x, y: x * float("nan"),
    "binary complex": lambda x, y: x + 1j,
    "binary bool": lambda x, y: x * True,
    "ufunc tensors": lambda x, y: np.add(x, y),
    "ufunc one": lambda x, y: np.exp(x),
    "three tensors": lambda x, y: np.where(x > 3, x, y),
    "scalar arguments": lambda x, y: np.clip(x, 1, 9),
    "numpy scalar": lambda x, y: x * np.float32(3),
    "attributes": lambda x, y: x.sum(axis=0),
    "attributes none": lambda x, y: np.sum(x, axis=None),
    "string attribute": lambda x, y: x.astype("float32"),
    "a view": lambda x, y: x[1:, ::2],
    "matmul moves": lambda x, y: x @ y.T,
}


@pytest.mark.parametrize("name", CALLS)
def test_the_fast_path_makes_the_general_paths_lineage(name, monkeypatch):
    fn = CALLS[name]
    x, y = _x(), _x(np.arange(12.0).reshape(3, 4) + 1)
    general = []
    real = dispatch._general
    monkeypatch.setattr(dispatch, "_general", lambda *a: general.append(1) or real(*a))
    first = fn(x, y)._lin
    took = len(general)
    again = [fn(x, y)._lin for _ in range(2)]
    assert took >= 1  # the first call decided
    assert len(general) == took or name in ("a view",), "the repeats took the general path"
    assert again == [first, first]
    assert first not in (0, x._lin, y._lin)


def test_equal_inputs_on_new_specs_give_equal_lineages():
    """Another tensor made alike (another spec object: the identity cache misses) has the
    same lineage, and so have results made from it."""
    a, b = _x(), _x()
    assert a._spec is not b._spec and a._lin == b._lin
    assert ((a + 1) * a)._lin == ((b + 1) * b)._lin


DIFFERENT = {
    "op": (lambda x: np.exp(x), lambda x: np.log1p(x)),
    "scalar": (lambda x: x * 2, lambda x: x * 3),
    "scalar side": (lambda x: x - 1, lambda x: 1 - x),
    "attribute": (lambda x: x.sum(axis=0, keepdims=True), lambda x: x.sum(axis=0)),
    "index": (lambda x: x[0], lambda x: x[1]),
    "written": (lambda x: x, lambda x: _written(x)),
    "factory": (lambda x: dt.zeros((3, 4), mesh=MESH), lambda x: dt.ones((3, 4), mesh=MESH)),
    "fill": (
        lambda x: dt.full((3, 4), 1.0, mesh=MESH),
        lambda x: dt.full((3, 4), 2.0, mesh=MESH),
    ),
    "seed": (
        lambda x: dt.rand((3, 4), seed=1, mesh=MESH),
        lambda x: dt.rand((3, 4), seed=2, mesh=MESH),
    ),
    "arange": (lambda x: dt.arange(4, mesh=MESH), lambda x: dt.arange(1, 5, mesh=MESH)),
}


def _written(x):
    y = x.copy()
    y[0, 0] = -1.0
    return y


@pytest.mark.parametrize("name", DIFFERENT)
def test_made_differently_different_lineage(name):
    make_a, make_b = DIFFERENT[name]
    x = _x()
    assert make_a(x)._lin != make_b(x)._lin


def test_a_write_in_place_changes_the_lineage_and_a_copy_keeps_it():
    x = _x()
    before = x._lin
    assert x.copy()._lin == x.detach()._lin == before
    assert dt.reshard(x, MESH, [dt.Replicate()])._lin == before
    x += 1
    assert x._lin != before
    after = x._lin
    x[0] = 5.0
    assert x._lin not in (before, after)


def test_a_shard_tensor_leaf_is_named_by_its_data():
    """On a mesh of several ranks the ranks agree on a crc32 of the data, which names the
    leaf: equal data, equal lineage; other data, another (here two simulated ranks)."""

    def leaves():
        mesh = dt.ProcessMesh([0, 1])
        a = dt.shard_tensor(np.arange(8.0), mesh, [dt.Shard(0)])
        b = dt.shard_tensor(np.arange(8.0), mesh, [dt.Shard(0)])
        c = dt.shard_tensor(np.arange(8.0) + 1, mesh, [dt.Shard(0)])
        return a._lin, b._lin, c._lin

    (a, b, c), again = dt.simulate(2, leaves)
    assert again == (a, b, c)  # the same on both ranks
    assert a == b != c


PROGRAM = """
import numpy as np, disttensor as dt
mesh = dt.ProcessMesh([0])
x = dt.shard_tensor(np.arange(12.0).reshape(3, 4), mesh, [dt.Shard(0)])
outs = [x, x + 1, x * np.nan, np.sum(x, axis=None), x.astype("float32"), np.pad(x, 1),
        x.reshape(4, 3), x[None, ..., 1:], dt.zeros((2,), mesh=mesh, dtype="int32"),
        np.einsum("ij->j", x), dt.full((2,), 1.5, mesh=mesh)]
print([t._lin for t in outs])
"""


def test_lineage_is_the_same_in_every_process():
    """Python's str hash (and, before 3.12, None's) differ by process: the lineage must not
    use them, or every rank would name one tensor differently."""
    got = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        out = subprocess.run(
            [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        got.append(out.stdout)
    assert got[0] == got[1]
    assert len(set(eval(got[0]))) == len(eval(got[0]))  # every tensor its own


def test_numpy_scalars_count_as_the_values_they_equal():
    """A numpy scalar operand (``x * lr`` with lr a float64) hashes as its value, NaN as one
    token, and a long double (whose ``item()`` is a long double again) works."""
    from disttensor.tensor import token

    x = _x()
    assert token(np.float32(0.5)) == token(0.5) and token(np.int8(-3)) == token(-3)
    assert token(np.float64("nan")) == token(float("nan")) == token(np.float32("nan"))
    assert (x * np.float64(2))._lin == (x * 2.0)._lin == (x * np.longdouble(2))._lin
    assert (x + np.clongdouble(1))._lin != (x + 2)._lin
    assert token("a\udc80") != token("a")  # a lone surrogate is hashed, not an error


def test_results_built_without_dispatch_are_named_alike_on_every_rank():
    """Slices of a split axis and numpy functions whose implementations build their results
    themselves (sort, cumsum, concatenate, pad) are named by the call: the same on every rank,
    another for another call."""

    def lineages():
        mesh = dt.ProcessMesh([0, 1])
        u = dt.shard_tensor(np.arange(9.0), mesh, [dt.Shard(0)])
        w = dt.shard_tensor(np.arange(9.0)[::-1].copy(), mesh, [dt.Shard(0)])
        made = (u[1:], u[:-1], np.sort(u), np.sort(w), np.cumsum(u), np.concatenate([u, w]),
                np.pad(u, 1), dt.full_like(u, 1.0), dt.full_like(u, 2.0))  # fmt: skip
        return [t._lin for t in made]

    mine, theirs = dt.simulate(2, lineages)
    assert mine == theirs
    assert 0 not in mine and len(set(mine)) == len(mine)


def test_an_argument_handed_back_keeps_its_lineage():
    """A numpy function that returns its argument (``np.atleast_1d`` of a 1-d tensor), alone
    or in a list, does not rename it: only one rank may have made the call, which moves
    nothing."""
    m = dt.dtensor_from_local(np.arange(4.0), MESH, [dt.Shard(0)])  # a tensor of lineage 0
    assert m._lin == 0
    assert np.atleast_1d(m) is m and m._lin == 0
    assert all(t is m for t in np.atleast_1d(m, m)) and m._lin == 0
