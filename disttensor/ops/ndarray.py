"""The rest of ``numpy.ndarray``'s surface on DistTensors (the numpy functions dt implements are
in ops/numpy_interop.py).

Each public attribute of ``numpy.ndarray`` is, on a DistTensor (tensor.py delegates here):

* metadata, read with no communication (``shape``, ``nbytes``, ``flags``, ``device``, ...);
* an op with a rule (``x.conj()``, ``x.round(2)``, ``x.dot(y)``, ``x.diagonal()`` of a square
  matrix), or numpy's function through ``__array_function__`` (ops/numpy_interop.py, else
  the counted replicate fallback, which is numpy's exact result), which also writes ``out=``;
* a local computation: ``copy``, ``view``, ``getfield``, ``byteswap`` on each shard, and
  ``partition``/``argpartition``/``take`` along an axis made whole first (Note [Along one
  axis]); ``sort``/``argsort`` sort split axes without gathering (ops/sorting.py);
* a write through ops/mutation.py, so every alias sees it: ``fill``, ``sort``, ``partition``,
  ``put``, ``setfield``, ``byteswap(inplace=True)``, ``x.flat[i] = v``; ``resize`` replaces
  the tensor's shard and spec in place;
* a collective conversion to Python: ``tolist``, ``item``, ``tobytes``, ``dumps``, ``dump``,
  ``tofile``, ``format(x, spec)``;
* refused with a reason (REFUSED): ``strides``, ``ctypes``, ``data``, ``base``.

On device shards (Note [Array backends] in backend.py) the local computations run with the
shard's array module (``xp.take``, ``xp.partition``...) and the writes through the device
writes of ops/mutation.py, with the host run's communication; index arguments (``take``'s
and ``put``'s indices, ``kth``) are metadata checked on the host, as numpy checks them, and
moved to the device. ``getfield``, ``setfield`` and ``byteswap`` stay host-only
(NotImplementedError naming them and GPU): CuPy's ndarray has none of them.

Note [Along one axis]
    partition, argpartition and take treat each 1-D lane along ``axis`` on its
    own. With that axis whole on every rank (the mesh dims that split it gathered, an
    all-gather over those mesh dims only) each rank computes its own lanes with numpy, and
    the result keeps the other axes' splits. Partial inputs are reduced first, except for
    take, which only moves elements (so every Partial passes through exactly). On a device
    the lanes are CuPy's ``partition``/``argpartition``/``take``: CuPy has no ``kind`` and
    no ``mode``, so numpy's only kind is checked and ``take``'s indices are made in bounds
    for the mode on the host; numpy's kth checks run on the host too (CuPy's messages
    differ). A partition fixes only the kth positions: the others may hold other values on a
    GPU than on the CPU (numpy leaves their order unspecified; CuPy sorts more).

>>> import numpy as np, disttensor as dt
>>> def program():
...     mesh = dt.ProcessMesh([0, 1])
...     x = dt.shard_tensor(np.array([[3.0, 1.0, 2.0], [9.0, 7.0, 8.0]]), mesh, [dt.Shard(0)])
...     y = x            # an alias
...     y.sort(axis=1)   # each rank sorts the rows it holds: no communication
...     return x.tolist(), x.nbytes, x.copy().placements
>>> dt.simulate(2, program)[0]
([[1.0, 2.0, 3.0], [7.0, 8.0, 9.0]], 48, [Shard(dim=0)])
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import autograd, backend, comm
from ..accounting import outside_rules
from ..dispatch import fallback
from ..placement import Replicate, Shard
from ..spec import DistSpec
from ..tensor import DistTensor, from_spec_block, reshard
from . import indexing, mutation
from . import reduction as red
from . import shape as sh
from .elementwise import OPS as EW
from .elementwise import astype as _astype

_R = Replicate()
_type = type  # the builtin, for functions with numpy's ``type`` parameter


class Unsupported(TypeError):
    """Arguments an implementation does not take: ``__array_function__`` then runs numpy's
    function through the replicate fallback (exact)."""


# -- refused attributes ----------------------------------------------------------------------
REFUSED = {
    "strides": "a DistTensor has no global memory layout (each rank holds its shard in a "
    "buffer of its own), so global strides mean nothing; x.to_local().strides are this rank's",
    "ctypes": "there is no global buffer to hand to C code; use x.to_local().ctypes for this "
    "rank's shard, or x.numpy().ctypes for a gathered copy (collective)",
    "data": "there is no global buffer to expose; use x.to_local().data for this rank's "
    "shard, or x.numpy().data for a gathered copy (collective)",
    "base": "DistTensors do not record which tensor they view (a shard may be a view, a copy "
    "or data fetched from other ranks, depending on the placements), so there is no base to "
    "report",
}


def refused(name: str) -> NotImplementedError:
    """The error of a refused ``numpy.ndarray`` attribute, naming it and why."""
    return NotImplementedError(f"DistTensor.{name} is not supported: {REFUSED[name]}")


# -- small helpers ----------------------------------------------------------------------------
def _coord(spec) -> tuple[int, ...] | None:
    return spec.mesh.get_coord(comm.get_rank())


def _make(local: Any, spec, like: Any) -> DistTensor:
    """A DistTensor of this rank's result ``local`` on the backend of ``like`` (the input's
    shard); ranks outside the mesh: an empty shard."""
    be = backend.of(like)
    if _coord(spec) is None:
        local = be.xp.empty(spec.local_shape(None), spec.dtype)
    return DistTensor(be.asarray(local), spec)


def _to(x: DistTensor, placements: list) -> DistTensor:
    """``x`` with ``placements`` (itself when it has them already)."""
    return x if tuple(placements) == x._spec.placements else reshard(x, x.mesh, placements)


def _plain(x: DistTensor) -> DistTensor:
    """``x`` with its Partial mesh dims reduced: for ops that are not linear (bit-level)."""
    return _to(x, list(x._spec.without_partials().placements))


def _no_gradient(name: str, inputs: tuple, out: DistTensor) -> DistTensor:
    """Record ``out`` as made by ``name``, which has no gradient: a backward through it
    refuses (instead of silently cutting the graph)."""
    if out.dtype.kind in "fc" and autograd.is_grad_enabled():
        if any(getattr(t, "requires_grad", False) for t in inputs):
            autograd.record(name, inputs, (out,), None)
    return out


_GATHERED = "a DistTensor argument: gathered"


def _gathered(v: Any, name: str) -> Any:
    """A DistTensor argument's global value on the host (collective, accounted: Note
    [Communication outside rules] in dispatch.py); anything else as it is."""
    if not isinstance(v, DistTensor):
        return v
    with outside_rules(name, _GATHERED, always=False):
        return v.numpy()


def _host_index(x: DistTensor, v: Any, name: str) -> Any:
    """An index argument of an op on ``x`` (indices, kth, a flat key) as host data: a
    DistTensor gathered, a device array copied out (indices are metadata the ranks plan
    with: Note [Keys on a device] in ops/indexing.py); TypeError for another backend's."""
    return _gathered(indexing.host_key(name, x, v), name)


