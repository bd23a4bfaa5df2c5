"""Training steps and single kernels on one process: dt on a 1-rank mesh against PyTorch eager.

Run (one process, no mpiexec; one thread on both sides unless ``--threads``)::

    python bench/kernels_vs_torch.py
    python bench/kernels_vs_torch.py --quick                          # smoke run, seconds
    python bench/kernels_vs_torch.py --only transformer,layer_norm    # some workloads
    python bench/kernels_vs_torch.py --threads 2                      # BLAS and torch threads

(The name is not plain "kernels": a script runs with its folder first on ``sys.path``, so a
module of that name in bench/ would stand in for the repository's top-level package kernels/,
which disttensor imports, in every script under bench/.)

Workloads (float32; dt on ``dt.ProcessMesh([0])``, PyTorch on the CPU with
``torch.set_num_threads``; the same initial parameters and inputs on both sides):

    mlp_gelu       16 x (Linear(256, 256), GELU tanh approximation), batch 64, MSE loss against
                   a target, Adam (lr 1e-3): forward, backward, ``opt.step()``, ``zero_grad()``
    mlp_tanh       the same with Tanh
    transformer    ``dt.nn.TransformerBlock(512, 8)`` on (4, 256, 512), loss ``(y**2).mean()``,
                   AdamW (lr 1e-3, weight decay 0.01); the PyTorch side is the same block
                   written out (pre-norm, torch.nn.Linear and LayerNorm, causal attention with
                   matmuls, a cached tril mask and ``torch.softmax``, no SDPA; 4x MLP with
                   GELU tanh approximation), weights copied from dt's
    layer_norm     ``dt.layer_norm(x, w, b)`` on (4096, 1024), forward + ``y.backward(g)``
    softmax        ``dt.softmax(x, -1)`` on (1024, 1024), forward + ``y.backward(g)``
    cross_entropy  ``dt.cross_entropy(logits, labels)`` (mean) on (256, 8192), forward +
                   ``loss.backward()``

dt's Linear weight is (in, out) with ``y = x @ W + b``, PyTorch's (out, in): weights are
copied transposed. PyTorch's optimizers run with their defaults (on CPU: the per-parameter
for-loop, neither ``foreach`` nor ``fused``). For the kernel workloads every call starts with
the inputs' ``.grad`` set to None (untimed), so backward writes the gradients rather than
adding to old ones, on both sides; ``g`` is a fixed random upstream gradient (a DistTensor on
the dt side, so no conversion is timed).

Before the timing, in ``--quick`` too, a correctness check in float64 at the run's sizes: each
workload is built afresh on both sides from equal inputs; the training workloads take 2 steps
on the same batch and each step's loss (relative 1e-9) and gradients (read after
``backward()``, per tensor, 1e-9 of the tensor's largest element) must agree, and so must the
parameters after the 2 steps (1e-8 of how far they moved; a skipped or wrong optimizer step
fails); the kernel workloads compare their output and every input gradient (1e-9 of the
largest element). One exception: a gradient that is zero in exact arithmetic (the block's
``attn.k.bias``: adding b to every key adds q.b to a whole row of scores, which softmax
ignores) comes out as rounding noise on both sides (about 1e-17 of the largest gradient), so
a gradient at most 1e-12 of the step's largest gradient element on the PyTorch side must be
as small on dt's instead of equal, and its parameter (moved by weight decay, and by Adam's
``lr * noise / eps``) is compared at the scale of the model's largest parameter change.

On a mismatch the script prints what differed and exits 1; nothing is timed: a benchmark of
a wrong computation is worthless. Without PyTorch (not installed, or ``--no-torch``, which
does not import it) the check is skipped, with a line saying so, and only dt is timed: the
check is a comparison with PyTorch, and dt's own numerics are the test suite's job (tests/
checks every op and its gradient against numpy).

Timing: the method of bench/_timing.py, whose helpers run here on ``MPI.COMM_SELF`` (its
barrier and its max over ranks then do nothing): per workload ``--warmup`` untimed calls of
each side size the run to ``--budget`` (20) seconds of timed calls (10 to 400 calls a side),
then the two sides are interleaved in ``--rounds`` rounds with the order rotated, so a noisy,
shared machine slows both alike. The default is 40 rounds (bench/_timing.py's scripts use 8):
with no barrier between calls, switching sides costs nothing, and short blocks follow the
load of a shared machine closely. Only the ratios within a workload are fair comparisons;
the load can change between workloads.

Reported per workload: dt and PyTorch medians (ms), the ratio dt / PyTorch (the issue's goal:
at most the goal column), and the inter-quartile range of each side relative to its median
(IQR, the spread). A machine line first: CPU model, cores, load, numpy with its BLAS, torch
with its BLAS and thread count.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _threads_arg(argv: list[str]) -> int:
    """``--threads`` before numpy loads: its BLAS reads the thread count when it starts."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=1)
    return max(1, pre.parse_known_args(argv)[0].threads)


