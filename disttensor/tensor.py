"""DistTensor: this rank's shard plus the DistSpec that says where it lies in the global tensor.

The global value is never stored; ``numpy()`` and ``print`` assemble it (collectively).

>>> import numpy as np, disttensor as dt
>>> mesh = dt.ProcessMesh([0])
>>> x = dt.shard_tensor(np.arange(6.0).reshape(2, 3), mesh, [dt.Shard(0)])
>>> x
DistTensor([[0., 1., 2.],
            [3., 4., 5.]], shape=(2, 3), dtype=float64,
           mesh=ProcessMesh(shape=(1,), process_ids=[0], dim_names=['d0']),
           placements=[Shard(dim=0)])
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
import zlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from . import autograd, backend, comm, recording
from . import reshard as _reshard
from ._format import format_array, shown_indices
from .accounting import outside_rules
from .comm import agree
from .comm.agree import doing
from .comm.base import reduce_arrays
from .mesh import ProcessMesh, names_differ
from .placement import Partial, Placement, Replicate
from .recording import on as _recording
from .spec import DistSpec, contiguous


class DistTensor:
    """A global tensor sharded over a ProcessMesh. Build one with ``dt.shard_tensor``."""

    # _moved: None until the first move (Note [One move per tensor])
    # _derived, _reads: Note [Picks read from their root]; _lin: Note [Lineage names the tensor]
    __slots__ = ("_derived", "_grad", "_hooks", "_lin", "_local", "_moved", "_node", "_reads",
                 "_spec", "requires_grad", "__weakref__")  # fmt: skip

    def __init__(self, local: np.ndarray, spec: DistSpec, requires_grad: bool = False) -> None:
        # _made (a compiled step's results) sets the same slots, without this call
        self._local = local
        self._spec = spec
        self.requires_grad = requires_grad
        self._grad: DistTensor | None = None
        self._node = None  # (autograd Node, output index) when an op made this tensor
        self._hooks = None  # a leaf's gradient hooks (autograd.register_hook)
        self._moved: dict | None = None  # set, not left unset: reading an unset slot raises
        self._derived: tuple | None = None
        self._lin = 0  # made by no op the lineage knows (Note [Lineage names the tensor])

    @property
    def grad(self) -> DistTensor | None:
        """The gradient backward accumulated (None before any). Its placements are whatever
        the gradient's ops produced (Partial(sum) over a data-parallel dim, say: Note [Partial
        gradients] in autograd.py); an assigned gradient must be a DistTensor of this
        tensor's shape, dtype and mesh, in any placements."""
        return self._grad

    @grad.setter
    def grad(self, g: DistTensor | None) -> None:
        if g is not None:
            _check_assigned_grad(self, g)
        self._grad = g

    # -- autograd (autograd.py) ----------------------------------------------------------------
    def backward(self, grad: Any = None, retain_graph: bool = False) -> None:
        """Accumulate gradients into ``.grad`` of the leaves this tensor depends on."""
        autograd.backward(self, grad, retain_graph)

    def detach(self) -> DistTensor:
        """The same shard and spec, cut from the graph (no gradient flows through it)."""
        out = DistTensor(self._local, self._spec)
        out._lin = self._lin  # the same value (Note [Lineage names the tensor])
        return out

    def requires_grad_(self, requires_grad: bool = True) -> DistTensor:
        """Set ``requires_grad`` in place; returns ``self``."""
        if requires_grad:
            _check_grad_dtype(self._spec.dtype)
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        """True unless an op recorded for backward made this tensor."""
        return self._node is None

    @property
    def grad_fn(self):
        """The autograd node that made this tensor (None for leaves)."""
        return None if self._node is None else self._node[0]

    def register_hook(self, fn):
        """``fn(grad)`` runs when this tensor's gradient is final; see autograd.register_hook."""
        return autograd.register_hook(self, fn)

    def register_post_accumulate_grad_hook(self, fn):
        """``fn(tensor)`` runs after backward has updated this leaf's ``.grad``."""
        return autograd.register_post_accumulate_grad_hook(self, fn)

    # -- metadata (global, no communication) ---------------------------------------------------
    @property
    def spec(self) -> DistSpec:
        return self._spec

    @property
    def shape(self) -> tuple[int, ...]:
        """The global shape (no communication)."""
        return self._spec.shape

    @property
    def dtype(self) -> np.dtype:
        """The dtype (no communication)."""
        return self._spec.dtype

    @property
    def ndim(self) -> int:
        """The number of axes (no communication)."""
        return len(self._spec.shape)

    @property
    def size(self) -> int:
        """The number of elements of the global value (no communication)."""
        return math.prod(self._spec.shape)

    @property
    def mesh(self) -> ProcessMesh:
        return self._spec.mesh

    @property
    def placements(self) -> list[Placement]:
        return list(self._spec.placements)

    @property
    def local_shape(self) -> tuple[int, ...]:
        return self._local.shape

    def __len__(self) -> int:
        """The length of the first axis (no communication)."""
        if not self.shape:
            raise TypeError("len() of a 0-d DistTensor")
        return self.shape[0]

    @property
    def itemsize(self) -> int:
        """Bytes per element, as numpy (no communication)."""
        return self._spec.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the global value, ``size * itemsize`` (no communication)."""
        return self.size * self._spec.dtype.itemsize

    @property
    def flags(self):
        """numpy's memory flags (no communication): see ops/ndarray.py ``Flags``."""
        return _nd().Flags(self)

    def setflags(self, write=None, align=None, uic=None) -> None:
        """numpy's ``setflags``, on every rank's shard (``write=False``: read-only)."""
        _nd().setflags(self, write, align, uic)

    @property
    def device(self) -> str:
        """Where the shards live: ``"cpu"`` (numpy's only device), or the GPU of this rank's
        shard, e.g. ``"cuda:0"`` (Note [Array backends] in backend.py)."""
        return backend.of(self._local).device_of(self._local)

    def to_device(self, device, /, *, stream=None) -> DistTensor:
        """A copy on ``device`` ("cpu", "gpu" or a registered device; ``x`` itself where it
        is there already): each rank copies its shard, no communication. The copy is a new
        leaf, cut from the graph (no gradient flows through a device move)."""
        return _nd().to_device(self, device, stream)

    @property
    def mT(self) -> DistTensor:
        """The last two axes swapped (``np.matrix_transpose``)."""
        return _nd().mT(self)

    @property
    def real(self) -> DistTensor:
        """The real part (elementwise op; a real tensor's own values)."""
        return _EW["real"](self)

    @real.setter
    def real(self, value) -> None:
        """``x.real = value`` writes the real part in place (aliases see it)."""
        _nd().set_real(self, value)

    @property
    def imag(self) -> DistTensor:
        """The imaginary part (elementwise op; zeros for a real tensor)."""
        return _EW["imag"](self)

    @imag.setter
    def imag(self, value) -> None:
        """``x.imag = value`` writes the imaginary part of a complex tensor in place."""
        _nd().set_imag(self, value)

    @property
    def flat(self):
        """The elements in C order: iterable, indexable and writable (ops/ndarray.py FlatIter)."""
        return _nd().FlatIter(self)

    @flat.setter
    def flat(self, value) -> None:
        """``x.flat = value`` sets every element, values repeated as numpy does, in place."""
        _nd().FlatIter(self)[:] = value

    @property
    def strides(self):
        """Refused (NotImplementedError): a DistTensor has no global memory layout."""
        raise _nd().refused("strides")

    @property
    def ctypes(self):
        """Refused (NotImplementedError): there is no global buffer to hand to C."""
        raise _nd().refused("ctypes")

    @property
    def data(self):
        """Refused (NotImplementedError): there is no global buffer to expose."""
        raise _nd().refused("data")

    @property
    def base(self):
        """Refused (NotImplementedError): DistTensors do not record which tensor they view."""
        raise _nd().refused("base")

    # -- values ------------------------------------------------------------------------------
    def to_local(self) -> Any:
        """This rank's shard, no communication (empty on ranks outside the mesh): a numpy
        array, or the device array itself on a GPU."""
        if _recording.rec is not None:
            recording.data_out("to_local()")
        return self._local

    def numpy(self) -> np.ndarray:
        """The global value as a host numpy array (from a device too), on every rank of the
        mesh (collective over the mesh)."""
        if _recording.rec is not None:
            recording.data_out("numpy()")
        rank = comm.get_rank()
        if rank not in self.mesh:
            raise RuntimeError(
                f"rank {rank} is not in this tensor's mesh {self.mesh.process_ids}; numpy() is "
                "collective over the mesh ranks, call it there"
            )
        full = _whole(self._spec)
        with doing("numpy()"):
            out = moved(self, full)
        if type(out) is not np.ndarray and backend.is_device(out):
            return backend.to_host(out)  # a copy
        memo = self._moved
        if out is self._local or (memo is not None and memo.get(full, (0, None))[1] is out):
            return out.copy()  # never the shard itself, nor the remembered move
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """The global value as a numpy array, for ``np.asarray(x)``, ``np.array([x, y])`` and
        numpy code that does not dispatch to dt (collective; accounted: Note [Communication
        outside rules])."""
        with outside_rules("np.asarray", "implicit conversion: the global value gathered", False):
            out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def reshard(self, mesh: ProcessMesh, placements: Sequence[Placement]) -> DistTensor:
        """Same as ``dt.reshard(self, mesh, placements)``."""
        return reshard(self, mesh, placements)

    def __repr__(self) -> str:
        """The global value like numpy prints it, plus its layout (collective over the mesh).

        Above numpy's summarization threshold only the items that are shown are gathered.
        """
        prefix = "DistTensor("
        recording.data_out("print")
        rank = comm.get_rank()
        if rank not in self.mesh:
            body = "<not on this rank>"
        else:
            idx = shown_indices(self.shape)
            with doing("print (repr)"):
                small = self.numpy() if idx is None else _gather_shown(self, idx, rank)
            body = format_array(small, self.shape, prefix=prefix, separator=", ")
        pad = " " * len(prefix)
        return (
            f"{prefix}{body}, shape={self.shape}, dtype={self.dtype},\n"
            f"{pad}mesh={self.mesh!r},\n{pad}placements={self.placements})"
        )

    __str__ = __repr__

    # -- ops as methods and operators (the op set lives in ops/, reached lazily) --------------
    __array_priority__ = 100

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _ops().array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _ops().array_function(func, args, kwargs)

    def __add__(self, o):
        return _binary(_EW["add"], self, o)

    def __radd__(self, o):
        return _binary(_EW["add"], o, self)

    def __sub__(self, o):
        return _binary(_EW["subtract"], self, o)

    def __rsub__(self, o):
        return _binary(_EW["subtract"], o, self)

    def __mul__(self, o):
        return _binary(_EW["multiply"], self, o)

    def __rmul__(self, o):
        return _binary(_EW["multiply"], o, self)

    def __truediv__(self, o):
        return _binary(_EW["divide"], self, o)

    def __rtruediv__(self, o):
        return _binary(_EW["divide"], o, self)

    def __floordiv__(self, o):
        return _ops().floor_divide(self, o)

    def __rfloordiv__(self, o):
        return _ops().floor_divide(o, self)

    def __mod__(self, o):
        return _ops().mod(self, o)

    def __rmod__(self, o):
        return _ops().mod(o, self)

    def __rand__(self, o):
        return _ops().array_ufunc(np.bitwise_and, "__call__", (o, self), {})

    def __ror__(self, o):
        return _ops().array_ufunc(np.bitwise_or, "__call__", (o, self), {})

    def __rxor__(self, o):
        return _ops().array_ufunc(np.bitwise_xor, "__call__", (o, self), {})

    def __pow__(self, o):
        return _binary(_EW["power"], self, o)

    def __rpow__(self, o):
        return _binary(_EW["power"], o, self)

    def __matmul__(self, o):
        return _binary(_EW["matmul"], self, o)

    def __rmatmul__(self, o):
        return _EW["matmul"](o, self)

    def __neg__(self):
        return _EW["negative"](self)

    def __pos__(self):
        return _ops().positive(self)

    def __abs__(self):
        return _ops().abs(self)

    def __invert__(self):
        return _ops().array_ufunc(np.invert, "__call__", (self,), {})

    def __and__(self, o):
        return _ops().array_ufunc(np.bitwise_and, "__call__", (self, o), {})

    def __or__(self, o):
        return _ops().array_ufunc(np.bitwise_or, "__call__", (self, o), {})

    def __xor__(self, o):
        return _ops().array_ufunc(np.bitwise_xor, "__call__", (self, o), {})

    def __lshift__(self, o):
        return _ops().array_ufunc(np.left_shift, "__call__", (self, o), {})

    def __rlshift__(self, o):
        return _ops().array_ufunc(np.left_shift, "__call__", (o, self), {})

    def __rshift__(self, o):
        return _ops().array_ufunc(np.right_shift, "__call__", (self, o), {})

    def __rrshift__(self, o):
        return _ops().array_ufunc(np.right_shift, "__call__", (o, self), {})

    def __divmod__(self, o):
        return _ops().array_ufunc(np.divmod, "__call__", (self, o), {})

    def __rdivmod__(self, o):
        return _ops().array_ufunc(np.divmod, "__call__", (o, self), {})

    def __eq__(self, o):  # type: ignore[override]
        try:
            return _binary(_EW["equal"], self, o)
        except TypeError as e:
            return _incomparable(self, o, e, False)

    def __ne__(self, o):  # type: ignore[override]
        try:
            return _binary(_EW["not_equal"], self, o)
        except TypeError as e:
            return _incomparable(self, o, e, True)

    def __lt__(self, o):
        return _binary(_EW["less"], self, o)

    def __le__(self, o):
        return _binary(_EW["less_equal"], self, o)

    def __gt__(self, o):
        return _binary(_EW["greater"], self, o)

    def __ge__(self, o):
        return _binary(_EW["greater_equal"], self, o)

    def __hash__(self) -> int:
        """A 0-d tensor hashes as its value, as numpy's scalars do, so an element works as a
        ``set`` member or a ``dict`` key (``set(y[idx])``, ``Counter(labels)``): locally when
        it is Replicate (an element read with ``x[i]``, iteration, a reduction's result
        after use), collectively when it is Partial. Like a numpy scalar's hash, it is the
        value's now: write into the tensor afterwards and the set does not know. Any other
        shape is unhashable, as numpy's arrays are (``==`` is elementwise)."""
        spec = self._spec
        if spec.shape:
            raise TypeError(
                f"unhashable type: 'DistTensor' of shape {spec.shape} (numpy arrays are not "
                "hashable either); a 0-d one hashes by value: x[i], or tuple(x.tolist()) "
                "for the whole value"
            )
        local = self._local
        if local.size == 1 and all(p.is_replicate() for p in spec.placements):
            return hash(local.item())
        return hash(self.item())

    # numpy's signatures; extra arguments (dtype=, out=, where=, ...) go through numpy's
    # function and __array_function__ (ops/numpy_interop.py: an op, else the exact fallback)
    def sum(self, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        """``np.sum``; over a split axis the result is Partial(sum), no communication."""
        if dtype is None and out is None and not kwargs:
            return _ops().sum(self, axis, keepdims)
        return np.sum(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, **kwargs)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        """``np.mean``; over a split axis the result is Partial(avg), no communication."""
        if dtype is None and out is None and not kwargs:
            return _ops().mean(self, axis, keepdims)
        return np.mean(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, **kwargs)

    def max(self, axis=None, out=None, keepdims=False, **kwargs):
        """``np.max``; over a split axis the result is Partial(max)."""
        if out is None and not kwargs:
            return _ops().max(self, axis, keepdims)
        return np.max(self, axis=axis, out=out, keepdims=keepdims, **kwargs)

    def min(self, axis=None, out=None, keepdims=False, **kwargs):
        """``np.min``; over a split axis the result is Partial(min)."""
        if out is None and not kwargs:
            return _ops().min(self, axis, keepdims)
        return np.min(self, axis=axis, out=out, keepdims=keepdims, **kwargs)

    def prod(self, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        """``np.prod`` (a reduced axis is gathered first)."""
        if dtype is None and out is None and not kwargs:
            return _ops().prod(self, axis, keepdims)
        return np.prod(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, **kwargs)

    def all(self, axis=None, out=None, keepdims=False, **kwargs):
        """``np.all``; over a split axis the result is Partial(min) of bools."""
        if out is None and not kwargs:
            return _ops().all(self, axis, keepdims)
        return np.all(self, axis=axis, out=out, keepdims=keepdims, **kwargs)

    def any(self, axis=None, out=None, keepdims=False, **kwargs):
        """``np.any``; over a split axis the result is Partial(max) of bools."""
        if out is None and not kwargs:
            return _ops().any(self, axis, keepdims)
        return np.any(self, axis=axis, out=out, keepdims=keepdims, **kwargs)

    def argmax(self, axis=None, out=None, *, keepdims=False):
        """``np.argmax`` (axis None or an int)."""
        if out is None:
            return _ops().argmax(self, axis, keepdims)
        return np.argmax(self, axis=axis, out=out, keepdims=keepdims)

    def argmin(self, axis=None, out=None, *, keepdims=False):
        """``np.argmin`` (axis None or an int)."""
        if out is None:
            return _ops().argmin(self, axis, keepdims)
        return np.argmin(self, axis=axis, out=out, keepdims=keepdims)

    def var(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kwargs):
        """``np.var``, written with dt ops (works on every placement)."""
        if dtype is None and out is None and not kwargs:
            return _ops().var(self, axis, ddof, keepdims)
        kwargs.update(axis=axis, dtype=dtype, out=out, ddof=ddof, keepdims=keepdims)
        return np.var(self, **kwargs)

    def std(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kwargs):
        """``np.std``: the square root of ``var``."""
        if dtype is None and out is None and not kwargs:
            return _ops().std(self, axis, ddof, keepdims)
        kwargs.update(axis=axis, dtype=dtype, out=out, ddof=ddof, keepdims=keepdims)
        return np.std(self, **kwargs)

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        """``x.astype(dtype)``, numpy's ``casting`` check; ``copy=False`` may return ``x``."""
        if casting == "unsafe" and copy:
            return _ops().astype(self, dtype)
        return _nd().astype(self, dtype, casting, copy)

    def clip(self, min=None, max=None, out=None, **kwargs):
        """``np.clip``; bounds may be scalars or tensors (``a_min``/``a_max`` too)."""
        lo, hi = kwargs.pop("a_min", min), kwargs.pop("a_max", max)
        if out is None and not kwargs:
            return _ops().clip(self, lo, hi)
        return np.clip(self, lo, hi, out=out, **kwargs)

    def reshape(self, *shape, order="C", copy=None):
        """``x.reshape(2, 3)`` or ``x.reshape((2, 3))``, as in numpy (``order="F"`` too)."""
        shape = shape[0] if len(shape) == 1 else shape
        if order == "C" and copy is None:
            return _ops().reshape(self, shape)
        return _nd().reshape(self, shape, order, copy)

    def transpose(self, *axes):
        """``x.transpose()``, ``x.transpose(1, 0)`` or ``x.transpose((1, 0))``."""
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]
        return _ops().transpose(self, tuple(axes) if axes else None)

    @property
    def T(self):
        """The axes reversed (``x.transpose()``)."""
        return _ops().transpose(self)

    def flatten(self, order="C"):
        """A 1-D copy of the elements (``order="F"``: column-major)."""
        if order == "C":
            return _ops().flatten(self)
        return _nd().in_order(self, order, _ops().flatten)

    def ravel(self, order="C"):
        """The elements as a 1-D tensor (``order="F"``: column-major)."""
        if order == "C":
            return _ops().ravel(self)
        return _nd().in_order(self, order, _ops().ravel)

    def repeat(self, repeats, axis=None):
        """``np.repeat``."""
        return _ops().repeat(self, repeats, axis)

    def squeeze(self, axis=None):
        """``np.squeeze``."""
        return _ops().squeeze(self, axis)

    def swapaxes(self, axis1, axis2):
        """``np.swapaxes``."""
        return _ops().swapaxes(self, axis1, axis2)

    # -- the rest of numpy.ndarray (ops/ndarray.py) -------------------------------------------
    def conj(self):
        """The complex conjugate (elementwise op)."""
        return _EW["conjugate"](self)

    def conjugate(self):
        """The complex conjugate (elementwise op)."""
        return _EW["conjugate"](self)

    def round(self, decimals=0, out=None):
        """``np.round``: elementwise, on any placements."""
        if out is None:
            return _nd().round_(self, decimals)
        return np.round(self, decimals=decimals, out=out)

    def __round__(self, ndigits=None):
        """``round(x, n)``: ``x.round(n)`` as a DistTensor (numpy arrays do not define it)."""
        return _nd().round_(self, ndigits or 0)

    def dot(self, b, out=None):
        """``np.dot(x, b)``."""
        if out is None:
            return _ops().dot(self, b)
        return np.dot(self, b, out=out)

    def diagonal(self, offset=0, axis1=0, axis2=1):
        """``np.diagonal`` (a square matrix's main diagonal by einsum, else the fallback)."""
        return np.diagonal(self, offset=offset, axis1=axis1, axis2=axis2)

    def trace(self, offset=0, axis1=0, axis2=1, dtype=None, out=None):
        """``np.trace`` (a square float matrix's by einsum, else the fallback)."""
        return np.trace(self, offset=offset, axis1=axis1, axis2=axis2, dtype=dtype, out=out)

    def cumsum(self, axis=None, dtype=None, out=None):
        """``np.cumsum``: a local scan plus the shard totals (ops/scan.py)."""
        return np.cumsum(self, axis=axis, dtype=dtype, out=out)

    def cumprod(self, axis=None, dtype=None, out=None):
        """``np.cumprod``: a local scan plus the shard totals (ops/scan.py)."""
        return np.cumprod(self, axis=axis, dtype=dtype, out=out)

    def argsort(self, axis=-1, kind=None, order=None, *, stable=None):
        """``np.argsort``: global indices; a split axis without gathering (ops/sorting.py)."""
        return np.argsort(self, axis=axis, kind=kind, order=order, stable=stable)

    def argpartition(self, kth, axis=-1, kind="introselect", order=None):
        """``np.argpartition``: lanes along ``axis`` on the ranks holding them."""
        return np.argpartition(self, kth, axis=axis, kind=kind, order=order)

    def sort(self, axis=-1, kind=None, order=None, *, stable=None) -> None:
        """Sort in place along ``axis`` (aliases see it), the placements kept (ops/sorting.py)."""
        _nd().sort_in_place(self, axis, kind, order, stable)

    def partition(self, kth, axis=-1, kind="introselect", order=None) -> None:
        """``np.partition`` in place along ``axis`` (aliases see it)."""
        _nd().partition_in_place(self, kth, axis, kind, order)

    def take(self, indices, axis=None, out=None, mode="raise"):
        """``np.take``: along a whole axis on every shard (the other axes keep their split)."""
        return np.take(self, indices, axis=axis, out=out, mode=mode)

    def put(self, indices, values, mode="raise") -> None:
        """``np.put``: flat positions set in place, each rank writing those it holds."""
        _nd().put(self, indices, values, mode)

    def choose(self, choices, out=None, mode="raise"):
        """``np.choose`` (the replicate fallback)."""
        return np.choose(self, choices, out=out, mode=mode)

    def compress(self, condition, axis=None, out=None):
        """``np.compress`` (the replicate fallback)."""
        return np.compress(condition, self, axis=axis, out=out)

    def nonzero(self):
        """``np.nonzero`` (the replicate fallback: Replicate index tensors)."""
        return np.nonzero(self)

    def searchsorted(self, v, side="left", sorter=None):
        """``np.searchsorted``: per-shard counts summed, never a gather of ``self``."""
        return np.searchsorted(self, v, side=side, sorter=sorter)

    def fill(self, value) -> None:
        """Set every element to the scalar ``value`` in place, no communication."""
        _nd().fill(self, value)

    def copy(self, order="C") -> DistTensor:
        """A copy of every rank's shard, same placements, no communication."""
        return _nd().copy(self)

    def __copy__(self) -> DistTensor:
        """``copy.copy(x)``: ``x.copy()``."""
        return _nd().copy(self)

    def __deepcopy__(self, memo) -> DistTensor:
        """``copy.deepcopy(x)``: a new leaf with copies of the shard and of ``.grad``."""
        return _nd().deepcopy(self, memo)

    def view(self, dtype=None, type=None) -> DistTensor:
        """A DistTensor sharing every rank's shard memory, possibly as another dtype."""
        return _nd().view(self, dtype, type)

    def getfield(self, dtype, offset=0) -> DistTensor:
        """Each element's bytes at ``offset`` read as ``dtype``, on every shard."""
        return _nd().getfield(self, dtype, offset)

    def setfield(self, val, dtype, offset=0) -> None:
        """Write ``val`` into each element's bytes at ``offset`` as ``dtype``, in place."""
        _nd().setfield(self, val, dtype, offset)

    def byteswap(self, inplace=False) -> DistTensor:
        """Each element's bytes swapped; ``inplace=True`` writes them into ``x``."""
        return _nd().byteswap(self, inplace)

    def resize(self, *new_shape, refcheck=True) -> None:
        """Change shape and size in place, as numpy (C order, zeros appended)."""
        shape = new_shape[0] if len(new_shape) == 1 else (new_shape or None)
        _nd().resize(self, shape, refcheck)

    def tolist(self):
        """The global value as nested Python lists (collective)."""
        return self.numpy().tolist()

    def tobytes(self, order="C") -> bytes:
        """The global value's bytes (collective)."""
        return self.numpy().tobytes(order)

    def dumps(self) -> bytes:
        """The gathered value pickled, as ``ndarray.dumps`` (collective)."""
        return self.numpy().dumps()

    def dump(self, file) -> None:
        """The gathered value pickled to ``file`` (collective; one rank writes a path)."""
        _nd().dump(self, file)

    def tofile(self, fid, sep="", format="%s") -> None:
        """The gathered value written to ``fid`` (collective; one rank writes a path)."""
        _nd().tofile(self, fid, sep, format)

    def __iter__(self):
        """``x[0], x[1], ...`` along the first axis (a 0-d tensor raises TypeError)."""
        return _nd().iterate(self)

    def __contains__(self, value) -> bool:
        """``value in x``: ``(x == value).any()`` (collective)."""
        return _nd().contains(self, value)

    def __index__(self) -> int:
        """A 0-d integer tensor as an index (collective); others raise TypeError."""
        recording.data_out("an index")
        return _nd().index(self)

    def __format__(self, spec: str) -> str:
        """A 0-d tensor formats its value (``f"{loss:.4f}"``); others only as ``str(x)``."""
        recording.data_out("format()")
        return _nd().format_(self, spec)

    def __getitem__(self, key):
        return _ops().getitem(self, key)

    # -- writes (ops/mutation.py: Note [Writes keep the layout]) --------------------------------
    def __setitem__(self, key, value):
        """``x[key] = value`` as in numpy; each rank writes its own part (collective)."""
        _ops().mutation.setitem(self, key, value)

    def _inplace(self, ufunc, other):
        return _inplace(ufunc, self, other)

    def __iadd__(self, o):
        return _inplace(np.add, self, o)

    def __isub__(self, o):
        return _inplace(np.subtract, self, o)

    def __imul__(self, o):
        return _inplace(np.multiply, self, o)

    def __itruediv__(self, o):
        return _inplace(np.true_divide, self, o)

    def __ifloordiv__(self, o):
        return self._inplace(np.floor_divide, o)

    def __imod__(self, o):
        return self._inplace(np.remainder, o)

    def __ipow__(self, o):
        return self._inplace(np.power, o)

    def __imatmul__(self, o):
        return self._inplace(np.matmul, o)

    def __iand__(self, o):
        return self._inplace(np.bitwise_and, o)

    def __ior__(self, o):
        return self._inplace(np.bitwise_or, o)

    def __ixor__(self, o):
        return self._inplace(np.bitwise_xor, o)

    def __ilshift__(self, o):
        return self._inplace(np.left_shift, o)

    def __irshift__(self, o):
        return self._inplace(np.right_shift, o)

    # -- Python scalars: collective, like numpy() ---------------------------------------------
    def _scalar(self, kind):
        if self.size != 1:
            raise ValueError(
                f"{kind.__name__}() of a DistTensor with {self.size} elements is ambiguous "
                "(as for numpy arrays); use .any() or .all()"
            )
        with doing(f"{kind.__name__}()"):
            return kind(self.numpy().reshape(()))

    def __bool__(self):
        return self._scalar(bool)

    def __float__(self):
        return self._scalar(float)

    def __int__(self):
        return self._scalar(int)

    def __complex__(self):
        return self._scalar(complex)

    def item(self, *args):
        """One element as a Python scalar, as numpy (collective: only that element moves)."""
        recording.data_out("item()")
        return _nd().item(self, *args)


def _check_assigned_grad(t: DistTensor, g: Any) -> None:
    """``t.grad = g``: what PyTorch checks (type, shape, dtype, device: here the mesh)."""
    if not isinstance(g, DistTensor):
        raise TypeError(
            f"assigned grad must be a DistTensor or None, got {type(g).__name__}; wrap a "
            "global array with dt.shard_tensor(g, x.mesh, x.placements)"
        )
    spec, gs = t._spec, g._spec
    if gs.shape != spec.shape:
        raise ValueError(f"assigned grad has shape {gs.shape}, but the tensor has {spec.shape}")
    if gs.dtype != spec.dtype:
        raise TypeError(f"assigned grad has dtype {gs.dtype}, but the tensor has {spec.dtype}")
    if gs.mesh != spec.mesh:
        clause = names_differ(gs.mesh, spec.mesh)
        fix = (
            f"{clause}: re-label the grad with dt.reshard(g, x.mesh, g.placements)"
            if clause
            else "dt.reshard it to the tensor's mesh first"
        )
        raise ValueError(f"assigned grad lives on {gs.mesh}, but the tensor on {spec.mesh}; {fix}")
    if type(g._local) is not type(t._local) and backend.of(g._local) is not backend.of(t._local):
        raise backend.mixed("assigned grad", backend.of(g._local), backend.of(t._local))


def _check_grad_dtype(dtype: np.dtype) -> None:
    if dtype.kind not in "fc":
        raise TypeError(
            f"requires_grad: only floating tensors can have gradients, got dtype {dtype}; "
            "make it with a float dtype (e.g. dtype=np.float32)"
        )


_OPS = None


def _nd():
    """ops/ndarray.py: the rest of numpy.ndarray's surface (reached lazily, as the op set)."""
    return _ops().ndarray


# Note [Comparisons numpy cannot make]
#     numpy's ``==`` and ``!=`` of an array and an operand its ufuncs have no loop for (a
#     string, bytes, a datetime against floats) do not raise as ``np.equal`` does: they give
#     every element False (``!=``: True), of the broadcast shape, after checking that the
#     shapes broadcast. DistTensor's operators do the same: the op raises numpy's no-loop
#     error on every rank before anything moves (dispatch checks such operands on stand-ins),
#     and the answer is then made without communication, laid out as the tensor (a Partial
#     mesh dim Replicate: the answer is the same everywhere), or, where the operand widens
#     the shape, by a bool op with a numpy array of the operand's shape.
def _incomparable(x: DistTensor, o: Any, error: TypeError, value: bool) -> DistTensor:
    """``x == o`` (``x != o``: ``value`` True) where numpy's ufunc has no loop for ``o``
    (Note [Comparisons numpy cannot make]); any other error is raised as it is."""
    if isinstance(o, DistTensor) or (
        type(o) in (list, tuple) and any(isinstance(e, DistTensor) for e in o)
    ):  # never gathered here: an error between tensors is the op's
        raise error
    from .creation import full
    from .dispatch import stand_in

    try:  # numpy's own answer on 0-d stand-ins of the two dtypes: no loop, or another error
        np.not_equal(stand_in(x), stand_in(np.asarray(o)))
    except TypeError as e:
        if not any(c.__qualname__ == "_UFuncNoLoopError" for c in type(e).__mro__):
            raise error from None
    else:
        raise error
    shape = np.broadcast_shapes(x.shape, np.shape(o))  # numpy's ValueError where they do not
    plain = x._spec.without_partials()
    out = full(x.shape, value, bool, mesh=plain.mesh, placements=plain.placements)
    if shape != x.shape:  # the operand widens it: broadcast by an op
        out = _ops().logical_or(out, np.full(np.shape(o), value))
    return out


def _ops():
    """The op set, which is built on this module and so is reached lazily (once)."""
    global _OPS
    if _OPS is None:
        from . import ops

        _OPS = ops
    return _OPS


class _LazyOps(dict):
    """The Op objects of the operators (operators skip the public wrappers), filled on the
    first lookup: the op set is built on this module."""

    def __missing__(self, name: str):
        if self:  # filled already: not an operator's op
            raise KeyError(name)
        ops = _ops()
        self.update(ops.elementwise.OPS)
        self["matmul"] = ops.linalg.OPS["matmul"]
        return self[name]


_EW = _LazyOps()


def _inplace(ufunc: Any, x: Any, y: Any) -> Any:
    """The in-place operators' ``x <op>= y``: ops/mutation.py's inplace once it is imported."""
    return _ops().mutation.inplace(ufunc, x, y)


def _binary(op: Any, x: Any, y: Any) -> Any:
    """The operators' call of ``op(x, y)``: dispatch.binary once dispatch is imported."""
    return op(x, y)


def _gather_shown(x: DistTensor, idx: tuple[np.ndarray, ...], rank: int) -> np.ndarray:
    """The global value at the ``np.ix_(*idx)`` grid, moving only those items (one all-gather).

    Every mesh rank sends the shown items of its shard; every rank then rebuilds the grid by
    taking one replica, reducing Partial mesh dims innermost first (Note [Partial order]) and
    placing each shard's items.
    """
    spec, mesh = x.spec, x.mesh

    def picked(coord):  # per axis: positions in idx that fall in this shard, and local offsets
        out = []
        for (start, n), ix in zip(spec.local_box(coord), idx):
            lo, hi = np.searchsorted(ix, [start, start + n])
            out.append((lo, ix[lo:hi] - start))
        return out

    coords = [mesh.get_coord(r) for r in mesh.process_ids]
    mine = picked(mesh.get_coord(rank))
    local = x.to_local()
    be = backend.of(local)  # a device shard: the shown items gathered there, then brought over
    grid_idx = np.ix_(*[loc for _, loc in mine])
    if be.device:
        grid_idx = tuple(be.from_host(i) for i in grid_idx)
    piece = be.xp.ascontiguousarray(local[grid_idx])
    counts = [math.prod(len(loc) for _, loc in picked(c)) for c in coords]
    flat = be.xp.empty(sum(counts), x.dtype)
    comm.group(tuple(mesh.process_ids)).allgather(piece, flat, counts)
    flat = backend.to_host(flat)

    grid = np.empty(mesh.shape, dtype=object)
    offset = 0
    for c, n in zip(coords, counts):
        grid[c] = flat[offset : offset + n].reshape([len(loc) for _, loc in picked(c)])
        offset += n
    for m in reversed(range(mesh.ndim)):
        p = spec.placements[m]
        if p.is_replicate():
            grid = grid.take([0], axis=m)
        elif isinstance(p, Partial):
            reduced = np.empty(grid.shape[:m] + (1,) + grid.shape[m + 1 :], dtype=object)
            for i in np.ndindex(reduced.shape):
                column = [grid[i[:m] + (j,) + i[m + 1 :]] for j in range(grid.shape[m])]
                reduced[i] = reduce_arrays(column, p.reduce_type)
            grid = reduced
    small = np.empty([len(ix) for ix in idx], x.dtype)
    for i in np.ndindex(grid.shape):  # the remaining coordinates address distinct shards
        coord = tuple(i[m] if spec.placements[m].is_shard() else 0 for m in range(mesh.ndim))
        where = tuple(slice(lo, lo + len(loc)) for lo, loc in picked(coord))
        small[where] = grid[i]
    return small


# -- construction and resharding -----------------------------------------------------------------
def check_world(mesh: ProcessMesh, what: str) -> None:
    """A clear error for a mesh naming ranks this world does not have (every rank raises)."""
    if not isinstance(mesh, ProcessMesh):
        raise TypeError(f"{what}: mesh must be a dt.ProcessMesh, got {type(mesh).__name__}")
    n = comm.get_world_size()
    if mesh.max_rank >= n:
        bad = [r for r in mesh.process_ids if r >= n]
        raise ValueError(
            f"{what}: the mesh has ranks {bad} but the world has only {n} ranks (0..{n - 1}); "
            f"launch with more processes or use a mesh of existing ranks"
        )


def from_spec_block(
    block_fn, spec: DistSpec, requires_grad: bool = False, on: backend.Backend | None = None
) -> DistTensor:
    """A DistTensor whose plain (Partial read as Replicate) shard is ``block_fn(slices)``, on
    backend ``on`` (default: the selected device, ``backend.current()``); a host block is
    copied to the device there.

    Only the local shard is made; Partial mesh dims are then set locally (no communication).
    """
    if requires_grad:
        _check_grad_dtype(spec.dtype)
    be = backend.current() if on is None else on
    rank = comm.get_rank()
    coord = spec.mesh.get_coord(rank)
    plain = spec.without_partials()
    if coord is None:
        local = be.xp.empty(plain.local_shape(None), spec.dtype)
    else:
        local = be.asarray(block_fn(plain.local_slices(coord)), spec.dtype)  # host: np.asarray
        if spec.has_partial():
            local = _reshard.execute(local, plain, spec)
    return DistTensor(local, spec, requires_grad)


def shard_tensor(
    data: Any,
    mesh: ProcessMesh,
    placements: Sequence[Placement],
    dtype: Any = None,
    requires_grad: bool = False,
    *,
    src: int | None = None,
    check: bool | None = None,
) -> DistTensor:
    """Distribute global ``data`` (the same on every rank) over ``mesh``; keeps only this shard.

    ``data`` may be an array, list, scalar, or a DistTensor (then it is resharded). The ranks
    of the mesh first agree that they passed the same shape, dtype, placements and values: a
    crc32 of the data's bytes rides in the agreement every collective makes, so data
    that differs by rank (an unseeded random draw) raises ``RanksDiverged`` on every rank
    instead of giving each rank another tensor. The price is one pass over the data per rank
    (about 4 GB/s; docs/concepts.md measures it) and nothing on a 1-rank mesh.
    ``check=False`` skips the values (shape, dtype and placements are still agreed; not
    with ``DISTTENSOR_DEBUG=1``), for data known to agree; ``check=True`` compares them even
    with ``DISTTENSOR_CHECK=0``, which otherwise turns the whole agreement off. ``src=r``
    takes the data from rank r alone, as PyTorch's ``distribute_tensor`` does: the other
    ranks may pass None, and each receives just its shard, point to point (Note [Replicas
    agree] below). Data that differs by rank by design is ``dtensor_from_local``'s.

    >>> import disttensor as dt
    >>> x = dt.shard_tensor([1, 2, 3], dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> x.shape, x.local_shape, x.placements
    ((3,), (3,), [Shard(dim=0)])
    """
    check_world(mesh, "shard_tensor")
    if src is not None:
        return _from_rank(data, mesh, placements, dtype, requires_grad, src)
    if isinstance(data, DistTensor):
        if data.is_leaf:  # a leaf (a parameter, say) gives a new leaf, with its own memory
            with autograd.no_grad():
                out = reshard(data, mesh, placements)
            if out is data:
                out = DistTensor(data.to_local().copy(), data.spec)
        else:  # part of a graph: the reshard is recorded, gradients flow back
            out = reshard(data, mesh, placements)
        if dtype is not None and np.dtype(dtype) != out.dtype:
            if out.is_leaf:
                spec = out.spec.replace(dtype=np.dtype(dtype))
                out = DistTensor(out.to_local().astype(dtype), spec)
            else:  # a recorded cast: the graph goes on
                out = out.astype(dtype)
        if out.is_leaf:
            if requires_grad:
                _check_grad_dtype(out.dtype)
            out.requires_grad = requires_grad or data.requires_grad
        return out
    on = None  # a device array stays on its device, whatever device is selected
    if backend.is_device(data):
        on = backend.of(data)
        arr = on.asarray(data, dtype)
    else:
        try:
            arr = np.asarray(data, dtype=dtype)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"shard_tensor cannot make an array of {type(data).__name__}: {e}"
            ) from None
    if arr.dtype == object:
        raise TypeError(f"shard_tensor needs numeric data, got an object array from {data!r:.80}")
    spec = DistSpec.make(mesh, placements, arr.shape, arr.dtype, what="shard_tensor")
    values = arr if check is not False or agree.DEBUG else None  # DEBUG: hunting a divergence
    crc = _agree_on(spec, "shard_tensor", values, force=bool(check))
    out = from_spec_block(lambda slices: arr[slices].copy(), spec, requires_grad, on)
    # the data the ranks agreed on names it (Note [Lineage names the tensor])
    out._lin = hash((_SHARD_TENSOR, spec.shape, crc))
    return out


