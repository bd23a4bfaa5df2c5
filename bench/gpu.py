"""GPU benchmarks: dispatch overhead, the fused kernels, the DP+MP demo step, NCCL bandwidth.

Run (needs CuPy and a GPU; without them it prints why and exits 0)::

    OMP_NUM_THREADS=1 python bench/gpu.py                      # one GPU
    OMP_NUM_THREADS=1 mpiexec -n N python bench/gpu.py         # N ranks, a GPU each
    OMP_NUM_THREADS=1 python bench/gpu.py --quick              # smoke run, small sizes
    OMP_NUM_THREADS=1 python bench/gpu.py --only b,d           # some sections

Every rank uses GPU ``local rank % GPU count`` (``disttensor.backend.set_device("gpu")``).
Sections (a) and (b) run on every rank alone (each its own GPU) and report the max over the
ranks of each median; (c) and (d) run over all ranks together, each call's time the max over
the ranks (bench/_timing.py's ``interleaved``). The method is bench/_timing.py's:
the variants of a table are interleaved in rounds with the order rotated, so a slow spell
hits all of them alike, and medians are reported. Device time is measured with CUDA events
around a run of calls on the current stream (``end.synchronize()`` then
``cupy.cuda.get_elapsed_time``); host time with ``time.perf_counter`` around a run of calls
that starts and ends with a stream synchronization, so queued kernels are paid for.

(a) Dispatch overhead: a cached dt op on a 1-rank mesh of 8x8 float32 device tensors
    (``x + y``, ``x @ w``, ``x.sum(axis=1)``, ``np.tanh(x)``) against the same CuPy call on
    the local arrays; per call, host time of loops of ``--number`` calls. Overhead = dt - CuPy.
    Goal: at most 15 us.
(b) Fused kernels (kernels/, docs/kernels.md) against their unfused CuPy composition (the
    same arithmetic as a sequence of CuPy array operations; the two must agree before they
    are timed, relative 1e-4 in float32) and against the memory-bandwidth floor: the bytes
    the kernel must move at least (``bytes_moved``: every input read once, every output
    written once) over the device-to-device copy bandwidth measured on the same GPU
    (``2 * nbytes / time`` of ``dst[...] = src``). Goal: fused within 1.5x of the floor.
(c) One training step of demos/mlp_dp_mp.py's model (Linear -> LayerNorm -> Linear, MSE,
    Adam; dt.DataParallel over "dp", fc1 column- and fc2 row-parallel over "mp") on a
    (dp, mp) mesh of all ranks (1x1 on one rank), with device tensors and with numpy ones:
    forward, backward, ``opt.step()`` and ``zero_grad()``, the loss read with ``float()``.
    Before the timing, 3 float64 steps of both must give the same losses (relative 1e-9).
(d) All-reduce bandwidth (sum, float32, 1 to 256 MiB) over all ranks: NCCL
    (``nccl_group(world).allreduce``) against MPI with host staging (the world's MPI
    communicator given device arrays: device-to-host copy, MPI, host-to-device copy), each
    call followed by a stream synchronization. Reported: time, algorithm bandwidth
    (bytes / time) and bus bandwidth (x 2 (n - 1) / n, NCCL's convention), NCCL's speed-up.
(e) Training workloads against PyTorch eager on the same GPU (rank 0 alone; skipped where
    torch has no CUDA): ``dt.nn.TransformerBlock(1024, 16)`` on (8, 512, 1024), forward,
    backward and AdamW (and forward alone), and an MLP of 16 x (Linear(256, 256) + GELU), batch
    64, Adam, each step on the host clock between stream synchronizations; GELU (tanh) on
    4096 x 4096 and softmax on (8, 16, 512, 512) forward, on CUDA events. The PyTorch side is
    the same model written with torch.nn (attention written out, no fused SDPA), float32 with
    TF32 off on both sides. Memory: the CuPy pool's bytes after three steps against PyTorch's
    peak reserved memory. Goals (dt / PyTorch): the block step 1.1 and no more memory, the
    MLP 1.5, GELU and softmax 1.2.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Any

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SECTIONS = "abcde"
MiB = 1 << 20
DISPATCH_GOAL_US = 15.0
FLOOR_GOAL = 1.5

# (b): the sizes of each kernel, (full run, --quick): n elements, or (rows, cols), or
# (members, elements per member)
KERNEL_SIZES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "adam_update": ((1 << 24,), (1 << 16,)),
    "xent_forward": ((4096, 16384), (64, 1000)),
    "xent_backward": ((4096, 16384), (64, 1000)),
    "layer_norm_forward": ((16384, 4096), (64, 512)),
    "layer_norm_backward": ((16384, 4096), (64, 512)),
    "bucket_pack": ((256, 1 << 16), (10, 1000)),
    "bucket_unpack": ((256, 1 << 16), (10, 1000)),
}
ALLREDUCE_MIB = ((1, 4, 16, 64, 256), (1, 4))


# -- what can be checked without a GPU ----------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--only`` is a comma-separated subset of a, b, c, d, e.

    >>> parse_args(["--quick", "--only", "b,d"]).only
    'bd'
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, few rounds (a smoke run)")
    p.add_argument("--only", default="a,b,c,d,e", help="sections to run, e.g. b,d (default all)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per table (default 8)")
    p.add_argument("--number", type=int, default=200, help="(a): calls per timed loop")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = p.parse_args(argv)
    chosen = [s.strip().lower() for s in args.only.split(",") if s.strip()]
    bad = [s for s in chosen if s not in SECTIONS]
    if bad or not chosen:
        p.error(f"--only takes sections from a, b, c, d, e; got {args.only!r}")
    args.only = "".join(s for s in SECTIONS if s in chosen)
    if args.rounds is None:
        args.rounds = 2 if args.quick else 8
    if args.rounds < 1 or args.number < 1:
        p.error("--rounds and --number must be at least 1")
    return args


def gpu_missing() -> str | None:
    """Why this machine cannot run the benchmark (no CuPy, no GPU), or None."""
    try:
        import cupy
    except Exception as e:  # ImportError, or CUDA libraries that do not load
        return f"CuPy is not installed ({type(e).__name__}: {e}); pip install 'disttensor[gpu]'"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, or one too old for CuPy's CUDA
        return f"CuPy sees no GPU ({type(e).__name__}: {e})"
    return None if count > 0 else "CuPy sees no GPU"


def bytes_moved(kernel: str, dims: tuple[int, ...], itemsize: int) -> int:
    """The bytes ``kernel`` must move at least: each input read once, each output written
    once (labels are int64; Adam's parameter and moments are read and written).

    >>> bytes_moved("adam_update", (1000,), 4)  # w, g, m, v read; w, m, v written
    28000
    >>> bytes_moved("layer_norm_forward", (10, 100), 8)  # x, w, b in; y, mean, rstd out
    17760
    """
    if kernel not in KERNEL_SIZES:
        raise ValueError(f"unknown kernel {kernel!r}: one of {', '.join(KERNEL_SIZES)}")
    if kernel == "adam_update":
        (n,) = dims
        return 7 * n * itemsize
    if kernel in ("bucket_pack", "bucket_unpack"):
        members, each = dims
        return 2 * members * each * itemsize  # every element read once and written once
    rows, cols = dims
    table = rows * cols * itemsize
    if kernel == "xent_forward":  # logits, labels in; loss, shift, sum_exp out
        return table + rows * 8 + 3 * rows * itemsize
    if kernel == "xent_backward":  # logits, labels, shift, sum_exp, grad_loss in; dlogits out
        return 2 * table + rows * 8 + 3 * rows * itemsize
    if kernel == "layer_norm_forward":  # x, w, b in; y, mean, rstd out
        return 2 * table + 2 * cols * itemsize + 2 * rows * itemsize
    # layer_norm_backward: dy, x, mean, rstd, w in; dx, dw, db out
    return 3 * table + 2 * rows * itemsize + 3 * cols * itemsize


def copy_bandwidth(nbytes: int, seconds: float) -> float:
    """Bytes per second of a device-to-device copy of ``nbytes``, which reads and writes them.

    >>> copy_bandwidth(1000, 1e-6)
    2000000000.0
    """
    return 2 * nbytes / seconds


def floor_ratio(seconds: float, nbytes: int, bandwidth: float) -> float:
    """How many times the bandwidth floor (``nbytes / bandwidth``) a kernel took.

    >>> floor_ratio(3e-6, 4000, 2e9)
    1.5
    """
    return seconds / (nbytes / bandwidth)


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> float:
    """NCCL's bus bandwidth of an all-reduce: ``nbytes / seconds * 2 (n - 1) / n`` (what
    each rank's link carries in a ring); the algorithm bandwidth on one rank.

    >>> bus_bandwidth(1000, 1e-6, 4) / 1e9
    1.5
    """
    algorithm = nbytes / seconds
    return algorithm * 2 * (ranks - 1) / ranks if ranks > 1 else algorithm


# -- timing on the device ------------------------------------------------------------------------
def rotated(names: list[str], r: int) -> list[str]:
    """``names`` rotated by round ``r`` (bench/_timing.py's interleaving)."""
    k = r % len(names)
    return names[k:] + names[:k]


def device_times(cp, fns: dict[str, Callable[[], Any]], reps: int, rounds: int) -> dict:
    """Median seconds per call of each variant: per round and variant, ``reps`` calls between
    two CUDA events on the current stream."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up: compilation, the memory pool
        fn()
    cp.cuda.get_current_stream().synchronize()
    for r in range(rounds):
        for k in rotated(list(fns), r):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(reps):
                fns[k]()
            end.record()
            end.synchronize()
            samples[k].append(cp.cuda.get_elapsed_time(start, end) * 1e-3 / reps)
    return {k: float(np.median(v)) for k, v in samples.items()}


def host_times(cp, fns: dict[str, Callable[[], Any]], number: int, rounds: int) -> dict:
    """Median seconds per call of each variant, host clock, loops of ``number`` calls that
    start and end with a stream synchronization (garbage collector off, as in timeit)."""
    stream = cp.cuda.get_current_stream()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds * 4):
            for k in rotated(list(fns), r):
                fn = fns[k]
                stream.synchronize()
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                stream.synchronize()
                samples[k].append((time.perf_counter() - t0) / number)
    finally:
        if gc_was:
            gc.enable()
    return {k: float(np.median(v)) for k, v in samples.items()}


def max_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Each value's max over the ranks (every rank passes the same keys in the same order)."""
    from mpi4py import MPI

    keys = list(values)
    a = np.array([values[k] for k in keys], np.float64)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a, op=MPI.MAX)
    return dict(zip(keys, a.tolist()))


# -- (a) dispatch overhead ---------------------------------------------------------------------
def section_dispatch(cp, args) -> str:
    import disttensor as dt

    mesh = dt.ProcessMesh([dt.get_rank()])
    rng = np.random.default_rng(0)
    x, y, w = (
        dt.shard_tensor(rng.standard_normal((8, 8)).astype(np.float32), mesh, [dt.Replicate()])
        for _ in range(3)
    )
    xl, yl, wl = x.to_local(), y.to_local(), w.to_local()
    if not isinstance(xl, cp.ndarray):
        raise RuntimeError("(a): shard_tensor made host shards with the GPU selected")
    ops = {
        "x + y": (lambda: x + y, lambda: xl + yl),
        "x @ w": (lambda: x @ w, lambda: xl @ wl),
        "x.sum(axis=1)": (lambda: x.sum(axis=1), lambda: xl.sum(axis=1)),
        "np.tanh(x)": (lambda: np.tanh(x), lambda: cp.tanh(xl)),
    }
    fns, missing = {}, []
    for name, (dt_call, raw) in ops.items():
        try:
            dt_call()
        except NotImplementedError:  # an op without a device kernel yet (Note [Array backends])
            missing.append(name)
            continue
        fns[f"dt {name}"], fns[f"cupy {name}"] = dt_call, raw
    t = max_over_ranks(host_times(cp, fns, args.number, args.rounds))
    rows = []
    for name in ops:
        if name in missing:
            rows.append([name, "-", "-", "no device kernel yet", "-"])
            continue
        over = (t[f"dt {name}"] - t[f"cupy {name}"]) * 1e6
        verdict = "ok" if over <= DISPATCH_GOAL_US else "over"
        row = [name, f"{t[f'cupy {name}'] * 1e6:.1f}", f"{t[f'dt {name}'] * 1e6:.1f}"]
        rows.append([*row, f"{over:.1f}", verdict])
    head = ["op (8x8 float32)", "cupy us", "dt us", "overhead us", f"<= {DISPATCH_GOAL_US:g} us"]
    return "(a) dispatch overhead, cached, per call\n" + _table(head, rows)


# -- (b) fused kernels -------------------------------------------------------------------------
def kernel_pair(cp, name: str, dims: tuple[int, ...], dtype, rng) -> tuple[Callable, Callable]:
    """(fused call, unfused CuPy composition) of kernel ``name`` on fresh arrays of ``dims``;
    each call returns its outputs (the two work on separate copies of any state they update,
    so their results can be compared after any number of calls)."""
    from kernels import KERNELS, adam, bucket

    def arr(*shape):
        return cp.asarray(rng.standard_normal(shape).astype(dtype))

    if name == "adam_update":
        fused = KERNELS["adam"].load(cp)["adam_update"]
        g = arr(*dims)
        w1, m1, v1 = arr(*dims), cp.zeros(dims, dtype), cp.zeros(dims, dtype)
        w2, m2, v2 = w1.copy(), m1.copy(), v1.copy()
        hyper = {"step": 3, "lr": 1e-3, "weight_decay": 0.01, "decoupled": True}
        c = adam.coefficients(dtype, **hyper)

        def one():
            fused(w1, g, m1, v1, **hyper)
            return w1, m1, v1

        def composed():  # adam.adam_update's arithmetic, one CuPy operation at a time
            m2[...] = c.beta1 * m2 + c.one_minus_beta1 * g
            v2[...] = c.beta2 * v2 + c.one_minus_beta2 * (g * g)
            w2[...] = c.decay * w2 - c.step_size * m2 / (cp.sqrt(v2 / c.bias_correction2) + c.eps)
            return w2, m2, v2

        return one, composed
    if name.startswith("bucket"):
        members, each = dims
        grads = [arr(each) for _ in range(members)]
        offsets = bucket.bucket_offsets([(each,)] * members)
        starts = [int(o) for o in offsets[:-1]]
        fns = KERNELS["bucket"].load(cp)
        if name == "bucket_pack":
            packed, copied = cp.empty(members * each, dtype), cp.empty(members * each, dtype)

            def copies():
                for a, o in zip(grads, starts):
                    copied[o : o + each] = a
                return copied

            return (lambda: fns["bucket_pack"](grads, packed, offsets)), copies
        buffer = arr(members * each)
        shapes = [(each,)] * members

        def slices():
            return [buffer[o : o + each].copy() for o in starts]

        return (lambda: fns["bucket_unpack"](buffer, offsets, shapes, copy=True)), slices
    rows, cols = dims
    x = arr(rows, cols)
    if name.startswith("xent"):
        fns = KERNELS["softmax_xent"].load(cp)
        labels = cp.asarray(rng.integers(0, cols, rows))
        _, shift, sum_exp = fns["xent_forward"](x, labels)
        picked = cp.asarray(np.arange(rows))
        if name == "xent_forward":

            def composed():
                top = x.max(axis=1)
                s = cp.exp(x - top[:, None]).sum(axis=1)
                return cp.log(s) + top - x[picked, labels], top, s

            return (lambda: fns["xent_forward"](x, labels)), composed
        grad = cp.asarray(np.ones(rows, dtype))

        def composed():
            p = cp.exp(x - shift[:, None]) / sum_exp[:, None]
            p[picked, labels] -= 1
            p *= grad[:, None]
            return p

        return (lambda: fns["xent_backward"](x, labels, shift, sum_exp, grad)), composed
    fns = KERNELS["layer_norm"].load(cp)
    weight, bias = arr(cols), arr(cols)
    eps = 1e-5
    if name == "layer_norm_forward":

        def composed():
            mean = x.mean(axis=1)
            xc = x - mean[:, None]
            rstd = 1 / cp.sqrt((xc * xc).mean(axis=1) + eps)
            return xc * rstd[:, None] * weight + bias, mean, rstd

        return (lambda: fns["layer_norm_forward"](x, weight, bias, eps)), composed
    _, mean, rstd = fns["layer_norm_forward"](x, weight, bias, eps)
    dy = arr(rows, cols)

    def composed():
        xhat = (x - mean[:, None]) * rstd[:, None]
        g = dy * weight
        dx = rstd[:, None] * (g - g.mean(axis=1)[:, None] - xhat * (g * xhat).mean(axis=1)[:, None])
        return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)

    return (lambda: fns["layer_norm_backward"](dy, x, mean, rstd, weight)), composed


