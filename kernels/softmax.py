"""Softmax, log softmax, logsumexp and the attention score path over the last axis: numpy
references and the CuPy loader of kernels/softmax.cu.

Callers move the reduced axis last (or merge several into it); a 0-d input is one row of one
element. Integer and bool inputs compute in float64, floating ones in their own dtype: the
references pass Python floats only, so float32 stays float32 (NEP 50).

Note [Softmax of odd rows]
    These compute what disttensor's composites of dt ops computed (disttensor/ops/reduction.py),
    NaNs and infinities included, and the CUDA kernels follow:

    * softmax shifts each row by its max (numpy's: a NaN wins), so a row whose max is not
      finite (a NaN, a +inf, or nothing but -inf) is NaN throughout: ``x - max`` is NaN
      somewhere, and so is the row's sum;
    * logsumexp and log softmax shift by the max where it is finite, else by 0 (as the
      softmax cross entropy does, kernels/softmax_xent.py): a row of -inf has logsumexp -inf
      and an empty row too (log 0), a row with a +inf has +inf, a row with a NaN NaN; log
      softmax is ``x - logsumexp`` (so -inf rows give NaN, a +inf gives -inf beside NaN);
    * a -inf entry of a finite row contributes exp(-inf) = 0: it is how the attention path
      masks (its masked entries get softmax 0, hence gradient 0, with no mask in backward).

The numpy references allocate their result and use it as their only full-size scratch; the
reductions' row vectors are the only other temporaries, and the inputs are never written.

>>> softmax_forward(np.log([[1.0, 3.0]]))
array([[0.25, 0.75]])
>>> logsumexp_forward(np.array([[0.0, 0.0], [1.0, -np.inf]]))
array([0.69314718, 1.        ])
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _cuda, _host

SOURCE = "softmax.cu"
HOST_SOURCE = "softmax.c"
WARP_COLS = 1024  # rows up to this long run a warp each (WARP_COLS in softmax.cu)
WARP_PER = (4, 8, 16, 32)  # columns per lane of the warp entries <name>_w<PER>_<f32|f64>
WARP_THREADS = 128  # threads of a block of such warps: four rows at a time
# the entries with warp variants (logsumexp_backward, with no reduction, has one entry)
_WARP = {"softmax_forward", "softmax_backward", "log_softmax_forward", "log_softmax_backward",
         "logsumexp_forward"}  # fmt: skip


def _floating(x: Any, what: str) -> np.ndarray:
    """``x`` as an array (subclasses kept) in the dtype it is computed in."""
    x = np.asanyarray(x)
    if x.dtype.kind == "c":
        raise TypeError(f"{what}: complex input is not supported (softmax orders its values)")
    return x if x.dtype.kind == "f" else x.astype(np.float64)


def _same_shape(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{what}: the gradient has shape {a.shape}, the output {b.shape}")


def _shift(x: np.ndarray) -> np.ndarray:
    """The rows' max where finite, else 0, kept as a (rows, 1) column (Note [Softmax of odd
    rows]); an empty row has -inf for max, so 0."""
    m = np.max(x, axis=-1, keepdims=True, initial=-np.inf)
    m[~np.isfinite(m)] = 0
    return m


def _softmax_into(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The softmax of ``x``'s rows written into ``y`` (``x`` itself when owned), shifted by
    the raw row max (Note [Softmax of odd rows])."""
    np.subtract(x, np.max(x, axis=-1, keepdims=True, initial=-np.inf), out=y)
    np.exp(y, out=y)
    return np.divide(y, np.sum(y, axis=-1, keepdims=True), out=y)


def softmax_forward(x: Any) -> np.ndarray:
    """``exp(x - max) / sum(exp(x - max))`` over the last axis.

    >>> softmax_forward(np.array([[0.0, np.log(3.0)], [1.0, -np.inf]]))
    array([[0.25, 0.75],
           [1.  , 0.  ]])
    """
    x = _floating(x, "softmax_forward")
    if x.ndim == 0:
        return softmax_forward(x.reshape(1)).reshape(())
    return _softmax_into(np.empty_like(x), x)


_VECDOT = getattr(np, "vecdot", None)  # numpy >= 2


