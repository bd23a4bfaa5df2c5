"""Plain-numpy references of the training demos: model, loss, hand-written backward, optimizer.

tests/test_demos.py replays a demo's recorded run (``--record``, demos/_common.py) with these
and compares losses, the last step's gradients and the final parameters. Unlike the demos'
own check (sharded run against the same library on one rank), this one shares no code with
disttensor: every formula below is written from its standard definition (PyTorch's
documentation for the layers, losses and optimizers), so a wrong local kernel, gradient or
optimizer term in the library shows up here. Do not import disttensor in this file.

The semantics the library's layers promise, and so the ones written here:
  * Linear: ``y = x @ W + b`` with W of shape (in, out);
  * LayerNorm over the last axis: ``(x - mean) / sqrt(var + eps) * gamma + beta``, the
    biased variance (mean of squares), eps 1e-5 inside the square root;
  * GELU, tanh approximation (GPT-2; PyTorch ``GELU(approximate="tanh")``):
    ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``;
  * MSE: mean over all elements; cross entropy: ``logsumexp(logits) - logits[label]``,
    mean over every row (batch and time);
  * pre-norm transformer block (GPT-2): ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``;
    causal multi-head self-attention ``softmax(q k^T / sqrt(head_dim)) v`` over heads of
    consecutive features, then an output projection; MLP ``fc2(gelu(fc1(x)))``, 4x wide;
  * SGD ``w -= lr g``; Adam with bias correction (eps added to ``sqrt(v_hat)``); AdamW with
    decoupled weight decay ``w -= lr * wd * w`` applied to every parameter.

Parameters are dicts name -> array with the names of ``named_parameters`` in the demos.
Each model function returns ``(loss, grads)``; the backward is a tape of closures, each
layer's ``back(dy)`` writes its parameters' gradients and returns the input's gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

Params = dict[str, np.ndarray]
Back = Callable[[np.ndarray], np.ndarray]


# -- layers: forward (output, back) ---------------------------------------------------------
def linear(x: np.ndarray, p: Params, name: str, grads: Params) -> tuple[np.ndarray, Back]:
    """``x @ W + b`` over the last axis of ``x``; no bias if ``name.bias`` is not in ``p``."""
    w, b = p[name + ".weight"], p.get(name + ".bias")
    y = x @ w if b is None else x @ w + b

    def back(dy):
        flat_x, flat_dy = x.reshape(-1, w.shape[0]), dy.reshape(-1, w.shape[1])
        grads[name + ".weight"] = flat_x.T @ flat_dy  # dL/dW_ij = sum_rows x_ri dy_rj
        if b is not None:
            grads[name + ".bias"] = flat_dy.sum(axis=0)
        return dy @ w.T

    return y, back


def layer_norm(
    x: np.ndarray, p: Params, name: str, grads: Params, eps: float = 1e-5
) -> tuple[np.ndarray, Back]:
    """LayerNorm over the last axis (biased variance, eps inside the root), affine."""
    gamma, beta = p[name + ".weight"], p[name + ".bias"]
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    inv_sigma = 1.0 / np.sqrt(var + eps)
    xhat = (x - mu) * inv_sigma
    y = xhat * gamma + beta

    def back(dy):
        rows = dy.reshape(-1, dy.shape[-1])
        grads[name + ".weight"] = (rows * xhat.reshape(rows.shape)).sum(axis=0)
        grads[name + ".bias"] = rows.sum(axis=0)
        # xhat = (x - mu) / sigma: dx = (g - mean(g) - xhat * mean(g * xhat)) / sigma, g = dL/dxhat
        g = dy * gamma
        return inv_sigma * (
            g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True)
        )

    return y, back


GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


def gelu(x: np.ndarray) -> tuple[np.ndarray, Back]:
    """The tanh approximation of GELU; derivative of 0.5 x (1 + tanh(u)), u = c (x + a x^3):
    0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3 a x^2)."""
    t = np.tanh(GELU_C * (x + GELU_A * x**3))
    y = 0.5 * x * (1.0 + t)

    def back(dy):
        return dy * (
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * GELU_A * x * x)
        )

    return y, back


def softmax(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (shifted by the row max; -inf entries give 0)."""
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention(
    x: np.ndarray, p: Params, name: str, grads: Params, heads: int
) -> tuple[np.ndarray, Back]:
    """Causal multi-head self-attention over (batch, time, dim) ``x``: q, k, v projections,
    head h takes features [h * d, (h + 1) * d), softmax(q k^T / sqrt(d)) with entry (i, j)
    masked for j > i, the heads concatenated back, then the output projection."""
    b, n, c = x.shape
    d = c // heads
    (q, back_q), (k, back_k), (v, back_v) = (
        linear(x, p, f"{name}.{w}", grads) for w in ("q", "k", "v")
    )

    def split(t):  # (b, n, c) -> (b, heads, n, d)
        return t.reshape(b, n, heads, d).transpose(0, 2, 1, 3)

    def merge(t):  # (b, heads, n, d) -> (b, n, c)
        return t.transpose(0, 2, 1, 3).reshape(b, n, c)

    qh, kh, vh = split(q), split(k), split(v)
    scale = 1.0 / math.sqrt(d)
    scores = qh @ kh.transpose(0, 1, 3, 2) * scale
    causal = np.tril(np.ones((n, n), dtype=bool))
    a = softmax(np.where(causal, scores, -np.inf))
    o = merge(a @ vh)
    y, back_proj = linear(o, p, f"{name}.proj", grads)

    def back(dy):
        do = split(back_proj(dy))
        da = do @ vh.transpose(0, 1, 3, 2)
        dvh = a.transpose(0, 1, 3, 2) @ do
        # softmax: ds_ij = a_ij (da_ij - sum_k da_ik a_ik); a masked entry is 0, so is its ds
        ds = a * (da - (da * a).sum(axis=-1, keepdims=True)) * scale
        dqh = ds @ kh
        dkh = ds.transpose(0, 1, 3, 2) @ qh
        return back_q(merge(dqh)) + back_k(merge(dkh)) + back_v(merge(dvh))

    return y, back


