"""Shard / Replicate / Partial: exact reprs, value semantics, validation, negative Shard dims."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

import disttensor as dt

REDUCE_TYPES = ["sum", "avg", "max", "min"]


@pytest.mark.parametrize(
    ("placement", "text"),
    [
        (dt.Shard(0), "Shard(dim=0)"),
        (dt.Shard(3), "Shard(dim=3)"),
        (dt.Shard(-1), "Shard(dim=-1)"),
        (dt.Replicate(), "Replicate()"),
        (dt.Partial(), "Partial(reduce_type='sum')"),
        *[(dt.Partial(r), f"Partial(reduce_type='{r}')") for r in REDUCE_TYPES],
        (dt.Partial(reduce_type="max"), "Partial(reduce_type='max')"),
    ],
)
def test_repr(placement, text) -> None:
    assert repr(placement) == text
    assert str(placement) == text
    assert repr([placement]) == f"[{text}]"


def test_repr_of_a_list() -> None:
    assert repr([dt.Shard(0), dt.Replicate(), dt.Partial()]) == (
        "[Shard(dim=0), Replicate(), Partial(reduce_type='sum')]"
    )


# -- value semantics -------------------------------------------------------------------------
def _distinct() -> list[dt.Placement]:
    return [dt.Shard(0), dt.Shard(1), dt.Replicate(), *[dt.Partial(r) for r in REDUCE_TYPES]]


def test_equal_and_hash_by_value() -> None:
    for a, b in zip(_distinct(), _distinct()):  # equal values built twice
        assert a == b and hash(a) == hash(b)
    assert dt.Partial() == dt.Partial("sum") == dt.Partial(reduce_type="sum")
    assert len(set(_distinct() + _distinct())) == len(_distinct())
    assert {dt.Shard(1): "x"}[dt.Shard(1)] == "x"


def test_distinct_values_differ() -> None:
    ps = _distinct()
    for i, a in enumerate(ps):
        for j, b in enumerate(ps):
            assert (a == b) == (i == j), (a, b)
    assert dt.Shard(0) != 0
    assert dt.Replicate() != "Replicate()"
    assert dt.Partial() != "sum"


@pytest.mark.parametrize(
    ("placement", "field", "value"),
    [(dt.Shard(0), "dim", 1), (dt.Partial(), "reduce_type", "max"), (dt.Replicate(), "x", 1)],
)
def test_frozen(placement, field, value) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(placement, field, value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(placement, field)


def test_pickle_round_trip() -> None:
    for p in _distinct():
        assert pickle.loads(pickle.dumps(p)) == p


@pytest.mark.parametrize(
    ("placement", "shard", "replicate", "partial"),
    [
        (dt.Shard(2), True, False, False),
        (dt.Replicate(), False, True, False),
        (dt.Partial("min"), False, False, True),
    ],
)
def test_kind_predicates(placement, shard, replicate, partial) -> None:
    assert isinstance(placement, dt.Placement)
    assert placement.is_shard() is shard
    assert placement.is_replicate() is replicate
    assert placement.is_partial() is partial


def test_is_shard_of_an_axis() -> None:
    assert dt.Shard(2).is_shard(2)
    assert not dt.Shard(2).is_shard(1)
    assert not dt.Replicate().is_shard(0)


# -- validation ------------------------------------------------------------------------------
@pytest.mark.parametrize("reduce_type", REDUCE_TYPES)
def test_all_reduce_types(reduce_type) -> None:
    p = dt.Partial(reduce_type)
    assert p.reduce_type == reduce_type
    assert p.is_partial()


@pytest.mark.parametrize("bad", ["mean", "SUM", "prod", "", None, 0])
def test_bad_reduce_type(bad) -> None:
    with pytest.raises(ValueError, match="is not supported; use one of 'sum', 'avg', 'max', 'min'"):
        dt.Partial(bad)


@pytest.mark.parametrize("bad", ["a", "0", 1.0, None, True, [0]])
def test_shard_needs_an_int(bad) -> None:
    with pytest.raises(TypeError, match=r"Shard\(dim\) needs an int tensor axis"):
        dt.Shard(bad)


# -- negative Shard dims wrap against the tensor's ndim ------------------------------------------
@pytest.mark.parametrize(
    ("shape", "dim", "normalized"),
    [((4, 6), -1, 1), ((4, 6), -2, 0), ((6,), -1, 0), ((2, 3, 4), -1, 2), ((2, 3, 4), -3, 0)],
)
def test_negative_shard_dims_are_normalized(shape, dim, normalized) -> None:
    data = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)

    def f():
        mesh = dt.ProcessMesh([0, 1])
        made = [
            dt.shard_tensor(data, mesh, [dt.Shard(dim)]),
            dt.zeros(shape, mesh=mesh, placements=[dt.Shard(dim)]),
            dt.reshard(dt.shard_tensor(data, mesh, [dt.Replicate()]), mesh, [dt.Shard(dim)]),
        ]
        local = np.array_split(data, 2, axis=normalized)[dt.get_rank()]
        made.append(dt.dtensor_from_local(local, mesh, [dt.Shard(dim)]))
        for x in made:
            assert x.placements == [dt.Shard(normalized)]
            assert repr(x.placements) == f"[Shard(dim={normalized})]"
            assert x.local_shape == local.shape
        np.testing.assert_array_equal(made[0].to_local(), local)
        return True

    assert dt.simulate(2, f) == [True, True]


def test_negative_shard_on_a_2d_mesh() -> None:
    def f():
        mesh = dt.ProcessMesh([[0, 1], [2, 3]])
        x = dt.shard_tensor(np.ones((4, 6)), mesh, [dt.Shard(-2), dt.Shard(-1)])
        return x.placements, x.local_shape

    assert dt.simulate(4, f) == [([dt.Shard(0), dt.Shard(1)], (2, 3))] * 4


def test_resharding_to_the_normalized_placement_is_a_no_op() -> None:
    def f():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(np.ones((4, 6)), mesh, [dt.Shard(1)])
        return dt.reshard(x, mesh, [dt.Shard(-1)]) is x

    assert dt.simulate(2, f) == [True, True]