# Note [Replicas agree]
# Every rank passes shard_tensor the same global data and keeps its own shard, so a rank that
# passes another shape (or placements, or dtype) would build a tensor the others do not have,
# and its later collectives would move mismatched buffers; one that passes other values (an
# unseeded random draw) would hold another "replica", or shards cut from another array, and
# every later result would differ by rank with no error. So the mesh's ranks first agree on
# (shape, dtype, placements, crc32 of the values) with the check every collective makes (Note
# [Ranks agree before a collective] in comm/agree.py: counted in CommCounter.checks,
# skipped with DISTTENSOR_CHECK=0), dtensor_from_local on (global shape, dtype, placements),
# dt.rand and dt.randn on the seed and stream they draw.
#
# Checking the values rather than taking one rank's (PyTorch's default) is a choice made on
# measurements (docs/concepts.md, "The same data on every rank"): the crc32 adds no message,
# only one pass over the data on every rank at once (~4 GB/s), about what broadcasting a
# replica from rank 0 costs on one node, more than scattering a large sharded input (only the
# shards move); and taking rank 0's data would hide the bug that the crc32 names (a program
# that passed per-rank data meant a seed, src=0, or dtensor_from_local). Every rank hashes the
# whole array, Shard placements too: a rank's shard is cut from its own copy, so a difference
# anywhere makes the assembled tensor an array no rank passed. check=False skips the crc (the
# data is known to agree); src=r is the PyTorch behaviour, asked for by name. With src=r no
# rank but r needs the data: the ranks learn its shape and dtype from r (one small all-gather
# of metadata) and each receives its shard point to point, as a move from the 1-rank mesh [r]
# (reshard.fetch).
def agree_on_mesh(mesh: ProcessMesh, what: str, key: tuple, force: bool = False) -> None:
    """Note [Replicas agree]: the ranks of ``mesh`` check that they pass the same ``key``
    for ``what`` (``RanksDiverged`` on every rank otherwise). Nothing on a 1-rank mesh, on
    ranks outside it, or with the check off (unless ``force``: the caller asked for it).
    Collective over the mesh."""
    if (agree.CHECK or force) and mesh.size > 1 and comm.get_rank() in mesh:
        comm.group(tuple(mesh.process_ids)).agree(what, key)


