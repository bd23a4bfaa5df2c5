"""Order statistics of DistTensors: ``median``, ``percentile``, ``quantile`` (numpy's, to the
bit), selected exactly along split axes with a few small all-reduces (Note [Distributed
selection]) instead of gathering the data; device shards on the device.

>>> import numpy as np, disttensor as dt
>>> x = dt.shard_tensor(np.array([5.0, 1.0, 4.0, 2.0, 3.0]), dt.ProcessMesh([0]), [dt.Shard(0)])
>>> float(np.median(x)), float(np.percentile(x, 25))
(3.0, 2.0)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .. import autograd, backend, comm
from ..placement import Partial, Replicate, Shard
from ..spec import DistSpec
from ..tensor import DistTensor, dtensor_from_local, reshard
from .numpy_interop import Unsupported, implements
from .statistics import _plain

_R = Replicate()


# -- order statistics: median, percentile, quantile ---------------------------------------------
# Note [Distributed selection]
#     numpy's median and quantiles read a few order statistics of each lane (the positions its
#     method interpolates between, and the last one, where NaNs sort), then interpolate. Along
#     reduced axes that no mesh dim splits, each rank finds them in its shard (np.partition,
#     as numpy). Along split ones each is found exactly by a radix select: the values map to
#     unsigned keys in the order numpy sorts them (floats by sign and magnitude bits, NaN
#     last; ints with the sign bit flipped); each pass counts, per lane and wanted position,
#     the next 8 bits of the keys that still match the prefix found so far (one all-reduce of
#     lanes x positions x 256 int32 counts over the mesh dims that split the reduced axes),
#     and every rank picks the same digit: eight passes for 64-bit values, four for 32-bit,
#     never the data. Where the lanes are shorter than those counts (2048 values per wanted
#     position) gathering the split reduced axes moves less, and that is
#     done instead (``_selects``). The interpolation is numpy's own code (its private
#     helpers, on exactly the order statistics it would read), so results are numpy's bit for
#     bit, up to the sign of a zero (numpy orders -0.0 and 0.0 as it finds them). Weights,
#     0-d input and empty reductions take the fallback.
#     On a device the select runs with the shards' array module throughout: the counts are
#     all-reduced on the device and the digits picked there (no copy to the host per pass), so
#     the collectives are the host's. Lanes whole on a rank take the same select, with no
#     collective, instead of a partition (CuPy's compares with ``<`` and does not put NaNs
#     last, as numpy's does); numpy's interpolation runs step for step with device operations
#     (``_device_lerp``), its indices and weights (host constants) moved there.
try:  # numpy's own interpolation (private; without it, the fallback)
    from numpy.lib import _function_base_impl as _fb

    _QUANTILE_METHODS, _get_indexes, _get_gamma, _lerp = (
        _fb._QuantileMethods,
        _fb._get_indexes,
        _fb._get_gamma,
        _fb._lerp,
    )
except (ImportError, AttributeError):  # pragma: no cover (numpy's internals moved)
    _QUANTILE_METHODS = None


def _device_lerp(a: Any, b: Any, t: Any) -> Any:
    """numpy's ``_lerp(a, b, t)`` with the operations of device arrays' own module, step for
    step (numpy's writes through its ufuncs' ``out=`` and ``where=``, which device arrays do
    not take from numpy): the same roundings in the same dtypes."""
    diff_b_a = b - a
    lerp = a + diff_b_a * t
    # numpy: subtract(b, diff_b_a * (1 - t), out=lerp, where=t >= 0.5, casting="unsafe",
    # dtype=lerp's): both operands cast to lerp's dtype, the difference kept where t >= 0.5
    above = b.astype(lerp.dtype) - (diff_b_a * (1 - t)).astype(lerp.dtype)
    if isinstance(t, float):  # a weak q's gamma
        return above if t >= 0.5 else lerp
    return backend.xp(lerp).where(t >= 0.5, above, lerp)


def _keys(values: Any) -> Any:
    """Unsigned keys in numpy's sort order (NaN last; -0.0 just below 0.0)."""
    xp = backend.xp(values)
    bits = values.dtype.itemsize * 8
    utype = np.dtype(f"u{values.dtype.itemsize}")
    top = utype.type(1 << (bits - 1))
    if values.dtype.kind == "f":
        values = xp.where(xp.isnan(values), values.dtype.type(np.nan), values)
        u = values.view(utype)
        return xp.where(u & top, ~u, u | top)
    u = values.view(utype)
    return u ^ top if values.dtype.kind == "i" else u


