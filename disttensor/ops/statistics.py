"""numpy's norms, comparisons and statistics on DistTensors, written with dt ops (so the rules
decide what moves, and the gradients of the composites come from their primitives):
``np.linalg.norm``, ``isclose``/``allclose``/``array_equal``/``array_equiv``, ``cov``/
``corrcoef``, ``count_nonzero``, ``histogram`` (order statistics: ops/order_stats.py).

Each does its elementwise work where the data lies and reduces what it must: a norm along an
axis that is not split moves nothing, along a split one it is a Partial reduced once; a
comparison is one all-reduce of a bool; ``cov`` of observations split over ranks is a mean
(one all-reduce of the D means) and a Gram product contracted over the split axis (one
D x D Partial(sum), reduced when read); a histogram is local counts with the global bin edges
(Note [Histograms of split data]). Arguments they do not take go to numpy's function
through the counted replicate fallback (ops/numpy_interop.py).

On device shards the same dt ops run (each op's device kernel), with the same communication;
the library's own host constants (corrcoef's diagonal mask) are moved to the device
explicitly, and what must be a host value is copied explicitly and is small: the one element
of allclose's, array_equal's and count_nonzero's result (a Python bool or numpy scalar, as on
the host), a histogram's (min, max) that its edges are computed from. A histogram is counted
by the device's ``histogram``. Host arrays handed to these functions with device tensors (an
isclose ``b``, histogram ``weights`` or bin edges) are copied onto the device explicitly
(``_onto_device``), as the replicate fallback copies the host arrays handed to numpy's
functions (Note [The replicate fallback on a device] in dispatch.py): the host's work and
communication, not a gather. On arrays that are not DistTensors the functions are those of
the array's own library.

>>> import numpy as np, disttensor as dt
>>> x = dt.shard_tensor(np.array([[3.0, 4.0], [6.0, 8.0]]), dt.ProcessMesh([0]), [dt.Shard(0)])
>>> np.linalg.norm(x, axis=1).numpy(), dt.allclose(x, 2 * x / 2), dt.count_nonzero(x > 3)
(array([ 5., 10.]), True, np.int64(3))
"""

from __future__ import annotations

import builtins
import operator
import warnings
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import backend, comm
from ..placement import Partial, Replicate
from ..tensor import DistTensor, dtensor_from_local, reshard
from . import linalg as la
from . import reduction as red
from . import shape as sh
from .elementwise import OPS as EW
from .numpy_interop import Unsupported, _only, implements

_R = Replicate()
_inf = np.inf


def _plain(x: Any) -> Any:
    """``x`` with its Partial mesh dims reduced (one all-reduce each); others as they are."""
    if not isinstance(x, DistTensor) or not x.spec.has_partial():
        return x
    return reshard(x, x.mesh, x.spec.without_partials().placements)


def _squares(x: DistTensor) -> DistTensor:
    """``(x.conj() * x).real``: ``x * x`` for real x (a Partial x reduced once)."""
    if x.dtype.kind == "c":
        x = _plain(x)
        return EW["real"](EW["multiply"](EW["conjugate"](x), x))
    return EW["multiply"](x, x)


def _size(x: DistTensor, axes: tuple[int, ...]) -> int:
    out = 1
    for a in axes:
        out *= x.shape[normalize_axis_index(a, x.ndim)]
    return out


def _max_or_zero(x: DistTensor, axis, keepdims: bool = False) -> DistTensor:
    """numpy's ``x.max(axis, initial=0)`` of a non-negative x: 0 over an empty axis."""
    if _size(x, axis if isinstance(axis, tuple) else (axis,)) == 0:
        return red.sum(x, axis, keepdims)  # zeros of the right shape and dtype
    return red.max(x, axis, keepdims)


