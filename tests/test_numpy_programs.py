"""The plain numpy programs of demos/numpy_programs.py, run unchanged on DistTensors.

Each program runs on numpy arrays and with its inputs sharded (every layout the demo lists),
and must give numpy's results: under real ``mpiexec`` on 1 to 4 ranks (the demo checks
itself and exits 1 on a mismatch), and in-process on simulated ranks (``dt.simulate``), the
fast way to debug one. Per program, a statement mirrored from it shows a communication
property that must hold: the ReLU mask write and in-place updates by replicated values make
no collective, the plate's edges are written with none, logistic regression's gradient is
reduced once per step, k-means' assignment step and power iteration's first product are local.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import numpy as np
import pytest
from mpirun import ROOT, run

import disttensor as dt


def _load_demo():
    path = ROOT / "demos" / "numpy_programs.py"
    spec = importlib.util.spec_from_file_location("numpy_programs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


npg = _load_demo()
PROGRAMS = {p.name: p for p in npg.PROGRAMS}
DEMO = "demos/numpy_programs.py"
ALL_OK = "OK: every program matches numpy"


def layout(program: str, name: str):
    return next(x for x in PROGRAMS[program].layouts if x.name == name)


def verdicts(out: str) -> dict[tuple[str, str], tuple[str, str]]:
    """The demo's per-run lines as (program, layout) -> (OK or MISMATCH, collectives)."""
    found = {}
    for program in npg.PROGRAMS:
        for lay in program.layouts:
            line = re.compile(
                rf"^{re.escape(program.name)}\s+{re.escape(lay.name)}\s+(OK|MISMATCH)\s.*"
                r"collectives: (.*)$",
                re.M,
            )
            hit = line.search(out)
            if hit is not None:
                found[program.name, lay.name] = (hit.group(1), hit.group(2))
    return found


# -- under mpiexec ---------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_demo_under_mpiexec(n):
    """Every program, every layout, OK; only rank 0 prints; one rank communicates nothing."""
    code, out = run(n, [DEMO], timeout=120)
    assert code == 0, out
    assert out.count(ALL_OK) == 1, out
    assert "MISMATCH" not in out, out
    found = verdicts(out)
    want = {(p.name, lay.name) for p in npg.PROGRAMS for lay in p.layouts}
    assert set(found) == want, out
    assert all(verdict == "OK" for verdict, _ in found.values()), out
    if n == 1:
        assert all(comm == "none" for _, comm in found.values()), out


@pytest.mark.mpi
def test_demo_fails_loudly_on_a_mismatch():
    """--perturb (hidden) changes one rank's shard of an input: every program must report
    MISMATCH on rank 0 and the job exit 1 (every rank agrees, no hang)."""
    code, out = run(2, [DEMO, "--perturb", "--only", "logistic_regression"], timeout=60)
    assert code == 1, out
    assert ALL_OK not in out, out
    assert "MISMATCH: a sharded run differs from numpy" in out, out
    found = verdicts(out)
    assert {v for v, _ in found.values()} == {"MISMATCH"} and len(found) == 2, out


# -- simulated ranks -------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_program_simulated(program, n):
    """The demo's own check, in-process: each layout equals numpy on every rank, and every
    rank made the same collectives (none on one rank)."""
    prog = PROGRAMS[program]
    for lay in prog.layouts:
        results = dt.simulate(n, npg.check, prog, lay, timeout=60)
        for rank, (worst, diffs, _, _) in enumerate(results):
            assert worst <= npg.TOLERANCE, (lay.name, rank, diffs)
        counts = [c for _, _, c, _ in results]
        collectives = [{k: v for k, v in c.items() if k != "send"} for c in counts]
        assert all(c == collectives[0] for c in collectives), (lay.name, counts)
        if n == 1:
            assert counts[0] == {}, (lay.name, counts)


def counted(fn):
    """Run ``fn()`` under a CommCounter; returns (its result, the counts)."""
    with dt.CommCounter() as cc:
        result = fn()
    return result, dict(cc.counts)