def outputs_agree(cp, a: Any, b: Any, dtype) -> bool:
    """Whether two calls' outputs (arrays, or tuples/lists of them) agree to the rounding of
    ``dtype`` (relative 1e-4 in float32, 1e-10 in float64, of each output's largest value)."""
    a = list(a) if isinstance(a, (tuple, list)) else [a]
    b = list(b) if isinstance(b, (tuple, list)) else [b]
    tol = 1e-4 if np.dtype(dtype) == np.float32 else 1e-10
    for x, y in zip(a, b, strict=True):
        x, y = cp.asnumpy(x).astype(np.float64), cp.asnumpy(y).astype(np.float64)
        scale = max(float(np.abs(y).max(initial=0.0)), 1e-30)
        if x.shape != y.shape or not np.abs(x - y).max(initial=0.0) <= tol * scale:
            return False
    return True


def measured_copy_bandwidth(cp, nbytes: int, rounds: int) -> float:
    """Device-to-device copy bandwidth (bytes/s) on ``nbytes``, median of ``rounds`` runs."""
    src = cp.ones(nbytes // 4, np.float32)
    dst = cp.empty_like(src)

    def copy():
        dst[...] = src

    seconds = device_times(cp, {"copy": copy}, reps=5, rounds=rounds)["copy"]
    return copy_bandwidth(src.nbytes, seconds)


def section_kernels(cp, args) -> str:
    dtype = np.dtype(args.dtype)
    bandwidth = measured_copy_bandwidth(cp, (8 if args.quick else 512) * MiB, args.rounds)
    rows, times = [], {}
    rng = np.random.default_rng(0)
    reps = 2 if args.quick else 10
    for name, sizes in KERNEL_SIZES.items():
        dims = sizes[1] if args.quick else sizes[0]
        fused, composed = kernel_pair(cp, name, dims, dtype, rng)
        if not outputs_agree(cp, fused(), composed(), dtype):
            raise SystemExit(f"(b) {name}: the fused kernel and its CuPy composition disagree")
        got = device_times(cp, {"fused": fused, "cupy": composed}, reps, args.rounds)
        times.update({f"{name} fused": got["fused"], f"{name} cupy": got["cupy"]})
        cp.get_default_memory_pool().free_all_blocks()
    times = max_over_ranks(times)
    for name, sizes in KERNEL_SIZES.items():
        dims = sizes[1] if args.quick else sizes[0]
        nbytes = bytes_moved(name, dims, dtype.itemsize)
        fused, composed = times[f"{name} fused"], times[f"{name} cupy"]
        ratio = floor_ratio(fused, nbytes, bandwidth)
        rows.append(
            [
                f"{name} {'x'.join(map(str, dims))}",
                f"{nbytes / MiB:.1f}",
                f"{composed * 1e6:.1f}",
                f"{fused * 1e6:.1f}",
                f"{composed / fused:.2f}x",
                f"{ratio:.2f}x",
                "ok" if ratio <= FLOOR_GOAL else "over",
            ]
        )
    head = [
        "kernel",
        "MiB moved",
        "cupy us",
        "fused us",
        "speed-up",
        "vs floor",
        f"<= {FLOOR_GOAL:g}x",
    ]
    return (
        f"(b) fused kernels, {dtype}; floor = bytes moved / copy bandwidth "
        f"{bandwidth / 1e9:.0f} GB/s (device-to-device, measured)\n" + _table(head, rows)
    )


# -- (c) the DP+MP demo step -------------------------------------------------------------------
def _demo_step(device: str, dtype, mesh) -> Callable[[], float]:
    """One training step of demos/mlp_dp_mp.py's model on ``device``, on a fixed batch."""
    sys.path.insert(0, os.path.join(ROOT, "demos"))
    import mlp_dp_mp as demo
    from _common import data_parallel

    import disttensor as dt
    from disttensor import backend

    backend.set_device(device)
    dt.manual_seed(0)
    model = demo.Net(dtype)
    dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(demo.PLAN))
    wrapper = data_parallel(model, mesh, "fused")
    net = wrapper or model
    opt = dt.optim.Adam(model.parameters(), lr=1e-2)
    x, y = next(demo.batches(1, dtype))
    xs, ys = (dt.shard_tensor(a, mesh, [dt.Shard(0), dt.Replicate()]) for a in (x, y))
    loss_fn = dt.nn.MSELoss()

    def step() -> float:
        opt.zero_grad()
        loss = loss_fn(net(xs), ys)
        loss.backward()
        opt.step()
        return float(loss)

    return step


