"""Softmax cross entropy: numpy references and the CuPy loader of kernels/softmax_xent.cu.

The class axis is the last one (callers move it there); labels have the logits' shape without
it. As in disttensor's cross entropy (disttensor/ops/nn.py), a label counts from the end when
negative and one outside ``[-classes, classes)`` raises IndexError; the loss of a row is
``log(sum(exp(x - s))) + s - x[label]`` with ``s`` the row max where that is finite, else 0.

Note [Vocabulary-parallel pieces]
    A rank of a vocabulary-parallel loss holds the columns ``[start, start + cols)`` of a
    ``classes``-wide vocabulary. disttensor composes the loss from an all-reduced max, an
    all-reduced sum of exponentials and the label's logit picked by its owner (Partial sum);
    these are its local pieces, in the order a rank calls them::

        local_max, label_logit = xent_local_max(block, labels, start, classes)
        shift = row_shift(all_reduce_max(local_max))
        sum_exp, label = all_reduce_sum(xent_local_sum_exp(block, shift), label_logit)
        loss = np.log(sum_exp) + shift - label
        dblock = xent_backward(block, labels, shift, sum_exp, grad_loss, start, classes)

    (the second all-reduce carries both sums). Only per-row vectors move; the logits never do.

>>> loss, shift, sum_exp = xent_forward(np.zeros((2, 4)), np.array([1, -1]))
>>> loss  # four equal classes: log(4)
array([1.38629436, 1.38629436])
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _cuda, _host

SOURCE = "softmax_xent.cu"
HOST_SOURCE = "softmax_xent.c"


def _as_float(logits: Any) -> np.ndarray:
    """The logits in the dtype the loss is computed in (integers become float64)."""
    logits = np.asarray(logits)
    if logits.ndim == 0:
        raise ValueError("softmax_xent: logits must have a class axis")
    return logits.astype(np.result_type(logits, 1.0), copy=False)


def check_labels(labels: Any, classes: int, rows_shape: tuple[int, ...]) -> np.ndarray:
    """``labels`` as int64 in ``[0, classes)``, negatives counted from the end; IndexError for
    one out of range, ValueError for a shape that is not ``rows_shape``.

    >>> check_labels([0, -1], 5, (2,))
    array([0, 4])
    """
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"softmax_xent: labels must be integers, got dtype {labels.dtype}")
    if labels.shape != rows_shape:
        raise ValueError(f"softmax_xent: labels must have shape {rows_shape}, got {labels.shape}")
    if labels.size and (labels.min() < -classes or labels.max() >= classes):
        raise IndexError(f"softmax_xent: a label is out of range for {classes} classes")
    labels = labels.astype(np.int64, copy=False)
    return np.where(labels < 0, labels + classes, labels)


def _take(x: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """``x[..., columns]`` per row (``columns`` of the rows' shape)."""
    return np.take_along_axis(x, columns[..., None], -1)[..., 0]


def row_shift(row_max: Any) -> np.ndarray:
    """The shift of each row: its max where finite, else 0 (NaN, +inf, or only -inf).

    >>> row_shift(np.array([2.0, -np.inf, np.nan]))
    array([2., 0., 0.])
    """
    return np.where(np.isfinite(row_max), row_max, 0)


def xent_forward(logits: Any, labels: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row loss ``log(sum(exp(x - shift))) + shift - x[label]``, with the ``shift`` and
    ``sum_exp`` the backward pass needs; bit for bit disttensor's fused cross entropy.

    >>> [a.round(4) for a in xent_forward(np.log([[1.0, 3.0]]), np.array([1]))]
    [array([0.2877]), array([1.0986]), array([1.3333])]
    """
    x = _as_float(logits)
    labels = check_labels(labels, x.shape[-1], x.shape[:-1])
    shift = row_shift(np.max(x, axis=-1, initial=-np.inf))
    e = np.subtract(x, shift[..., None])  # the one temporary: exp in place
    sum_exp = np.sum(np.exp(e, out=e), axis=-1)
    return np.log(sum_exp) + shift - _take(x, labels), shift, sum_exp


def xent_local_max(
    block: Any, labels: Any, start: int, classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """A vocabulary block's row max (-inf for no columns) and each label's logit where the
    block holds the label, else 0 (Note [Vocabulary-parallel pieces]).

    >>> xent_local_max(np.array([[1.0, 5.0]]), np.array([3]), 2, 4)
    (array([5.]), array([5.]))
    """
    x = _as_float(block)
    labels = check_labels(labels, classes, x.shape[:-1])
    column = labels - start
    mine = (column >= 0) & (column < x.shape[-1])
    picked = _take(x, np.where(mine, column, 0)) if x.shape[-1] else np.zeros(mine.shape, x.dtype)
    label_logit = np.where(mine, picked, np.zeros((), x.dtype))
    return np.max(x, axis=-1, initial=-np.inf), label_logit


def xent_local_sum_exp(block: Any, shift: Any) -> np.ndarray:
    """``sum(exp(x - shift))`` over a block's columns (the shift made from the global max).

    >>> xent_local_sum_exp(np.zeros((1, 3)), np.zeros(1))
    array([3.])
    """
    x = _as_float(block)
    return np.sum(np.exp(x - np.asarray(shift, x.dtype)[..., None]), axis=-1)


def xent_backward(
    logits: Any,
    labels: Any,
    shift: Any,
    sum_exp: Any,
    grad_loss: Any,
    start: int = 0,
    classes: int | None = None,
) -> np.ndarray:
    """``(softmax(x) - onehot(label)) * grad_loss`` per row, the softmax from the forward
    pass's ``shift`` and ``sum_exp``; ``grad_loss`` broadcasts to the rows. With a block's
    ``start`` and the vocabulary's ``classes``, that block of the vocabulary-parallel gradient.

    >>> xent_backward(np.zeros((1, 2)), np.array([0]), np.zeros(1), np.full(1, 2.0), 1.0)
    array([[-0.5,  0.5]])
    """
    x = _as_float(logits)
    cols = x.shape[-1]
    classes = cols if classes is None else classes
    labels = check_labels(labels, classes, x.shape[:-1])
    rows = x.shape[:-1]
    g = np.broadcast_to(np.asarray(grad_loss, x.dtype), rows)
    # exp(x - shift) * (g / sum_exp), then g off at the label: one array, three passes
    dx = np.subtract(x, np.asarray(shift, x.dtype)[..., None])
    np.exp(dx, out=dx)
    dx *= (g / np.asarray(sum_exp, x.dtype))[..., None]
    column = (labels - start).reshape(-1)
    mine = np.flatnonzero((column >= 0) & (column < cols))
    if mine.size:
        flat = dx.reshape(-1, cols)  # a view: dx is a fresh C-contiguous array
        flat[mine, column[mine]] -= g.reshape(-1)[mine]
    return dx


REFERENCES: dict[str, Callable[..., Any]] = {
    "xent_forward": xent_forward,
    "xent_local_max": xent_local_max,
    "xent_local_sum_exp": xent_local_sum_exp,
    "xent_backward": xent_backward,
    "row_shift": row_shift,
}


def load_host() -> dict[str, Callable[..., Any]]:
    """Compiled versions of ``xent_forward``, ``xent_backward`` and ``xent_local_sum_exp`` on
    the host (softmax_xent.c; Note [Host kernels] in kernels/_host.py) where the host kernels
    are built, else nothing (the references run; ``xent_local_max`` and ``row_shift``, with
    no exp, are theirs anyway).

    They take logits of float32 or float64 (integers as float64, as the references compute
    them) in any layout (copied C-contiguous); the labels are checked here by
    ``check_labels``, with the reference's errors, and the per-row arguments converted to the
    logits' dtype and broadcast to the rows as the reference does. Other dtypes and per-row
    arguments that do not broadcast to the rows go to the reference. Results are the
    references' to float rounding (host.h's exp, sums in lanes), NaN, infinite and 0 where
    theirs are.
    """
    P, N = ctypes.c_void_p, ctypes.c_longlong
    signatures = {
        "xent_forward": [P, P, N, N, P, P, P],
        "xent_local_sum_exp": [P, N, N, P, P],
        "xent_backward": [P, P, N, N, P, P, P, P],
    }
    entries = _host.entries(signatures)
    if entries is None:
        return {}
    ptr = _host.pointer

    def per_row(a: Any, x: np.ndarray) -> np.ndarray | None:
        """``a`` in ``x``'s dtype, one C-contiguous value per row, as the reference reads
        it; None where it does not broadcast to the rows (the reference then says why)."""
        rows = x.shape[:-1]
        try:
            a = np.broadcast_to(np.asarray(a, x.dtype), rows)
        except ValueError:
            return None
        return np.ascontiguousarray(a).reshape(rows)

    @functools.wraps(xent_forward)
    def forward(logits, labels):
        x = _as_float(logits)
        fns = entries.get(x.dtype)
        if fns is None:
            return xent_forward(x, labels)
        labels = np.ascontiguousarray(check_labels(labels, x.shape[-1], x.shape[:-1]))
        x = np.ascontiguousarray(x)
        loss, shift, sum_exp = (np.empty(x.shape[:-1], x.dtype) for _ in range(3))
        fns["xent_forward"](ptr(x), ptr(labels), math.prod(x.shape[:-1]), x.shape[-1],
                            ptr(loss), ptr(shift), ptr(sum_exp))  # fmt: skip
        return loss, shift, sum_exp

    @functools.wraps(xent_local_sum_exp)
    def local_sum_exp(block, shift):
        x = _as_float(block)
        fns = entries.get(x.dtype)
        rows_shift = None if fns is None else per_row(shift, x)
        if rows_shift is None:
            return xent_local_sum_exp(x, shift)
        x = np.ascontiguousarray(x)
        out = np.empty(x.shape[:-1], x.dtype)
        fns["xent_local_sum_exp"](ptr(x), math.prod(x.shape[:-1]), x.shape[-1],
                                  ptr(rows_shift), ptr(out))  # fmt: skip
        return out

    @functools.wraps(xent_backward)
    def backward(logits, labels, shift, sum_exp, grad_loss, start=0, classes=None):
        x = _as_float(logits)
        fns = entries.get(x.dtype)
        stats = None if fns is None else [per_row(a, x) for a in (shift, sum_exp, grad_loss)]
        if stats is None or any(a is None for a in stats):
            return xent_backward(x, labels, shift, sum_exp, grad_loss, start, classes)
        cols = x.shape[-1]
        labels = check_labels(labels, cols if classes is None else classes, x.shape[:-1])
        column = np.ascontiguousarray(labels - start, np.int64)
        x = np.ascontiguousarray(x)
        dx = np.empty(x.shape, x.dtype)
        fns["xent_backward"](ptr(x), ptr(column), math.prod(x.shape[:-1]), cols,
                             *(ptr(a) for a in stats), ptr(dx))  # fmt: skip
        return dx

    return {
        "xent_forward": forward,
        "xent_local_sum_exp": local_sum_exp,
        "xent_backward": backward,
    }


def load(cupy: Any) -> dict[str, Callable[..., Any]]:
    """CuPy versions of ``REFERENCES`` (same names and signatures, on cupy arrays with the
    class axis last, float32 or float64), built from softmax_xent.cu. Needs a GPU.

    >>> import cupy  # doctest: +SKIP
    >>> loss, shift, sum_exp = load(cupy)["xent_forward"](logits, labels)  # doctest: +SKIP
    """
    module = _cuda.build(cupy, SOURCE)

    def prepare(logits: Any, labels: Any, classes: int | None, what: str):
        """(logits, labels, rows, cols, kernel suffix) checked and made contiguous."""
        x = cupy.ascontiguousarray(cupy.asarray(logits))
        if x.ndim == 0:
            raise ValueError(f"{what}: logits must have a class axis")
        suffix = _cuda.suffix(x.dtype, what)
        cols = x.shape[-1]
        classes = cols if classes is None else classes
        if labels is not None:
            labels = cupy.ascontiguousarray(cupy.asarray(labels, np.int64))
            if labels.shape != x.shape[:-1]:
                raise ValueError(f"{what}: labels must have shape {x.shape[:-1]}")
            if labels.size and (int(labels.min()) < -classes or int(labels.max()) >= classes):
                raise IndexError(f"{what}: a label is out of range for {classes} classes")
        return x, labels, int(np.prod(x.shape[:-1])), cols, suffix

    def launch(name: str, suffix: str, rows: int, cols: int, args: tuple) -> None:
        if rows:
            grid = (min(rows, _cuda.MAX_BLOCKS),)
            module.get_function(f"{name}_{suffix}")(grid, (_cuda.row_threads(cols),), args)

    def rows_of(a: Any, x: Any) -> Any:
        return cupy.ascontiguousarray(cupy.broadcast_to(cupy.asarray(a, x.dtype), x.shape[:-1]))

    @functools.wraps(xent_forward)
    def forward(logits, labels):
        x, labels, rows, cols, sfx = prepare(logits, labels, None, "xent_forward")
        loss, shift, sum_exp = (cupy.empty(x.shape[:-1], x.dtype) for _ in range(3))
        args = (x, labels, np.int64(rows), np.int64(cols), loss, shift, sum_exp)
        launch("xent_forward", sfx, rows, cols, args)
        return loss, shift, sum_exp

    @functools.wraps(xent_local_max)
    def local_max(block, labels, start, classes):
        x, labels, rows, cols, sfx = prepare(block, labels, classes, "xent_local_max")
        top, picked = cupy.empty(x.shape[:-1], x.dtype), cupy.empty(x.shape[:-1], x.dtype)
        args = (x, labels, np.int64(rows), np.int64(cols), np.int64(start), np.int64(classes))
        launch("xent_local_max", sfx, rows, cols, (*args, top, picked))
        return top, picked

    @functools.wraps(xent_local_sum_exp)
    def local_sum_exp(block, shift):
        x, _, rows, cols, sfx = prepare(block, None, None, "xent_local_sum_exp")
        out = cupy.empty(x.shape[:-1], x.dtype)
        args = (x, np.int64(rows), np.int64(cols), rows_of(shift, x), out)
        launch("xent_local_sum_exp", sfx, rows, cols, args)
        return out

    @functools.wraps(xent_backward)
    def backward(logits, labels, shift, sum_exp, grad_loss, start=0, classes=None):
        x, labels, rows, cols, sfx = prepare(logits, labels, classes, "xent_backward")
        classes = cols if classes is None else classes
        dx = cupy.empty_like(x)
        stats = (rows_of(shift, x), rows_of(sum_exp, x), rows_of(grad_loss, x))
        args = (x, labels, np.int64(rows), np.int64(cols), np.int64(start), np.int64(classes))
        launch("xent_backward", sfx, rows, cols, (*args, *stats, dx))
        return dx

    @functools.wraps(row_shift)
    def shift_cuda(row_max):
        return cupy.where(cupy.isfinite(row_max), row_max, 0)

    return {
        "xent_forward": forward,
        "xent_local_max": local_max,
        "xent_local_sum_exp": local_sum_exp,
        "xent_backward": backward,
        "row_shift": shift_cuda,
    }
