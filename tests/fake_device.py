"""A CPU stand-in for CuPy: device arrays that refuse numpy where CuPy's do.

``FakeArray`` wraps a numpy array (its "device memory") and behaves like ``cupy.ndarray``
where disttensor's code could tell them apart: ``np.asarray(x)`` and every implicit
conversion raise TypeError (CuPy's message), numpy's functions and ufuncs refuse it
(``__array_ufunc__ = None``, ``__array_function__`` answers NotImplemented), and it meets host
data only as CuPy does: Python and numpy scalars mix in, numpy arrays (0-d ones too) are
refused by its operators, functions and indexing; ``asarray``/``array`` copy host data in and
``asnumpy``/``.get()`` copy out. Reductions and indexing give 0-d arrays, never numpy
scalars. ``MODULE`` is its array module: the functions disttensor's device kernels call
(elementwise ufuncs, reductions, matmul/einsum, reshape/transpose/concatenate, take/put,
where/clip, sort/argsort basics, ``random``, ``asnumpy``, ``ascontiguousarray``...), each
numpy's own on the storage, so results are bit for bit numpy's; a name CuPy has but this
list lacks raises AttributeError, like a missing CuPy function. The stand-in checks names, not
signatures: it takes numpy's parameters, so code must keep to the parameters CuPy documents
(``cupy.sort`` has no ``kind``, ``cupy.unique`` no ``sorted``...).

``install()`` registers it through disttensor's seam exactly as CuPy is registered
(disttensor/backend.py: a ``Backend`` for the array type, and the device name "fake" for
``dt.set_device``); library code has no case for it. The fused kernels are the host's run on
the storage (what the GPU path calls ``kernels.<name>.load(cupy)`` for): the numpy references,
or the compiled ones where the host has them (Note [Host kernels] in kernels/_host.py), so the
stand-in's results stay the host's bit for bit.

>>> be = install()
>>> x = MODULE.asarray([1.0, 2.0])
>>> (x * 2).get(), type(MODULE.sum(x)).__name__
(array([2., 4.]), 'FakeArray')
>>> np.asarray(x)  # doctest: +ELLIPSIS
Traceback (most recent call last):
TypeError: Implicit conversion to a NumPy array is not allowed. Please use `.get()` ...
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from disttensor import backend

_IMPLICIT = (
    "Implicit conversion to a NumPy array is not allowed. "
    "Please use `.get()` to construct a NumPy array explicitly."
)


def _unwrap(v: Any) -> Any:
    """An argument as numpy sees it: FakeArray -> its storage; numpy arrays refused (CuPy's
    error), containers searched."""
    if type(v) is FakeArray:
        return v._a
    if isinstance(v, np.ndarray):
        raise TypeError(f"Unsupported type {type(v)}")
    if type(v) in (list, tuple):
        return type(v)(_unwrap(a) for a in v)
    return v


def _unwrap_kw(kwargs: dict) -> dict:
    return {k: _unwrap(v) for k, v in kwargs.items()}


def _wrap(r: Any) -> Any:
    """A numpy result as the device gives it: arrays and numpy scalars as FakeArrays."""
    if isinstance(r, np.ndarray):
        return FakeArray(r)
    if isinstance(r, np.generic):
        return FakeArray(np.asarray(r))
    if type(r) is list:
        return [_wrap(a) for a in r]
    if isinstance(r, tuple):  # numpy's named results (QRResult, ...): a plain tuple, as CuPy's
        return tuple(_wrap(a) for a in r)
    return r


class FakeArray:
    """A device array held in numpy storage (see the module docstring)."""

    __slots__ = ("_a", "__weakref__")
    __array_ufunc__ = None  # numpy's ufuncs and ndarray operators refuse it

    def __init__(self, storage: np.ndarray) -> None:
        self._a = storage

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(_IMPLICIT)

    def __array_function__(self, func, types, args, kwargs):
        return NotImplemented  # numpy's functions raise TypeError

    # -- metadata ------------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    base = property(lambda self: None)  # views are not tracked (disttensor needs no more)
    device = property(lambda self: SimpleNamespace(id=0))
    data = property(lambda self: SimpleNamespace(ptr=self._a.__array_interface__["data"][0]))
    T = property(lambda self: FakeArray(self._a.T))
    real = property(lambda self: _wrap(self._a.real))
    imag = property(lambda self: _wrap(self._a.imag))

    # -- explicit transfers and Python values (CuPy allows these) ------------------------
    def get(self) -> np.ndarray:
        """A host copy (CuPy's device-to-host transfer)."""
        return self._a.copy()

    def set(self, host: np.ndarray) -> None:
        """Copy host data in (CuPy's host-to-device transfer into this array)."""
        self._a[...] = host

    def item(self, *args):
        return self._a.item(*args)

    def tolist(self):
        return self._a.tolist()

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        return (_wrap(a) for a in self._a)

    def __bool__(self) -> bool:
        return bool(self._a)

    def __float__(self) -> float:
        return float(self._a)

    def __int__(self) -> int:
        return int(self._a)

    def __complex__(self) -> complex:
        return complex(self._a)

    def __repr__(self) -> str:
        return "fake" + repr(self._a)

    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key)])

    def __setitem__(self, key, value) -> None:
        self._a[_unwrap(key)] = _unwrap(value)

    __hash__ = None  # type: ignore[assignment]