# -- two_layer_net -----------------------------------------------------------------------------
def _two_layer_net_step(layout_name: str) -> dict:
    """One training step of ``two_layer_net``, statement by statement, on the program's inputs
    sharded as the layout says; the ReLU mask write and the updates counted on their own."""
    a = npg.shard_inputs(PROGRAMS["two_layer_net"], layout("two_layer_net", layout_name))
    X, y, W1, b1, W2, b2 = (a[k] for k in ("X", "y", "W1", "b1", "W2", "b2"))
    num_examples, step_size, reg = X.shape[0], 1.0, 1e-3
    hidden = np.maximum(0, np.dot(X, W1) + b1)
    scores = np.dot(hidden, W2) + b2
    exp_scores = np.exp(scores - np.max(scores, axis=1, keepdims=True))
    dscores = exp_scores / np.sum(exp_scores, axis=1, keepdims=True)
    dscores[np.arange(num_examples), y] -= 1
    dscores /= num_examples
    dW2 = np.dot(hidden.T, dscores)
    db2 = np.sum(dscores, axis=0, keepdims=True)
    dhidden = np.dot(dscores, W2.T)
    before = dhidden.placements

    def mask():
        dhidden[hidden <= 0] = 0

    out = {"mask": counted(mask)[1], "mask placements": (before, dhidden.placements)}
    out["dhidden"] = np.asarray(dhidden)
    dW1 = np.dot(X.T, dhidden)
    db1 = np.sum(dhidden, axis=0, keepdims=True)
    grad_placements = dW2.placements

    def regularize():
        nonlocal dW2, dW1
        dW2 += reg * W2
        dW1 += reg * W1

    out["regularize"] = counted(regularize)[1]
    out["regularized placements"] = (grad_placements, dW2.placements)
    params = (W1, b1, W2, b2)
    placements = [p.placements for p in params]
    updates = []
    for param, grad in zip(params, (dW1, db1, dW2, db2)):

        def update(param=param, grad=grad):
            param += -step_size * grad

        partial = any(q.is_partial() for q in grad.placements)
        updates.append((partial, counted(update)[1]))
    out["updates"] = updates
    out["param placements"] = (placements, [p.placements for p in params])

    def decay():
        for param in params:
            param *= 1 - step_size * reg  # weight decay: replicated by replicated

    out["decay"] = counted(decay)[1]
    out["params"] = [np.asarray(p) for p in params]
    return out


def _two_layer_net_step_numpy() -> dict:
    a = PROGRAMS["two_layer_net"].inputs()
    X, y, W1, b1, W2, b2 = (a[k] for k in ("X", "y", "W1", "b1", "W2", "b2"))
    num_examples, step_size, reg = X.shape[0], 1.0, 1e-3
    hidden = np.maximum(0, np.dot(X, W1) + b1)
    scores = np.dot(hidden, W2) + b2
    exp_scores = np.exp(scores - np.max(scores, axis=1, keepdims=True))
    dscores = exp_scores / np.sum(exp_scores, axis=1, keepdims=True)
    dscores[np.arange(num_examples), y] -= 1
    dscores /= num_examples
    dW2 = np.dot(hidden.T, dscores)
    db2 = np.sum(dscores, axis=0, keepdims=True)
    dhidden = np.dot(dscores, W2.T)
    dhidden[hidden <= 0] = 0
    dW1 = np.dot(X.T, dhidden) + reg * W1
    db1 = np.sum(dhidden, axis=0, keepdims=True)
    dW2 += reg * W2
    params = [W1, b1, W2, b2]
    for param, grad in zip(params, (dW1, db1, dW2, db2)):
        param += -step_size * grad
        param *= 1 - step_size * reg
    return {"dhidden": dhidden, "params": params}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("layout_name", ["rows", "dp x mp"])
