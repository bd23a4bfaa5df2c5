"""Neural-network ops: layer_norm, embedding, cross_entropy, and the attention score path
``attention_softmax`` that dt.nn's attention runs (rules in spmd/nn_rules.py).

Note [Fused or composite]
    layer_norm and cross_entropy, and softmax, log_softmax and logsumexp (ops/reduction.py),
    reduce over some axes (the normalized axes, the class axis, the softmax axes). When no
    mesh dim splits those axes, one fused op runs: a local kernel, no communication, batch
    axes keep their sharding (Note [Row-wise rules] in spmd/nn_rules.py); the softmax family's
    gradients are one fused op each too. When a mesh dim does split them (hidden-sharded
    activations, vocabulary-parallel logits), the fused op would have to gather the whole
    tensor first; the composite of dt reductions (mean and variance, max and sum of
    exponentials) keeps them split and moves only per-row statistics as small all-reduces
    of Partial values. So each call takes the route that moves the least.

Lookups with a split table write zeros for the rows (classes) another rank owns and come out
Partial(sum), with no communication (Megatron's vocabulary-parallel embedding and loss).

The fused kernels are those of the top-level ``kernels`` package (docs/kernels.md): the numpy
references on the host (they compute what these ops computed before, bit for bit), the CUDA
programs on a GPU (``backend.kernels``).

>>> import numpy as np, disttensor as dt
>>> mesh = dt.ProcessMesh([0])
>>> table = dt.shard_tensor(np.arange(6.0).reshape(3, 2), mesh, [dt.Shard(0)])
>>> dt.embedding(np.array([2, 0]), table).numpy()
array([[4., 5.],
       [0., 1.]])
>>> logits = dt.shard_tensor(np.zeros((2, 4)), mesh, [dt.Shard(1)])
>>> dt.cross_entropy(logits, np.array([1, 3])).numpy()  # log(4): four equal classes
array(1.38629436)
>>> dt.layer_norm(dt.shard_tensor([[1.0, 3.0]], mesh, [dt.Shard(0)])).numpy()
array([[-0.999995,  0.999995]])
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from .. import backend
from ..dispatch import KernelContext, Op
from ..spec import DistSpec
from ..spmd.nn_rules import normalize_axis
from ..tensor import DistTensor
from .elementwise import OPS as EW
from .reduction import _splits, logsumexp, mean

_REDUCTIONS = ("mean", "sum", "none")


# -- helpers -------------------------------------------------------------------------------
def _operand(a: Any) -> Any:
    """DistTensors and device arrays as they are; anything else as a numpy array (dispatch
    makes it Replicate)."""
    return a if isinstance(a, DistTensor) or backend.is_device(a) else np.asarray(a)


def _owned(ctx: KernelContext | None, i: int, axis: int, n: int) -> tuple[int, int]:
    """(start, length) of the global range of input ``i``'s ``axis`` this rank holds."""
    if ctx is None:  # plain numpy call: the whole axis
        return 0, n
    return ctx.inputs[i].local_box(ctx.coord)[axis]


def _check_index(idx: Any, n: int, what: str, xp: Any = np) -> Any:
    """numpy indexing rules: [-n, n) with negatives from the end; else IndexError (a local
    check, as numpy's own: with sharded indices only the ranks holding a bad one raise)."""
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"{what}: an index is out of range for an axis of length {n}")
    return xp.where(idx < 0, idx + n, idx)


def _with(fn):
    """The device kernel factory of a kernel taking the backend as ``be``."""
    return lambda be: partial(fn, be=be)


def _check_integer(a: Any, what: str) -> None:
    if np.dtype(a.dtype).kind not in "iu":
        raise TypeError(f"{what} must be an integer tensor of indices, got dtype {a.dtype}")


# -- layer_norm ------------------------------------------------------------------------------
def _rows2d(x, begin: int, xp: Any) -> Any:
    """``x`` with its axes from ``begin`` on made one (a view where the layout allows)."""
    if begin == x.ndim - 1:
        return x
    return xp.reshape(x, x.shape[:begin] + (math.prod(x.shape[begin:]),))