def _method(name: str):
    def call(self, *args, **kwargs):
        return _wrap(getattr(self._a, name)(*_unwrap(args), **_unwrap_kw(kwargs)))

    call.__name__ = name
    return call


def _names(text: str) -> list[str]:
    return text.split()


METHODS = _names(
    "reshape transpose swapaxes astype copy ravel flatten squeeze view fill sum mean max min "
    "prod all any argmax argmin cumsum cumprod clip round conj conjugate dot nonzero take "
    "repeat diagonal trace sort argsort searchsorted var std partition argpartition put "
    "nonzero cumsum cumprod"
)
for _name in METHODS:
    setattr(FakeArray, _name, _method(_name))


def _in_place(name: str):
    def call(self, other):
        getattr(self._a, name)(_unwrap(other))
        return self

    call.__name__ = name
    return call


OPERATORS = _names(
    "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift "
    "radd rsub rmul rtruediv rfloordiv rmod rpow rmatmul rand ror rxor "
    "lt le gt ge eq ne neg pos abs invert"
)
for _name in OPERATORS:
    setattr(FakeArray, f"__{_name}__", _method(f"__{_name}__"))
for _name in _names("iadd isub imul itruediv ifloordiv imod ipow imatmul iand ior ixor"):
    setattr(FakeArray, f"__{_name}__", _in_place(f"__{_name}__"))


# -- the array module ------------------------------------------------------------------------
def _function(name: str):
    f = getattr(np, name)

    def call(*args, **kwargs):
        return _wrap(f(*_unwrap(args), **_unwrap_kw(kwargs)))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"numpy.{name} on the fake device's storage."
    return call


FUNCTIONS = _names(
    # elementwise
    "abs absolute negative positive exp expm1 log log1p log2 log10 sqrt square reciprocal sign "
    "sin cos tan tanh arctan sinh cosh floor ceil round rint logical_not isnan isfinite isinf "
    "conjugate conj real imag add subtract multiply divide true_divide power maximum minimum "
    "floor_divide mod remainder arctan2 equal not_equal less less_equal greater greater_equal "
    "logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor invert left_shift "
    "right_shift where clip isclose allclose array_equal copyto "
    # numpy's other ufuncs that CuPy documents (they have rules: ops/elementwise.py)
    "arccos arcsin arccosh arcsinh arctanh cbrt copysign deg2rad degrees rad2deg radians "
    "divmod exp2 fabs float_power fmax fmin fmod frexp heaviside hypot logaddexp logaddexp2 "
    "modf nextafter signbit trunc gcd lcm ldexp "
    # reductions and scans
    "sum mean max min amax amin prod all any argmax argmin cumsum cumprod count_nonzero "
    # linear algebra
    "matmul dot einsum outer tensordot "
    # shape and joins
    "reshape transpose swapaxes moveaxis expand_dims squeeze broadcast_to tile repeat split "
    "array_split concatenate stack ravel flip roll diagonal trace tril triu "
    # indexing, sorting, counting
    "take take_along_axis put put_along_axis nonzero argwhere flatnonzero sort argsort "
    "partition argpartition lexsort searchsorted unique isin bincount digitize "
    "unravel_index ravel_multi_index indices compress extract "
    # order statistics and statistics
    "median quantile percentile nanmedian nansum nanmean nanmax "
    "nanmin nanargmax nanargmin nanvar nanstd var std average cov corrcoef histogram "
    "array_equiv ptp "
    # layout
    "pad diff diag diagflat atleast_1d atleast_2d atleast_3d hstack vstack column_stack "
    "dstack append rot90 fliplr flipud meshgrid linspace "
    # creation
    "empty zeros ones full empty_like zeros_like ones_like full_like arange eye copy "
    "ascontiguousarray result_type can_cast iinfo finfo"
)


