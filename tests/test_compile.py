"""dt.compile (disttensor/capture.py, Note [Compiled steps]): a step replayed once two calls
record the same gives the eager step's values and collectives, on meshes (1), (2), (3), (4)
and (2, 2) with even, uneven and empty shards; a step a replay could get wrong stays eager
with its reason; ranks that replay different steps raise RanksDiverged. The grid runs on
simulated ranks and under mpiexec (``main``: ``mpiexec -n N python tests/test_compile.py``)."""

from __future__ import annotations

import inspect
import re
import sys
import warnings

import numpy as np
import pytest
from mpirun import ROOT, run

import disttensor as dt
from disttensor import capture

S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
STEPS = 8  # the inputs' remembered reductions settle over the first calls


# -- the steps: plain numpy (the demo's, and two of this file's) ---------------------------------
sys.path.insert(0, str(ROOT / "demos"))  # the demo's steps, as tests/test_numpy_algorithms.py
from numpy_algorithms import cg_step, kmeans_step, power_step, stencil_step  # noqa: E402


def logistic_step(X, y, w, lr):  # the demo's, with the learning rate an argument
    dw = X.T @ (1.0 / (1.0 + np.exp(-(X @ w))) - y) / X.shape[0]
    w -= lr * dw  # in place: the input itself is the result
    return {"w": w}


def writes_step(x, y):
    x += y
    x *= 0.5
    x -= y.mean()
    return {"x": x, "col": x.sum(axis=0) / x.max()}  # a max: not a sum's all-reduce


def mesh2d_step(X, W):
    Y = X @ W
    s = (Y * Y).sum()
    return {"Y": Y / s, "s": s}


def _spd(n: int) -> np.ndarray:
    m = np.random.default_rng(n).standard_normal((n, n))
    return m @ m.T + n * np.eye(n)


def _inputs(name: str, n: int) -> tuple[dict, dict]:
    """(global values, placements on a 1-D mesh) of case ``name`` of size ``n``."""
    g = np.random.default_rng(n)
    if name == "cg":
        A, b = _spd(n), g.standard_normal(n)
        return {"A": A, "x": np.zeros(n), "r": b, "p": b.copy(), "rs": b @ b}, {
            "A": [S0], "x": [S0], "r": [S0], "p": [S0], "rs": [R]
        }  # fmt: skip
    if name == "power":
        return {"A": _spd(n), "v": np.ones(n) / np.sqrt(n)}, {"A": [S0], "v": [R]}
    if name == "logistic":
        X = g.standard_normal((n, 3))
        y = (X @ [1.0, -2.0, 0.5] > 0).astype(float)
        return {"X": X, "y": y, "w": np.zeros(3), "lr": 0.5}, {"X": [S0], "y": [S0], "w": [R]}
    if name == "kmeans":
        X = np.concatenate([g.normal(c, 0.3, (n, 2)) for c in (-2, 0, 2)])
        return {"X": X, "centroids": X[[0, n, 2 * n]].copy()}, {"X": [S0], "centroids": [R]}
    if name == "stencil":
        u = np.zeros((n + 2, 5))
        u[0] = 1.0
        return {"u": u, "alpha": 0.2}, {"u": [S0]}
    if name == "writes":
        return {"x": g.standard_normal((n, 3)), "y": g.standard_normal((n, 3))}, {
            "x": [S0], "y": [S0]
        }  # fmt: skip
    raise KeyError(name)


STEP = {
    "cg": cg_step, "power": power_step, "logistic": logistic_step, "kmeans": kmeans_step,
    "stencil": stencil_step, "writes": writes_step, "mesh2d": mesh2d_step,
}  # fmt: skip
CASES = ["cg", "power", "logistic", "kmeans", "stencil", "writes"]
SIZES = (7, 3)  # uneven on 2, 3 and 4 ranks; 3 rows on 4 ranks leave one empty


def _place(values: dict, placements: dict, mesh) -> dict:
    return {
        k: dt.shard_tensor(v, mesh, placements[k]) if k in placements else v
        for k, v in values.items()
    }


def _call(step, state: dict) -> dict:
    """``state`` updated by ``step`` called with the entries its parameters name."""
    names = inspect.signature(step).parameters
    return {**state, **step(**{k: v for k, v in state.items() if k in names})}


