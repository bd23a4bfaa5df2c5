"""numpy algorithms that communicate like hand-written MPI.

    mpiexec -n N python demos/numpy_algorithms.py [--only NAME]      (N = 1 to 4)

Five textbook algorithms, written in plain numpy (``np.linalg.norm``, ``np.argmin``, ``@``,
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
  (Shard(0)), so the product ``A @ p`` gathers p, as the textbook distributed CG does;
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
out) are at most twice the hand-written ones, and so are the whole run's. A failed check
exits 1 on every rank.

Shifted slices of a split axis are split again by ``numpy.array_split`` over their own
length, so a stencil step moves just the halo rows when the interior's split boundaries sit
one row from the plate's: 37 rows does that on 1 to 4 ranks. A 36-row plate is listed as a
known case (``KNOWN``, shown but not failed): on 3 and 4 ranks dt sends 3.3 times the halo
exchange there. The Megatron forward stays within 2x (1.35x to 1.82x on 2 to 4 ranks) of
Megatron's all-reduce of the activations after the embedding, the attention and the MLP, by
another route: the lookup in the vocabulary-split table comes out split by batch (Note
[Gathers by index] in disttensor/ops/indexing.py), and the matmuls that follow gather weights
and move activations between splits instead.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import _handwritten_mpi as hw
import numpy as np
from _handwritten_mpi import gelu, layer_norm, softmax  # plain numpy, shared with hw

import disttensor as dt

TOLERANCE = 1e-10  # float64, relative to each result's largest |value|
BOUND = 2.0  # dt may send at most this many times the hand-written bytes


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


def cg_inputs() -> dict:
    rng = np.random.default_rng(12)
    n = 61
    M = rng.standard_normal((n, n))
    return {"A": M @ M.T / n + np.eye(n), "b": rng.standard_normal(n), "x": np.zeros(n)}


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
    known to (a limit of the library, shown but not failed)."""

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
    ),
    Case("pca", "observations by rows", pca_inputs, {"X": [S0]}, pca, 1, hw.pca, hw.pca_bytes),
    Case(
        "stencil", "rows, 37 x 29", plate(37), {"u": [S0]}, stencil_step, 20,
        partial(hw.stencil, steps=20), hw.stencil_bytes, finish=stencil_finish,
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
    ),
    Case(
        "cg", "rows, Shard(0) vectors", cg_inputs, {"A": [S0], "b": [S0], "x": [S0]}, cg_step,
        12, partial(hw.cg, steps=12), hw.cg_bytes, start=cg_start, finish=cg_finish,
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


# -- running ------------------------------------------------------------------------------------
def _call(fn: Callable[..., dict], state: dict) -> dict:
    """``fn`` with the entries of ``state`` its parameters name."""
    names = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in state.items() if k in names})


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
    """Stands in for ``dt.CommCounter`` in the numpy run: nothing to count."""

    total_bytes = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _run(case: Case, state: dict, counter=_NoCounter) -> tuple[dict, list[int], int, dict]:
    """Start, steps and finish on ``state`` (numpy arrays or DistTensors); ``counter``: a
    context manager class with ``total_bytes`` (``dt.CommCounter``). Returns the results
    (what the step and the finish return, global values), the bytes of each step, of the
    whole run, and the calls that communicated outside an SPMD rule."""
    per_step, names = [], set()
    with counter() as whole:
        state = {**state, **_call(case.start, state)}
        for _ in range(case.steps):
            with counter() as one:
                out = _call(case.step, state)
            state.update(out)
            names |= set(out)
            per_step.append(one.total_bytes)
        out = _call(case.finish, state)
        state.update(out)
        names |= set(out)
    outside = dict(getattr(whole, "fallbacks", {}))
    results = {k: _global(state[k]) for k in sorted(names)}  # every rank in the same order
    return results, per_step, whole.total_bytes, outside


def run_numpy(case: Case) -> dict:
    """The program on numpy arrays, in this process."""
    return _run(case, case.inputs())[0]


def run_dt(case: Case, perturb: bool = False) -> tuple[dict, list[int], int, dict]:
    """The program on the case's sharded inputs (collective): results, dt's bytes of each
    step and of the whole run on this rank, the calls outside SPMD rules. ``perturb``: add
    1e-6 to the last rank's shard of the first sharded input (to see the check fail)."""
    args = shard_inputs(case)
    if perturb and dt.get_rank() == dt.get_world_size() - 1:
        first = next(k for k in args if isinstance(args[k], dt.DistTensor))
        args[first].to_local()[...] += 1e-6
    return _run(case, args, dt.CommCounter)


def run_handwritten(case: Case, comm) -> tuple[dict, list[int], int]:
    """The hand-written mpi4py version (under mpiexec; ``comm``: an mpi4py communicator):
    results, bytes of each iteration and of the whole run on this rank."""
    counted = hw.Counted(comm)
    results = case.handwritten(counted, **case.inputs())
    per_iteration, total = counted.per_iteration()
    return {k: np.asarray(v) for k, v in results.items()}, per_iteration, total


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

    def problems(self, case: Case, bound: float = BOUND) -> list[str]:
        """What failed on this rank ([] when everything holds); a known over-communication
        is not a failure."""
        out = []
        if not self.dt_diff <= TOLERANCE:
            out.append(f"MISMATCH: dt differs from numpy by {self.dt_diff:.2e}")
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


def check(case: Case, comm, perturb: bool = False) -> Outcome:
    """Run the case on numpy, dt and hand-written (collective, under mpiexec: ``comm`` is an
    mpi4py communicator of every rank). ``perturb``: add 1e-6 to dt's last rank's shard of
    the first sharded input, to see the check fail."""
    want = run_numpy(case)
    got, steps, dt_total, outside = run_dt(case, perturb)
    hand, iterations, hw_total = run_handwritten(case, comm)
    return Outcome(
        dt_diff=worst_diff(got, want),
        # the hand-written version returns some of the results, named as numpy's
        hw_diff=worst_diff(hand, {k: want[k] for k in hand})
        if hand and set(hand) <= set(want)
        else float("inf"),
        outside=outside,
        dt_iteration=max(steps, default=0),
        hw_iteration=max(iterations, default=0),
        formula=case.hw_bytes(case.inputs(), dt.get_world_size(), dt.get_rank()),
        hw_iterations=iterations,
        dt_total=dt_total,
        hw_total=hw_total,
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


HEADER = (
    f"{'program [layout]':<32} {'ranks':>5} {'dt B/it':>10} {'hand B/it':>10} {'ratio':>7} "
    f"{'run':>7}  verdict\n"
    "(bytes sent per iteration by the busiest rank; ratio: dt / hand-written, the worst rank's,"
    " per iteration and for the whole run)"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=sorted({c.name for c in CASES}), action="append")
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
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        outcomes = world.allgather_object(check(case, comm, args.perturb))
        failed |= any(o.problems(case) for o in outcomes)
        if rank == 0:
            print(report(case, outcomes), flush=True)
    outside = world.allgather_object(str(dt.fallback_report()) if dt.fallback_report() else "")
    if any(outside):
        failed = True
        if rank == 0:
            print("FALLBACK: dt.fallback_report() on some rank:\n" + next(filter(None, outside)))
    if failed:
        if rank == 0:
            print("FAILED: a program differs from numpy, fell back or sent too much", flush=True)
        raise SystemExit(1)
    if rank == 0:
        print(f"OK: every program matches numpy, no fallback, within {BOUND:g}x", flush=True)


if __name__ == "__main__":
    main()
