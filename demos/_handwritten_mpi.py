"""Hand-written mpi4py versions of the programs in demos/numpy_algorithms.py.

Each is the textbook distributed algorithm, written the way one writes it by hand with
mpi4py: every rank holds its rows (``numpy.array_split`` of the global arrays, the split
disttensor uses), computes locally and calls MPI where the algorithm needs the other ranks:

- k-means: local distances and assignment, local per-cluster sums and counts, one Allreduce
  of a K x (D + 1) buffer (sums beside counts) per iteration;
- PCA: one Allreduce of the column sums (the mean), one of the D x D Gram matrix of the
  centred rows; the eigen-decomposition and the projection are local;
- stencil: ghost rows, one Sendrecv of a boundary row with each neighbour per step;
- conjugate gradient: rows of A and of every vector; per iteration one Allgatherv of the
  search direction (for the product with the local rows of A) and two scalar Allreduces
  (p.Ap and r.r);
- power iteration: rows of A, the vector whole on every rank; per iteration one Allreduce of
  two scalars (v.w and w.w, independent, so one buffer) and one Allgatherv of the new
  vector's rows;
- logistic regression: rows of X and y, the weights whole on every rank; per iteration one
  Allreduce of the D gradient sums;
- GPT-2 forward, batch split: every weight replicated, each rank runs its own sequences: no
  communication at all;
- GPT-2 forward, Megatron: the vocabulary split over the ranks (embedding rows and logits),
  the heads and the MLP's hidden units split (q/k/v and fc columns, attention output and
  projection rows): one Allreduce of the B x T x C activations after the embedding, after
  attention and after the MLP.

``Counted`` wraps the communicator and adds up the bytes this rank hands to MPI to send (the
send buffer of each call, as ``dt.CommCounter`` counts dt's collectives) and the calls that
communicate: each collective on more than one rank, each Sendrecv that sends to a rank (as
``dt.CommCounter`` counts a collective, or a send, of dt; on one rank dt calls none).
``mark()`` starts an iteration. ``Timed(comm)`` times each iteration instead, from a barrier at
its ``mark()`` to the next ``mark()``, and counts nothing: its calls are the MPI calls alone,
as a loop written by hand makes them (counting costs 3 to 5 % of these small iterations).
Each ``*_bytes`` and ``*_calls`` function is the formula those counts follow per iteration,
which the demo checks against the measurement on every rank (so that tests on simulated
ranks, where there is no MPI, can use them). Results are gathered for checking with the raw
communicator, uncounted, as the demo gathers dt's.
"""

from __future__ import annotations

import time
from itertools import pairwise

import numpy as np


def rows(n: int, size: int, rank: int) -> tuple[int, int]:
    """(start, stop) of rank's rows of n under ``numpy.array_split``."""
    q, r = divmod(n, size)
    start = rank * q + min(rank, r)
    return start, start + q + (rank < r)


class Counted:
    """An mpi4py communicator that counts the bytes this rank hands to MPI to send and the
    calls that communicate (``Timed``: times, and counts nothing)."""

    def __init__(self, comm) -> None:
        from mpi4py import MPI  # only under mpiexec: importing it starts MPI

        self.MPI, self.comm = MPI, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.sent = 0
        self.calls = 0
        self.marks: list[tuple[int, int]] = []
        self._counts: dict[tuple, list[int]] = {}  # Allgatherv's counts by output shape

    def mark(self) -> None:
        """An iteration starts (and, called after the loop, the last one ends)."""
        self.marks.append((self.sent, self.calls))

    def _counts_of(self, out: np.ndarray) -> list[int]:
        """Allgatherv's counts for ``out`` (n rows): computed once, as a hand-written loop
        would before it starts."""
        counts = self._counts.get(out.shape)
        if counts is None:
            row = int(np.prod(out.shape[1:]))
            spans = (rows(len(out), self.size, r) for r in range(self.size))
            counts = self._counts[out.shape] = [(hi - lo) * row for lo, hi in spans]
        return counts

    def _collective(self, nbytes: int) -> None:
        self.sent += nbytes
        self.calls += self.size > 1  # on one rank MPI moves nothing (and dt calls nothing)

    def Allreduce(self, buf: np.ndarray) -> None:
        """Sum ``buf`` over the ranks, in place."""
        self._collective(buf.nbytes)
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)

    def Allgatherv(self, local: np.ndarray, out: np.ndarray) -> None:
        """``out`` (n rows) gets every rank's rows (``array_split`` of n), ``local`` ours."""
        self._collective(local.nbytes)
        self.comm.Allgatherv(np.ascontiguousarray(local), [out, self._counts_of(out)])

    def Sendrecv(self, send: np.ndarray, dest: int, recv: np.ndarray, source: int) -> None:
        """Send ``send`` to ``dest`` and receive ``recv`` from ``source``; MPI.PROC_NULL at the
        ends of the row of ranks (nothing sent or received)."""
        if dest != self.MPI.PROC_NULL:
            self.sent += send.nbytes
            self.calls += 1  # a message, as dt counts each send
        self.comm.Sendrecv(np.ascontiguousarray(send), dest=dest, recvbuf=recv, source=source)

    def gather_rows(self, local: np.ndarray) -> np.ndarray:
        """The global array of every rank's rows (for checking: not counted)."""
        return np.concatenate(self.comm.allgather(local))

    def per_iteration(self) -> tuple[list[int], int]:
        """(bytes of each iteration, bytes of the whole run)."""
        sent = [m[0] for m in self.marks]
        return [b - a for a, b in pairwise(sent)], self.sent

    def calls_per_iteration(self) -> list[int]:
        """The calls that communicated in each iteration."""
        calls = [m[1] for m in self.marks]
        return [b - a for a, b in pairwise(calls)]