def _min_nonempty(x: DistTensor, axis, keepdims: bool = False) -> DistTensor:
    if _size(x, axis if isinstance(axis, tuple) else (axis,)) == 0:
        raise Unsupported("numpy's error for a minimum over an empty axis")
    return red.min(x, axis, keepdims)


# -- norms -------------------------------------------------------------------------------------
def norm(x, ord=None, axis=None, keepdims=False):
    """``np.linalg.norm`` with dt reductions: vector norms (ord None/2, 1, inf, -inf, 0, any
    other p) and the matrix norms 'fro', 1, -1, inf, -inf; 2, -2 and 'nuc' (singular
    values) raise ``Unsupported`` (numpy's function through the fallback). Along an axis that
    is not split nothing moves; a split one gives a Partial reduced once where needed.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([[1.0, -2.0], [3.0, 4.0]]), dt.ProcessMesh([0]), [dt.Shard(1)])
    >>> float(norm(x)), norm(x, 1, axis=0).numpy(), float(norm(x, np.inf))
    (5.477225575051661, array([4., 6.]), 7.0)
    """
    if not isinstance(x, DistTensor):
        raise Unsupported("not a DistTensor")
    if x.dtype.kind not in "fc":
        x = EW["astype"](x, np.float64)
    nd = x.ndim
    if axis is None:
        if ord is None or (_is(ord, "f", "fro") and nd == 2) or (_num(ord, 2) and nd == 1):
            if nd == 1 and x.dtype.kind == "f" and not keepdims and not x._spec.has_partial():
                return EW["sqrt"](la.matmul(x, x))  # numpy's x.dot(x): one op, one product
            return EW["sqrt"](red.sum(_squares(x), None, keepdims))
        axis = tuple(range(nd))
    elif not isinstance(axis, tuple):
        try:
            axis = int(axis)
        except Exception:
            raise Unsupported("numpy's TypeError for the axis") from None
        axis = (axis,)
    if len(axis) == 1:
        return _vector_norm(x, ord, axis, keepdims)
    if len(axis) == 2:
        return _matrix_norm(x, ord, axis, keepdims)
    raise Unsupported("numpy's error for more than two axes")


def _is(ord, *names: str) -> bool:
    return isinstance(ord, str) and ord in names


def _num(ord, value: float) -> bool:
    return not isinstance(ord, str) and ord is not None and bool(ord == value)


def _vector_norm(x: DistTensor, ord, axis: tuple[int, ...], keepdims: bool) -> DistTensor:
    if isinstance(ord, str):
        raise Unsupported(f"numpy's error for the vector norm order {ord!r}")
    if _num(ord, _inf):
        return _max_or_zero(EW["abs"](x), axis, keepdims)
    if _num(ord, -_inf):
        return _min_nonempty(EW["abs"](x), axis, keepdims)
    if _num(ord, 0):
        nonzero = EW["astype"](EW["not_equal"](x, 0), np.empty(0, x.dtype).real.dtype)
        return red.sum(nonzero, axis, keepdims)
    if _num(ord, 1):
        return red.sum(EW["abs"](x), axis, keepdims)
    if ord is None or _num(ord, 2):
        return EW["sqrt"](red.sum(_squares(x), axis, keepdims))
    # numpy: absx **= ord (in place: absx keeps its dtype), then ret **= 1/ord in ret's dtype
    p = ord.item() if isinstance(ord, np.generic) else ord
    if not isinstance(p, (int, float)):
        raise Unsupported(f"a norm order of type {type(ord).__name__}")
    absx = EW["abs"](x)
    powered = EW["power"](absx, p)
    if powered.dtype != absx.dtype:
        powered = EW["astype"](powered, absx.dtype)
    ret = red.sum(powered, axis, keepdims)
    with np.errstate(divide="ignore"):
        return EW["power"](ret, np.reciprocal(p, dtype=ret.dtype))


