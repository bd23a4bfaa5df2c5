"""numpy interop: numpy's ufuncs and functions called on DistTensors (``__array_ufunc__``,
``__array_function__``), looked up by the function objects themselves.

Note [numpy functions by identity]
    ``__array_function__`` receives numpy's function object. NUMPY_TABLE maps each function
    dt implements to its implementation; every other function, however it is named, takes
    the replicate fallback, which computes numpy's own result: ``np.emath.sqrt`` of negative
    numbers is complex there, where dt's (real) ``sqrt`` would give NaN. An implementation
    takes numpy's signature and raises ``Unsupported`` for arguments it does not handle
    (``dtype=``, ``order='F'``, ...), which sends the call to the fallback too, accounted
    with those arguments as the reason (Note [Communication outside rules] in accounting.py).
    ``out=`` is written as numpy does (ops/mutation.py); functions that write into their
    argument (``np.copyto``, ``np.add.at``, ...) write into the DistTensor.

>>> import numpy as np, disttensor as dt
>>> x = dt.shard_tensor(np.array([-4.0, 9.0]), dt.ProcessMesh([0]), [dt.Shard(0)])
>>> np.emath.sqrt(x).numpy()  # numpy's complex result, not dt.sqrt's NaN
array([0.+2.j, 3.+0.j])
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import creation
from ..dispatch import binary, fallback
from ..tensor import DistTensor, name_unnamed
from . import linalg as la
from . import mutation
from . import reduction as red
from . import shape as sh
from .elementwise import NUMPY_ONLY_OPS, DtypeRefused, _Checked
from .elementwise import OPS as EW
from .elementwise import astype as _astype
from .elementwise import clip as _clip
from .ndarray import (
    Unsupported,
    _on_copy,
    argpartition,
    argsort,
    copy,
    mT,
    partition,
    put,
    round_,
    sort,
    take,
)


# -- numpy functions dt implements (Note [numpy functions by identity]) ------------------------
class Entry(NamedTuple):
    """A numpy function's dt implementation: ``name`` is the dt op it runs (functions that
    share one are aliases); ``writes``: it writes into its first argument (never re-run
    through the fallback, which would write a gathered copy)."""

    name: str
    impl: Callable[..., Any]
    writes: bool = False


NUMPY_TABLE: dict[Callable, Entry] = {}
_NEUTRAL = {"dtype": None, "out": None, "where": True, "subok": None, "device": None}


def implements(*funcs: Callable, name: str, writes: bool = False):
    """Decorator: ``impl(given)`` implements the numpy functions ``funcs``; it receives the
    arguments of the call by numpy's parameter names (only those given)."""

    def deco(impl):
        for func in funcs:
            sig = inspect.signature(func)
            plain = all(
                p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()
            )
            names = tuple(sig.parameters)
            seen: set[tuple] = set()  # call shapes that bound (below)

            def run(*args, _sig=sig, _plain=plain, _names=names, _seen=seen, **kwargs):
                # Signature.bind costs microseconds; a call of a shape (positional count and
                # keyword names) that bound once binds the same way: positionals to the first
                # parameters, keywords by name (functions without *args and **kwargs)
                shape = (len(args), *kwargs)
                if shape in _seen:
                    given = dict(zip(_names, args))
                    given.update(kwargs)
                    return impl(given)
                try:
                    given = _sig.bind(*args, **kwargs).arguments
                except TypeError as e:
                    raise Unsupported(str(e)) from None
                if _plain:
                    _seen.add(shape)
                return impl(dict(given))

            NUMPY_TABLE[func] = Entry(name, run, writes)
        return impl

    return deco


def _only(given: dict, *takes: str) -> dict:
    """``given`` when every argument outside ``takes`` has numpy's neutral value (dtype=None,
    where=True, ...), else Unsupported."""
    for k, v in given.items():
        if k in takes:
            continue
        if k in ("subok", "optimize") or (k in _NEUTRAL and v is _NEUTRAL[k]):
            continue  # subok: a DistTensor is its own type; optimize: einsum's speed only
        if k == "device" and v == "cpu":
            continue
        raise Unsupported(f"{k}={v!r}")
    return given


