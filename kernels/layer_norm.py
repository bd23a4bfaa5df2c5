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

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _cuda, _host

SOURCE = "layer_norm.cu"
HOST_SOURCE = "layer_norm.c"
ROWS_Y = 8  # the row threads of a column tile (ROWS_Y in layer_norm.cu)
CHUNK_ROWS = 64  # rows per chunk of the weight/bias gradient's first stage, at the least


def _check(x: Any, weight: Any, bias: Any, what: str) -> None:
    if x.ndim == 0:
        raise ValueError(f"{what}: x must have at least one axis")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.shape != x.shape[-1:]:
            raise ValueError(f"{what}: {name} must have shape {x.shape[-1:]}, got {p.shape}")


def row_block(cols: int, itemsize: int) -> int:
    """Rows per block of the numpy references: about 512 KiB of a row-major (rows, cols)
    array, so the several passes over a block run in the CPU's cache, not its memory
    (Note [Row blocks]).

    >>> row_block(1024, 4), row_block(1, 8), row_block(10**6, 4)
    (128, 65536, 1)
    """
    return max(1, BLOCK_BYTES // max(1, cols * itemsize))


# Note [Row blocks]
#     A row-wise kernel written in numpy is a few passes over its data (deviations, scaling,
#     products, ...). Over a whole (4096, 1024) float32 array each pass streams 16 MiB and
#     each temporary is a fresh allocation the operating system must map in; a block of rows
#     of about 512 KiB stays in the cache across the passes, and the temporaries are a few
#     block-sized buffers made once per call. Row sums and dot products are BLAS
#     matrix-vector products (``block @ ones``, a batched ``matmul`` of rows): they read the
#     block once and write one number per row, where numpy's reduction writes a temporary
#     first. They add in BLAS's order, not numpy's pairwise one (float rounding differs, not
#     accuracy: both accumulate in blocks).
BLOCK_BYTES = 512 << 10


def _as_rows(a: Any) -> Any:
    """``a`` as a 2-D (rows, last axis) array (a view where the layout allows)."""
    return a.reshape(-1, a.shape[-1]) if a.ndim != 2 else a


def layer_norm_forward(
    x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y, mean, rstd)``: ``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last
    axis (``weight`` and ``bias`` optional), with the rows' ``mean`` and ``rstd``.

    In blocks of rows, into the output and one block of scratch (Note [Row blocks]); the
    row sums are products with a vector of ones (one BLAS call each, where numpy's
    reductions would make a pass and a temporary), so they add in BLAS's order.

    >>> layer_norm_forward(np.array([[0.0, 2.0]]), np.array([2.0, 2.0]), np.array([1.0, 1.0]))[0]
    array([[-0.99999,  2.99999]])
    """
    x = np.asanyarray(x)
    weight = None if weight is None else np.asanyarray(weight)
    bias = None if bias is None else np.asanyarray(bias)
    _check(x, weight, bias, "layer_norm_forward")
    dtype = np.result_type(x, 1.0) if x.dtype.kind not in "fc" else x.dtype
    cols = x.shape[-1]
    y = np.empty(x.shape, np.result_type(dtype, *(p for p in (weight, bias) if p is not None)))
    mean = np.empty(x.shape[:-1], dtype)
    rstd = np.empty(x.shape[:-1], dtype)
    if y.size == 0:
        if mean.size:  # rows of no columns: numpy's mean of nothing
            with np.errstate(invalid="ignore", divide="ignore"):
                mean[...] = np.nan
                rstd[...] = 1 / np.sqrt(mean + eps)
        return y, mean, rstd
    x2, y2, m1, r1 = _as_rows(x), _as_rows(y), mean.reshape(-1, 1), rstd.reshape(-1, 1)
    rows = x2.shape[0]
    step = row_block(cols, y.itemsize)
    d = np.empty((min(step, rows), cols), dtype) if y.dtype != dtype else None
    ones = np.ones((cols, 1), dtype)
    inv = 1.0 / cols  # a Python float: float32 stays float32
    for r0 in range(0, rows, step):
        r1_ = min(rows, r0 + step)
        xb, mu, rs = x2[r0:r1_], m1[r0:r1_], r1[r0:r1_]
        db = y2[r0:r1_] if d is None else d[: r1_ - r0]
        np.matmul(xb, ones, out=mu)
        mu *= inv
        np.subtract(xb, mu, out=db)
        np.matmul(db[:, None, :], db[:, :, None], out=rs[:, :, None])  # the rows' squares
        rs *= inv
        rs += eps
        np.sqrt(rs, out=rs)
        np.divide(1.0, rs, out=rs)
        yb = y2[r0:r1_]
        np.multiply(db, rs, out=yb)
        if weight is not None:
            np.multiply(yb, weight, out=yb)
        if bias is not None:
            np.add(yb, bias, out=yb)
    return y, mean, rstd


def layer_norm_backward(
    dy: Any, x: Any, mean: Any, rstd: Any, weight: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dweight, dbias)`` of layer norm from the forward pass's ``mean`` and ``rstd``:
    ``dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat))`` with ``gy = dy * weight``,
    ``dweight = sum(dy * xhat)`` and ``dbias = sum(dy)`` over the rows.

    In blocks of rows with three block-sized buffers (Note [Row blocks]); the row means and
    the column sums are products with a vector of ones (one BLAS call each, where numpy's
    reductions would make a pass and a temporary), so they add in BLAS's order.

    >>> x = np.array([[1.0, 3.0]])
    >>> _, mean, rstd = layer_norm_forward(x)
    >>> [g.round(4) for g in layer_norm_backward(np.array([[1.0, 1.0]]), x, mean, rstd)]
    [array([[0., 0.]]), array([-1.,  1.]), array([1., 1.])]
    """
    dy, x = np.asanyarray(dy), np.asanyarray(x)
    weight = None if weight is None else np.asanyarray(weight)
    _check(x, weight, None, "layer_norm_backward")
    if dy.shape != x.shape:
        raise ValueError(f"layer_norm_backward: dy must have x's shape {x.shape}, got {dy.shape}")
    mean, rstd = np.asanyarray(mean), np.asanyarray(rstd)
    dtype = np.result_type(dy, x, mean, rstd, *(() if weight is None else (weight,)))
    if dtype.kind not in "fc":
        dtype = np.result_type(dtype, 1.0)
    cols = x.shape[-1]
    dx = np.empty(x.shape, dtype)
    dweight = np.zeros(x.shape[-1:], dtype)
    dbias = np.zeros(x.shape[-1:], dtype)
    if dx.size == 0:
        return dx, dweight, dbias
    dy2, x2, dx2 = _as_rows(dy), _as_rows(x), _as_rows(dx)
    m1, r1 = mean.reshape(-1, 1), rstd.reshape(-1, 1)
    rows = x2.shape[0]
    step = row_block(cols, dx.itemsize)
    k = min(step, rows)
    xhat, gy, tmp = (np.empty((k, cols), dtype) for _ in range(3))
    ones_rows, ones_cols = np.ones(k, dtype), np.ones((cols, 1), dtype)
    inv = 1.0 / cols  # a Python float: float32 stays float32
    for r0 in range(0, rows, step):
        r1_ = min(rows, r0 + step)
        n = r1_ - r0
        xb, dyb, rs = x2[r0:r1_], dy2[r0:r1_], r1[r0:r1_]
        xh, t = xhat[:n], tmp[:n]
        np.subtract(xb, m1[r0:r1_], out=xh)
        np.multiply(xh, rs, out=xh)
        np.multiply(dyb, xh, out=t)  # the weight gradient's terms
        dweight += ones_rows[:n] @ t
        dbias += ones_rows[:n] @ dyb
        if weight is None:
            g = dyb
        else:
            g = gy[:n]
            np.multiply(dyb, weight, out=g)
        mean_g = g @ ones_cols
        mean_g *= inv
        proj = np.matmul(g[:, None, :], xh[:, :, None])[:, 0]  # the rows' dot products
        proj *= inv
        np.multiply(xh, proj, out=xh)  # inner = mean(gy) + xhat * mean(gy * xhat)
        np.add(xh, mean_g, out=xh)
        out = dx2[r0:r1_]
        np.subtract(g, xh, out=out)
        np.multiply(out, rs, out=out)
    return dx, dweight, dbias


REFERENCES: dict[str, Callable[..., Any]] = {
    "layer_norm_forward": layer_norm_forward,
    "layer_norm_backward": layer_norm_backward,
}


def load_host() -> dict[str, Callable[..., Any]]:
    """Compiled versions of ``REFERENCES`` on the host (layer_norm.c; Note [Host kernels] in
    kernels/_host.py) where the host kernels are built, else nothing (the references run).
    They take float32 and float64 inputs of one dtype; anything else goes to the reference.
    """
    P, N, F = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_double
    entries = _host.entries(
        {"ln_forward": [P, P, P, N, N, F, P, P, P], "ln_backward": [P, P, P, P, P, N, N, P, P, P]}
    )
    if entries is None:
        return {}
    ptr = _host.pointer

    def same(dtype: Any, *arrays: Any) -> bool:
        return all(a is None or a.dtype == dtype for a in arrays)

    def contiguous(a: Any) -> Any:
        return None if a is None else np.ascontiguousarray(a)

    @functools.wraps(layer_norm_forward)
    def forward(x, weight=None, bias=None, eps=1e-5):
        x = np.asarray(x)
        weight = None if weight is None else np.asarray(weight)
        bias = None if bias is None else np.asarray(bias)
        _check(x, weight, bias, "layer_norm_forward")
        fns = entries.get(x.dtype)
        if fns is None or not same(x.dtype, weight, bias) or x.shape[-1] == 0:
            return layer_norm_forward(x, weight, bias, eps)
        x, weight, bias = contiguous(x), contiguous(weight), contiguous(bias)
        y = np.empty_like(x)
        mean, rstd = np.empty(x.shape[:-1], x.dtype), np.empty(x.shape[:-1], x.dtype)
        rows, cols = mean.size, x.shape[-1]
        fns["ln_forward"](ptr(x), ptr(weight), ptr(bias), rows, cols, float(eps), ptr(y),
                          ptr(mean), ptr(rstd))  # fmt: skip
        return y, mean, rstd

    @functools.wraps(layer_norm_backward)
    def backward(dy, x, mean, rstd, weight=None):
        dy, x, mean, rstd = (np.asarray(a) for a in (dy, x, mean, rstd))
        weight = None if weight is None else np.asarray(weight)
        _check(x, weight, None, "layer_norm_backward")
        fns = entries.get(x.dtype)
        if (
            fns is None
            or not same(x.dtype, dy, mean, rstd, weight)
            or dy.shape != x.shape
            or mean.shape != x.shape[:-1] != rstd.shape
        ):
            return layer_norm_backward(dy, x, mean, rstd, weight)
        dy, x, mean, rstd, weight = (contiguous(a) for a in (dy, x, mean, rstd, weight))
        dx = np.empty_like(x)
        dweight, dbias = np.zeros(x.shape[-1:], x.dtype), np.zeros(x.shape[-1:], x.dtype)
        rows, cols = mean.size, x.shape[-1]
        if dx.size:
            fns["ln_backward"](ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(weight), rows, cols,
                               ptr(dx), ptr(dweight), ptr(dbias))  # fmt: skip
        return dx, dweight, dbias

    return {"layer_norm_forward": forward, "layer_norm_backward": backward}


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
