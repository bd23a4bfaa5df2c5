"""Data parallelism: fused gradient buckets, overlap with backward, gradient merge and sharded
data parallelism (ZeRO stages 1 to 3), in one run.

Run (N = 2 or 4 ranks; each rank one thread)::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/dp.py
    OMP_NUM_THREADS=1 mpiexec -n 4 python bench/dp.py
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/dp.py --quick   # smoke run, seconds
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/dp.py --only e  # table (e) alone, a minute
    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/dp.py --only e --model gpt  # (e), the GPT demo

``--only`` takes a comma list of tables (a, b, c, e; (d) comes with (b)) and runs those
alone, with the checks they need: the float64 agreement check for (b) and (c), (a)'s own
check for (a), the sharding check for (e).

All tables are timed with the method of bench/_timing.py: every timed call starts after a
barrier, its time is the max over ranks, the variants of a table are interleaved in rounds
with the order rotated, and the median is reported with the inter-quartile range (IQR,
relative to the median) as the spread. The number of calls adapts to a time budget per table
(``--budget``). Tables (b) and (c) start each call with a barrier that sleeps while it waits
(``Ibarrier`` + ``Test`` + a 50 us sleep) instead of MPI's busy-polling ``Barrier``, so the
ranks that idle during a one-process row do not take a core from rank 0 (with more ranks
than cores, N = 4 on this 2-core machine, a spinning rank would halve its speed).

(a) Fused vs one by one: ``--grads`` (1000) float32 gradients of ``--grad-size`` (1024)
elements, different on every rank, reduced (sum) over all ranks:

    raw one by one      1000 ``comm.Allreduce(g, out)``, a fresh ``out`` each (as dt does)
    raw fused           the pack copy ``np.concatenate(grads, out=flat)`` into one buffer
                        and one in-place ``Allreduce`` of it
    dt one by one       1000 ``Partial(sum)`` DistTensors, each ``dt.reshard(g, mesh,
                        [Replicate()])``: what ``dt.optim`` does per parameter without a
                        DataParallel wrapper (Note [Optimizer placements])
    dt buckets, no fuse DataParallel's Reducer with fusion off (``fuse=False``: a bucket each)
    dt buckets, fused   DataParallel's Reducer with its default caps (first bucket 1 MiB, then
                        25 MiB: 2 buckets for 1000 x 4 KiB)

The dt bucket rows drive ``disttensor.parallel.buckets.Reducer`` directly, exactly as
``DataParallel(overlap=False)`` does in one step, minus the backward pass around it: 1000
parameters get a Partial ``.grad`` (untimed, before the barrier), then the timed call is
``begin()``, ``arrive(p)`` for every parameter (what the post-accumulate-grad hook calls),
``flush()`` (pack every bucket, one blocking all-reduce each) and ``finish()`` (every
``.grad`` becomes a Replicate view into its bucket). A model of 1000 bias parameters would
time 1000 backward ops around 2 all-reduces; driving the Reducer measures the fused path
itself, per-gradient bookkeeping included. Goal: fused at least 5x faster than one by one.

(b) Step time of a ``--layers`` (50) x (``dt.nn.Linear(w, w)``, ``dt.nn.Tanh()``) MLP, width
``--width`` (128), ``dt.nn.MSELoss``, SGD (lr 0.01), global batch ``--batch`` (64), float32 (100
parameter tensors, 3.3 MB). One step is forward (with the loss), backward, ``opt.step()``
and ``opt.zero_grad()``; the loss is not read (a user would read it every few steps). Rows:

    dt 1 process        a 1-rank mesh on rank 0, the other ranks idle
    torch 1 process     the same model in PyTorch (nn.Linear + nn.Tanh, MSELoss, SGD,
                        ``torch.set_num_threads(1)``), on rank 0
    dt, no wrapper      all N ranks, batch Shard(0) over "dp", parameters Replicate; no
                        wrapper: ``opt.step()`` all-reduces each of the 100 gradients
    dt DP fuse=False    ``DataParallel(fuse=False, overlap=False)``: a bucket per gradient
    dt DP fused         ``DataParallel(overlap=False)``: buckets reduced when finished
    dt DP fused+overlap ``DataParallel()``: buckets reduced with ``Iallreduce`` during backward
    torch DDP           ``DistributedDataParallel`` (gloo, CPU) on the same model, batch and
                        ranks (torch.distributed initialized from the MPI rank and size)

The dt DataParallel rows call ``dp_model.finish_gradients()`` before ``opt.step()`` (it waits
for, or runs, the reductions; the step then finds nothing in flight), so the step's time is
split into forward, backward, finish, opt.step and zero_grad (each the median of its per-step
max over ranks; a rank that reaches a collective first waits there for the slowest, so
finish, and opt.step without the wrapper, also hold the ranks' skew). Goal: dt with fusion
and overlap faster than DDP (ratio dt / DDP < 1). With torch, a last line times the two
transports alone on a buffer of all the gradients: MPI ``Allreduce`` (dt's) against gloo's
``all_reduce`` (DDP's, TCP over the loopback here).

(c) Gradient merge: ``DataParallel(k_steps=4)``: a step is 4 micro-steps (forward and backward
of a batch of ``--batch`` each, reduced once after the 4th) and one opt.step; reported per
micro-step, next to the same wrapper with k = 1.

(d) Overlap: from the two fused rows of (b), how much of the reduction backward hid:
``hidden = 1 - wait_overlap / reduce_blocking``, where reduce_blocking is the time of
``finish_gradients()`` with overlap off (pack, all-reduce, views) and wait_overlap the same
call with overlap on (the wait for buckets in flight, views); with the backward times of
both, because overlap moves the pack copies and the launches into backward. Without an
asynchronous progress thread (MPICH's default) the all-reduce's copies and sums are done by
the ranks themselves inside MPI calls, here the ``Test`` calls DataParallel makes as each
gradient becomes final: on cores the ranks already fill, overlap moves that work into
backward rather than hiding it, so the net saving line matters as much as "hidden".

Before any timing, in ``--quick`` too, an agreement check in float64 at the run's sizes:
every variant is built afresh from the same initial weights (dt's seeded factories give the
same weights on every mesh; torch's are copied from dt's, transposed: dt's Linear weight is
(in, out) with ``y = x @ W + b``, torch's is (out, in)) and takes 3 SGD steps, a new batch
each. dt one process is the reference (on rank 0, broadcast); every rank checks its own copy
of every data-parallel variant (no wrapper, DP fuse=False, fused, fused+overlap, and k=4
gradient merge fed the same batches as 4 micro-batches of a quarter), torch one process and
DDP: each step's loss (the mean of the 4 micro-losses for k=4, the mean over ranks for DDP)
to 1e-9 relative, and every final parameter to 1e-9 of how far it moved
(``max|p - p_ref| <= 1e-9 * max|p_ref - p_initial|``); every variant must move every tensor.
(a)'s variants are checked too (exact sums of small integers). On a mismatch every rank
exits non-zero and rank 0 prints what differed; no time is reported.

(e) Sharded data parallelism: the MLP of (b) with AdamW (lr 1e-3: SGD keeps no state to
split), batch Shard(0) over "dp", float32, wrapped in ``DataParallel()`` (fused + overlap)
alone ("DP (plain)", the baseline) and with ``dt.shard_optimizer(opt,
dt.ShardingStage1/2/3("dp"))`` (Note [Sharding stages] in disttensor/parallel/sharding.py:
stage 1 splits the Adam moments over "dp", stage 2 also reduce-scatters the gradients into
slices during backward, stage 3 also keeps the parameters as slices between steps, a group
of modules gathered for its forward and again for its backward: with the default 25 MiB
buckets this model is one group; "small groups" gives stage 3 buckets of a quarter of the
model, so each layer is a group, as in a model larger than a bucket). One step and its
phases as in (b), the five variants interleaved. Goal: stages 1 and 2 within 1.05x of the
plain step, stage 3 within 1.3x (small groups: no time goal, its memory). Memory, per rank
(max over ranks), in MB (1e6 bytes):

    model state         ``dt.memory_report(model, opt)`` after ``opt.step()``, before
                        ``zero_grad()``: parameters + gradients + optimizer state; next to the
                        ideal (plain's, with the parts the stage splits divided by N; stage 3:
                        1/N) and what stays after ``zero_grad()``
    DP buckets          DataParallel's all-reduce bucket buffers (``dp_model.buckets``):
                        kept from step to step, the size of the gradients they hold (stages 2
                        and 3 reduce-scatter from the optimizer's scratch instead)
    traced held, peak   ``tracemalloc`` (numpy registers its buffers with it) on a fresh copy
                        of each variant, tracing from its construction through 2 warm-up
                        steps: the bytes held between steps (everything the variant keeps,
                        bucket buffers included), and the peak during one more step
                        (activations, gradients and communication buffers on top); untimed

``--model gpt``: (e) on the GPT of demos/gpt_dp_mp.py instead (its sizes: 2 transformer
blocks, dim 32, vocab 64, 30k parameters; replicated on the 1-D "dp" mesh, no tensor
parallelism), ``dt.cross_entropy`` on the demo's batch of token ids (8 windows of 16, Shard(0)
over "dp", even or not), AdamW lr 1e-3 with the demo's eps 1e-4 (see the check).

Before (e)'s timing, in ``--quick`` too, a float32 check at the run's sizes: plain and every
stage, built from the same seeds, take 3 AdamW steps on the same batches; each step's loss and
every final parameter (gathered) must match plain DataParallel's to 1e-5 relative
(``max|p - p_plain| <= 1e-5 * max|p_plain|`` per tensor), and every tensor must have moved.
The values need not be bitwise equal: over 3 or more ranks MPI may sum the reduce-scatter in
another order than the all-reduce. On a mismatch every rank exits non-zero, as above. The GPT
passes at the same tolerance with AdamW's eps 1e-4; with 1e-8 its attention key biases, whose
gradient is zero but for rounding (softmax ignores them), move by ~lr in a direction set by
the summation order: 5e-4 of their size after 3 steps on 4 ranks.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import (  # noqa: E402
    Stats,
    adaptive_iters,
    format_table,
    interleaved,
    load_line,
    mpi_library,
    timed_block,
)

import disttensor as dt  # noqa: E402
from disttensor.parallel.buckets import MiB, Reducer  # noqa: E402

LR = 0.01
K = 4  # gradient merge steps
CHECK_STEPS = 3
LOSS_TOL = 1e-9  # |loss_a - loss_ref| / |loss_ref|, every step


def loss_mismatches(
    failures: list[str], worst: dict, rank: int, name: str, losses: list[float],
    ref_losses: list[float], against: str, tol: float,
) -> None:  # fmt: skip
    """Each step's loss of variant ``name`` against the reference's (``against``): the worst
    relative difference into ``worst["loss"]``, a line into ``failures`` past ``tol``."""
    for s, (a, b) in enumerate(zip(losses, ref_losses, strict=True), 1):
        r = abs(a - b) / abs(b)
        worst["loss"] = max(worst["loss"], r)
        if not r <= tol:
            failures.append(
                f"rank {rank}: {name} step {s} loss {a!r} vs {against} {b!r}: relative "
                f"difference {r:.3g} > {tol:g}"
            )


PARAM_TOL = 1e-9  # max|p_a - p_ref| / max|p_ref - p_initial|, per tensor, after the steps
PHASES = ("forward", "backward", "finish", "opt.step", "zero_grad")
GOAL_FUSED = 5.0

try:  # optional: the torch rows
    import torch
except ImportError:
    torch = None


class CheckFailed(Exception):
    pass


# -- timing --------------------------------------------------------------------------------
def gentle_barrier(comm: MPI.Comm) -> None:
    """A barrier that sleeps while it waits, so idle ranks leave the cores to busy ones."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(5e-5)