def asarray(a: Any, dtype: Any = None, order: Any = None) -> FakeArray:
    """``cupy.asarray``: a FakeArray as it is (cast if asked), host data copied in."""
    if type(a) is FakeArray:
        return a if dtype is None or a.dtype == dtype else FakeArray(a._a.astype(dtype))
    return FakeArray(np.array(a, dtype=dtype, order=order or "K", copy=True))


def array(a: Any, dtype: Any = None, copy: bool = True, order: Any = "K") -> FakeArray:
    """``cupy.array``: a copy (FakeArray or host data)."""
    src = a._a if type(a) is FakeArray else a
    return FakeArray(np.array(src, dtype=dtype, copy=copy, order=order))


def asnumpy(a: Any) -> np.ndarray:
    """``cupy.asnumpy``: a host copy of a FakeArray; host data as numpy."""
    return a._a.copy() if type(a) is FakeArray else np.asarray(a)


def _random() -> SimpleNamespace:
    """``cupy.random``'s basics, drawn on the host with numpy's generator."""
    rng = np.random.default_rng(0)

    def seed(s: int) -> None:
        nonlocal rng
        rng = np.random.default_rng(s)

    return SimpleNamespace(
        seed=seed,
        random=lambda size=None, dtype=np.float64: FakeArray(np.asarray(rng.random(size, dtype))),
        standard_normal=lambda size=None, dtype=np.float64: FakeArray(
            np.asarray(rng.standard_normal(size, dtype))
        ),
        randint=lambda low, high=None, size=None: FakeArray(
            np.asarray(rng.integers(low, high, size))
        ),
    )


LINALG = _names("qr svd eigh eigvalsh lstsq norm solve inv det slogdet cholesky matrix_rank pinv")


def _linalg() -> SimpleNamespace:
    """``cupy.linalg``'s functions on the storage (numpy.linalg's, results wrapped)."""
    funcs = {}
    for name in LINALG:
        f = getattr(np.linalg, name)

        def call(*args, _f=f, **kwargs):
            return _wrap(_f(*_unwrap(args), **_unwrap_kw(kwargs)))

        call.__name__ = call.__qualname__ = name
        funcs[name] = call
    return SimpleNamespace(**funcs)


MODULE = SimpleNamespace(
    __name__="fake_cupy",
    ndarray=FakeArray,
    asarray=asarray,
    array=array,
    asnumpy=asnumpy,
    random=_random(),
    linalg=_linalg(),
    newaxis=None,
    inf=np.inf,
    nan=np.nan,
    pi=np.pi,
    **{name: _function(name) for name in FUNCTIONS},
    **{t: getattr(np, t) for t in ("bool_", "int32", "int64", "float32", "float64", "dtype")},
)


# -- registration through disttensor's seam ------------------------------------------------------
def _kernels(name: str) -> dict[str, Any]:
    """The host's functions of kernel ``name`` (disttensor.backend.NUMPY's) on the storage:
    device arrays in and out, host arguments (offsets, scalars) as they are."""

    def on_storage(f):
        def call(*args, **kwargs):
            return _wrap(f(*_host_ok(args), **_host_ok(kwargs)))

        call.__name__ = f.__name__
        return call

    return {n: on_storage(f) for n, f in backend.NUMPY.load(name).items()}


def _host_ok(v: Any) -> Any:
    """Kernel arguments: FakeArrays as storage, host numpy arrays (offsets) allowed."""
    if type(v) is FakeArray:
        return v._a
    if type(v) in (list, tuple):
        return type(v)(_host_ok(a) for a in v)
    if type(v) is dict:
        return {k: _host_ok(a) for k, a in v.items()}
    return v


def _scatter_add(out: FakeArray, idx: Any, values: Any) -> None:
    np.add.at(out._a, _unwrap(idx), _unwrap(values))


BACKEND = backend.Backend(
    "fake",
    MODULE,
    FakeArray,
    device=True,
    to_host=asnumpy,
    from_host=lambda a, dtype=None: FakeArray(np.array(a, dtype=dtype, copy=True)),
    load=_kernels,
    scatter_add=_scatter_add,
    device_of=lambda a: "fake:0",
)


def install() -> backend.Backend:
    """Register the stand-in (idempotent): its array type, and the device name "fake"."""

    def make() -> backend.Backend:
        backend.register(BACKEND)
        return BACKEND

    backend.register_device("fake", make)
    backend.register(BACKEND)
    return BACKEND
