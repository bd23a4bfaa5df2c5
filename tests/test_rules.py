"""SPMD rules: collective counts on canonical cases, infer_forward, the registry, op coverage,
and the rule validator (disttensor/spmd/validate.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import op_cases
import pytest
from op_cases import PAVG, PMAX, PSUM, S0, S1, R, assert_close, every_rank, make_input, mesh_of

import disttensor as dt
from disttensor import autograd, dispatch
from disttensor.dispatch import Op
from disttensor.ops import elementwise, linalg, reduction
from disttensor.spmd import TensorSpec, core, get_rule, infer_forward, registered_ops, rules
from disttensor.spmd import validate as val


# -- collectives on canonical cases --------------------------------------------------------
def _matmul(a, b):
    return a @ b


def case(fn, *inputs, out=None, collectives=0):
    """An op on inputs (global shape, placements): its output placements and collective count."""
    return fn, inputs, out, collectives


M, K, N = (7, 5), (5, 3), (7, 5)  # uneven on 2 and 3 ranks
CANONICAL = {
    "matmul S(1) x S(0) -> Partial(sum)": case(_matmul, (M, [S1]), (K, [S0]), out=[PSUM]),
    "matmul S(0) x R -> S(0)": case(_matmul, (M, [S0]), (K, [R]), out=[S0]),
    "matmul R x S(1) -> S(1)": case(_matmul, (M, [R]), (K, [S1]), out=[S1]),
    "add on equal shards": case(dt.add, (N, [S1]), (N, [S1]), out=[S1]),
    "multiply on equal shards": case(dt.multiply, (N, [S0]), (N, [S0]), out=[S0]),
    "exp of a shard": case(dt.exp, (N, [S0]), out=[S0]),
    "maximum, broadcast row": case(dt.maximum, (N, [S0]), ((5,), [R]), out=[S0]),
    "sum over a sharded axis": case(lambda x: x.sum(axis=0), (N, [S0]), out=[PSUM]),
    "sum over the other axis": case(lambda x: x.sum(axis=1), (N, [S0]), out=[S0]),
    "max over a sharded axis": case(lambda x: x.max(axis=1), (N, [S1]), out=[PMAX]),
    "mean over a sharded axis (uneven)": case(lambda x: x.mean(axis=0), (N, [S0]), out=[PAVG]),
    "add Partial + Replicate": case(dt.add, (N, [PSUM]), (N, [R]), out=[PSUM]),
    "add Partial + Partial": case(dt.add, (N, [PSUM]), (N, [PSUM]), out=[PSUM]),
    "multiply Replicate * Partial(avg)": case(dt.multiply, (N, [R]), (N, [PAVG]), out=[PAVG]),
    "scalar * Partial": case(lambda x: 2.5 * x, (N, [PSUM]), out=[PSUM]),
    "exp of Partial: one collective": case(dt.exp, (N, [PSUM]), collectives=1),
    "Partial + 1 is not linear: one collective": case(lambda x: x + 1, (N, [PSUM]), collectives=1),
    "matmul S(0) x S(0): one collective": case(_matmul, (M, [S0]), (K, [S0]), collectives=1),
}


def _canonical(mesh, fn, inputs):
    rng = np.random.default_rng(30)
    gs = [rng.normal(size=shape) for shape, _ in inputs]
    xs = [make_input(g, mesh, pl) for g, (_, pl) in zip(gs, inputs)]
    with dt.CommCounter() as cc:
        out = fn(*xs)
    assert_close(out.numpy(), np.asarray(fn(*gs)), "value")  # mean of uneven shards: exact
    return out.placements, cc.total


@pytest.mark.parametrize("mesh_shape", [(2,), (3,)], ids=str)
@pytest.mark.parametrize("name", list(CANONICAL))
def test_canonical_collectives(name, mesh_shape):
    fn, inputs, out, collectives = CANONICAL[name]
    mesh = mesh_of(mesh_shape)
    for placements, total in dt.simulate(mesh.size, _canonical, mesh, fn, inputs):
        assert out is None or placements == out
        assert total == collectives


def test_column_then_row_parallel_is_one_all_reduce():
    """x @ W1[S(1)] -> relu -> @ W2[S(0)] -> Partial; resolving it is the one all-reduce."""

    def body(mesh):
        rng = np.random.default_rng(31)
        x, w1, w2 = rng.normal(size=(6, 4)), rng.normal(size=(4, 8)), rng.normal(size=(8, 3))
        with dt.CommCounter() as cc:
            h = dt.relu(make_input(x, mesh, [R, R]) @ make_input(w1, mesh, [R, S1]))
            y = h @ make_input(w2, mesh, [R, S0])
            placements = y.placements
            y = dt.reshard(y, mesh, [R, R])
        assert_close(y.numpy(), np.maximum(x @ w1, 0) @ w2, "mlp")
        return placements, cc.counts

    for placements, counts in dt.simulate(4, body, mesh_of((2, 2))):
        assert placements == [R, PSUM] and counts == {"all_reduce": 1}


# -- infer_forward, the registry, errors ---------------------------------------------------
def test_infer_forward_design_example():
    mesh = dt.ProcessMesh([[0, 1], [2, 3]])
    got = dt.spmd.infer_forward(
        "matmul",
        [
            dt.spmd.TensorSpec((64, 32), [dt.Shard(0), dt.Replicate()]),
            dt.spmd.TensorSpec((32, 48), [dt.Replicate(), dt.Shard(1)]),
        ],
        mesh,
        trans_x=False,
        trans_y=False,
    )
    assert got == (
        [[dt.Shard(0), dt.Replicate()], [dt.Replicate(), dt.Shard(1)]],
        [[dt.Shard(0), dt.Shard(1)]],
    )


@pytest.mark.parametrize(
    "op,specs,mesh,attrs,want",
    [
        ("matmul", [((64, 32), [S1]), ((32, 48), [S0])], [0, 1], {}, ([[S1], [S0]], [[PSUM]])),
        (
            "matmul",
            [((64, 32), [S0]), ((48, 32), [S0])],
            (2,),
            {"trans_y": True},
            ([[S0], [R]], [[S0]]),
        ),
        ("add", [((8, 4), [S0]), ((4,), [R])], (4,), {}, ([[S0], [R]], [[S0]])),
        ("add", [((8, 4), [PSUM]), ((8, 4), [R])], (2,), {}, ([[PSUM], [PSUM]], [[PSUM]])),
        # a Partial input of a non-linear op is all-reduced: a reduce-scatter would only
        # postpone the other half of the work (spmd.core.reshard_cost)
        ("exp", [((8, 4), [S1, PSUM])], (2, 2), {}, ([[S1, R]], [[S1, R]])),
        ("sum", [((8, 4), [S0, S1])], (2, 2), {"axis": 0}, ([[S0, S1]], [[PSUM, S0]])),
        ("mean", [((8, 4), [S1])], (3,), {"axis": -1, "keepdims": True}, ([[S1]], [[PAVG]])),
        ("max", [((8, 4), [PMAX])], (2,), {"axis": 1}, ([[PMAX]], [[PMAX]])),
        (
            "einsum",
            [((8, 4), [S1]), ((4, 6), [S0])],
            (2,),
            {"equation": "ij,jk"},
            ([[S1], [S0]], [[PSUM]]),
        ),
        (
            "no_such_op",
            [((8, 4), [S0, S1]), ((3,), [PSUM, R])],
            (2, 2),
            {},
            ([[R, R], [R, R]], [[R, R]]),
        ),
    ],
    ids=[
        "guide matmul",
        "trans_y",
        "broadcast",
        "Partial+R",
        "exp of Partial on 2-D",
        "sum 2-D",
        "mean",
        "max of Partial(max)",
        "einsum implicit",
        "unknown op: fallback",
    ],
)
def test_infer_forward(op, specs, mesh, attrs, want):
    mesh = dt.ProcessMesh(mesh) if isinstance(mesh, list) else mesh
    got = infer_forward(op, [TensorSpec(s, p) for s, p in specs], mesh, **attrs)
    assert got == (list(map(list, want[0])), list(map(list, want[1])))


def test_registered_ops():
    names = registered_ops()
    assert names == sorted(set(names))
    ours = {*rules.POINTWISE, "matmul", "einsum", "dot", "outer", *rules.REDUCTIONS}
    assert ours <= set(names)
    assert {"var", "std"}.isdisjoint(names)  # composites: Note in the coverage test
    assert get_rule("no_such_op") is None


@pytest.mark.parametrize(
    "make,exc,match",
    [
        (lambda: TensorSpec((4,), [dt.Shard(1)]), ValueError, r"Shard\(dim=1\) is out of range"),
        (lambda: TensorSpec((), [dt.Shard(0)]), ValueError, "out of range for a tensor with 0"),
        (lambda: TensorSpec((4,), ["S0"]), TypeError, "must be Placements, got 'S0'"),
        (lambda: infer_forward("add", [(4,)], (2,)), TypeError, "needs dt.spmd.TensorSpec"),
        (
            lambda: infer_forward("add", [TensorSpec((4,), [S0])], (2, 2)),
            ValueError,
            "has 1 placements for a 2-D mesh",
        ),
        (
            lambda: infer_forward(
                "matmul", [TensorSpec((4, 3), [R]), TensorSpec((4, 3), [R])], (2,)
            ),
            ValueError,
            r"matmul: .*core dimension 0.* \(size 4 is different from 3\); shapes \(4, 3\)",
        ),
        (
            lambda: infer_forward(
                "einsum", [TensorSpec((4, 3), [R]), TensorSpec((4, 3), [R])], (2,), equation="ij,jk"
            ),
            ValueError,
            "axis 'j' has length 3 in one operand and 4",
        ),
        (
            lambda: infer_forward("add", [TensorSpec((4, 3), [R]), TensorSpec((3, 4), [R])], (2,)),
            ValueError,
            "could not be broadcast",
        ),
        (
            lambda: infer_forward("einsum", [TensorSpec((4, 3), [R])], (2,), equation="ijk->i"),
            ValueError,
            "does not match an input with 2 axes",
        ),
    ],
)
def test_bad_specs_raise_clear_errors(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: TensorSpec((-1,), [R]),
        lambda: TensorSpec((4.5,), [R]),
        lambda: TensorSpec((4,), S0),
    ],
    ids=["negative dim", "fractional dim", "bare placement"],
)
def test_tensor_spec_validates_its_arguments(make):
    """Regression (was: negative and fractional dims accepted; a bare Placement failed with
    'object is not iterable')."""

    with pytest.raises((ValueError, TypeError), match=r"shape|placements"):
        make()


def test_reduction_rule_rejects_out_of_range_axis():
    """Regression (was: _reduced wrapped axis % ndim, so dispatch resharded before AxisError)."""

    with pytest.raises((ValueError, IndexError)):
        infer_forward("sum", [TensorSpec((4, 3), [S0])], (2,), axis=5)


# -- coverage: which public ops have a kernel and a rule -----------------------------------
FAMILIES = (elementwise, linalg, reduction)  # shape and nn ops have their own tests
# Public ops without a kernel and rule of their own, by design: composites written with the
# primitives, whose rules decide (so no rule of theirs can disagree with their kernels); and
# softmax, log_softmax and logsumexp, functions that run one fused op (whose rule, in
# spmd/nn_rules.py, describes both routes) or the composite where a reduced axis is split.
COMPOSITE = {"var", "std", "logsumexp", "softmax", "log_softmax"}
# The gradient column: every op with a rule has a gradient (autograd.GRADIENTS, tested by
# tests/test_grad.py) or is a constant for autograd (autograd.NOT_DIFFERENTIABLE), except:
NO_GRADIENT_BY_DESIGN = {
    # fused gradient kernels whose gradients nothing computes: backward runs with recording
    # off (the activation and softmax gradient ops have composite gradients of their own)
    "layer_norm_grad",
    "cross_entropy_grad",
}


def test_public_ops_have_a_kernel_and_a_rule():
    public = {name for family in FAMILIES for name in family.__all__}
    assert public <= set(dt.ops.__all__) and all(hasattr(dt, name) for name in public)
    # numpy's aliases are the functions of the names they alias (dt.acos is dt.arccos);
    # numpy's integer and bitwise ufuncs, fmod, float_power and ldexp have kernels and rules
    # of their own, tested on their domains by tests/test_ufuncs.py
    for alias, name in elementwise.ALIASES.items():
        assert getattr(dt, alias) is getattr(dt, name), alias
    for name, op in elementwise.NUMPY_ONLY_OPS.items():
        assert isinstance(op, Op) and get_rule(op.rule) is not None, name
    public -= {*elementwise.ALIASES, *elementwise.NUMPY_ONLY}
    # the gufuncs: numpy's ufunc protocol runs dt.einsum (tests/test_ufuncs.py)
    public -= {"vecdot", "matvec", "vecmat"}
    table = val.op_table()
    kernel = {name for name in public if isinstance(table.get(name), Op)}
    rule = {name for name in kernel if get_rule(table[name].rule) is not None}
    assert public - kernel == COMPOSITE
    assert kernel - rule == set()
    assert set(val.known_ops()) == public  # the validator has examples for every one


def test_every_rule_op_has_a_gradient_or_is_a_constant():
    ops = set(registered_ops())
    both = set(autograd.GRADIENTS) & autograd.NOT_DIFFERENTIABLE
    assert not both, f"both a gradient and not differentiable: {sorted(both)}"
    missing = ops - set(autograd.GRADIENTS) - autograd.NOT_DIFFERENTIABLE - NO_GRADIENT_BY_DESIGN
    assert not missing, f"ops with a rule but no gradient: {sorted(missing)}"
    stale = NO_GRADIENT_BY_DESIGN & (set(autograd.GRADIENTS) | autograd.NOT_DIFFERENTIABLE)
    assert not stale, f"remove from NO_GRADIENT_BY_DESIGN: {sorted(stale)}"


# -- the validator -------------------------------------------------------------------------
# The grids of tests/test_ops_*.py cover every op through dispatch; these validator runs add
# the rule check (the raw kernel on the rule's placements) for one op of each kind.
CLEAN = [
    "negative",
    "exp",
    "sign",
    "conjugate",
    "maximum",
    "less",
    "clip",
    "astype",
    "dot",
    "einsum",
    "outer",
    "sum",
    "max",
    "all",
    "argmax",
    "softmax",
]
BUGGY: dict[str, str] = {}  # op name -> reason, for rules known to be wrong (none now)


@pytest.mark.parametrize(
    "name",
    CLEAN
    + [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=r)) for n, r in BUGGY.items()],
)
def test_validator_finds_no_wrong_result(name):
    wrong = [str(f) for f in val.validate([name], k=2) if f.is_wrong]
    assert not wrong, "\n".join(wrong[:8])


def test_validator_three_ranks():
    wrong = [str(f) for f in val.validate(["maximum", "max"], k=3) if f.is_wrong]
    assert not wrong, "\n".join(wrong[:8])


@pytest.fixture
def swapped_rule(monkeypatch):
    """Install a rule for an op (and forget dispatch's cached decisions)."""
    monkeypatch.setattr(dispatch, "_cache", {})

    def swap(name, rule):
        monkeypatch.setitem(core._RULES, name, rule)

    return swap


def test_validator_catches_a_wrong_rule(swapped_rule):
    swapped_rule("exp", rules.pointwise_rule("negative"))  # claims exp is linear
    found = val.validate(["exp"], k=2)
    partial_sum = [f for f in found if f.placements == (PSUM,)]
    assert {f.kind for f in partial_sum} >= {"rule", "wrong"}
    assert not [f for f in found if f.is_wrong and not any(p.is_partial() for p in f.placements)]


def test_validator_catches_a_rule_dispatch_masks(swapped_rule):
    """A rule that asks Partial(max) for a Replicate input of abs and claims Partial(max) out:
    dispatch's local Replicate -> Partial(max) holds the value on every rank, where the claim
    happens to hold; on other Partial(max) values it does not (abs is not monotone)."""

    def rule(specs, mesh_shape, **kw):
        if specs[0].placements == (R,):
            return core.RuleResult(((PMAX,),), ((PMAX,),), (specs[0].shape,))
        return rules.pointwise_rule("abs")(specs, mesh_shape, **kw)

    swapped_rule("abs", rule)
    found = [f for f in val.validate(["abs"], k=2) if f.placements == (R,)]
    assert {f.kind for f in found if f.is_wrong} == {"rule"}


def test_validator_reports_over_communication(swapped_rule):
    def everything_replicate(specs, mesh_shape, **_):
        (spec,) = specs
        return core.RuleResult(((R,) * len(mesh_shape),), ((R,) * len(mesh_shape),), (spec.shape,))

    swapped_rule("negative", everything_replicate)
    found = val.validate(["negative"], k=2)
    assert found and not [f for f in found if f.is_wrong]
    shard = [f for f in found if f.placements == (S0,)]
    assert shard and "exact with 0, 0 B: (Shard(dim=0)) -> (Shard(dim=0))" in shard[0].detail
    lines = val.summarize(found)["negative"]
    assert lines[0].endswith("with 0 collective(s)")


def test_validator_cli(capsys, swapped_rule):
    assert val.main(["--ops", "negative,argmin", "--mesh", "2"]) == 0
    out = capsys.readouterr().out
    assert "negative" in out and "argmin" in out and out.rstrip().endswith("OK: 0 wrong result(s)")
    swapped_rule("exp", rules.pointwise_rule("negative"))
    assert val.main(["--ops", "exp", "--mesh", "3"]) == 1
    assert "FAIL" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no examples for"):
        val.validate(["no_such_op"])


def test_validator_runs_as_a_module():
    cmd = [sys.executable, "-m", "disttensor.spmd.validate", "--ops", "sign", "--mesh", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sign" in proc.stdout


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("kind", ["sum", "avg", "max", "min"])
@pytest.mark.parametrize("k", [2, 3])
def test_validator_splits_are_exact_and_asymmetric(kind, dtype, k):
    if kind == "avg" and np.dtype(dtype).kind != "f":
        pytest.skip("Partial(avg) needs floats")
    rng = np.random.default_rng(32)
    v = val.data((40,), dtype, rng, "small")
    parts = val.split_partial(v, kind, k, rng)
    assert_close(val.reduce_arrays(parts, kind), v, f"{kind} split", exact=True)
    if dtype != np.bool_:
        assert not np.array_equal(parts[0], parts[1])
    if kind in ("sum", "avg") and dtype == np.float64:  # not halves: 0.7/0.3-like weights
        assert not np.allclose(parts[0], parts[1])


def test_op_cases_on_simulated_ranks():
    """The SPMD cases that also run under mpiexec; with 3 ranks, ranks outside the smaller
    meshes skip the kernels and the gathers."""
    for case in op_cases.ALL:
        assert every_rank(dt.simulate(3, case, 3)) > 100