def run_table(
    comm: MPI.Comm,
    fns: Mapping[str, Callable[[], Any]],
    befores: Mapping[str, Callable[[], Any]],
    budget_s: float,
    rounds: int,
    warmup: int,
    iters: int | None = None,
    resets: list | None = None,
) -> dict[str, Stats]:
    """bench/_timing.py's method with a ``before`` per variant: ``warmup`` untimed calls of
    each (their wall time sizes the run to ``budget_s`` unless ``iters`` is given), then the
    variants interleaved in ``rounds`` rounds with the order rotated. ``resets`` (lists)
    are emptied after the warm-up, so phase records hold the timed calls only."""
    t0 = time.perf_counter()
    for k, fn in fns.items():
        timed_block(comm, fn, warmup, befores[k])
    per_call = comm.allreduce((time.perf_counter() - t0) / max(warmup, 1), op=MPI.MAX)
    if iters is None:
        iters = adaptive_iters(per_call, budget_s, lo=8, hi=400)
    for r in resets or []:
        r.clear()
    return interleaved(comm, fns, iters, rounds, befores)


def ms(t: float) -> str:
    return f"{t * 1e3:.2f}"


# -- models --------------------------------------------------------------------------------
def build_dt_mlp(mesh: dt.ProcessMesh, layers: int, width: int, dtype: Any) -> dt.nn.Module:
    dt.manual_seed(0)  # the same weights on every mesh
    mods: list[dt.nn.Module] = []
    for _ in range(layers):
        mods += [dt.nn.Linear(width, width, dtype=dtype, mesh=mesh), dt.nn.Tanh()]
    return dt.nn.Sequential(*mods)


DEMOS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demos")


def gpt_demo():
    """demos/gpt_dp_mp.py as a module (its GPT, batches and sizes); (e) with --model gpt."""
    if DEMOS not in sys.path:
        sys.path.insert(0, DEMOS)
    import gpt_dp_mp

    return gpt_dp_mp


def build_dt_gpt(mesh: dt.ProcessMesh, dtype: Any) -> dt.nn.Module:
    """The demo's GPT, replicated on ``mesh`` (no tensor parallelism), seeded as the demo."""
    dt.manual_seed(0)  # the same weights on every mesh
    model = gpt_demo().GPT(dtype)
    dt.shard_layer(model, mesh, None)
    return model


# (name, wrapper arguments or None for no wrapper)
DP_MODES: dict[str, dict | None] = {
    "dt, no wrapper": None,
    "dt DP fuse=False": {"fuse": False, "overlap": False},
    "dt DP fused": {"overlap": False},
    "dt DP fused+overlap": {"overlap": True},
}