def _agree_on(spec: DistSpec, what: str, values: Any = None, force: bool = False) -> int:
    """The ranks of ``spec``'s mesh check they hold the same spec, and a crc32 of ``values``
    when given (Note [Replicas agree]); ``force``: even with the check off. Nothing (no hash
    either) on a 1-rank mesh or on ranks outside it. Returns the crc32 agreed on, else 0."""
    if not (agree.CHECK or force) or spec.mesh.size == 1 or comm.get_rank() not in spec.mesh:
        return 0
    key: tuple = (spec.shape, spec.dtype, spec.placements)
    crc = 0
    if values is not None:
        crc = _crc32(values)
        key += (f"values crc32 {crc:#010x}",)
    agree_on_mesh(spec.mesh, what, key, force=True)
    return crc


def _crc32(values: Any) -> int:
    """crc32 of ``values``' bytes in C order (a device array's through a host copy). zlib
    releases the GIL on large buffers, so simulated ranks hash at once."""
    host = backend.to_host(values) if backend.is_device(values) else values
    return zlib.crc32(np.ascontiguousarray(host).reshape(-1).view(np.uint8))


def _from_rank(data, mesh, placements, dtype, requires_grad, src) -> DistTensor:
    """``shard_tensor(..., src=src)``: Note [Replicas agree]."""
    world = comm.world()
    if isinstance(src, bool) or not isinstance(src, (int, np.integer)) or not 0 <= src < world.size:
        raise ValueError(
            f"shard_tensor: src must be a rank of the world (0..{world.size - 1}), got {src!r}"
        )
    src, rank = int(src), comm.get_rank()
    meta: Any = None
    arr = None
    if rank == src:
        if isinstance(data, DistTensor):
            raise TypeError("shard_tensor(..., src=): data must be an array on rank src")
        arr = backend.to_host(data) if backend.is_device(data) else data
        arr = np.asarray(arr, dtype=dtype)
        meta = (arr.shape, arr.dtype.str) if arr.dtype != object else "object"
    with doing("shard_tensor(src=...)"):
        metas = world.allgather_object(meta)  # every rank learns the shape (and errors) at once
    meta = metas[world.ranks.index(src)]
    if meta == "object":
        raise TypeError(f"shard_tensor needs numeric data; rank {src} passed an object array")
    shape, dt_str = meta
    spec = DistSpec.make(mesh, placements, shape, np.dtype(dt_str), what="shard_tensor")
    if requires_grad:
        _check_grad_dtype(spec.dtype)
    one = ProcessMesh([src])
    held = DistSpec(one, (Replicate(),), spec.shape, spec.dtype)
    be = backend.current()  # every rank's data moves on the selected device
    if rank == src:
        local = be.asarray(np.ascontiguousarray(arr)) if be.device else np.ascontiguousarray(arr)
    else:
        local = be.xp.empty(held.local_shape(None), spec.dtype)
    with doing("shard_tensor(src=...)"):
        out = _reshard.execute(local, held, spec)
    return DistTensor(out if out is not arr else out.copy(), spec, requires_grad)