def _reduction(name: str, *funcs: Callable) -> None:
    ours = getattr(red, name)
    args = ("a", "axis", "keepdims", *(("ddof",) if name in ("var", "std") else ()))

    @implements(*funcs, name=name)
    def impl(given):
        g = _only(given, *args)
        extra = (g.get("ddof", 0),) if name in ("var", "std") else ()
        return ours(g["a"], g.get("axis"), *extra, g.get("keepdims", False))


for _name in ("sum", "mean", "prod", "all", "any", "argmax", "argmin", "var", "std"):
    _reduction(_name, getattr(np, _name))
_reduction("max", np.max, np.amax)
_reduction("min", np.min, np.amin)


@implements(np.round, np.around, name="round")
def _round(given):
    g = _only(given, "a", "decimals")
    return round_(g["a"], g.get("decimals", 0))


@implements(np.clip, name="clip")
def _np_clip(given):
    g = _only(given, "a", "a_min", "a_max", "min", "max")
    if ("a_min" in g and "min" in g) or ("a_max" in g and "max" in g):
        raise Unsupported("numpy's error for both a_min and min")
    lo, hi = g.get("a_min", g.get("min")), g.get("a_max", g.get("max"))
    return _clip(g["a"], lo, hi)


@implements(np.real, name="real")
def _np_real(given):
    return EW["real"](given["val"])


@implements(np.imag, name="imag")
def _np_imag(given):
    return EW["imag"](given["val"])


@implements(np.astype, name="astype")
def _np_astype(given):
    g = _only(given, "x", "dtype", "copy")
    x, dtype = g["x"], np.dtype(g["dtype"])
    if not isinstance(x, DistTensor):
        raise Unsupported("not a DistTensor")
    return x if dtype == x.dtype and not g.get("copy", True) else _astype(x, dtype)


@implements(np.dot, name="dot")
def _np_dot(given):
    g = _only(given, "a", "b")
    return la.dot(g["a"], g["b"])


@implements(np.einsum, name="einsum")
def _np_einsum(given):
    ops = given.get("operands", ())
    if given.get("kwargs") or not ops or not isinstance(ops[0], str):
        raise Unsupported("dtype=/order=/casting= or the interleaved form")
    return la.einsum(*ops)


@implements(np.outer, name="outer")
def _np_outer(given):
    g = _only(given, "a", "b")
    return la.outer(g["a"], g["b"])


@implements(np.linalg.matmul, name="matmul")
def _np_matmul(given):
    return la.matmul(given["x1"], given["x2"])


@implements(np.matrix_transpose, np.linalg.matrix_transpose, name="matrix_transpose")
def _np_matrix_transpose(given):
    x = given["x"]
    if not isinstance(x, DistTensor) or x.ndim < 2:
        raise Unsupported("numpy's error for ndim < 2")
    return mT(x)


# shape ops
@implements(np.reshape, name="reshape")
def _np_reshape(given):
    g = _only(given, "a", "shape", "order", "copy")
    if g.get("order", "C") != "C" or g.get("copy") is False:
        raise Unsupported("order='F'/'A' or copy=False")
    out = sh.reshape(g["a"], g["shape"])
    return copy(out) if g.get("copy") else out


@implements(np.transpose, name="transpose")
def _np_transpose(given):
    return sh.transpose(given["a"], given.get("axes"))


@implements(np.swapaxes, name="swapaxes")
def _np_swapaxes(given):
    return sh.swapaxes(given["a"], given["axis1"], given["axis2"])


@implements(np.expand_dims, name="expand_dims")
def _np_expand_dims(given):
    return sh.expand_dims(given["a"], given["axis"])