def _row_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sum(a * b)`` of each row, kept as a (rows, 1) column: ``np.vecdot`` where numpy has
    it (one pass, no full-size temporary: a third of softmax's backward), else a product and
    a sum."""
    if _VECDOT is not None:
        return _VECDOT(a, b)[..., None]
    return np.sum(np.multiply(a, b), axis=-1, keepdims=True)


def softmax_backward(g: Any, y: Any) -> np.ndarray:
    """The gradient of softmax from its output ``y``: ``y * (g - sum(g * y))`` per row.

    >>> softmax_backward(np.array([[1.0, 0.0]]), np.array([[0.5, 0.5]]))
    array([[ 0.25, -0.25]])
    """
    g, y = np.asanyarray(g), np.asanyarray(y)
    _same_shape(g, y, "softmax_backward")
    if y.ndim == 0:
        return softmax_backward(g.reshape(1), y.reshape(1)).reshape(())
    dx = np.subtract(g, _row_dot(g, y))
    return np.multiply(dx, y, out=dx)


def log_softmax_forward(x: Any) -> np.ndarray:
    """``x - logsumexp(x)`` over the last axis (Note [Softmax of odd rows]).

    >>> log_softmax_forward(np.log([[1.0, 3.0]]))
    array([[-1.38629436, -0.28768207]])
    """
    x = _floating(x, "log_softmax_forward")
    if x.ndim == 0:
        return log_softmax_forward(x.reshape(1)).reshape(())
    m = _shift(x)
    y = np.subtract(x, m)
    np.exp(y, out=y)
    lse = np.sum(y, axis=-1, keepdims=True)
    np.log(lse, out=lse)
    lse += m
    return np.subtract(x, lse, out=y)


def log_softmax_backward(g: Any, y: Any) -> np.ndarray:
    """The gradient of log softmax from its output ``y``: ``g - exp(y) * sum(g)`` per row.

    >>> log_softmax_backward(np.array([[1.0, 1.0]]), np.log([[0.25, 0.75]]))
    array([[ 0.5, -0.5]])
    """
    g, y = np.asanyarray(g), np.asanyarray(y)
    _same_shape(g, y, "log_softmax_backward")
    if y.ndim == 0:
        return log_softmax_backward(g.reshape(1), y.reshape(1)).reshape(())
    dx = np.exp(y)
    np.multiply(dx, np.sum(g, axis=-1, keepdims=True), out=dx)
    return np.subtract(g, dx, out=dx)


def logsumexp_forward(x: Any) -> np.ndarray:
    """``log(sum(exp(x)))`` of each row (shape ``x.shape[:-1]``), shifted by the row max
    where finite (Note [Softmax of odd rows]).

    >>> logsumexp_forward(np.array([[1000.0, 1000.0], [10.0, 10.0]]))
    array([1000.69314718,   10.69314718])
    """
    x = _floating(x, "logsumexp_forward")
    if x.ndim == 0:
        return logsumexp_forward(x.reshape(1))
    m = _shift(x)
    e = np.subtract(x, m)
    np.exp(e, out=e)
    out = np.sum(e, axis=-1, keepdims=True)
    np.log(out, out=out)
    out += m
    return out[..., 0]


def logsumexp_backward(g: Any, x: Any, out: Any) -> np.ndarray:
    """The gradient of logsumexp: ``g * exp(x - out)``, with ``g`` and the forward's ``out``
    per row (they broadcast to ``x.shape[:-1]``).

    >>> logsumexp_backward(np.array([2.0]), np.log([[1.0, 3.0]]), np.log([4.0]))
    array([[0.5, 1.5]])
    """
    x = _floating(x, "logsumexp_backward")
    g, out = np.asanyarray(g), np.asanyarray(out)
    if x.ndim == 0:
        return logsumexp_backward(g, x.reshape(1), out).reshape(())
    dx = np.subtract(x, out[..., None])
    np.exp(dx, out=dx)
    return np.multiply(dx, g[..., None], out=dx)


@functools.lru_cache(maxsize=32)
def _above_diagonal(rows: int, cols: int) -> np.ndarray:
    """The entries a causal mask hides: column j > row i (read-only, one per shape)."""
    mask = np.triu(np.ones((rows, cols), bool), 1)
    mask.flags.writeable = False
    return mask


def _check_scores(s: Any, what: str) -> None:
    if s.ndim < 2:
        raise ValueError(f"{what}: scores need two axes (queries, keys), got shape {s.shape}")


def attention_softmax_forward(s: Any, scale: float, causal: bool) -> np.ndarray:
    """``softmax(where(mask, s * scale, -inf))`` over the last axis, ``mask`` the causal one
    over the last two axes (query i sees keys j <= i, as ``np.tril`` and PyTorch's
    ``is_causal`` count them; any number of keys) or everything when ``causal`` is false.

    >>> attention_softmax_forward(np.zeros((2, 2)), 0.5, True)
    array([[1. , 0. ],
           [0.5, 0.5]])
    """
    s = _floating(s, "attention_softmax_forward")
    _check_scores(s, "attention_softmax_forward")
    y = np.multiply(s, float(scale))  # a Python float: float32 scores stay float32
    if causal:
        np.copyto(y, -np.inf, where=_above_diagonal(*s.shape[-2:]))
    return _softmax_into(y, y)


def attention_softmax_backward(g: Any, y: Any, scale: float) -> np.ndarray:
    """The gradient of the attention path with respect to the scores: ``scale *
    softmax_backward(g, y)``; masked entries have ``y = 0``, so their gradient is 0.

    >>> attention_softmax_backward(np.array([[1.0, 0.0]]), np.array([[0.5, 0.5]]), 2.0)
    array([[ 0.5, -0.5]])
    """
    dx = softmax_backward(g, y)
    return np.multiply(dx, float(scale), out=dx)


REFERENCES: dict[str, Callable[..., Any]] = {
    "softmax_forward": softmax_forward,
    "softmax_backward": softmax_backward,
    "log_softmax_forward": log_softmax_forward,
    "log_softmax_backward": log_softmax_backward,
    "logsumexp_forward": logsumexp_forward,
    "logsumexp_backward": logsumexp_backward,
    "attention_softmax_forward": attention_softmax_forward,
    "attention_softmax_backward": attention_softmax_backward,
}


def _rows_cols(a: np.ndarray) -> tuple[int, int]:
    """(rows, cols) of ``a`` as the kernels see it: a 0-d array is one row of one."""
    return (math.prod(a.shape[:-1]), a.shape[-1]) if a.ndim else (1, 1)


def _contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` C-contiguous (a copy where it is not; a 0-d array stays 0-d)."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _per_row(a: np.ndarray, dtype: np.dtype, rows: tuple[int, ...]) -> bool:
    """Whether ``a`` is a plain array of ``dtype`` that broadcasts to the ``rows`` shape."""
    if type(a) is not np.ndarray or a.dtype != dtype:
        return False
    try:
        return np.broadcast_shapes(a.shape, rows) == rows
    except ValueError:
        return False


def load_host() -> dict[str, Callable[..., Any]]:
    """Compiled versions of ``REFERENCES`` on the host (softmax.c; Note [Host kernels] in
    kernels/_host.py) where the host kernels are built, else nothing (the references run).

    They take plain ndarrays of float32 or float64 (integers and bools as float64, as the
    references compute them), any layout (copied C-contiguous), the arrays of a call in one
    dtype; anything else (float16, subclasses, mixed dtypes, shapes that broadcast) goes to
    the reference. Results are the references' to float rounding (exp is host.h's, within
    1 ulp; sums add in lanes; softmax multiplies by 1 / sum where the reference divides),
    with the same entries NaN, infinite or 0 (Note [Softmax of odd rows]); a causal row's sum
    skips its masked columns rather than adding their zeros.
    """
    P, N, F, B = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_double, ctypes.c_int
    signatures = {  # every entry: (inputs..., rows, cols, [scalars...], out)
        "softmax_forward": [P, N, N, P],
        "softmax_backward": [P, P, N, N, P],
        "log_softmax_forward": [P, N, N, P],
        "log_softmax_backward": [P, P, N, N, P],
        "logsumexp_forward": [P, N, N, P],
        "logsumexp_backward": [P, P, P, N, N, P],
        "attention_softmax_forward": [P, N, N, F, B, N, P],
        "attention_softmax_backward": [P, P, N, N, F, P],
    }
    entries = _host.entries(signatures)
    if entries is None:
        return {}
    ptr = _host.pointer

    def take(x: np.ndarray) -> dict[str, Any] | None:
        """The compiled entries for ``x``, or None where the reference must run."""
        return entries.get(x.dtype) if type(x) is np.ndarray else None

    def pair(g: Any, y: Any) -> tuple[np.ndarray, np.ndarray, dict[str, Any] | None]:
        """(g, y, the entries where both are plain arrays of one dtype and shape, else None)."""
        g, y = np.asanyarray(g), np.asanyarray(y)
        fns = take(y)
        if fns is None or type(g) is not np.ndarray or g.dtype != y.dtype or g.shape != y.shape:
            return g, y, None
        return _contiguous(g), _contiguous(y), fns

    def rowwise(name: str, x: Any) -> np.ndarray:
        """The entry ``name`` of one full-size input and output (its reference for inputs it
        does not take)."""
        x = _floating(x, name)
        fns = take(x)
        if fns is None:
            return REFERENCES[name](x)
        x = _contiguous(x)
        y = np.empty(x.shape, x.dtype)
        fns[name](ptr(x), *_rows_cols(x), ptr(y))
        return y

    def rowwise_grad(name: str, g: Any, y: Any, *scale: float) -> np.ndarray:
        g, y, fns = pair(g, y)
        if fns is None:
            return REFERENCES[name](g, y, *scale)
        dx = np.empty(y.shape, y.dtype)
        fns[name](ptr(g), ptr(y), *_rows_cols(y), *scale, ptr(dx))
        return dx

    @functools.wraps(softmax_forward)
    def softmax_fwd(x):
        return rowwise("softmax_forward", x)

    @functools.wraps(softmax_backward)
    def softmax_bwd(g, y):
        return rowwise_grad("softmax_backward", g, y)

    @functools.wraps(log_softmax_forward)
    def log_softmax_fwd(x):
        return rowwise("log_softmax_forward", x)

    @functools.wraps(log_softmax_backward)
    def log_softmax_bwd(g, y):
        return rowwise_grad("log_softmax_backward", g, y)

    @functools.wraps(logsumexp_forward)
    def logsumexp_fwd(x):
        x = _floating(x, "logsumexp_forward")
        fns = take(x)
        if fns is None:
            return logsumexp_forward(x)
        x = _contiguous(x)
        out = np.empty(x.shape[:-1], x.dtype)
        fns["logsumexp_forward"](ptr(x), *_rows_cols(x), ptr(out))
        return out

    @functools.wraps(logsumexp_backward)
    def logsumexp_bwd(g, x, out):
        x = _floating(x, "logsumexp_backward")
        g, out = np.asanyarray(g), np.asanyarray(out)
        fns = take(x)
        rows = x.shape[:-1]
        if fns is None or not all(_per_row(a, x.dtype, rows) for a in (g, out)):
            return logsumexp_backward(g, x, out)
        g, out = (np.ascontiguousarray(np.broadcast_to(a, rows)).reshape(rows) for a in (g, out))
        x = _contiguous(x)
        dx = np.empty(x.shape, x.dtype)
        fns["logsumexp_backward"](ptr(g), ptr(x), ptr(out), *_rows_cols(x), ptr(dx))
        return dx

    @functools.wraps(attention_softmax_forward)
    def attention_fwd(s, scale, causal):
        s = _floating(s, "attention_softmax_forward")
        _check_scores(s, "attention_softmax_forward")
        fns = take(s)
        if fns is None:
            return attention_softmax_forward(s, scale, causal)
        s = _contiguous(s)
        y = np.empty(s.shape, s.dtype)
        rows, cols = _rows_cols(s)
        n_q = s.shape[-2] if causal else 1
        fns["attention_softmax_forward"](ptr(s), rows, cols, float(scale), bool(causal),
                                         max(n_q, 1), ptr(y))  # fmt: skip
        return y

    @functools.wraps(attention_softmax_backward)
    def attention_bwd(g, y, scale):
        return rowwise_grad("attention_softmax_backward", g, y, float(scale))

    return {
        "softmax_forward": softmax_fwd,
        "softmax_backward": softmax_bwd,
        "log_softmax_forward": log_softmax_fwd,
        "log_softmax_backward": log_softmax_bwd,
        "logsumexp_forward": logsumexp_fwd,
        "logsumexp_backward": logsumexp_bwd,
        "attention_softmax_forward": attention_fwd,
        "attention_softmax_backward": attention_bwd,
    }


def load(cupy: Any) -> dict[str, Callable[..., Any]]:
    """CuPy versions of ``REFERENCES`` (same names and signatures, on cupy arrays; float32 and
    float64, integers and bools computed in float64), built from softmax.cu. Needs a GPU.

    >>> import cupy  # doctest: +SKIP
    >>> y = load(cupy)["attention_softmax_forward"](scores, 0.125, True)  # doctest: +SKIP
    """
    module = _cuda.build(cupy, SOURCE)
    entries: dict[str, Any] = {}  # name -> kernel: a dict lookup per call, not CuPy's own

    def entry(name: str) -> Any:
        kernel = entries.get(name)
        if kernel is None:
            kernel = entries[name] = module.get_function(name)
        return kernel

    def floating(a: Any, what: str, dtype: Any = None) -> tuple[Any, str]:
        """(``a`` C-contiguous in the dtype it is computed in, or in ``dtype``; the kernel
        suffix of that dtype)."""
        a = cupy.asarray(a) if dtype is None else cupy.asarray(a, dtype)
        if a.dtype.kind == "c":
            raise TypeError(f"{what}: complex input is not supported")
        if a.dtype.kind != "f":
            a = cupy.asarray(a, np.float64)
        c = cupy.ascontiguousarray(a)
        if c.ndim != a.ndim:  # CuPy's ascontiguousarray makes a 0-d array 1-d
            c = c.reshape(a.shape)
        return c, _cuda.suffix(a.dtype, what)

    def launch(name: str, sfx: str, like: Any, args: tuple, out: Any) -> Any:
        """Entry ``name`` over the rows of ``like`` (a 0-d array: one row of one), called as
        every entry of softmax.cu is: ``(*args, rows, cols, out)``; returns ``out``."""
        rows, cols = (math.prod(like.shape[:-1]), like.shape[-1]) if like.ndim else (1, 1)
        if not rows:
            return out
        if cols <= WARP_COLS:  # Note [Warp rows] in softmax.cu: a warp per row
            per = next(p for p in WARP_PER if cols <= 32 * p)
            kernel = entry(f"{name}_w{per}_{sfx}" if name in _WARP else f"{name}_{sfx}")
            threads, grid = WARP_THREADS, -(-rows // (WARP_THREADS // 32))
        else:  # a block per row, as large as the kernel's registers allow
            kernel = entry(f"{name}_{sfx}")
            cap = getattr(kernel, "max_threads_per_block", 1024) // 32 * 32
            threads, grid = min(_cuda.row_threads(cols), cap), rows
        args = (*args, np.int64(rows), np.int64(cols), out)
        kernel((min(grid, _cuda.MAX_BLOCKS),), (threads,), args)
        return out

    def per_row(a: Any, x: Any) -> Any:
        """A per-row argument of ``x`` (broadcast to its rows), contiguous, in its dtype."""
        return cupy.ascontiguousarray(cupy.broadcast_to(cupy.asarray(a, x.dtype), x.shape[:-1]))

    def softmax_rows(s: Any, scale: float, causal: bool, what: str) -> Any:
        x, sfx = floating(s, what)
        n_q = np.int64(x.shape[-2] if causal else 1)
        args = (x, x.dtype.type(scale), np.int32(bool(causal)), n_q)
        return launch("softmax_forward", sfx, x, args, cupy.empty_like(x))

    def softmax_grad(g: Any, y: Any, scale: float, what: str) -> Any:
        y, sfx = floating(y, what)
        g, _ = floating(g, what, y.dtype)
        _same_shape(g, y, what)
        return launch("softmax_backward", sfx, y, (g, y, y.dtype.type(scale)), cupy.empty_like(y))

    @functools.wraps(softmax_forward)
    def softmax_fwd(x):
        return softmax_rows(x, 1.0, False, "softmax_forward")

    @functools.wraps(softmax_backward)
    def softmax_bwd(g, y):
        return softmax_grad(g, y, 1.0, "softmax_backward")

    @functools.wraps(log_softmax_forward)
    def log_softmax_fwd(x):
        x, sfx = floating(x, "log_softmax_forward")
        return launch("log_softmax_forward", sfx, x, (x,), cupy.empty_like(x))

    @functools.wraps(log_softmax_backward)
    def log_softmax_bwd(g, y):
        y, sfx = floating(y, "log_softmax_backward")
        g, _ = floating(g, "log_softmax_backward", y.dtype)
        _same_shape(g, y, "log_softmax_backward")
        return launch("log_softmax_backward", sfx, y, (g, y), cupy.empty_like(y))

    @functools.wraps(logsumexp_forward)
    def logsumexp_fwd(x):
        x, sfx = floating(x, "logsumexp_forward")
        return launch("logsumexp_forward", sfx, x, (x,), cupy.empty(x.shape[:-1], x.dtype))

    @functools.wraps(logsumexp_backward)
    def logsumexp_bwd(g, x, out):
        x, sfx = floating(x, "logsumexp_backward")
        args = (per_row(g, x), x, per_row(out, x))
        return launch("logsumexp_backward", sfx, x, args, cupy.empty_like(x))

    @functools.wraps(attention_softmax_forward)
    def attention_fwd(s, scale, causal):
        s = cupy.asarray(s)
        _check_scores(s, "attention_softmax_forward")
        return softmax_rows(s, float(scale), causal, "attention_softmax_forward")

    @functools.wraps(attention_softmax_backward)
    def attention_bwd(g, y, scale):
        return softmax_grad(g, y, float(scale), "attention_softmax_backward")

    return {
        "softmax_forward": softmax_fwd,
        "softmax_backward": softmax_bwd,
        "log_softmax_forward": log_softmax_fwd,
        "log_softmax_backward": log_softmax_bwd,
        "logsumexp_forward": logsumexp_fwd,
        "logsumexp_backward": logsumexp_bwd,
        "attention_softmax_forward": attention_fwd,
        "attention_softmax_backward": attention_bwd,
    }