def _values_of(keys: Any, dtype: np.dtype) -> Any:
    bits = dtype.itemsize * 8
    top = keys.dtype.type(1 << (bits - 1))
    if dtype.kind == "f":
        xp = backend.xp(keys)
        return xp.where(keys & top, keys & ~top, ~keys).astype(keys.dtype).view(dtype)
    return (keys ^ top if dtype.kind == "i" else keys).view(dtype)


def _select(a: DistTensor, spec: DistSpec, reduced: tuple[int, ...], positions) -> Any:
    """The order statistics at ``positions`` (sorted, 0-based) of each lane of ``a`` along the
    ``reduced`` axes, this rank's lanes: shape (len(positions), *local lane shape), on a's
    backend. Note [Distributed selection]. ``spec``: the counts of a pass, laid out like the
    lanes with a trailing (positions, 256) block, Partial(sum) over the mesh dims that split
    the lanes (none: no communication)."""
    kept = [i for i in range(a.ndim) if i not in reduced]
    local = a.to_local()
    xp = backend.xp(local)
    lane_shape = tuple(local.shape[i] for i in kept)
    count = math.prod(local.shape[i] for i in reduced)
    nlanes, T = math.prod(lane_shape), len(positions)
    arr = xp.moveaxis(local, kept, list(range(len(kept)))).reshape(nlanes, count)
    keys = _keys(xp.ascontiguousarray(arr))
    bits = keys.dtype.itemsize * 8
    prefix = xp.zeros((nlanes, T), keys.dtype)
    rem = xp.asarray(np.broadcast_to(np.asarray(positions, np.int64), (nlanes, T)).copy())
    lane_ids = xp.broadcast_to(xp.arange(nlanes)[:, None], keys.shape)
    shape = spec.local_shape(spec.mesh.get_coord(comm.get_rank()))
    for shift in range(bits - 8, -8, -8):
        digit = ((keys >> keys.dtype.type(shift)) & keys.dtype.type(255)).astype(np.intp)
        counts = xp.zeros(nlanes * T * 256, spec.dtype)
        high = keys >> keys.dtype.type(shift + 8) if shift + 8 < bits else None
        for t in range(T):
            sel = (high == prefix[:, t : t + 1]) if high is not None else slice(None)
            idx = (lane_ids[sel] * T + t) * 256 + digit[sel]
            counts += xp.bincount(idx.ravel(), minlength=counts.size)
        total = _plain(DistTensor(counts.reshape(shape), spec)).to_local().reshape(nlanes, T, 256)
        cum = xp.cumsum(total, axis=-1)
        d = (cum <= rem[..., None]).sum(axis=-1)  # the digit whose bucket holds the position
        below = xp.take_along_axis(cum, xp.maximum(d - 1, 0)[..., None], axis=-1)[..., 0]
        rem -= xp.where(d > 0, below, 0)
        prefix = (prefix << keys.dtype.type(8)) | d.astype(keys.dtype)
    values = _values_of(prefix, a.dtype)  # (lanes, T)
    return xp.moveaxis(values, -1, 0).reshape((T, *lane_shape))


def _selects(n: int, dtype: np.dtype, positions: int) -> bool:
    """Whether selection moves fewer bytes than gathering lanes of n values: per lane, one
    all-reduce (about twice its bytes) of positions x 256 int32 counts per 8 bits of a value,
    against n values, so 2048 values per wanted position. The same answer on every rank
    (global sizes only)."""
    passes = dtype.itemsize
    return passes * 2 * positions * 256 * 4 < n * dtype.itemsize


