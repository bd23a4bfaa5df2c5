"""Activation kernels (kernels/activations.py) against the composites they replaced, and a
GELU MLP's training step, on one CPU thread; PyTorch's where it is importable.

Run::

    OMP_NUM_THREADS=1 python bench/activations.py            # kernels and the MLP step
    OMP_NUM_THREADS=1 python bench/activations.py --mlp      # the step only
    OMP_NUM_THREADS=1 python bench/activations.py --mlp --act ReLU   # GELU, ReLU, Tanh, Sigmoid

``--mlp`` runs whatever disttensor is first on the path, so the step of another checkout
is timed with ``PYTHONPATH=<that checkout> python bench/activations.py --mlp``.

Kernels: float32 64 x 256 and 1024 x 1024, forward and backward of each activation, the
former numpy composite (written out below, as ops/elementwise.py and ops/gradients.py had
it; dt ran the former gradients as several dispatched ops, so the step gains more) against
the reference the ops now run; torch's kernels where it has them. The MLP: 16 x (Linear(256,
256) + GELU, or ``--act``), batch 64, MSE loss, Adam; one step is forward, backward,
``opt.step()``, ``zero_grad()``. Each time is the median of rounds of calls, the variants
interleaved round by round (noise on a shared machine hits them alike).
"""

from __future__ import annotations

import argparse
import math
import os
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

try:
    import torch
except ImportError:  # the benchmark runs without torch
    torch = None

C = math.sqrt(2 / math.pi)


# -- the composites the kernels replaced ---------------------------------------------------------
def former_sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(np.result_type(x, 1.0), copy=False)


def former_gelu(x):
    c = np.sqrt(2 / np.pi).astype(np.result_type(x, 1.0))
    return 0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x**3)))


def former_gelu_grad(g, x):
    t = np.tanh(C * (x + 0.044715 * x * x * x))
    return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C * (1 + 0.134145 * x * x))


def former_silu_grad(g, x):
    s = former_sigmoid(x)
    return g * (s * (1 + x * (1 - s)))


def former_tanh_grad(g, y):  # the in-place kernel tanh_grad ran before
    t = np.multiply(y, y)
    np.subtract(1, t, out=t)
    return np.multiply(g, t, out=t)


def timed(calls: dict, rounds: int, number: int) -> dict[str, float]:
    """Median seconds per call of each variant, interleaved over ``rounds``."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(rounds):
        order = list(calls)
        order = order[r % len(order) :] + order[: r % len(order)]
        for k in order:
            f = calls[k]
            t0 = time.perf_counter()
            for _ in range(number):
                f()
            times[k].append((time.perf_counter() - t0) / number)
    return {k: float(np.median(v)) for k, v in times.items()}


def kernel_rows(rounds: int) -> None:
    print("kernels, float32, 1 thread: median us per call")
    print(f"{'kernel':<20}{'shape':>12}{'former':>10}{'fused':>10}{'speed-up':>10}{'torch':>10}")
    rng = np.random.default_rng(0)
    for shape in ((64, 256), (1024, 1024)):
        x = (2 * rng.standard_normal(shape)).astype(np.float32)
        g = rng.standard_normal(shape).astype(np.float32)
        number = 200 if x.size < 100_000 else 5
        for name, calls in kernel_calls(x, g).items():
            t = timed(calls, rounds, number)
            tt = f"{t['torch'] * 1e6:10.1f}" if "torch" in t else f"{'-':>10}"
            speed = t["former"] / t["fused"]
            print(f"{name:<20}{shape!s:>12}{t['former'] * 1e6:10.1f}{t['fused'] * 1e6:10.1f}"
                  f"{speed:9.2f}x{tt}")  # fmt: skip


def kernel_calls(x: np.ndarray, g: np.ndarray) -> dict[str, dict]:
    """Per kernel: the former composite, the fused reference and torch's where it has one."""
    from kernels import activations as act

    y_tanh, y_sig = np.tanh(x), act.sigmoid_forward(x)
    rows = {
        "gelu forward": (lambda: former_gelu(x), lambda: act.gelu_forward(x)),
        "gelu backward": (lambda: former_gelu_grad(g, x), lambda: act.gelu_backward(g, x)),
        "silu forward": (lambda: x * former_sigmoid(x), lambda: act.silu_forward(x)),
        "silu backward": (lambda: former_silu_grad(g, x), lambda: act.silu_backward(g, x)),
        "sigmoid forward": (lambda: former_sigmoid(x), lambda: act.sigmoid_forward(x)),
        "sigmoid backward": (
            lambda: g * (y_sig * (1 - y_sig)),
            lambda: act.sigmoid_backward(g, y_sig),
        ),
        "tanh backward": (
            lambda: former_tanh_grad(g, y_tanh),
            lambda: act.tanh_backward(g, y_tanh),
        ),
        "relu backward": (lambda: np.where(x > 0, g, 0), lambda: act.relu_backward(g, x)),
    }
    calls = {name: {"former": old, "fused": new} for name, (old, new) in rows.items()}
    if torch is not None:
        tx, tg = torch.from_numpy(x), torch.from_numpy(g)
        calls["gelu forward"]["torch"] = lambda: torch.nn.functional.gelu(tx, approximate="tanh")
        calls["gelu backward"]["torch"] = lambda: torch.ops.aten.gelu_backward(
            tg, tx, approximate="tanh"
        )
        calls["silu forward"]["torch"] = lambda: torch.nn.functional.silu(tx)
        calls["sigmoid forward"]["torch"] = lambda: torch.sigmoid(tx)
    return calls