THREADS = _threads_arg(sys.argv[1:])
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = str(THREADS)

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import Stats, adaptive_iters, format_table, interleaved, load_line  # noqa: E402

import disttensor as dt  # noqa: E402

torch: Any = None  # optional, the PyTorch side: imported by main() unless --no-torch


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


LR = 1e-3
CHECK_STEPS = 2
LOSS_TOL = 1e-9  # |a - b| / |b| of a loss
GRAD_TOL = 1e-9  # max|a - b| / max|b| of an output or a gradient, per tensor
PARAM_TOL = 1e-8  # max|p_a - p_b| / max|p_b - p_initial|, per tensor, after the steps
# a gradient whose largest element is at most this times the largest gradient element of the
# step is zero in exact arithmetic (attn.k.bias: adding b to every key adds q.b to a whole
# row of scores, which softmax ignores), and both sides return rounding noise: it is checked
# to be that small on both sides instead of compared
ZERO_GRAD = 1e-12
PLANT = 1 + 1e-7  # --plant: the dt side's first input scaled by this (the check must fail)

# the goal per workload: dt's time / PyTorch's at most this
GOALS = {
    "mlp_gelu": 1.0,
    "mlp_tanh": 1.0,
    "transformer": 1.2,
    "layer_norm": 1.5,
    "softmax": 1.5,
    "cross_entropy": 1.0,
}
TRAINING = ("mlp_gelu", "mlp_tanh", "transformer")

FULL = {
    "mlp": {"layers": 16, "width": 256, "batch": 64},
    "transformer": {"dim": 512, "heads": 8, "batch": 4, "seq": 256},
    "layer_norm": (4096, 1024),
    "softmax": (1024, 1024),
    "cross_entropy": (256, 8192),
}
QUICK = {
    "mlp": {"layers": 4, "width": 32, "batch": 8},
    "transformer": {"dim": 32, "heads": 4, "batch": 2, "seq": 16},
    "layer_norm": (64, 128),
    "softmax": (64, 128),
    "cross_entropy": (32, 512),
}


class CheckFailed(Exception):
    pass


# -- the two sides of a workload -----------------------------------------------------------
@dataclass
class Side:
    """One side of a workload. ``call(record)`` is the timed work; with a dict ``record`` it
    also fills it with what the check compares (the loss or output and the gradients, as
    numpy arrays in dt's layout). ``before()`` runs untimed before every call. ``params()``
    (training workloads) gives the parameters in dt's layout."""

    call: Callable[[dict | None], Any]
    before: Callable[[], Any]
    params: Callable[[], dict[str, np.ndarray]] | None = None


def _nothing() -> None:
    return None


def _tdtype(dtype: np.dtype):
    return torch.float64 if np.dtype(dtype) == np.float64 else torch.float32


def _t(a: np.ndarray, grad: bool = False):
    """A torch tensor of a copy of ``a`` (so the two sides never share memory)."""
    return torch.from_numpy(np.array(a)).requires_grad_(grad)


def _dt_layout(name: str, a: np.ndarray) -> np.ndarray:
    """A torch parameter or gradient in dt's layout: Linear weights (out, in) -> (in, out)."""
    return a.T if a.ndim == 2 else a


def _copy_params(dt_model, torch_model) -> None:
    """dt's initial parameters into the torch model of the same parameter names."""
    src = dict(dt_model.named_parameters())
    dst = dict(torch_model.named_parameters())
    if src.keys() != dst.keys() or any(src[k].shape != dst[k].shape[::-1] for k in src):
        raise CheckFailed(
            f"the torch model does not mirror dt's: {[(k, v.shape) for k, v in src.items()]} vs "
            f"{[(k, tuple(v.shape)) for k, v in dst.items()]}"
        )
    with torch.no_grad():
        for k, p in src.items():
            dst[k].copy_(torch.from_numpy(np.ascontiguousarray(_dt_layout(k, p.numpy()))))