def _layer_norm_kernel(
    x, weight=None, bias=None, begin_norm_axis=-1, epsilon=1e-5, be=backend.NUMPY
):
    """kernels/layer_norm.py's forward over the last axis (several normalized axes made one);
    returns ``(y, (mean, rstd))``, the row statistics of shape ``x.shape[:begin]`` kept for
    the gradient (Note [Saved for backward] in dispatch.py)."""
    forward = backend.kernels(be, "layer_norm")["layer_norm_forward"]
    begin = begin_norm_axis % x.ndim
    w, b = (None if a is None else a.reshape(-1) for a in (weight, bias))
    y, mean, rstd = forward(_rows2d(x, begin, be.xp), w, b, epsilon)
    return y.reshape(x.shape), (mean, rstd)


_LAYER_NORM = Op(
    "layer_norm",
    _layer_norm_kernel,
    rule="layer_norm",
    device=_with(_layer_norm_kernel),
    saves=True,
)


def _layer_norm_grad_kernel(g, x, mean, rstd, weight=None, begin_norm_axis=-1, wants="xwb",
                            be=backend.NUMPY):  # fmt: skip
    """The gradients ``wants`` names ("x": dx, "w": dweight, "b": dbias, in that order) from
    the forward's row statistics: kernels/layer_norm.py's backward."""
    backward = backend.kernels(be, "layer_norm")["layer_norm_backward"]
    begin = begin_norm_axis % x.ndim
    xp = be.xp
    w = None if weight is None else weight.reshape(-1)
    dx, dw, db = backward(_rows2d(g, begin, xp), _rows2d(x, begin, xp), mean, rstd, w)
    found = {"x": dx.reshape(x.shape), "w": dw.reshape(x.shape[begin:]),
             "b": db.reshape(x.shape[begin:])}  # fmt: skip
    outs = tuple(found[k] for k in wants)
    return outs if len(outs) > 1 else outs[0]


LAYER_NORM_GRAD = Op(
    "layer_norm_grad",
    _layer_norm_grad_kernel,
    rule="layer_norm_grad",
    device=_with(_layer_norm_grad_kernel),
)


def layer_norm(x, weight=None, bias=None, begin_norm_axis: int = -1, epsilon: float = 1e-5):
    """Normalize ``x`` over axes ``[begin_norm_axis, ndim)`` to zero mean and unit variance,
    then scale by ``weight`` and shift by ``bias`` (both of the normalized shape, optional).

    Normalized axes that are split take the composite route: Note [Fused or composite].
    """
    x = _operand(x)
    if x.ndim == 0:
        raise ValueError("layer_norm: x must have at least one axis")
    begin = normalize_axis(begin_norm_axis, x.ndim, "layer_norm: begin_norm_axis")
    params = {"weight": weight, "bias": bias}
    for name, p in params.items():
        if p is not None:
            params[name] = p = _operand(p)
            if p.shape != x.shape[begin:]:
                raise ValueError(
                    f"layer_norm: {name} must have the normalized shape {x.shape[begin:]} "
                    f"(x.shape[{begin}:]), got {p.shape}"
                )
    weight, bias = params["weight"], params["bias"]
    axes = tuple(range(begin, x.ndim))
    if not _splits(x, axes):
        return _LAYER_NORM(x, weight, bias, begin_norm_axis=begin, epsilon=float(epsilon))
    # Partial(avg) means of a split axis: only (rows, 1, ...) statistics are all-reduced
    d = x - mean(x, axes, keepdims=True)
    y = d * EW["rsqrt"](mean(d * d, axes, keepdims=True) + float(epsilon))
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


# -- embedding -------------------------------------------------------------------------------
def _embedding_kernel(ids, weight, *, ctx: KernelContext | None = None, be=backend.NUMPY):
    start, n = _owned(ctx, 1, 0, weight.shape[0])
    vocab = weight.shape[0] if ctx is None else ctx.inputs[1].shape[0]
    ids = _check_index(ids, vocab, "embedding", be.xp)
    out = be.xp.zeros(ids.shape + weight.shape[1:], weight.dtype)
    mine = (ids >= start) & (ids < start + n)  # rows another rank owns stay zero
    out[mine] = weight[ids[mine] - start]
    return out