def _order_stats(name: str, a: DistTensor, axis, keepdims: bool, positions_of, finish):
    """The frame of median/quantile: Partials reduced, the axes normalized; numpy's own
    ``positions_of(n)``: the order statistics needed of lanes of n values, found with
    np.partition where no mesh dim splits a reduced axis, else by distributed selection (Note
    [Distributed selection]); ``finish(stats, row, n)``: numpy's interpolation (``row(i)``: the
    row of stats holding position i); keepdims, placements and the result tensor as numpy's
    _ureduce shapes them."""
    if a.dtype.kind not in "iuf" or a.ndim == 0:
        raise Unsupported(f"a {a.dtype} input of {a.ndim} axes")
    a = _plain(a)
    nd, mesh = a.ndim, a.mesh
    reduced = tuple(range(nd)) if axis is None else normalize_axis_tuple(axis, nd)
    kept = [i for i in range(nd) if i not in reduced]
    n = math.prod(a.shape[i] for i in reduced)
    if n == 0:
        raise Unsupported("numpy's result for an empty reduction (warnings or errors)")
    coord = mesh.get_coord(comm.get_rank())
    split = [
        m
        for m, p in enumerate(a.placements)
        if p.is_shard() and p.dim in reduced and mesh.shape[m] > 1
    ]
    positions = sorted({int(p) % n for p in positions_of(n)})
    kept_pls = [p if p.is_shard() and p.dim in kept else _R for p in a.placements]
    if split and not _selects(n, a.dtype, len(positions)):  # gathering the lanes is cheaper
        a = reshard(a, mesh, kept_pls)  # an all-gather over the mesh dims in ``split``
        split = []
    if coord is None or not (split or backend.is_device(a._local)):
        stats = _local_stats(a, reduced, positions, coord)
    else:  # on a device lanes whole on this rank too: the select with no Partial, no collective
        lane_shape = tuple(a.shape[i] for i in kept)
        lanes_pls = [
            Shard(kept.index(p.dim))
            if p.is_shard() and p.dim in kept
            else Partial("sum")
            if m in split
            else _R
            for m, p in enumerate(a.placements)
        ]
        counts = np.int32 if n < 2**31 else np.int64
        spec = DistSpec.make(mesh, lanes_pls, (*lane_shape, len(positions), 256), counts)
        stats = _select(a, spec, reduced, positions)
    row = {p: i for i, p in enumerate(positions)}
    result = backend.xp(stats).asarray(finish(stats, lambda i: row[int(i) % n], n))
    qdims = result.ndim - len(kept)
    if keepdims:
        index = tuple(np.newaxis if i in reduced else slice(None) for i in range(nd))
        result = result[(Ellipsis, *index)]
    dims = {k: (k if keepdims else j) + qdims for j, k in enumerate(kept)}
    shape = result.shape[:qdims] + tuple(
        a.shape[i] if i in dims else 1 for i in range(nd) if keepdims or i in dims
    )
    pls = [Shard(dims[p.dim]) if p.is_shard() else _R for p in kept_pls]
    if coord is None:  # an empty shard of the input's backend
        result = backend.xp(a._local).empty(
            DistSpec(mesh, tuple(pls), shape, result.dtype).local_shape(None), result.dtype
        )
    out = dtensor_from_local(result, mesh, pls, global_shape=shape)
    if a.requires_grad and autograd.is_grad_enabled() and out.dtype.kind in "fc":
        autograd.record(name, (a,), (out,), None)  # no gradient: backward refuses, naming it
    return out


def _local_stats(a: DistTensor, reduced, positions, coord) -> np.ndarray:
    """The order statistics of host lanes whose reduced axes are whole on this rank (or
    stand-ins on a rank outside the mesh): np.partition, as numpy's own functions do. Device
    lanes take ``_select`` instead: CuPy's partition compares with ``<``, which does not
    order NaNs last as numpy's does."""
    kept = [i for i in range(a.ndim) if i not in reduced]
    if coord is None:
        local = np.zeros([1 if i in reduced else 0 for i in range(a.ndim)], a.dtype)
        positions = [0] * len(positions)
    else:
        local = a.to_local()
    lane_shape = tuple(local.shape[i] for i in kept)
    count = math.prod(local.shape[i] for i in reduced)
    arr = np.moveaxis(local, kept, range(len(kept))).reshape((*lane_shape, count))
    part = np.partition(arr, positions, axis=-1) if arr.size else arr
    return np.moveaxis(part[..., positions], -1, 0)