def _dt_training(model, opt, loss_fn: Callable, inputs: tuple) -> Side:
    def call(record: dict | None = None):
        loss = loss_fn(model(inputs[0]), *inputs[1:])
        loss.backward()
        if record is not None:
            record["loss"] = float(loss)
            record.update(
                (f"grad {k}", np.array(p.grad.numpy())) for k, p in model.named_parameters()
            )
        opt.step()
        opt.zero_grad()
        return loss

    return Side(
        call, _nothing, lambda: {k: np.array(p.numpy()) for k, p in model.named_parameters()}
    )


def _torch_training(model, opt, loss_fn: Callable, inputs: tuple) -> Side:
    def call(record: dict | None = None):
        loss = loss_fn(model(inputs[0]), *inputs[1:])
        loss.backward()
        if record is not None:
            record["loss"] = loss.item()
            record.update(
                (f"grad {k}", _dt_layout(k, p.grad.detach().numpy().copy()))
                for k, p in model.named_parameters()
            )
        opt.step()
        opt.zero_grad()
        return loss

    def params():
        return {k: _dt_layout(k, p.detach().numpy().copy()) for k, p in model.named_parameters()}

    return Side(call, _nothing, params)


def _dt_kernel(fn: Callable, leaves: dict[str, Any], g) -> Side:
    """``y = fn()``, then ``y.backward(g)`` (``g`` None: a scalar loss)."""

    def before():
        for v in leaves.values():
            v.grad = None

    def call(record: dict | None = None):
        y = fn()
        y.backward(g)
        if record is not None:
            record["output"] = np.array(y.numpy())
            record.update((f"grad {k}", np.array(v.grad.numpy())) for k, v in leaves.items())
        return y

    return Side(call, before)


def _torch_kernel(fn: Callable, leaves: dict[str, Any], g) -> Side:
    def before():
        for v in leaves.values():
            v.grad = None

    def call(record: dict | None = None):
        y = fn()
        y.backward(g)
        if record is not None:
            record["output"] = y.detach().numpy().copy()
            record.update((f"grad {k}", v.grad.numpy().copy()) for k, v in leaves.items())
        return y

    return Side(call, before)


# -- workloads -----------------------------------------------------------------------------
# each builder: (mesh, dtype, sizes, use torch, plant) -> (dt Side, torch Side or None)


def _torch_mlp(layers: int, width: int, act: str, dtype):
    mods = []
    for _ in range(layers):
        mods.append(torch.nn.Linear(width, width, dtype=dtype))
        mods.append(torch.nn.GELU(approximate="tanh") if act == "gelu" else torch.nn.Tanh())
    return torch.nn.Sequential(*mods)


def build_mlp(act: str):
    def build(mesh, dtype, sizes, use_torch: bool, plant: bool):
        s = sizes["mlp"]
        dt.manual_seed(0)
        mods: list[dt.nn.Module] = []
        for i in range(s["layers"]):
            mods.append(dt.nn.Linear(s["width"], s["width"], dtype=dtype, mesh=mesh, seed=i))
            mods.append(dt.nn.GELU() if act == "gelu" else dt.nn.Tanh())
        model = dt.nn.Sequential(*mods)
        rng = np.random.default_rng(1)
        x, target = rng.standard_normal((2, s["batch"], s["width"])).astype(dtype)
        xd = x * dtype.type(PLANT) if plant else x
        rep = [dt.Replicate()]
        dt_in = (dt.shard_tensor(xd, mesh, rep), dt.shard_tensor(target, mesh, rep))
        dt_side = _dt_training(
            model, dt.optim.Adam(model.parameters(), lr=LR), dt.nn.MSELoss(), dt_in
        )
        if not use_torch:
            return dt_side, None
        tm = _torch_mlp(s["layers"], s["width"], act, _tdtype(dtype))
        _copy_params(model, tm)
        t_side = _torch_training(
            tm,
            torch.optim.Adam(tm.parameters(), lr=LR),
            torch.nn.functional.mse_loss,
            (_t(x), _t(target)),
        )
        return dt_side, t_side

    return build


