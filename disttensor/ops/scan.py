"""Scans along one axis: ``cumsum`` and ``cumprod`` (and ``np.cumsum``/``np.cumprod``,
``np.cumulative_sum``/``np.cumulative_prod``, ``x.cumsum()``, ``x.cumprod()``).

Along an axis that no mesh dim splits, a scan is one local op whose rule keeps every placement
(spmd/scan_rules.py). Along a split axis it is Note [Scans of a split axis]: one small
all-gather of the shard totals, never the array.

Note [Scans of a split axis]
    Each rank scans its shard; its last slice along the axis (the shard's total: O(other
    dims) elements, the identity for an empty shard) goes into a tensor of one slice per
    piece of the axis, split like the axis, which is gathered over the mesh dims that split
    the axis only (one all-gather per such mesh dim, of the totals). The piece at position p
    (row-major over those mesh dims: nested splits order the pieces so) adds (cumsum) or
    multiplies (cumprod) the total of the pieces before it to its local scan. The result keeps
    the input's placements. cumsum is linear, so Partial(sum)/Partial(avg) inputs stay Partial
    (every step is linear in the parts); cumprod, bools, casts and Partial(max)/Partial(min)
    reduce them first. Integer results are exact (wrap-around addition and multiplication are
    associative); float results differ from numpy's sequential scan by rounding only.
    ``reverse=True`` (internal: the gradient of cumsum) scans from the end, adding the totals
    of the pieces after each one. ``axis=None`` scans the raveled tensor (the reshape rule
    decides what moves).
    On a device the local scans, the totals and the offsets are the device's (``xp.cumsum``
    on the shards, the totals gathered in device buffers): the same collectives as on the
    host, nothing copied to it.

>>> import numpy as np, disttensor as dt
>>> x = dt.shard_tensor(np.arange(1.0, 7.0), dt.ProcessMesh([0]), [dt.Shard(0)])
>>> dt.cumsum(x).numpy(), np.cumprod(x).numpy()
(array([ 1.,  3.,  6., 10., 15., 21.]), array([  1.,   2.,   6.,  24., 120., 720.]))
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import autograd, backend, comm
from ..dispatch import Op
from ..placement import Replicate
from ..tensor import DistTensor, dtensor_from_local, reshard
from . import shape as sh
from .numpy_interop import Unsupported, _only, implements

_FUNCS = {"sum": np.cumsum, "prod": np.cumprod}
_NAMES = {"sum": "cumsum", "prod": "cumprod"}


def _kernel(kind: str, xp: Any = np):
    """The local scan of ``kind`` with array module ``xp`` (a device's: Note [Array
    backends] in backend.py)."""
    func = getattr(xp, _NAMES[kind])

    def kernel(x, axis=0, dtype=None, reverse=False):
        if not reverse:
            return func(x, axis=axis, dtype=dtype)
        return xp.ascontiguousarray(xp.flip(func(xp.flip(x, axis), axis=axis, dtype=dtype), axis))

    return kernel


OPS = {
    name: Op(name, _kernel(kind), rule=name, device=lambda be, kind=kind: _kernel(kind, be.xp))
    for kind, name in _NAMES.items()
}


def result_dtype(kind: str, dtype: Any, dtype_arg: Any = None) -> np.dtype:
    """numpy's result dtype of cumsum/cumprod of ``dtype`` (small integers and bools widen
    to the platform integer, as in np.sum)."""
    return _FUNCS[kind](np.empty(0, dtype), dtype=dtype_arg).dtype


def scan(kind: str, x: Any, axis: Any = None, dtype: Any = None, reverse: bool = False) -> Any:
    """cumsum (``kind="sum"``) or cumprod (``"prod"``) of ``x`` along ``axis`` (None: the
    raveled tensor); ``reverse``: from the end (cumsum only)."""
    if not isinstance(x, DistTensor):  # numpy's own (a device array: its module's)
        be = backend.of(x)
        if axis is None:
            x, axis = be.xp.ravel(x), 0
        return _kernel(kind, be.xp)(be.asarray(x), axis, dtype, reverse)
    if axis is None:
        x, axis = sh.ravel(x), 0
    # numpy's TypeError or AxisError, before any collective
    axis = normalize_axis_index(operator.index(axis), x.ndim)
    dtype = None if dtype is None else np.dtype(dtype)
    attrs: dict[str, Any] = {"axis": axis}
    if dtype is not None:
        attrs["dtype"] = dtype
    if reverse:
        attrs["reverse"] = True
    mesh = x.mesh
    dims = [m for m, p in enumerate(x.placements) if p.is_shard(axis) and mesh.shape[m] > 1]
    out_dtype = result_dtype(kind, x.dtype, dtype)
    if out_dtype != x.dtype or dtype is not None:  # the parts of a Partial would cast apart
        x = _plain(x, keep=())
    if not dims:
        return OPS[_NAMES[kind]](x, **attrs)
    return _split_scan(kind, x, axis, dims, out_dtype, attrs)


def _plain(x: DistTensor, keep: tuple[str, ...]) -> DistTensor:
    """``x`` with its Partial mesh dims reduced, except those whose reduce type is in ``keep``."""
    pls = [Replicate() if p.is_partial() and p.reduce_type not in keep else p for p in x.placements]
    return x if tuple(pls) == x.spec.placements else reshard(x, x.mesh, pls)


def _split_scan(kind, x: DistTensor, axis: int, dims: list[int], out_dtype, attrs) -> DistTensor:
    """Note [Scans of a split axis]."""
    linear = kind == "sum" and x.dtype != np.bool_
    x = _plain(x, keep=("sum", "avg") if linear else ())
    mesh, spec = x.mesh, x.spec
    coord = mesh.get_coord(comm.get_rank())
    reverse = attrs.get("reverse", False)
    pieces = math.prod(mesh.shape[m] for m in dims)
    tshape = list(spec.shape)
    tshape[axis] = pieces
    xp = backend.xp(x.to_local())  # the shards' array module (Note [Array backends])
    if coord is not None:
        local = _kernel(kind, xp)(x.to_local(), axis, attrs.get("dtype"), reverse)
        n = local.shape[axis]
        if n:
            last = xp.take(local, [0 if reverse else n - 1], axis=axis)
        else:  # an empty shard: the identity
            shape = list(local.shape)
            shape[axis] = 1
            last = (xp.zeros if kind == "sum" else xp.ones)(tuple(shape), out_dtype)
    else:
        local = last = xp.empty(0, out_dtype)
    totals = dtensor_from_local(last, mesh, spec.placements, global_shape=tshape)
    gathered = reshard(
        totals, mesh, [Replicate() if p.is_shard(axis) else p for p in spec.placements]
    )
    out_spec = spec.replace(dtype=out_dtype)
    if coord is None:
        out = DistTensor(xp.empty(out_spec.local_shape(None), out_dtype), out_spec)
    else:
        p = 0
        for m in dims:  # this shard's position among the pieces of the axis
            p = p * mesh.shape[m] + coord[m]
        t = gathered.to_local()
        index = [slice(None)] * t.ndim
        index[axis] = slice(p + 1, None) if reverse else slice(0, p)
        offset = getattr(xp, kind)(t[tuple(index)], axis=axis, dtype=out_dtype, keepdims=True)
        result = local + offset if kind == "sum" else local * offset
        out = DistTensor(xp.ascontiguousarray(result, out_dtype), out_spec)
    if x.requires_grad and autograd.is_grad_enabled():
        autograd.record_op(_NAMES[kind], (x,), attrs, out)
    return out


def cumsum(a, axis=None, dtype=None):
    """``np.cumsum``: along a split axis, local scans plus one all-gather of the shard totals
    over the mesh dims that split it (Note [Scans of a split axis]); the placements stay.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(6).reshape(3, 2), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.cumsum(x, axis=0).numpy()
    array([[0, 1],
           [2, 4],
           [6, 9]])
    """
    return scan("sum", a, axis, dtype)


def cumprod(a, axis=None, dtype=None):
    """``np.cumprod``: as ``cumsum`` (Partial inputs are reduced first: not linear).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(1, 5), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.cumprod(x).numpy()
    array([ 1,  2,  6, 24])
    """
    return scan("prod", a, axis, dtype)


def _np_scan(func: Callable, kind: str) -> None:
    """np.cumsum/np.cumprod of a DistTensor: its array, axis and dtype."""

    @implements(func, name=func.__name__)
    def impl(given):
        g = _only(given, "a", "axis", "dtype")
        if not isinstance(g["a"], DistTensor):
            raise Unsupported("not a DistTensor")
        return scan(kind, g["a"], g.get("axis"), g.get("dtype"))


_np_scan(np.cumsum, "sum")
_np_scan(np.cumprod, "prod")


def _cumulative(func, kind: str) -> None:
    """``np.cumulative_sum``/``np.cumulative_prod`` (array API): axis may be None only for
    1-D input; ``include_initial`` takes the fallback."""

    @implements(func, name=_NAMES[kind])
    def impl(given):
        g = _only(given, "x", "axis", "dtype", "include_initial")
        x, axis = g["x"], g.get("axis")
        if not isinstance(x, DistTensor) or g.get("include_initial", False):
            raise Unsupported("include_initial=True or not a DistTensor")
        if axis is None and x.ndim != 1:
            raise Unsupported("numpy's error for axis=None of a tensor that is not 1-D")
        return scan(kind, x, 0 if axis is None else axis, g.get("dtype"))


if hasattr(np, "cumulative_sum"):  # numpy >= 2.1
    _cumulative(np.cumulative_sum, "sum")
    _cumulative(np.cumulative_prod, "prod")


__all__ = ["cumprod", "cumsum"]
