"""Gradient bucket pack and unpack: numpy references and the CuPy loader of kernels/bucket.cu.

The layout is disttensor's (disttensor/parallel/buckets.py, Note [Gradient buckets]):
members placed one after another in arrival order, no padding, member ``k`` at
``buffer[offsets[k]:offsets[k + 1]]`` in its own local shape, a member without a gradient
zero-filled. A scale multiplies each element once, so packing with a scale gives the bits of
packing and then scaling the whole buffer (as the reducer does after its all-reduce).

>>> offsets = bucket_offsets([(2,), (1, 2)])
>>> buffer = bucket_pack([np.array([1.0, 2.0]), None], np.empty(4), offsets, scale=0.5)
>>> buffer
array([0.5, 1. , 0. , 0. ])
>>> bucket_unpack(buffer, offsets, [(2,), (1, 2)])[1]
array([[0., 0.]])
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _cuda

SOURCE = "bucket.cu"
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y; more members are strided over it


def bucket_offsets(shapes: Sequence[Sequence[int]]) -> np.ndarray:
    """Where each member of these local shapes starts, and the total: ``len(shapes) + 1``
    int64 values, member ``k`` at ``[offsets[k], offsets[k + 1])``.

    >>> bucket_offsets([(2, 3), (4,), ()])
    array([ 0,  6, 10, 11])
    """
    sizes = [math.prod(s) for s in shapes]  # Python ints: np.prod costs ~1 us a member
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)


def _sizes(members: Sequence[Any]) -> list[int | None]:
    """Each member's element count (None for an absent one); members are arrays or shapes."""
    return [None if a is None else math.prod(getattr(a, "shape", a)) for a in members]


def _check(sizes: list[int | None], buffer: Any, offsets: Any, what: str) -> np.ndarray:
    """The offsets as int64, checked against the members' sizes and the buffer's."""
    offsets = np.asarray(offsets, np.int64)
    if buffer.ndim != 1:
        raise ValueError(f"{what}: the buffer must be flat, got shape {buffer.shape}")
    if offsets.shape != (len(sizes) + 1,) or offsets[0] < 0 or offsets[-1] > buffer.size:
        raise ValueError(f"{what}: offsets must be {len(sizes) + 1} positions in the buffer")
    slots = np.diff(offsets)
    for k, n in enumerate(sizes):
        if n is not None and n != slots[k]:
            raise ValueError(f"{what}: member {k} has {n} items, its slot {slots[k]}")
    return offsets


def bucket_pack(
    arrays: Sequence[np.ndarray | None], buffer: np.ndarray, offsets: Any, scale: float = 1.0
) -> np.ndarray:
    """Copy each array (times ``scale``) into its slot of the flat ``buffer``; ``None`` zero-
    fills the slot. Returns ``buffer``.

    >>> bucket_pack([np.ones((1, 2)), np.array([3.0])], np.zeros(3), [0, 2, 3])
    array([1., 1., 3.])
    """
    offsets = _check(_sizes(arrays), buffer, offsets, "bucket_pack")
    for a, start, stop in zip(arrays, offsets[:-1], offsets[1:]):
        slot = buffer[start:stop]
        if a is None:
            slot[...] = 0
        elif scale == 1:
            slot[...] = a.reshape(-1)
        else:
            np.multiply(a.reshape(-1), scale, out=slot)
    return buffer


def bucket_unpack(
    buffer: np.ndarray,
    offsets: Any,
    shapes: Sequence[Sequence[int]],
    scale: float = 1.0,
    copy: bool = False,
) -> list[np.ndarray]:
    """The members of ``buffer`` in their ``shapes``, times ``scale``: views into the buffer
    (scaled in place, as after a reduction) or, with ``copy``, new arrays (buffer untouched).

    >>> buffer = np.arange(3.0)
    >>> bucket_unpack(buffer, [0, 1, 3], [(), (2,)], scale=2.0, copy=True)
    [array(0.), array([2., 4.])]
    """
    shapes = [tuple(s) for s in shapes]
    offsets = _check(_sizes(shapes), buffer, offsets, "bucket_unpack")
    if not copy and scale != 1:
        buffer *= scale
    out = [buffer[a:b].reshape(s) for s, a, b in zip(shapes, offsets[:-1], offsets[1:])]
    if copy:
        out = [m.copy() for m in out]
        if scale != 1:
            for m in out:
                m *= scale  # in place: a 0-d member stays an array
    return out