@dataclass
class DtRun:
    """A dt model, its optimizer and loss; ``step`` takes one optimizer step over the
    micro-batches given, recording phase times."""

    mesh: dt.ProcessMesh
    placements: list
    inner: dt.nn.Module
    dp: dt.DataParallel | None
    opt: Any  # dt.optim.SGD, or AdamW in (e), perhaps in a dt.shard_optimizer
    loss_fn: Callable = field(default_factory=dt.nn.MSELoss)  # (output, target) -> loss
    phases: list = field(default_factory=list)

    @classmethod
    def make(
        cls, mesh, args, dtype, wrap: dict | None, k: int = 1, dp: bool = True,
        optim: Callable | None = None, stage: type | None = None, model: str = "mlp",
    ) -> DtRun:  # fmt: skip
        """``optim(parameters)`` makes the optimizer (default SGD, lr ``LR``); ``stage`` (a
        dt.ShardingStage1, 2 or 3) shards it over "dp"; ``model`` "gpt": the GPT demo's
        model and cross entropy (the data: token ids and labels) instead of the MLP."""
        if model == "gpt":
            inner, loss_fn = build_dt_gpt(mesh, dtype), dt.cross_entropy
        else:
            inner, loss_fn = build_dt_mlp(mesh, args.layers, args.width, dtype), dt.nn.MSELoss()
        wrapper = None
        if wrap is not None:
            wrapper = dt.DataParallel(inner, mesh, dim="dp", k_steps=k, **wrap)
        model = inner if wrapper is None else wrapper
        opt = (
            dt.optim.SGD(model.parameters(), lr=LR) if optim is None else optim(model.parameters())
        )
        if stage is not None:  # a stage class, or a factory of the model's parameters
            made = stage("dp") if isinstance(stage, type) else stage("dp", inner.parameters())
            opt = dt.shard_optimizer(opt, made)
        placements = [dt.Shard(0)] if dp else [dt.Replicate()]
        return cls(mesh, placements, inner, wrapper, opt, loss_fn)

    @property
    def model(self):
        return self.inner if self.dp is None else self.dp

    def data(self, arrays: list[np.ndarray]) -> list[dt.DistTensor]:
        return [dt.shard_tensor(a, self.mesh, self.placements) for a in arrays]

    def step(self, micro: list, losses: list | None = None):
        pc = time.perf_counter
        tf = tb = 0.0
        loss = None
        for x, t in micro:
            t0 = pc()
            loss = self.loss_fn(self.model(x), t)
            t1 = pc()
            loss.backward()
            tb += pc() - t1
            tf += t1 - t0
            if losses is not None:  # the agreement check: a collective
                losses.append(float(loss))
        t2 = pc()
        if self.dp is not None:
            self.dp.finish_gradients()
        t3 = pc()
        self.opt.step()
        t4 = pc()
        self.opt.zero_grad()
        t5 = pc()
        self.phases.append((tf, tb, t3 - t2, t4 - t3, t5 - t4))
        return loss

    def params(self) -> list[np.ndarray]:
        """Parameters in (W, b) order, this rank's copies (Replicate: the whole tensor)."""
        return [p.to_local().copy() for p in self.inner.parameters()]

    def global_params(self) -> list[np.ndarray]:
        """Parameters in (W, b) order, whole (gathered where stage 3 keeps a slice)."""
        return [np.array(p.numpy(), copy=True) for p in self.inner.parameters()]


@dataclass
class TorchRun:
    """The same model in PyTorch, from dt's weights; ``ddp`` wraps it in DDP."""

    model: Any
    opt: Any
    phases: list = field(default_factory=list)

    @classmethod
    def make(cls, init: list[np.ndarray], dtype: Any, ddp: bool) -> TorchRun:
        tdtype = torch.float64 if np.dtype(dtype) == np.float64 else torch.float32
        mods = []
        for w, b in zip(init[0::2], init[1::2], strict=True):
            lin = torch.nn.Linear(w.shape[0], w.shape[1], dtype=tdtype)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
                lin.bias.copy_(torch.from_numpy(b))
            mods += [lin, torch.nn.Tanh()]
        model = torch.nn.Sequential(*mods)
        if ddp:
            model = torch.nn.parallel.DistributedDataParallel(model)
        return cls(model, torch.optim.SGD(model.parameters(), lr=LR))

    def step(self, micro: list, losses: list | None = None):
        pc = time.perf_counter
        tf = tb = 0.0
        loss = None
        for x, t in micro:
            t0 = pc()
            loss = torch.nn.functional.mse_loss(self.model(x), t)
            t1 = pc()
            loss.backward()
            tb += pc() - t1
            tf += t1 - t0
            if losses is not None:
                losses.append(loss.item())
        t3 = pc()
        self.opt.step()
        t4 = pc()
        self.opt.zero_grad()
        t5 = pc()
        self.phases.append((tf, tb, 0.0, t4 - t3, t5 - t4))
        return loss

    def params(self) -> list[np.ndarray]:
        """In dt's layout: W (in, out), b."""
        out = []
        for m in self.model.modules():
            if isinstance(m, torch.nn.Linear):
                out += [m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy()]
        return out


def init_torch_dist(comm: MPI.Comm) -> None:
    import torch.distributed as tdist

    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(comm.Get_rank()),
        WORLD_SIZE=str(comm.Get_size()),
    )
    tdist.init_process_group("gloo", init_method="env://")


def local_rows(a: np.ndarray, rank: int, n: int) -> np.ndarray:
    b = a.shape[0] // n
    return np.ascontiguousarray(a[rank * b : (rank + 1) * b])


def split(a: np.ndarray, k: int) -> list[np.ndarray]:
    return [np.ascontiguousarray(c) for c in np.split(a, k)]