def dtensor_from_local(
    local: Any,
    mesh: ProcessMesh,
    placements: Sequence[Placement],
    global_shape: Sequence[int] | None = None,
) -> DistTensor:
    """Wrap this rank's shard ``local`` (no copy) as a DistTensor. A device array (CuPy) is
    taken as it is; host data is copied to the device when a GPU is selected
    (``dt.set_device``).

    With ``global_shape=None`` the global shape is worked out from every rank's shard (one small
    all-gather over the mesh), and shards that cannot form a global tensor raise on every rank.
    With ``global_shape`` given, only this rank's shard is checked, with no communication.
    """
    check_world(mesh, "dtensor_from_local")
    local = contiguous(local)
    be = backend.current()
    if be.device and type(local) not in backend.DEVICE_ARRAYS:  # host data, a device selected
        local = be.asarray(local)
    rank = comm.get_rank()
    coord = mesh.get_coord(rank)
    if global_shape is not None:
        spec = DistSpec.make(mesh, placements, global_shape, local.dtype, what="dtensor_from_local")
        want = spec.local_shape(coord)
        bad = coord is not None and local.shape != want
        # Note [Replicas agree]; whether the shard fits too, so every rank raises, naming it
        fit = f"local shape {local.shape} where {want} fits" if bad else "local shape fits"
        agree_on_mesh(mesh, "dtensor_from_local", (spec.shape, spec.dtype, spec.placements, fit))
        if bad:
            raise ValueError(
                f"dtensor_from_local: rank {rank} passed a local shape {local.shape} but global "
                f"shape {spec.shape} with placements {list(spec.placements)} gives it {want} "
                "(shards follow numpy.array_split: the first n % k are one longer)"
            )
        if coord is None:
            local = backend.xp(local).empty(want, local.dtype)
        return DistTensor(local, spec)
    if coord is None:
        raise ValueError(
            f"dtensor_from_local: rank {rank} is not in the mesh {mesh.process_ids}, so it cannot "
            "learn the global shape; pass global_shape=..."
        )
    # Gather first and validate only what every rank then knows, so a bad shard on one rank
    # raises the same error on all of them instead of leaving them in the all-gather.
    infos = comm.group(tuple(mesh.process_ids)).allgather_object((local.shape, local.dtype.str))
    spec = _infer_global(mesh, placements, dict(zip(mesh.process_ids, infos)))
    return DistTensor(local, spec)