def _matrix_norm(x: DistTensor, ord, axis: tuple, keepdims: bool) -> DistTensor:
    nd = x.ndim
    row, col = (normalize_axis_index(operator.index(a), nd) for a in axis)
    if row == col:
        raise ValueError("Duplicate axes given.")
    if ord is None or _is(ord, "fro", "f"):
        ret = EW["sqrt"](red.sum(_squares(x), (row, col)))
    elif isinstance(ord, str) or not any(_num(ord, v) for v in (1, -1, _inf, -_inf)):
        raise Unsupported(f"the matrix norm order {ord!r} (singular values, or numpy's error)")
    elif _num(ord, 1) or _num(ord, -1):
        s = red.sum(EW["abs"](x), row)
        c = col - 1 if col > row else col
        ret = _max_or_zero(s, c) if _num(ord, 1) else _min_nonempty(s, c)
    else:  # inf, -inf
        s = red.sum(EW["abs"](x), col)
        r = row - 1 if row > col else row
        ret = _max_or_zero(s, r) if _num(ord, _inf) else _min_nonempty(s, r)
    if keepdims:
        shape = list(x.shape)
        shape[row] = shape[col] = 1
        ret = sh.reshape(ret, tuple(shape))
    return ret


@implements(np.linalg.norm, name="norm")
def _np_norm(given):
    g = _only(given, "x", "ord", "axis", "keepdims")
    return norm(g["x"], g.get("ord"), g.get("axis"), g.get("keepdims", False))


# -- comparisons -------------------------------------------------------------------------------
def _array(v: Any) -> Any:
    """numpy's ``asanyarray`` for what is not a Python scalar, a DistTensor or a device array."""
    if isinstance(v, (int, float, complex, DistTensor)) or backend.is_device(v):
        return v
    return np.asanyarray(v)


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """``np.isclose``: elementwise and local where a and b are laid out alike (numpy's
    formula, so its dtypes and its NaN and inf rules).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([1.0, np.nan, 3.0]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.isclose(x, [1.0 + 1e-9, np.nan, 3.1], equal_nan=True).numpy()
    array([ True,  True, False])
    """
    if isinstance(rtol, DistTensor) or isinstance(atol, DistTensor):
        raise Unsupported("DistTensor tolerances")
    x, y = _array(a), _array(b)
    if not isinstance(x, DistTensor) and not isinstance(y, DistTensor):
        # arrays: numpy's isclose, or the device's (each converts its arguments as _array does)
        return backend.xp(y if backend.is_device(y) else x).isclose(a, b, rtol, atol, equal_nan)
    atol, rtol = _array(atol), _array(rtol)
    finite = (np.all(np.isfinite(backend.to_host(t))) for t in (atol, rtol))  # host values
    if not all(finite):
        raise Unsupported("non-finite tolerances (numpy's warning)")
    x, y, atol, rtol = _onto_device(x, y, atol, rtol)
    if (ydtype := getattr(y, "dtype", None)) is not None and ydtype.kind != "m":
        want = np.result_type(y, 1.0) if isinstance(y, np.ndarray) else np.result_type(ydtype, 1.0)
        if want != ydtype:
            on = isinstance(y, DistTensor) or backend.is_device(y)  # dt's astype, on the device
            y = EW["astype"](y, want) if on else np.asanyarray(y, want)
    elif isinstance(y, int):
        y = float(y)
    with np.errstate(invalid="ignore"):
        bound = EW["add"](atol, EW["multiply"](rtol, EW["abs"](y)))
        near = EW["less_equal"](EW["abs"](EW["subtract"](x, y)), bound)
        result = EW["logical_or"](EW["logical_and"](near, EW["isfinite"](y)), EW["equal"](x, y))
        if equal_nan:
            both = EW["logical_and"](EW["isnan"](x), EW["isnan"](y))
            result = EW["logical_or"](result, both)
    return result


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    """``np.allclose``: ``isclose`` where the data lies, then one all-reduce of a bool.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(4.0), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.allclose(x, np.arange(4.0) + 1e-9), dt.allclose(x, 0.0)
    (True, False)
    """
    return _all(isclose(a, b, rtol, atol, equal_nan))