def block(x: np.ndarray, p: Params, name: str, grads: Params, heads: int):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""
    h1, back_ln1 = layer_norm(x, p, f"{name}.ln1", grads)
    a, back_attn = attention(h1, p, f"{name}.attn", grads, heads)
    x1 = x + a
    h2, back_ln2 = layer_norm(x1, p, f"{name}.ln2", grads)
    f, back_fc1 = linear(h2, p, f"{name}.mlp.fc1", grads)
    g, back_gelu = gelu(f)
    m, back_fc2 = linear(g, p, f"{name}.mlp.fc2", grads)

    def back(dy):
        dx1 = dy + back_ln2(back_fc1(back_gelu(back_fc2(dy))))
        return dx1 + back_ln1(back_attn(dx1))

    return x1 + m, back


# -- losses: (loss, dloss/dinput) -------------------------------------------------------------
def mse(out: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    """``mean((out - target)^2)`` over all elements."""
    diff = out - target
    return float((diff**2).mean()), 2.0 * diff / diff.size


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """``mean over rows of logsumexp(row) - row[label]``; classes on the last axis."""
    x = logits.reshape(-1, logits.shape[-1])
    lab = labels.reshape(-1)
    rows = np.arange(len(lab))
    m = x.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(axis=-1)) + m[:, 0]
    loss = float((lse - x[rows, lab]).mean())
    dx = softmax(x)
    dx[rows, lab] -= 1.0
    return loss, (dx / len(lab)).reshape(logits.shape)


# -- the demos' models: (params, batch) -> (loss, grads) --------------------------------------
def simple_net(p: Params, batch) -> tuple[float, Params]:
    """demos/_simple_net.py: ``mse(x @ w0 @ w1, y)``."""
    x, y = batch
    h = x @ p["w0"]
    loss, dout = mse(h @ p["w1"], y)
    dh = dout @ p["w1"].T
    return loss, {"w1": h.T @ dout, "w0": x.T @ dh}


def mlp(p: Params, batch) -> tuple[float, Params]:
    """demos/mlp_dp_mp.py: ``mse(fc2(norm(fc1(x))), y)``."""
    x, y = batch
    grads: Params = {}
    h, back_fc1 = linear(x, p, "fc1", grads)
    z, back_norm = layer_norm(h, p, "norm", grads)
    out, back_fc2 = linear(z, p, "fc2", grads)
    loss, dout = mse(out, y)
    back_fc1(back_norm(back_fc2(dout)))
    return loss, grads


GPT_HEADS = 4  # demos/gpt_dp_mp.py HEADS