class Timed(Counted):
    """``Counted``'s calls with nothing around them (no counting; the MPI constants looked up
    once), the time of each iteration in ``times``: from a barrier at its ``mark()`` to the
    next ``mark()``."""

    def __init__(self, comm) -> None:
        super().__init__(comm)
        self._in_place, self._sum = self.MPI.IN_PLACE, self.MPI.SUM
        self.times: list[float] = []  # this rank's seconds of each iteration
        self._t0 = 0.0  # when the iteration now running started

    def mark(self) -> None:
        """The clock of an iteration stops here, before the barrier that starts the next one,
        as bench/_timing.py times a call."""
        if self._t0:
            self.times.append(time.perf_counter() - self._t0)
        self.comm.Barrier()
        self._t0 = time.perf_counter()

    def Allreduce(self, buf: np.ndarray) -> None:
        self.comm.Allreduce(self._in_place, buf, op=self._sum)

    def Allgatherv(self, local: np.ndarray, out: np.ndarray) -> None:
        self.comm.Allgatherv(local, [out, self._counts_of(out)])

    def Sendrecv(self, send: np.ndarray, dest: int, recv: np.ndarray, source: int) -> None:
        self.comm.Sendrecv(send, dest=dest, recvbuf=recv, source=source)


# -- k-means --------------------------------------------------------------------------------
def kmeans(comm: Counted, X, centroids, steps: int) -> dict:
    lo, hi = rows(len(X), comm.size, comm.rank)
    X, centroids = X[lo:hi], centroids.copy()
    k, d = centroids.shape
    for _ in range(steps):
        comm.mark()
        labels = np.linalg.norm(X[:, None, :] - centroids[None], axis=2).argmin(axis=1)
        buf = np.zeros((k, d + 1))
        np.add.at(buf[:, :d], labels, X)
        buf[:, d] = np.bincount(labels, minlength=k)
        comm.Allreduce(buf)
        sums, counts = buf[:, :d], buf[:, d]
        centroids = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], centroids)
    comm.mark()
    labels = np.linalg.norm(X[:, None, :] - centroids[None], axis=2).argmin(axis=1)
    inertia = np.array([np.sum(np.min(np.linalg.norm(X[:, None] - centroids, axis=2), 1) ** 2)])
    comm.Allreduce(inertia)
    return {"centroids": centroids, "labels": comm.gather_rows(labels), "inertia": inertia[0]}


def kmeans_bytes(inputs: dict, size: int, rank: int) -> int:
    k, d = inputs["centroids"].shape
    return k * (d + 1) * 8


def kmeans_calls(inputs: dict, size: int, rank: int) -> int:
    return int(size > 1)


# -- PCA ------------------------------------------------------------------------------------
def pca(comm: Counted, X, k: int) -> dict:
    n = len(X)
    lo, hi = rows(n, comm.size, comm.rank)
    X = X[lo:hi]
    comm.mark()
    mean = X.sum(axis=0)
    comm.Allreduce(mean)
    mean /= n
    Xc = X - mean
    C = Xc.T @ Xc
    comm.Allreduce(C)
    C /= n - 1
    w, V = np.linalg.eigh(C)
    w, V = w[::-1][:k], V[:, ::-1][:, :k]
    V = V * np.sign(V[np.argmax(np.abs(V), axis=0), np.arange(k)])
    comm.mark()
    return {"variances": w, "components": V, "projected": comm.gather_rows(Xc @ V)}


def pca_bytes(inputs: dict, size: int, rank: int) -> int:
    d = inputs["X"].shape[1]
    return (d + d * d) * 8