def _onto_device(*values: Any) -> tuple:
    """``values`` with their host arrays copied onto the device of the first DistTensor among
    them where that is a device (the module docstring); as they are otherwise."""
    on = next((backend.of(v._local) for v in values if isinstance(v, DistTensor)), backend.NUMPY)
    if not on.device:
        return values
    return tuple(on.asarray(v) if isinstance(v, np.ndarray) else v for v in values)


def _as_array(a: Any) -> Any:
    return a if isinstance(a, DistTensor) or backend.is_device(a) else np.asarray(a)


def _all(t: Any) -> bool:
    """Whether every element of ``t`` is true, as a Python bool: a DistTensor's ``all`` (one
    all-reduce where it is split) read on every rank, a device's one element copied to the
    host; an array's own library's ``all``."""
    if isinstance(t, DistTensor):
        return builtins.bool(red.all(t))
    return builtins.bool(backend.to_host(backend.xp(t).all(t)))


def array_equal(a1, a2, equal_nan=False) -> bool:
    """``np.array_equal``: shapes compared locally, values elementwise, one all-reduce of a bool.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([1.0, np.nan]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.array_equal(x, x), dt.array_equal(x, [1.0, np.nan], equal_nan=True)
    (False, True)
    """
    try:
        a1, a2 = _onto_device(_as_array(a1), _as_array(a2))
    except Exception:
        return False
    if a1.shape != a2.shape:
        return False
    if not equal_nan:
        return _all(EW["equal"](a1, a2))
    if a1 is a2:
        return True
    if a1.dtype.kind not in "fc" and a2.dtype.kind not in "fc":  # cannot hold NaN
        return _all(EW["equal"](a1, a2))
    both = EW["logical_and"](EW["isnan"](a1), EW["isnan"](a2))
    return _all(EW["logical_or"](EW["equal"](a1, a2), both))


def array_equiv(a1, a2) -> bool:
    """``np.array_equiv``: shapes that broadcast, values equal; one all-reduce of a bool.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.ones((3, 2)), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.array_equiv(x, [1.0, 1.0]), dt.array_equiv(x, np.ones(3))
    (True, False)
    """
    try:
        a1, a2 = _onto_device(_as_array(a1), _as_array(a2))
    except Exception:
        return False
    try:
        np.broadcast_shapes(a1.shape, a2.shape)
    except ValueError:
        return False
    return _all(EW["equal"](a1, a2))


@implements(np.isclose, name="isclose")
def _np_isclose(given):
    return isclose(**given)


@implements(np.allclose, name="allclose")
def _np_allclose(given):
    return allclose(**given)


@implements(np.array_equal, name="array_equal")
def _np_array_equal(given):
    return array_equal(**given)


@implements(np.array_equiv, name="array_equiv")
def _np_array_equiv(given):
    return array_equiv(**given)


# -- counting ----------------------------------------------------------------------------------
def count_nonzero(a, axis=None, *, keepdims=False):
    """``np.count_nonzero``: local counts summed (a Partial(sum) over split axes); numpy's
    np.intp scalar for ``axis=None`` (one all-reduce of one element), else an np.intp tensor.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([[0, 1, 2], [3, 0, 0]]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.count_nonzero(x), dt.count_nonzero(x, axis=0).numpy()
    (np.int64(3), array([1, 1, 1]))
    """
    if not isinstance(a, DistTensor):
        if not backend.is_device(a):
            return np.count_nonzero(a, axis=axis, keepdims=keepdims)
        if keepdims:  # CuPy's count_nonzero has no keepdims
            raise backend.unsupported("count_nonzero(keepdims=True) of an array", backend.of(a))
        return backend.xp(a).count_nonzero(a, axis)
    if isinstance(axis, list):
        raise Unsupported("numpy's error for a list axis")
    nonzero = a if a.dtype == np.bool_ else EW["astype"](a, np.bool_)
    count = red.sum(nonzero, axis, keepdims)
    if count.dtype != np.intp:
        count = EW["astype"](count, np.intp)
    if axis is None and not keepdims:
        return count.numpy()[()]
    return count


