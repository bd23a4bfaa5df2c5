"""The reshard planner ``disttensor.reshard.plan``: a pure function of (mesh shape, src, dst).

Plans are checked two independent ways: by the step rules of Note [Nested sharding] and
Note [Partial order] (spec.py), and by running the steps on a model of every rank's local array
(plain numpy, written here from the placement semantics) and comparing with the global value.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import disttensor as dt
from disttensor.reshard import plan

S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
P, PMAX = dt.Partial("sum"), dt.Partial("max")
CHOICES = [S0, S1, R, P, PMAX]
MESH_SHAPES = [(2,), (3,), (2, 2), (2, 3), (2, 2, 2)]
SHAPE = (5, 7)  # uneven on every mesh here, with empty shards when nested 2x2x2


def _kind(p: dt.Placement) -> str:
    return "S" if p.is_shard() else "P" if p.is_partial() else "R"


# Which collective moves one mesh dim from one kind of placement to another (reshard.py table).
STEP_KIND = {
    ("S", "R"): "all_gather",
    ("P", "R"): "all_reduce",
    ("P", "S"): "reduce_scatter",
    ("S", "S"): "all_to_all",
    ("R", "S"): "slice",
    ("R", "P"): "to_partial",
}

_COMMUTE = {frozenset({"sum"}), frozenset({"max"}), frozenset({"sum", "avg"})}


def _commutes(a: str, b: str) -> bool:
    return a == b or frozenset({a, b}) in _COMMUTE


# -- rule checker ----------------------------------------------------------------------------
def check_rules(mesh_shape, src, dst, steps) -> None:
    """Each step changes one mesh dim from its current placement, and only where exact."""
    state = [d if n == 1 else s for s, d, n in zip(src, dst, mesh_shape)]  # size 1: relabel
    for step in steps:
        m = step.mesh_dim
        assert 0 <= m < len(mesh_shape) and mesh_shape[m] > 1, step
        assert step.src == state[m] and step.dst != step.src, (state, step)
        assert step.kind == STEP_KIND[_kind(step.src), _kind(step.dst)], step
        later = state[m + 1 :]
        for pl in (step.src, step.dst):  # Note [Nested sharding]
            if pl.is_shard():
                assert not any(x.is_shard(pl.dim) for x in later), (state, step)
        if step.src.is_partial():  # Note [Partial order]: inner Partials are reduced first
            for x in later:
                if x.is_partial():
                    assert _commutes(step.src.reduce_type, x.reduce_type), (state, step)
        state[m] = step.dst
    assert tuple(state) == tuple(dst), (state, dst)


# -- data model: every rank's local array, stepped by plain numpy -------------------------------
def _groups(mesh_shape, m):
    """Lists of mesh coordinates along mesh dim ``m`` (in order), one per group."""
    others = [range(n) if j != m else [0] for j, n in enumerate(mesh_shape)]
    for base in itertools.product(*others):
        yield [base[:m] + (i,) + base[m + 1 :] for i in range(mesh_shape[m])]


REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}


def _reduce(arrays, op):
    return REDUCE[op](np.stack(arrays), axis=0)


def _apply(mesh_shape, local, m, src, dst):
    """Locals after moving mesh dim ``m`` from ``src`` to ``dst``, by what the move means."""
    k, out = mesh_shape[m], {}
    for group in _groups(mesh_shape, m):
        pieces = [local[c] for c in group]
        if src.is_shard():
            whole = np.concatenate(pieces, axis=src.dim)
        elif src.is_partial():
            whole = _reduce(pieces, src.reduce_type)
        for i, c in enumerate(group):
            if src.is_replicate():
                whole = pieces[i]
            if dst.is_shard():
                out[c] = np.array_split(whole, k, axis=dst.dim)[i]
            elif dst.is_partial() and dst.reduce_type == "sum" and i != 0:
                out[c] = np.zeros_like(whole)
            else:
                out[c] = whole
    return out


def expected_locals(mesh_shape, placements, value):
    """Locals of ``value`` laid out by ``placements``: nested array_split boxes, mesh-dim order."""
    local = {c: value for c in np.ndindex(*mesh_shape)}
    for m, p in enumerate(placements):
        if not p.is_replicate():
            local = _apply(mesh_shape, local, m, R, p)
    return local


def gathered(mesh_shape, placements, local):
    """Every rank's global value: Partials reduced, then shards joined, innermost first."""
    placements = list(placements)
    for kinds in ("P", "S"):
        for m in reversed(range(len(mesh_shape))):
            if _kind(placements[m]) == kinds:
                local = _apply(mesh_shape, local, m, placements[m], R)
                placements[m] = R
    return local