# -- agreement check -----------------------------------------------------------------------
def agreement_check(comm, args, one, mesh) -> str:
    """Every variant, in float64, against dt on one process (module docstring). Returns the
    summary line; raises CheckFailed (on every rank) on a mismatch."""
    rank, n = comm.Get_rank(), comm.Get_size()
    start = time.perf_counter()
    f64 = np.float64
    rng = np.random.default_rng(1)
    batches = [rng.standard_normal((2, args.batch, args.width)) for _ in range(CHECK_STEPS)]
    failures: list[str] = []
    worst = {"loss": 0.0, "parameters": 0.0}

    def run(r, micro_of, init=None) -> tuple[list[float], list[np.ndarray]]:
        if init is not None and not all(
            np.array_equal(p, q) for p, q in zip(r.params(), init, strict=True)
        ):
            failures.append(f"rank {rank}: initial weights differ from dt 1 process")
        losses: list[float] = []
        for x, t in batches:
            got: list[float] = []
            r.step(micro_of(r, x, t), got)
            losses.append(float(np.mean(got)))
        return losses, r.params()

    def dt_micro(k):
        def micro(r, x, t):
            return list(zip(r.data(split(x, k)), r.data(split(t, k)), strict=True))

        return micro

    ref = None
    if rank == 0:
        r0 = DtRun.make(one, args, f64, None, dp=False)
        ref = (r0.params(), *run(r0, dt_micro(1)))
    init, ref_losses, ref_final = comm.bcast(ref, root=0)

    def compare(name: str, losses: list[float], final: list[np.ndarray]) -> None:
        loss_mismatches(failures, worst, rank, name, losses, ref_losses, "dt 1 process", LOSS_TOL)
        for i, (p, q, p0) in enumerate(zip(final, ref_final, init, strict=True)):
            what = f"layer {i // 2} {'weight' if i % 2 == 0 else 'bias'}"
            moved = float(np.max(np.abs(q - p0)))
            if not float(np.max(np.abs(p - p0))) > 0:
                failures.append(f"rank {rank}: {name}: {what} did not change in the steps")
            r = float(np.max(np.abs(p - q))) / moved if moved > 0 else float("inf")
            worst["parameters"] = max(worst["parameters"], r)
            if not r <= PARAM_TOL:
                failures.append(
                    f"rank {rank}: {name}: {what} differs from dt 1 process by {r:.3g} of its "
                    f"change ({moved:.3g}) > {PARAM_TOL:g}"
                )

    def guarded(name: str, fn) -> None:
        """Run the variant (an error there is uncaught: disttensor's hook ends the job), then
        compare; a comparison that cannot run is a failure (and the collectives go on)."""
        result = fn()
        try:
            compare(name, *result)
        except Exception as e:
            failures.append(f"rank {rank}: comparing {name} raised {e!r}")

    def dt_variant(name: str, wrap: dict | None, k: int = 1):
        r = DtRun.make(mesh, args, f64, wrap, k=k)
        if name == args.plant:  # the test that a wrong variant fails the check
            r.opt.set_lr(LR * (1 + 1e-7))
        return run(r, dt_micro(k), init)

    checked = ["dt 1 process"]
    for name, wrap in DP_MODES.items():
        guarded(name, lambda name=name, wrap=wrap: dt_variant(name, wrap))
        checked.append(name)
    name = f"dt DP fused+overlap k={K}"
    guarded(name, lambda: dt_variant(name, {}, K))
    checked.append(name)

    if torch is not None:

        def torch_micro(local):
            def micro(r, x, t):
                if local:
                    x, t = local_rows(x, rank, n), local_rows(t, rank, n)
                return [(torch.from_numpy(x), torch.from_numpy(t))]

            return micro

        if rank == 0:
            guarded(
                "torch 1 process",
                lambda: run(TorchRun.make(init, f64, False), torch_micro(False), init),
            )
        checked.append("torch 1 process")

        def ddp():
            losses, final = run(TorchRun.make(init, f64, True), torch_micro(True), init)
            return [comm.allreduce(v) / n for v in losses], final  # the global batch's loss

        guarded("torch DDP", ddp)
        checked.append("torch DDP")

    verdicts = comm.allgather((failures, worst))
    failures = [f for fs, _ in verdicts for f in fs]
    if failures:
        shown = [f"  {f}" for f in failures[:30]]
        if len(failures) > 30:
            shown.append(f"  ... and {len(failures) - 30} more")
        raise CheckFailed("\n".join(shown))
    worst = {k: max(w[k] for _, w in verdicts) for k in worst}
    return (
        f"agreement check (float64, {CHECK_STEPS} SGD steps, {len(checked)} variants: "
        f"{', '.join(checked)}): losses and final parameters agree with dt 1 process "
        f"(max rel diff: loss {worst['loss']:.1e}, parameters {worst['parameters']:.1e} of "
        f"their change; tolerances {LOSS_TOL:g}, {PARAM_TOL:g}; "
        f"{time.perf_counter() - start:.2f} s)"
    )


# -- (a) one by one vs fused ---------------------------------------------------------------
def fused_case(comm, mesh, args):
    """The variants of table (a), with what each must compute; returns (fns, befores,
    check)."""
    rank, n = comm.Get_rank(), comm.Get_size()
    size, count = args.grad_size, args.grads
    base = np.arange(size, dtype=np.int64)
    # small integers: every reduction order gives the same float32 sums
    grads = [((base + 7 * i + rank) % 251).astype(np.float32) for i in range(count)]
    want = [
        sum(((base + 7 * i + r) % 251) for r in range(n)).astype(np.float32) for i in range(count)
    ]
    flat = np.empty(size * count, np.float32)

    def raw_one():
        outs = []
        for g in grads:
            out = np.empty_like(g)
            comm.Allreduce(g, out, op=MPI.SUM)
            outs.append(out)
        return outs

    def raw_fused():
        np.concatenate(grads, out=flat)
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        return flat

    parts = [dt.dtensor_from_local(g, mesh, [dt.Partial()], global_shape=(size,)) for g in grads]
    rep = [dt.Replicate()]

    def dt_one():
        return [dt.reshard(p, mesh, rep) for p in parts]

    def reducer_case(caps):
        params = [dt.nn.Parameter(dt.zeros((size,), np.float32, mesh=mesh)) for _ in range(count)]
        red = Reducer(params, mesh, (0,), caps)
        backward_order = params[::-1]

        def before():
            for p, g in zip(params, parts):
                p.grad = g
            comm.Barrier()

        def fn():
            red.begin()
            for p in params:
                red.arrive(p, launch=False)
            red.flush(backward_order)
            return red.finish(1.0)

        return fn, before, params, red

    default_caps = (1.0 * MiB, 25.0 * MiB)  # DataParallel's defaults
    nofuse, nofuse_before, nofuse_params, _ = reducer_case((0, 0))
    fused, fused_before, fused_params, fused_red = reducer_case(default_caps)

    fns = {
        "raw one by one": raw_one,
        "raw fused": raw_fused,
        "dt one by one (dt.reshard)": dt_one,
        "dt buckets, fuse=False": nofuse,
        "dt buckets, fused": fused,
    }
    befores = {k: comm.Barrier for k in fns}
    befores["dt buckets, fuse=False"] = nofuse_before
    befores["dt buckets, fused"] = fused_before

    def check() -> list[str]:
        bad = []
        if not all(np.array_equal(a, b) for a, b in zip(raw_one(), want, strict=True)):
            bad.append("raw one by one")
        if not np.array_equal(raw_fused(), np.concatenate(want)):
            bad.append("raw fused")
        got = dt_one()
        if not all(
            g.placements == rep and np.array_equal(g.to_local(), w)
            for g, w in zip(got, want, strict=True)
        ):
            bad.append("dt one by one")
        for name, b4, fn, params in (
            ("dt buckets, fuse=False", nofuse_before, nofuse, nofuse_params),
            ("dt buckets, fused", fused_before, fused, fused_params),
        ):
            for _ in range(2):  # the first call builds the layout, the second reuses it
                b4()
                done = fn()
                ok = len(done) == count and all(
                    p.grad.placements == rep and np.array_equal(p.grad.to_local(), w)
                    for p, w in zip(params, want, strict=True)
                )
                if not ok:
                    bad.append(name)
                    break
        return [f"rank {rank}: (a) {b} computed a wrong sum" for b in bad]

    layout = fused_red.summary
    return fns, befores, check, layout


# -- (e) sharded data parallelism ----------------------------------------------------------
ADAM_LR = 1e-3
SHARD_TOL = 1e-5  # float32: max|p - p_plain| / max|p_plain| per tensor; loss relative
PLANT_SHARD = 1e-2  # --plant NAME: that variant's learning rate off by this much (float32)
PLAIN = "DP (plain)"


def stage3_small_groups(dim: str, params) -> dt.ShardingStage3:
    """Stage 3 with buckets of a quarter of the model's parameter bytes: smaller than the
    model, so each layer (a module whose parameters fit) is a group of its own, gathered for
    its forward and again for its backward (Note [Sharding stages])."""
    nbytes = sum(p.nbytes for p in params)
    return dt.ShardingStage3(dim, bucket_size_mb=nbytes / 4 / 2**20)