def _run(step, state: dict) -> tuple[dict, list[int]]:
    """STEPS calls of ``step`` fed back their results: (the gathered state, per step the
    collectives it made)."""
    calls = []
    for _ in range(STEPS):
        with dt.CommCounter() as cc:
            state = _call(step, state)
        calls.append(cc.total)
    return {k: v.numpy() if isinstance(v, dt.DistTensor) else v for k, v in state.items()}, calls


def check_case(name: str, n: int, mesh) -> str:
    """'' where the compiled step matches the eager one (values, collectives per step) and
    replayed its steady steps; else what differs (collective)."""
    if name == "mesh2d":
        g = np.random.default_rng(n)
        values = {"X": g.standard_normal((n, 4)), "W": g.standard_normal((4, 6))}
        placements = {"X": [S0, R], "W": [R, S1]}
    else:
        values, placements = _inputs(name, n)
        placements = {k: p + [R] * (mesh.ndim - 1) for k, p in placements.items()}
    want, eager_calls = _run(STEP[name], _place(values, placements, mesh))
    step = dt.compile(STEP[name])
    got, calls = _run(step, _place(values, placements, mesh))
    problems = []
    for k, w in want.items():
        if not np.allclose(got[k], w, rtol=1e-12, atol=1e-12):
            problems.append(f"{k} differs by {np.max(np.abs(np.asarray(got[k]) - w))}")
    if calls[2:] != eager_calls[2:]:
        problems.append(f"collectives per step {calls} against eager {eager_calls}")
    if step.replays < 2:
        problems.append(f"{step.replays} replays of {STEPS} ({step.why})")
    return "; ".join(problems)


def _grid(world: int) -> list[tuple[str, int, object]]:
    meshes = [dt.ProcessMesh(list(range(world)))]
    if world == 4:
        meshes.append(dt.ProcessMesh([[0, 1], [2, 3]]))
    out = []
    for mesh in meshes:
        names = CASES + (["mesh2d"] if mesh.ndim == 2 else [])
        out += [(name, n, mesh) for name in names for n in SIZES]
    return out


def grid(world: int) -> list[str]:
    """Every case on every mesh of ``world`` ranks: what failed, named (collective)."""
    failed = []
    for name, n, mesh in _grid(world):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a refusal fails the case
            try:
                found = check_case(name, n, mesh)
            except RuntimeWarning as e:
                found = str(e)
        if found:
            failed.append(f"{name} n={n} mesh {mesh.shape}: {found}")
    return failed


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_compiled_steps_match_eager_simulated(world):
    """Meshes (1), (2), (3), (4), (2, 2); 7 and 3 rows (uneven, and an empty shard on 4)."""
    for failed in dt.simulate(world, grid, world, timeout=120):
        assert failed == [], failed


# -- the replay itself ---------------------------------------------------------------------------
def _on_two(name: str, n: int, fn):
    """(case ``name``'s inputs of size ``n`` on the mesh of ranks 0 and 1, ``fn`` compiled)."""
    values, placements = _inputs(name, n)
    return _place(values, placements, dt.ProcessMesh([0, 1])), dt.compile(fn)


def test_a_replayed_cg_step_makes_the_hand_written_collectives_and_one_check():
    def body():
        state, step = _on_two("cg", 8, cg_step)
        counts = []
        for _ in range(8):
            with dt.CommCounter() as cc:
                state = _call(step, state)
            counts.append((cc.total, cc.checks))
        return counts, step.replays, step.source

    counts, replays, source = dt.simulate(2, body)[0]
    assert replays >= 3
    assert counts[-3:] == [(3, 1)] * 3, counts  # the gather checked, the two sums bare
    assert source.count("_reduced(") == 2  # simulated ranks: the generic unchecked call


def test_a_scalar_argument_that_changes_records_again():
    def body():
        mesh = dt.ProcessMesh([0, 1])
        values, placements = _inputs("logistic", 9)
        a = _place(values, placements, mesh)
        b = _place(values, placements, mesh)
        step = dt.compile(logistic_step)
        for k in range(6):
            lr = 0.5 if k < 3 else 0.25
            logistic_step(a["X"], a["y"], a["w"], lr)
            step(b["X"], b["y"], b["w"], lr)
        return a["w"].numpy(), b["w"].numpy(), step.recordings

    want, got, recordings = dt.simulate(2, body)[0]
    np.testing.assert_array_equal(got, want)
    assert recordings >= 4  # two per value of lr