def check_data(mesh_shape, src, dst, steps, shape=SHAPE) -> None:
    value = np.arange(1, math.prod(shape) + 1).reshape(shape)
    state = [d if n == 1 else s for s, d, n in zip(src, dst, mesh_shape)]
    local = expected_locals(mesh_shape, state, value)
    for step in steps:
        local = _apply(mesh_shape, local, step.mesh_dim, step.src, step.dst)
        state[step.mesh_dim] = step.dst
    for c, v in gathered(mesh_shape, dst, local).items():
        np.testing.assert_array_equal(v, value, err_msg=f"{src} -> {dst} via {steps}, rank {c}")
    if not any(p.is_partial() for p in dst):
        want = expected_locals(mesh_shape, dst, value)
        for c in want:
            np.testing.assert_array_equal(local[c], want[c], err_msg=f"{src} -> {dst}, {c}")


def test_data_model_agrees_with_array_split() -> None:
    # [S(0), S(0)] on (2, 2): the first mesh dim halves axis 0, the second halves each half.
    value = np.arange(5)
    local = expected_locals((2, 2), (S0, S0), value)
    assert [local[c].tolist() for c in np.ndindex(2, 2)] == [[0, 1], [2], [3], [4]]
    assert all((v == value).all() for v in gathered((2, 2), (S0, S0), local).values())


# -- single transitions on a 1-D mesh ----------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize(
    ("src", "dst", "kind"),
    [
        (S0, R, "all_gather"),
        (S1, R, "all_gather"),
        (P, R, "all_reduce"),
        (PMAX, R, "all_reduce"),
        (dt.Partial("avg"), R, "all_reduce"),
        (P, S0, "reduce_scatter"),
        (dt.Partial("min"), S1, "reduce_scatter"),
        (S0, S1, "all_to_all"),
        (S1, S0, "all_to_all"),
        (R, S0, "slice"),
        (R, S1, "slice"),
        (R, P, "to_partial"),
        (R, dt.Partial("max"), "to_partial"),
    ],
)
def test_one_step(n, src, dst, kind) -> None:
    steps = plan((n,), (src,), (dst,))
    assert len(steps) == 1
    (step,) = steps
    assert (step.kind, step.mesh_dim, step.src, step.dst) == (kind, 0, src, dst)
    check_rules((n,), (src,), (dst,), steps)
    check_data((n,), (src,), (dst,), steps)


@pytest.mark.parametrize(
    ("src", "dst"), [(P, PMAX), (PMAX, P), (dt.Partial("avg"), dt.Partial("min"))]
)
def test_partial_to_another_partial_goes_through_replicate(src, dst) -> None:
    steps = plan((2,), (src,), (dst,))
    assert [(s.kind, s.src, s.dst) for s in steps] == [
        ("all_reduce", src, R),
        ("to_partial", R, dst),
    ]


@pytest.mark.parametrize("mesh_shape", [(1,), (1, 1), (1, 1, 1)])
@pytest.mark.parametrize("src", CHOICES)
@pytest.mark.parametrize("dst", CHOICES)
def test_size_one_mesh_dims_need_no_steps(mesh_shape, src, dst) -> None:
    n = len(mesh_shape)
    assert plan(mesh_shape, (src,) * n, (dst,) * n) == ()


@pytest.mark.parametrize(
    ("mesh_shape", "src", "dst", "expected"),
    [
        ((1, 2), (S0, S0), (P, R), [(1, S0, R)]),
        ((2, 1), (S1, R), (R, S0), [(0, S1, R)]),
        ((1, 3, 1), (P, S1, S0), (R, S0, PMAX), [(1, S1, S0)]),
    ],
)
def test_size_one_mesh_dims_are_relabelled(mesh_shape, src, dst, expected) -> None:
    steps = plan(mesh_shape, src, dst)
    assert [(s.mesh_dim, s.src, s.dst) for s in steps] == expected
    check_rules(mesh_shape, src, dst, steps)


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES)
@pytest.mark.parametrize("p", CHOICES + [dt.Partial("avg"), dt.Partial("min")])
def test_identical_placements_need_no_steps(mesh_shape, p) -> None:
    placements = (p,) * len(mesh_shape)
    assert plan(mesh_shape, placements, placements) == ()