@implements(np.count_nonzero, name="count_nonzero")
def _np_count_nonzero(given):
    g = _only(given, "a", "axis", "keepdims")
    return count_nonzero(g["a"], g.get("axis"), keepdims=g.get("keepdims", False))


# -- covariance --------------------------------------------------------------------------------
def cov(m, y=None, rowvar=True, bias=False, ddof=None, fweights=None, aweights=None, *, dtype=None):
    """``np.cov`` of the variables of ``m`` (rows, or columns with ``rowvar=False``): the
    mean, then the Gram product of the deviations, contracted over the observations. With the
    observations split the mean is one all-reduce of the variables' means and the result a
    Partial(sum) D x D, reduced when read; no data moves. ``y``, ``fweights`` and
    ``aweights`` take the fallback.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([[0.0, 2.0], [1.0, 1.0], [2.0, 0.0]]), dt.ProcessMesh([0]),
    ...                     [dt.Shard(0)])
    >>> dt.cov(x, rowvar=False).numpy()
    array([[ 1., -1.],
           [-1.,  1.]])
    """
    if y is not None or fweights is not None or aweights is not None:
        raise Unsupported("y=, fweights= or aweights=")
    if not isinstance(m, DistTensor):
        raise Unsupported("not a DistTensor")
    if ddof is not None and ddof != int(ddof):
        raise ValueError("ddof must be integer")
    if m.ndim > 2:
        raise ValueError("m has more than 2 dimensions")
    dtype = np.result_type(m.dtype, np.float64) if dtype is None else np.dtype(dtype)
    X = m if m.dtype == dtype else EW["astype"](m, dtype)
    obs = 1 if rowvar and m.ndim == 2 else 0  # the axis of the observations
    nvars = 1 if m.ndim < 2 else m.shape[1 - obs]
    nobs = m.shape[obs] if m.ndim else 1
    if nvars == 0:
        return _replicated(backend.constant(m, np.array([]).reshape(0, 0)), m)
    if ddof is None:
        ddof = 1 if bias == 0 else 0
    fact = nobs - ddof
    if fact <= 0:
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=3)
        fact = 0.0
    if m.ndim == 0:
        X = sh.reshape(X, (1,))
    d = EW["subtract"](X, red.mean(X, obs, keepdims=True))
    dc = EW["conjugate"](d) if d.dtype.kind == "c" else d
    if X.ndim == 1:
        c = la.matmul(d, dc)
    elif obs == 1:
        c = la.matmul(d, dc, trans_y=True)
    else:
        c = la.matmul(d, dc, trans_x=True)
    scale = float(np.true_divide(1, fact))  # a Python float: numpy scales in place (c's dtype)
    if not np.isfinite(scale):  # inf times the parts of a Partial is not inf times their sum
        c = _plain(c)
    c = EW["multiply"](c, scale)
    return sh.squeeze(c) if c.ndim and 1 in c.shape else c