def _infer_global(mesh: ProcessMesh, placements, infos: dict[int, tuple]) -> DistSpec:
    ndims = {len(s) for s, _ in infos.values()}
    dtypes = {d for _, d in infos.values()}
    if len(ndims) > 1 or len(dtypes) > 1:
        raise ValueError(
            "dtensor_from_local: ranks passed shards of different ndim or dtype: "
            + ", ".join(f"rank {r}: {s} {np.dtype(d)}" for r, (s, d) in infos.items())
        )
    first = next(iter(infos.values()))[0]
    spec = DistSpec.make(mesh, placements, first, dtypes.pop(), what="dtensor_from_local")
    shape = []
    for axis in range(spec.ndim):
        dims = [m for m, p in enumerate(spec.placements) if p.is_shard(axis)]
        # sum the shard lengths over every coordinate of the mesh dims that split this axis
        total = 0
        for sub in np.ndindex(*[mesh.shape[m] for m in dims]):
            coord = [0] * mesh.ndim
            for m, c in zip(dims, sub):
                coord[m] = c
            total += infos[int(mesh.mesh[tuple(coord)])][0][axis]
        shape.append(total)
    out = spec.replace(shape=tuple(shape))
    bad = [
        (r, s, out.local_shape(mesh.get_coord(r)))
        for r, (s, _) in infos.items()
        if tuple(s) != out.local_shape(mesh.get_coord(r))
    ]
    if bad:
        raise ValueError(
            f"dtensor_from_local: the shards cannot form a global tensor with placements "
            f"{list(spec.placements)}: global shape {tuple(shape)} needs "
            + "; ".join(f"rank {r} to hold {want}, it has {tuple(s)}" for r, s, want in bad)
            + " (shards follow numpy.array_split: the first n % k are one longer)"
        )
    return out