def torch_block(dim: int, heads: int, dtype, mlp_ratio: int = 4):
    """dt.nn.TransformerBlock (pre-norm; disttensor/nn/transformer.py) written out in PyTorch,
    with dt's parameter names (classes defined here: torch is imported only when used)."""

    class TorchAttention(torch.nn.Module):
        """dt.nn.MultiHeadAttention (causal, no dropout) written out in PyTorch."""

        def __init__(self, dim: int, heads: int, dtype) -> None:
            super().__init__()
            self.dim, self.heads = dim, heads
            self.q, self.k, self.v, self.proj = (
                torch.nn.Linear(dim, dim, dtype=dtype) for _ in range(4)
            )
            self.mask = torch.ones(0, 0, dtype=torch.bool)  # the (n, n) tril, cached

        def forward(self, x):
            b, n, _ = x.shape
            hd = self.dim // self.heads
            q, k, v = (
                f(x).view(b, n, self.heads, hd).transpose(1, 2) for f in (self.q, self.k, self.v)
            )
            scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(hd))
            if self.mask.shape != (n, n):
                self.mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
            scores = scores.masked_fill(~self.mask, float("-inf"))
            att = torch.softmax(scores, dim=-1)
            out = (att @ v).transpose(1, 2).reshape(b, n, self.dim)
            return self.proj(out)

    class TorchMLP(torch.nn.Module):
        """fc1 -> GELU (tanh approximation) -> fc2."""

        def __init__(self, dim: int, hidden: int, dtype) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(dim, hidden, dtype=dtype)
            self.act = torch.nn.GELU(approximate="tanh")
            self.fc2 = torch.nn.Linear(hidden, dim, dtype=dtype)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class TorchBlock(torch.nn.Module):
        """x + attn(ln1(x)), then x + mlp(ln2(x))."""

        def __init__(self, dim: int, heads: int, dtype, mlp_ratio: int = 4) -> None:
            super().__init__()
            self.ln1 = torch.nn.LayerNorm(dim, eps=1e-5, dtype=dtype)
            self.attn = TorchAttention(dim, heads, dtype)
            self.ln2 = torch.nn.LayerNorm(dim, eps=1e-5, dtype=dtype)
            self.mlp = TorchMLP(dim, mlp_ratio * dim, dtype)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    return TorchBlock(dim, heads, dtype, mlp_ratio)


def _square_mean(y):
    return (y**2).mean()


def build_transformer(mesh, dtype, sizes, use_torch: bool, plant: bool):
    s = sizes["transformer"]
    block = dt.nn.TransformerBlock(s["dim"], s["heads"], dtype=dtype, mesh=mesh, seed=0)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((s["batch"], s["seq"], s["dim"])).astype(dtype)
    xd = x * dtype.type(PLANT) if plant else x
    opt = dt.optim.AdamW(block.parameters(), lr=LR, weight_decay=0.01)
    dt_side = _dt_training(block, opt, _square_mean, (dt.shard_tensor(xd, mesh, [dt.Replicate()]),))
    if not use_torch:
        return dt_side, None
    tb = torch_block(s["dim"], s["heads"], _tdtype(dtype))
    _copy_params(block, tb)
    topt = torch.optim.AdamW(tb.parameters(), lr=LR, weight_decay=0.01)
    return dt_side, _torch_training(tb, topt, _square_mean, (_t(x),))


def _dt_leaves(mesh, arrays: dict[str, np.ndarray], plant: bool) -> dict[str, Any]:
    out = {}
    for i, (k, a) in enumerate(arrays.items()):
        a = a * a.dtype.type(PLANT) if plant and i == 0 else a
        out[k] = dt.shard_tensor(a, mesh, [dt.Replicate()], requires_grad=True)
    return out


def build_layer_norm(mesh, dtype, sizes, use_torch: bool, plant: bool):
    rows, cols = sizes["layer_norm"]
    rng = np.random.default_rng(3)
    arrays = {
        "x": rng.standard_normal((rows, cols)).astype(dtype),
        "weight": (1 + 0.1 * rng.standard_normal(cols)).astype(dtype),
        "bias": (0.1 * rng.standard_normal(cols)).astype(dtype),
    }
    g = rng.standard_normal((rows, cols)).astype(dtype)
    d = _dt_leaves(mesh, arrays, plant)
    dg = dt.shard_tensor(g, mesh, [dt.Replicate()])
    dt_side = _dt_kernel(lambda: dt.layer_norm(d["x"], d["weight"], d["bias"]), d, dg)
    if not use_torch:
        return dt_side, None
    t = {k: _t(a, grad=True) for k, a in arrays.items()}
    fn = torch.nn.functional.layer_norm
    return dt_side, _torch_kernel(
        lambda: fn(t["x"], (cols,), t["weight"], t["bias"], 1e-5), t, _t(g)
    )


