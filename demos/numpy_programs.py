"""Ordinary numpy programs, run unchanged on DistTensors.

    mpiexec -n 4 python demos/numpy_programs.py [--only NAME]

Each program below is plain numpy, written as the numpy tutorials write it: module-level
``np.`` calls, operators, in-place updates (``W += -lr * dW``) and item assignment
(``dscores[np.arange(N), y] -= 1``, ``dhidden[hidden <= 0] = 0``). It takes its (global)
input arrays and returns its results; it never mentions disttensor.

The script runs each program twice: on plain numpy arrays in this process, then with some
inputs sharded over the ranks (``dt.shard_tensor``), once per layout: rows split over a 1-D
mesh of every rank, and a second layout (a 2-D mesh, or another split). numpy dispatches
its functions and in-place operators to the DistTensors (``__array_ufunc__``,
``__array_function__``), so the same code runs sharded. The results must equal numpy's
(float64: 1e-10 relative to each result's largest value); per program and layout rank 0
prints OK or MISMATCH, the largest difference and the collectives the sharded run made,
then the ops that communicated outside an SPMD rule (``CommCounter().fallbacks``: gathered
keys, slices of split axes, numpy functions without a rule; ``dt.fallback_report()`` says
why). The exit code is 1 if any result differs on any rank.

The programs:

- ``two_layer_net``: the CS231n two-layer classifier (ReLU, softmax, cross entropy, L2),
  hand-written backprop and in-place SGD, on a spiral data set of 101 points (uneven
  shards on any number of ranks), data parallel or data x tensor parallel;
- ``heat_diffusion``: a 2-D explicit heat stencil, shifted slices of the plate written back
  into its interior, edges set by item assignment; the plate split by rows (or blocks);
- ``logistic_regression``: gradient descent with numpy weights and sharded data, so the
  gradient ``X.T @ (sigmoid(X @ w) - y) / n`` is a DistTensor and ``w -= lr * dw`` writes it
  into a numpy array; ``np.clip(p, lo, hi, out=p)`` before the log loss;
- ``kmeans``: Lloyd's algorithm, ``np.argmin`` of the distances and a centroid loop with a
  boolean mask selection;
- ``power_iteration``: the dominant eigenpair of a symmetric matrix, ``v /= np.linalg.norm(v)``;
- ``knn_predict``: CS231n's k-nearest-neighbour classifier, its vote over ``set(closest_y)``
  and a dict keyed by the labels (elements of a DistTensor work as numpy's scalars);
- ``game_of_life``: Conway's rules with ``np.roll`` and ``&``, ``|`` on a boolean board split
  by rows (or blocks), which stays split, each generation moving only the halo rows.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import disttensor as dt

TOLERANCE = 1e-10  # float64, relative to each result's largest |value|


# -- the programs: plain numpy ------------------------------------------------------------------
def two_layer_net(X, y, W1, b1, W2, b2, steps=30, step_size=1.0, reg=1e-3):
    """A two-layer ReLU classifier trained with hand-written backprop (CS231n's case study)."""
    num_examples = X.shape[0]
    losses = []
    for _ in range(steps):
        # forward: class scores [N x K]
        hidden = np.maximum(0, np.dot(X, W1) + b1)
        scores = np.dot(hidden, W2) + b2
        exp_scores = np.exp(scores - np.max(scores, axis=1, keepdims=True))
        probs = exp_scores / np.sum(exp_scores, axis=1, keepdims=True)

        # average cross-entropy loss and L2 regularization
        correct_logprobs = -np.log(probs[np.arange(num_examples), y])
        data_loss = np.sum(correct_logprobs) / num_examples
        reg_loss = 0.5 * reg * np.sum(W1 * W1) + 0.5 * reg * np.sum(W2 * W2)
        losses.append(float(data_loss + reg_loss))

        # gradient on the scores
        dscores = probs
        dscores[np.arange(num_examples), y] -= 1
        dscores /= num_examples

        # backprop into W2 and b2, then the hidden layer, the ReLU, W1 and b1
        dW2 = np.dot(hidden.T, dscores)
        db2 = np.sum(dscores, axis=0, keepdims=True)
        dhidden = np.dot(dscores, W2.T)
        dhidden[hidden <= 0] = 0
        dW1 = np.dot(X.T, dhidden)
        db1 = np.sum(dhidden, axis=0, keepdims=True)
        dW2 += reg * W2
        dW1 += reg * W1

        # parameter update, in place
        for param, grad in zip((W1, b1, W2, b2), (dW1, db1, dW2, db2)):
            param += -step_size * grad

    predicted = np.argmax(scores, axis=1)
    accuracy = np.mean(predicted == y)
    return {
        "losses": np.array(losses),
        "W1": W1,
        "b1": b1,
        "W2": W2,
        "b2": b2,
        "accuracy": accuracy,
    }


def heat_diffusion(u, steps=25, alpha=0.2):
    """Explicit finite differences for the heat equation on a plate with fixed edges."""
    u[0, :] = 100.0  # hot top edge
    u[-1, :] = 0.0  # cold bottom edge
    u[:, 0] = 40.0  # warm left edge (cooler than the right edge on average: no tie between
    # the outer columns, whose sums would otherwise differ only in the last bits)
    u[:, -1] = np.linspace(100.0, 0.0, u.shape[0])  # right edge: hot at the top, cold below
    for _ in range(steps):
        u[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * (
            u[2:, 1:-1]
            - 2 * u[1:-1, 1:-1]
            + u[:-2, 1:-1]
            + u[1:-1, 2:]
            - 2 * u[1:-1, 1:-1]
            + u[1:-1, :-2]
        )
    heat_per_column = u[1:-1, 1:-1].sum(axis=0)
    return {"u": u, "mean": np.mean(u), "hottest column": np.argmax(heat_per_column) + 1}


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def logistic_regression(X, y, steps=40, lr=0.5):
    """Binary logistic regression by batch gradient descent; the weights are numpy."""
    n, d = X.shape
    w = np.zeros(d)
    for _ in range(steps):
        dw = X.T @ (sigmoid(X @ w) - y) / n
        w -= lr * dw
    p = sigmoid(X @ w)
    np.clip(p, 1e-12, 1 - 1e-12, out=p)  # keep the logs finite
    loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    accuracy = np.mean((p > 0.5) == y)
    return {"w": w, "loss": loss, "accuracy": accuracy}


def kmeans(X, centroids, steps=6):
    """Lloyd's k-means: assign each point to its nearest centroid, move centroids to means."""
    k = centroids.shape[0]
    for _ in range(steps):
        distances = ((X[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
        labels = np.argmin(distances, axis=1)
        for j in range(k):
            members = X[labels == j]
            if len(members) > 0:
                centroids[j] = members.mean(axis=0)
    inertia = np.sum(np.min(distances, axis=1))
    return {"centroids": centroids, "labels": labels, "inertia": inertia}


def power_iteration(A, v, steps=30):
    """The dominant eigenvalue and eigenvector of a symmetric matrix."""
    for _ in range(steps):
        v = A @ v
        v /= np.linalg.norm(v)
    eigenvalue = v @ A @ v
    return {"v": v, "eigenvalue": eigenvalue}


# -- their inputs (global arrays, the same on every rank) ---------------------------------------
def knn_predict(X_train, y_train, X_test, k=5):
    """CS231n's k-nearest-neighbour classifier: the distance matrix without loops, then a
    vote among the k closest training labels of each test point (the most votes, the
    smallest label on a tie)."""
    dists = np.sqrt(
        np.maximum(
            np.sum(X_test**2, axis=1)[:, None]
            + np.sum(X_train**2, axis=1)[None, :]
            - 2 * X_test @ X_train.T,
            0.0,
        )
    )
    y_pred = np.zeros(X_test.shape[0])
    for i in range(X_test.shape[0]):
        closest_y = y_train[np.argsort(dists[i])[:k]]
        votes = {label: 0 for label in set(closest_y)}
        for label in closest_y:
            votes[label] += 1
        y_pred[i] = min(votes, key=lambda c: (-votes[c], c))
    return {"dists": dists, "y_pred": y_pred}


def game_of_life(board, steps=4):
    """Conway's Game of Life on a torus: neighbours counted with np.roll, the rules with & and
    |."""
    for _ in range(steps):
        neighbours = sum(
            np.roll(np.roll(board, i, axis=0), j, axis=1)
            for i in (-1, 0, 1)
            for j in (-1, 0, 1)
            if (i, j) != (0, 0)
        )
        board = (neighbours == 3) | (board & (neighbours == 2))
    return {"board": board, "alive": board.sum()}


def knn_inputs() -> dict:
    """Three clusters of 5-D points, 43 for training (uneven shards) and 9 to classify."""
    rng = np.random.default_rng(8)
    centers = 3.0 * rng.standard_normal((3, 5))
    labels = rng.integers(0, 3, 52)
    points = centers[labels] + rng.standard_normal((52, 5))
    return {"X_train": points[:43], "y_train": labels[:43], "X_test": points[43:]}


def life_inputs() -> dict:
    """A 37 x 29 board, a third of it alive."""
    return {"board": np.random.default_rng(9).random((37, 29)) < 0.33}


def spiral_inputs() -> dict:
    """CS231n's spiral: 3 classes of points on arms, 101 points, a 16-unit hidden layer."""
    rng = np.random.default_rng(0)
    n, k, h = 101, 3, 16
    y = np.arange(n) % k
    r = np.linspace(0.0, 1.0, n)
    t = y * 4.0 + r * 4.0 + 0.2 * rng.standard_normal(n)
    X = np.c_[r * np.sin(t), r * np.cos(t)]
    return {
        "X": X,
        "y": y,
        "W1": 0.5 * rng.standard_normal((2, h)),
        "b1": np.zeros((1, h)),
        "W2": 0.5 * rng.standard_normal((h, k)),
        "b2": np.zeros((1, k)),
    }


def plate_inputs() -> dict:
    return {"u": np.zeros((23, 17))}


def logistic_inputs() -> dict:
    rng = np.random.default_rng(1)
    n, d = 97, 6
    X = rng.standard_normal((n, d))
    X[:, 0] = 1.0  # a bias column
    w_true = rng.standard_normal(d)
    y = (X @ w_true + 0.5 * rng.standard_normal(n) > 0).astype(np.float64)
    return {"X": X, "y": y}


def kmeans_inputs() -> dict:
    rng = np.random.default_rng(2)
    centers = np.array([[0.0, 0.0, 0.0], [4.0, 4.0, 0.0], [0.0, 4.0, 4.0]])
    X = np.concatenate([c + rng.standard_normal((n, 3)) for c, n in zip(centers, (20, 17, 22))])
    X = X[rng.permutation(len(X))]
    return {"X": X, "centroids": X[:3].copy()}


def power_inputs() -> dict:
    """A symmetric matrix whose largest eigenvalue stands out (noise plus a rank-one spike)."""
    rng = np.random.default_rng(3)
    n = 37
    M = rng.standard_normal((n, n))
    u = rng.standard_normal(n)
    u /= np.linalg.norm(u)
    return {"A": (M + M.T) / 2 + 25.0 * np.outer(u, u), "v": np.ones(n)}


# -- layouts: which inputs to shard, on which mesh ----------------------------------------------
def rows_mesh() -> dt.ProcessMesh:
    """Every rank in one row: the 1-D mesh of the world."""
    return dt.init_mesh((dt.get_world_size(),), dim_names=["x"])


def grid_mesh() -> dt.ProcessMesh:
    """A (dp, mp) mesh of every rank: mp is 2 when the world size is even."""
    world = dt.get_world_size()
    mp = 2 if world % 2 == 0 else 1
    return dt.init_mesh((world // mp, mp), dim_names=["dp", "mp"])


@dataclass(frozen=True)
class Layout:
    name: str
    mesh: Callable[[], dt.ProcessMesh]
    placements: dict  # input name -> placements; inputs not named stay numpy arrays


R, S0, S1 = dt.Replicate(), dt.Shard(0), dt.Shard(1)


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable[..., dict]
    inputs: Callable[[], dict]
    layouts: tuple[Layout, ...]


PROGRAMS = (
    Program(
        "two_layer_net",
        two_layer_net,
        spiral_inputs,
        (
            # data parallel: the batch split by rows, the parameters replicated
            Layout(
                "rows",
                rows_mesh,
                {"X": [S0], "y": [S0], "W1": [R], "b1": [R], "W2": [R], "b2": [R]},
            ),
            # data x tensor parallel: hidden units split over "mp" (Megatron's column/row)
            Layout(
                "dp x mp",
                grid_mesh,
                {
                    "X": [S0, R],
                    "y": [S0, R],
                    "W1": [R, S1],
                    "b1": [R, S1],
                    "W2": [R, S0],
                    "b2": [R, R],
                },
            ),
        ),
    ),
    Program(
        "heat_diffusion",
        heat_diffusion,
        plate_inputs,
        (
            Layout("rows", rows_mesh, {"u": [S0]}),
            Layout("blocks", grid_mesh, {"u": [S0, S1]}),
        ),
    ),
    Program(
        "logistic_regression",
        logistic_regression,
        logistic_inputs,
        (
            Layout("rows", rows_mesh, {"X": [S0], "y": [S0]}),
            Layout("features", rows_mesh, {"X": [S1], "y": [R]}),
        ),
    ),
    Program(
        "kmeans",
        kmeans,
        kmeans_inputs,
        (
            Layout("rows", rows_mesh, {"X": [S0]}),
            # points by rows over "dp", coordinates over "mp"; centroids replicated
            Layout("points x coords", grid_mesh, {"X": [S0, S1], "centroids": [R, R]}),
        ),
    ),
    Program(
        "knn_predict",
        knn_predict,
        knn_inputs,
        (
            Layout("train by rows", rows_mesh, {"X_train": [S0], "y_train": [S0]}),
            Layout(
                "train and test by rows",
                rows_mesh,
                {"X_train": [S0], "y_train": [S0], "X_test": [S0]},
            ),
        ),
    ),
    Program(
        "game_of_life",
        game_of_life,
        life_inputs,
        (
            Layout("rows", rows_mesh, {"board": [S0]}),
            Layout("blocks", grid_mesh, {"board": [S0, S1]}),
        ),
    ),
    Program(
        "power_iteration",
        power_iteration,
        power_inputs,
        (
            Layout("rows", rows_mesh, {"A": [S0]}),
            Layout("columns", rows_mesh, {"A": [S1], "v": [R]}),
        ),
    ),
)


# -- running and checking -----------------------------------------------------------------------
def as_numpy(value) -> np.ndarray:
    """A result as a numpy array (a DistTensor's global value: collective)."""
    return np.asarray(value)


def rel_diff(got, want) -> float:
    """max |got - want| / max |want| (absolute where want is all zeros): one number per
    result."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = float(np.abs(want).max(initial=0.0)) or 1.0
    return float(np.abs(got - want).max(initial=0.0)) / scale


def run_numpy(program: Program) -> dict:
    """The program on plain numpy arrays, in this process."""
    return {k: as_numpy(v) for k, v in program.fn(**program.inputs()).items()}


def shard_inputs(program: Program, layout: Layout) -> dict:
    """The program's inputs, those the layout names sharded (DistTensors), the others numpy."""
    mesh = layout.mesh()
    return {
        name: dt.shard_tensor(a, mesh, layout.placements[name]) if name in layout.placements else a
        for name, a in program.inputs().items()
    }


def run_sharded(program: Program, layout: Layout, perturb: bool = False) -> tuple[dict, ...]:
    """The program with the layout's inputs sharded (collective): the global results, the
    collectives the program made (the results' gathering afterwards is not counted) and the
    calls that communicated outside an SPMD rule, by op.
    ``perturb``: add 1e-6 to the last rank's shard of the first sharded input (to see the
    check fail)."""
    args = shard_inputs(program, layout)
    if perturb and dt.get_rank() == dt.get_world_size() - 1:
        first = next(iter(layout.placements))
        args[first].to_local()[...] += 1e-6
    with dt.CommCounter() as cc:
        out = program.fn(**args)
    results = {k: as_numpy(v) for k, v in out.items()}  # every rank, in the same order
    outside: dict[str, int] = {}
    for (op, _), calls in cc.fallbacks.items():
        outside[op] = outside.get(op, 0) + calls
    return results, dict(sorted(cc.counts.items())), outside


def check(program: Program, layout: Layout, perturb: bool = False) -> tuple:
    """Run ``program`` sharded with ``layout`` and on numpy (collective); returns the worst
    relative difference over its results and over every rank, the worst per result, the
    collectives of the sharded run and its calls outside SPMD rules by op."""
    want = run_numpy(program)
    got, counts, outside = run_sharded(program, layout, perturb)
    diffs = {k: rel_diff(got.get(k), w) for k, w in want.items()}
    everyone = dt.comm.world().allgather_object(diffs)
    diffs = {k: max(d[k] for d in everyone) for k in diffs}
    return max(diffs.values(), default=0.0), diffs, counts, outside


def report(program: Program, layout: Layout, worst, diffs, counts, outside) -> str:
    """The lines of one sharded run: verdict, difference and collectives, and the ops whose
    communication no SPMD rule planned (``dt.fallback_report()`` says why)."""
    verdict = "OK" if worst <= TOLERANCE else "MISMATCH"
    comm = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "none"
    line = (
        f"{program.name:<20} {layout.name:<18} {verdict:<8} max rel diff {worst:.1e}  "
        f"collectives: {comm}"
    )
    if outside:
        ops = sorted(outside.items(), key=lambda item: -item[1])
        line += "\n    outside SPMD rules: " + ", ".join(f"{op} x{n}" for op, n in ops)
    if verdict != "OK":
        line += "\n" + "\n".join(
            f"    {k}: rel diff {d:.3g}" for k, d in diffs.items() if not d <= TOLERANCE
        )
    return line


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=[prog.name for prog in PROGRAMS], action="append")
    # hidden: perturb one rank's shard of an input, to see the check fail
    p.add_argument("--perturb", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    dt.print0(f"{dt.get_world_size()} rank(s); tolerance {TOLERANCE:g} (float64)")
    failed = False
    for program in PROGRAMS:
        if args.only and program.name not in args.only:
            continue
        for layout in program.layouts:
            result = check(program, layout, args.perturb)
            failed |= not result[0] <= TOLERANCE
            dt.print0(report(program, layout, *result))
    if failed:
        dt.print0("MISMATCH: a sharded run differs from numpy")
        raise SystemExit(1)
    dt.print0("OK: every program matches numpy")


if __name__ == "__main__":
    main()
