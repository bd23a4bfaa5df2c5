"""numpy algorithms that communicate like hand-written MPI.

    mpiexec -n N python demos/numpy_algorithms.py [--only NAME] [--rounds 40]   (N = 1 to 4)

Seven textbook algorithms, written in plain numpy (``np.linalg.norm``, ``np.argmin``, ``@``,
``np.cov``, ``np.linalg.eigh``, slicing, ``np.exp``, ...), run unchanged on numpy arrays and
with their data sharded over every rank (``dt.shard_tensor`` on a 1-D mesh):

- ``kmeans``: Lloyd's iterations, the points split by rows (Shard(0)), the centroids numpy;
  the new centroids are one-hot sums ``onehot.T @ X`` over counts;
- ``pca``: ``np.cov`` of row-split observations, ``np.linalg.eigh`` of the small D x D
  covariance, the projection of the rows onto the leading components (signs fixed by each
  component's largest entry);
- ``stencil``: a 2-D explicit diffusion step on a plate split by rows, ``u[1:-1, 1:-1]``
  updated in place from shifted slices; the plate has 37 rows (see below);
- ``cg``: conjugate gradient on a row-split SPD matrix with every vector split like its rows
  (Shard(0)), so the product ``A @ p`` gathers p, as the textbook distributed CG does; 61
  unknowns, and 256 (where ops cost less next to numpy's work on the larger arrays);
- ``power``: power iteration ``w = A @ v; lam = v @ w; v = w / np.linalg.norm(w)`` on a
  row-split symmetric matrix, v a numpy vector at the start (then split like w);
- ``logistic``: batch gradient descent for logistic regression, ``dw = X.T @ (sigmoid(X @ w)
  - y) / n; w -= lr * dw``, the data split by rows and the weights replicated (a numpy ``w``
  would be written in place from a DistTensor: outside the SPMD rules, a fallback);
- ``gpt2``: a GPT-2-style forward (token lookup ``wte[ids]``, layer norm, causal
  self-attention with a numpy softmax, a GELU MLP, tied logits ``x @ wte.T``), the batch
  split over the ranks ("batch"), or Megatron-style ("megatron": the vocabulary, the heads
  and the MLP's hidden units split).

Each program is an iteration (``*_step``) between a start and a finish. Every rank runs it
three ways: on numpy arrays, on DistTensors, and as the hand-written mpi4py version of the
same algorithm (demos/_handwritten_mpi.py). Checked on every rank: both distributed results
equal numpy's (float64, 1e-10 relative to each result's largest value); dt took no fallback
(``dt.fallback_report()`` stays empty); the hand-written bytes equal their formula; dt's
bytes per iteration (bytes sent per rank, the worst iteration, measured with
``dt.CommCounter``; the small agreement checks before collectives are not data and are left
out) are at most twice the hand-written ones, and so are the whole run's.

The iterative programs (k-means, stencil, cg, power, logistic) are compared per iteration
too: the collectives dt makes (``dt.CommCounter``: each collective, each send) against the
hand-written version's calls that reach another rank, the most any iteration after the first
makes (the first also carries what the start left pending, such as a Partial it reduces),
checked equal; and the time per iteration of each (``--rounds`` runs of each, interleaved,
after a warm-up run: each iteration starts after a barrier, its time is the max over the
ranks, the median over the iterations after the first is shown with dt's ratio to the
hand-written time, which is reported, not checked). dt's time includes its agreement check
of each collective (it travels in the collective's own first message, Note [The check rides
along] in disttensor/comm/agree.py; ``DISTTENSOR_CHECK=0`` turns it off), counted beside the
collectives. Each iterative step also runs under ``dt.compile`` (recorded, then replayed
without dispatch's work around each op: Note [Compiled steps] in disttensor/capture.py):
checked to equal numpy's results with the eager step's collectives per iteration, and timed
as a third version (``comp``), the steps it replayed shown. A failed check exits 1 on every
rank.

Shifted slices of a split axis are split again by ``numpy.array_split`` over their own
length, so a stencil step moves just the halo rows when the interior's split boundaries sit
one row from the plate's: 37 rows does that on 1 to 4 ranks. A 36-row plate is listed as a
known case (``KNOWN``, shown but not failed): on 3 and 4 ranks dt sends 3.3 times the halo
exchange there, in up to 6 sends per step, not 2. k-means makes the hand-written single
all-reduce per iteration: its counts and sums are small Partial results reduced together (Note
[Small reductions ride together] in disttensor/tensor.py). The Megatron forward stays within 2x
(1.35x to 1.82x on 2 to 4 ranks) of Megatron's all-reduce of the activations after the
embedding, the attention and the MLP, by another route: the lookup in the vocabulary-split
table comes out split by batch (Note [Gathers by index] in disttensor/ops/indexing.py), and the
matmuls that follow gather weights and move activations between splits instead.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import _handwritten_mpi as hw
import numpy as np
from _handwritten_mpi import gelu, layer_norm, sigmoid, softmax  # plain numpy, shared with hw
from numpy_programs import logistic_inputs as logistic_data
from numpy_programs import power_inputs

import disttensor as dt

TOLERANCE = 1e-10  # float64, relative to each result's largest |value|
BOUND = 2.0  # dt may send at most this many times the hand-written bytes
# the goal for the compiled step's time per iteration on 2 ranks, against the hand-written
# version's, in these programs: printed with the timings (a benchmark's goal, not a check)
GOAL, GOAL_PROGRAMS = 1.5, ("cg", "power", "logistic", "kmeans")


# -- the programs: plain numpy -------------------------------------------------------------------
def kmeans_step(X, centroids):
    """One Lloyd iteration: nearest centroid, then each centroid the mean of its points."""
    k = centroids.shape[0]
    distances = np.linalg.norm(X[:, None, :] - centroids[None, :, :], axis=2)
    labels = np.argmin(distances, axis=1)
    onehot = (labels[:, None] == np.arange(k)[None, :]).astype(X.dtype)
    counts = onehot.sum(axis=0)
    sums = onehot.T @ X
    # an empty cluster keeps its centroid
    centroids = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], centroids)
    return {"centroids": centroids}


def kmeans_finish(X, centroids):
    distances = np.linalg.norm(X[:, None, :] - centroids[None, :, :], axis=2)
    labels = np.argmin(distances, axis=1)
    inertia = np.sum(np.min(distances, axis=1) ** 2)
    return {"centroids": centroids, "labels": labels, "inertia": inertia}


def pca(X, k):
    """The k leading principal components of the rows of X and the rows projected on them."""
    mean = X.mean(axis=0)
    cov = np.cov(X, rowvar=False)
    variances, vectors = np.linalg.eigh(cov)  # ascending
    variances, vectors = variances[::-1][:k], vectors[:, ::-1][:, :k]
    signs = np.sign(vectors[np.argmax(np.abs(vectors), axis=0), np.arange(k)])
    components = vectors * signs  # each component's largest entry positive
    projected = (X - mean) @ components
    return {"variances": variances, "components": components, "projected": projected}


def stencil_step(u, alpha=0.2):
    """One explicit diffusion step of the plate's interior, in place (the edges stay)."""
    u[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * (
        u[2:, 1:-1] + u[:-2, 1:-1] + u[1:-1, 2:] + u[1:-1, :-2] - 4 * u[1:-1, 1:-1]
    )
    return {"u": u}


def stencil_finish(u):
    return {"u": u, "mean": np.mean(u)}


def cg_start(A, b, x):
    r = b - A @ x
    return {"r": r, "p": r.copy(), "rs": r @ r}


def cg_step(A, x, r, p, rs):
    """One conjugate gradient iteration."""
    Ap = A @ p
    alpha = rs / (p @ Ap)
    x = x + alpha * p
    r = r - alpha * Ap
    rs_new = r @ r
    p = r + (rs_new / rs) * p
    return {"x": x, "r": r, "p": p, "rs": rs_new}


def cg_finish(A, b, x):
    return {"x": x, "residual": np.linalg.norm(b - A @ x)}


def power_step(A, v):
    """One power iteration: the Rayleigh quotient of v, then the next unit vector."""
    w = A @ v
    lam = v @ w
    v = w / np.linalg.norm(w)
    return {"v": v, "lam": lam}


def logistic_step(X, y, w, lr=0.5):
    """One step of batch gradient descent on the mean log loss, the weights in place."""
    dw = X.T @ (sigmoid(X @ w) - y) / X.shape[0]
    w -= lr * dw
    return {"w": w}


def logistic_finish(X, y, w):
    p = sigmoid(X @ w)
    np.clip(p, 1e-12, 1 - 1e-12, out=p)  # keep the logs finite
    loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    return {"w": w, "loss": loss, "accuracy": np.mean((p > 0.5) == y)}


def causal_self_attention(x, w, n_head):
    B, T, C = x.shape

    def heads(y):  # (B, T, C) -> (B, n_head, T, C // n_head)
        return y.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)

    q = heads(x @ w["w_q"] + w["b_q"])
    k = heads(x @ w["w_k"] + w["b_k"])
    v = heads(x @ w["w_v"] + w["b_v"])
    mask = np.triu(np.full((T, T), -1e10), k=1)  # no attention to later positions
    att = softmax(q @ k.swapaxes(-1, -2) / np.sqrt(C // n_head) + mask)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    return y @ w["w_o"] + w["b_o"]


def gpt2_forward(ids, wte, wpe, blocks, ln_f_g, ln_f_b, n_head):
    """Logits of a GPT-2-style model (pre-norm blocks, tied token embedding)."""
    x = wte[ids] + wpe[: ids.shape[1]]
    for w in blocks:
        x = x + causal_self_attention(layer_norm(x, w["ln1_g"], w["ln1_b"]), w, n_head)
        h = layer_norm(x, w["ln2_g"], w["ln2_b"])
        x = x + gelu(h @ w["w_fc"] + w["b_fc"]) @ w["w_proj"] + w["b_proj"]
    return {"logits": layer_norm(x, ln_f_g, ln_f_b) @ wte.T}


# -- their inputs (global arrays, the same on every rank) -------------------------------------
def kmeans_inputs() -> dict:
    rng = np.random.default_rng(10)
    centers = 5.0 * rng.standard_normal((5, 4))
    X = np.concatenate(
        [c + rng.standard_normal((n, 4)) for c, n in zip(centers, (41, 37, 45, 39, 41))]
    )
    X = X[rng.permutation(len(X))]  # 203 points: uneven shards on 2, 3 and 4 ranks
    return {"X": X, "centroids": X[:5].copy()}


def pca_inputs() -> dict:
    rng = np.random.default_rng(11)
    X = rng.standard_normal((157, 6)) @ rng.standard_normal((6, 6)) + rng.standard_normal(6)
    return {"X": X, "k": 3}


def plate(rows: int) -> Callable[[], dict]:
    """A plate of ``rows`` x 29 with fixed edges: hot top, cold bottom, a warm left edge and a
    right edge hot at the top and cold below."""

    def inputs() -> dict:
        u = np.zeros((rows, 29))
        u[0, :], u[-1, :], u[:, 0] = 100.0, 0.0, 40.0
        u[:, -1] = np.linspace(100.0, 0.0, rows)
        return {"u": u}

    return inputs


def cg_inputs(n: int = 61) -> dict:
    rng = np.random.default_rng(12)
    M = rng.standard_normal((n, n))
    return {"A": M @ M.T / n + np.eye(n), "b": rng.standard_normal(n), "x": np.zeros(n)}


def logistic_inputs() -> dict:
    """demos/numpy_programs.py's data (97 points, 6 features with a bias column), the weights
    zero."""
    data = logistic_data()
    return {**data, "w": np.zeros(data["X"].shape[1])}


GPT = {"vocab": 101, "dim": 48, "heads": 12, "seq": 16, "batch": 4, "layers": 2}


def gpt2_inputs() -> dict:
    """Token ids and the weights of a small GPT-2 (12 heads: they split evenly on 1-4 ranks)."""
    rng = np.random.default_rng(13)
    c, v, t = GPT["dim"], GPT["vocab"], GPT["seq"]

    def r(*shape):
        return 0.1 * rng.standard_normal(shape)

    def block() -> dict:
        w = {"ln1_g": 1 + r(c), "ln1_b": r(c)}
        for n in "qkv":
            w[f"w_{n}"], w[f"b_{n}"] = r(c, c), r(c)
        w.update(w_o=r(c, c), b_o=r(c), ln2_g=1 + r(c), ln2_b=r(c))
        w.update(w_fc=r(c, 4 * c), b_fc=r(4 * c), w_proj=r(4 * c, c), b_proj=r(c))
        return w

    return {
        "ids": rng.integers(0, v, (GPT["batch"], t)),
        "wte": r(v, c),
        "wpe": r(t, c),
        "blocks": [block() for _ in range(GPT["layers"])],
        "ln_f_g": 1 + r(c),
        "ln_f_b": r(c),
        "n_head": GPT["heads"],
    }


# -- the cases: program, layout, hand-written version -------------------------------------------
S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()


def _same(**state) -> dict:
    """The start or finish of a program that needs none."""
    return {}


@dataclass(frozen=True)
class Case:
    """A program with one layout. ``placements``: input name -> placements on the 1-D mesh of
    every rank (names inside ``blocks`` apply to every block); inputs not named stay numpy.
    ``known_over``: why dt sends more than BOUND times the hand-written bytes, where it is
    known to (a limit of the library, shown but not failed). ``hw_calls``: the formula of the
    hand-written version's communicating calls per iteration, for the iterative programs,
    whose collectives and time per iteration are compared; ``known_calls``: why dt makes more
    collectives per iteration than that, where it is known to."""

    name: str
    layout: str
    inputs: Callable[[], dict]
    placements: dict
    step: Callable[..., dict]
    steps: int
    handwritten: Callable[..., dict]
    hw_bytes: Callable[[dict, int, int], int]
    start: Callable[..., dict] = _same
    finish: Callable[..., dict] = _same
    known_over: str = ""
    hw_calls: Callable[[dict, int, int], int] | None = None
    known_calls: str = ""

    @property
    def label(self) -> str:
        return f"{self.name} [{self.layout}]"


MEGATRON = {
    "wte": [S0],  # vocabulary-parallel embedding and logits
    **{f"w_{n}": [S1] for n in "qkv"},  # column-parallel: the heads split
    **{f"b_{n}": [S0] for n in "qkv"},
    "w_o": [S0],  # row-parallel: a partial sum over the heads
    "w_fc": [S1],
    "b_fc": [S0],
    "w_proj": [S0],
}

CASES = (
    Case(
        "kmeans", "points by rows", kmeans_inputs, {"X": [S0]}, kmeans_step, 6,
        partial(hw.kmeans, steps=6), hw.kmeans_bytes, finish=kmeans_finish,
        hw_calls=hw.kmeans_calls,
    ),
    Case("pca", "observations by rows", pca_inputs, {"X": [S0]}, pca, 1, hw.pca, hw.pca_bytes),
    Case(
        "stencil", "rows, 37 x 29", plate(37), {"u": [S0]}, stencil_step, 20,
        partial(hw.stencil, steps=20), hw.stencil_bytes, finish=stencil_finish,
        hw_calls=hw.stencil_calls,
    ),
    Case(
        "stencil", "rows, 36 x 29", plate(36), {"u": [S0]}, stencil_step, 20,
        partial(hw.stencil, steps=20), hw.stencil_bytes, finish=stencil_finish,
        known_over=(
            "a slice of a split axis is split again by numpy.array_split over its own length; "
            "on 3 and 4 ranks the interior's boundaries (34 rows) sit 0 or 2 rows from the "
            "plate's (36), so each shifted slice and the write-back move 1-2 extra rows per "
            "boundary (7 rows per rank and step, not 2); 37 rows keeps them 1 row apart"
        ),
        hw_calls=hw.stencil_calls,
        known_calls=(
            "up to 6 sends per step on an inner rank of 3 or 4, where the halo exchange makes "
            "2: the cause of its bytes. Rows 1:-1 split over their own 34 do not line up with "
            "the plate's 36, so the four slices of rows 1:-1 (u[1:-1, 1:-1] twice, "
            "u[1:-1, 2:], u[1:-1, :-2]) fetch rows from a neighbour as u[2:, 1:-1] and "
            "u[:-2, 1:-1] do, and the write-back u[1:-1, 1:-1] = ... sends rows back: one "
            "send each, a slice taken twice fetched twice (each is a new tensor)"
        ),
    ),
    Case(
        "cg", "rows, Shard(0) vectors", cg_inputs, {"A": [S0], "b": [S0], "x": [S0]}, cg_step,
        12, partial(hw.cg, steps=12), hw.cg_bytes, start=cg_start, finish=cg_finish,
        hw_calls=hw.cg_calls,
    ),
    Case(
        "cg", "rows, 256 unknowns", partial(cg_inputs, 256), {"A": [S0], "b": [S0], "x": [S0]},
        cg_step, 12, partial(hw.cg, steps=12), hw.cg_bytes, start=cg_start, finish=cg_finish,
        hw_calls=hw.cg_calls,
    ),
    Case(
        "power", "rows of A, v numpy", power_inputs, {"A": [S0]}, power_step, 12,
        partial(hw.power, steps=12), hw.power_bytes, hw_calls=hw.power_calls,
    ),
    Case(
        "logistic", "rows, w replicated", logistic_inputs, {"X": [S0], "y": [S0], "w": [R]},
        logistic_step, 12, partial(hw.logistic, steps=12), hw.logistic_bytes,
        finish=logistic_finish, hw_calls=hw.logistic_calls,
    ),
    Case(
        "gpt2", "batch", gpt2_inputs, {"ids": [S0], "wte": [R]}, gpt2_forward, 1,
        hw.gpt2_batch, hw.gpt2_batch_bytes,
    ),
    Case(
        "gpt2", "megatron", gpt2_inputs, MEGATRON, gpt2_forward, 1, hw.gpt2_megatron,
        hw.gpt2_megatron_bytes,
    ),
)  # fmt: skip
ITERATIVE = tuple(c for c in CASES if c.hw_calls is not None)


# -- running ------------------------------------------------------------------------------------
_PARAMS: dict = {}


def _arguments(fn: Callable[..., dict], state: dict) -> dict:
    """The entries of ``state`` that ``fn``'s parameters name (looked up once per function)."""
    names = _PARAMS.get(fn)
    if names is None:
        names = _PARAMS[fn] = tuple(inspect.signature(fn).parameters)
    return {k: state[k] for k in names if k in state}


def _call(fn: Callable[..., dict], state: dict) -> dict:
    """``fn`` with the entries of ``state`` its parameters name."""
    return fn(**_arguments(fn, state))


def shard_inputs(case: Case) -> dict:
    """The case's inputs, those it names sharded on the 1-D mesh of every rank."""
    mesh = dt.init_mesh((dt.get_world_size(),), dim_names=["x"])

    def place(name, value):
        if isinstance(value, dict):
            return {k: place(k, v) for k, v in value.items()}
        if isinstance(value, list):
            return [place(name, v) for v in value]
        if name in case.placements:
            return dt.shard_tensor(value, mesh, case.placements[name])
        return value

    return {k: place(k, v) for k, v in case.inputs().items()}


def _global(value) -> np.ndarray:
    """A result's global value (collective for a DistTensor: ``numpy()``, never accounted)."""
    return value.numpy() if isinstance(value, dt.DistTensor) else np.asarray(value)


class _NoCounter:
    """Stands in for ``dt.CommCounter`` in the numpy run and the timed runs: nothing to
    count."""

    total = total_bytes = checks = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


class _Clock:
    """Times each step as bench/_timing.py times a call: started right after a barrier (on
    ``comm``, an mpi4py communicator apart from dt's), stopped when the step has returned
    and its results replaced the old state (freeing them is the loop's cost, as in a user's
    loop). ``times``: this rank's seconds of each step."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.times: list[float] = []

    def __enter__(self):
        self.comm.Barrier()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.times.append(time.perf_counter() - self._t0)


class Run(NamedTuple):
    """One rank's run of a case: the results (global values), the bytes, collectives and
    agreement checks of each step, the bytes of the whole run, and the calls that
    communicated outside an SPMD rule."""

    results: dict
    step_bytes: list
    total_bytes: int
    outside: dict
    step_calls: list
    step_checks: list


_COMPILED: dict = {}


def compiled(case: Case) -> Callable[..., dict]:
    """The case's step under ``dt.compile`` (one per case, kept: its programs too)."""
    hit = _COMPILED.get(case.label)
    if hit is None:
        hit = _COMPILED[case.label] = dt.compile(case.step)
    return hit


def _run(case: Case, state: dict, counter=_NoCounter, clock=None, step=None) -> Run:
    """Start, steps and finish on ``state`` (numpy arrays or DistTensors); ``counter``: a
    context manager class with ``total``, ``total_bytes`` and ``checks`` (``dt.CommCounter``);
    ``clock``: a _Clock that times each step; ``step``: the step to run (the case's)."""
    step = step or case.step
    per_step, calls, checks, names = [], [], [], set()
    clock = clock or contextlib.nullcontext()
    with counter() as whole:
        state = {**state, **_call(case.start, state)}
        for _ in range(case.steps):
            # the demo's own work (the counter, picking the step's arguments from the state)
            # outside the clock: it times the step and the state's update, freeing the old
            # values, as a user's loop does (the hand-written loop's clock times its body)
            with counter() as one:
                args = _arguments(step, state)
                with clock:
                    out = step(**args)
                    args = None
                    state.update(out)
            names |= set(out)
            per_step.append(one.total_bytes)
            calls.append(one.total)
            checks.append(one.checks)
        out = _call(case.finish, state)
        state.update(out)
        names |= set(out)
    outside = dict(getattr(whole, "fallbacks", {}))
    results = {k: _global(state[k]) for k in sorted(names)}  # every rank in the same order
    return Run(results, per_step, whole.total_bytes, outside, calls, checks)


def run_numpy(case: Case) -> dict:
    """The program on numpy arrays, in this process."""
    return _run(case, case.inputs()).results


def run_dt(case: Case, perturb: bool = False, step=None) -> Run:
    """The program on the case's sharded inputs (collective), counted on this rank.
    ``perturb``: add 1e-6 to the last rank's shard of the first sharded input (to see the
    check fail); ``step``: the step to run (the case's; ``compiled(case)``)."""
    args = shard_inputs(case)
    if perturb and dt.get_rank() == dt.get_world_size() - 1:
        first = next(k for k in args if isinstance(args[k], dt.DistTensor))
        args[first].to_local()[...] += 1e-6
    return _run(case, args, dt.CommCounter, step=step)


def run_handwritten(case: Case, comm) -> tuple[dict, list[int], int, list[int]]:
    """The hand-written mpi4py version (under mpiexec; ``comm``: an mpi4py communicator):
    results, bytes of each iteration and of the whole run on this rank, the communicating
    calls of each iteration."""
    counted = hw.Counted(comm)
    results = case.handwritten(counted, **case.inputs())
    per_iteration, total = counted.per_iteration()
    results = {k: np.asarray(v) for k, v in results.items()}
    return results, per_iteration, total, counted.calls_per_iteration()


def steady(per_iteration: list[int]) -> int:
    """Collectives per iteration: the most any iteration after the first makes. The first
    differs by what the start leaves (a Partial the first step reduces, a numpy input no
    iteration gathers) and the finish, not by the iteration."""
    return max(per_iteration[1:], default=0)


def time_case(case: Case, comm, rounds: int, warmup: int = 1) -> dict[str, np.ndarray]:
    """Seconds per iteration, dt's and the hand-written version's (collective, under
    mpiexec): ``warmup`` untimed runs of each, then ``rounds`` runs of each interleaved, the
    order swapped every round. Each iteration starts right after a barrier; its time is the
    max over the ranks; the first iteration of each run is left out (see ``steady``)."""
    from mpi4py import MPI

    def dt_run(step=None) -> list[float]:  # the step: the case's, or compiled(case)
        clock = _Clock(comm)
        _run(case, shard_inputs(case), clock=clock, step=step)
        return clock.times

    def hand_run() -> list[float]:
        timed = hw.Timed(comm)
        case.handwritten(timed, **case.inputs())
        return timed.times

    variants = {"dt": dt_run, "compiled": partial(dt_run, compiled(case)), "hand": hand_run}
    samples: dict[str, list] = {k: [] for k in variants}
    for r in range(warmup + rounds):
        for k in sorted(variants, reverse=r % 2 == 1):
            times = np.asarray(variants[k](), dtype=np.float64)
            comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
            if r >= warmup:
                samples[k].append(times[1:])
    return {k: np.concatenate(v) for k, v in samples.items()}


# -- checking -----------------------------------------------------------------------------------
def rel_diff(got, want) -> float:
    """max |got - want| / max |want| (absolute where want is all zeros); inf on a shape
    mismatch or a missing result."""
    if got is None:
        return float("inf")
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = float(np.abs(want).max(initial=0.0)) or 1.0
    return float(np.abs(got - want).max(initial=0.0)) / scale


def worst_diff(got: dict, want: dict) -> float:
    """The largest rel_diff over the results numpy gives (and none missing)."""
    return max((rel_diff(got.get(k), w) for k, w in want.items()), default=0.0)


def within(dt_bytes: int, hw_bytes: int, bound: float = BOUND) -> bool:
    """dt's bytes at most ``bound`` times the hand-written ones (none where those are none)."""
    return dt_bytes == 0 if hw_bytes == 0 else dt_bytes <= bound * hw_bytes


def ratio(dt_bytes: int, hw_bytes: int) -> float:
    """dt's bytes over the hand-written ones (1 where neither sends anything)."""
    if hw_bytes == 0:
        return 1.0 if dt_bytes == 0 else float("inf")
    return dt_bytes / hw_bytes


@dataclass
class Outcome:
    """One rank's checks of one case."""

    dt_diff: float
    hw_diff: float
    outside: dict  # dt's calls outside SPMD rules
    dt_iteration: int  # the worst step's bytes
    hw_iteration: int
    formula: int  # the hand-written bytes per iteration by the formula
    hw_iterations: list  # the measured bytes of each hand-written iteration
    dt_total: int
    hw_total: int
    dt_calls: list = field(default_factory=list)  # dt's collectives of each step
    hw_calls: list = field(default_factory=list)  # the hand-written calls of each iteration
    calls_formula: int | None = None  # the hand-written calls per iteration by the formula
    dt_checks: list = field(default_factory=list)  # dt's agreement checks of each step
    compiled_diff: float = 0.0  # the step under dt.compile: its results against numpy's,
    compiled_calls: list = field(default_factory=list)  # its collectives of each step,
    replayed: int = 0  # and how many of its steps were replays
    why: str = ""  # why it was not compiled

    def problems(self, case: Case, bound: float = BOUND) -> list[str]:
        """What failed on this rank ([] when everything holds); a known over-communication
        is not a failure."""
        out = []
        if not self.dt_diff <= TOLERANCE:
            out.append(f"MISMATCH: dt differs from numpy by {self.dt_diff:.2e}")
        if not self.compiled_diff <= TOLERANCE:
            out.append(
                f"MISMATCH: dt.compile's step differs from numpy by {self.compiled_diff:.2e}"
            )
        if not self.hw_diff <= TOLERANCE:
            out.append(f"MISMATCH: the hand-written version differs by {self.hw_diff:.2e}")
        if self.outside:
            out.append(f"FALLBACK: {self.outside}")
        if any(b != self.formula for b in self.hw_iterations):
            out.append(f"FORMULA: measured {self.hw_iterations}, formula {self.formula}")
        over = not (
            within(self.dt_iteration, self.hw_iteration, bound)
            and within(self.dt_total, self.hw_total, bound)
        )
        if over and not case.known_over:
            out.append(
                f"OVER: {self.dt_iteration} B per iteration ({self.dt_total} in all) against "
                f"{self.hw_iteration} ({self.hw_total}) hand-written"
            )
        return out

    def calls_differ(self) -> bool:
        return steady(self.dt_calls) != steady(self.hw_calls)

    def count_problems(self, case: Case) -> list[str]:
        """What failed in the collectives per iteration on this rank (an iterative case);
        dt making other than the hand-written count is a failure unless it is known."""
        out = []
        if any(c != self.calls_formula for c in self.hw_calls):
            out.append(f"FORMULA: calls measured {self.hw_calls}, formula {self.calls_formula}")
        if self.compiled_calls and steady(self.compiled_calls) != steady(self.dt_calls):
            out.append(
                f"CALLS: dt.compile's step makes {steady(self.compiled_calls)} collectives per "
                f"iteration ({self.compiled_calls}), the eager step {steady(self.dt_calls)}"
            )
        if self.calls_differ() and not case.known_calls:
            out.append(
                f"CALLS: dt makes {steady(self.dt_calls)} collectives per iteration "
                f"({self.dt_calls}), the hand-written version {steady(self.hw_calls)}"
            )
        return out


def check(case: Case, comm, perturb: bool = False) -> Outcome:
    """Run the case on numpy, dt and hand-written (collective, under mpiexec: ``comm`` is an
    mpi4py communicator of every rank). ``perturb``: add 1e-6 to dt's last rank's shard of
    the first sharded input, to see the check fail."""
    want = run_numpy(case)
    got = run_dt(case, perturb)
    hand, iterations, hw_total, hw_calls = run_handwritten(case, comm)
    size, rank = dt.get_world_size(), dt.get_rank()
    extra = {}
    if case in ITERATIVE:  # the step under dt.compile: the same values and collectives
        step = compiled(case)
        replays = step.replays
        cgot = run_dt(case, perturb, step)
        extra = dict(
            compiled_diff=worst_diff(cgot.results, want),
            compiled_calls=cgot.step_calls,
            replayed=step.replays - replays,
            why=step.why or "",
        )
    return Outcome(
        dt_diff=worst_diff(got.results, want),
        # the hand-written version returns some of the results, named as numpy's
        hw_diff=worst_diff(hand, {k: want[k] for k in hand})
        if hand and set(hand) <= set(want)
        else float("inf"),
        outside=got.outside,
        dt_iteration=max(got.step_bytes, default=0),
        hw_iteration=max(iterations, default=0),
        formula=case.hw_bytes(case.inputs(), size, rank),
        hw_iterations=iterations,
        dt_total=got.total_bytes,
        hw_total=hw_total,
        dt_calls=got.step_calls,
        hw_calls=hw_calls,
        calls_formula=case.hw_calls(case.inputs(), size, rank) if case.hw_calls else None,
        dt_checks=got.step_checks,
        **extra,
    )


def report(case: Case, outcomes: list[Outcome]) -> str:
    """One line per case (every rank's outcome): bytes per iteration of the busiest rank, dt
    and hand-written, the worst rank's ratio, the verdict; then what failed, by rank."""
    dt_b = max(o.dt_iteration for o in outcomes)
    hw_b = max(o.hw_iteration for o in outcomes)
    worst = max(ratio(o.dt_iteration, o.hw_iteration) for o in outcomes)
    whole = max(ratio(o.dt_total, o.hw_total) for o in outcomes)
    problems = {r: o.problems(case) for r, o in enumerate(outcomes)}
    over = any(
        not (within(o.dt_iteration, o.hw_iteration) and within(o.dt_total, o.hw_total))
        for o in outcomes
    )
    verdict = "FAIL" if any(problems.values()) else "KNOWN" if over else "OK"
    line = (
        f"{case.label:<32} {len(outcomes):>5} {dt_b:>10} {hw_b:>10} {worst:>7.2f} {whole:>7.2f}"
        f"  {verdict}"
    )
    if verdict == "KNOWN":
        line += f"\n    known over {BOUND:g}x: {case.known_over}"
    for r, found in problems.items():
        line += "".join(f"\n    rank {r}: {p}" for p in found)
    return line


def report_iterations(case: Case, outcomes: list[Outcome], times: dict | None) -> str:
    """One line per iterative case: collectives per iteration (``steady``) of the busiest
    rank, dt's and hand-written, dt's agreement checks per iteration, the median time per
    iteration of each (max over ranks), their ratio and the larger relative IQR, the
    verdict on the collectives; then what failed, by rank."""
    dt_c = max(steady(o.dt_calls) for o in outcomes)
    hw_c = max(steady(o.hw_calls) for o in outcomes)
    checks = max(steady(o.dt_checks) for o in outcomes)
    problems = {r: o.count_problems(case) for r, o in enumerate(outcomes)}
    differ = any(o.calls_differ() for o in outcomes)
    verdict = "FAIL" if any(problems.values()) else "KNOWN" if differ else "OK"
    replayed = min(o.replayed for o in outcomes)
    if times:
        t_dt, t_c, t_hw = (float(np.median(times[k])) for k in ("dt", "compiled", "hand"))
        iqr = max(_iqr(times[k]) for k in times)
        timing = (
            f"{t_dt * 1e6:>9.1f} {t_c * 1e6:>9.1f} {t_hw * 1e6:>9.1f} {t_dt / t_hw:>7.2f} "
            f"{t_c / t_hw:>7.2f} {iqr:>6.2f}"
        )
    else:
        timing = f"{'-':>9} {'-':>9} {'-':>9} {'-':>7} {'-':>7} {'-':>6}"
    line = (
        f"{case.label:<32} {len(outcomes):>5} {dt_c:>7} {hw_c:>7} {checks:>7} {replayed:>8} "
        f"{timing}  {verdict}"
    )
    why = {o.why for o in outcomes if o.why}
    if why:
        line += "\n    not compiled: " + "; ".join(sorted(why))
    if verdict == "KNOWN":
        line += f"\n    known: {case.known_calls}"
    for r, found in problems.items():
        line += "".join(f"\n    rank {r}: {p}" for p in found)
    return line


def _iqr(times: np.ndarray) -> float:
    """The inter-quartile range of ``times`` relative to their median."""
    q1, q3 = np.percentile(times, [25, 75])
    return float((q3 - q1) / np.median(times))


HEADER = (
    f"{'program [layout]':<32} {'ranks':>5} {'dt B/it':>10} {'hand B/it':>10} {'ratio':>7} "
    f"{'run':>7}  verdict\n"
    "(bytes sent per iteration by the busiest rank; ratio: dt / hand-written, the worst rank's,"
    " per iteration and for the whole run)"
)

ITERATION_HEADER = (
    f"{'program [layout]':<32} {'ranks':>5} {'dt':>7} {'hand':>7} {'checks':>7} {'replayed':>8} "
    f"{'dt us':>9} {'comp us':>9} {'hand us':>9} {'ratio':>7} {'comp':>7} {'IQR':>6}  verdict\n"
    "(per iteration: collectives of the busiest rank, dt and hand-written (each collective or "
    "send that reaches another rank), dt's agreement checks; replayed: steps of the checked run"
    " that dt.compile replayed (the rest recorded); time, median over the iterations after the "
    "first of each run, each the max over ranks: dt eager, the step under dt.compile (comp), "
    "hand-written; ratio and comp: dt's and compiled time / hand-written time; IQR: relative, "
    "the largest of the three)"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=sorted({c.name for c in CASES}), action="append")
    p.add_argument(
        "--rounds", type=int, default=40,
        help="timed runs of each iterative program, dt and hand-written interleaved "
        "(default 40; 0: count, do not time)",
    )  # fmt: skip
    # hidden: perturb one rank's shard of an input, to see the check fail
    p.add_argument("--perturb", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    from mpi4py import MPI  # the hand-written versions' communicator

    comm = MPI.COMM_WORLD.Dup()  # apart from dt's own traffic
    world = dt.comm.world()
    rank = dt.get_rank()
    if rank == 0:
        print(f"{dt.get_world_size()} rank(s); {HEADER}", flush=True)
    dt.fallback_report(reset=True)
    failed = False
    iterations = []
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        outcomes = world.allgather_object(check(case, comm, args.perturb))
        failed |= any(o.problems(case) for o in outcomes)
        if rank == 0:
            print(report(case, outcomes), flush=True)
        if case in ITERATIVE:
            failed |= any(o.count_problems(case) for o in outcomes)
            iterations.append((case, outcomes))
    lines, compiled = [], {}
    for case, outcomes in iterations:
        # timed after every check, so that the timed runs follow one another
        times = time_case(case, comm, args.rounds) if args.rounds > 0 else None
        lines.append(report_iterations(case, outcomes, times))
        if times and case.name in GOAL_PROGRAMS:
            compiled[case.label] = float(np.median(times["compiled"]) / np.median(times["hand"]))
    if rank == 0 and lines:
        print(f"\n{ITERATION_HEADER}", *lines, sep="\n", flush=True)
    if rank == 0 and compiled and dt.get_world_size() == 2:
        worst = max(compiled, key=compiled.get)
        met = "met" if compiled[worst] <= GOAL else "NOT met"
        print(
            f"goal on 2 ranks: the compiled step of {', '.join(GOAL_PROGRAMS)} within {GOAL:g}x "
            f"the hand-written time per iteration: {met} (the largest: {worst}, "
            f"{compiled[worst]:.2f})",
            flush=True,
        )
    outside = world.allgather_object(str(dt.fallback_report()) if dt.fallback_report() else "")
    if any(outside):
        failed = True
        if rank == 0:
            print("FALLBACK: dt.fallback_report() on some rank:\n" + next(filter(None, outside)))
    if failed:
        if rank == 0:
            print(
                "FAILED: a program differs from numpy, fell back, sent too much or made other "
                "collectives per iteration than its hand-written version",
                flush=True,
            )
        raise SystemExit(1)
    if rank == 0:
        print(
            f"OK: every program matches numpy, no fallback, within {BOUND:g}x, the hand-written"
            " collectives per iteration (but the known cases)",
            flush=True,
        )


if __name__ == "__main__":
    main()