def build_softmax(mesh, dtype, sizes, use_torch: bool, plant: bool):
    rows, cols = sizes["softmax"]
    rng = np.random.default_rng(4)
    arrays = {"x": (2 * rng.standard_normal((rows, cols))).astype(dtype)}
    g = rng.standard_normal((rows, cols)).astype(dtype)
    d = _dt_leaves(mesh, arrays, plant)
    dg = dt.shard_tensor(g, mesh, [dt.Replicate()])
    dt_side = _dt_kernel(lambda: dt.softmax(d["x"], -1), d, dg)
    if not use_torch:
        return dt_side, None
    t = {k: _t(a, grad=True) for k, a in arrays.items()}
    return dt_side, _torch_kernel(lambda: torch.softmax(t["x"], -1), t, _t(g))


def build_cross_entropy(mesh, dtype, sizes, use_torch: bool, plant: bool):
    rows, classes = sizes["cross_entropy"]
    rng = np.random.default_rng(5)
    arrays = {"logits": (2 * rng.standard_normal((rows, classes))).astype(dtype)}
    labels = rng.integers(0, classes, rows)
    d = _dt_leaves(mesh, arrays, plant)
    dl = dt.shard_tensor(labels, mesh, [dt.Replicate()])
    dt_side = _dt_kernel(lambda: dt.cross_entropy(d["logits"], dl), d, None)
    if not use_torch:
        return dt_side, None
    t = {k: _t(a, grad=True) for k, a in arrays.items()}
    tl = torch.from_numpy(labels)
    fn = torch.nn.functional.cross_entropy
    return dt_side, _torch_kernel(lambda: fn(t["logits"], tl), t, None)


BUILDERS = {
    "mlp_gelu": build_mlp("gelu"),
    "mlp_tanh": build_mlp("tanh"),
    "transformer": build_transformer,
    "layer_norm": build_layer_norm,
    "softmax": build_softmax,
    "cross_entropy": build_cross_entropy,
}


def describe(name: str, sizes: dict) -> str:
    if name.startswith("mlp"):
        s = sizes["mlp"]
        act = "GELU(tanh)" if name == "mlp_gelu" else "Tanh"
        return (
            f"{s['layers']} x (Linear({s['width']}, {s['width']}), {act}), batch {s['batch']}, "
            "MSE, Adam step"
        )
    if name == "transformer":
        s = sizes["transformer"]
        return (
            f"TransformerBlock({s['dim']}, {s['heads']}) on ({s['batch']}, {s['seq']}, "
            f"{s['dim']}), (y**2).mean(), AdamW step"
        )
    shape = sizes[name]
    return {
        "layer_norm": f"layer_norm(x, w, b) on {shape}, fwd + bwd",
        "softmax": f"softmax(x, -1) on {shape}, fwd + bwd",
        "cross_entropy": f"cross_entropy(logits {shape}, labels), mean, fwd + bwd",
    }[name]