def test_new_inputs_of_other_specs_and_missing_reductions_run_right():
    """A program that reads ``rs``'s remembered reduction, called with a Partial ``rs`` that
    was never reduced, runs eagerly (and records again); another size records its own
    program; every call gives the eager values."""

    def body():
        mesh = dt.ProcessMesh([0, 1])
        step = dt.compile(cg_step)
        ok = []
        for n in (8, 5, 8):
            values, placements = _inputs("cg", n)
            state, ref = (_place(values, placements, mesh) for _ in range(2))
            for s in (state, ref):
                s["rs"] = s["r"] @ s["r"]  # Partial, not reduced
            for _ in range(5):
                state = _call(step, state)
                ref = _call(cg_step, ref)
                ok.append(all(np.allclose(state[k].numpy(), ref[k].numpy()) for k in ref))
        return ok, step.replays, step.recordings

    ok, replays, recordings = dt.simulate(2, body)[0]
    assert all(ok), ok
    assert replays >= 6 and recordings >= 6, (replays, recordings)


def _nan_step(x, fill):
    return {"y": np.where(x > 5, fill, x), "z": x + np.float64("nan")}


def test_nan_arguments_and_constants_replay():
    """NaN is not equal to itself: a NaN argument keys by its type, a NaN constant agrees."""

    def body():
        x = dt.shard_tensor(np.arange(8.0), dt.ProcessMesh([0, 1]), [S0])
        step = dt.compile(_nan_step)
        got = [step(x, float("nan")) for _ in range(5)]
        want = _nan_step(x, float("nan"))
        same = all(
            np.array_equal(g[k].numpy(), want[k].numpy(), equal_nan=True) for g in got for k in want
        )
        return same, step.replays

    same, replays = dt.simulate(2, body)[0]
    assert same and replays >= 3


def test_aliased_inputs_and_results_that_are_inputs():
    def body():
        mesh = dt.ProcessMesh([0, 1, 2])
        step = dt.compile(writes_step)
        x = dt.shard_tensor(np.arange(15.0).reshape(5, 3), mesh, [S0])
        y = dt.shard_tensor(np.ones((5, 3)), mesh, [S0])
        want = np.arange(15.0).reshape(5, 3)
        for _ in range(4):
            out = step(x, y)
            assert out["x"] is x
            want = (want + 1) * 0.5 - 1
        np.testing.assert_allclose(x.numpy(), want)
        z = x.copy()  # the same tensor twice: another key, recorded again
        out = step(z, z)
        return out["x"].numpy(), step.replays, (x.numpy() + x.numpy()) * 0.5

    got, replays, want = dt.simulate(3, body)[0]
    assert replays >= 2
    np.testing.assert_allclose(got, want - want.mean())


# -- what stays eager ---------------------------------------------------------------------------
def _data_to_python(x):
    return {"y": x * float(x.sum())}


def _prints(x):
    print(x)
    return {"y": x + 1}


def _gradient(w, x):
    return {"loss": (w * x).sum()}


def _barrier(x):
    dt.barrier()
    return {"y": x + 1}


def _random_constant(x):
    return {"y": x + np.random.default_rng().standard_normal(x.shape[1])}


def _no_rule(x):
    return {"y": np.unwrap(x)}  # a function without a rule: the replicate fallback


REFUSED = [
    (_data_to_python, "hands a tensor's data to Python"),
    (_prints, "print hands a tensor's data to Python"),
    (_gradient, "a gradient to record"),
    (_barrier, "outside an op or a move"),
    (_random_constant, "no two recordings in a row agree"),
    (_no_rule, "has no rule"),
]


@pytest.mark.parametrize(("fn", "why"), REFUSED, ids=[f.__name__ for f, _ in REFUSED])
def test_a_step_a_replay_could_get_wrong_stays_eager(fn, why, capsys):
    def body():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(np.arange(12.0).reshape(4, 3), mesh, [S0])
        w = dt.shard_tensor(np.ones((4, 3)), mesh, [R], requires_grad=True)
        step = dt.compile(fn, warn=False)  # warnings are per process, not per simulated rank
        args = (w, x) if fn is _gradient else (x,)
        got = [step(*args) for _ in range(8)]
        want = fn(*args)
        same = all(
            np.allclose(g[k].numpy(), want[k].numpy()) for g in got for k in want
        ) if fn is not _random_constant else True  # fmt: skip
        return step.replays, step.why, same

    for replays, reason, same in dt.simulate(2, body):
        assert replays == 0 and same
        assert why in reason, reason


