"""Activations and their gradients, elementwise: numpy references and the CuPy loader of
kernels/activations.cu.

The forwards compute what disttensor's composites computed (``_composite`` below, the
contract, to float rounding): GELU's tanh approximation ``0.5 x (1 + tanh(c (x + 0.044715
x^3)))`` with ``c = sqrt(2 / pi)``, ``silu(x) = x sigmoid(x)`` and ``sigmoid(x) = 1 / (1 +
exp(-x))``. The backwards take the output's gradient ``g`` and what the derivative is written
in: the input ``x`` (gelu, silu, relu) or the output ``y`` (sigmoid, tanh), and return
``g * f'``; ``relu_backward`` selects ``g`` where ``x > 0`` and 0 elsewhere (NaN and infinite
gradients of inactive units too), the bits of ``np.where(x > 0, g, 0)``.

>>> x = np.array([-1.0, 0.0, 2.0])
>>> gelu_forward(x).round(6)
array([-0.158808,  0.      ,  1.954598])
>>> sigmoid_forward(np.array([-1e4, 0.0, 1e4]))  # no overflow
array([0. , 0.5, 1. ])
>>> relu_backward(np.array([np.nan, 1.0, 2.0]), x)
array([0., 0., 2.])
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _cuda

SOURCE = "activations.cu"

# Note [Fused activations]
#     A composite activation is one numpy call per operation, each allocating its result;
#     ``x**3`` on float32 data with negative entries is numpy's general power (about 50 times
#     ``x * x * x``). The references run the same arithmetic in place: the output array, plus
#     the fewest scratch arrays the expression needs, written with ``out=``; the constants are
#     Python floats, which NEP 50 rounds to the array's dtype, so float32 computes in float32
#     (tests/precision.py checks it) and float64 in float64. The CUDA kernels are one launch
#     each, reading each input and writing the output once (16 bytes a thread at a time where
#     the arrays are aligned: activations.cu).
#
#     The fast route takes float32 or float64 inputs, and for a gradient ``g`` of the same
#     shape and dtype as the other input (what autograd passes). Anything else (integer or
#     float16 inputs, a broadcasting or promoting ``g``) runs ``_composite``, the former
#     expression, so the result is numpy's as before.
#
#     sigmoid is ``1 / (1 + exp(-x))``: exp(-x) overflows to inf for very negative x and the
#     quotient is then the correct 0, so only the overflow warning is silenced; the former
#     ``exp(-|x|)`` with a select costs two more arrays and a slow ``where``. Accurate to a few
#     ulps on both sides (no ``1 - s`` cancellation), as the former one.

_C = math.sqrt(2 / math.pi)  # GELU's c; Python floats round to the array's dtype (NEP 50)
_A = 0.044715
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
# relu_backward selects by bits: g's elements viewed as integers of its width
_BITS = {np.dtype(np.float32): np.dtype(np.int32), np.dtype(np.float64): np.dtype(np.int64)}


# -- the former composites: the contract, and the route of the inputs the fast one does not take
def _sigmoid(x: Any, xp: Any = np) -> Any:
    # exp of a non-positive number only: no overflow for large |x|
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(xp.result_type(x, 1.0), copy=False)


def _gelu(x: Any, xp: Any = np) -> Any:
    c = np.sqrt(2 / np.pi).astype(xp.result_type(x, 1.0))  # a host scalar
    return 0.5 * x * (1 + xp.tanh(c * (x + 0.044715 * x**3)))


def _gelu_grad(g: Any, x: Any, xp: Any = np) -> Any:
    t = xp.tanh(_C * (x + 0.044715 * x * x * x))
    return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 0.134145 * x * x))


def _silu_grad(g: Any, x: Any, xp: Any = np) -> Any:
    s = _sigmoid(x, xp)
    return g * (s * (1 + x * (1 - s)))


_composite: dict[str, Callable[..., Any]] = {
    "gelu_forward": _gelu,
    "gelu_backward": _gelu_grad,
    "silu_forward": lambda x, xp=np: x * _sigmoid(x, xp),
    "silu_backward": _silu_grad,
    "sigmoid_forward": _sigmoid,
    "sigmoid_backward": lambda g, y, xp=np: g * (y * (1 - y)),
    "tanh_backward": lambda g, y, xp=np: g * (1 - y * y),
    "relu_backward": lambda g, x, xp=np: xp.where(x > 0, g, 0),
}


def _fused(g: Any, x: np.ndarray) -> bool:
    """Whether a gradient takes the fast route (Note [Fused activations])."""
    return (
        isinstance(g, np.ndarray) and g.dtype is x.dtype and x.dtype in _FLOATS
        and g.shape == x.shape
    )  # fmt: skip


# -- forwards -------------------------------------------------------------------------------------
def gelu_forward(x: Any) -> np.ndarray:
    """``0.5 x (1 + tanh(c (x + 0.044715 x^3)))``, ``c = sqrt(2 / pi)``, in one array.

    >>> gelu_forward(np.float32([1.0])).dtype
    dtype('float32')
    """
    x = np.asanyarray(x)
    if x.dtype not in _FLOATS:
        return _gelu(x)
    if not x.ndim:  # a ufunc gives a 0-d result back as a scalar: run on one element
        return gelu_forward(x.reshape(1)).reshape(())
    out = np.multiply(x, x)
    out *= _A * _C
    out += _C
    out *= x  # c (x + 0.044715 x^3)
    np.tanh(out, out=out)
    out += 1.0
    out *= x
    out *= 0.5
    return out


def silu_forward(x: Any) -> np.ndarray:
    """``x sigmoid(x) = x / (1 + exp(-x))``, in one array.

    >>> silu_forward(np.array([-1e4, 0.0, 1e4]))
    array([   -0.,     0., 10000.])
    """
    x = np.asanyarray(x)
    if x.dtype not in _FLOATS:
        return _composite["silu_forward"](x)
    if not x.ndim:
        return silu_forward(x.reshape(1)).reshape(())
    out = np.negative(x)
    with np.errstate(over="ignore"):  # exp(-x) = inf for very negative x: x / inf = -0
        np.exp(out, out=out)
    out += 1.0
    return np.divide(x, out, out=out)


def sigmoid_forward(x: Any) -> np.ndarray:
    """``1 / (1 + exp(-x))``, in one array, without overflow warnings (Note [Fused
    activations]).

    >>> sigmoid_forward(np.float32([-200.0, 200.0]))
    array([0., 1.], dtype=float32)
    """
    x = np.asanyarray(x)
    if x.dtype not in _FLOATS:
        return _sigmoid(x)
    if not x.ndim:
        return sigmoid_forward(x.reshape(1)).reshape(())
    out = np.negative(x)
    with np.errstate(over="ignore"):  # exp(-x) = inf for very negative x: 1 / inf = 0
        np.exp(out, out=out)
    out += 1.0
    return np.divide(1.0, out, out=out)


# -- backwards ------------------------------------------------------------------------------------
def gelu_backward(g: Any, x: Any) -> np.ndarray:
    """``g * gelu'(x)``; with ``t = tanh(c (x + 0.044715 x^3))``, ``gelu'(x) = 0.5 (1 + t) +
    0.5 c x (1 - t^2) (1 + 0.134145 x^2)``, computed as ``(1 + t) (0.5 + x (1 - t) q)``, ``q =
    0.5 c (1 + 0.134145 x^2)``: no ``1 - t^2`` cancellation, and ``x (1 - t)`` first, so it is
    0, not inf * 0, where t rounds to 1. Three arrays: the output and two scratch.

    >>> gelu_backward(np.ones(3), np.array([-10.0, 0.0, 10.0]))
    array([-0. ,  0.5,  1. ])
    """
    x = np.asanyarray(x)
    if not _fused(g, x):
        return _gelu_grad(g, x)
    if not x.ndim:
        return gelu_backward(g.reshape(1), x.reshape(1)).reshape(())
    q = np.multiply(x, x)
    t = np.multiply(q, _A * _C)
    t += _C
    t *= x
    np.tanh(t, out=t)
    q *= 1.5 * _A * _C
    q += 0.5 * _C
    out = np.subtract(1.0, t)
    out *= x
    out *= q
    out += 0.5
    t += 1.0
    out *= t
    out *= g
    return out


def silu_backward(g: Any, x: Any) -> np.ndarray:
    """``g * silu'(x) = g s (1 + x (1 - s))``, ``s = sigmoid(x)``.

    >>> silu_backward(np.ones(3), np.array([-1e4, 0.0, 1e4]))
    array([-0. ,  0.5,  1. ])
    """
    x = np.asanyarray(x)
    if not _fused(g, x):
        return _silu_grad(g, x)
    if not x.ndim:
        return silu_backward(g.reshape(1), x.reshape(1)).reshape(())
    s = sigmoid_forward(x)
    out = np.subtract(1.0, s)
    out *= x
    out += 1.0
    out *= s
    out *= g
    return out


def sigmoid_backward(g: Any, y: Any) -> np.ndarray:
    """``g * (y * (1 - y))`` from the forward's output ``y``: the former composite's
    operations in its order, so its bits.

    >>> sigmoid_backward(np.array([2.0]), np.array([0.5]))
    array([0.5])
    """
    y = np.asanyarray(y)
    if not _fused(g, y):
        return _composite["sigmoid_backward"](g, y)
    if not y.ndim:
        return sigmoid_backward(g.reshape(1), y.reshape(1)).reshape(())
    out = np.subtract(1.0, y)
    out *= y
    out *= g
    return out


def tanh_backward(g: Any, y: Any) -> np.ndarray:
    """``g * (1 - y * y)`` from the forward's output ``y``: the former composite's operations
    in its order, so its bits.

    >>> tanh_backward(np.array([2.0]), np.array([0.5]))
    array([1.5])
    """
    y = np.asanyarray(y)
    if not _fused(g, y):
        return _composite["tanh_backward"](g, y)
    if not y.ndim:
        return tanh_backward(g.reshape(1), y.reshape(1)).reshape(())
    out = np.multiply(y, y)
    np.subtract(1.0, out, out=out)
    out *= g
    return out


def relu_backward(g: Any, x: Any) -> np.ndarray:
    """``np.where(x > 0, g, 0)``, bit for bit.

    >>> relu_backward(np.array([-1.0, 3.0]), np.array([0.0, 1.0]))
    array([0., 3.])
    """
    x = np.asanyarray(x)
    if not _fused(g, x):
        return _composite["relu_backward"](g, x)
    if not x.ndim:
        return relu_backward(g.reshape(1), x.reshape(1)).reshape(())
    # np.where with a data-dependent mask runs about three times slower than these passes:
    # g's bits ANDed with all-ones where x > 0 and with zeros (+0.0) elsewhere
    bits = _BITS[g.dtype]
    mask = np.greater(x, 0.0).astype(bits)
    np.negative(mask, out=mask)  # True -> -1: every bit set
    out = np.empty_like(g)
    np.bitwise_and(g.view(bits), mask, out=out.view(bits))
    return out


REFERENCES: dict[str, Callable[..., Any]] = {
    "gelu_forward": gelu_forward,
    "gelu_backward": gelu_backward,
    "silu_forward": silu_forward,
    "silu_backward": silu_backward,
    "sigmoid_forward": sigmoid_forward,
    "sigmoid_backward": sigmoid_backward,
    "tanh_backward": tanh_backward,
    "relu_backward": relu_backward,
}


def load(cupy: Any) -> dict[str, Callable[..., Any]]:
    """CuPy versions of ``REFERENCES`` (same names and signatures), built from
    activations.cu: one launch each on float32 or float64 arrays (strided ones are copied
    first); the inputs the references give to their composite run it with ``cupy``. Needs a
    GPU.

    >>> import cupy  # doctest: +SKIP
    >>> y = load(cupy)["gelu_forward"](x)  # doctest: +SKIP
    """
    module = _cuda.build(cupy, SOURCE)

    def launch(name: str, *inputs: Any) -> Any:
        """The kernel on ``inputs`` (of one shape and dtype, the last one's), flat."""
        last = inputs[-1]
        out = cupy.empty(last.shape, last.dtype)
        n = last.size
        if n:  # ascontiguousarray: the array itself where it is contiguous (0-d ones: 1-d)
            arrays = [cupy.ascontiguousarray(a) for a in inputs]
            entry = module.get_function(f"{name}_{_cuda.suffix(last.dtype, name)}")
            packs = -(-n // (16 // last.dtype.itemsize))  # 16-byte accesses (activations.cu)
            entry((_cuda.blocks(packs),), (_cuda.THREADS,), (*arrays, np.int64(n), out))
        return out

    def unary(name: str) -> Callable[[Any], Any]:
        composite = _composite[name]

        @functools.wraps(REFERENCES[name])
        def forward(x):
            x = cupy.asarray(x)
            return launch(name, x) if x.dtype in _FLOATS else composite(x, cupy)

        return forward

    def fused(g: Any, a: Any) -> bool:
        return (
            isinstance(g, cupy.ndarray) and g.shape == a.shape and g.dtype == a.dtype
            and a.dtype in _FLOATS
        )  # fmt: skip

    def of_input(name: str) -> Callable[[Any, Any], Any]:
        composite = _composite[name]

        @functools.wraps(REFERENCES[name])
        def backward(g, x):
            x = cupy.asarray(x)
            return launch(name, g, x) if fused(g, x) else composite(g, x, cupy)

        return backward

    def of_output(name: str) -> Callable[[Any, Any], Any]:
        composite = _composite[name]

        @functools.wraps(REFERENCES[name])
        def backward(g, y):
            y = cupy.asarray(y)
            return launch(name, g, y) if fused(g, y) else composite(g, y, cupy)

        return backward

    fns = {name: unary(name) for name in ("gelu_forward", "silu_forward", "sigmoid_forward")}
    fns.update({n: of_input(n) for n in ("gelu_backward", "silu_backward", "relu_backward")})
    fns.update({n: of_output(n) for n in ("sigmoid_backward", "tanh_backward")})
    return fns
