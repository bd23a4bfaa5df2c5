"""Fused Adam / AdamW update: the numpy reference and the CuPy loader of kernels/adam.cu.

Note [Adam bit for bit]
    disttensor's optimizer (disttensor/optim/optimizer.py, Adam.update) updates a shard with
    a sequence of numpy operations on arrays of the parameter's dtype T and Python floats.
    numpy rounds each Python float to T where it meets a T array, then rounds each operation
    in T. ``adam_update`` performs the same operations in the same order on the same
    T-rounded coefficients (``coefficients``), on blocks of the flat arrays (the update is
    elementwise, so blocking changes memory traffic, not values), and adam.cu performs them
    per element with round-to-nearest intrinsics that are never fused into multiply-adds.
    So the optimizer, the reference and the kernel agree bit for bit in float32 and float64.

>>> w, g = np.ones(3), np.array([0.5, -2.0, 0.0])
>>> m, v = np.zeros(3), np.zeros(3)
>>> adam_update(w, g, m, v, step=1, lr=0.1)
>>> w.round(6)  # the first step moves each weight by about lr against its gradient's sign
array([0.9, 1.1, 1. ])
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from . import _cuda

SOURCE = "adam.cu"
BLOCK = 1 << 15  # elements per block of the reference: its temporaries stay in cache

# the kernel's DecayMode (adam.cu)
NO_DECAY, L2_DECAY, DECOUPLED_DECAY = 0, 1, 2


class Coefficients(NamedTuple):
    """The update's scalars, each rounded once to the parameter's dtype (adam.cu's order)."""

    beta1: np.floating
    one_minus_beta1: np.floating
    beta2: np.floating
    one_minus_beta2: np.floating
    step_size: np.floating  # lr / (1 - beta1**step)
    bias_correction2: np.floating  # 1 - beta2**step
    eps: np.floating
    weight_decay: np.floating
    decay: np.floating  # 1 - lr * weight_decay, the decoupled factor
    mode: int


def coefficients(
    dtype: Any,
    *,
    step: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> Coefficients:
    """The scalars of step ``step`` (from 1), computed in double from Python floats as the
    optimizer computes them, then rounded to ``dtype`` as numpy rounds a Python operand.
    Its keywords are the update's hyper-parameters, for the reference and the kernel alike.

    >>> coefficients(np.float32, step=1, lr=0.1, weight_decay=0.01, decoupled=True).mode
    2
    """
    if int(step) != step or step < 1:
        raise ValueError(f"adam_update: step counts from 1, got {step!r}")
    to = np.dtype(dtype).type
    lr, beta1, beta2, wd = float(lr), float(beta1), float(beta2), float(weight_decay)
    mode = (DECOUPLED_DECAY if decoupled else L2_DECAY) if wd else NO_DECAY
    return Coefficients(
        to(beta1),
        to(1 - beta1),
        to(beta2),
        to(1 - beta2),
        to(lr / (1 - beta1**step)),
        to(1 - beta2**step),
        to(float(eps)),
        to(wd),
        to(1 - lr * wd),
        mode,
    )


def _check(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any) -> None:
    """Same shape and one floating dtype for all four (the optimizer casts the gradient)."""
    arrays = {"grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if np.dtype(param.dtype).kind != "f":
        raise TypeError(f"adam_update: param must be floating, got {param.dtype}")
    for name, a in arrays.items():
        if a.shape != param.shape or a.dtype != param.dtype:
            raise ValueError(
                f"adam_update: {name} must have param's shape {param.shape} and dtype "
                f"{param.dtype}, got {a.shape} {a.dtype}"
            )


def _blocks(arrays: tuple[np.ndarray, ...]) -> Iterator[tuple[np.ndarray, ...]]:
    """Views of ``BLOCK`` elements of the flat arrays; the whole arrays when one is strided."""
    if not all(a.flags.c_contiguous for a in arrays):
        yield arrays
        return
    flat = [a.reshape(-1) for a in arrays]
    for start in range(0, flat[0].size, BLOCK):
        yield tuple(f[start : start + BLOCK] for f in flat)


def adam_update(
    param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, **hyper: Any
) -> None:
    """Adam step of ``param`` in place, moments updated in place. ``hyper`` are the keywords
    of ``coefficients``: ``step`` (from 1), ``lr``, ``beta1=0.9``, ``beta2=0.999``,
    ``eps=1e-8``, ``weight_decay=0.0``, added to the gradient (L2) or, with
    ``decoupled=True``, scaling the weight (AdamW). Bit for bit disttensor's optimizer:
    Note [Adam bit for bit].

    >>> w, m, v = np.zeros(2, np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32)
    >>> adam_update(w, np.ones(2, np.float32), m, v, step=1, lr=0.5)
    >>> w, m
    (array([-0.5, -0.5], dtype=float32), array([0.1, 0.1], dtype=float32))
    """
    _check(param, grad, exp_avg, exp_avg_sq)
    c = coefficients(param.dtype, **hyper)
    # the expression's temporaries written into three block-sized buffers, made once per
    # call: the same operations in the same order, so the same bits
    arrays = (param, grad, exp_avg, exp_avg_sq)
    k = min(param.size, BLOCK) if all(a.flags.c_contiguous for a in arrays) else None
    bufs = [np.empty(k or param.shape, param.dtype) for _ in range(3)]
    for w, g, m, v in _blocks(arrays):
        t1, t2, t3 = (b[: w.size] if k else b for b in bufs)
        if c.mode == L2_DECAY:
            g = np.add(g, np.multiply(c.weight_decay, w, out=t3), out=t3)
        m *= c.beta1
        m += np.multiply(c.one_minus_beta1, g, out=t1)
        v *= c.beta2
        v += np.multiply(c.one_minus_beta2, np.multiply(g, g, out=t1), out=t1)
        if c.mode == DECOUPLED_DECAY:
            w *= c.decay
        denom = np.add(np.sqrt(np.divide(v, c.bias_correction2, out=t1), out=t1), c.eps, out=t1)
        w -= np.divide(np.multiply(c.step_size, m, out=t2), denom, out=t2)


REFERENCES: dict[str, Callable[..., Any]] = {"adam_update": adam_update}


def load(cupy: Any) -> dict[str, Callable[..., Any]]:
    """CuPy versions of ``REFERENCES`` (same names and signatures, on C-contiguous cupy
    arrays of float32 or float64), built from adam.cu. Needs a GPU.

    >>> import cupy  # doctest: +SKIP
    >>> load(cupy)["adam_update"](w, g, m, v, step=1, lr=1e-3)  # doctest: +SKIP
    """
    module = _cuda.build(cupy, SOURCE)

    @functools.wraps(adam_update)
    def adam_update_cuda(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, **hyper: Any):
        _check(param, grad, exp_avg, exp_avg_sq)
        arrays = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        _cuda.contiguous(cupy, "adam_update", **arrays)
        kernel = module.get_function("adam_update_" + _cuda.suffix(param.dtype, "adam_update"))
        c = coefficients(param.dtype, **hyper)
        n = param.size
        if n:
            args = (param, grad, exp_avg, exp_avg_sq, np.int64(n), *c[:-1], np.int32(c.mode))
            kernel((_cuda.blocks(n),), (_cuda.THREADS,), args)

    return {"adam_update": adam_update_cuda}