def test_a_refusal_warns_once_with_its_reason():
    def body():
        x = dt.shard_tensor(np.arange(4.0), dt.ProcessMesh([0]), [S0])
        step = dt.compile(_data_to_python)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(4):
                step(x)
        return [str(c.message) for c in caught if c.category is RuntimeWarning]

    caught = dt.simulate(1, body)[0]
    assert len(caught) == 1 and "hands a tensor's data to Python" in caught[0], caught


def _normed(x, g, b):
    return {"loss": (dt.layer_norm(x, g, b, begin_norm_axis=1) ** 2).sum()}  # a saving kernel


def test_a_step_that_records_a_gradient_stays_eager_with_its_gradients():
    """The recording call itself builds the graph right (a saving kernel's saved values
    included); without a gradient the same step replays, its kernel's saved values dropped."""

    def body():
        mesh = dt.ProcessMesh([0, 1])
        data = np.random.default_rng(0).standard_normal((6, 4))
        x = dt.shard_tensor(data, mesh, [S0])
        g = dt.shard_tensor(np.linspace(0.5, 1.5, 4), mesh, [R], requires_grad=True)
        b = dt.shard_tensor(np.zeros(4), mesh, [R], requires_grad=True)
        step = dt.compile(_normed, warn=False)
        grads = []
        for _ in range(3):
            step(x, g, b)["loss"].backward()
            grads.append(g.grad.numpy().copy())
            g.grad = None
        _normed(x, g, b)["loss"].backward()
        want, why = g.grad.numpy(), step.why
        with dt.no_grad():
            values = [step(x, g, b)["loss"].numpy() for _ in range(4)]
            ref = _normed(x, g, b)["loss"].numpy()
        return grads, want, why, values, ref, step.replays

    grads, want, why, values, ref, replays = dt.simulate(2, body)[0]
    for got in grads:
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert "a gradient to record" in why
    assert replays >= 1 and all(np.allclose(v, ref, rtol=1e-12) for v in values)


def test_under_explain_a_compiled_step_runs_its_ops():
    def body():
        state, step = _on_two("power", 6, power_step)
        for _ in range(6):
            state = _call(step, state)
        replays = step.replays
        report = dt.explain(step, state["A"], state["v"])
        return replays, step.replays, report.counts

    before, after, counts = dt.simulate(2, body)[0]
    assert before >= 2 and after == before, (before, after)
    assert counts.get("all_gather") == 1 and counts.get("all_reduce") == 1, counts


def test_programs_per_function_are_bounded():
    def body():
        mesh = dt.ProcessMesh([0])
        step = dt.compile(lambda x: {"y": x * 2})
        for n in range(1, capture.MAX_PROGRAMS + 6):
            x = dt.shard_tensor(np.ones(n), mesh, [S0])
            for _ in range(3):
                step(x)
        return sum(len(s.programs) for s in step._states.values())

    assert dt.simulate(1, body)[0] == capture.MAX_PROGRAMS


def test_recordings_kept_per_function_are_bounded(monkeypatch):
    monkeypatch.setattr(capture, "MAX_KEYS", 8)

    def body():
        mesh = dt.ProcessMesh([0])
        step = dt.compile(lambda x: {"y": x * 2})
        for n in range(1, 30):  # a new shape every call: recorded once each, never replayed
            step(dt.shard_tensor(np.ones(n), mesh, [S0]))
        state = next(iter(step._states.values()))
        return len(state.last), len(state.tries), step.replays

    last, tries, replays = dt.simulate(1, body)[0]
    assert last <= 8 and tries <= 8 and replays == 0