def median(a, axis=None, out=None, overwrite_input=False, keepdims=False):
    """``np.median``: numpy's own along reduced axes that are whole; along split ones the
    one or two middle order statistics (and the last, for NaNs) by distributed selection
    (Note [Distributed selection]), averaged as numpy averages them.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([[4.0, 1.0], [2.0, 3.0], [9.0, 0.0]]), dt.ProcessMesh([0]),
    ...                     [dt.Shard(0)])
    >>> np.median(x).numpy(), np.median(x, axis=0).numpy()
    (array(2.5), array([4., 1.]))
    """
    if out is not None or not isinstance(a, DistTensor):
        raise Unsupported("out= or not a DistTensor")
    nan = a.dtype.kind == "f"

    def positions(n):
        kth = [n // 2 - 1, n // 2] if n % 2 == 0 else [(n - 1) // 2]
        return [*kth, n - 1] if nan else kth

    def finish(stats, row, n):
        xp = backend.xp(stats)
        mid = [n // 2 - 1, n // 2] if n % 2 == 0 else [(n - 1) // 2]
        rout = xp.mean(stats[[row(i) for i in mid]], axis=0)
        if nan:
            last = stats[row(n - 1)]
            isnan = xp.isnan(last)
            if isnan.any():
                if rout.ndim == 0:
                    return last
                xp.copyto(rout, last, where=isnan)
        return rout

    return _order_stats("median", a, axis, keepdims, positions, finish)


def _quantile_of(name: str, a, q, axis, method, keepdims, weights, weak_q: bool):
    """np.quantile's steps after its checks of ``q`` (an array in [0, 1])."""
    if weights is not None or _QUANTILE_METHODS is None:
        raise Unsupported("weights= (method='inverted_cdf' sorts the lanes)")
    if method not in _QUANTILE_METHODS or q.ndim > 2:
        raise Unsupported("numpy's error for the method or a q of more than one axis")
    props = _QUANTILE_METHODS[method]
    nan = a.dtype.kind == "f"
    plan: dict[str, Any] = {}

    def positions(n):
        virtual = np.asanyarray(props["get_virtual_index"](n, q))
        integers = props["fix_gamma"] is None or (
            method == "linear" and np.issubdtype(virtual.dtype, np.integer)
        )
        plan.update(virtual=virtual, integers=integers)
        if integers:
            wanted = list(virtual.ravel())
        else:
            prev, nxt = _get_indexes(np.empty(0, a.dtype), virtual, n)
            plan.update(prev=prev, next=nxt)
            wanted = [*prev.ravel(), *nxt.ravel()]
        return [*wanted, n - 1] if nan else wanted

    def finish(stats, row, n):
        xp = backend.xp(stats)
        rows = np.vectorize(row, otypes=[np.intp])  # the rows of stats: host indices, moved
        virtual = plan["virtual"]
        if plan["integers"]:
            result = xp.take(stats, xp.asarray(rows(virtual)), axis=0)
        else:
            prev, nxt = plan["prev"], plan["next"]
            previous, following = stats[xp.asarray(rows(prev))], stats[xp.asarray(rows(nxt))]
            gamma = _get_gamma(virtual, prev, props)
            if weak_q:
                gamma = float(gamma)
            else:  # numpy's host constant, moved beside device stats
                gamma = gamma.reshape(virtual.shape + (1,) * (stats.ndim - 1))
                gamma = backend.constant(stats, gamma)
            if xp is np:
                result = np.asarray(_lerp(previous, following, gamma))
            else:
                result = _device_lerp(previous, following, gamma)
        if nan:
            last = stats[row(n - 1)]
            having = xp.isnan(last)
            if having.any():
                if result.ndim == 0:
                    return last
                xp.copyto(result, last, where=having)
        return result

    return _order_stats(name, a, axis, keepdims, positions, finish)


def quantile(
    a,
    q,
    axis=None,
    out=None,
    overwrite_input=False,
    method="linear",
    keepdims=False,
    *,
    weights=None,
):
    """``np.quantile`` (any unweighted method): numpy's own along reduced axes that are
    whole, distributed selection along split ones (Note [Distributed selection]).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(10.0), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> np.quantile(x, [0.25, 0.5]).numpy(), np.percentile(x, 90, method="lower").numpy()
    (array([2.25, 4.5 ]), array(8.))
    """
    if out is not None or not isinstance(a, DistTensor) or isinstance(q, DistTensor):
        raise Unsupported("out=, a numpy a or a DistTensor q")
    weak_q = type(q) in (int, float)
    q = np.asanyarray(q)
    if a.dtype.kind == "c" or q.size == 0 or not (q.min() >= 0 and q.max() <= 1):
        raise Unsupported("numpy's error for complex input or q outside [0, 1]")
    return _quantile_of("quantile", a, q, axis, method, keepdims, weights, weak_q)


def percentile(
    a,
    q,
    axis=None,
    out=None,
    overwrite_input=False,
    method="linear",
    keepdims=False,
    *,
    weights=None,
):
    """``np.percentile``: ``quantile`` of ``q / 100``, as numpy divides it."""
    if out is not None or not isinstance(a, DistTensor) or isinstance(q, DistTensor):
        raise Unsupported("out=, a numpy a or a DistTensor q")
    weak_q = type(q) in (int, float)
    q = np.true_divide(q, 100)
    q = np.asanyarray(q)
    if a.dtype.kind == "c" or q.size == 0 or not (q.min() >= 0 and q.max() <= 1):
        raise Unsupported("numpy's error for complex input or q outside [0, 100]")
    return _quantile_of("percentile", a, q, axis, method, keepdims, weights, weak_q)


@implements(np.median, name="median")
def _np_median(given):
    return median(**given)


@implements(np.quantile, name="quantile")
def _np_quantile(given):
    return quantile(**given)


@implements(np.percentile, name="percentile")
def _np_percentile(given):
    return percentile(**given)


__all__ = ["median", "percentile", "quantile"]