# -- stencil --------------------------------------------------------------------------------
def stencil(comm: Counted, u, steps: int, alpha: float = 0.2) -> dict:
    n, w = u.shape
    lo, hi = rows(n, comm.size, comm.rank)
    up = comm.rank - 1 if comm.rank > 0 else comm.MPI.PROC_NULL
    down = comm.rank + 1 if comm.rank < comm.size - 1 else comm.MPI.PROC_NULL
    g = np.zeros((hi - lo + 2, w))  # this rank's rows with a ghost row above and below
    g[1:-1] = u[lo:hi]
    first, last = max(lo, 1) - lo + 1, min(hi, n - 1) - lo + 1  # the rows updated (local)
    for _ in range(steps):
        comm.mark()
        comm.Sendrecv(g[1], up, g[-1], down)  # my first row up, my lower ghost from below
        comm.Sendrecv(g[-2], down, g[0], up)  # my last row down, my upper ghost from above
        c = g[first:last, 1:-1]
        g[first:last, 1:-1] = c + alpha * (
            g[first + 1 : last + 1, 1:-1]
            + g[first - 1 : last - 1, 1:-1]
            + g[first:last, 2:]
            + g[first:last, :-2]
            - 4 * c
        )
    comm.mark()
    u = comm.gather_rows(g[1:-1])
    return {"u": u, "mean": u.mean()}


def stencil_bytes(inputs: dict, size: int, rank: int) -> int:
    n, w = inputs["u"].shape
    if n < size:
        raise ValueError("the formula assumes every rank holds a row")
    return w * 8 * ((rank > 0) + (rank < size - 1))


def stencil_calls(inputs: dict, size: int, rank: int) -> int:
    return (rank > 0) + (rank < size - 1)  # one message to each neighbour


# -- conjugate gradient ----------------------------------------------------------------------
def cg(comm: Counted, A, b, x, steps: int) -> dict:
    n = len(b)
    lo, hi = rows(n, comm.size, comm.rank)
    A, b, x = A[lo:hi], b[lo:hi], x[lo:hi].copy()
    full = np.empty(n)
    comm.Allgatherv(x, full)
    r = b - A @ full
    p = r.copy()
    rs = np.array([r @ r])
    comm.Allreduce(rs)
    for _ in range(steps):
        comm.mark()
        comm.Allgatherv(p, full)
        Ap = A @ full
        pAp = np.array([p @ Ap])
        comm.Allreduce(pAp)
        alpha = rs[0] / pAp[0]
        x += alpha * p
        r -= alpha * Ap
        rs_new = np.array([r @ r])
        comm.Allreduce(rs_new)
        p = r + (rs_new[0] / rs[0]) * p
        rs = rs_new
    comm.mark()
    comm.Allgatherv(x, full)
    res = b - A @ full
    rr = np.array([res @ res])
    comm.Allreduce(rr)
    return {"x": full.copy(), "residual": np.sqrt(rr[0])}


def cg_bytes(inputs: dict, size: int, rank: int) -> int:
    lo, hi = rows(len(inputs["b"]), size, rank)
    return (hi - lo) * 8 + 2 * 8


def cg_calls(inputs: dict, size: int, rank: int) -> int:
    return 3 * (size > 1)


# -- power iteration ---------------------------------------------------------------------------
def power(comm: Counted, A, v, steps: int) -> dict:
    n = len(A)
    lo, hi = rows(n, comm.size, comm.rank)
    A, v = A[lo:hi], v.astype(np.float64)  # v: a new array, whole on every rank
    lam = 0.0
    for _ in range(steps):
        comm.mark()
        w = A @ v  # my rows of A v
        dots = np.array([v[lo:hi] @ w, w @ w])  # my parts of v.w and w.w: one buffer
        comm.Allreduce(dots)
        lam = dots[0]
        comm.Allgatherv(w / np.sqrt(dots[1]), v)
    comm.mark()
    return {"v": v.copy(), "lam": lam}


def power_bytes(inputs: dict, size: int, rank: int) -> int:
    lo, hi = rows(len(inputs["v"]), size, rank)
    return 2 * 8 + (hi - lo) * 8


def power_calls(inputs: dict, size: int, rank: int) -> int:
    return 2 * (size > 1)