stage3_small_groups.stage = 3  # type: ignore[attr-defined]
SMALL_GROUPS = "DP + ShardingStage3 (small groups)"
SHARDED: dict[str, Any] = {  # (name, sharding stage or None)
    PLAIN: None,
    "DP + ShardingStage1": dt.ShardingStage1,
    "DP + ShardingStage2": dt.ShardingStage2,
    "DP + ShardingStage3": dt.ShardingStage3,
    SMALL_GROUPS: stage3_small_groups,  # what a model larger than a bucket does; no time goal
}
GOAL_STAGE = {1: 1.05, 2: 1.05, 3: 1.3}  # step time / plain
MEM_TOL = 0.03  # model state within 3 % of the ideal (uneven splits round up)


GPT_EPS = 1e-4  # --model gpt: AdamW's eps as in demos/gpt_dp_mp.py (why: sharding_check)


def adamw(params, eps: float = 1e-8) -> dt.optim.AdamW:
    return dt.optim.AdamW(params, lr=ADAM_LR, eps=eps)


def sharded_run(mesh: dt.ProcessMesh, args, name: str, dtype: Any = np.float32) -> DtRun:
    """Variant ``name`` of (e): DataParallel() (fused + overlap), AdamW, maybe sharded; the
    model of ``--model``."""
    eps = GPT_EPS if args.model == "gpt" else 1e-8

    def optim(params):
        return adamw(params, eps)

    return DtRun.make(
        mesh, args, dtype, {"overlap": True}, optim=optim, stage=SHARDED[name], model=args.model
    )


