"""matmul, dot, einsum, outer, linear: rules are einsum equations (spmd/rules.py).

>>> import numpy as np, disttensor as dt
>>> mesh = dt.ProcessMesh([0])
>>> a = dt.shard_tensor(np.eye(2), mesh, [dt.Shard(1)])
>>> (a @ np.ones((2, 3))).shape
(2, 3)
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..dispatch import Op, with_xp
from ..tensor import DistTensor


def _shape(a) -> tuple[int, ...]:
    return a.shape if isinstance(a, DistTensor) else np.shape(a)


def _matmul(x, y, trans_x=False, trans_y=False, xp=np):
    """``xp``: the array module (a device's: Note [Array backends] in backend.py)."""
    if trans_x and x.ndim >= 2:
        x = x.swapaxes(-1, -2)  # the method: np.swapaxes' Python wrapper costs a microsecond
    if trans_y and y.ndim >= 2:
        y = y.swapaxes(-1, -2)
    if xp is np and 0 < x.ndim <= 2 and 0 < y.ndim <= 2 and x.dtype == y.dtype in _BLAS:
        return np.dot(x, y)  # matmul's BLAS call (_by_dot)
    return xp.matmul(x, y)


_BLAS = frozenset(np.dtype(c) for c in "fdFD")


def _by_dot(x, y) -> Any:
    """What ``_matmul(x, y)`` calls on host arrays like ``x`` and ``y`` (anything with their
    ``ndim`` and ``dtype``): ``np.dot`` for vectors and matrices of one BLAS dtype (the BLAS
    call matmul makes for them, without a generalized ufunc's dispatch around it: 0.25 us
    less per call, a third of a small dot product's), else ``np.matmul``. A compiled step
    calls it (the kernel's ``plain``: capture.py)."""
    if 0 < x.ndim <= 2 and 0 < y.ndim <= 2 and x.dtype == y.dtype in _BLAS:
        return np.dot
    return np.matmul


_matmul.plain = _by_dot  # what it calls with no keyword arguments (a compiled step calls it)


def _linear(x, w, b, xp=np):
    out = xp.matmul(x, w)
    if b.dtype == out.dtype:  # added in place into matmul's fresh result: one pass, no copy
        out += b
        return out
    return out + b  # numpy's promotion, as x @ w + b


_MATMUL = Op("matmul", _matmul, rule="matmul", device=with_xp(_matmul))
_LINEAR = Op("linear", _linear, rule="linear", device=with_xp(_linear))
_DOT = Op("dot", np.dot, rule="dot", device="dot")


@functools.lru_cache(maxsize=1024)
def _einsum_path(equation: str, shapes: tuple[tuple[int, ...], ...]) -> list:
    """numpy's contraction order for ``equation`` on operands of ``shapes`` (found once)."""
    stand_ins = [np.broadcast_to(np.empty((), np.float32), s) for s in shapes]
    return np.einsum_path(equation, *stand_ins, optimize="greedy")[0]


def _einsum(*ops, equation):
    """``np.einsum`` along a contraction path, so pairs of operands contract with BLAS
    (tensordot) instead of einsum's own loops: a linear's weight gradient over (batch, time)
    rows takes a tenth of the time. The path is worked out once per equation and shapes."""
    if len(ops) < 2:
        return np.einsum(equation, *ops)
    return np.einsum(equation, *ops, optimize=_einsum_path(equation, tuple(o.shape for o in ops)))


_EINSUM = Op(
    "einsum",
    _einsum,
    rule="einsum",
    # the same contraction order on a device (optimize=True finds numpy's greedy path)
    device=lambda be: lambda *ops, equation: be.xp.einsum(equation, *ops, optimize=len(ops) > 1),
)
_OUTER = Op("outer", np.outer, rule="outer", device="outer")
OPS = {op.name: op for op in (_MATMUL, _DOT, _EINSUM, _OUTER, _LINEAR)}


def matmul(x, y, trans_x: bool = False, trans_y: bool = False):
    """``np.matmul(x, y)``; ``trans_x``/``trans_y`` use the transpose of the last two axes."""
    if trans_x or trans_y:
        return _MATMUL(x, y, trans_x=bool(trans_x), trans_y=bool(trans_y))
    return _MATMUL(x, y)


def linear(x, weight, bias=None):
    """``x @ weight + bias`` as one op (weight (in, out), as ``dt.nn.Linear`` holds it; bias
    (out,)): one kernel and one autograd node instead of two. Other shapes compute the same
    expression with numpy's broadcasting.

    >>> import numpy as np, disttensor as dt
    >>> mesh = dt.ProcessMesh([0])
    >>> w = dt.shard_tensor(np.eye(2), mesh, [dt.Shard(1)])
    >>> dt.linear(np.ones((3, 2)), w, np.array([10.0, 20.0])).numpy()
    array([[11., 21.],
           [11., 21.],
           [11., 21.]])
    """
    if bias is None:
        return _MATMUL(x, weight)
    sw = _shape(weight)
    if len(sw) != 2 or _shape(bias) != sw[1:] or not _shape(x):
        return _MATMUL(x, weight) + bias
    return _LINEAR(x, weight, bias)


def dot(x, y):
    """``np.dot(x, y)``."""
    return _DOT(x, y)


def einsum(equation: str, *operands):
    """``np.einsum(equation, *operands)``; the SPMD rule is derived from the equation."""
    if not isinstance(equation, str):
        raise TypeError("einsum: give the equation as a string first, e.g. 'ij,jk->ik'")
    return _EINSUM(*operands, equation=equation)


def outer(x, y):
    """``np.outer(x, y)``."""
    return _OUTER(x, y)


def vecdot(x1, x2, /, **kwargs):
    """``np.vecdot(x1, x2)``: sum(conj(x1) * x2) over the last axis, batch axes broadcast;
    numpy's ufunc protocol runs it (dt.einsum on DistTensors: ops/numpy_interop.py)."""
    return np.vecdot(x1, x2, **kwargs)


def matvec(x1, x2, /, **kwargs):
    """``np.matvec(x1, x2)``: (..., m, n) matrices times (..., n) vectors (as ``vecdot``)."""
    return np.matvec(x1, x2, **kwargs)


def vecmat(x1, x2, /, **kwargs):
    """``np.vecmat(x1, x2)``: conj of (..., n) vectors times (..., n, m) matrices (as
    ``vecdot``)."""
    return np.vecmat(x1, x2, **kwargs)


__all__ = ["dot", "einsum", "linear", "matmul", "matvec", "outer", "vecdot", "vecmat"]