# -- correctness check ---------------------------------------------------------------------
def _rel(a, b, scale: float) -> float:
    """max|a - b| / scale (inf when scale is 0 and a != b)."""
    diff = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def check(name: str, mesh, sizes, plant: bool) -> dict[str, float]:
    """The workload in float64 on both sides from equal inputs (module docstring). Returns the
    largest relative difference of each kind compared; raises CheckFailed on a mismatch."""
    f64 = np.dtype(np.float64)
    a, b = BUILDERS[name](mesh, f64, sizes, True, plant)
    failures: list[str] = []
    worst = dict.fromkeys(("outputs", "gradients", "parameters"), 0.0)

    def compare(kind: str, what: str, r: float, tol: float) -> None:
        worst[kind] = max(worst[kind], r)
        if not r <= tol:
            failures.append(f"{what}: relative difference {r:.3g} > {tol:g}")

    training = name in TRAINING
    init = b.params() if training else {}
    zero: set[str] = set()  # parameters whose gradient is zero in exact arithmetic
    if training:
        for k, p in a.params().items():  # the copy itself
            if not np.array_equal(p, init[k]):
                failures.append(f"initial {k}: dt and torch differ")
    for step in range(1, (CHECK_STEPS if training else 1) + 1):
        ra: dict = {}
        rb: dict = {}
        for side, rec in ((a, ra), (b, rb)):
            side.before()
            side.call(rec)
        if ra.keys() != rb.keys():
            failures.append(f"dt records {sorted(ra)}, torch {sorted(rb)}")
            break
        where = f"step {step} " if training else ""
        grads = [k for k in rb if k.startswith("grad ")]
        floor = ZERO_GRAD * max(float(np.max(np.abs(rb[k]))) for k in grads)
        for k in ra:
            if k in grads and float(np.max(np.abs(rb[k]))) <= floor:
                zero.add(k.removeprefix("grad "))  # zero in exact arithmetic: both noise
                dmax = float(np.max(np.abs(ra[k])))
                if not dmax <= floor:
                    failures.append(
                        f"{where}{k}: torch's is zero to rounding (max {np.max(np.abs(rb[k])):.3g}"
                        f" <= {ZERO_GRAD:g} x the largest gradient element), dt's is not "
                        f"(max {dmax:.3g})"
                    )
            elif k == "loss":
                what = f"{where}loss, dt {ra[k]!r} vs torch {rb[k]!r}"
                compare("outputs", what, _rel(ra[k], rb[k], abs(rb[k])), LOSS_TOL)
            elif np.shape(ra[k]) != np.shape(rb[k]):
                failures.append(f"{where}{k}: shapes dt {np.shape(ra[k])}, torch {np.shape(rb[k])}")
            else:
                scale = float(np.max(np.abs(rb[k])))
                what = f"{where}{k}, dt vs torch (max|torch| {scale:.3g})"
                kind = "outputs" if k == "output" else "gradients"
                compare(kind, what, _rel(ra[k], rb[k], scale), GRAD_TOL)
    if training:
        pa, pb = a.params(), b.params()
        change = {k: float(np.max(np.abs(pb[k] - init[k]))) for k in pb}
        for k in pb:
            moved = change[k]
            if not (float(np.max(np.abs(pa[k] - init[k]))) > 0 and moved > 0):
                failures.append(f"{k} did not change in {CHECK_STEPS} steps (dt or torch)")
                continue
            scale, of = moved, "its change max|p_torch - p_initial|"
            if k in zero:  # Adam's step on a rounding-noise gradient: noise / eps * lr
                scale, of = max(change.values()), "the model's largest parameter change"
            what = f"{k} after {CHECK_STEPS} steps, dt vs torch (relative to {of}, {scale:.3g})"
            compare("parameters", what, _rel(pa[k], pb[k], scale), PARAM_TOL)
    if failures:
        more = [f"... and {len(failures) - 20} more"] if len(failures) > 20 else []
        raise CheckFailed("\n".join(f"  {name}: {f}" for f in failures[:20] + more))
    return worst


# -- timing --------------------------------------------------------------------------------
def time_workload(sides: dict[str, Side], args) -> dict[str, Stats]:
    """bench/_timing.py's method on one process (COMM_SELF): warm-up calls size the run,
    then the sides interleaved in rounds with the order rotated."""
    comm = MPI.COMM_SELF
    fns = {k: s.call for k, s in sides.items()}
    befores = {k: s.before for k, s in sides.items()}
    t0 = time.perf_counter()
    for k, fn in fns.items():
        for _ in range(args.warmup):
            befores[k]()
            fn()
    per_call = (time.perf_counter() - t0) / max(args.warmup, 1)
    iters = args.iters or adaptive_iters(per_call, args.budget, lo=10, hi=400)
    return interleaved(comm, fns, iters, args.rounds, befores)