_EMBEDDING = Op(
    "embedding", _embedding_kernel, rule="embedding", ctx=True, device=_with(_embedding_kernel)
)


def embedding(ids, weight):
    """Row lookup ``weight[ids]``: integer ``ids`` of any shape, ``weight`` of shape
    (vocab, dim); the result has shape ``ids.shape + (dim,)``.

    ids split -> the output's leading axes split; weight split by columns -> the last axis
    split; weight split by rows (vocabulary-parallel) -> Partial(sum). None communicates.
    Negative ids count from the end, as in numpy; an id out of range raises IndexError on
    the ranks that hold it.
    """
    ids, weight = _operand(ids), _operand(weight)
    _check_integer(ids, "embedding: ids")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (vocab, dim), got shape {weight.shape}")
    return _EMBEDDING(ids, weight)


def _embedding_grad_kernel(
    ids, g, vocab, like=(), *, ctx: KernelContext | None = None, be=backend.NUMPY
):
    """Rows of ``g`` added into a zero (vocab, dim) table at ``ids``; with the table's rows
    split, only the rows this rank owns (embedding_grad rule in spmd/nn_rules.py)."""
    start, n = 0, vocab
    if ctx is not None:
        spec = ctx.inputs[1]
        out = DistSpec(spec.mesh, ctx.outputs[0], (vocab, spec.shape[-1]), spec.dtype)
        start, n = out.local_box(ctx.coord)[0]
    ids = _check_index(ids, vocab, "embedding", be.xp)
    out_local = be.xp.zeros((n, g.shape[-1]), g.dtype)
    mine = (ids >= start) & (ids < start + n)
    be.scatter_add(out_local, ids[mine] - start, g[mine])
    return out_local


EMBEDDING_GRAD = Op(
    "embedding_grad",
    _embedding_grad_kernel,
    rule="embedding_grad",
    ctx=True,
    device=_with(_embedding_grad_kernel),
)


# -- cross_entropy ---------------------------------------------------------------------------
def _take_labels_kernel(x, labels, axis, *, ctx: KernelContext | None = None, xp=np):
    start, n = _owned(ctx, 0, axis, x.shape[axis])
    classes = x.shape[axis] if ctx is None else ctx.inputs[0].shape[axis]
    labels = _check_index(labels, classes, "cross_entropy: labels", xp)
    mine = (labels >= start) & (labels < start + n)  # classes another rank owns give zero
    if n == 0:
        return xp.zeros(labels.shape, x.dtype)
    idx = xp.expand_dims(xp.where(mine, labels - start, 0), axis)
    picked = xp.take_along_axis(x, idx, axis).squeeze(axis)
    return xp.where(mine, picked, xp.zeros((), x.dtype))


_TAKE_LABELS = Op(
    "take_labels",
    _take_labels_kernel,
    rule="take_labels",
    ctx=True,
    device=lambda be: partial(_take_labels_kernel, xp=be.xp),
)


def _cross_entropy_kernel(logits, labels, axis, be=backend.NUMPY):
    """Per-sample ``logsumexp(x) - x[label]`` along ``axis``, shifted by the row max:
    kernels/softmax_xent.py's forward with the class axis moved last. Returns ``(loss,
    (shift, sum_exp))``: the row statistics the gradient's softmax needs (Note [Saved for
    backward] in dispatch.py)."""
    x = be.xp.moveaxis(logits, axis, -1)
    labels = _check_index(labels, x.shape[-1], "cross_entropy: labels", be.xp)
    loss, shift, sum_exp = backend.kernels(be, "softmax_xent")["xent_forward"](x, labels)
    return loss, (shift, sum_exp)


_CROSS_ENTROPY = Op(
    "cross_entropy",
    _cross_entropy_kernel,
    rule="cross_entropy",
    device=_with(_cross_entropy_kernel),
    saves=True,
)