def corrcoef(x, y=None, rowvar=True, *, dtype=None):
    """``np.corrcoef``: ``cov`` reduced once (the D x D all-reduce), then local: divided by
    the standard deviations on its diagonal and clipped to [-1, 1].

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([[0.0, 2.0], [1.0, 1.5], [2.0, 0.0]]), dt.ProcessMesh([0]),
    ...                     [dt.Shard(0)])
    >>> np.round(dt.corrcoef(x, rowvar=False).numpy(), 4)
    array([[ 1.    , -0.9608],
           [-0.9608,  1.    ]])
    """
    if y is not None:
        raise Unsupported("y=")
    if not isinstance(x, DistTensor):
        raise Unsupported("not a DistTensor")
    want = np.result_type(x.dtype, np.float64) if dtype is None else np.dtype(dtype)
    if want.kind == "c":
        raise Unsupported("complex (numpy clips the real and imaginary parts in place)")
    c = _plain(cov(x, rowvar=rowvar, dtype=dtype))
    if c.ndim == 0:
        return EW["divide"](c, c)
    if c.size == 0:
        return c
    # the diagonal (c is whole on every rank: local); not einsum("ii->i"), which has no gradient
    diagonal = backend.constant(c, np.eye(c.shape[0], dtype=bool))
    stddev = EW["sqrt"](red.sum(EW["multiply"](c, diagonal), 1))
    c = EW["divide"](c, sh.expand_dims(stddev, 1))
    c = EW["divide"](c, sh.expand_dims(stddev, 0))
    return EW["clip"](c, -1, 1)


def _replicated(value: np.ndarray, like: DistTensor) -> DistTensor:
    """``value`` (the same on every rank) as a Replicate tensor on ``like``'s mesh."""
    mesh = like.mesh
    return dtensor_from_local(value, mesh, [_R] * mesh.ndim, global_shape=value.shape)


@implements(np.cov, name="cov")
def _np_cov(given):
    return cov(**given)


@implements(np.corrcoef, name="corrcoef")
def _np_corrcoef(given):
    return corrcoef(**given)


# -- histograms --------------------------------------------------------------------------------
# Note [Histograms of split data]
#     A histogram's counts are sums over the elements, and numpy computes each element's bin
#     from the bin edges alone (it even counts in blocks of 65536 elements). So every rank
#     histograms its shard with the global edges and the counts are a Partial(sum) over the
#     mesh dims that split the data, reduced when read: exact for counts, float rounding
#     for weights. With integer bins and no range, the edges need the global min and max:
#     one all-reduce of two elements (the max and the "negated" min, -x for floats and ~x for
#     integers, both under max). Each rank then calls np.histogram on its shard with
#     range=(min, max), the very numpy scalars numpy's own call derives from the data, so the
#     edges and each element's bin are numpy's bit for bit. Non-finite data takes numpy's own
#     error through the fallback. On a device the (max, -min) pair is all-reduced in a device
#     buffer and its two elements copied to the host (the range is a host value, as numpy's
#     is); each rank counts with the device's ``histogram``, whose edges come from the same
#     range (CuPy's linspace: numpy's to rounding) and whose bins are decided by comparing
#     with them, as numpy's are. CuPy sums weights in float64 (or int64): the counts are cast
#     to numpy's type, the weights'.
def histogram(a, bins=10, range=None, density=None, weights=None):
    """``np.histogram`` (bins an int or edges, range, density, weights): local counts with the
    global edges (Note [Histograms of split data]). Returns (hist, bin_edges) as DistTensors:
    hist is Partial(sum) over the mesh dims that split ``a`` (reduced when read; Replicate
    with ``density``), bin_edges Replicate. String bins take the fallback.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([0.5, 1.0, 1.5, 4.0]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> h, e = dt.histogram(x, bins=2)
    >>> h.numpy(), e.numpy()
    (array([3, 1]), array([0.5 , 2.25, 4.  ]))
    """
    if not isinstance(a, DistTensor):
        raise Unsupported("not a DistTensor")
    if a.dtype.kind not in "iuf":
        raise Unsupported(f"a {a.dtype} input")
    if isinstance(bins, (str, DistTensor)) or isinstance(range, DistTensor):
        raise Unsupported("string bins (estimators need the data) or DistTensor bins/range")
    on = backend.of(a._local)
    if weights is not None:
        if not (isinstance(weights, DistTensor) or backend.is_device(weights)):
            a, weights = _onto_device(a, np.asarray(weights))
        w_on = backend.of(getattr(weights, "_local", weights))
        if w_on is not on:  # never moved silently between devices (Note [Array backends])
            raise backend.mixed("histogram", on, w_on)
    a = _plain(a)
    mesh, coord = a.mesh, a.mesh.get_coord(comm.get_rank())
    w = None
    if weights is not None:
        w = weights
        if w.shape != a.shape or w.dtype.kind not in "iufc":
            raise Unsupported("numpy's error for weights of another shape, or their dtype")
        if isinstance(w, DistTensor) and w.mesh != mesh:
            raise Unsupported("weights on another mesh")
        if not isinstance(w, DistTensor):
            w = _replicated(w, a)
        w = reshard(_plain(w), mesh, a.placements)
    if np.ndim(bins) == 0:
        try:
            nbins = operator.index(bins)
        except TypeError:
            raise Unsupported("numpy's error for the bins") from None
        if nbins < 1:
            raise Unsupported("numpy's error for bins < 1")
        if range is None:
            range = (0, 1) if a.size == 0 else _min_max(a, coord)
    elif np.ndim(bins) != 1:
        raise Unsupported("numpy's error for bins of more than one axis")
    elif on.device:
        bins = on.asarray(bins)  # the edges onto the device (the module docstring)
    xp = on.xp
    if coord is not None:
        local = a.to_local()
        hist, edges = xp.histogram(
            local, bins, range=range, weights=None if w is None else w.to_local()
        )
    else:  # a rank outside the mesh: numpy's dtypes on stand-ins
        hist, edges = xp.histogram(
            xp.zeros(0, a.dtype), bins, range, weights=None if w is None else xp.zeros(0, w.dtype)
        )
    if on.device:  # numpy's count type (Note [Histograms of split data])
        hist = hist.astype(np.intp if w is None else w.dtype, copy=False)
    pls = [Partial("sum") if p.is_shard() else _R for p in a.placements]
    counts = dtensor_from_local(hist, mesh, pls, global_shape=hist.shape)
    if density:
        counts = _plain(counts)
        if coord is not None:
            n = counts.to_local()
            db = xp.array(xp.diff(edges), float)
            counts = _replicated(n / db / n.sum(), a)
        else:
            counts = _replicated(xp.zeros(hist.shape), a)
    return counts, _replicated(edges, a)


