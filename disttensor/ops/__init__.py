"""The op set, by family; every op goes through dispatch.apply (one path)."""

from __future__ import annotations

from . import (
    gradients,  # noqa: F401  (fills autograd.GRADIENTS)
    mutation,
)
from .elementwise import *  # noqa: F403
from .elementwise import __all__ as _ew
from .linalg import *  # noqa: F403
from .linalg import __all__ as _la
from .nn import *  # noqa: F403
from .nn import __all__ as _nn
from .reduction import *  # noqa: F403
from .reduction import __all__ as _red
from .shape import *  # noqa: F403
from .shape import __all__ as _sh

__all__ = [*_ew, *_la, *_red, *_sh, *_nn]

# -- numpy interop: np.exp(x), np.sum(x, axis=0), np.concatenate([a, b]) on DistTensors ---------
# Both tables are keyed by numpy's function objects (Note [numpy functions by identity] in
# ops/ndarray.py): a function of the same name elsewhere (np.emath.sqrt) is not dt's.
import inspect

import numpy as np

from ..dispatch import fallback as _fallback
from ..tensor import DistTensor
from . import ndarray, reduction
from .elementwise import OPS as _EW
from .linalg import matmul as _matmul

_NUMPY_NAMES = {"abs": "absolute", "mod": "remainder"}  # dt op -> numpy ufunc, where they differ
_UFUNCS = {}  # numpy ufunc -> the dt op of its calls
for _op_name, _op in _EW.items():
    _ufunc = getattr(np, _NUMPY_NAMES.get(_op_name, _op_name), None)
    if isinstance(_ufunc, np.ufunc):
        _UFUNCS.setdefault(_ufunc, _op)  # np.divide is np.true_divide: the first name wins
_REDUCE = {  # numpy ufunc -> the dt reduction of its .reduce
    np.add: reduction.sum,
    np.maximum: reduction.max,
    np.minimum: reduction.min,
    np.multiply: reduction.prod,
    np.logical_and: reduction.all,
    np.logical_or: reduction.any,
}


def _display(func) -> str:
    """``np.linalg.norm``-style name of a numpy function (its module where not top level)."""
    module = getattr(func, "__module__", None) or ""
    if module in ("numpy", "numpy._core.multiarray", "numpy._core.umath") or not module:
        return func.__name__
    return f"np{module[5:]}.{func.__name__}" if module.startswith("numpy.") else func.__name__


def array_ufunc(ufunc, method, inputs, kwargs):
    """``__array_ufunc__``: ufunc calls and reductions through the op set, else the fallback;
    ``out=`` (a DistTensor or a numpy array) is written as numpy does (ops/mutation.py), and
    ``ufunc.at`` writes into a DistTensor in place."""
    if kwargs.get("out") is not None:
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
    kwargs.pop("out", None)
    if method == "__call__" and not kwargs:
        op = _UFUNCS.get(ufunc)
        if op is not None:
            return op(*inputs)
        if ufunc is np.matmul:
            return _matmul(*inputs)
    if method == "reduce" and len(inputs) == 1:
        ours = _REDUCE.get(ufunc)
        kw = dict(kwargs)
        axis = kw.pop("axis", 0)
        keepdims = kw.pop("keepdims", False)
        if ours is not None and not kw:
            return ours(inputs[0], axis, keepdims)
    if method == "at" and isinstance(inputs[0], DistTensor):
        return ndarray.ufunc_at(ufunc, inputs, kwargs)
    return _fallback(f"{ufunc.__name__}.{method}", getattr(ufunc, method), inputs, kwargs)


def array_function(func, args, kwargs):
    """``__array_function__``: the numpy functions dt implements, looked up by identity in
    ``ndarray.NUMPY_TABLE`` (``np.shape``/``np.ndim``/``np.size``/``np.zeros_like``/... read
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
    entry = ndarray.NUMPY_TABLE.get(func)
    if entry is not None:
        try:
            return entry.impl(*args, **kwargs)
        except ndarray.Unsupported:
            pass  # numpy arguments we do not take (dtype=, order=, ...): the fallback is exact
        except TypeError:
            if entry.writes:
                raise
    return _fallback(_display(func), func, args, kwargs)


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