ACTIVATIONS = ("GELU", "ReLU", "Tanh", "Sigmoid")  # dt.nn's and torch.nn's


def mlp_rows(rounds: int, act: str, layers: int = 16, dim: int = 256, batch: int = 64) -> None:
    import disttensor as dt

    print(f"MLP step: {layers} x (Linear({dim}, {dim}) + {act}), batch {batch}, Adam, float32")
    print(f"disttensor from {os.path.dirname(dt.__file__)}")
    mesh = dt.ProcessMesh([0])
    rng = np.random.default_rng(1)
    x_np = rng.standard_normal((batch, dim)).astype(np.float32)
    t_np = rng.standard_normal((batch, dim)).astype(np.float32)

    def run():
        dt.manual_seed(0)
        mods = []
        for _ in range(layers):
            mods += [dt.nn.Linear(dim, dim, mesh=mesh), getattr(dt.nn, act)()]
        model = dt.nn.Sequential(*mods)
        opt = dt.optim.Adam(model.parameters(), lr=1e-4)
        loss_fn = dt.nn.MSELoss()
        x = dt.shard_tensor(x_np, mesh, [dt.Replicate()])
        target = dt.shard_tensor(t_np, mesh, [dt.Replicate()])

        def step():
            loss = loss_fn(model(x), target)
            loss.backward()
            opt.step()
            opt.zero_grad()

        calls = {"dt": step}
        if torch is not None:
            torch.set_num_threads(1)
            torch.manual_seed(0)
            seq = []
            for _ in range(layers):
                kw = {"approximate": "tanh"} if act == "GELU" else {}
                seq += [torch.nn.Linear(dim, dim), getattr(torch.nn, act)(**kw)]
            tmodel = torch.nn.Sequential(*seq)
            topt = torch.optim.Adam(tmodel.parameters(), lr=1e-4)
            tx, tt = torch.from_numpy(x_np), torch.from_numpy(t_np)

            def torch_step():
                loss = torch.nn.functional.mse_loss(tmodel(tx), tt)
                loss.backward()
                topt.step()
                topt.zero_grad()

            calls["torch"] = torch_step
        for f in calls.values():  # warm up: caches, allocator, Adam state
            for _ in range(5):
                f()
        return timed(calls, rounds, 10)

    (t,) = dt.simulate(1, run)
    line = f"dt step {t['dt'] * 1e3:.3f} ms"
    if "torch" in t:
        line += f", torch step {t['torch'] * 1e3:.3f} ms, dt/torch {t['dt'] / t['torch']:.2f}x"
    print(line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mlp", action="store_true", help="the MLP step only")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--act", choices=ACTIVATIONS, default="GELU", help="the MLP's activation")
    args = p.parse_args()
    if torch is not None:
        torch.set_num_threads(1)
    if not args.mlp:
        kernel_rows(args.rounds)
        print()
    mlp_rows(args.rounds, args.act)


if __name__ == "__main__":
    main()
