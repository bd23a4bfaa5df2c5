"""Reductions with numpy's ``axis`` (int, tuple, None) and ``keepdims``.

A reduction over a sharded axis gives a Partial result with no communication (sum: sum, mean:
avg, max/any: max, min/all: min); prod/argmax/argmin need the axis whole. var and std are
written with the primitives, so they work on every placement. softmax, log_softmax and
logsumexp are one fused op each (kernels/softmax.py) where their axes are whole, and the
composite of the primitives where a mesh dim splits them.

>>> import numpy as np, disttensor as dt
>>> mesh = dt.ProcessMesh([0])
>>> x = dt.shard_tensor(np.arange(6.0).reshape(2, 3), mesh, [dt.Shard(1)])
>>> x.sum(axis=1).to_local(), dt.softmax(x, axis=-1).numpy().sum(axis=-1)
(array([ 3., 12.]), array([1., 1.]))
"""

from __future__ import annotations

import builtins
import math
from functools import partial

import numpy as np

from .. import backend
from ..dispatch import KernelContext, Op, host_method
from ..tensor import DistTensor, reshard
from .elementwise import OPS as EW


def _axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in axes:
        if not -ndim <= a < builtins.max(ndim, 1):
            raise np.exceptions.AxisError(a, ndim)
        out.append(a % ndim if ndim else a)
    return tuple(out)


def _split_reduced(ctx: KernelContext | None, axes) -> int:
    """Product of the mesh dims that split a reduced axis (each makes the result Partial)."""
    if ctx is None:  # plain numpy inputs
        return 1
    spec = ctx.inputs[0]
    return math.prod(
        spec.mesh.shape[m] for m, p in enumerate(spec.placements) if p.is_shard() and p.dim in axes
    )


def _mean(x, axis=None, keepdims=False, *, ctx: KernelContext | None, xp=None):
    """``xp``: a device's array module (None: numpy, through ``np.add.reduce``)."""
    axes = _axes(axis, x.ndim)
    shape = x.shape if ctx is None else ctx.inputs[0].shape
    count = math.prod([shape[a] for a in axes])
    acc = np.float64 if x.dtype.kind in "biu" else None
    if xp is None:
        total = np.add.reduce(x, axis=axes, dtype=acc, keepdims=keepdims)
    else:
        total = xp.sum(x, axis=axes, dtype=acc, keepdims=keepdims)
    # Partial(avg) over k ranks: each holds k * (its sum) / count, so their average is the mean
    # exactly, with uneven shards too. (The operator: np.true_divide on a numpy scalar costs
    # a microsecond more.)
    return total / (count / _split_reduced(ctx, axes)) if count else total / count


def _extreme(ufunc, fill):
    def kernel(x, axis=None, keepdims=False, *, ctx: KernelContext | None):
        axes = _axes(axis, x.ndim)
        if _split_reduced(ctx, axes) > 1:  # a shard may be empty: reduce from the identity
            return ufunc.reduce(x, axis=axes, keepdims=keepdims, initial=fill(x.dtype))
        return ufunc.reduce(x, axis=axes, keepdims=keepdims)

    return kernel


def _extreme_device(name: str, fill):
    """``_extreme`` on a device: ``xp.max``/``xp.min``, which take no ``initial``: an empty
    reduced region gives the identity (the only case where ``initial`` changes the result)."""

    def factory(be):
        reduce = getattr(be.xp, name)

        def kernel(x, axis=None, keepdims=False, *, ctx: KernelContext | None):
            axes = _axes(axis, x.ndim)
            if builtins.any(x.shape[a] == 0 for a in axes) and _split_reduced(ctx, axes) > 1:
                kept = [1 if a in axes else n for a, n in enumerate(x.shape)]
                shape = kept if keepdims else [n for a, n in enumerate(x.shape) if a not in axes]
                return be.xp.full(tuple(shape), fill(x.dtype), x.dtype)
            return reduce(x, axis=axes, keepdims=keepdims)

        return kernel

    return factory


def _whole(name: str) -> Op:
    """A reduction the rule gives whole axes (prod, all, any, argmax, argmin): numpy's
    function of that name on the host, the array module's on a device."""
    kernel = host_method(name)

    def device(be):
        g = getattr(be.xp, name)
        return lambda x, axis=None, keepdims=False: g(x, axis=axis, keepdims=keepdims)

    return Op(name, kernel, rule=name, device=device)


def _extreme_op(name: str, ufunc, fill) -> Op:
    return Op(name, _extreme(ufunc, fill), rule=name, ctx=True, device=_extreme_device(name, fill))


def _lowest(dtype):
    return False if dtype.kind == "b" else np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _highest(dtype):
    return True if dtype.kind == "b" else np.iinfo(dtype).max if dtype.kind in "iu" else np.inf