def gpt(p: Params, batch, heads: int = GPT_HEADS) -> tuple[float, Params]:
    """demos/gpt_dp_mp.py: token + position embeddings, the blocks ``blocks.0``, ...,
    ``ln_f``, a bias-free lm head, cross entropy against the next tokens."""
    ids, labels = batch
    n = ids.shape[1]
    grads: Params = {}
    x = p["tok.weight"][ids] + p["pos.weight"][np.arange(n)]
    backs = []
    layers = sorted({int(k.split(".")[1]) for k in p if k.startswith("blocks.")})
    for i in layers:
        x, back = block(x, p, f"blocks.{i}", grads, heads)
        backs.append(back)
    z, back_ln_f = layer_norm(x, p, "ln_f", grads)
    logits, back_head = linear(z, p, "head", grads)
    loss, dlogits = cross_entropy(logits, labels)
    dx = back_ln_f(back_head(dlogits))
    for back in reversed(backs):
        dx = back(dx)
    # embedding lookups: each row of the table gets the sum of the gradients of its uses
    dtok = np.zeros_like(p["tok.weight"])
    np.add.at(dtok, ids.reshape(-1), dx.reshape(-1, dx.shape[-1]))
    dpos = np.zeros_like(p["pos.weight"])
    dpos[:n] = dx.sum(axis=0)
    grads["tok.weight"], grads["pos.weight"] = dtok, dpos
    return loss, grads


# -- optimizers (PyTorch's documented algorithms) -------------------------------------------
class SGD:
    """``w <- w - lr * g`` (no momentum, no weight decay)."""

    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.settings = {"optimizer": "SGD", "lr": lr, "weight_decay": 0.0}

    def step(self, p: Params, grads: Params) -> None:
        for name, g in grads.items():
            p[name] = p[name] - self.lr * g


class Adam:
    """Adam (Kingma and Ba), as PyTorch documents it; ``decoupled`` is AdamW (Loshchilov and
    Hutter): ``w <- w - lr * wd * w`` before the Adam step instead of ``g += wd * w``.

        m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
        w <- w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    """

    def __init__(
        self,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled: bool = False,
    ) -> None:
        self.lr, (self.b1, self.b2), self.eps = lr, betas, eps
        self.wd, self.decoupled = weight_decay, decoupled
        self.t = 0
        self.m: Params = {}
        self.v: Params = {}
        self.settings = {
            "optimizer": "AdamW" if decoupled else "Adam",
            "lr": lr,
            "beta1": betas[0],
            "beta2": betas[1],
            "eps": eps,
            "weight_decay": weight_decay,
        }

    def step(self, p: Params, grads: Params) -> None:
        self.t += 1
        lr, b1, b2, t = self.lr, self.b1, self.b2, self.t
        for name, g in grads.items():
            w = p[name]
            if self.wd and not self.decoupled:
                g = g + self.wd * w
            if self.wd and self.decoupled:
                w = w - lr * self.wd * w
            m = self.m[name] = b1 * self.m.get(name, 0.0) + (1 - b1) * g
            v = self.v[name] = b2 * self.v.get(name, 0.0) + (1 - b2) * g * g
            m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
            p[name] = w - lr * m_hat / (np.sqrt(v_hat) + self.eps)


# -- the demos: model and optimizer as each script sets them ----------------------------------
DEMOS: dict[str, tuple[Callable, Callable[[], SGD | Adam]]] = {
    "simple_net_dp.py": (simple_net, lambda: SGD(lr=0.05)),
    "simple_net_mp.py": (simple_net, lambda: SGD(lr=0.05)),
    "mlp_dp_mp.py": (mlp, lambda: Adam(lr=1e-2)),
    "gpt_dp_mp.py": (
        gpt,
        lambda: Adam(lr=1e-2, eps=1e-4, weight_decay=0.01, decoupled=True),
    ),
}


def replay(demo: str, initial: Params, batches: list[tuple]) -> dict:
    """Train ``demo``'s reference from ``initial`` on ``batches`` in float64: the per-step
    losses, the last step's gradients and the final parameters."""
    model, make_opt = DEMOS[demo]
    p = {name: np.array(v, dtype=np.float64) for name, v in initial.items()}
    opt = make_opt()
    losses, grads = [], {}
    for batch in batches:
        batch = tuple(a.astype(np.float64) if a.dtype.kind == "f" else a for a in batch)
        loss, grads = model(p, batch)
        opt.step(p, grads)
        losses.append(loss)
    return {"losses": np.array(losses), "gradients": grads, "parameters": p}