def _cross_entropy_grad_kernel(logits, labels, shift, sum_exp, g, axis, be=backend.NUMPY):
    """``(softmax(logits) - onehot(labels)) * g`` along ``axis``, the softmax from the
    forward's row statistics: kernels/softmax_xent.py's backward."""
    xp = be.xp
    x = xp.moveaxis(logits, axis, -1)
    labels = _check_index(labels, x.shape[-1], "cross_entropy: labels", xp)
    dx = backend.kernels(be, "softmax_xent")["xent_backward"](x, labels, shift, sum_exp, g)
    return xp.moveaxis(dx, -1, axis)


CROSS_ENTROPY_GRAD = Op(
    "cross_entropy_grad",
    _cross_entropy_grad_kernel,
    rule="cross_entropy_grad",
    device=_with(_cross_entropy_grad_kernel),
)


def cross_entropy(logits, labels, axis: int = -1, reduction: str = "mean"):
    """``-log_softmax(logits, axis)`` at the integer class ``labels``, reduced by ``reduction``
    ("mean", "sum" or "none"). ``labels`` has the logits' shape without ``axis``.

    A split class axis takes the composite route (Note [Fused or composite]): the logsumexp
    all-reduces per-row max and sum-exp, the owner of each label picks its logit (Partial(sum)),
    and the logits never move. Labels index like numpy (negatives from the end); one out of
    range raises IndexError on the ranks that hold it.
    """
    logits, labels = _operand(logits), _operand(labels)
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}"
        )
    if logits.ndim == 0:
        raise ValueError("cross_entropy: logits must have a class axis")
    axis = normalize_axis(axis, logits.ndim, "cross_entropy")
    _check_integer(labels, "cross_entropy: labels")
    want = logits.shape[:axis] + logits.shape[axis + 1 :]
    if labels.shape != want:
        raise ValueError(
            f"cross_entropy: labels must have the logits' shape without the class axis "
            f"({want}), got {labels.shape}"
        )
    if _splits(logits, (axis,)):
        loss = logsumexp(logits, axis) - _TAKE_LABELS(logits, labels, axis=axis)
    else:
        loss = _CROSS_ENTROPY(logits, labels, axis=axis)
    # .mean()/.sum() exist on DistTensors and numpy results alike
    return loss if reduction == "none" else getattr(loss, reduction)()


# -- the attention score path -----------------------------------------------------------------
# Note [Attention scores]
#     Attention turns scores q k^T into weights as softmax(where(causal, scores * scale, -inf))
#     over the keys. As three dt ops that is three full-size passes and a bool mask table per
#     call; ``attention_softmax`` is one op whose kernel (kernels/softmax.py) scales, masks and
#     normalizes each row in one pass (one block per row on a GPU), and its gradient is one
#     op too: softmax_grad with the scale (masked entries have weight 0, so gradient 0; no
#     mask in backward). Its rule (spmd/nn_rules.py) needs the keys whole and, with the causal
#     mask, the queries too (a row's query index picks its mask); batch and head axes keep
#     their sharding, so Megatron's head-split attention runs it with no communication.
def _attention_softmax_kernel(scores, scale=1.0, causal=True, be=backend.NUMPY):
    f = backend.kernels(be, "softmax")["attention_softmax_forward"]
    return f(scores, scale, causal)


_ATTENTION_SOFTMAX = Op(
    "attention_softmax",
    _attention_softmax_kernel,
    rule="attention_softmax",
    device=_with(_attention_softmax_kernel),
)


def attention_softmax(scores, scale: float, causal: bool = True):
    """``softmax(where(mask, scores * scale, -inf), axis=-1)`` in one op (Note [Attention
    scores]): ``scores`` of shape (..., queries, keys); ``mask`` lets query i see keys
    j <= i (``np.tril`` of the last two axes, PyTorch's ``is_causal``) when ``causal``, every
    key otherwise.

    >>> import numpy as np
    >>> attention_softmax(np.zeros((2, 2)), 0.5)
    array([[1. , 0. ],
           [0.5, 0.5]])
    """
    scores = _operand(scores)
    if scores.ndim < 2:
        raise ValueError(
            f"attention_softmax: scores need two axes (queries, keys), got shape {scores.shape}"
        )
    return _ATTENTION_SOFTMAX(scores, scale=float(scale), causal=bool(causal))


__all__ = ["cross_entropy", "embedding", "layer_norm"]