OPS = {
    "sum": Op(
        "sum",
        lambda x, axis=None, keepdims=False: np.add.reduce(x, axis=axis, keepdims=keepdims),
        rule="sum",
        device=lambda be: (
            lambda x, axis=None, keepdims=False: be.xp.sum(x, axis=axis, keepdims=keepdims)
        ),
    ),
    "mean": Op("mean", _mean, rule="mean", ctx=True, device=lambda be: partial(_mean, xp=be.xp)),
    "max": _extreme_op("max", np.maximum, _lowest),
    "min": _extreme_op("min", np.minimum, _highest),
    **{name: _whole(name) for name in ("prod", "all", "any", "argmax", "argmin")},
}


def _norm_axis(axis):
    if isinstance(axis, list):
        return tuple(axis)
    return axis


def _reduce(name: str, x, axis=None, keepdims=False):
    if axis is None:  # spelled out: every loss and its gradient pass here
        return OPS[name](x, keepdims=True) if keepdims else OPS[name](x)
    if isinstance(axis, list):
        axis = tuple(axis)
    return OPS[name](x, axis=axis, keepdims=True) if keepdims else OPS[name](x, axis=axis)


def sum(x, axis=None, keepdims=False):
    """``np.sum``; over a sharded axis the result is Partial(sum), no communication."""
    return _reduce("sum", x, axis, keepdims)


def mean(x, axis=None, keepdims=False):
    """``np.mean``; over a sharded axis the result is Partial(avg), exact for uneven shards."""
    return _reduce("mean", x, axis, keepdims)


def _no_identity(name: str, x, axis, keepdims) -> None:
    """numpy's error where it has one: max, min, argmax and argmin of a DistTensor over an
    empty axis (Note [Empty reductions])."""
    if isinstance(x, DistTensor) and 0 in x.shape:
        getattr(np, name)(np.empty(x.shape, x.dtype), axis=_norm_axis(axis), keepdims=keepdims)


# Note [Empty reductions]
# numpy's max and min of an empty axis raise ValueError ("zero-size array to reduction operation
# maximum which has no identity"), argmax and argmin too ("attempt to get argmax of an empty
# sequence"), unless initial= gives a value. A split axis makes max/min a Partial from local
# reductions that start at the identity (-inf, the dtype's lowest), since a shard may be empty
# while the axis is not; so an axis empty everywhere would return -inf, silently. Every rank
# knows the global shape, so every rank asks numpy on a zero-size stand-in of it (no memory,
# no communication) before any op runs: numpy's own error, type and text, on every rank at
# once and before any collective, or nothing, where numpy reduces a zero-size array fine (an
# axis other than the empty one, keepdims, axis=()). Only zero-size tensors pay the look.
# np.ptp, np.nanmax and calls with initial= or where= take the replicate fallback, which
# gives numpy a zero-size operand's global value without gathering it (it is known on every
# rank): numpy's error, or its result, on every rank before any collective.


def max(x, axis=None, keepdims=False):
    """``np.max``; over a sharded axis the result is Partial(max)."""
    _no_identity("max", x, axis, keepdims)
    return _reduce("max", x, axis, keepdims)


def min(x, axis=None, keepdims=False):
    """``np.min``; over a sharded axis the result is Partial(min)."""
    _no_identity("min", x, axis, keepdims)
    return _reduce("min", x, axis, keepdims)


def prod(x, axis=None, keepdims=False):
    """``np.prod`` (a reduced axis is gathered first)."""
    return _reduce("prod", x, axis, keepdims)


def all(x, axis=None, keepdims=False):
    """``np.all``; over a sharded axis the result is Partial(min) of bools (logical and)."""
    return _reduce("all", x, axis, keepdims)


def any(x, axis=None, keepdims=False):
    """``np.any``; over a sharded axis the result is Partial(max) of bools (logical or)."""
    return _reduce("any", x, axis, keepdims)