@implements(np.squeeze, name="squeeze")
def _np_squeeze(given):
    return sh.squeeze(given["a"], given.get("axis"))


@implements(np.broadcast_to, name="broadcast_to")
def _np_broadcast_to(given):
    return sh.broadcast_to(given["array"], given["shape"])


def _joining(func: Callable, ours: Callable) -> None:
    """np.concatenate/np.stack: the arrays and the axis; other casting goes to numpy."""

    @implements(func, name=func.__name__)
    def impl(given):
        g = _only(given, "arrays", "axis")
        if given.get("casting", "same_kind") != "same_kind":
            raise Unsupported("casting=")
        return ours(g["arrays"], g.get("axis", 0))


_joining(np.concatenate, sh.concatenate)
_joining(np.stack, sh.stack)


@implements(np.split, name="split")
def _np_split(given):
    return sh.split(given["ary"], given["indices_or_sections"], given.get("axis", 0))


@implements(np.tile, name="tile")
def _np_tile(given):
    return sh.tile(given["A"], given["reps"])


@implements(np.repeat, name="repeat")
def _np_repeat(given):
    return sh.repeat(given["a"], given["repeats"], given.get("axis"))


@implements(np.ravel, name="ravel")
def _np_ravel(given):
    if given.get("order", "C") not in ("C", "K", "A"):
        raise Unsupported("order='F'")
    return sh.ravel(given["a"])


# along one axis (ops/ndarray.py takes numpy's signatures as they are)
for _func, _impl in (
    (np.sort, sort),
    (np.argsort, argsort),
    (np.partition, partition),
    (np.argpartition, argpartition),
    (np.take, take),
):
    implements(_func, name=_func.__name__)(lambda given, impl=_impl: impl(**given))


# np.diagonal, np.trace, np.diag, np.where, ...: ops/layout.py


# creation and copies: no communication
@implements(np.copy, name="copy")
def _np_copy(given):
    a = given["a"]
    if not isinstance(a, DistTensor):
        raise Unsupported("not a DistTensor")
    return copy(a)


def _like(func: Callable, ours: Callable, first: str) -> None:
    @implements(func, name=func.__name__)
    def impl(given):
        a = given.pop(first)
        if not isinstance(a, DistTensor):
            raise Unsupported("not a DistTensor")
        return ours(a, **given)


_like(np.zeros_like, creation.zeros_like, "a")
_like(np.ones_like, creation.ones_like, "a")
_like(np.full_like, creation.full_like, "a")
_like(np.empty_like, creation.empty_like, "prototype")


# metadata: no communication
@implements(np.shape, name="shape")
def _np_shape(given):
    a = given["a"]
    if not isinstance(a, DistTensor):
        raise Unsupported("not a DistTensor")
    return a.shape


@implements(np.ndim, name="ndim")
def _np_ndim(given):
    a = given["a"]
    if not isinstance(a, DistTensor):
        raise Unsupported("not a DistTensor")
    return a.ndim


@implements(np.size, name="size")
def _np_size(given):
    a, axis = given["a"], given.get("axis")
    if not isinstance(a, DistTensor):
        raise Unsupported("not a DistTensor")
    if axis is None:
        return a.size
    axes = axis if isinstance(axis, tuple) else (axis,)
    return math.prod(a.shape[normalize_axis_index(operator.index(i), a.ndim)] for i in axes)


def _dtype_of(v: Any) -> Any:
    return v.dtype if isinstance(v, DistTensor) else v


@implements(np.result_type, name="result_type")
def _np_result_type(given):
    return np.result_type(*map(_dtype_of, given.get("arrays_and_dtypes", ())))


@implements(np.can_cast, name="can_cast")
def _np_can_cast(given):
    return np.can_cast(
        _dtype_of(given["from_"]), _dtype_of(given["to"]), given.get("casting", "safe")
    )


@implements(np.iscomplexobj, name="iscomplexobj")
def _np_iscomplexobj(given):
    return np.iscomplexobj(np.empty(0, _dtype_of(given["x"])))