REFERENCES: dict[str, Callable[..., Any]] = {
    "bucket_pack": bucket_pack,
    "bucket_unpack": bucket_unpack,
}


def load(cupy: Any) -> dict[str, Callable[..., Any]]:
    """CuPy versions of the packing references (``bucket_offsets`` is host arithmetic and
    serves both): same names and signatures, on cupy arrays of float32 or float64, with the
    offsets on the host. Needs a GPU.

    >>> import cupy  # doctest: +SKIP
    >>> load(cupy)["bucket_pack"](grads, buffer, bucket_offsets(shapes))  # doctest: +SKIP
    """
    module = _cuda.build(cupy, SOURCE)
    array = cupy.ndarray

    def launch(name: str, offsets: np.ndarray, args: tuple) -> None:
        members = len(offsets) - 1
        largest = int(np.diff(offsets).max(initial=0))
        if members and largest:
            grid = (_cuda.blocks(largest), min(members, MAX_GRID_Y))
            module.get_function(name)(grid, (_cuda.THREADS,), args)

    def addresses(arrays: Sequence[Any]) -> Any:
        """Device addresses of the arrays (0 for None), as a device uint64 vector."""
        return cupy.asarray(np.array([0 if a is None else a.data.ptr for a in arrays], np.uint64))

    @functools.wraps(bucket_pack)
    def pack(arrays, buffer, offsets, scale=1.0):
        _cuda.contiguous(cupy, "bucket_pack", buffer=buffer)
        sfx = _cuda.suffix(buffer.dtype, "bucket_pack")
        offsets = _check(_sizes(arrays), buffer, offsets, "bucket_pack")
        # contiguous sources of the buffer's dtype (a copy only where one is not: the common
        # case costs no call per member); they stay referenced until the launch is queued,
        # and CuPy's pool reuses memory in stream order
        dtype = buffer.dtype
        sources = [
            a
            if a is None or (type(a) is array and a.dtype == dtype and a.flags.c_contiguous)
            else cupy.ascontiguousarray(cupy.asarray(a, dtype))
            for a in arrays
        ]
        args = (addresses(sources), cupy.asarray(offsets), np.int64(len(sources)), buffer)
        launch("bucket_pack_" + sfx, offsets, (*args, buffer.dtype.type(scale)))
        return buffer

    @functools.wraps(bucket_unpack)
    def unpack(buffer, offsets, shapes, scale=1.0, copy=False):
        _cuda.contiguous(cupy, "bucket_unpack", buffer=buffer)
        sfx = _cuda.suffix(buffer.dtype, "bucket_unpack")
        shapes = [tuple(s) for s in shapes]
        offsets = _check(_sizes(shapes), buffer, offsets, "bucket_unpack")
        scale_t = buffer.dtype.type(scale)
        if copy:  # one new buffer and one launch; the members are views of it
            flat = cupy.empty(buffer.size, buffer.dtype)
            if buffer.size:
                args = (flat, buffer, np.int64(buffer.size), scale_t)
                copy_fn = module.get_function("bucket_copy_" + sfx)
                copy_fn((_cuda.blocks(buffer.size),), (_cuda.THREADS,), args)
            return [flat[a:b].reshape(s) for s, a, b in zip(shapes, offsets[:-1], offsets[1:])]
        if scale != 1 and buffer.size:
            scale_fn = module.get_function("bucket_scale_" + sfx)
            args = (buffer, np.int64(buffer.size), scale_t)
            scale_fn((_cuda.blocks(buffer.size),), (_cuda.THREADS,), args)
        return [buffer[a:b].reshape(s) for s, a, b in zip(shapes, offsets[:-1], offsets[1:])]

    return {"bucket_pack": pack, "bucket_unpack": unpack}