def test_mixed_identical_placements_need_no_steps() -> None:
    for ps in itertools.product(CHOICES, repeat=2):
        assert plan((2, 3), ps, ps) == ()


# -- N-D meshes ------------------------------------------------------------------------------
def test_gather_one_mesh_dim_of_two() -> None:
    steps = plan((2, 2), (S0, S1), (R, S1))
    assert len(steps) == 1
    assert (steps[0].kind, steps[0].mesh_dim, steps[0].src, steps[0].dst) == (
        "all_gather",
        0,
        S0,
        R,
    )


def test_nested_shards_are_gathered_innermost_first() -> None:
    steps = plan((2, 2), (S0, S0), (R, R))
    assert [(s.kind, s.mesh_dim) for s in steps] == [("all_gather", 1), ("all_gather", 0)]


def test_mixed_partials_are_reduced_innermost_first() -> None:
    steps = plan((2, 2), (PMAX, P), (R, R))
    assert [(s.kind, s.mesh_dim) for s in steps] == [("all_reduce", 1), ("all_reduce", 0)]


@pytest.mark.parametrize("mesh_shape", [(2, 2), (2, 3), (3, 2)])
@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ((S0, S0), (S1, S0)),
        ((S0, S0), (S0, S1)),
        ((S0, S0), (S1, S1)),
        ((S1, S0), (S0, S0)),
        ((S0, S1), (S1, S0)),
        ((S0, S0), (R, S0)),
        ((R, S0), (S0, S0)),
        ((P, S0), (S0, S0)),
        ((S0, S0), (S0, P)),
    ],
)
def test_nested_sharding(mesh_shape, src, dst) -> None:
    steps = plan(mesh_shape, src, dst)
    check_rules(mesh_shape, src, dst, steps)
    check_data(mesh_shape, src, dst, steps)


def test_checkers_reject_a_step_that_breaks_nesting() -> None:
    # Splitting the outer Shard(0) directly to Shard(1) would leave the inner split wrong.
    from disttensor.reshard import Step

    bad = (Step(0, S0, S1),)
    with pytest.raises(AssertionError):
        check_rules((2, 2), (S0, S0), (S1, S0), bad)
    with pytest.raises(AssertionError):
        check_data((2, 2), (S0, S0), (S1, S0), bad)


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_every_placement_pair_has_a_valid_plan(mesh_shape) -> None:
    n = len(mesh_shape)
    model = math.prod(mesh_shape) <= 6  # the data model on 8 ranks would dominate the run time
    for src in itertools.product(CHOICES, repeat=n):
        for dst in itertools.product(CHOICES, repeat=n):
            steps = plan(mesh_shape, src, dst)
            check_rules(mesh_shape, src, dst, steps)
            if model:
                check_data(mesh_shape, src, dst, steps)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ((S0, S0, S0), (S1, S1, S1)),
        ((S0, S0, S0), (R, R, R)),
        ((S0, S1, S0), (S1, S0, S1)),
        ((P, PMAX, P), (R, R, R)),
        ((PMAX, P, S0), (S0, S0, S0)),
        ((R, R, R), (P, PMAX, P)),
        ((S1, P, S1), (PMAX, S1, S1)),
    ],
)
def test_2x2x2_data_model(src, dst) -> None:
    steps = plan((2, 2, 2), src, dst)
    check_rules((2, 2, 2), src, dst, steps)
    check_data((2, 2, 2), src, dst, steps)


# -- purity and caching ------------------------------------------------------------------------
def test_plan_is_deterministic_and_cached() -> None:
    args = ((2, 3), (S0, P), (S1, S0))
    first = plan(*args)
    assert plan(*args) is first
    hits = plan.cache_info().hits
    assert plan(*args) is first
    assert plan.cache_info().hits == hits + 1
    # equal (not identical) arguments hit the same entry
    assert plan((2, 3), (dt.Shard(0), dt.Partial()), (dt.Shard(1), dt.Shard(0))) is first
    # computed afresh, it is the same plan
    for _ in range(3):
        assert plan.__wrapped__(*args) == first


def test_plan_steps_are_frozen_values() -> None:
    (step,) = plan((2,), (S0,), (R,))
    assert repr(step) == "all_gather(mesh_dim=0: Shard(dim=0) -> Replicate())"
    with pytest.raises(AttributeError):
        step.mesh_dim = 1
    assert hash(step) == hash(plan.__wrapped__((2,), (S0,), (R,))[0])