def _min_max(a: DistTensor, coord) -> tuple[Any, Any]:
    """(a.min(), a.max()) as numpy scalars of a's dtype: one all-reduce of two elements over
    the mesh dims that split ``a`` (on a device, of a device buffer, then copied to the host);
    Unsupported (numpy's error) when one is not finite."""
    dtype = a.dtype
    flip = (lambda v: ~v) if dtype.kind in "iu" else (lambda v: -v)
    lowest = np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf
    local = a.to_local()
    enc = backend.xp(local).full(2, lowest, dtype)
    if coord is not None and local.size:
        enc[0], enc[1] = local.max(), flip(local.min())
        if dtype.kind == "f":  # NaN data (its min and max are NaN): +inf wins, and is refused
            enc[enc != enc] = np.inf
    pls = [Partial("max") if p.is_shard() else _R for p in a.placements]
    t = dtensor_from_local(enc, a.mesh, pls, global_shape=(2,))
    both = backend.to_host(reshard(t, a.mesh, [_R] * a.mesh.ndim).to_local())
    if coord is None:
        return dtype.type(0), dtype.type(1)
    hi, lo = both[0], flip(both[1])
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise Unsupported("numpy's error for a range that is not finite")
    return lo, hi


@implements(np.histogram, name="histogram")
def _np_histogram(given):
    return histogram(**given)


__all__ = [
    "allclose",
    "array_equal",
    "array_equiv",
    "corrcoef",
    "count_nonzero",
    "cov",
    "histogram",
    "isclose",
]
