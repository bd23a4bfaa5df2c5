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
import numpy as np

from ..dispatch import fallback as _fallback
from .elementwise import OPS as _EW

_UFUNC_NAMES = {"absolute": "abs", "true_divide": "divide", "remainder": "mod"}
_REDUCE = {
    "add": "sum",
    "maximum": "max",
    "minimum": "min",
    "multiply": "prod",
    "logical_and": "all",
    "logical_or": "any",
}
_FUNCS = {name: globals()[name] for name in __all__}


def array_ufunc(ufunc, method, inputs, kwargs):
    """``__array_ufunc__``: ufunc calls and reductions through the op set, else the fallback;
    ``out=`` (a DistTensor or a numpy array) is written as numpy does (ops/mutation.py)."""
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
    name = _UFUNC_NAMES.get(ufunc.__name__, ufunc.__name__)
    if method == "__call__" and not kwargs and name in _EW:
        return _EW[name](*inputs)
    if method == "__call__" and not kwargs and ufunc is np.matmul:
        return _FUNCS["matmul"](*inputs)
    if method == "reduce" and ufunc.__name__ in _REDUCE and len(inputs) == 1:
        kw = dict(kwargs)
        axis = kw.pop("axis", 0)
        keepdims = kw.pop("keepdims", False)
        if not kw:
            return _FUNCS[_REDUCE[ufunc.__name__]](inputs[0], axis, keepdims)
    return _fallback(f"{ufunc.__name__}.{method}", getattr(ufunc, method), inputs, kwargs)


def array_function(func, args, kwargs):
    """``__array_function__``: numpy functions with a dt op of the same name use it;
    ``np.shape``/``np.ndim``/``np.size`` read the global metadata (no communication)."""
    name = func.__name__
    if kwargs.get("out") is not None:  # computed without it, then written as numpy does
        kwargs = dict(kwargs)
        out = kwargs.pop("out")
        result = array_function(func, args, kwargs)
        if func is np.dot and result.dtype != out.dtype:
            raise ValueError(
                "output array is not acceptable (must have the right datatype, number of "
                "dimensions, and be a C-Array)"
            )
        return mutation.write_out(name, result, out, "unsafe")
    if name in ("shape", "ndim", "size") and len(args) == 1 and not kwargs:
        return getattr(args[0], name)
    ours = _FUNCS.get(name)
    if ours is not None:
        try:
            return ours(*args, **kwargs)
        except TypeError:
            pass  # numpy arguments we do not take (out=, dtype=, ...): the fallback is exact
    return _fallback(name, func, args, kwargs)