# -- metadata (no communication) --------------------------------------------------------------
class Flags:
    """``x.flags``: the memory flags numpy shows, read live. Contiguity describes the global
    value as ``x.numpy()`` lays it out (C order); ``writeable``, ``aligned`` and ``owndata``
    are those of this rank's shard, and setting ``writeable``/``aligned``
    (``x.flags.writeable = False``, ``x.flags["W"] = False``) sets them on every shard, as
    ``x.setflags`` does."""

    _KEYS: ClassVar[dict[str, str]] = {
        "C_CONTIGUOUS": "c_contiguous",
        "F_CONTIGUOUS": "f_contiguous",
        "OWNDATA": "owndata",
        "WRITEABLE": "writeable",
        "ALIGNED": "aligned",
        "WRITEBACKIFCOPY": "writebackifcopy",
        "FNC": "fnc",
        "FORC": "forc",
        "BEHAVED": "behaved",
        "CARRAY": "carray",
        "FARRAY": "farray",
        "C": "c_contiguous",
        "F": "f_contiguous",
        "O": "owndata",
        "W": "writeable",
        "A": "aligned",
        "X": "writebackifcopy",
    }
    __slots__ = ("_x",)

    def __init__(self, x: DistTensor) -> None:
        object.__setattr__(self, "_x", x)

    c_contiguous = property(lambda self: True)
    # numpy: a C-contiguous array is F-contiguous too when at most one axis is longer than 1
    f_contiguous = property(lambda self: sum(n > 1 for n in self._x.shape) <= 1)
    owndata = property(lambda self: self._x.to_local().flags.owndata)
    writeable = property(lambda self: self._x.to_local().flags.writeable)
    aligned = property(lambda self: self._x.to_local().flags.aligned)
    writebackifcopy = property(lambda self: False)
    fnc = property(lambda self: self.f_contiguous and not self.c_contiguous)
    forc = property(lambda self: True)
    behaved = property(lambda self: self.aligned and self.writeable)
    carray = property(lambda self: self.behaved and self.c_contiguous)
    farray = property(lambda self: self.behaved and self.fnc)

    def __getitem__(self, key: str) -> bool:
        name = self._KEYS.get(str(key).upper())
        if name is None:
            raise KeyError(f"Unknown flag {key!r}")
        return getattr(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        flag = {"writeable": "write", "aligned": "align", "writebackifcopy": "uic"}.get(name)
        if flag is None:
            raise AttributeError(f"attribute {name!r} of flags is not writable")
        setflags(self._x, **{flag: value})

    def __setitem__(self, key: str, value: Any) -> None:
        name = self._KEYS.get(str(key).upper())
        if name is None:
            raise KeyError(f"Unknown flag {key!r}")
        setattr(self, name, value)

    def __repr__(self) -> str:
        keys = ("C_CONTIGUOUS", "F_CONTIGUOUS", "OWNDATA", "WRITEABLE", "ALIGNED")
        return "".join(f"  {k} : {self[k]}\n" for k in (*keys, "WRITEBACKIFCOPY"))


def setflags(x: DistTensor, write: Any = None, align: Any = None, uic: Any = None) -> None:
    """``x.setflags``: numpy's flags set on this rank's shard (every rank does the same)."""
    x.to_local().setflags(write=write, align=align, uic=uic)


def mT(x: DistTensor) -> DistTensor:
    """``x.mT``: the last two axes swapped."""
    if x.ndim < 2:
        raise ValueError("matrix transpose with ndim < 2 is undefined")
    return sh.swapaxes(x, -2, -1)


def to_device(x: DistTensor, device: Any, stream: Any = None) -> DistTensor:
    """``x.to_device(device)``: ``x`` itself where its shards are there already, else a new
    leaf whose shards are copies on ``device`` ("cpu", "gpu" or a registered device: Note
    [Array backends] in backend.py), with ``x``'s spec; no communication.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.ones(2), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> x.to_device("cpu") is x
    True
    """
    if stream is not None:
        raise ValueError("The stream argument in to_device() is not supported")
    src = backend.of(x._local)
    try:
        dst = backend.select(device)
    except RuntimeError as e:  # "gpu" without CuPy or a GPU: numpy's error for a device
        raise ValueError(f"Unsupported device: {device} ({e})") from None
    if dst is src:
        return x
    local = backend.to_host(x._local) if src.device else x._local
    if dst.device:
        local = dst.from_host(local)
    return DistTensor(local, x._spec)


def set_real(x: DistTensor, value: Any) -> None:
    """``x.real = value``: in place (the imaginary part of a complex tensor kept)."""
    if x.dtype.kind == "c":
        value = EW["add"](value, EW["multiply"](EW["imag"](x), 1j))
    mutation.assign(x, value)


def set_imag(x: DistTensor, value: Any) -> None:
    """``x.imag = value``: in place, complex tensors only (numpy's TypeError otherwise)."""
    if x.dtype.kind != "c":
        raise TypeError("array does not have imaginary part to set")
    mutation.assign(x, EW["add"](EW["real"](x), EW["multiply"](value, 1j)))


# -- methods with numpy's other arguments ---------------------------------------------------------
def astype(x: DistTensor, dtype: Any, casting: str = "unsafe", copy: bool = True) -> DistTensor:
    """``x.astype(dtype, casting=..., copy=...)``: numpy's casting check; ``copy=False``
    returns ``x`` when it has the dtype already."""
    dtype = np.dtype(dtype)
    if not np.can_cast(x.dtype, dtype, casting):
        raise TypeError(
            f"Cannot cast array data from {x.dtype!r} to {dtype!r} according to the rule "
            f"{casting!r}"
        )
    return x if dtype == x.dtype and not copy else _astype(x, dtype)


def in_order(x: DistTensor, order: str, fn: Callable) -> DistTensor:
    """``fn`` (ravel/flatten) of ``x`` read in ``order``: 'F' is the C order of ``x.T``; 'A'
    and 'K' are 'C' (a DistTensor's global value is C-ordered, see Flags)."""
    if order == "F":
        return fn(sh.transpose(x))
    if order in ("C", "A", "K", None):
        return fn(x)
    raise ValueError(f"order must be one of 'C', 'F', 'A', or 'K' (got {order!r})")


def reshape(x: DistTensor, shape: Any, order: str = "C", copy: Any = None) -> DistTensor:
    """``x.reshape(shape, order=..., copy=...)``: 'F' reads and writes the elements
    column-major (``x.T`` reshaped to the reversed shape, transposed back)."""
    if order == "F":
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        out = sh.transpose(sh.reshape(sh.transpose(x), shape[::-1]))
    elif order in ("C", "A"):
        out = sh.reshape(x, shape)
    else:
        raise ValueError(f"order must be one of 'C', 'F', 'A' (got {order!r})")
    return _copy(out) if copy else out


def sort_in_place(x: DistTensor, axis: Any, kind: Any, order: Any, stable: Any) -> None:
    """``x.sort(axis)``: np.sort's result written into ``x`` (aliases see it)."""
    if axis is None:
        raise TypeError("'NoneType' object cannot be interpreted as an integer")
    mutation.check_writable(x, None, "sort")
    mutation.assign(x, np.sort(x, axis=axis, kind=kind, order=order, stable=stable))


def partition_in_place(x: DistTensor, kth: Any, axis: Any, kind: str, order: Any) -> None:
    """``x.partition(kth, axis)``: np.partition's result written into ``x``."""
    if axis is None:
        raise TypeError("'NoneType' object cannot be interpreted as an integer")
    mutation.check_writable(x, None, "partition")
    mutation.assign(x, np.partition(x, kth, axis=axis, kind=kind, order=order))


# -- copies and views: local, no communication ------------------------------------------------
def copy(x: Any, order: str = "C") -> Any:
    """``x.copy()``: a copy of each rank's shard, same placements, no communication (its
    gradient is the identity)."""
    if not isinstance(x, DistTensor):
        return np.copy(x, order=order)
    out = DistTensor(x._local.copy(), x._spec)
    out._lin = x._lin  # the same value (Note [Lineage names the tensor] in tensor.py)
    if x.requires_grad and autograd.is_grad_enabled():
        autograd.record("copy", (x,), (out,), lambda gs: (gs[0],))
    return out


_copy = copy  # for functions with numpy's ``copy`` parameter


def deepcopy(x: DistTensor, memo: dict) -> DistTensor:
    """``copy.deepcopy(x)``: a new leaf with a copy of the shard (and of ``.grad``)."""
    import copy as copy_module

    out = type(x).__new__(type(x))
    DistTensor.__init__(out, x._local.copy(), x._spec, x.requires_grad and x.is_leaf)
    out._lin = x._lin
    memo[id(x)] = out
    if x.grad is not None:
        out.grad = copy_module.deepcopy(x.grad, memo)
    return out


def view(x: DistTensor, dtype: Any = None, type: Any = None) -> DistTensor:
    """``x.view()`` / ``x.view(dtype)``: a new DistTensor sharing each rank's shard memory (a
    write through either shows in the other). A dtype of another item size changes the last
    axis, which must then not be split; the bits of a Partial value are not a view of its
    global value, so Partial tensors are refused."""
    if isinstance(dtype, _type) and issubclass(dtype, (np.ndarray, DistTensor)):
        dtype, type = None, dtype
    if type is not None and not (isinstance(type, _type) and issubclass(type, DistTensor)):
        raise NotImplementedError(
            "DistTensor.view(type=...): a DistTensor cannot be viewed as another array type; "
            "x.to_local().view(...) views this rank's shard, x.numpy() is the gathered value"
        )
    spec = x._spec
    if dtype is None or np.dtype(dtype) == spec.dtype:
        out = DistTensor(x._local.view(), spec)
        if x.requires_grad and autograd.is_grad_enabled():
            autograd.record("view", (x,), (out,), lambda gs: (gs[0],))
        return out
    dtype = np.dtype(dtype)
    if spec.has_partial():
        raise NotImplementedError(
            f"DistTensor.view({dtype}) of a Partial tensor: its shards' bits are not the bits "
            "of its global value; reshard it to Shard/Replicate placements first"
        )
    shape = spec.shape
    if dtype.itemsize != spec.dtype.itemsize:
        last = spec.ndim - 1
        if last >= 0 and any(p.is_shard(last) for p in spec.placements):
            raise NotImplementedError(
                f"DistTensor.view({dtype}) changes the length of the last axis, which is split "
                "over the mesh (the shards would not split the new length as numpy.array_split "
                "does); reshard that axis whole first"
            )
        # numpy's checks and errors, on a stand-in of the last axis
        last_axis = np.empty(shape[-1:], spec.dtype).view(dtype)
        shape = shape[:-1] + last_axis.shape
    out_spec = spec.replace(dtype=dtype, shape=shape)
    local = x._local.view(dtype) if _coord(spec) is not None else None
    return _make(local, out_spec, x._local)


def getfield(x: DistTensor, dtype: Any, offset: int = 0) -> DistTensor:
    """``x.getfield(dtype, offset)``: each element's bytes at ``offset`` read as ``dtype``, on
    each shard (Partials reduced first: bits are not linear). Host shards only: CuPy's
    ndarray has no getfield."""
    backend.host_only("getfield", x, dtype, offset)
    y = _plain(x)
    spec = y._spec.replace(dtype=np.dtype(dtype))
    np.empty(0, x.dtype).getfield(dtype, offset)  # numpy's errors, on every rank alike
    local = y._local.getfield(dtype, offset) if _coord(spec) is not None else None
    return _no_gradient("getfield", (y,), _make(local, spec, y._local))


def setfield(x: DistTensor, val: Any, dtype: Any, offset: int = 0) -> None:
    """``x.setfield(val, dtype, offset)``: written in place (aliases see it). Host shards
    only: CuPy's ndarray has no setfield."""
    backend.host_only("setfield", x, val, dtype, offset)
    mutation.check_writable(x, val, "setfield")
    np.empty(0, x.dtype).getfield(dtype, offset)  # numpy's errors, on every rank alike
    if isinstance(val, DistTensor) or np.ndim(val) != 0:
        new = fallback("setfield", _on_copy(np.ndarray.setfield), (x, val, dtype, offset), {})
    else:
        y = _plain(x)
        local = y._local.copy()
        local.setfield(val, dtype, offset)
        new = DistTensor(local, y._spec)
    mutation.assign(x, new)


def byteswap(x: DistTensor, inplace: bool = False) -> DistTensor:
    """``x.byteswap()``: each shard's bytes swapped (Partials reduced first); ``inplace=True``
    writes the result into ``x`` (aliases see it) and returns ``x``. Host shards only:
    CuPy's ndarray has no byteswap."""
    backend.host_only("byteswap", x, inplace)
    y = _plain(x)
    out = DistTensor(y._local.byteswap(), y._spec)
    if not inplace:
        return _no_gradient("byteswap", (y,), out)
    mutation.assign(x, out)
    return x


# -- writes (ops/mutation.py) --------------------------------------------------------------------
def fill(x: DistTensor, value: Any) -> None:
    """``x.fill(value)``: every element set to the scalar ``value``, in place, no
    communication."""
    if np.ndim(value) != 0:
        raise ValueError("setting an array element with a sequence.")
    mutation.assign(x, value)


def _flat_indices(x: DistTensor, ind: Any, mode: str) -> np.ndarray:
    """Flat indices of ``put``/``x.flat[...] =`` as numpy resolves them for ``mode``."""
    idx = np.asarray(_host_index(x, ind, "put"))
    if idx.dtype.kind not in "iub":
        idx = idx.astype(np.intp, casting="same_kind")  # numpy's TypeError for floats
    idx = idx.astype(np.intp).ravel()
    n = x.size
    if mode == "raise":
        bad = idx[(idx < -n) | (idx >= n)]
        if bad.size:
            raise IndexError(f"index {bad[0]} is out of bounds for axis 0 with size {n}")
        return idx % n if n else idx
    if mode == "wrap":
        if n == 0 and idx.size:
            raise IndexError("cannot do a non-empty take from an empty axes.")
        return idx % n if n else idx
    if mode == "clip":
        if n == 0 and idx.size:
            raise IndexError("cannot do a non-empty take from an empty axes.")
        return np.clip(idx, 0, max(n - 1, 0))
    raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")


def put(x: DistTensor, indices: Any, values: Any, mode: str = "raise") -> None:
    """``x.put(indices, values, mode)``: flat positions set in place (values repeated as
    numpy does), each rank writing the positions it holds (a DistTensor value gathered on its
    own device)."""
    mutation.check_writable(x, values, "put")
    mutation.same_device("put", x, values)
    idx = _flat_indices(x, indices, mode)
    if isinstance(values, DistTensor):
        with outside_rules("put", _GATHERED, always=False):
            values = mutation.global_value(values)
    vb = backend.of(values)  # numpy for host values
    v = vb.asarray(values).ravel()
    if idx.size == 0 or v.size == 0:
        return
    # numpy's rule (np.resize): repeated cyclically, extra values ignored
    v = vb.xp.tile(v, -(-idx.size // v.size))[: idx.size]
    if x.ndim == 0:
        mutation.assign(x, v[-1])
        return
    mutation.setitem(x, np.unravel_index(idx, x.shape), v)


def resize(x: DistTensor, new_shape: Any, refcheck: bool = True) -> None:
    """``x.resize(new_shape)``: in place, as numpy: the elements in C order, cut or padded
    with zeros. The tensor gets a new shard and spec (its placements kept where they fit the
    new shape); every reference to ``x`` sees it, but not tensors made from ``x`` before."""
    if new_shape is None:  # x.resize(): nothing to do
        return
    shape = (new_shape,) if isinstance(new_shape, (int, np.integer)) else tuple(new_shape)
    if any(operator.index(n) < 0 for n in shape):
        raise ValueError("negative dimensions not allowed")
    mutation.check_writable(x, None, "resize")
    n, size = math.prod(shape), x.size
    with autograd.no_grad():
        flat = sh.ravel(x)
        if n <= size:
            flat = sh.getitem(flat, slice(0, n))
        else:
            be = backend.of(x._local)  # zeros on x's own device
            pad_spec = DistSpec.make(x.mesh, [_R] * x.mesh.ndim, (n - size,), x.dtype)
            pad = from_spec_block(lambda _: be.xp.zeros(n - size, x.dtype), pad_spec, on=be)
            flat = sh.concatenate([flat, pad])
        out = sh.reshape(flat, shape)
        keep = [p for p in x._spec.placements if not p.is_shard() or p.dim < len(shape)]
        if len(keep) == x.mesh.ndim:
            out = _to(out, keep)
    x._local, x._spec = out._local, out._spec
    autograd.note_mutation(x._local)  # tapes that saved x refuse (Note [Mutation and autograd])


def _on_copy(func: Callable) -> Callable:
    """``func`` (which writes into its first argument) applied to a copy, which it returns."""

    def run(a, *args, **kwargs):
        b = np.array(a, copy=True)
        func(b, *args, **kwargs)
        return b

    return run


# -- Python values (collective over the mesh) ----------------------------------------------------
def item(x: DistTensor, *args: Any) -> Any:
    """``x.item()`` / ``x.item(i)`` / ``x.item(i, j)``: one element as a Python scalar
    (collective: only that element moves)."""
    if not args:
        if x.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return x.numpy().reshape(()).item()
    if len(args) == 1 and isinstance(args[0], tuple):
        args = args[0]
    if len(args) == 1:
        i = operator.index(args[0])
        if not -x.size <= i < x.size:
            raise IndexError(f"index {i} is out of bounds for axis 0 with size {x.size}")
        key = np.unravel_index(i % x.size, x.shape)
    elif len(args) != x.ndim:
        raise ValueError("incorrect number of indices for array")
    else:
        key = tuple(operator.index(i) for i in args)
        for axis, (i, n) in enumerate(zip(key, x.shape)):
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
    return sh.getitem(x, tuple(int(i) for i in key)).numpy().item()


def index(x: DistTensor) -> int:
    """``operator.index(x)``: a 0-d integer tensor's value (collective)."""
    if x.ndim != 0 or x.dtype.kind not in "iu":
        raise TypeError("only integer scalar arrays can be converted to a scalar index")
    return int(x.numpy())


def format_(x: DistTensor, spec: str) -> str:
    """``format(x, spec)``: a 0-d tensor formats its value as numpy's scalars do; others
    only with an empty spec, as ``str(x)`` (both collective)."""
    if x.ndim == 0:
        return format(x.numpy()[()], spec)
    if spec:
        raise TypeError("unsupported format string passed to DistTensor.__format__")
    return str(x)


def contains(x: DistTensor, value: Any) -> bool:
    """``value in x``: ``(x == value).any()``, as numpy (collective)."""
    return bool(red.any(EW["equal"](x, value)))


def iterate(x: DistTensor):
    """``iter(x)``: ``x[0], x[1], ...`` along the first axis, as DistTensors."""
    if x.ndim == 0:
        raise TypeError("iteration over a 0-d array")
    return (sh.getitem(x, i) for i in range(x.shape[0]))


def round_(x: Any, decimals: int = 0, out: Any = None) -> Any:
    """``np.round(x, decimals)``: elementwise, on any placements."""
    if out is not None:
        raise Unsupported("out=")
    if not isinstance(x, DistTensor):
        return np.round(x, decimals)
    return EW["round"](x, decimals) if decimals else EW["round"](x)


def _is_path(f: Any) -> bool:
    return isinstance(f, (str, os.PathLike))


def _write_file(x: DistTensor, f: Any, write: Callable[[np.ndarray, Any], None]) -> None:
    """Gather ``x`` (collective); a path is written by the first rank of the mesh while the
    others wait, so the file is complete on every rank when this returns; an open file
    object is written by every rank (each holds its own)."""
    value = x.numpy()
    ranks = tuple(x.mesh.process_ids)
    if not _is_path(f):
        write(value, f)
        return
    if comm.get_rank() == ranks[0]:
        write(value, f)
    comm.group(ranks).barrier()


def dump(x: DistTensor, file: Any) -> None:
    """``x.dump(file)``: the gathered value pickled to ``file`` (collective)."""
    _write_file(x, file, lambda v, f: v.dump(f))


def tofile(x: DistTensor, fid: Any, sep: str = "", format: str = "%s") -> None:
    """``x.tofile(fid)``: the gathered value written to ``fid`` (collective)."""
    _write_file(x, fid, lambda v, f: v.tofile(f, sep=sep, format=format))


# -- x.flat ------------------------------------------------------------------------------------
class FlatIter:
    """``x.flat``: the elements in C order. Iteration gathers the value once (collective);
    ``x.flat[i]`` is a numpy scalar (collective), ``x.flat[2:5]`` and ``x.flat[[1, 3]]`` are
    1-D DistTensors; ``x.flat[key] = value`` writes into ``x`` in place (as ``x.put``)."""

    def __init__(self, x: DistTensor) -> None:
        self.base = x

    def __len__(self) -> int:
        return self.base.size

    def __iter__(self):
        return iter(self.base.numpy().flat)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.base.numpy().ravel()
        return out if dtype is None else out.astype(dtype, copy=False)

    def copy(self) -> DistTensor:
        """A 1-D copy of the elements (``x.flatten()``)."""
        return sh.flatten(self.base)

    def __getitem__(self, key: Any) -> Any:
        flat = sh.ravel(self.base)
        if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
            return sh.getitem(flat, key).numpy()[()]  # a numpy scalar, as numpy's
        return sh.getitem(flat, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        n = self.base.size
        if isinstance(key, slice):
            idx = np.arange(*key.indices(n))
        elif isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
            idx = np.array([int(key)])
        else:
            k = np.asarray(_host_index(self.base, key, "flat[key] ="))
            idx = np.flatnonzero(k) if k.dtype == np.bool_ else k
        put(self.base, idx, value)

    def __repr__(self) -> str:
        return f"<DistTensor flat iterator over {self.base.size} elements>"


# -- along one axis (Note [Along one axis]) ---------------------------------------------------
def along_axis(x: DistTensor, axis: int, keep_partials: bool = False) -> DistTensor:
    """``x`` with ``axis`` whole on every rank (mesh dims that split it Replicate); Partial
    mesh dims reduced unless ``keep_partials``; the other splits kept."""
    pls = []
    for p in x._spec.placements:
        if (p.is_shard() and p.dim == axis) or (p.is_partial() and not keep_partials):
            p = _R
        pls.append(p)
    return _to(x, pls)


def _lanes(name: str, x: DistTensor, axis: Any, fn: Callable, dtype: Any) -> DistTensor:
    """``fn(local, axis)`` on the shards with ``axis`` made whole; ``axis=None``: flattened."""
    if axis is None:
        x, axis = sh.ravel(x), 0
    axis = normalize_axis_index(operator.index(axis), x.ndim)
    y = along_axis(x, axis)
    spec = y._spec.replace(dtype=np.dtype(dtype))
    local = fn(y._local, axis) if _coord(spec) is not None else None
    return _no_gradient(name, (y,), _make(local, spec, y._local))


def _no_order(order: Any) -> None:
    if order is not None:
        raise Unsupported("order= (structured dtypes)")


def sort(a: Any, axis: Any = -1, kind: Any = None, order: Any = None, *, stable: Any = None):
    """``np.sort``: distributed along split axes, ops/sorting.py (imported here lazily: it
    builds on this module)."""
    from . import sorting

    return sorting.sort(a, axis, kind, order, stable=stable)


def argsort(a: Any, axis: Any = -1, kind: Any = None, order: Any = None, *, stable: Any = None):
    """``np.argsort``: distributed along split axes, ops/sorting.py."""
    from . import sorting

    return sorting.argsort(a, axis, kind, order, stable=stable)


def partition(a: Any, kth: Any, axis: Any = -1, kind: str = "introselect", order: Any = None):
    """``np.partition``: each lane along ``axis`` on the rank holding it."""
    _no_order(order)
    if not isinstance(a, DistTensor):
        raise Unsupported("no DistTensor to partition")
    kth = _host_index(a, kth, "partition")
    return _lanes("partition", a, axis, _selection("partition", kth, kind), a.dtype)


def argpartition(a: Any, kth: Any, axis: Any = -1, kind: str = "introselect", order: Any = None):
    """``np.argpartition``: each lane along ``axis`` on the rank holding it."""
    _no_order(order)
    if not isinstance(a, DistTensor):
        raise Unsupported("no DistTensor to partition")
    kth = _host_index(a, kth, "argpartition")
    return _lanes("argpartition", a, axis, _selection("argpartition", kth, kind), np.intp)


def _selection(name: str, kth: Any, kind: str) -> Callable:
    """The lane function of np.partition/np.argpartition (``name``): numpy's own on host
    shards; on a device the module's, which has no ``kind`` and other errors, so numpy's
    checks run first (Note [Along one axis])."""

    def run(v: Any, axis: int) -> Any:
        be = backend.of(v)
        if not be.device:
            return getattr(np, name)(v, kth, axis, kind)
        n = v.shape[axis]
        k = np.asarray(kth)
        ok = kind == "introselect" and k.dtype.kind in "iu" and k.ndim <= 1
        if not (ok and ((k >= -n) & (k < n)).all()):
            getattr(np, name)(np.zeros(n, np.int8), kth, kind=kind)  # numpy's error
        k = np.where(k < 0, k + n, k).tolist()  # Python ints, as CuPy takes them
        if k == []:  # no kth: numpy leaves the lanes as they are (CuPy would sort them)
            if name == "partition":
                return v.copy()
            lane = be.xp.arange(n, dtype=np.intp).reshape(
                [-1 if d == axis else 1 for d in range(v.ndim)]
            )
            return be.xp.ascontiguousarray(be.xp.broadcast_to(lane, v.shape))
        return getattr(be.xp, name)(v, k, axis)

    return run


def take(a: Any, indices: Any, axis: Any = None, out: Any = None, mode: str = "raise"):
    """``np.take``: the axis made whole, the indices taken on every shard (the other axes keep
    their splits, Partials pass through: it only moves elements). The indices are made in
    bounds for ``mode`` on the host (CuPy's take has no mode: Note [Along one axis])."""
    if out is not None or not isinstance(a, DistTensor):
        raise Unsupported("out= or no DistTensor")
    idx = np.asarray(_host_index(a, indices, "take"))
    if idx.dtype.kind not in "biu" or not np.can_cast(idx.dtype, np.intp):
        raise Unsupported("indices numpy casts itself")
    if mode not in ("raise", "wrap", "clip"):
        raise Unsupported("numpy's own error for the mode")
    if axis is None:
        a, axis = sh.ravel(a), 0
    axis = normalize_axis_index(operator.index(axis), a.ndim)
    n = a.shape[axis]
    if mode == "raise":
        bad = idx[(idx < -n) | (idx >= n)]
        if bad.size:
            raise IndexError(f"index {bad.flat[0]} is out of bounds for axis {axis} with size {n}")
    elif n == 0 and idx.size:
        raise IndexError("cannot do a non-empty take from an empty axes.")
    idx = idx.astype(np.intp)
    if idx.size:  # in bounds for the mode, as numpy's take reads them
        idx = np.clip(idx, 0, n - 1) if mode == "clip" else idx % n
    y = along_axis(a, axis, keep_partials=True)
    shift = idx.ndim - 1
    pls = [Shard(p.dim + shift) if p.is_shard() and p.dim > axis else p for p in y.placements]
    shape = a.shape[:axis] + idx.shape + a.shape[axis + 1 :]
    spec = y._spec.replace(shape=shape, placements=tuple(pls))
    xp = backend.xp(y._local)
    local = xp.take(y._local, xp.asarray(idx), axis) if _coord(spec) is not None else None
    return _no_gradient("take", (y,), _make(local, spec, y._local))
