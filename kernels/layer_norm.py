"""Layer norm over the last axis: numpy references and the CuPy loader of kernels/layer_norm.cu.

The normalized axes are the last one; a caller normalizing over several trailing axes
reshapes them into one first. ``layer_norm_forward`` computes what disttensor's fused layer
norm kernel computes (disttensor/ops/nn.py), bit for bit: the mean, the mean of squared
deviations, ``eps`` added before the square root; it also returns the per-row ``mean`` and
``rstd = 1 / sqrt(var + eps)`` that ``layer_norm_backward`` needs.

>>> y, mean, rstd = layer_norm_forward(np.array([[1.0, 3.0]]))
>>> y, mean, rstd
(array([[-0.999995,  0.999995]]), array([2.]), array([0.999995]))
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _cuda

SOURCE = "layer_norm.cu"
ROWS_Y = 8  # the row threads of a column tile (ROWS_Y in layer_norm.cu)
CHUNK_ROWS = 64  # rows per chunk of the weight/bias gradient's first stage, at the least


def _check(x: Any, weight: Any, bias: Any, what: str) -> None:
    if x.ndim == 0:
        raise ValueError(f"{what}: x must have at least one axis")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.shape != x.shape[-1:]:
            raise ValueError(f"{what}: {name} must have shape {x.shape[-1:]}, got {p.shape}")


def layer_norm_forward(
    x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y, mean, rstd)``: ``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last
    axis (``weight`` and ``bias`` optional), with the rows' ``mean`` and ``rstd``.

    >>> layer_norm_forward(np.array([[0.0, 2.0]]), np.array([2.0, 2.0]), np.array([1.0, 1.0]))[0]
    array([[-0.99999,  2.99999]])
    """
    x = np.asarray(x)
    weight = None if weight is None else np.asarray(weight)
    bias = None if bias is None else np.asarray(bias)
    _check(x, weight, bias, "layer_norm_forward")
    mean = x.mean(axis=-1, keepdims=True)
    d = x - mean
    std = np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)
    y = d / std
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mean[..., 0], 1 / std[..., 0]


def layer_norm_backward(
    dy: Any, x: Any, mean: Any, rstd: Any, weight: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dweight, dbias)`` of layer norm from the forward pass's ``mean`` and ``rstd``:
    ``dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat))`` with ``gy = dy * weight``,
    ``dweight = sum(dy * xhat)`` and ``dbias = sum(dy)`` over the rows.

    >>> x = np.array([[1.0, 3.0]])
    >>> _, mean, rstd = layer_norm_forward(x)
    >>> [g.round(4) for g in layer_norm_backward(np.array([[1.0, 1.0]]), x, mean, rstd)]
    [array([[0., 0.]]), array([-1.,  1.]), array([1., 1.])]
    """
    dy, x = np.asarray(dy), np.asarray(x)
    weight = None if weight is None else np.asarray(weight)
    _check(x, weight, None, "layer_norm_backward")
    if dy.shape != x.shape:
        raise ValueError(f"layer_norm_backward: dy must have x's shape {x.shape}, got {dy.shape}")
    rstd = np.asarray(rstd)[..., None]
    xhat = (x - np.asarray(mean)[..., None]) * rstd
    gy = dy if weight is None else dy * weight
    inner = gy.mean(axis=-1, keepdims=True) + xhat * (gy * xhat).mean(axis=-1, keepdims=True)
    rows = tuple(range(x.ndim - 1))
    return rstd * (gy - inner), (dy * xhat).sum(axis=rows), dy.sum(axis=rows)


REFERENCES: dict[str, Callable[..., Any]] = {
    "layer_norm_forward": layer_norm_forward,
    "layer_norm_backward": layer_norm_backward,
}


def load(cupy: Any) -> dict[str, Callable[..., Any]]:
    """CuPy versions of ``REFERENCES`` (same names and signatures, on cupy arrays of float32
    or float64), built from layer_norm.cu. Needs a GPU.

    >>> import cupy  # doctest: +SKIP
    >>> y, mean, rstd = load(cupy)["layer_norm_forward"](x, w, b)  # doctest: +SKIP
    """
    module = _cuda.build(cupy, SOURCE)

    def flat(a: Any, dtype: Any) -> Any:
        return None if a is None else cupy.ascontiguousarray(cupy.asarray(a, dtype))

    def shape2d(x: Any) -> tuple[int, int]:
        cols = x.shape[-1]
        return int(np.prod(x.shape[:-1])), cols

    @functools.wraps(layer_norm_forward)
    def forward(x, weight=None, bias=None, eps=1e-5):
        x = cupy.ascontiguousarray(cupy.asarray(x))
        sfx = _cuda.suffix(x.dtype, "layer_norm_forward")
        weight, bias = flat(weight, x.dtype), flat(bias, x.dtype)
        _check(x, weight, bias, "layer_norm_forward")
        rows, cols = shape2d(x)
        y = cupy.empty_like(x)
        mean, rstd = cupy.empty(x.shape[:-1], x.dtype), cupy.empty(x.shape[:-1], x.dtype)
        if rows:
            w = _cuda.NULL if weight is None else weight
            b = _cuda.NULL if bias is None else bias
            args = (x, w, b, np.int64(rows), np.int64(cols), x.dtype.type(eps), y, mean, rstd)
            grid = (min(rows, _cuda.MAX_BLOCKS),)
            module.get_function("ln_forward_" + sfx)(grid, (_cuda.row_threads(cols),), args)
        return y, mean, rstd

    @functools.wraps(layer_norm_backward)
    def backward(dy, x, mean, rstd, weight=None):
        x = cupy.ascontiguousarray(cupy.asarray(x))
        sfx = _cuda.suffix(x.dtype, "layer_norm_backward")
        dy, mean, rstd, weight = (flat(a, x.dtype) for a in (dy, mean, rstd, weight))
        _check(x, weight, None, "layer_norm_backward")
        if dy.shape != x.shape:
            raise ValueError(f"layer_norm_backward: dy must have x's shape {x.shape}")
        rows, cols = shape2d(x)
        dx = cupy.empty_like(x)
        dweight, dbias = cupy.zeros(cols, x.dtype), cupy.zeros(cols, x.dtype)
        if not rows or not cols:
            return dx, dweight, dbias
        w = _cuda.NULL if weight is None else weight
        n, c = np.int64(rows), np.int64(cols)
        grid = (min(rows, _cuda.MAX_BLOCKS),)
        args = (dy, x, mean, rstd, w, n, c, dx)
        module.get_function("ln_backward_dx_" + sfx)(grid, (_cuda.row_threads(cols),), args)
        # column sums in two stages: chunks of rows, then the chunks (at most 1024 of them)
        chunk = max(CHUNK_ROWS, -(-rows // 1024))
        chunks = -(-rows // chunk)
        pdw, pdb = cupy.empty((chunks, cols), x.dtype), cupy.empty((chunks, cols), x.dtype)
        tiles = (-(-cols // 32), chunks)
        args = (dy, x, mean, rstd, n, c, np.int64(chunk), pdw, pdb)
        module.get_function("ln_backward_partial_" + sfx)(tiles, (32, ROWS_Y), args)
        args = (pdw, pdb, np.int64(chunks), c, dweight, dbias)
        finish = module.get_function("ln_backward_finish_" + sfx)
        finish((_cuda.blocks(cols),), (_cuda.THREADS,), args)
        return dx, dweight, dbias

    return {"layer_norm_forward": forward, "layer_norm_backward": backward}