def machine_line(no_torch: bool) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        np_blas = f"{blas['name']} {blas.get('version', '')}".strip()
    except Exception:
        np_blas = "BLAS unknown"
    if torch is not None:
        cfg = torch.__config__.show()
        t_blas = next(
            (w.split("=", 1)[1].split(",")[0] for w in cfg.split() if w.startswith("BLAS_INFO=")),
            "?",
        )
        tline = f"torch {torch.__version__} ({t_blas}; get_num_threads {torch.get_num_threads()})"
    else:
        tline = "torch left out (--no-torch)" if no_torch else "torch not installed"
    return (
        f"machine: {cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; Python "
        f"{platform.python_version()}, numpy {np.__version__} ({np_blas}; OMP/OPENBLAS/"
        f"MKL_NUM_THREADS={THREADS}), {tline}; disttensor {getattr(dt, '__version__', '?')}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated: " + ",".join(GOALS))
    ap.add_argument("--threads", type=int, default=1, help="numpy BLAS and torch threads")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed calls each")
    ap.add_argument("--rounds", type=int, default=40, help="(one process: switching is cheap)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=None, help="fixed timed calls per side")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, a few calls (seconds)")
    ap.add_argument("--no-torch", action="store_true", help="time dt alone")
    ap.add_argument("--plant", default=None, help=argparse.SUPPRESS)  # a workload to get wrong
    args = ap.parse_args()
    names = list(GOALS) if args.only is None else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in names if n not in GOALS]
    if unknown:
        ap.error(f"--only: unknown workloads {unknown}; choose from {list(GOALS)}")
    sizes = FULL
    if args.quick:
        sizes = QUICK
        args.rounds, args.warmup, args.iters = 2, 1, args.iters or 4
    global torch
    torch = None if args.no_torch else import_torch()
    use_torch = torch is not None
    if use_torch:
        torch.set_num_threads(args.threads)
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    mesh = dt.ProcessMesh([0])
    print(machine_line(args.no_torch), flush=True)

    if use_torch:
        t0 = time.perf_counter()
        worst: dict[str, float] = {}
        try:
            for name in names:
                for k, r in check(name, mesh, sizes, plant=name == args.plant).items():
                    worst[k] = max(worst.get(k, 0.0), r)
        except CheckFailed as e:
            print(
                "kernels: correctness check FAILED (float64, dt against PyTorch; the benchmark "
                f"is invalid):\n{e}",
                flush=True,
            )
            return 1
        print(
            f"correctness check (float64, dt against PyTorch, {len(names)} workloads; training "
            f"{CHECK_STEPS} steps): dt and PyTorch agree (max rel diff: losses and outputs "
            f"{worst['outputs']:.1e}, gradients {worst['gradients']:.1e}, parameters "
            f"{worst['parameters']:.1e} of their change; tolerances {LOSS_TOL:g}, {GRAD_TOL:g}, "
            f"{PARAM_TOL:g}; {time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    else:
        why = "--no-torch" if args.no_torch else "PyTorch is not installed"
        print(f"{why}: timing dt alone; correctness check skipped (it compares with PyTorch)")

    rows = []
    for name in names:
        f32 = np.dtype(np.float32)
        dt_side, t_side = BUILDERS[name](mesh, f32, sizes, use_torch, False)
        sides = {"dt": dt_side} if t_side is None else {"dt": dt_side, "torch": t_side}
        st = time_workload(sides, args)
        goal = GOALS[name]
        d = st["dt"]
        if "torch" in st:
            t = st["torch"]
            ratio = d.median / t.median
            met = "yes" if ratio <= goal else "no"
            cells = [f"{t.median * 1e3:.2f}", f"{ratio:.2f}", f"<= {goal:g}", met]
            cells += [f"{d.spread:.0%}", f"{t.spread:.0%}"]
        else:
            absent = "left out" if args.no_torch else "not installed"
            cells = [absent, "-", f"<= {goal:g}", "-", f"{d.spread:.0%}", "-"]
        rows.append([name, f"{d.median * 1e3:.2f}", *cells, str(len(d.times))])
        print(f"  {name}: {describe(name, sizes)}: dt {d.median * 1e3:.2f} ms", flush=True)
        del dt_side, t_side, sides

    print()
    print(
        f"float32, {THREADS} thread(s) per side; medians of interleaved calls "
        f"({args.rounds} rounds, order rotated); IQR relative to the median"
    )
    headers = ["workload", "dt ms", "torch ms", "dt/torch", "goal", "met", "IQR dt",
               "IQR torch", "calls"]  # fmt: skip
    print(format_table(headers, rows))
    if args.quick:
        print("--quick: tiny sizes and a few calls, a smoke run; its times are not results")
    print(load_line(start, load_before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