def test_two_layer_net_writes(layout_name, n):
    """``dhidden[hidden <= 0] = 0`` makes no collective (the mask and the target lie alike)
    and keeps dhidden's layout; ``dW += reg * W`` (a replicated value into a Partial gradient)
    and weight decay ``W *= 1 - lr * reg`` (replicated into replicated) make none; the update
    ``W += -lr * dW`` is one all-reduce by a Partial gradient (data parallel), none by
    another, and leaves the parameter as it was placed. The values equal numpy's."""
    want = _two_layer_net_step_numpy()
    for rank, got in enumerate(dt.simulate(n, _two_layer_net_step, layout_name)):
        assert got["mask"] == {}, (rank, got["mask"])
        assert got["mask placements"][0] == got["mask placements"][1]
        assert got["regularize"] == {}, (rank, got["regularize"])
        assert got["regularized placements"][0] == got["regularized placements"][1]
        assert got["decay"] == {}, (rank, got["decay"])
        for partial, counts in got["updates"]:
            assert counts == ({"all_reduce": 1} if partial else {}), (rank, got["updates"])
        if layout_name == "rows":  # data parallel: every gradient is Partial
            assert all(partial for partial, _ in got["updates"])
        assert got["param placements"][0] == got["param placements"][1]
        np.testing.assert_allclose(got["dhidden"], want["dhidden"], rtol=0, atol=1e-15)
        for g, w in zip(got["params"], want["params"]):
            np.testing.assert_allclose(g, w, rtol=1e-12)


# -- heat_diffusion ----------------------------------------------------------------------------
def _heat_edges(layout_name: str):
    prog = PROGRAMS["heat_diffusion"]
    u = npg.shard_inputs(prog, layout(prog.name, layout_name))["u"]
    placements = u.placements

    def edges():  # heat_diffusion's first statements
        u[0, :] = 100.0
        u[-1, :] = 0.0
        u[:, 0] = 50.0
        u[:, -1] = np.linspace(100.0, 0.0, u.shape[0])

    _, counts = counted(edges)
    after_edges = np.asarray(u)
    result = prog.fn(u)
    return counts, after_edges, placements, result["u"].placements, result["u"] is u


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("layout_name", ["rows", "blocks"])
def test_heat_edges_make_no_collective(layout_name, n):
    """Writing the plate's edges (scalars, a numpy row) makes no collective: each rank writes
    the part it holds. The plate is updated in place and keeps its layout."""
    want = np.zeros((23, 17))
    want[0, :], want[-1, :], want[:, 0] = 100.0, 0.0, 50.0
    want[:, -1] = np.linspace(100.0, 0.0, 23)
    for counts, after_edges, before, after, same in dt.simulate(n, _heat_edges, layout_name):
        assert counts == {}, counts
        np.testing.assert_array_equal(after_edges, want)
        assert before == after and same


# -- logistic_regression -----------------------------------------------------------------------
def _logistic(layout_name: str):
    prog = PROGRAMS["logistic_regression"]
    args = npg.shard_inputs(prog, layout(prog.name, layout_name))
    out, counts = counted(lambda: prog.fn(**args, steps=7))
    return counts, type(out["w"]), out["w"]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_logistic_regression_reduces_once_per_step(n):
    """Rows split, numpy weights: the forward pass and the gradient are local; ``w -= lr *
    dw`` writes the Partial gradient into the numpy array, one all-reduce per step and
    nothing else. ``w`` stays a numpy array, equal to numpy's."""
    prog = PROGRAMS["logistic_regression"]
    want = prog.fn(**prog.inputs(), steps=7)["w"]
    for counts, kind, w in dt.simulate(n, _logistic, "rows"):
        assert counts == {"all_reduce": 7}, counts
        assert kind is np.ndarray
        np.testing.assert_allclose(w, want, rtol=1e-12)