def argmax(x, axis=None, keepdims=False):
    """``np.argmax`` (axis None or an int)."""
    _no_identity("argmax", x, axis, keepdims)  # before the split axis is gathered
    return _reduce("argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims=False):
    """``np.argmin`` (axis None or an int)."""
    _no_identity("argmin", x, axis, keepdims)
    return _reduce("argmin", x, axis, keepdims)


def var(x, axis=None, ddof=0, keepdims=False):
    """``np.var`` written with primitives (two-pass: mean, then mean of squared deviations)."""
    axis = _norm_axis(axis)
    d = EW["subtract"](x, mean(x, axis, keepdims=True))
    v = mean(EW["multiply"](d, d), axis, keepdims)
    if ddof:
        n = math.prod(x.shape[a] for a in _axes(axis, x.ndim))
        with np.errstate(divide="ignore"):  # ddof >= n: inf or nan, as numpy gives
            v = EW["multiply"](v, np.float64(n) / builtins.max(n - ddof, 0))
    return v


def std(x, axis=None, ddof=0, keepdims=False):
    """``np.std``: the square root of ``var``."""
    return EW["sqrt"](var(x, axis, ddof, keepdims))


# -- softmax, log_softmax, logsumexp: fused or composite -------------------------------------
# As layer_norm and cross_entropy (Note [Fused or composite] in ops/nn.py): where no mesh dim
# splits a reduced axis, one fused op runs the local kernel of kernels/softmax.py (CUDA on a
# GPU), and its gradient is one fused op too; where one does, the composite of dt reductions
# keeps the split and all-reduces only per-row statistics (the max, the sum of exponentials).
# Several reduced axes (or axis=None) are moved last and merged into one for the kernel.
def _splits(x, axes) -> bool:
    """Whether a mesh dim (of more than one rank) splits one of ``axes`` of ``x``."""
    if not isinstance(x, DistTensor):
        return False
    return builtins.any(
        p.is_shard() and p.dim in axes and n > 1 for p, n in zip(x.placements, x.mesh.shape)
    )


def _rows(x, axes: tuple[int, ...], xp):
    """``x`` with ``axes`` moved last and merged into one axis (the kernels' rows), and the
    shape before the merge (to undo it: ``_unrows``)."""
    k = len(axes)
    if axes != tuple(range(x.ndim - k, x.ndim)):
        x = xp.moveaxis(x, axes, tuple(range(-k, 0)))
    if k == 1:
        return x, x.shape
    lead = x.shape[: x.ndim - k]
    return x.reshape(lead + (math.prod(x.shape[x.ndim - k :]),)), x.shape


def _unrows(y, axes: tuple[int, ...], shape: tuple[int, ...], xp):
    """A full-size result of the rows back in the input's axis order (``_rows`` undone)."""
    k = len(axes)
    if k > 1:
        y = y.reshape(shape)
    if axes != tuple(range(y.ndim - k, y.ndim)):
        y = xp.moveaxis(y, tuple(range(-k, 0)), axes)
    return y


def _kept_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` with the reduced ``axes`` as 1 (a keepdims result's shape)."""
    return tuple(1 if a in axes else n for a, n in enumerate(shape))


def _along(f, arrays, axis, xp):
    """``f`` of full-size ``arrays`` (the input, or the gradient and the output) over the rows
    of ``axis``, its full-size result in the input's axis order; a 0-d array is one row of one
    element."""
    if arrays[0].ndim == 0:
        return f(*arrays)
    axes = _axes(axis, arrays[0].ndim)
    rows = [_rows(a, axes, xp) for a in arrays]
    return _unrows(f(*(r for r, _ in rows)), axes, rows[0][1], xp)


def _row_kernel(name: str):
    """The kernel of a fused op whose result has its inputs' shape (softmax, log_softmax,
    log_softmax_grad)."""

    def kernel(*arrays, axis=-1, be=backend.NUMPY):
        return _along(backend.kernels(be, "softmax")[name], arrays, axis, be.xp)

    return kernel


def _softmax_grad_kernel(g, y, axis=-1, scale=1.0, be=backend.NUMPY):
    """The gradient of softmax, and of the attention path (``scale``: Note [Attention
    scores] in ops/nn.py), from the output ``y``."""
    fns = backend.kernels(be, "softmax")
    if scale == 1.0:
        return _along(fns["softmax_backward"], (g, y), axis, be.xp)
    f = partial(fns["attention_softmax_backward"], scale=scale)
    return _along(f, (g, y), axis, be.xp)


def _logsumexp_kernel(x, axis=None, keepdims=False, be=backend.NUMPY):
    f = backend.kernels(be, "softmax")["logsumexp_forward"]
    if x.ndim == 0:
        return f(x)
    axes = _axes(axis, x.ndim)
    out = f(_rows(x, axes, be.xp)[0])
    return out.reshape(_kept_shape(x.shape, axes)) if keepdims else out


def _logsumexp_grad_kernel(g, x, out, axis=None, keepdims=False, be=backend.NUMPY):
    """``g * exp(x - out)``: ``g`` and ``out`` of the forward's output shape."""
    f = backend.kernels(be, "softmax")["logsumexp_backward"]
    if x.ndim == 0:
        return f(g, x, out)
    axes = _axes(axis, x.ndim)
    rows, shape = _rows(x, axes, be.xp)
    lead = rows.shape[:-1]  # keepdims: drop the size-1 axes
    return _unrows(f(g.reshape(lead), rows, out.reshape(lead)), axes, shape, be.xp)


def _with(fn):
    """The device kernel factory of a kernel taking the backend as ``be``."""
    return lambda be: partial(fn, be=be)


_FUSED = {
    name: Op(name, kernel, rule=rule, device=_with(kernel))
    for name, kernel, rule in (
        ("softmax", _row_kernel("softmax_forward"), "softmax"),
        ("log_softmax", _row_kernel("log_softmax_forward"), "log_softmax"),
        ("logsumexp", _logsumexp_kernel, "logsumexp"),
        ("softmax_grad", _softmax_grad_kernel, "softmax_grad"),
        ("log_softmax_grad", _row_kernel("log_softmax_backward"), "log_softmax_grad"),
        ("logsumexp_grad", _logsumexp_grad_kernel, "logsumexp_grad"),
    )
}
# the gradients (ops/gradients.py): internal ops, not exported
SOFTMAX_GRAD, LOG_SOFTMAX_GRAD = _FUSED["softmax_grad"], _FUSED["log_softmax_grad"]
LOGSUMEXP_GRAD = _FUSED["logsumexp_grad"]


def _fused_axis(x, axis):
    """(``axis`` as the fused op takes it: an int, a tuple or None; whether a mesh dim splits
    one of the reduced axes, so the composite runs). Raises AxisError as numpy does."""
    axis = _norm_axis(axis)
    if isinstance(axis, tuple) and len(axis) == 1:
        axis = axis[0]
    axes = _axes(axis, builtins.max(x.ndim, 1))  # a 0-d x takes axis 0 or -1, as numpy's max
    return axis, _splits(x, axes)


def logsumexp(x, axis=None, keepdims=False):
    """``log(sum(exp(x)))`` along ``axis``, shifted by the max for stability (by 0 where the
    max is not finite: a row of -inf gives -inf, one with +inf +inf, one with NaN NaN).

    One fused op, or the composite where a mesh dim splits a reduced axis (comment above).
    """
    x = _operand(x)
    axis, split = _fused_axis(x, axis)
    if not split:
        return _FUSED["logsumexp"](x, axis=axis, keepdims=bool(keepdims))
    x = _resolved(x)  # not linear: a Partial is reduced once, here, not by each use below
    m = _shift(x, axis)
    m = EW["where"](EW["isfinite"](m), m, np.zeros((), m.dtype))
    s = sum(EW["exp"](EW["subtract"](x, m)), axis, keepdims=True)
    if not keepdims:  # drop the size-1 axes: a max over them is a squeeze, and local
        s, m = max(s, axis), max(m, axis)
    return EW["add"](EW["log"](s), m)


def _operand(a):
    """DistTensors and device arrays as they are; anything else as a numpy array."""
    return a if isinstance(a, DistTensor) or backend.is_device(a) else np.asarray(a)


def _resolved(t):
    """``t`` with Partial mesh dims reduced (one collective each); others kept."""
    if not isinstance(t, DistTensor) or not t.spec.has_partial():
        return t
    return reshard(t, t.mesh, t.spec.without_partials().placements)


def _shift(x, axis):
    """The max along ``axis`` (kept), Partial reduced once (it is used twice), as a constant:
    the result does not depend on the shift, so no gradient flows through it."""
    m = _resolved(_reduce("max", x, axis, True))  # an empty row is shifted by -inf: no error
    return m.detach() if isinstance(m, DistTensor) else m


def softmax(x, axis=-1):
    """``exp(x) / sum(exp(x))`` along ``axis``, shifted by the max for stability (a row whose
    max is not finite is NaN). One fused op, or the composite where a mesh dim splits a
    reduced axis (comment above)."""
    x = _operand(x)
    axis, split = _fused_axis(x, axis)
    if not split:
        return _FUSED["softmax"](x, axis=axis)
    x = _resolved(x)  # not linear: a Partial is reduced once, here, not by each use below
    e = EW["exp"](EW["subtract"](x, _shift(x, axis)))
    return EW["divide"](e, sum(e, axis, keepdims=True))


def log_softmax(x, axis=-1):
    """``x - logsumexp(x)`` along ``axis``: one fused op, or the composite where a mesh dim
    splits a reduced axis (comment above)."""
    x = _operand(x)
    axis, split = _fused_axis(x, axis)
    if not split:
        return _FUSED["log_softmax"](x, axis=axis)
    x = _resolved(x)
    return EW["subtract"](x, logsumexp(x, axis, keepdims=True))


__all__ = [
    "all",
    "any",
    "argmax",
    "argmin",
    "log_softmax",
    "logsumexp",
    "max",
    "mean",
    "min",
    "prod",
    "softmax",
    "std",
    "sum",
    "var",
]