def sharding_batches(args, steps: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``steps`` global (input, target) batches for (e)'s model: the MLP's float32 normals,
    or the GPT demo's (token ids, next ids) windows (its own fixed seed)."""
    if args.model == "gpt":
        return [tuple(b) for b in gpt_demo().batches(steps)]
    rng = np.random.default_rng(seed)
    return [
        tuple(rng.standard_normal((2, args.batch, args.width)).astype(np.float32))
        for _ in range(steps)
    ]


def model_label(args) -> str:
    """(e)'s model in words, for the table's title."""
    if args.model == "gpt":
        g = gpt_demo()
        return (
            f"GPT of demos/gpt_dp_mp.py (vocab {g.VOCAB}, dim {g.DIM}, {g.HEADS} heads, "
            f"{g.LAYERS} blocks, seq {g.SEQ}; no tensor parallelism), dt.cross_entropy, "
            f"AdamW lr {ADAM_LR:g} eps {GPT_EPS:g} (the demo's), global batch {g.BATCH} (token ids)"
        )
    return (
        f"MLP {args.layers} x (Linear({args.width}, {args.width}), Tanh), MSELoss, AdamW lr "
        f"{ADAM_LR:g}, global batch {args.batch}"
    )


def stage_of(name: str) -> int:
    return 0 if SHARDED[name] is None else SHARDED[name].stage


def phase_median(comm: MPI.Comm, phases: list) -> np.ndarray:
    """Each phase's median over the steps of its per-step max over ranks."""
    a = np.array(phases, dtype=np.float64).reshape(-1, len(PHASES))
    comm.Allreduce(MPI.IN_PLACE, a, op=MPI.MAX)
    return np.median(a, axis=0)


def sharding_check(comm: MPI.Comm, args, mesh: dt.ProcessMesh) -> str:
    """Every stage against plain DataParallel, float32, AdamW (module docstring, (e)).
    Returns the summary line; raises CheckFailed (on every rank) on a mismatch."""
    rank = comm.Get_rank()
    start = time.perf_counter()
    batches = sharding_batches(args, CHECK_STEPS, seed=2)
    names: list[str] = []  # the parameters in words
    failures: list[str] = []
    init: list[np.ndarray] | None = None
    results: dict[str, tuple[list[float], list[np.ndarray]]] = {}
    for name in SHARDED:
        r = sharded_run(mesh, args, name)
        if name == args.plant:  # the test that a wrong variant fails the check
            r.opt.set_lr(ADAM_LR * (1 + PLANT_SHARD))
        first = r.global_params()
        if init is None:
            init = first
            if args.model == "gpt":
                names = [k for k, _ in r.inner.named_parameters()]
            else:
                names = [f"layer {i // 2} {'weight' if i % 2 == 0 else 'bias'}" for i in
                         range(len(first))]  # fmt: skip
        elif not all(np.array_equal(p, q) for p, q in zip(first, init, strict=True)):
            failures.append(f"rank {rank}: {name}: initial weights differ from {PLAIN}")
        losses: list[float] = []
        for x, t in batches:
            r.step([tuple(r.data([x, t]))], losses)
        results[name] = (losses, r.global_params())
        del r
    ref_losses, ref = results[PLAIN]
    worst_abs = {name: 0.0 for name in SHARDED if name != PLAIN}
    worst_rel = {"loss": 0.0, "parameters": 0.0}
    for name, (losses, final) in results.items():
        for i, (p, p0) in enumerate(zip(final, init, strict=True)):
            if not float(np.max(np.abs(p - p0))) > 0:
                failures.append(f"rank {rank}: {name}: {names[i]} did not change in the steps")
        if name == PLAIN:
            continue
        loss_mismatches(failures, worst_rel, rank, name, losses, ref_losses, PLAIN, SHARD_TOL)
        for i, (p, q) in enumerate(zip(final, ref, strict=True)):
            diff = float(np.max(np.abs(p - q)))
            rel = diff / float(np.max(np.abs(q)))
            worst_abs[name] = max(worst_abs[name], diff)
            worst_rel["parameters"] = max(worst_rel["parameters"], rel)
            if not rel <= SHARD_TOL:
                failures.append(
                    f"rank {rank}: {name}: {names[i]} differs from {PLAIN} by {diff:.3g} "
                    f"(max abs), {rel:.3g} of max|p| > {SHARD_TOL:g}"
                )
    verdicts = comm.allgather((failures, worst_abs, worst_rel))
    failures = [f for fs, _, _ in verdicts for f in fs]
    if failures:
        shown = [f"  {f}" for f in failures[:30]]
        if len(failures) > 30:
            shown.append(f"  ... and {len(failures) - 30} more")
        raise CheckFailed("\n".join(shown), "sharding check")
    diffs = ", ".join(
        f"{k.removeprefix('DP + ShardingStage')} {max(v[k] for _, v, _ in verdicts):.1e}"
        for k in worst_abs
    )
    rel = {k: max(w[k] for _, _, w in verdicts) for k in worst_rel}
    return (
        f"sharding check (float32, {CHECK_STEPS} AdamW steps, "
        f"{'GPT demo model, ' if args.model == 'gpt' else ''}{PLAIN} and DataParallel + "
        f"ShardingStage1, 2, 3): losses and final parameters agree with plain DataParallel "
        f"(max abs parameter diff, stage {diffs}; max rel: loss {rel['loss']:.1e}, "
        f"parameters {rel['parameters']:.1e} of max|p|; tolerance {SHARD_TOL:g}"
        + (
            f", as for the MLP: the GPT's AdamW takes the demo's eps {GPT_EPS:g}, not 1e-8, "
            "under which the attention key biases, whose gradient is rounding noise (softmax "
            "ignores them), would move by ~lr in a direction set by the summation order"
            if args.model == "gpt"
            else ""
        )
        + "; "
        f"{time.perf_counter() - start:.2f} s)"
    )


def traced_memory(comm: MPI.Comm, mesh, args, name: str, x_np, t_np) -> np.ndarray:
    """A fresh copy of variant ``name``, traced by tracemalloc from its construction through
    2 warm-up steps and one more (module docstring, (e)). Returns, in bytes on this rank:
    parameters, gradients, optimizer state (memory_report after opt.step), memory_report's
    total after zero_grad (its buffers included), DataParallel's bucket buffers, traced bytes
    held before the step,
    traced peak during the step."""
    gc.collect()
    tracemalloc.start()
    try:
        r = sharded_run(mesh, args, name)
        ((x, t),) = micro = [tuple(r.data([x_np, t_np]))]
        for _ in range(2):
            r.step(micro)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        loss = r.loss_fn(r.model(x), t)
        loss.backward()
        r.opt.step()
        step = dt.memory_report(r.inner, r.opt)
        r.opt.zero_grad()
        zero = dt.memory_report(r.inner, r.opt)
        del loss
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    buckets = sum(  # a sharding stage's reduce-scatter buckets hold no buffer
        b["bytes"]
        for b in r.dp.buckets.get("buckets", [])
        if b.get("collective") != "reduce_scatter"
    )
    parts = (step["parameters"], step["gradients"], step["optimizer_state"], zero["total"])
    return np.array([*parts, buckets, held, peak], dtype=np.float64)


def sharding_table(comm: MPI.Comm, args, mesh, x_np, t_np, iters, say) -> None:
    """Table (e): step time and memory of plain DataParallel and the three stages."""
    n = comm.Get_size()
    runs = {name: sharded_run(mesh, args, name) for name in SHARDED}
    fns: dict[str, Callable[[], Any]] = {}
    for name, r in runs.items():
        micro = [tuple(r.data([x_np, t_np]))]
        fns[name] = lambda r=r, micro=micro: r.step(micro)
    gentle = {k: (lambda: gentle_barrier(comm)) for k in fns}
    resets = [r.phases for r in runs.values()]
    st = run_table(comm, fns, gentle, args.budget, args.rounds, args.warmup, iters, resets)
    ph = {k: phase_median(comm, r.phases) for k, r in runs.items()}
    del runs, fns
    mem = {}
    for name in SHARDED:  # the same order on every rank
        m = traced_memory(comm, mesh, args, name, x_np, t_np)
        comm.Allreduce(MPI.IN_PLACE, m, op=MPI.MAX)
        mem[name] = m

    pbytes = mem[PLAIN][0]  # plain DataParallel: every parameter whole on every rank
    psize = f"{pbytes / 1e6:.1f} MB" if pbytes >= 1e6 else f"{pbytes / 1e3:.0f} kB"
    base = st[PLAIN].median
    say(
        "",
        f"(e) sharded data parallelism: {model_label(args)} "
        f'Shard(0) over "dp", float32 ({psize} of parameters), '
        f"DataParallel() (fused + overlap) alone and with dt.shard_optimizer(opt, "
        f'ShardingStage1/2/3("dp"), and stage 3 with buckets of a quarter of the model); '
        f"{n} ranks; {len(st[PLAIN].times)} steps per variant",
    )
    rows = [
        [k, ms(s.median), f"{s.spread:.0%}", f"{s.median / base:.2f}", *(ms(v) for v in ph[k])]
        for k, s in st.items()
    ]
    headers = ["variant", "step ms", "IQR", "/ plain", *(f"{p} ms" for p in PHASES)]
    say(format_table(headers, rows))
    say(
        "phases as in (b); 'finish' = dp_model.finish_gradients(): plain and stage 1 "
        "all-reduce the gradients in DataParallel's buckets, stages 2 and 3 reduce-scatter "
        "them there, during backward (with overlap 'finish' is the wait); stages 1 and 2 "
        "all-gather the updated parameters in opt.step; stage 3 gathers the parameters in "
        "forward (at the model's first module call)"
    )
    verdicts = []
    for k in SHARDED:
        if k in (PLAIN, SMALL_GROUPS):
            continue
        s = stage_of(k)
        ratio = st[k].median / base
        verdicts.append(
            f"stage {s} {ratio:.2f}x (goal <= {GOAL_STAGE[s]:g}x: "
            f"{'met' if ratio <= GOAL_STAGE[s] else 'NOT met'})"
        )
    say("step time / plain DataParallel: " + ", ".join(verdicts))

    plain = mem[PLAIN]
    p0, g0, o0 = plain[:3]
    unit, mb = ("MB", 1e6) if p0 + g0 + o0 >= 1e6 else ("kB", 1e3)  # kB: --quick
    rows, verdicts = [], []
    for k, m in mem.items():
        s = stage_of(k)
        total = float(m[:3].sum())
        ideal = (
            (p0 / n if s >= 3 else p0) + (g0 / n if s >= 2 else g0) + (o0 / n if s >= 1 else o0)
        ) / (p0 + g0 + o0)
        ratio = total / (p0 + g0 + o0)
        rows.append([
            k, *(f"{v / mb:.2f}" for v in m[:3]), f"{total / mb:.2f}", f"{ratio:.2f}",
            f"{ideal:.2f}", f"{m[3] / mb:.2f}", f"{m[4] / mb:.2f}", f"{m[5] / mb:.2f}",
            f"{m[6] / mb:.2f}", f"{(m[6] - m[5]) / mb:.2f}", f"{m[6] / plain[6]:.2f}",
        ])  # fmt: skip
        if s:
            ok = ratio <= ideal * (1 + MEM_TOL)
            name = f"stage {s}" + (" (small groups)" if k == SMALL_GROUPS else "")
            verdicts.append(
                f"{name} {ratio:.2f} (ideal {ideal:.2f}{', 1/N' if s == 3 else ''}: "
                f"{'met' if ok else 'NOT met'})"
            )
    say(
        "",
        f"(e) memory per rank, {unit} (max over ranks); model state = dt.memory_report after "
        "opt.step(); traced = tracemalloc on a fresh copy since its construction",
    )
    headers = [
        "variant", "params", "grads", "opt state", "model state", "/ plain", "ideal",
        "after zero_grad", "DP buckets", "traced held", "step peak", "peak - held",
        "peak / plain",
    ]  # fmt: skip
    say(format_table(headers, rows))
    say(
        "model state / plain DataParallel (goal: the split parts 1/N of plain's, stage 3 "
        "about 1/N in all): " + ", ".join(verdicts),
        "ideal: plain's parameters, gradients and optimizer state with the parts the stage "
        f"splits divided by N = {n}; after zero_grad: memory_report's total then, its "
        "buffers included (DataParallel's buckets; a sharded optimizer's scratch, as large as "
        "its largest bucket, and its gradient blocks); DP buckets: DataParallel's bucket "
        "buffers (stages 2 and 3 reduce-scatter from the optimizer's scratch instead); "
        "traced held: all the variant keeps between steps; step peak: the most it held during "
        "one step (forward to zero_grad); peak - held: what the step allocated on top",
    )


# -- main ----------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grads", type=int, default=1000, help="(a): gradients")
    ap.add_argument("--grad-size", type=int, default=1024, help="(a): float32 elements each")
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64, help="global batch (per micro-step)")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed calls per table")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true", help="leave the torch rows out")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, a few calls (< 20 s)")
    ap.add_argument(
        "--only", default="a,b,c,e", metavar="TABLES",
        help="comma list of the tables to run: a, b (with d), c, e (default: all)",
    )  # fmt: skip
    ap.add_argument(
        "--model", default="mlp", choices=["mlp", "gpt"],
        help="(e): the MLP of (b) (default), or the GPT of demos/gpt_dp_mp.py (its sizes)",
    )  # fmt: skip
    ap.add_argument("--plant", default=None, help=argparse.SUPPRESS)  # a variant to get wrong
    args = ap.parse_args()
    tables = {t.strip().replace("d", "b") for t in args.only.split(",") if t.strip()}
    if not tables or not tables <= set("abce"):
        ap.error(f"--only {args.only!r}: a comma list of a, b, c, d, e")
    global torch
    torch_note = "torch not installed"
    if args.no_torch:
        torch = None
    if "b" not in tables and torch is not None:  # the torch rows and their check are (b)'s
        torch, torch_note = None, "torch not used"
    iters = None
    if args.quick:
        args.grads, args.grad_size, args.layers, args.width, args.batch = 100, 256, 4, 16, 16
        args.rounds, args.warmup, iters = 2, 1, 4

    start, load_before = time.perf_counter(), os.getloadavg()[0]
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    if n < 2:
        sys.exit("bench/dp.py compares data parallelism over N >= 2 ranks: mpiexec -n N")
    if tables & {"b", "c"} and args.batch % (K * n):  # (e) takes uneven batches
        sys.exit(f"--batch {args.batch} must be a multiple of {K} x {n} ranks (k={K} merge)")
    one = dt.ProcessMesh([0], dim_names=["dp"])
    mesh = dt.ProcessMesh(list(range(n)), dim_names=["dp"])
    if torch is not None:
        torch.set_num_threads(1)
        init_torch_dist(comm)

    def say(*lines: str) -> None:
        if rank == 0:
            print(*lines, sep="\n", flush=True)

    cores = os.cpu_count() or 1
    say(
        f"bench/dp.py: {n} ranks on {cores} cores"
        + (f" (OVERSUBSCRIBED: {n} ranks share {cores} cores)" if n > cores else "")
        + f", 1 thread per rank; {mpi_library()}, "
        f"mpi4py {sys.modules['mpi4py'].__version__}, numpy {np.__version__}, "
        + (f"torch {torch.__version__}" if torch is not None else torch_note)
        + ("" if tables == set("abce") else f"; tables {', '.join(sorted(tables))} only")
    )
    if n > cores:
        say(
            "  (more ranks than cores: MPI ranks busy-poll in collectives and share the "
            "cores, so absolute times are inflated and noisy; gloo (DDP) blocks instead of "
            "polling; compare within a table)"
        )

    # -- agreement check ---------------------------------------------------------------
    try:
        if tables & {"b", "c"}:
            say(agreement_check(comm, args, one, mesh))
        if "a" in tables:
            fns_a, befores_a, check_a, layout = fused_case(comm, mesh, args)
            bad = [f for fs in comm.allgather(check_a()) for f in fs]
            if bad:
                raise CheckFailed("\n".join(f"  {f}" for f in bad))
        if "e" in tables:
            say(sharding_check(comm, args, mesh))
    except CheckFailed as e:
        what = e.args[1] if len(e.args) > 1 else "agreement check"
        say(f"dp: {what} FAILED (the benchmark is invalid):", e.args[0])
        return 1

    rng = np.random.default_rng(0)
    f32 = np.float32
    x_np, t_np = rng.standard_normal((2, args.batch, args.width)).astype(f32)
    merge = rng.standard_normal((K, 2, args.batch, args.width)).astype(f32)

    # -- (a) -----------------------------------------------------------------------------
    if "a" in tables:
        st = run_table(comm, fns_a, befores_a, args.budget, args.rounds, args.warmup, iters)
        lay = layout()
        sizes = " + ".join(f"{b['bytes'] / MiB:.2f} MiB" for b in lay["buckets"])
        mb = args.grads * args.grad_size * 4 / MiB
        say(
            "",
            f"(a) {args.grads} float32 gradients of {args.grad_size} elements ({mb:.2f} MiB), "
            f"sum over {n} ranks; {len(st['raw fused'].times)} calls per variant",
        )
        rows = [
            [k, ms(s.median), f"{s.median / args.grads * 1e6:.1f}", f"{s.spread:.0%}"]
            for k, s in st.items()
        ]
        say(format_table(["variant", "ms (median)", "us per gradient", "IQR"], rows))
        raw_x = st["raw one by one"].median / st["raw fused"].median
        dt_x = st["dt one by one (dt.reshard)"].median / st["dt buckets, fused"].median
        say(
            f"dt fused = DataParallel's Reducer, default caps: {len(lay['buckets'])} buckets "
            f"({sizes})",
            f"fused speed-up, raw mpi4py: {raw_x:.1f}x; dt (reshard one by one -> buckets): "
            f"{dt_x:.1f}x (goal: fused >= {GOAL_FUSED:g}x faster than one by one: "
            f"{'met' if dt_x >= GOAL_FUSED else 'NOT met'})",
            f"dt fused / raw fused: "
            f"{st['dt buckets, fused'].median / st['raw fused'].median:.2f}x; "
            f"dt one by one / raw one by one: "
            f"{st['dt one by one (dt.reshard)'].median / st['raw one by one'].median:.2f}x",
        )
        del fns_a, befores_a

    # -- (b) -----------------------------------------------------------------------------
    if "b" in tables:
        runs: dict[str, Any] = {}
        fns: dict[str, Callable[[], Any]] = {}
        idle_phases: dict[str, list] = {}

        def on_rank0(name: str, r, micro) -> None:
            if rank == 0:
                runs[name] = r
                fns[name] = lambda: r.step(micro)
            else:
                idle_phases[name] = []
                fns[name] = lambda: idle_phases[name].append((0.0,) * len(PHASES))

        r1 = DtRun.make(one, args, f32, None, dp=False) if rank == 0 else None
        init32 = comm.bcast(r1.params() if rank == 0 else None, root=0)
        on_rank0("dt 1 process", r1, [tuple(r1.data([x_np, t_np]))] if rank == 0 else None)
        if torch is not None:
            tr = TorchRun.make(init32, f32, ddp=False) if rank == 0 else None
            on_rank0("torch 1 process", tr, [(torch.from_numpy(x_np), torch.from_numpy(t_np))])
        for name, wrap in DP_MODES.items():
            r = runs[name] = DtRun.make(mesh, args, f32, wrap)
            micro = [tuple(r.data([x_np, t_np]))]
            fns[name] = lambda r=r, micro=micro: r.step(micro)
        if torch is not None:
            r = runs["torch DDP"] = TorchRun.make(init32, f32, ddp=True)
            micro = [tuple(torch.from_numpy(local_rows(a, rank, n)) for a in (x_np, t_np))]
            fns["torch DDP"] = lambda r=r, micro=micro: r.step(micro)

        def phases_of(name: str) -> list:
            return runs[name].phases if name in runs else idle_phases[name]

        def phase_medians(names) -> dict[str, np.ndarray]:
            out = {}
            for k in names:  # the same calls on every rank, in the same order
                a = np.array(phases_of(k), dtype=np.float64).reshape(-1, len(PHASES))
                comm.Allreduce(MPI.IN_PLACE, a, op=MPI.MAX)
                out[k] = np.median(a, axis=0)
            return out

        gentle = {k: (lambda: gentle_barrier(comm)) for k in fns}
        resets = [phases_of(k) for k in fns]
        st = run_table(comm, fns, gentle, args.budget, args.rounds, args.warmup, iters, resets)
        ph = phase_medians(fns)
        nparams = 2 * args.layers
        pbytes = nparams // 2 * (args.width * args.width + args.width) * 4
        say(
            "",
            f"(b) step time, MLP {args.layers} x (Linear({args.width}, {args.width}), Tanh), "
            f"MSELoss, SGD lr {LR}, global batch {args.batch}, float32 ({nparams} parameter "
            f"tensors, {pbytes / 1e6:.1f} MB); {len(st['dt 1 process'].times)} steps per variant",
        )
        rows = []
        ddp = st.get("torch DDP")
        for k, s in st.items():
            ranks = "1" if "1 process" in k else str(n)
            rows.append([
                k, ranks, ms(s.median), f"{s.spread:.0%}", *(ms(v) for v in ph[k]),
                "-" if ddp is None else f"{s.median / ddp.median:.2f}",
            ])  # fmt: skip
        if torch is None:
            rows.insert(1, ["torch 1 process", "1", "torch not installed", *[""] * 7])
            rows.append(["torch DDP", str(n), "torch not installed", *[""] * 7])
        headers = ["variant", "ranks", "step ms", "IQR", *(f"{p} ms" for p in PHASES), "/ DDP"]
        say(format_table(headers, rows))
        say(
            "phases: medians of each phase's per-step max over ranks (they need not add up to "
            "the step's median); 'finish' = dp_model.finish_gradients() (DataParallel rows); "
            "without the wrapper the all-reduces are inside opt.step; DDP's reductions are "
            "inside its backward"
        )
        ovl = st["dt DP fused+overlap"].median
        if ddp is not None:
            ratio = ovl / ddp.median
            say(
                f"dt DP fused+overlap / torch DDP: {ratio:.2f} (goal: dt with fusion and overlap "
                f"faster than DDP, ratio < 1: {'met' if ratio < 1 else 'NOT met'})",
                f"dt 1 process / torch 1 process: "
                f"{st['dt 1 process'].median / st['torch 1 process'].median:.2f}",
            )
        else:
            say("dt DP fused+overlap / torch DDP: torch not installed (goal: dt faster than DDP)")
        say(
            f"speed-up over dt 1 process, {n} ranks: "
            + ", ".join(f"{k} {st['dt 1 process'].median / st[k].median:.2f}x" for k in DP_MODES)
        )
        if torch is not None:  # what the two transports cost for this model's gradients
            import torch.distributed as tdist

            grad_elems = pbytes // 4
            buf, tbuf = np.zeros(grad_elems, f32), torch.zeros(grad_elems)  # sums stay 0
            fns_t = {
                "MPI": lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                "gloo": lambda: tdist.all_reduce(tbuf),
            }
            gentle_t = {k: (lambda: gentle_barrier(comm)) for k in fns_t}
            st_t = run_table(
                comm, fns_t, gentle_t, args.budget / 4, args.rounds, args.warmup, iters
            )
            say(
                f"one all-reduce of all {pbytes / 1e6:.1f} MB of gradients, the transports alone: "
                f"MPI Allreduce (dt) {ms(st_t['MPI'].median)} ms (IQR {st_t['MPI'].spread:.0%}), "
                f"gloo all_reduce (DDP) {ms(st_t['gloo'].median)} ms "
                f"(IQR {st_t['gloo'].spread:.0%})"
            )

    # -- (d) -----------------------------------------------------------------------------
    if "b" in tables:
        blocking = ph["dt DP fused"]
        overlap = ph["dt DP fused+overlap"]
        red, wait = blocking[2], overlap[2]
        hidden = 1 - wait / red if red > 0 else float("nan")
        net = (blocking[1] + blocking[2]) - (overlap[1] + overlap[2])
        say(
            "",
            f"(d) overlap: reduce_blocking (finish_gradients, overlap off: pack + all-reduce + "
            f"views) {ms(red)} ms; wait_overlap (finish_gradients, overlap on: wait + views) "
            f"{ms(wait)} ms; hidden = 1 - wait_overlap / reduce_blocking = {hidden:.0%}",
            f"    backward {ms(blocking[1])} ms (overlap off) vs {ms(overlap[1])} ms (overlap on: "
            f"the pack copies, launches and MPI tests run in it); backward + finish saved by "
            f"overlap: {ms(net)} ms per step",
        )

    # -- (c) -----------------------------------------------------------------------------
    if "c" in tables:
        if "b" in tables:
            k1 = runs["dt DP fused+overlap"]
            fn_k1 = fns["dt DP fused+overlap"]
        else:  # (c) alone: its own k=1 run
            k1 = DtRun.make(mesh, args, f32, {"overlap": True})
            micro_1 = [tuple(k1.data([x_np, t_np]))]

            def fn_k1():
                return k1.step(micro_1)

        rk = DtRun.make(mesh, args, f32, {"overlap": True}, k=K)
        micro_k = [tuple(rk.data([m[0], m[1]])) for m in merge]
        fns_c = {
            "dt DP fused+overlap, k=1": fn_k1,
            f"dt DP fused+overlap, k={K}": lambda: rk.step(micro_k),
        }
        gentle_c = {k: (lambda: gentle_barrier(comm)) for k in fns_c}
        st = run_table(
            comm,
            fns_c,
            gentle_c,
            args.budget,
            args.rounds,
            args.warmup,
            iters,
            [k1.phases, rk.phases],
        )
        a = np.array(k1.phases).reshape(-1, len(PHASES))
        b = np.array(rk.phases).reshape(-1, len(PHASES))
        comm.Allreduce(MPI.IN_PLACE, a, op=MPI.MAX)
        comm.Allreduce(MPI.IN_PLACE, b, op=MPI.MAX)
        ph1, phk = np.median(a, axis=0), np.median(b, axis=0) / K
        s1, sk = st["dt DP fused+overlap, k=1"], st[f"dt DP fused+overlap, k={K}"]
        say(
            "",
            f"(c) gradient merge: DataParallel(k_steps={K}), a step = {K} micro-steps of batch "
            f"{args.batch} + one reduction and opt.step; per micro-step; "
            f"{len(s1.times)} steps per variant",
        )
        rows = [
            ["k=1", ms(s1.median), f"{s1.spread:.0%}", *(ms(v) for v in ph1)],
            [f"k={K}", ms(sk.median / K), f"{sk.spread:.0%}", *(ms(v) for v in phk)],
        ]
        say(
            format_table(
                ["DP fused+overlap", "micro-step ms", "IQR", *(f"{p} ms" for p in PHASES)], rows
            )
        )
        say(
            f"phases per micro-step: for k={K} the step's forward and backward (the {K} passes), "
            f"finish, opt.step and zero_grad, divided by {K}"
        )
        say(f"k={K} / k=1 per micro-step: {sk.median / K / s1.median:.2f}")
    # -- (e) -----------------------------------------------------------------------------
    if "e" in tables:
        e_x, e_t = (x_np, t_np) if args.model == "mlp" else sharding_batches(args, 1, 0)[0]
        sharding_table(comm, args, mesh, e_x, e_t, iters, say)

    say("", load_line(start, load_before))
    if torch is not None:
        import torch.distributed as tdist

        tdist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