def _demo_mesh():
    import disttensor as dt

    world = dt.get_world_size()
    mp = 2 if world % 2 == 0 else 1
    return dt.init_mesh((world // mp, mp), dim_names=["dp", "mp"])


def section_demo(cp, args) -> str:
    from _timing import interleaved
    from mpi4py import MPI

    mesh = _demo_mesh()
    check = {d: _demo_step(d, np.float64, mesh) for d in ("gpu", "cpu")}
    losses = {d: [check[d]() for _ in range(3)] for d in check}
    rel = max(abs(g - c) / abs(c) for g, c in zip(losses["gpu"], losses["cpu"]))
    if not rel <= 1e-9:
        raise SystemExit(f"(c) the GPU and CPU steps disagree: losses {losses}")
    dtype = np.dtype(args.dtype)
    steps = {d: _demo_step(d, dtype, mesh) for d in ("gpu", "cpu")}
    iters = 10 if args.quick else 200
    t = interleaved(MPI.COMM_WORLD, steps, iters, rounds=args.rounds)
    gpu, cpu = t["gpu"].median, t["cpu"].median
    rows = [
        ["GPU (CuPy)", f"{gpu * 1e3:.2f}", f"{t['gpu'].spread:.0%}"],
        ["CPU (numpy)", f"{cpu * 1e3:.2f}", f"{t['cpu'].spread:.0%}"],
    ]
    dp, mp = mesh.shape
    return (
        f"(c) demos/mlp_dp_mp.py step, {dtype}, mesh {dp}x{mp}; GPU and CPU losses agree "
        f"(float64, 3 steps, relative {rel:.1e}); CPU / GPU = {cpu / gpu:.2f}\n"
        + _table(["device", "step ms", "IQR"], rows)
    )


# -- (d) all-reduce bandwidth -----------------------------------------------------------------
def section_allreduce(cp, args) -> str:
    from _timing import interleaved
    from mpi4py import MPI

    import disttensor as dt
    from disttensor.comm.nccl import nccl_group

    world = dt.comm.world()
    dev = nccl_group(world)
    stream = cp.cuda.get_current_stream()
    n = world.size
    rows = []
    sizes = ALLREDUCE_MIB[1] if args.quick else ALLREDUCE_MIB[0]
    for mib in sizes:
        buf = cp.ones(mib * MiB // 4, np.float32)
        fns = {}
        if dev is not None:
            fns["nccl"] = lambda buf=buf: (dev.allreduce(buf, buf, "sum"), stream.synchronize())
        fns["staged"] = lambda buf=buf: (world.allreduce(buf, buf, "sum"), stream.synchronize())
        iters = 4 if args.quick else max(8, 256 // mib)
        t = interleaved(MPI.COMM_WORLD, fns, iters, rounds=args.rounds)
        for k in fns:
            s = t[k].median
            bus = bus_bandwidth(buf.nbytes, s, n) / 1e9
            speed = f"{t['staged'].median / s:.1f}x" if k == "nccl" else ""
            rows.append(
                [
                    f"{mib} MiB {k}",
                    f"{s * 1e3:.3f}",
                    f"{buf.nbytes / s / 1e9:.1f}",
                    f"{bus:.1f}",
                    speed,
                ]
            )
        del buf
    note = "" if dev is not None else " (NCCL unavailable here: see the log line above)"
    if n == 1:
        note += " (1 rank: both are copies, no network)"
    head = ["size, path", "ms", "algbw GB/s", "busbw GB/s", "NCCL speed-up"]
    return f"(d) all-reduce (sum, float32) over {n} rank(s){note}\n" + _table(head, rows)


# -- (e) training workloads against PyTorch ------------------------------------------------------
# (full run, --quick): block (batch, time, dim, heads), MLP (layers, width, batch), GELU
# (rows, cols), softmax shape
TRAIN_SIZES = {
    "block": ((8, 512, 1024, 16), (2, 64, 128, 4)),
    "mlp": ((16, 256, 64), (4, 64, 8)),
    "gelu": ((4096, 4096), (256, 256)),
    "softmax": ((8, 16, 512, 512), (2, 2, 64, 64)),
}
TRAIN_GOALS = {"block step": 1.1, "block forward": None, "MLP step": 1.5, "GELU": 1.2,
               "softmax": 1.2}  # fmt: skip


def _torch_block(torch, dim: int, heads: int):
    """The same block as dt.nn.TransformerBlock, in torch.nn (pre-norm, causal attention
    written out, GELU tanh, a 4x MLP)."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, n, _ = x.shape
            h = self.ln1(x)
            q, k, v = (f(h).view(b, n, heads, dim // heads).transpose(1, 2)
                       for f in (self.q, self.k, self.v))  # fmt: skip
            s = (q @ k.transpose(-1, -2)) * (1 / (dim // heads) ** 0.5)
            mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
            att = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, n, dim))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    return Block()


def section_train(cp, args) -> str:
    try:
        import torch
    except Exception as e:
        return f"(e) skipped: PyTorch is not importable ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        return "(e) skipped: PyTorch sees no CUDA device"
    import disttensor as dt

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    pick = 1 if args.quick else 0
    mesh = dt.ProcessMesh([dt.get_rank()])
    f32 = np.float32
    rng = np.random.default_rng(0)
    dev = torch.device("cuda", cp.cuda.Device().id)
    stream = cp.cuda.get_current_stream()
    pool = cp.get_default_memory_pool()
    rows, mem = [], []

    def both(name: str, dt_fn, torch_fn, host: bool) -> None:
        def t_fn():
            torch_fn()
            torch.cuda.current_stream().synchronize() if host else None

        fns = {"dt": dt_fn, "torch": torch_fn}
        if host:
            number = 2 if args.quick else 5
            t = host_times(cp, {"dt": dt_fn, "torch": t_fn}, number, args.rounds)
        else:
            t = device_times(cp, fns, 3 if args.quick else 20, args.rounds)
        torch.cuda.synchronize()
        goal = TRAIN_GOALS[name]
        ratio = t["dt"] / t["torch"]
        ok = "" if goal is None else ("ok" if ratio <= goal else f"> {goal:g}")
        rows.append([name, f"{t['dt'] * 1e3:.3f}", f"{t['torch'] * 1e3:.3f}", f"{ratio:.2f}", ok])

    # the block: forward + backward + AdamW, and forward alone
    b, n, d, h = TRAIN_SIZES["block"][pick]
    dt.manual_seed(0)
    block = dt.nn.TransformerBlock(d, h, dtype=f32, mesh=mesh)
    opt = dt.optim.AdamW(block.parameters(), lr=1e-4)
    x_host = rng.standard_normal((b, n, d)).astype(f32)
    x = dt.shard_tensor(x_host, mesh, [dt.Replicate()])
    tblock = _torch_block(torch, d, h).to(dev)
    topt = torch.optim.AdamW(tblock.parameters(), lr=1e-4)
    tx = torch.from_numpy(x_host).to(dev)

    def dt_step():
        loss = (block(x) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    def torch_step():
        loss = (tblock(tx) ** 2).mean()
        loss.backward()
        topt.step()
        topt.zero_grad()

    def dt_forward():
        with dt.no_grad():
            block(x)

    def torch_forward():
        with torch.no_grad():
            tblock(tx)

    pool.free_all_blocks()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        dt_step()
        torch_step()
    stream.synchronize()
    torch.cuda.synchronize()
    mem = [pool.total_bytes() / MiB, torch.cuda.max_memory_reserved() / MiB]
    both("block step", dt_step, torch_step, host=True)
    both("block forward", dt_forward, torch_forward, host=True)

    # the MLP: layers x (Linear + GELU), Adam
    layers, width, batch = TRAIN_SIZES["mlp"][pick]
    dt.manual_seed(1)
    mods = [m for _ in range(layers) for m in (dt.nn.Linear(width, width, dtype=f32, mesh=mesh),
                                                dt.nn.GELU())]  # fmt: skip
    mlp = dt.nn.Sequential(*mods)
    mopt = dt.optim.Adam(mlp.parameters(), lr=1e-4)
    xm_host = rng.standard_normal((batch, width)).astype(f32)
    xm = dt.shard_tensor(xm_host, mesh, [dt.Replicate()])
    pairs = [(torch.nn.Linear(width, width), torch.nn.GELU(approximate="tanh")) for _ in mods[::2]]
    tmlp = torch.nn.Sequential(*(m for pair in pairs for m in pair)).to(dev)
    tmopt = torch.optim.Adam(tmlp.parameters(), lr=1e-4)
    txm = torch.from_numpy(xm_host).to(dev)

    def dt_mlp():
        loss = (mlp(xm) ** 2).mean()
        loss.backward()
        mopt.step()
        mopt.zero_grad()

    def torch_mlp():
        loss = (tmlp(txm) ** 2).mean()
        loss.backward()
        tmopt.step()
        tmopt.zero_grad()

    both("MLP step", dt_mlp, torch_mlp, host=True)

    # the kernels alone
    g_host = rng.standard_normal(TRAIN_SIZES["gelu"][pick]).astype(f32)
    gx, tg = dt.shard_tensor(g_host, mesh, [dt.Replicate()]), torch.from_numpy(g_host).to(dev)
    both("GELU", lambda: dt.gelu(gx), lambda: torch.nn.functional.gelu(tg, approximate="tanh"),
         host=False)  # fmt: skip
    s_host = rng.standard_normal(TRAIN_SIZES["softmax"][pick]).astype(f32)
    sx, ts = dt.shard_tensor(s_host, mesh, [dt.Replicate()]), torch.from_numpy(s_host).to(dev)
    both("softmax", lambda: dt.softmax(sx, axis=-1), lambda: torch.softmax(ts, dim=-1),
         host=False)  # fmt: skip
    head = ["workload", "dt ms", "PyTorch ms", "dt / PyTorch", "goal"]
    return (
        f"(e) training workloads against PyTorch {torch.__version__} on the same GPU, float32, "
        f"TF32 off; block {b}x{n}x{d} ({h} heads), MLP {layers} x {width}, batch {batch}\n"
        + _table(head, rows)
        + f"\nmemory for the block step: dt (CuPy pool) {mem[0]:.0f} MiB, PyTorch (peak "
        f"reserved) {mem[1]:.0f} MiB, ratio {mem[0] / mem[1]:.2f}"
    )


def _table(head: list[str], rows: list[list[str]]) -> str:
    from _timing import format_table

    return format_table(head, rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = gpu_missing()
    if missing is not None:
        print(f"bench/gpu.py: skipped: {missing}", flush=True)
        return 0
    import cupy as cp

    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    import disttensor as dt
    from disttensor import backend

    backend.set_device("gpu")  # this rank's GPU: local rank % count
    start = time.perf_counter()
    load = os.getloadavg()[0]
    dt.print0(
        f"bench/gpu.py on {dt.get_world_size()} rank(s), GPU {cp.cuda.Device().pci_bus_id}"
        f"{' (quick)' if args.quick else ''}"
    )
    sections = {
        "a": section_dispatch,
        "b": section_kernels,
        "c": section_demo,
        "d": section_allreduce,
        "e": section_train,
    }
    for s in args.only:
        backend.set_device("gpu")  # (c) selects the CPU for its host run
        dt.print0("\n" + sections[s](cp, args))
    from _timing import load_line

    dt.print0("\n" + load_line(start, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