@implements(np.isrealobj, name="isrealobj")
def _np_isrealobj(given):
    return np.isrealobj(np.empty(0, _dtype_of(given["x"])))


# functions that write into their first argument: into the DistTensor, in place
@implements(np.copyto, name="copyto", writes=True)
def _np_copyto(given):
    dst = given["dst"]
    if not isinstance(dst, DistTensor):
        raise Unsupported("a numpy dst: the fallback writes into it")
    casting, where = given.get("casting", "same_kind"), given.get("where", True)
    mutation.write_out("copyto", given["src"], dst, casting, where)


@implements(np.put, name="put", writes=True)
def _np_put(given):
    a = given["a"]
    if not isinstance(a, DistTensor):
        raise Unsupported("a numpy target: the fallback writes into it")
    put(a, given["ind"], given["v"], given.get("mode", "raise"))


def _masked(func: Callable, target: str, mask: str, values: str) -> None:
    """putmask/place: a scalar value is ``x[mask] = value`` (local for a mask laid out like
    x); other values are written by numpy into the gathered value, which is assigned back."""

    @implements(func, name=func.__name__, writes=True)
    def impl(given):
        x = given[target]
        if not isinstance(x, DistTensor):
            raise Unsupported("a numpy target: the fallback writes into it")
        m, v = given[mask], given[values]
        if np.ndim(v) == 0 and not isinstance(v, DistTensor) and np.shape(m) == x.shape:
            mdtype = m.dtype if isinstance(m, DistTensor) else np.asarray(m).dtype
            if mdtype == np.bool_:
                mutation.setitem(x, m, v)
                return
        _write_back(func, x, given)


_masked(np.putmask, "a", "mask", "values")
_masked(np.place, "arr", "mask", "vals")


def _write_back(func: Callable, x: DistTensor, given: dict) -> None:
    """numpy's ``func`` writes into the gathered value of ``x`` (its first argument), which
    is then written into ``x`` (aliases see it)."""
    mutation.check_writable(x, None, func.__name__)
    args = list(given.values())
    new = fallback(func.__name__, _on_copy(func), tuple(args), {})
    mutation.assign(x, new)


def _gathered_writer(func: Callable, target: str) -> None:
    @implements(func, name=func.__name__, writes=True)
    def impl(given):
        if not isinstance(given[target], DistTensor):
            raise Unsupported("a numpy target: the fallback writes into it")
        _write_back(func, given[target], given)


_gathered_writer(np.fill_diagonal, "a")
_gathered_writer(np.put_along_axis, "arr")


def ufunc_at(ufunc: np.ufunc, inputs: tuple, kwargs: dict) -> None:
    """``np.add.at(x, indices, values)`` on a DistTensor ``x``: numpy's unbuffered write on
    the gathered value, assigned back into ``x`` (aliases see it)."""
    x = inputs[0]
    mutation.check_writable(x, None, f"{ufunc.__name__}.at")
    new = fallback(f"{ufunc.__name__}.at", _on_copy(ufunc.at), inputs, kwargs)
    mutation.assign(x, new)


def implemented_by(func: Any) -> str | None:
    """The dt op a numpy function or ufunc runs on DistTensors, None for the fallback."""
    if func is np.matmul:  # a ufunc with a function of its own (linalg.matmul)
        return "matmul"
    if isinstance(func, np.ufunc):
        op = _UFUNCS.get(func)
        if op is None:
            return func.__name__ if func in _GUFUNCS else None
        return op.name
    entry = NUMPY_TABLE.get(func)
    return None if entry is None else entry.name


# Both tables are keyed by numpy's function objects (Note [numpy functions by identity]): a
# function of the same name elsewhere (np.emath.sqrt) is not dt's. numpy's aliases of a ufunc
# (np.acos, np.bitwise_not, np.pow, np.conj, ...) are the ufunc itself: the same op.