# -- ranks that replay different steps ------------------------------------------------------------
def diverging(n: int = 6) -> str:
    """Both ranks replay ``power_step`` (of ``n`` unknowns: 7 gathers unequal parts); then
    rank 1 replays a step of the same collectives where rank 0 replays ``power_step`` again,
    and later rank 1 runs ``power_step`` op by op where rank 0 replays it: RanksDiverged on
    both each time (collective)."""
    mesh = dt.ProcessMesh([0, 1])

    def other_step(A, v):  # the same collectives, of another tensor
        return power_step(A, 2 * v)

    values, placements = _inputs("power", n)
    state = _place(values, placements, mesh)
    step, other = dt.compile(power_step), dt.compile(other_step)
    for _ in range(4):
        state = _call(step, state)
    for _ in range(4):
        _call(other, _place(values, placements, mesh))  # replays on both ranks
    found = []
    for on_one in (other, power_step):
        state = _call(step, state)
        try:
            _call(step if dt.get_rank() == 0 else on_one, state)
            found.append("no error")
        except dt.RanksDiverged:
            found.append("RanksDiverged")
    return ",".join(found)


def test_ranks_replaying_different_steps_raise_ranks_diverged():
    assert dt.simulate(2, diverging, timeout=30) == ["RanksDiverged,RanksDiverged"] * 2


def batched_step(X, W):
    return {"Y": X @ W}  # a stack of matrices: np.matmul, not np.dot


def _called(step) -> set:
    """The numpy matrix products this rank's programs of ``step`` call."""
    found = set()
    for state in step._states.values():
        for programs in state.programs.values():
            for p in programs:
                found |= {
                    f.__name__ for f in p.flat.__globals__.values() if f in (np.dot, np.matmul)
                }
    return found


def test_a_replay_calls_the_product_the_eager_kernel_calls():
    """matmul's kernel computes float vectors' and matrices' products with np.dot and
    stacks with np.matmul; a replay calls the same: the eager step's values exactly."""

    def body():
        mesh = dt.ProcessMesh([0, 1])
        values, placements = _inputs("cg", 9)
        state, ref = (_place(values, placements, mesh) for _ in range(2))
        step = dt.compile(cg_step)
        for _ in range(STEPS):
            state, ref = _call(step, state), _call(cg_step, ref)
        same = all(np.array_equal(state[k].numpy(), ref[k].numpy()) for k in ref)
        g = np.random.default_rng(1)
        X = dt.shard_tensor(g.standard_normal((4, 3, 5)), mesh, [S0])
        W = dt.shard_tensor(g.standard_normal((5, 2)), mesh, [R])
        batched = dt.compile(batched_step)
        Y = [batched(X, W)["Y"].numpy() for _ in range(4)]
        return same, _called(step), _called(batched), Y, (X @ W).numpy(), step.replays

    same, cg_calls, stack_calls, Y, want, replays = dt.simulate(2, body)[0]
    assert same and replays >= 3
    assert cg_calls == {"dot"} and stack_calls == {"matmul"}, (cg_calls, stack_calls)
    for y in Y:
        np.testing.assert_array_equal(y, want)


# -- how a compiled step is called ---------------------------------------------------------------
def scaled_step(x, y, scale=2.0):
    return {"z": x * scale + y}


def test_calls_by_name_and_by_position_share_one_program():
    """A step's parameters bind as the step binds them, so keyword and positional calls are
    one key (a default is its value); another value of a parameter records again."""

    def body():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(np.arange(7.0), mesh, [S0])
        y = dt.shard_tensor(np.ones(7), mesh, [S0])
        step = dt.compile(scaled_step)
        calls = [
            lambda: step(x, y),
            lambda: step(x=x, y=y),
            lambda: step(y=y, x=x),
            lambda: step(x, y, 2.0),
            lambda: step(x, y=y, scale=2.0),
        ]
        got = [c()["z"].numpy() for c in calls * 2]
        before = step.recordings
        other = [step(x, y, scale=3.0)["z"].numpy() for _ in range(4)]
        return got, other, before, step.recordings, step.replays

    got, other, before, recordings, replays = dt.simulate(2, body)[0]
    for g in got:
        np.testing.assert_array_equal(g, np.arange(7.0) * 2.0 + 1)
    for g in other:
        np.testing.assert_array_equal(g, np.arange(7.0) * 3.0 + 1)
    assert before == 2 and recordings == 4, (before, recordings)  # two per value of scale
    assert replays == 10 - 2 + 4 - 2, replays


def test_a_call_that_does_not_bind_raises_the_steps_own_error():
    step = dt.compile(scaled_step)
    with pytest.raises(TypeError, match=r"^scaled_step\(\) missing 1 required positional argument"):
        step(1.0)
    with pytest.raises(TypeError, match=r"^scaled_step\(\) got an unexpected keyword argument 'w'"):
        step(1.0, 2.0, w=3)
    assert str(inspect.signature(step)) == "(x, y, scale=2.0)"