# -- kmeans ----------------------------------------------------------------------------------
def _kmeans_assign():
    prog = PROGRAMS["kmeans"]
    a = npg.shard_inputs(prog, layout(prog.name, "rows"))
    X, centroids = a["X"], a["centroids"]

    def assign():  # kmeans' assignment step
        distances = ((X[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
        return np.argmin(distances, axis=1)

    labels, counts = counted(assign)
    return counts, labels.placements, np.asarray(labels)


@pytest.mark.parametrize("n", [2, 4])
def test_kmeans_assignment_is_local(n):
    """Points split by rows, numpy centroids: distances and ``np.argmin`` make no collective
    and the labels stay split like the points."""
    a = PROGRAMS["kmeans"].inputs()
    want = np.argmin(((a["X"][:, None, :] - a["centroids"][None]) ** 2).sum(axis=2), axis=1)
    for counts, placements, labels in dt.simulate(n, _kmeans_assign):
        assert counts == {}, counts
        assert placements == [dt.Shard(0)]
        np.testing.assert_array_equal(labels, want)


# -- power_iteration ---------------------------------------------------------------------------
def _power_first_step():
    prog = PROGRAMS["power_iteration"]
    a = npg.shard_inputs(prog, layout(prog.name, "rows"))
    A, v = a["A"], a["v"]
    v, counts = counted(lambda: A @ v)
    placements = v.placements
    v /= np.linalg.norm(v)
    return counts, placements, v.placements, np.asarray(v)


@pytest.mark.parametrize("n", [2, 4])
def test_power_iteration_product_is_local(n):
    """Rows of A split, v numpy: ``A @ v`` makes no collective and is split like A's rows;
    ``v /= np.linalg.norm(v)`` keeps that layout."""
    a = PROGRAMS["power_iteration"].inputs()
    want = a["A"] @ a["v"]
    want /= np.linalg.norm(want)
    for counts, first, after, v in dt.simulate(n, _power_first_step):
        assert counts == {}, counts
        assert first == after == [dt.Shard(0)]
        np.testing.assert_allclose(v, want, rtol=1e-13)


# -- numpy functions that write into their argument ----------------------------------------------
# They must write into the DistTensor itself, not into a gathered copy (which would leave it
# unchanged on 2+ ranks, silently). E.g. CS231n's word-embedding backward,
# ``dW = np.zeros_like(W); np.add.at(dW, x, dout)``.
WRITING_FUNCTIONS = {
    "np.add.at": lambda x: np.add.at(x, ([0, 2, 2], [1, 1, 1]), 1.0),
    "np.copyto": lambda x: np.copyto(x, 7.0),
    "np.fill_diagonal": lambda x: np.fill_diagonal(x, 0.0),
    "np.put": lambda x: np.put(x, [0, 5], -1.0),
    "np.putmask": lambda x: np.putmask(x, x > 5, 0.0),
    "np.place": lambda x: np.place(x, x > 5, 0.0),
}


def _write_with(name: str) -> np.ndarray:
    mesh = dt.init_mesh((dt.get_world_size(),))
    x = dt.shard_tensor(np.arange(16.0).reshape(4, 4), mesh, [dt.Shard(0)])
    WRITING_FUNCTIONS[name](x)
    return np.asarray(x)


@pytest.mark.parametrize("name", list(WRITING_FUNCTIONS))
def test_numpy_functions_that_write_into_their_argument(name):
    want = np.arange(16.0).reshape(4, 4)
    WRITING_FUNCTIONS[name](want)
    for got in dt.simulate(2, _write_with, name):
        np.testing.assert_array_equal(got, want)


def _progress_line() -> str:
    mesh = dt.init_mesh((dt.get_world_size(),))
    loss = np.mean(dt.shard_tensor(np.arange(5.0), mesh, [dt.Shard(0)]))
    return f"iteration 0: loss {loss:.4f}"  # a format spec, as numpy 0-d arrays take


def test_a_scalar_result_formats_like_numpy():
    assert dt.simulate(2, _progress_line) == ["iteration 0: loss 2.0000"] * 2


# -- game_of_life ------------------------------------------------------------------------------
def _life(layout_name: str):
    prog = PROGRAMS["game_of_life"]
    a = npg.shard_inputs(prog, layout(prog.name, layout_name))
    with dt.CommCounter() as cc:
        out = prog.fn(**a, steps=3)
    return cc.counts, cc.bytes, out["board"].placements, out["board"].numpy()


@pytest.mark.parametrize("n", [2, 3, 4])
def test_game_of_life_stays_split_with_halo_traffic(n):
    """The board keeps its row split through every generation, and each generation moves
    only halo rows: np.roll by one row sends one row to each neighbour (8 rolls, 3 of them
    along the split axis each generation), far less than the board."""
    prog = PROGRAMS["game_of_life"]
    want = prog.fn(**prog.inputs(), steps=3)["board"]
    board = prog.inputs()["board"]
    for counts, nbytes, placements, got in dt.simulate(n, _life, "rows"):
        assert set(counts) <= {"send"}, counts
        assert sum(nbytes.values()) <= 3 * 6 * board.shape[1] * 8, nbytes  # rows of int64 at most
        assert list(placements) == [dt.Shard(0)], placements
        np.testing.assert_array_equal(got, want)