def reshard(x: DistTensor, mesh: ProcessMesh, placements: Sequence[Placement]) -> DistTensor:
    """``x`` with new placements, possibly on another mesh (collective over both meshes).

    >>> import disttensor as dt
    >>> mesh = dt.ProcessMesh([0])
    >>> y = dt.reshard(dt.ones((4,), mesh=mesh, placements=[dt.Partial()]), mesh, [dt.Shard(0)])
    >>> y.placements, y.to_local()
    ([Shard(dim=0)], array([1., 1., 1., 1.]))
    """
    if not isinstance(x, DistTensor):
        raise TypeError(f"reshard needs a DistTensor, got {type(x).__name__}; use dt.shard_tensor")
    spec = x._spec
    try:  # Note [Reshard targets kept on the spec]
        dst, how = spec.__dict__["_to"][(mesh, *placements)]
    except (KeyError, TypeError):
        dst, how = _reshard_target(spec, mesh, placements)
    if comm.world().size <= mesh.max_rank:  # a world without the mesh's ranks (simulate)
        check_world(mesh, "reshard")
    if how is None:  # the same layout
        return x
    out = DistTensor(moved(x, dst, how=how), dst)
    # the same value (Note [Lineage names the tensor]); a rank outside x's mesh may not know
    # how x was made, so a tensor moved across meshes starts a lineage of its own
    out._lin = hash((_CROSS, dst.shape)) if how.cross else x._lin
    if x.requires_grad and autograd._state.enabled:
        # the gradient goes back to the source placements, Partials read as Replicate
        # (Note [Partial gradients] in autograd.py)
        back = x.spec.without_partials()
        autograd.record(
            "reshard", (x,), (out,), lambda gs: (reshard(gs[0], back.mesh, back.placements),)
        )
    return out


# Note [Lineage names the tensor]
#     The agreement check (Note [Ranks agree before a collective] in comm/agree.py) compares
#     what every rank is about to do, but the kind, size, op and specs of a call cannot tell
#     two tensors of one layout apart: rank 0 gathering ``a`` while rank 1 gathers ``b`` of the
#     same spec would exchange each other's data. So every DistTensor carries a lineage
#     (``_lin``), a hash of how the program made it, the same on every rank:
#     * an op's result hashes the op, its attributes and its arguments (``token``: a tensor by
#       its own lineage; a Python or numpy scalar, string, slice or range by value; an array
#       by its shape and dtype; anything else by its type). dispatch's fast paths make the
#       same hash as its general path (``_finish``), and the i-th of several results
#       ``hash((lin, i))``;
#     * a ``shard_tensor`` leaf hashes the crc32 of its data that the ranks of its mesh agreed
#       on (Note [Replicas agree]; 0 where none was made: a 1-rank mesh, ``check=False``);
#       a factory its arguments (``dt.zeros``, ``dt.arange``, the seed and stream of
#       ``dt.rand``);
#     * a result that a numpy function's implementation (``__array_function__``), a slice of
#       a split axis or an advanced index built without dispatch hashes the call
#       (``name_unnamed``);
#     * a write in place mixes a write mark into the target's (``mutation._written``);
#     * ``reshard``, ``detach`` and ``copy`` keep the source's: the value is the same.
#     Each move of a tensor within its mesh (an op's input, ``dt.reshard``, ``numpy()``,
#     ``print``, ``float``, a pending reduction riding along) passes its lineage to
#     ``reshard.execute``, which hands it to the agreement check (``agree.Stack.lin``): it is
#     folded into the fingerprint, and shown as ``tensor #...`` where it is what differs.
#     The lineage depends on nothing a rank holds alone: no counters, ids or addresses
#     (Python's str hash and, before 3.12, hash(None) differ by process, so names go through
#     crc32; every NaN is one token). Two tensors made alike hold the same value, and moving
#     one for the other is harmless. It cannot name what it does not know: shards wrapped by
#     ``dtensor_from_local`` and the tensors the library builds itself (optimizer states, a
#     loaded checkpoint) carry 0, so they and what the same ops make of them look alike; and
#     a tensor moved across meshes starts a lineage of its own (a rank outside the source
#     mesh may not know how the source was made), its move unnamed. A Python scalar that
#     differs by rank (``x * rank``) makes another tensor on each rank, which raises at its
#     next collective: dt's values are global, and such a program has no single-process
#     value. The cost: a tuple hash per op result (about 0.1 us) and one per move.
_NAN = 0x7FF8000000000001  # the token of every NaN: hash(nan) is per object
_NONE = 0x4E4F4E45  # hash(None) is per process before Python 3.12
_ELLIPSIS = 0x2E2E2E
_SLICE = 0x534C4943
_RANGE = 0x52414E47
_ARRAY = 0x41525259
_TOKEN_ITEMS = 64  # at most this many elements of a sequence go in


def code_of(name: str) -> int:
    """A name's stable code (crc32: Python's str hash differs by process)."""
    return zlib.crc32(name.encode())


_SHARD_TENSOR = code_of("shard_tensor")
_CROSS = code_of("reshard across meshes")


def token(v: Any) -> Any:
    """What argument ``v`` adds to an op result's lineage, the same on every rank that passed
    the same value (Note [Lineage names the tensor])."""
    t = type(v)
    if t is int:
        return v
    if t is DistTensor:
        return v._lin
    f = _TOKENS.get(t)
    if f is not None:
        return f(v)
    if isinstance(v, DistTensor):  # a subclass (nn.Parameter)
        return v._lin
    if isinstance(v, np.generic):  # types _TOKENS lacks: a datetime, a string, ...
        return zlib.crc32(str(v).encode("utf-8", "surrogatepass"))
    if isinstance(v, np.ndarray) or t in backend.ARRAYS:  # a view type, a device array
        return _array(v)
    if isinstance(v, np.dtype):
        return _dtype(v)
    if isinstance(v, type):
        return zlib.crc32(f"{v.__module__}.{v.__qualname__}".encode())
    if isinstance(v, (int, float, complex)):  # subclasses (an IntEnum)
        return hash(v) if v == v else _NAN
    return zlib.crc32(t.__qualname__.encode())  # by type: a repr may hold an address


def _number(v: Any) -> Any:
    return v if v == v else _NAN


def _sequence(v: Any) -> int:
    return hash((len(v), *map(token, v[:_TOKEN_ITEMS])))


def _slice(v: Any) -> int:
    a, b, c = v.start, v.stop, v.step
    return hash((_SLICE, _NONE if a is None else token(a), _NONE if b is None else token(b),
                 _NONE if c is None else token(c)))  # fmt: skip


def _array(v: Any) -> int:
    """An array argument: its shape and dtype (its values stay unread: a pass over them
    would cost as much as the op)."""
    return hash((_ARRAY, tuple(v.shape), _dtype(v.dtype)))


def _dtype(d: Any) -> int:
    code = _DTYPES.get(d)
    if code is None:
        code = _DTYPES[d] = zlib.crc32(np.dtype(d).str.encode())
    return code


_DTYPES: dict[Any, int] = {}
_TOKENS: dict[type, Any] = {
    bool: int,
    float: _number,
    complex: _number,
    str: lambda v: zlib.crc32(v.encode("utf-8", "surrogatepass")),
    type(None): lambda v: _NONE,
    tuple: _sequence,
    list: _sequence,
    slice: _slice,
    range: lambda v: hash((_RANGE, v.start, v.stop, v.step)),
    type(Ellipsis): lambda v: _ELLIPSIS,
    np.ndarray: _array,
}
# numpy's numeric scalars hash as the Python values they equal (a NaN is one token)
for _t in (np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128,
           np.clongdouble):  # fmt: skip
    _TOKENS[_t] = _number
for _t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
           np.uint64, np.intc, np.uintc, np.longlong, np.ulonglong):  # fmt: skip
    _TOKENS[_t] = int