_NUMPY_NAMES = {"abs": "absolute", "mod": "remainder"}  # dt op -> numpy ufunc, where they differ
_UFUNCS = {}  # numpy ufunc -> the dt op of its calls
for _op_name, _op in {**EW, **NUMPY_ONLY_OPS}.items():
    _ufunc = getattr(np, _NUMPY_NAMES.get(_op_name, _op_name), None)
    if isinstance(_ufunc, np.ufunc):
        _UFUNCS.setdefault(_ufunc, _op)  # np.divide is np.true_divide: the first name wins
_REDUCE = {  # numpy ufunc -> the dt reduction of its .reduce
    np.add: red.sum,
    np.maximum: red.max,
    np.minimum: red.min,
    np.multiply: red.prod,
    np.logical_and: red.all,
    np.logical_or: red.any,
}
_BOOL_REDUCE = {np.bitwise_and: red.all, np.bitwise_or: red.any}  # .reduce of bool tensors
# numpy ufunc -> the dt scan of its .accumulate (ops/scan.py, which imports this module), with
# numpy's dtypes
_ACCUMULATE = {np.add: "cumsum", np.multiply: "cumprod"}


# -- gufuncs with a core dimension: einsum ---------------------------------------------------
def _vecdot(x1, x2):
    """``np.vecdot(x1, x2)``: sum(conj(x1) * x2) over the last axis, batch axes broadcast."""
    return la.einsum("...i,...i->...", _conj(x1), x2)


def _matvec(x1, x2):
    """``np.matvec(x1, x2)``: (..., m, n) matrices times (..., n) vectors."""
    return la.einsum("...mn,...n->...m", x1, x2)


def _vecmat(x1, x2):
    """``np.vecmat(x1, x2)``: conj of (..., n) vectors times (..., n, m) matrices."""
    return la.einsum("...n,...nm->...m", _conj(x1), x2)


def _conj(x):
    return EW["conjugate"](x) if x.dtype.kind == "c" else x


_GUFUNCS = {np.vecdot: _vecdot, np.matvec: _matvec, np.vecmat: _vecmat}


def _gufunc_call(ufunc: np.ufunc, inputs: tuple, kwargs: dict) -> Any:
    """np.vecdot/matvec/vecmat as einsum (whose rule splits batch axes and contracts a split
    core axis into a Partial sum), or None for the fallback: operands that are not arrays or
    DistTensors, keyword arguments (``axes=``; ``axis=-1`` of vecdot is its default), and
    shapes numpy refuses (so the fallback raises numpy's own error)."""
    kw = dict(kwargs)
    if ufunc is np.vecdot and kw.get("axis", -1) == -1:
        kw.pop("axis", None)
    if kw or len(inputs) != 2 or not all(isinstance(a, (DistTensor, np.ndarray)) for a in inputs):
        return None
    sx, sy = inputs[0].shape, inputs[1].shape
    core = _CORE[ufunc]  # (core axes of x1, of x2, the contracted axis in each)
    if len(sx) < core[0] or len(sy) < core[1] or sx[core[2]] != sy[core[3]]:
        return None
    try:
        np.broadcast_shapes(sx[: len(sx) - core[0]], sy[: len(sy) - core[1]])
    except ValueError:
        return None
    return _GUFUNCS[ufunc](*inputs)


_CORE = {np.vecdot: (1, 1, -1, -1), np.matvec: (2, 1, -1, -1), np.vecmat: (1, 2, -1, -2)}


def _display(func) -> str:
    """``np.linalg.norm``-style name of a numpy function (its module where not top level)."""
    module = getattr(func, "__module__", None) or ""
    if module in ("numpy", "numpy._core.multiarray", "numpy._core.umath") or not module:
        return func.__name__
    return f"np{module[5:]}.{func.__name__}" if module.startswith("numpy.") else func.__name__


