"""Which dtypes a numpy kernel computes in: a float32 program must compute in float32.

``computed_dtypes(fn, *arrays)`` runs ``fn`` on views of ``arrays`` whose type reports every
ufunc call (operators, reductions and matmul are ufuncs too) and returns the dtypes of every
array those calls produced or took (numpy arrays and scalars; Python scalars take the other
operand's dtype under NEP 50). A kernel that promotes a float32 input to float64 anywhere (a
0-d int64 exponent under NEP 50, ``np.float64`` constants, a float64 ``out=`` buffer, an
in-place operation on a float32 buffer with a float64 operand, which computes in float64 and
casts back) shows float64 among them. A kernel that drops the view type before computing
(``np.asarray``) reports nothing, so the helper also returns how many calls it saw: a check
that saw none checked nothing.

>>> import numpy as np
>>> x = np.ones(3, np.float32)
>>> kinds, calls = computed_dtypes(lambda a: a * 2.0 + 1, x)
>>> sorted(map(str, kinds)), calls
(['float32'], 2)
>>> sorted(map(str, computed_dtypes(lambda a: a * np.float64(2), x)[0]))
['float32', 'float64']
>>> sorted(map(str, computed_dtypes(lambda a: np.multiply(a, np.float64(2), out=a), x)[0]))
['float32', 'float64']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class _Traced(np.ndarray):
    """An ndarray view whose ufunc calls are recorded in ``_Traced.log``: per call the dtypes
    it took and produced."""

    log: list[list[np.dtype]] | None = None

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        plain = tuple(a.view(np.ndarray) if isinstance(a, _Traced) else a for a in inputs)
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(a.view(np.ndarray) if isinstance(a, _Traced) else a for a in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        results = result if isinstance(result, tuple) else (result,)
        if _Traced.log is not None:
            # what the call took (a float64 operand makes a float64 loop) and produced
            took = [a.dtype for a in plain if isinstance(a, (np.ndarray, np.generic))]
            made = [np.dtype(r.dtype) for r in results if getattr(r, "dtype", None) is not None]
            _Traced.log.append(took + made)
        if out is not None:  # numpy's contract: the out arrays themselves come back
            return out if isinstance(result, tuple) else out[0]
        return tuple(_wrap(r) for r in results) if isinstance(result, tuple) else _wrap(result)


def _wrap(r: Any) -> Any:
    return r.view(_Traced) if type(r) is np.ndarray else r


def computed_dtypes(fn: Callable[..., Any], *arrays: Any) -> tuple[set[np.dtype], int]:
    """(the dtypes of every ufunc operand and result while ``fn(*arrays)`` ran, the number of
    calls); ndarray arguments are passed as recording views, others as they are."""
    args = [a.view(_Traced) if isinstance(a, np.ndarray) else a for a in arrays]
    _Traced.log = []
    try:
        fn(*args)
        seen = _Traced.log
    finally:
        _Traced.log = None
    return {d for call in seen for d in call}, len(seen)


def assert_float32_only(fn: Callable[..., Any], *arrays: Any, least: int = 1) -> None:
    """Assert that ``fn`` on float32 ``arrays`` computes no float64 array, having made at least
    ``least`` ufunc calls (so the check saw the computation)."""
    kinds, calls = computed_dtypes(fn, *arrays)
    assert calls >= least, f"only {calls} ufunc calls seen: the kernel dropped the traced view"
    assert np.dtype(np.float64) not in kinds, f"float64 computed from float32 inputs: {kinds}"