def star_step(*xs, scale=1.0):
    return {"z": xs[0] * scale + xs[1]}


def test_a_step_of_any_signature_compiles():
    """Variadic and keyword-only parameters: the general call, keys by position and name."""

    def body():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(np.arange(5.0), mesh, [S0])
        step = dt.compile(star_step)
        got = [step(x, x, scale=0.5)["z"].numpy() for _ in range(5)]
        return got, step.replays, type(step) is capture.Compiled

    got, replays, generic = dt.simulate(2, body)[0]
    for g in got:
        np.testing.assert_array_equal(g, np.arange(5.0) * 1.5)
    assert replays == 3 and generic


# -- under mpiexec -----------------------------------------------------------------------------
LINE = re.compile(r"^COMPILE (\S+) (.*)$", re.M)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_compiled_steps_under_mpiexec(n):
    code, out = run(n, ["tests/test_compile.py"], timeout=120, env={"DISTTENSOR_TIMEOUT": "20"})
    assert code == 0, out[-4000:]
    found = dict(LINE.findall(out))
    assert found.get("grid") == "OK", out[-4000:]
    assert found.get("checkoff") == "0,1,2,True", out[-4000:]  # two recordings, then replays
    if n == 2:
        assert found.get("diverged") == ",".join(["RanksDiverged"] * 4), out[-4000:]
        assert found.get("compares") == "0", out[-4000:]


def _slow_compares() -> int:
    """The headers compared one by one (``MPIComm._compare``) in replays of a cg step whose
    gather has unequal parts (7 rows), on two ranks: none, each rank's own payload size is
    the one its header says (``Planned.sizes``)."""
    from disttensor.comm import mpi

    values, placements = _inputs("cg", 7)
    state = _place(values, placements, dt.ProcessMesh([0, 1]))
    step = dt.compile(cg_step)
    for _ in range(STEPS):
        state = _call(step, state)
    compare, calls = mpi.MPIComm._compare, []
    mpi.MPIComm._compare = staticmethod(lambda heads, fp: calls.append(1) or compare(heads, fp))
    try:
        replays = step.replays
        for _ in range(4):
            state = _call(step, state)
        assert step.replays == replays + 4
    finally:
        mpi.MPIComm._compare = staticmethod(compare)
    return len(calls)


def _checks_off() -> str:
    """A cg step replayed with the check off (every collective bare: no checks), then on
    again (the setting is part of the key: it records again, and its replays check once):
    "checks off,checks on,recordings after,values equal" (collective)."""
    from disttensor.comm import agree

    values, placements = _inputs("cg", 7)
    mesh = dt.ProcessMesh(list(range(dt.get_world_size())))
    state, ref = (_place(values, placements, mesh) for _ in range(2))
    step = dt.compile(cg_step)
    prev = agree.set_checks(False)
    try:
        for _ in range(STEPS):
            state, ref = _call(step, state), _call(cg_step, ref)
        with dt.CommCounter() as off:
            state, ref = _call(step, state), _call(cg_step, ref)
        replays = step.replays
    finally:
        agree.set_checks(*prev)
    recordings = step.recordings
    for _ in range(4):
        with dt.CommCounter() as on:
            state = _call(step, state)
        ref = _call(cg_step, ref)
    same = all(np.allclose(state[k].numpy(), ref[k].numpy(), rtol=1e-12) for k in ref)
    assert replays >= 3 and step.replays >= replays + 2
    return f"{off.checks},{on.checks},{step.recordings - recordings},{same}"


def main() -> None:
    world = dt.get_world_size()
    failed = grid(world)
    verdict = "OK" if not failed else " | ".join(failed)
    if dt.get_rank() == 0:
        print(f"COMPILE grid {verdict}", flush=True)
    if world == 2:
        found = ",".join(diverging(n) for n in (6, 7))
        if dt.get_rank() == 0:
            print(f"COMPILE diverged {found}", flush=True)
        slow = _slow_compares()
        if dt.get_rank() == 0:
            print(f"COMPILE compares {slow}", flush=True)
    off = _checks_off()
    if dt.get_rank() == 0:
        print(f"COMPILE checkoff {off}", flush=True)
    sys.exit(0 if not failed else 1)


if __name__ == "__main__":
    main()