def array_ufunc(ufunc, method, inputs, kwargs):
    """``__array_ufunc__``: ufunc calls and methods through the op set, else the fallback;
    ``out=`` (a DistTensor or a numpy array) is written as numpy does (ops/mutation.py).

    * ``__call__``: every ufunc's op (Note [numpy's ufuncs] in ops/elementwise.py), np.matmul's
      and the gufuncs np.vecdot, np.matvec and np.vecmat as dt.einsum; keyword arguments
      (``dtype=``, ``where=``, ``casting=``, ...) take the fallback;
    * ``reduce``: np.add, np.multiply, np.maximum, np.minimum, np.logical_and and
      np.logical_or as dt.sum, dt.prod, dt.max, dt.min, dt.all and dt.any, and
      np.bitwise_and/np.bitwise_or of bool tensors as dt.all/dt.any (``axis=`` and
      ``keepdims=``); every other ufunc's reduce takes the fallback;
    * ``accumulate``: np.add and np.multiply as dt.cumsum and dt.cumprod along ``axis`` (0 by
      default; the same dtypes as numpy's); the others take the fallback;
    * ``outer``: ``f.outer(a, b)`` of DistTensors and arrays is ``f(a[..., None, ...], b)``
      (as numpy computes it), the op's pointwise rule on a reshaped ``a``: ``a``'s axes keep
      their splits, ``b``'s too where no mesh dim splits both; scalars, keyword arguments and
      gufuncs take the fallback;
    * ``reduceat``: the fallback;
    * ``at``: writes into a DistTensor in place (numpy's unbuffered write on the gathered
      value, assigned back: ``ufunc_at``).

    The fallback gathers the inputs and computes numpy's own result (or raises numpy's own
    error) on every rank, counted (Note [Communication outside rules])."""
    if kwargs and kwargs.get("out") is not None:
        kwargs = dict(kwargs)
        out = kwargs.pop("out")
        outs = out if isinstance(out, tuple) else (out,)
        where = kwargs.pop("where", True)
        casting = kwargs.pop("casting", "same_kind" if method == "__call__" else "unsafe")
        result = array_ufunc(ufunc, method, inputs, kwargs)
        results = result if isinstance(result, tuple) else (result,)
        for r, o in zip(results, outs):
            mutation.write_out(ufunc.__name__, r, o, casting, where)
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out
    if kwargs:
        kwargs.pop("out", None)
    if method == "__call__":  # np.exp(x), np.maximum(x, 1): the op's call
        op = _UFUNCS.get(ufunc) or (la.OPS["matmul"] if ufunc is np.matmul else None)
        if op is not None and not kwargs:
            if len(inputs) != 2:
                return op(*inputs)
            if type(op) is _Checked:  # numpy's dtype rules first, as its call makes them
                op.check(inputs, {})
            return binary(op, *inputs)  # two operands as the operators take them
    name = f"{ufunc.__name__}.{method}"
    reason = None  # the fallback's: no dt op, or arguments it does not take
    if method == "__call__":
        name = ufunc.__name__
        if op is not None:
            reason = _not_taken(kwargs)
        if ufunc in _GUFUNCS:
            result = _gufunc_call(ufunc, inputs, kwargs)
            if result is not None:
                return result
            if kwargs:
                reason = _not_taken(kwargs)
    if method == "reduce" and len(inputs) == 1:
        ours = _REDUCE.get(ufunc)
        if ours is None and getattr(inputs[0], "dtype", None) == np.bool_:
            ours = _BOOL_REDUCE.get(ufunc)
        kw = dict(kwargs)
        axis = kw.pop("axis", 0)
        keepdims = kw.pop("keepdims", False)
        if ours is not None and not kw:
            return ours(inputs[0], axis, keepdims)
        if ours is not None:
            reason = _not_taken(kw)
    if method == "accumulate" and len(inputs) == 1 and ufunc in _ACCUMULATE:
        x, kw = inputs[0], dict(kwargs)
        axis = kw.pop("axis", 0)
        if isinstance(x, DistTensor) and x.ndim and isinstance(axis, (int, np.integer)) and not kw:
            from . import scan

            return getattr(scan, _ACCUMULATE[ufunc])(x, axis)
        if kw:
            reason = _not_taken(kw)
    if method == "outer" and len(inputs) == 2 and ufunc.nin == 2:
        op = _UFUNCS.get(ufunc)
        a, b = inputs
        arrays = all(isinstance(v, (DistTensor, np.ndarray)) for v in inputs)
        if op is not None and arrays and not kwargs:
            shape = tuple(a.shape) + (1,) * b.ndim
            return op(sh.reshape(a, shape) if isinstance(a, DistTensor) else a.reshape(shape), b)
        if op is not None and kwargs:
            reason = _not_taken(kwargs)
    if method == "at" and isinstance(inputs[0], DistTensor):
        return ufunc_at(ufunc, inputs, kwargs)
    if reason is None:
        return fallback(name, getattr(ufunc, method), inputs, kwargs)
    return fallback(name, getattr(ufunc, method), inputs, kwargs, reason)