def name_unnamed(out: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """``out``, a public function's result, with the lineage of the call (its name and
    arguments) given to each result tensor that has none: one its implementation built
    itself, not through dispatch (a sort's, a concatenation's). An argument handed back
    (``np.asanyarray(x)``) keeps its own: a call that only one rank makes must not rename
    it. Returns ``out``."""
    if isinstance(out, DistTensor):
        if out._lin or _among(out, args, kwargs):
            return out
    elif type(out) is not tuple and type(out) is not list:
        return out
    named = [code_of(k) for k in kwargs]
    lin = hash((code_of(name), *map(token, args), *named, *map(token, kwargs.values())))
    if isinstance(out, DistTensor):
        out._lin = lin
    else:
        for i, o in enumerate(out):
            if isinstance(o, DistTensor) and not o._lin and not _among(o, args, kwargs):
                o._lin = hash((lin, i))
    return out


def _among(t: DistTensor, args: tuple, kwargs: dict) -> bool:
    """Whether tensor ``t`` is one of the arguments (or in a list or tuple of them)."""
    for a in (*args, *kwargs.values()):
        if a is t or ((type(a) is list or type(a) is tuple) and any(e is t for e in a)):
            return True
    return False


def stamp(out: Any, lin: int) -> None:
    """Give an op's result ``out`` (a DistTensor, or a tuple or list of results) lineage
    ``lin``, the i-th element of a sequence ``hash((lin, i))``."""
    if isinstance(out, DistTensor):
        out._lin = lin
    elif type(out) is tuple or type(out) is list:
        for i, o in enumerate(out):
            stamp(o, hash((lin, i)))


# Note [One move per tensor]
#     A tensor moved to a layout is not moved there again: a Partial scalar used by two
#     divisions is reduced once, a vector gathered for two products once. ``moved`` keeps the
#     moved local array on the source tensor (``_moved``: target spec -> the source's local
#     array, the moved one and the number of the latest write in place so far, autograd's
#     write counter) and hands it out again while neither array has been written in place
#     since (nothing written anywhere since: no array to look at) and the source still holds
#     the same array. Every rank decides alike: the moves and writes are the program's, the
#     same on every rank, and nothing depends on a rank's own sizes, so a reuse skips the
#     collective everywhere. Moves that gather (a Shard becoming Replicate) are remembered
#     only up to MEMO_GATHER_BYTES of the tensor's global size, so a sharded tensor is not
#     kept whole beside its shard; other moves keep at most what the source holds. A
#     remembered array is read, never written, by the kernels that get it; dt.reshard's
#     result may hold it, and a write through dt (which counts writes) makes it stale.
MEMO_GATHER_BYTES = 8 << 20


def remembered(x: DistTensor, dst: DistSpec) -> Any:
    """The local array of ``x`` in layout ``dst`` that an earlier move left and that is still
    good (Note [One move per tensor]), else None; no communication."""
    memo = x._moved
    if memo is not None:
        hit = memo.get(dst)
        if hit is not None:
            src, out, seq = hit
            if src is x._local and (
                _LAST_WRITE[0] == seq  # nothing written since, anywhere
                or not (_written_after(src, seq) or _written_after(out, seq))
            ):
                return out
    return None


def moved(x: DistTensor, dst: DistSpec, chain: tuple | None = None, how: Any = None) -> Any:
    """This rank's local array of ``x`` in layout ``dst`` (collective, the first time;
    Note [One move per tensor]). ``chain``: the specs to reshard through, ending with
    ``dst`` (default: ``dst`` alone); ``how``: ``reshard.move(x's spec, dst)``, where the
    caller has it."""
    memo = x._moved
    if memo is not None:  # a tensor never moved (most) skips the call
        out = remembered(x, dst)
        if out is not None:
            return out
    spec = x._spec
    lists = _pending.lists
    items = lists.get(spec.mesh) if lists else None  # the pending reductions of x's mesh
    if items:  # moved now: x is pending no more (Note [Small reductions ride together])
        _drop(items, x)
    one_step = chain is None or len(chain) == 1
    local = _from_root(x, dst) if x._derived is not None and one_step else None
    if local is not None:  # read from the pick's root: remembered like a move
        keep = True
    else:
        if one_step:
            if how is None:
                how = _reshard.move(spec, dst)
            # reduced with pending ones (Note [Small reductions ride together]), or alone
            local = _together(x, dst, items) if items else None
            if local is None:  # named by its lineage (Note [Lineage names the tensor])
                if _recording.rec is None:
                    local = _reshard.execute(x._local, spec, dst, how, x._lin)
                else:  # dt.compile records (Note [Compiled steps] in capture.py)
                    args = (x._local, spec, dst, how, x._lin)
                    local = recording.run(_reshard.execute, args, None, 4)
        else:  # dispatch's bool Partials: reduced first
            if items:
                items.clear()  # a move: what was pending before it no longer rides
            local = x._local
            for step in chain:
                if _recording.rec is None:
                    local = _reshard.execute(local, spec, step, None, x._lin)
                else:
                    args = (local, spec, step, None, x._lin)
                    local = recording.run(_reshard.execute, args, None, 4)
                spec = step
            how = _reshard.move(x._spec, dst)
        keep = not how.gathers or how.nbytes <= MEMO_GATHER_BYTES
    if keep:
        _remember(x, dst, local)
    return local


def _remember(x: DistTensor, dst: DistSpec, local: Any) -> None:
    """Keep ``local``, x's array in layout ``dst``, on x (Note [One move per tensor])."""
    memo = x._moved
    # good while neither array is written after the latest write so far (``remembered``)
    if memo is None:
        memo = x._moved = {}
    memo[dst] = (x._local, local, _LAST_WRITE[0])


def _made(local: Any, spec: DistSpec, lin: int, moved: dict | None = None) -> DistTensor:
    """A new DistTensor of ``local`` and ``spec`` (no gradient) of lineage ``lin`` with the
    remembered moves ``moved`` (``_remember``'s entries): a compiled step's result
    (capture.py), in one call where ``__init__`` and the stores after it cost twice as much."""
    t = _new_tensor(DistTensor)
    t._local = local
    t._spec = spec
    t.requires_grad = False
    t._grad = t._node = t._hooks = t._derived = None
    t._moved = moved
    t._lin = lin
    return t


_new_tensor = object.__new__


def _drop(items: list, t: Any) -> None:
    """Take tensor ``t`` off a pending list (Note [Small reductions ride together])."""
    k = len(items)
    while k:
        k -= 1
        if items[k][0] is t:
            del items[k]


# Note [Small reductions ride together]
#     A program that makes several small Partial tensors before it reads them (k-means'
#     ``counts = onehot.sum(axis=0)`` and ``sums = onehot.T @ X``) would reduce each by an
#     all-reduce of its own where an op first needs it; hand-written MPI puts them in one
#     buffer. So dispatch notes each small Partial result (``note_partial``: Partial and
#     Replicate placements only, a Partial mesh dim of more than one rank, at most
#     PENDING_BYTES) in a short list of pending reductions, one per thread (so per simulated
#     rank). When one of them is reduced (a one-step move to its own layout with the Partials
#     read as Replicate), the others on the list of the same mesh, placements and dtype that
#     were not written since ride in the same all-reduce, packed end to end, up to
#     PENDING_BYTES in all: one call of the combined size, named by the flat reshard. Each
#     keeps its reduced value as a remembered move (Note [One move per tensor]), and dispatch
#     uses that value where an op would have kept the tensor Partial (Note [Reduced values
#     used] in dispatch.py), so ``sums / np.maximum(counts, 1)[:, None]`` is Replicate and
#     nothing is reduced in the next iteration.
#     Every rank of a mesh decides alike: there is one list per mesh (the ranks of a mesh make
#     the ops and moves of its tensors, the others do not), and it holds what the program's
#     ops made on that mesh since the last move of one of its tensors, in their order, not
#     what is still alive (garbage collection can free a tensor at different times on
#     different ranks). An entry leaves the list when an op that makes a Partial result
#     consumes it (so ``X.T @ r / n`` sends only the quotient, not the product too), and when
#     the list is full (PENDING_MAX, oldest first); the list is emptied by every move of a
#     tensor of its mesh (one that reads a pick from its root excepted: the root's move
#     empties it) and, all lists, when ranks are found to diverge (agree.WHEN_DIVERGED: after
#     a RanksDiverged the ranks' lists may differ, and must not make the next calls differ
#     too). The list holds its tensors, so a tensor the program dropped costs its bytes in one
#     batch at most; results that require a gradient (the list would keep their graph alive)
#     and results of ops that only move elements (a view would keep its base alive) are not
#     noted.
PENDING_BYTES = 512
PENDING_MAX = 4
_LAST_WRITE = autograd._last_mutation
_written_after = autograd._written_after


class _Pending(threading.local):
    # per mesh, its pending reductions: (tensor, the number of the latest write when it was
    # made, its ride key)
    lists: dict | None = None


_pending = _Pending()


def _forget_pending() -> None:
    """This thread's pending reductions ride no more (agree.WHEN_DIVERGED)."""
    _pending.lists = None


agree.WHEN_DIVERGED.append(_forget_pending)


def rides(spec: DistSpec) -> Any:
    """Whether a result of ``spec`` is noted as a pending reduction (Note [Small reductions
    ride together]): its ride key, (mesh, placements, dtype) made one object for equal ones,
    else None; kept on the spec."""
    d = spec.__dict__
    if "_rides" in d:
        return d["_rides"]
    key = None
    if (
        math.prod(spec.shape) * spec.dtype.itemsize <= PENDING_BYTES
        and not spec.has_shard()
        and any(p.is_partial() and n > 1 for p, n in zip(spec.placements, spec.mesh.shape))
    ):
        key = (spec.mesh, spec.placements, spec.dtype)
        key = _RIDE_KEYS.setdefault(key, key)
    object.__setattr__(spec, "_rides", key)
    return key


_RIDE_KEYS: dict[tuple, tuple] = {}


def note_partial(out: DistTensor, args: tuple) -> None:
    """Dispatch made ``out``, a small Partial result (``rides``), from ``args``: the inputs
    it consumed leave the pending list, ``out`` joins it."""
    lists = _pending.lists
    if lists is None:
        lists = _pending.lists = {}
    mesh = out._spec.mesh
    items = lists.get(mesh)
    if items is None:
        items = lists[mesh] = []
    elif items:  # the inputs it consumed
        for a in args:
            _drop(items, a)
    items.append((out, _LAST_WRITE[0], out._spec.__dict__["_rides"]))  # rides() set it
    if len(items) > PENDING_MAX:
        del items[0]


def _together(x: DistTensor, dst: DistSpec, items: list) -> Any:
    """``x``'s local array reduced to ``dst`` together with the pending reductions that can
    ride along (None: none can, or ``x`` cannot take them): Note [Small reductions ride
    together]."""
    spec = x._spec
    local = x._local
    pending = items[:]
    items.clear()  # a move: what was pending before it no longer rides
    key = rides(spec)
    if key is None:
        return None
    plain = spec.without_partials()
    if dst is not plain and dst != plain:
        return None
    size = local.nbytes
    riders: list[DistTensor] = []
    for t, seq, k in pending:
        a = t._local
        if (
            k is key
            and type(a) is type(local)
            and size + a.nbytes <= PENDING_BYTES
            and (_LAST_WRITE[0] == seq or not _written_after(a, seq))  # nothing written
            and (t._moved is None or remembered(t, t._spec.without_partials()) is None)
        ):
            riders.append(t)
            size += a.nbytes
    if not riders:
        return None
    n = size // local.itemsize
    hit = _FLAT.get((id(key), n))  # ride keys live for ever: their ids stay theirs
    if hit is None:
        if len(_FLAT) >= 256:
            _FLAT.clear()
        flat = DistSpec(key[0], key[1], (n,), key[2])
        whole = flat.without_partials()
        hit = _FLAT[(id(key), n)] = (flat, whole, _reshard.move(flat, whole))
    others = [t._local for t in riders]
    if _recording.rec is None:
        outs = _packed(local, others, hit[0], hit[1], hit[2], x._lin)
    else:  # dt.compile records (Note [Compiled steps] in capture.py)
        outs = recording.run(_packed, (local, others, *hit, x._lin), None, 5)
    for i, t in enumerate(riders, 1):
        _remember(t, t._spec.without_partials(), outs[i])
    return outs[0]


def _packed(local, others: list, flat: DistSpec, whole: DistSpec, how, lin: int, run=None):
    """``local`` and the arrays ``others`` reduced in one move of their concatenation from
    ``flat`` to ``whole`` (``how``; ``lin``: the lineage it is named by), each back in its
    shape: Note [Small reductions ride together]. ``run``: what moves (``reshard.execute``;
    a compiled step's replay gives its own, capture.py)."""
    parts = [local.reshape(-1)]
    for a in others:
        parts.append(a.reshape(-1))
    flat_local = _reshard._xp(local).concatenate(parts)
    if run is None:
        out = _reshard.execute(flat_local, flat, whole, how, lin)
    else:
        out = run(flat_local, flat, whole, how, lin)
    off = local.size
    res = [out[:off].reshape(local.shape)]
    for a in others:
        res.append(out[off : off + a.size].reshape(a.shape))
        off += a.size
    return tuple(res)


# the flat spec of n packed elements of a ride key, its Partials reduced, and the move
_FLAT: dict[tuple, tuple] = {}


# Note [Picks read from their root]
#     An element or row picked from a split tensor (``A[i]``, ``A[i][j]`` with A split by
#     rows) is Partial(sum): the rank that holds it has the value, the others zeros. Reading
#     it (``abs(A[i][j])``, ``float``, ``if``, a set member) reduces it, one small
#     collective per element, so a double loop over a 120 x 120 matrix made 14,400 of them.
#     A pick (a basic-index getitem whose result is Partial over a mesh dim of more than one
#     rank, from a Partial tensor too: ``counts[:, None]``) therefore remembers its root: the
#     tensor it was picked from (or that tensor's own root), the numpy indexes that lead from
#     the root's whole value to the pick's, and the root's and its own local arrays with
#     their write counters (``_derived``; weak references, so a pick does not keep a large
#     tensor alive). When the pick must become Replicate on every mesh dim, and neither it
#     nor its root was written since, it is read from the root's whole value instead:
#     * if that value is remembered on the root (Note [One move per tensor]): no
#       communication at all;
#     * else once the root has been read this way often enough that gathering it costs
#       fewer bytes than the reads would: ``_reads`` counts them, each read standing for its
#       bytes plus READ_BYTES (the latency of a small collective in bytes), and the root must
#       be small enough to be remembered (MEMO_GATHER_BYTES). A Partial root reduced for its
#       first pick (k-means' ``counts`` for ``counts[:, None]``) costs the same bytes as the
#       pick, and is then remembered for the root's own uses.
#     Every rank decides alike: the picks, reads and writes are the program's. Ranks outside
#     the root's mesh take the ordinary path (nothing to move there). The value is the same:
#     a pick of the reduced root is the reduction of the pick, element by element.
READ_BYTES = 4096


def derive(out: DistTensor, x: DistTensor, index: tuple) -> None:
    """Record that ``out`` is ``x[index]`` (a numpy index of ``x``'s whole value) and is
    Partial: Note [Picks read from their root]."""
    root, keys = x, (index,)
    d = x._derived
    if d is not None and _intact(x, d):
        root = d[0]()
        if root is None:
            root = x
        else:
            keys = d[3] + (index,)
    try:
        out._derived = (
            weakref.ref(root),
            weakref.ref(root._local),
            autograd.version(root._local),
            keys,
            autograd.version(out._local),
        )
    except TypeError:  # an array type without weak references: no root
        out._derived = None


def _intact(x: DistTensor, d: tuple) -> bool:
    """Whether pick ``x`` and its root are as they were when ``x`` was picked."""
    root = d[0]()
    return (
        root is not None
        and root._local is d[1]()
        and autograd.version(root._local) == d[2]
        and autograd.version(x._local) == d[4]
    )


def _from_root(x: DistTensor, dst: DistSpec) -> Any:
    """Pick ``x``'s local array in the all-Replicate ``dst``, read from its root's whole value
    (None: take the ordinary move): Note [Picks read from their root]."""
    d = x._derived
    if _whole(dst) is not dst or not _intact(x, d):  # dst not all Replicate
        return None
    root = d[0]()
    rspec = root._spec
    if rspec.mesh.get_coord(comm.get_rank()) is None:
        return None
    full = _whole(rspec)
    whole = remembered(root, full)
    if whole is None:
        nbytes = math.prod(rspec.shape) * rspec.dtype.itemsize
        reads = getattr(root, "_reads", 0) + 1
        root._reads = reads
        if nbytes > MEMO_GATHER_BYTES:
            return None
        if reads * (math.prod(dst.shape) * dst.dtype.itemsize + READ_BYTES) < nbytes:
            return None
        whole = moved(root, full)
    if _recording.rec is None:
        return _pick(whole, d[3])
    return recording.run(_pick, (whole, d[3]))  # Note [Compiled steps] in capture.py


def _pick(whole: Any, keys: tuple) -> Any:
    """``whole[keys[0]][keys[1]]...``: a pick's value read from its root's whole value."""
    for index in keys:
        whole = whole[index]
    return whole


def _whole(spec: DistSpec) -> DistSpec:
    """``spec`` with every placement Replicate (the spec itself where they are), kept on it:
    a Partial root's is its ``without_partials``, so a pick's read finds the reduced root
    that a ride remembered by identity."""
    whole = spec.__dict__.get("_whole")
    if whole is None:
        if all(p.is_replicate() for p in spec.placements):
            whole = spec
        elif not spec.has_shard():
            whole = spec.without_partials()
        else:
            mesh = spec.mesh
            whole = _target(mesh, (Replicate(),) * mesh.ndim, spec.shape, spec.dtype)
        object.__setattr__(spec, "_whole", whole)
    return whole


# Note [Reshard targets kept on the spec]
#     ``dt.reshard(x, mesh, placements)`` in a loop (a loss read every step, a Partial
#     scalar made Replicate) finds its validated target spec and its planned move in a small
#     dict on x's spec (``_to``: (mesh, *placements) -> (target, move), None for no move),
#     one lookup, instead of validating the placements, comparing specs and looking the plan
#     up by both specs' hashes each call. The dict lives and dies with the spec (specs of
#     tensors made per step come from the dispatch plan's cached specs, so it fills once),
#     and holds at most a few targets per spec. Only the world check is made every call: a
#     spec may outlive a dt.simulate world.
_TARGETS_PER_SPEC = 8


def _reshard_target(spec: DistSpec, mesh: ProcessMesh, placements: Any) -> tuple:
    """(validated target spec, its move from ``spec`` or None when nothing moves), kept on
    ``spec`` when the placements can key a dict (Note [Reshard targets kept on the spec]);
    raises for bad placements or a mesh of ranks this world does not have."""
    check_world(mesh, "reshard")
    dst = None
    if isinstance(placements, (list, tuple)):
        # validated and cached (placements that cannot key the cache: make says why)
        with contextlib.suppress(TypeError):
            dst = _target(mesh, tuple(placements), spec.shape, spec.dtype)
    if dst is None:
        dst = DistSpec.make(mesh, placements, spec.shape, spec.dtype, what="reshard")  # raises
    same = (dst.mesh is spec.mesh and dst.placements == spec.placements) or dst == spec
    hit = (dst, None if same else _reshard.move(spec, dst))
    if isinstance(placements, (list, tuple)):
        with contextlib.suppress(TypeError):  # placements that cannot key the dict
            spec.kept("_to", (mesh, *placements), lambda: hit, _TARGETS_PER_SPEC)
    return hit


@lru_cache(maxsize=4096)
def _target(mesh: ProcessMesh, placements: tuple, shape: tuple, dtype: np.dtype) -> DistSpec:
    """Validated target specs, cached: a repeated reshard skips the validation work."""
    return DistSpec.make(mesh, placements, shape, dtype, what="reshard")