# -- logistic regression ---------------------------------------------------------------------
def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def logistic(comm: Counted, X, y, w, steps: int, lr: float = 0.5) -> dict:
    n = len(X)
    lo, hi = rows(n, comm.size, comm.rank)
    X, y, w = X[lo:hi], y[lo:hi], w.astype(np.float64)  # w: a new array, whole everywhere
    for _ in range(steps):
        comm.mark()
        dw = X.T @ (sigmoid(X @ w) - y)  # my rows' part of the gradient's sum
        comm.Allreduce(dw)
        w -= lr * (dw / n)
    comm.mark()
    p = np.clip(sigmoid(X @ w), 1e-12, 1 - 1e-12)
    sums = np.array([np.sum(y * np.log(p) + (1 - y) * np.log(1 - p)), np.sum((p > 0.5) == y)])
    comm.Allreduce(sums)
    return {"w": w, "loss": -sums[0] / n, "accuracy": sums[1] / n}


def logistic_bytes(inputs: dict, size: int, rank: int) -> int:
    return inputs["X"].shape[1] * 8


def logistic_calls(inputs: dict, size: int, rank: int) -> int:
    return int(size > 1)


# -- GPT-2 forward ------------------------------------------------------------------------------
# The local pieces of the forward, plain numpy, shared with demos/numpy_algorithms.py's
# program (which runs them on DistTensors): both versions compute the same math.
def layer_norm(x, g, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * g + b


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _attention(q, k, v):
    """Causal attention of (B, heads, T, hd) q, k, v."""
    t = q.shape[-2]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]) + np.triu(np.full((t, t), -1e10), k=1)
    return softmax(s) @ v


def _block(x, w: dict, n_head: int, cols: slice, fc: slice, reduce) -> np.ndarray:
    """One pre-norm transformer block on this rank's heads (``cols`` of q/k/v, rows of the
    attention output) and hidden units (``fc``); ``reduce`` sums a partial output over the
    ranks that split them."""
    b, t, _ = x.shape
    hd = x.shape[-1] // n_head
    heads = (cols.stop - cols.start) // hd
    h = layer_norm(x, w["ln1_g"], w["ln1_b"])
    q, k, v = (
        (h @ w[f"w_{n}"][:, cols] + w[f"b_{n}"][cols])
        .reshape(b, t, heads, hd)
        .transpose(0, 2, 1, 3)
        for n in "qkv"
    )
    y = _attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, t, heads * hd)
    x = x + reduce(y @ w["w_o"][cols]) + w["b_o"]
    h = layer_norm(x, w["ln2_g"], w["ln2_b"])
    out = gelu(h @ w["w_fc"][:, fc] + w["b_fc"][fc]) @ w["w_proj"][fc]
    return x + reduce(out) + w["b_proj"]


def gpt2_batch(comm: Counted, ids, wte, wpe, blocks, ln_f_g, ln_f_b, n_head: int) -> dict:
    """Each rank its own sequences, every weight whole: no communication."""
    lo, hi = rows(len(ids), comm.size, comm.rank)
    ids = ids[lo:hi]
    c = wte.shape[1]
    comm.mark()
    x = wte[ids] + wpe[: ids.shape[1]]
    for w in blocks:
        x = _block(x, w, n_head, slice(0, c), slice(0, w["w_fc"].shape[1]), lambda a: a)
    logits = layer_norm(x, ln_f_g, ln_f_b) @ wte.T
    comm.mark()
    return {"logits": comm.gather_rows(logits)}


def gpt2_megatron(comm: Counted, ids, wte, wpe, blocks, ln_f_g, ln_f_b, n_head: int) -> dict:
    """Vocabulary, heads and MLP hidden units split over the ranks (Megatron-LM)."""
    vocab, c = wte.shape
    hd = c // n_head
    v0, v1 = rows(vocab, comm.size, comm.rank)
    h0, h1 = rows(n_head, comm.size, comm.rank)
    cols = slice(h0 * hd, h1 * hd)  # my heads' columns of q, k, v (rows of w_o)
    wte = wte[v0:v1]

    def reduce(a):
        comm.Allreduce(a)
        return a

    comm.mark()
    mine = (ids >= v0) & (ids < v1)  # the tokens whose rows I hold; the others add zeros
    x = reduce(np.where(mine[..., None], wte[np.where(mine, ids - v0, 0)], 0.0))
    x = x + wpe[: ids.shape[1]]
    for w in blocks:
        f0, f1 = rows(w["w_fc"].shape[1], comm.size, comm.rank)
        x = _block(x, w, n_head, cols, slice(f0, f1), reduce)
    logits = layer_norm(x, ln_f_g, ln_f_b) @ wte.T  # my vocabulary's columns
    comm.mark()
    return {"logits": np.concatenate(comm.comm.allgather(logits), axis=-1)}


def gpt2_batch_bytes(inputs: dict, size: int, rank: int) -> int:
    return 0


def gpt2_megatron_bytes(inputs: dict, size: int, rank: int) -> int:
    b, t = inputs["ids"].shape
    return (1 + 2 * len(inputs["blocks"])) * b * t * inputs["wte"].shape[1] * 8