def _not_taken(given: Any) -> str:
    """The fallback's reason when dt has the op but not these arguments (Note [numpy
    functions by identity])."""
    what = ", ".join(f"{k}=" for k in given) if isinstance(given, dict) else str(given)
    return f"arguments dt does not take ({what}): inputs gathered, computed whole on every rank"


def array_function(func, args, kwargs):
    """``__array_function__``: the numpy functions dt implements, looked up by identity in
    ``NUMPY_TABLE`` (``np.shape``/``np.ndim``/``np.size``/``np.zeros_like``/... read
    metadata only); every other function, and arguments an implementation does not take,
    go to the counted replicate fallback (numpy's own result)."""
    pos = _out_position(func)
    if pos is not None and len(args) > pos and args[pos] is not None:  # np.cumsum(x, 0, None, o)
        args, kwargs = _out_by_keyword(func, args, kwargs)
    if kwargs.get("out") is not None:  # computed without it, then written as numpy does
        kwargs = dict(kwargs)
        out = kwargs.pop("out")
        result = array_function(func, args, kwargs)
        if func is np.dot and result.dtype != out.dtype:
            raise ValueError(
                "output array is not acceptable (must have the right datatype, number of "
                "dimensions, and be a C-Array)"
            )
        return mutation.write_out(func.__name__, result, out, "unsafe")
    entry = NUMPY_TABLE.get(func)
    if entry is not None:
        try:
            out = entry.impl(*args, **kwargs)
        except Unsupported as e:  # numpy arguments we do not take (dtype=, order=, ...)
            out = fallback(_display(func), func, args, kwargs, _not_taken(e))
        except TypeError as e:
            if entry.writes or isinstance(e, DtypeRefused):
                raise
            out = fallback(_display(func), func, args, kwargs, _not_taken(e))
    else:
        out = fallback(_display(func), func, args, kwargs)
    # Note [Lineage names the tensor] in tensor.py: what dispatch did not make, the call names
    return name_unnamed(out, func.__name__, args, kwargs)


_OUT_AT: dict = {}  # numpy function -> index of a positional ``out`` parameter, or None


def _out_position(func) -> int | None:
    try:
        return _OUT_AT[func]
    except KeyError:
        pass
    pos = None
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        params = []
    for i, p in enumerate(params):
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        if p.name == "out":
            pos = i
    _OUT_AT[func] = pos
    return pos


def _out_by_keyword(func, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with a positionally given ``out`` passed by keyword instead (so that it is
    written as numpy does, never handed to the fallback as a value)."""
    bound = inspect.signature(func).bind(*args, **kwargs)
    out = bound.arguments.pop("out")
    return bound.args, {**bound.kwargs, "out": out}


__all__: list[str] = []  # reached as DistTensor methods and through __array_function__
