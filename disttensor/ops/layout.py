"""Layout ops: flip, roll, pad, diff, tril/triu, diagonals, tensordot, take_along_axis, the
stacking functions (hstack, vstack, dstack, column_stack, atleast_*d) and the nonzero family
(nonzero, argwhere, flatnonzero, ``np.where(condition)``), with numpy's names and semantics,
and ``np.<name>`` on DistTensors.

None of them gathers the array. Ops that move items between ranks fetch just the boxes each
rank needs, point to point (Note [Boxes by index maps]); tril, triu and diagonals are local
kernels that know their shard's global box (spmd/layout_rules.py); take_along_axis gathers
only the mesh dims that split its axis; the stacking functions are concatenates of reshaped
inputs; nonzero moves the indices, never the data (Note [Nonzero of split data]).

On a device (Note [Array backends] in backend.py) every one of them computes on the device
with the same communication as on the host: the kernels take the shards' array module (its
diff, tril, diagonal, take_along_axis, cumsum), the boxes fetched point to point and the
buffers of the all-gathers are device arrays, and only metadata is read back (nonzero's
counts, the range check of take_along_axis's indices, which CuPy would wrap). The functions
take plain device arrays too (their module's function).

Note [Boxes by index maps]
    flip, roll and pad (mode="constant") are, on each axis, a map from output positions to
    input positions: ``n - 1 - j`` (flip), ``(j - s) mod n`` (roll), ``j - before`` where it
    is in range, else the constant (pad; a negative ``before`` crops). The result keeps the
    input's placements (a split axis stays split, over its new length; Partials stay), so
    each rank's output shard comes from at most two runs of input positions per axis (one
    unless it rolls across the end). Every rank works out every rank's runs from the specs
    alone and ``reshard.fetch`` delivers each box from the rank that holds it: itself where
    it can (an axis no mesh dim splits is never exchanged), else its neighbours, point to
    point. A flip of a split axis moves each shard to its mirror rank; a roll by s moves s
    rows across each boundary; a pad moves the few rows the shift pushes over a boundary.
    ``diff`` fetches its window (its output rows and the next n rows) the same way and runs
    numpy's diff on it (the device's on a device), so its values are numpy's bit for bit.
    Partial inputs are exchanged within each group of ranks that share their coordinates on
    the Partial mesh dims (the ranks that hold the shards of one partial value), so they
    stay Partial: these ops are linear; the pad constant is written as a Replicate value
    made Partial (zeros off coordinate 0 of a Partial(sum) mesh dim). diff reduces
    Partial(max/min) and bool Partials first (not linear). The gradient of a map is the
    inverse map (the same exchange back), of diff n times ``-diff(pad(g, 1, 1))``.

Note [Nonzero of split data]
    numpy's indices of the nonzero items are in C order. Each rank takes numpy's nonzero of
    its shard and adds its box's offsets; the shards' index lists, gathered from every rank
    (one all-gather of the per-rank counts, then one of the indices: bytes of the result,
    never of the data), sorted into C order (by their flat positions, which are distinct),
    are numpy's result on every rank, Replicate.
    Where the counts show that the indices would be more bytes than the data (a dense
    input), the data is gathered instead and every rank takes numpy's nonzero of it: the
    second all-gather moves the smaller of the two.
    Mesh dims that do not split the input are first split (Replicate: a local slice;
    Partial: one reduce-scatter of the value numpy would see), so every item is counted
    once and the work is shared.

>>> import numpy as np, disttensor as dt
>>> def program():
...     mesh = dt.ProcessMesh([0, 1])
...     x = dt.shard_tensor(np.arange(8.0).reshape(4, 2), mesh, [dt.Shard(0)])
...     with dt.CommCounter() as cc:
...         y = np.roll(np.flip(x, 1), 1, axis=0)  # one row crosses each boundary
...     return y.placements, y.numpy()[:2], cc.counts
>>> dt.simulate(2, program)[0]
([Shard(dim=0)], array([[7., 6.],
       [1., 0.]]), {'send': 1})
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Sequence
from functools import lru_cache, partial
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from .. import autograd, backend, comm
from .. import reshard as _reshard
from ..dispatch import KernelContext, Op, with_xp
from ..mesh import ProcessMesh
from ..placement import Replicate, Shard
from ..spec import DistSpec
from ..spmd.layout_rules import diagonal_length
from ..tensor import DistTensor, reshard
from . import linalg as la
from . import reduction as red
from . import shape as sh
from .elementwise import astype as _astype
from .elementwise import where as _where
from .ndarray import Unsupported
from .numpy_interop import _only, implements

_R = Replicate()
Box = tuple[tuple[int, int], ...]  # (start, length) per axis


# -- boxes, point to point (Note [Boxes by index maps]) ----------------------------------------
@lru_cache(maxsize=1024)
def _group(spec: DistSpec, coord: tuple[int, ...]) -> DistSpec:
    """The spec of the tensor of partial values this rank's Partial group holds: the mesh
    dims that are Partial fixed at this rank's coordinate (size 1, Replicate)."""
    if not spec.has_partial():
        return spec
    index = tuple(
        slice(c, c + 1) if p.is_partial() else slice(None) for c, p in zip(coord, spec.placements)
    )
    mesh = ProcessMesh(spec.mesh.mesh[index], spec.mesh.dim_names)
    placements = tuple(_R if p.is_partial() else p for p in spec.placements)
    return DistSpec(mesh, placements, spec.shape, spec.dtype)


def fetch_boxes(
    x: DistTensor, boxes: Callable[[tuple[int, ...]], Sequence[Box]]
) -> list[np.ndarray] | None:
    """Each rank receives the global boxes ``boxes(coord)`` of ``x`` (``coord``: its
    coordinate on x's mesh) from the ranks of its Partial group that hold them, point to
    point; a rank holding a box copies it. None on a rank outside the mesh. Collective
    over the mesh; ``boxes`` must depend on the coordinate only."""
    spec = x._spec
    mesh = spec.mesh
    rank = comm.get_rank()
    coord = mesh.get_coord(rank)
    if coord is None:
        return None
    group = _group(spec, coord)
    per_rank = {r: tuple(boxes(mesh.get_coord(r))) for r in group.mesh.process_ids}
    count = max(len(b) for b in per_rank.values())
    empty = tuple((0, 0) for _ in spec.shape)
    out = []
    for q in range(count):  # one exchange per piece; the same number on every rank
        wants = tuple((r, b[q] if q < len(b) else empty) for r, b in per_rank.items())
        out.append(_reshard.fetch(x._local, group, wants))
    return out[: len(per_rank[rank])]


def _fill(spec: DistSpec, coord: tuple[int, ...] | None, value: Any) -> Any:
    """The constant this rank writes for ``value``: a Replicate value made Partial (zeros
    off coordinate 0 of every Partial(sum) mesh dim; the value itself on the others)."""
    if coord is not None:
        for c, p in zip(coord, spec.placements):
            if p.is_partial() and p.reduce_type == "sum" and c != 0:
                return spec.dtype.type(0)
    return value


def _cast(value: Any, dtype: np.dtype) -> Any:
    """``value`` as numpy writes it into an array of ``dtype`` (its errors on every rank)."""
    out = np.empty((), dtype)
    out[()] = value
    return out[()]


def _shape_of(a: Any) -> tuple[int, ...]:
    """The shape of a tensor or an array (numpy's np.shape refuses device arrays)."""
    return a.shape if isinstance(a, DistTensor) or backend.is_device(a) else np.shape(a)


# A map per axis: ("id",), ("flip",), ("roll", s) with 0 <= s < n, ("shift", b): out j <- in
# j - b where that is in range, else the constant.
def _runs(m: tuple, o: int, n_out: int, n: int) -> list[tuple[int, int, int]]:
    """(input start, length, output offset) of the runs the output positions [o, o + n_out)
    take from an input axis of n items under map ``m``."""
    if n_out == 0:
        return []
    kind = m[0]
    if kind == "id":
        return [(o, n_out, 0)]
    if kind == "flip":
        return [(n - o - n_out, n_out, 0)]
    if kind == "roll":
        s, runs = m[1], []
        a1 = min(o + n_out, s)
        if a1 > o:  # positions before s come from the end
            runs.append((o - s + n, a1 - o, 0))
        b0 = max(o, s)
        if o + n_out > b0:
            runs.append((b0 - s, o + n_out - b0, b0 - o))
        return runs
    b = m[1]
    j0, j1 = max(o, b), min(o + n_out, b + n)
    return [(j0 - b, j1 - j0, j0 - o)] if j1 > j0 else []


@lru_cache(maxsize=4096)
def _pieces(maps: tuple, in_shape: tuple, out_box: Box) -> tuple[tuple[Box, tuple], ...]:
    """(input box, output slices) of every piece of the output box."""
    per_axis = [_runs(m, o, n, k) for m, (o, n), k in zip(maps, out_box, in_shape)]
    return tuple(
        (tuple((s, n) for s, n, _ in combo), tuple(slice(j, j + n) for _, n, j in combo))
        for combo in itertools.product(*per_axis)
    )


def _covers(m: tuple, n: int, n_out: int) -> bool:
    return m[0] != "shift" or (m[1] <= 0 and m[1] + n >= n_out)


def inverse_maps(maps: tuple, in_shape: tuple) -> tuple:
    """The maps of the adjoint (the gradient): output positions back to input positions."""
    inv = []
    for m, n in zip(maps, in_shape):
        if m[0] == "roll":
            inv.append(("roll", (n - m[1]) % n))
        elif m[0] == "shift":
            inv.append(("shift", -m[1]))
        else:
            inv.append(m)
    return tuple(inv)


def remap(x: DistTensor, maps: tuple, shape: tuple[int, ...], value: Any = 0) -> DistTensor:
    """Note [Boxes by index maps]: the tensor of ``shape`` whose item at each position is
    ``x``'s item at the mapped position (``value`` where there is none), with x's
    placements."""
    spec = x._spec
    shape = tuple(shape)
    out_spec = spec.replace(shape=shape)
    flips = tuple(a for a, m in enumerate(maps) if m[0] == "flip")

    def boxes(c):
        return [box for box, _ in _pieces(maps, spec.shape, out_spec.local_box(c))]

    got = fetch_boxes(x, boxes)
    coord = spec.mesh.get_coord(comm.get_rank())
    xp = backend.xp(x._local)  # the shards' array module (Note [Array backends])
    if coord is None:
        local = xp.empty(out_spec.local_shape(None), spec.dtype)
    else:
        lshape = out_spec.local_shape(coord)
        if all(_covers(m, n, k) for m, n, k in zip(maps, spec.shape, shape)):
            local = xp.empty(lshape, spec.dtype)
        else:
            local = xp.full(lshape, _fill(spec, coord, value), spec.dtype)
        for (_, dst), piece in zip(_pieces(maps, spec.shape, out_spec.local_box(coord)), got):
            local[dst] = xp.flip(piece, flips) if flips else piece
    out = DistTensor(local, out_spec)
    if x.requires_grad and autograd.is_grad_enabled():
        autograd.record_op("remap", (x,), {"maps": maps, "shape": shape}, out)
    return out


def shift_axis(x: DistTensor, axis: int, before: int, after: int, value: Any = 0) -> DistTensor:
    """``x`` padded along ``axis`` (negative widths crop): one remap."""
    before, after = int(before), int(after)
    maps = tuple(("shift", before) if a == axis else ("id",) for a in range(x.ndim))
    shape = tuple(n + before + after if a == axis else n for a, n in enumerate(x.shape))
    return remap(x, maps, shape, value)


# -- concatenate along a split axis (Note [Joins along a split axis]) ----------------------------
# Note [Joins along a split axis]
#     The concatenate rule makes the joined axis Replicate: the shards of a split axis, joined,
#     are no shard of the result. When the inputs share their placements and the joined axis
#     is split, the result keeps those placements instead (the axis split over its new
#     length), and each rank fetches its output rows from the inputs that hold them (Note
#     [Boxes by index maps]: the join is a shift of each input into its slot), point to
#     point: about one shard per rank moves, never a gather. numpy operands take the same
#     placements locally (Replicate -> Shard is a slice). Other joins keep the rule. The
#     gradient of each input is its slot of g, cropped by the same exchange back.
def join_split(arrays: Sequence[Any], axis: int) -> DistTensor | None:
    """``np.concatenate(arrays, axis)`` by Note [Joins along a split axis]; None when the
    inputs are not of its form (the concatenate rule then decides)."""
    tensors = [a for a in arrays if isinstance(a, DistTensor)]
    if not tensors:
        return None
    first = tensors[0]
    spec, mesh, nd = first._spec, first.mesh, first.ndim
    if nd == 0 or not -nd <= axis < nd:
        return None
    axis %= nd
    pls = spec.placements
    if not any(p.is_shard(axis) and mesh.shape[m] > 1 for m, p in enumerate(pls)):
        return None
    kind = type(first._local)  # operands on other backends: the rule refuses them
    for a in arrays:
        if isinstance(a, DistTensor):
            ours = type(a._local) is kind and a._spec.placements == pls and a.mesh == mesh
        else:
            ours = isinstance(a, np.ndarray) if kind is np.ndarray else type(a) is kind
        shape = _shape_of(a)
        if (
            not ours
            or len(shape) != nd
            or any(n != k for d, (n, k) in enumerate(zip(shape, spec.shape)) if d != axis)
            or a.dtype != spec.dtype
        ):
            return None
    parts = [a if isinstance(a, DistTensor) else _placed(a, mesh, pls) for a in arrays]
    sizes = tuple(a.shape[axis] for a in parts)
    offsets = np.cumsum((0,) + sizes[:-1]).tolist()
    shape = tuple(sum(sizes) if d == axis else n for d, n in enumerate(spec.shape))
    out_spec = spec.replace(shape=shape)
    coord = mesh.get_coord(comm.get_rank())
    local = backend.xp(first._local).empty(out_spec.local_shape(coord), spec.dtype)
    for part, off in zip(parts, offsets):
        maps = tuple(("shift", off) if d == axis else ("id",) for d in range(nd))

        def boxes(c, maps=maps, part=part):
            return [box for box, _ in _pieces(maps, part.shape, out_spec.local_box(c))]

        got = fetch_boxes(part, boxes)
        if coord is not None:
            pieces = _pieces(maps, part.shape, out_spec.local_box(coord))
            for (_, dst), piece in zip(pieces, got):
                local[dst] = piece
    out = DistTensor(local, out_spec)
    if any(p.requires_grad for p in parts) and autograd.is_grad_enabled():
        autograd.record_op("join", tuple(parts), {"axis": axis, "sizes": sizes}, out)
    return out


def _placed(a: Any, mesh: ProcessMesh, pls: tuple) -> DistTensor:
    """An array operand with placements ``pls``: Replicate, then local slices and zeros."""
    rep = DistTensor(a, DistSpec(mesh, (_R,) * mesh.ndim, a.shape, a.dtype))
    return reshard(rep, mesh, list(pls))


def crop(g: DistTensor, axis: int, start: int, size: int) -> DistTensor:
    """``g[..., start:start + size, ...]`` along ``axis`` by Note [Boxes by index maps]."""
    return shift_axis(g, axis, -start, start + size - g.shape[axis])


# -- flip, roll, pad ---------------------------------------------------------------------------
def _tensor(x: Any, what: str) -> DistTensor:
    if not isinstance(x, DistTensor):
        raise Unsupported(f"{what}: not a DistTensor")
    return x


def flip(m, axis=None):
    """``np.flip``: the result keeps the placements; a flipped split axis moves each shard to
    its mirror rank, point to point (Note [Boxes by index maps]).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(6).reshape(2, 3), dt.ProcessMesh([0]), [dt.Shard(1)])
    >>> dt.flip(x, 1).numpy()
    array([[2, 1, 0],
           [5, 4, 3]])
    """
    if not isinstance(m, DistTensor):
        return np.flip(m, axis)
    axes = range(m.ndim) if axis is None else normalize_axis_tuple(axis, m.ndim)
    maps = tuple(("flip",) if a in axes else ("id",) for a in range(m.ndim))
    return remap(m, maps, m.shape)


def fliplr(m):
    """``np.fliplr``: ``flip(m, 1)``."""
    if isinstance(m, DistTensor) and m.ndim < 2:
        raise ValueError("Input must be >= 2-d.")
    return flip(m, 1) if isinstance(m, DistTensor) else np.fliplr(m)


def flipud(m):
    """``np.flipud``: ``flip(m, 0)``."""
    if isinstance(m, DistTensor) and m.ndim < 1:
        raise ValueError("Input must be >= 1-d.")
    return flip(m, 0) if isinstance(m, DistTensor) else np.flipud(m)


def roll(a, shift, axis=None):
    """``np.roll``: along an axis no mesh dim splits a local roll; along a split axis each
    rank fetches the rows that cross its boundaries, point to point. ``axis=None`` rolls the
    raveled tensor (the reshape rule decides what moves).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(5), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.roll(x, 2).numpy()
    array([3, 4, 0, 1, 2])
    """
    if not isinstance(a, DistTensor):
        return np.roll(a, shift, axis)
    if axis is None:
        return sh.reshape(roll(sh.ravel(a), shift, 0), a.shape)
    pairs = np.broadcast(shift, axis)
    if pairs.ndim > 1:
        raise ValueError("'shift' and 'axis' should be scalars or 1D sequences")
    shifts = dict.fromkeys(range(a.ndim), 0)
    for s, ax in pairs:
        shifts[normalize_axis_index(operator.index(ax), a.ndim)] += operator.index(s)
    maps = tuple(
        ("roll", shifts[d] % n) if n and shifts[d] % n else ("id",) for d, n in enumerate(a.shape)
    )
    return remap(a, maps, a.shape)


def _pairs(value: Any, ndim: int, what: str) -> np.ndarray:
    """numpy.pad's (before, after) per axis: an int, a pair, or one pair per axis."""
    try:
        return np.broadcast_to(np.asarray(value), (ndim, 2))
    except ValueError:
        raise Unsupported(f"{what}: numpy's error") from None


def pad(array, pad_width, mode="constant", **kwargs):
    """``np.pad`` with ``mode="constant"`` (other modes: numpy's through the replicate
    fallback, the device's pad on a device): the result keeps the placements; along a split
    axis each rank fetches the rows the padding shifts across its boundaries (Note [Boxes by
    index maps]).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(4), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.pad(x, (2, 1), constant_values=9).numpy()
    array([9, 9, 0, 1, 2, 3, 9])
    """
    if not isinstance(array, DistTensor):
        return backend.xp(array).pad(array, pad_width, mode, **kwargs)
    if mode != "constant" or set(kwargs) - {"constant_values"}:
        raise Unsupported(f"mode={mode!r} or {sorted(kwargs)}")
    values = kwargs.get("constant_values", 0)
    if isinstance(values, DistTensor):
        raise Unsupported("a DistTensor constant")
    widths = np.asarray(pad_width)
    if widths.dtype.kind not in "iu":
        raise Unsupported("pad_width that is not integer")
    if (widths < 0).any():
        raise ValueError("index can't contain negative values")
    nd = array.ndim
    widths = _pairs(widths, nd, "pad_width")
    vals = _pairs(values, nd, "constant_values")
    vals = np.array([[_cast(v, array.dtype) for v in row] for row in vals], array.dtype)
    vals = vals.reshape(nd, 2)
    if nd == 0 or (vals == vals.flat[0]).all():
        maps = tuple(("shift", int(b)) for b, _ in widths)
        shape = tuple(n + int(b) + int(e) for n, (b, e) in zip(array.shape, widths))
        return remap(array, maps, shape, vals.flat[0] if nd else 0)
    out = array  # numpy pads axis after axis: later axes overwrite the corners
    for a in range(nd):
        out = shift_axis(out, a, int(widths[a, 0]), 0, vals[a, 0])
        out = shift_axis(out, a, 0, int(widths[a, 1]), vals[a, 1])
    return out


# -- diff --------------------------------------------------------------------------------------
def _reduce_partials(x: DistTensor, keep: tuple[str, ...]) -> DistTensor:
    """``x`` with its Partial mesh dims reduced, except those whose type is in ``keep``."""
    pls = [_R if p.is_partial() and p.reduce_type not in keep else p for p in x.placements]
    return x if tuple(pls) == x._spec.placements else reshard(x, x.mesh, pls)


def _window_diff(x: DistTensor, n: int, axis: int) -> DistTensor:
    """numpy's diff of order n along ``axis``: each rank fetches its output rows and the n
    after them (Note [Boxes by index maps]) and runs numpy's diff on that window."""
    x = _reduce_partials(x, () if x.dtype == np.bool_ else ("sum", "avg"))
    spec = x._spec
    shape = tuple(max(k - n, 0) if a == axis else k for a, k in enumerate(spec.shape))
    out_spec = spec.replace(shape=shape)

    def window(c):
        box = out_spec.local_box(c)
        if any(k == 0 for _, k in box):
            return [tuple((0, 0) for _ in box)]
        return [tuple((s, k + n) if a == axis else (s, k) for a, (s, k) in enumerate(box))]

    got = fetch_boxes(x, window)
    coord = spec.mesh.get_coord(comm.get_rank())
    lshape = out_spec.local_shape(coord)
    xp = backend.xp(x._local)  # the shards' array module (Note [Array backends])
    if coord is None or math.prod(lshape) == 0:
        local = xp.empty(lshape, np.diff(np.empty((n + 1,), spec.dtype)).dtype)
    else:
        local = xp.diff(got[0], n, axis)
    out = DistTensor(local, out_spec.replace(dtype=local.dtype))
    if x.requires_grad and autograd.is_grad_enabled():
        autograd.record_op("diff", (x,), {"n": n, "axis": axis}, out)
    return out


def diff(a, n=1, axis=-1, prepend=np._NoValue, append=np._NoValue):
    """``np.diff``: along a split axis each rank fetches the n rows after its own, point to
    point, and runs numpy's diff on that window (the placements stay). A scalar
    ``prepend``/``append`` is a pad; an array one is concatenated (its rule decides).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([1, 4, 9, 16]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.diff(x).numpy(), dt.diff(x, 2, prepend=0).numpy()
    (array([3, 5, 7]), array([2, 2, 2]))
    """
    if not isinstance(a, DistTensor):  # CuPy's diff takes no np._NoValue: pass only those given
        ends = {"prepend": prepend, "append": append}
        ends = {k: v for k, v in ends.items() if v is not np._NoValue}
        return backend.xp(a).diff(a, n, axis, **ends)
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"order must be non-negative but got {n!r}")
    if a.ndim == 0:
        raise ValueError("diff requires input that is at least one dimensional")
    axis = normalize_axis_index(operator.index(axis), a.ndim)
    if n == 0:
        return a
    for v, first in ((prepend, True), (append, False)):
        if v is np._NoValue:
            continue
        device = backend.is_device(v)
        if not isinstance(v, DistTensor) and _shape_of(v) == ():  # a pad, in numpy's dtype
            dtype = np.result_type(a.dtype, v.dtype if device else np.asarray(v).dtype)
            a = shift_axis(a if dtype == a.dtype else _astype(a, dtype), axis, first, not first, v)
            continue
        if not isinstance(v, DistTensor) and not device:
            v = np.asarray(v)
        if v.ndim == 0:  # numpy broadcasts it to one slice along the axis
            v = sh.broadcast_to(v, tuple(1 if d == axis else k for d, k in enumerate(a.shape)))
        a = sh.concatenate([v, a] if first else [a, v], axis)
    return _window_diff(a, n, axis)


# -- triangles and diagonals (spmd/layout_rules.py) --------------------------------------------
def _triangle(fn: Callable) -> Callable:
    """Kernel of tril/triu: Note [Triangles with global offsets]."""

    def kernel(x, k=0, *, ctx: KernelContext | None = None):
        if ctx is not None and ctx.coord is not None:
            box = ctx.inputs[0].local_box(ctx.coord)
            k = k + box[-2][0] - box[-1][0]
        return fn(x, k)

    return kernel


Run = tuple[int, int]  # (start, count) of positions along an axis


def _diagonal_run(offset: int, items: Run, rows: Run, cols: Run) -> tuple[int, int, int, int]:
    """The items of diagonal ``offset`` among ``items`` ((start, count) of its positions)
    that lie in the block of ``rows`` and ``cols`` ((start, count) each): item j is at (j +
    max(-offset, 0), j + max(offset, 0)), so they are one run j in [lo, hi), at block row
    ``r`` and column ``c`` onwards, one step down and right per item. (lo, hi, r, c); hi <= lo
    when none is."""
    j0r = rows[0] - max(-offset, 0)  # the item in the block's first row (j0c: column)
    j0c = cols[0] - max(offset, 0)
    lo = max(items[0], j0r, j0c)
    hi = min(items[0] + items[1], j0r + rows[1], j0c + cols[1])
    return lo, hi, lo - j0r, lo - j0c


def _diagonal(x, offset=0, *, ctx: KernelContext | None = None, xp: Any = np):
    """Kernel of diagonal (last two axes): Note [Diagonals of split matrices]. Each output
    position the rank holds takes its item where the rank holds it, else zero (one run of
    the block's own diagonal: _diagonal_run). ``xp``: the array module."""
    if ctx is None:
        return xp.diagonal(x, offset, -2, -1).copy()
    spec = ctx.inputs[0]
    n, m = spec.shape[-2:]
    length = diagonal_length(n, m, offset)
    out_shape = ctx.local_shape(0)
    out = xp.zeros(out_shape, x.dtype)
    if ctx.coord is None or math.prod(out_shape) == 0:
        return out
    box = spec.local_box(ctx.coord)
    out_spec = DistSpec(spec.mesh, ctx.outputs[0], (*spec.shape[:-2], length), spec.dtype)
    s, k = out_spec.local_box(ctx.coord)[-1]
    lo, hi, r, c = _diagonal_run(offset, (s, k), box[-2], box[-1])
    if hi > lo:
        block = x[..., r : r + hi - lo, c : c + hi - lo]
        out[..., lo - s : hi - s] = xp.diagonal(block, 0, -2, -1)
    return out


def _diag_embed(v, offset=0, shape=(0, 0), *, ctx: KernelContext | None = None, xp: Any = np):
    """Kernel of diag_embed: ``v`` (..., L) onto diagonal ``offset`` of zeros (..., *shape);
    this rank writes the items of its output box (one run: _diagonal_run). ``xp``: the array
    module."""
    if ctx is None:
        out_shape, vbox, obox = (
            (*v.shape[:-1], *shape),
            (0, v.shape[-1]),
            ((0, shape[0]), (0, shape[1])),
        )
    else:
        spec = ctx.inputs[0]
        out_shape = ctx.local_shape(0)
        if ctx.coord is None:
            return xp.zeros(out_shape, v.dtype)
        vbox = spec.local_box(ctx.coord)[-1]
        ospec = DistSpec(spec.mesh, ctx.outputs[0], (*spec.shape[:-1], *shape), spec.dtype)
        obox = ospec.local_box(ctx.coord)[-2:]
    out = xp.zeros(out_shape, v.dtype)
    lo, hi, r, c = _diagonal_run(offset, vbox, obox[0], obox[1])
    if hi > lo:
        step = xp.arange(hi - lo)
        out[..., r + step, c + step] = v[..., lo - vbox[0] : hi - vbox[0]]
    return out


def _take_along_axis_device(arr, idx, axis, *, xp: Any):
    """take_along_axis on a device. CuPy wraps an out-of-range index where numpy raises, so
    the range is checked first (two reductions read back), with numpy's IndexError."""
    n = arr.shape[axis]
    if idx.size:
        low, high = int(idx.min()), int(idx.max())
        if low < -n or high >= n:
            bad = low if low < -n else high
            raise IndexError(f"index {bad} is out of bounds for axis {axis} with size {n}")
    return xp.take_along_axis(arr, idx, axis)


def _take_along_axis_grad(
    g, idx, axis=0, length=0, *, ctx: KernelContext | None = None, be=backend.NUMPY
):
    """``g`` added at ``idx`` along ``axis`` into zeros with ``length`` items on it (the
    backend's scatter-add: ``np.add.at`` on the host)."""
    shape = (
        ctx.local_shape(0) if ctx is not None else g.shape[:axis] + (length,) + g.shape[axis + 1 :]
    )
    xp = be.xp
    out = xp.zeros(shape, g.dtype)
    if g.size:  # np.indices(g.shape, sparse=True), which CuPy's indices does not take
        nd = g.ndim
        grid = [xp.arange(n).reshape((1,) * a + (n,) + (1,) * (nd - a - 1))
                for a, n in enumerate(g.shape)]  # fmt: skip
        grid[axis] = xp.where(idx < 0, idx + length, idx)
        be.scatter_add(out, tuple(grid), g)
    return out


OPS: dict[str, Op] = {
    name: Op(
        name,
        _triangle(getattr(np, name)),
        rule=name,
        ctx=True,
        moves_only=True,
        device=lambda be, name=name: _triangle(getattr(be.xp, name)),
    )
    for name in ("tril", "triu")
}
OPS["diagonal"] = Op(
    "diagonal", _diagonal, rule="diagonal", ctx=True, moves_only=True, device=with_xp(_diagonal)
)
OPS["diag_embed"] = Op(
    "diag_embed",
    _diag_embed,
    rule="diag_embed",
    ctx=True,
    moves_only=True,
    device=with_xp(_diag_embed),
)
OPS["take_along_axis"] = Op(
    "take_along_axis",
    lambda arr, idx, axis: np.take_along_axis(arr, idx, axis),
    rule="take_along_axis",
    moves_only=True,
    device=with_xp(_take_along_axis_device),
)
OPS["take_along_axis_grad"] = Op(
    "take_along_axis_grad",
    _take_along_axis_grad,
    rule="take_along_axis_grad",
    ctx=True,
    device=lambda be: partial(_take_along_axis_grad, be=be),
)


def _triangular(name: str, m, k) -> Any:
    if not isinstance(m, DistTensor):
        return getattr(backend.xp(m), name)(m, k)
    k = operator.index(k)
    if m.ndim == 0:
        raise Unsupported("numpy's error for a 0-d input")
    if m.ndim == 1:  # numpy broadcasts a vector to the rows of a square
        m = sh.broadcast_to(m, (m.shape[0], m.shape[0]))
    return OPS[name](m, k=k)


def tril(m, k=0):
    """``np.tril``: local on every layout (Note [Triangles with global offsets]).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.ones((3, 3), int), dt.ProcessMesh([0]), [dt.Shard(1)])
    >>> dt.tril(x).numpy()
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    """
    return _triangular("tril", m, k)


def triu(m, k=0):
    """``np.triu``: local on every layout (Note [Triangles with global offsets])."""
    return _triangular("triu", m, k)


def diagonal(a, offset=0, axis1=0, axis2=1):
    """``np.diagonal``: no communication (Note [Diagonals of split matrices]); the diagonal
    is the last axis, after the others in order, as in numpy.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(9).reshape(3, 3), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.diagonal(x).numpy(), dt.diagonal(x, -1).numpy()
    (array([0, 4, 8]), array([3, 7]))
    """
    if not isinstance(a, DistTensor):
        return backend.xp(a).diagonal(a, offset, axis1, axis2)
    nd = a.ndim
    if nd < 2:
        raise ValueError("diag requires an array of at least two dimensions")
    a1, a2 = normalize_axis_index(axis1, nd), normalize_axis_index(axis2, nd)
    if a1 == a2:
        raise ValueError("axis1 and axis2 cannot be the same")
    if (a1, a2) != (nd - 2, nd - 1):
        a = sh.transpose(a, tuple(d for d in range(nd) if d not in (a1, a2)) + (a1, a2))
    return OPS["diagonal"](a, offset=operator.index(offset))


def diag_embed(v, offset: int = 0, shape: tuple[int, int] | None = None):
    """``v`` (..., L) written onto diagonal ``offset`` of zeros of (..., *shape) (default:
    square); the inverse of ``diagonal``."""
    k = operator.index(offset)
    if shape is None:
        side = v.shape[-1] + abs(k)
        shape = (side, side)
    return OPS["diag_embed"](v, offset=k, shape=tuple(operator.index(s) for s in shape))


def diag(v, k=0):
    """``np.diag``: a vector onto a diagonal (its split stays a split of the rows where they
    line up, else the vector is gathered and the rows stay split), or a matrix's diagonal.

    >>> import numpy as np, disttensor as dt
    >>> v = dt.shard_tensor(np.array([1, 2]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.diag(v, 1).numpy()
    array([[0, 1, 0],
           [0, 0, 2],
           [0, 0, 0]])
    """
    if not isinstance(v, DistTensor):
        return backend.xp(v).diag(v, k)
    if v.ndim == 1:
        return diag_embed(v, k)
    if v.ndim == 2:
        return diagonal(v, k)
    raise ValueError("Input must be 1- or 2-d.")


def trace(a, offset=0, axis1=0, axis2=1):
    """``np.trace``: the sum of ``diagonal`` (a split diagonal gives a Partial(sum) sum, no
    communication).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(9.0).reshape(3, 3), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> float(dt.trace(x)), float(dt.trace(x, 1))
    (12.0, 6.0)
    """
    if not isinstance(a, DistTensor):
        return backend.xp(a).trace(a, offset, axis1, axis2)
    return red.sum(diagonal(a, offset, axis1, axis2), -1)


# -- tensordot, take_along_axis ----------------------------------------------------------------
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def tensordot(a, b, axes=2):
    """``np.tensordot`` as the einsum of the same contraction (its rule decides).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(6.0).reshape(2, 3), dt.ProcessMesh([0]), [dt.Shard(1)])
    >>> dt.tensordot(x, np.ones((3, 2)), 1).numpy()
    array([[ 3.,  3.],
           [12., 12.]])
    """
    sa, sb = _shape_of(a), _shape_of(b)
    na, nb = len(sa), len(sb)
    try:
        if isinstance(axes, (int, np.integer)):
            k = operator.index(axes)
            if k < 0:
                raise ValueError
            axes_a, axes_b = list(range(na - k, na)), list(range(k))
        else:
            axes_a, axes_b = ([x] if isinstance(x, (int, np.integer)) else list(x) for x in axes)
        axes_a = [normalize_axis_index(operator.index(i), na) for i in axes_a]
        axes_b = [normalize_axis_index(operator.index(i), nb) for i in axes_b]
    except (TypeError, ValueError, np.exceptions.AxisError):
        raise Unsupported("numpy's error for these axes") from None
    if (
        len(axes_a) != len(axes_b)
        or len(set(axes_a)) != len(axes_a)
        or any(sa[i] != sb[j] for i, j in zip(axes_a, axes_b))
        or na + nb > len(_LETTERS)
    ):
        raise Unsupported("numpy's shape-mismatch error")
    la_ = _LETTERS[:na]
    lb = list(_LETTERS[na : na + nb])
    for i, j in zip(axes_a, axes_b):
        lb[j] = la_[i]
    out = "".join(c for i, c in enumerate(la_) if i not in axes_a)
    out += "".join(c for j, c in enumerate(lb) if j not in axes_b)
    return la.einsum(f"{la_},{''.join(lb)}->{out}", a, b)


def take_along_axis(arr, indices, axis=-1):
    """``np.take_along_axis``: along an axis no mesh dim splits, local (the indices' splits
    are the result's); along a split axis, ``arr`` is gathered on those mesh dims only.

    >>> import numpy as np, disttensor as dt
    >>> g = np.array([[10, 30, 20], [60, 40, 50]])
    >>> x = dt.shard_tensor(g, dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.take_along_axis(x, np.array([[1], [0]]), 1).numpy()
    array([[30],
           [60]])
    """
    if not isinstance(arr, DistTensor):
        if isinstance(indices, DistTensor):
            raise Unsupported("a numpy array with DistTensor indices")
        if backend.is_device(arr):  # CuPy's take_along_axis takes an int axis only
            if axis is None:
                arr, axis = arr.ravel(), 0
            return _take_along_axis_device(arr, indices, axis, xp=backend.xp(arr))
        return np.take_along_axis(arr, indices, axis)
    if not isinstance(indices, DistTensor) and not backend.is_device(indices):
        indices = np.asarray(indices)
    if indices.dtype.kind not in "iu":
        raise IndexError("`indices` must be an integer array")
    if axis is None:
        if indices.ndim != 1:
            raise ValueError("when axis=None, `indices` must have a single dimension.")
        arr, axis = sh.ravel(arr), 0
    if indices.ndim != arr.ndim:
        raise ValueError("`indices` and `arr` must have the same number of dimensions")
    axis = normalize_axis_index(operator.index(axis), arr.ndim)
    n = arr.shape[axis]
    if isinstance(indices, np.ndarray):
        bad = indices[(indices < -n) | (indices >= n)]
        if bad.size:
            raise IndexError(f"index {bad.flat[0]} is out of bounds for axis {axis} with size {n}")
    return OPS["take_along_axis"](arr, indices, axis=axis)


# -- stacking ----------------------------------------------------------------------------------
def _operand(a: Any) -> Any:
    return a if isinstance(a, DistTensor) or backend.is_device(a) else np.asarray(a)


def _each(fn: Callable, arys: tuple) -> Any:
    """``fn`` of every array, numpy's way: the one result, or a tuple of them."""
    out = [fn(a) for a in map(_operand, arys)]
    return out[0] if len(out) == 1 else tuple(out)


def atleast_1d(*arys):
    """``np.atleast_1d``: a 0-d tensor reshaped to (1,) (never any communication)."""
    return _each(lambda a: sh.reshape(a, (1,)) if a.ndim == 0 else a, arys)


def _at_least_2d(a: Any) -> Any:
    if a.ndim == 0:
        return sh.reshape(a, (1, 1))
    return sh.expand_dims(a, 0) if a.ndim == 1 else a


def atleast_2d(*arys):
    """``np.atleast_2d``: (n,) becomes (1, n) (never any communication)."""
    return _each(_at_least_2d, arys)


def _at_least_3d(a: Any) -> Any:
    if a.ndim == 0:
        return sh.reshape(a, (1, 1, 1))
    if a.ndim == 1:
        return sh.expand_dims(a, (0, 2))
    return sh.expand_dims(a, 2) if a.ndim == 2 else a


def atleast_3d(*arys):
    """``np.atleast_3d``: (n,) becomes (1, n, 1), (m, n) becomes (m, n, 1)."""
    return _each(_at_least_3d, arys)


def _stackable(tup) -> list:
    if isinstance(tup, DistTensor):
        raise TypeError("arrays to stack must be passed as a sequence (a list or a tuple)")
    return [_operand(a) for a in tup]


def hstack(tup):
    """``np.hstack``: concatenate along axis 1 (axis 0 for vectors); the inputs' splits of
    the other axes stay, with no communication.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.zeros((2, 1)), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.hstack([x, np.ones((2, 1))]).numpy()
    array([[0., 1.],
           [0., 1.]])
    """
    arrs = [a if a.ndim else sh.reshape(a, (1,)) for a in _stackable(tup)]
    return sh.concatenate(arrs, 0 if arrs and arrs[0].ndim == 1 else 1)


def vstack(tup):
    """``np.vstack``: vectors become rows, then concatenate along axis 0."""
    return sh.concatenate([_at_least_2d(a) for a in _stackable(tup)], 0)


def dstack(tup):
    """``np.dstack``: ``atleast_3d`` each, then concatenate along axis 2."""
    return sh.concatenate([_at_least_3d(a) for a in _stackable(tup)], 2)


def column_stack(tup):
    """``np.column_stack``: vectors become columns, then concatenate along axis 1."""
    cols = []
    for a in _stackable(tup):
        if a.ndim == 0:
            a = sh.reshape(a, (1, 1))
        elif a.ndim == 1:
            a = sh.expand_dims(a, 1)
        cols.append(a)
    return sh.concatenate(cols, 1)


# -- nonzero (Note [Nonzero of split data]) ----------------------------------------------------
def _spread(x: DistTensor) -> DistTensor:
    """``x`` with every mesh dim that does not split it splitting an axis (Replicate: a local
    slice; Partial: a reduce-scatter), so each item is on one rank only: the longest axis
    that no later mesh dim splits (Note [Nested sharding]: only the innermost split of an
    axis may change)."""
    mesh, pls = x.mesh, list(x.placements)
    for m, p in enumerate(pls):
        if p.is_shard() or mesh.shape[m] == 1:
            continue
        later = {q.dim for j, q in enumerate(x.placements[m + 1 :], m + 1) if q.is_shard()}
        free = [a for a in range(x.ndim) if a not in later] or list(range(x.ndim))
        pls[m] = Shard(max(free, key=lambda a: x.shape[a]))
    return x if tuple(pls) == x._spec.placements else reshard(x, mesh, pls)


def _replicated(value: Any, mesh: ProcessMesh) -> DistTensor:
    spec = DistSpec(mesh, (_R,) * mesh.ndim, value.shape, value.dtype)
    coord = mesh.get_coord(comm.get_rank())
    if coord is None:
        value = backend.xp(value).empty(spec.local_shape(None), value.dtype)
    return DistTensor(value, spec)


def _nonzero_coords(a: DistTensor) -> Any:
    """The (count, ndim) global indices of a's nonzero items in C order, on every rank of the
    mesh (None elsewhere), in the shards' array type: Note [Nonzero of split data]."""
    x = _spread(a)
    spec = x._spec
    mesh = spec.mesh
    coord = mesh.get_coord(comm.get_rank())
    if coord is None:
        return None
    be = backend.of(x._local)  # the shards' backend (Note [Array backends])
    xp = be.xp
    box = spec.local_box(coord)
    local = xp.stack(xp.nonzero(x._local), axis=1).astype(np.intp, copy=False)
    local += be.asarray(np.array([s for s, _ in box], np.intp))
    nd = spec.ndim
    if mesh.size == 1:
        return local
    group = comm.group(tuple(mesh.process_ids))
    counts = xp.empty(mesh.size, np.int64)
    group.allgather(be.asarray(np.array([local.shape[0]], np.int64)), counts, [1] * mesh.size)
    counts = backend.to_host(counts)  # the sizes of the next all-gather: host metadata
    total = int(counts.sum())
    if total * nd * np.dtype(np.intp).itemsize > spec.dtype.itemsize * math.prod(spec.shape):
        return xp.argwhere(_gathered(x, group))  # denser than the data: that moves less
    flat = xp.empty(total * nd, np.intp)
    group.allgather(xp.ascontiguousarray(local).reshape(-1), flat, [int(c) * nd for c in counts])
    coords = flat.reshape(-1, nd)
    # C order is the order of the flat positions, which are distinct: any sort gives it
    # (CuPy's lexsort and argsort take no kind= in every version)
    return coords[xp.argsort(xp.ravel_multi_index(tuple(coords.T), spec.shape))]


def _gathered(x: DistTensor, group: comm.Communicator) -> Any:
    """The global value of ``x`` (every item on one rank: ``_spread``) from one all-gather
    of the shards over the mesh."""
    spec, mesh = x._spec, x.mesh
    xp = backend.xp(x._local)
    boxes = [spec.local_box(mesh.get_coord(r)) for r in mesh.process_ids]
    sizes = [math.prod(n for _, n in box) for box in boxes]
    flat = xp.empty(sum(sizes), spec.dtype)
    group.allgather(xp.ascontiguousarray(x._local).reshape(-1), flat, sizes)
    whole = xp.empty(spec.shape, spec.dtype)
    start = 0
    for box, size in zip(boxes, sizes):
        whole[tuple(slice(s, s + n) for s, n in box)] = flat[start : start + size].reshape(
            [n for _, n in box]
        )
        start += size
    return whole


def nonzero(a):
    """``np.nonzero``: a tuple of Replicate index tensors, made from the shards' own nonzero
    indices (Note [Nonzero of split data]).

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([[0, 3], [4, 0]]), dt.ProcessMesh([0]), [dt.Shard(1)])
    >>> [i.numpy() for i in dt.nonzero(x)]
    [array([0, 1]), array([1, 0])]
    """
    if not isinstance(a, DistTensor):
        return backend.xp(a).nonzero(a)
    if a.ndim == 0:  # numpy's ValueError, on the host and on a device alike
        np.nonzero(np.empty((), a.dtype))
        raise Unsupported("numpy's result for a 0-d input")
    xp = backend.xp(a._local)
    coords = _nonzero_coords(a)
    coords = xp.empty((0, a.ndim), np.intp) if coords is None else coords
    return tuple(_replicated(xp.ascontiguousarray(coords[:, d]), a.mesh) for d in range(a.ndim))


def argwhere(a):
    """``np.argwhere``: the (N, ndim) indices of the nonzero items, Replicate."""
    if not isinstance(a, DistTensor):
        return backend.xp(a).argwhere(a)
    xp = backend.xp(a._local)
    flat = a.ndim == 0
    coords = _nonzero_coords(sh.reshape(a, (1,)) if flat else a)
    count = 0 if coords is None else coords.shape[0]
    if flat:
        coords = xp.empty((count, 0), np.intp)
    elif coords is None:
        coords = xp.empty((0, a.ndim), np.intp)
    return _replicated(coords, a.mesh)


def flatnonzero(a):
    """``np.flatnonzero``: the indices of the nonzero items of the raveled tensor, Replicate
    (computed from ``nonzero``'s indices: the raveled tensor is never formed)."""
    if not isinstance(a, DistTensor):
        return backend.xp(a).flatnonzero(a)
    xp = backend.xp(a._local)
    if a.ndim == 0:
        a = sh.reshape(a, (1,))
    coords = _nonzero_coords(a)
    if coords is None:
        flat = xp.empty(0, np.intp)
    else:
        flat = xp.ravel_multi_index(tuple(coords.T), a.shape).astype(np.intp, copy=False)
    return _replicated(flat, a.mesh)


# -- numpy functions (Note [numpy functions by identity] in ops/numpy_interop.py) --------------
def _adapt(func: Callable, ours: Callable, first: str) -> None:
    """``func`` (numpy's) on a DistTensor runs ``ours``, whose parameters are numpy's names:
    the tensor argument ``first`` is checked, the others are passed as given."""

    @implements(func, name=func.__name__)
    def impl(given):
        rest = {k: v for k, v in given.items() if k != first}
        return ours(_tensor(given[first], func.__name__), **rest)


for _func, _ours, _first in (
    (np.flip, flip, "m"),
    (np.fliplr, fliplr, "m"),
    (np.flipud, flipud, "m"),
    (np.roll, roll, "a"),
    (np.diff, diff, "a"),
    (np.tril, tril, "m"),
    (np.triu, triu, "m"),
    (np.diag, diag, "v"),
    (np.diagonal, diagonal, "a"),
    (np.nonzero, nonzero, "a"),
    (np.argwhere, argwhere, "a"),
    (np.flatnonzero, flatnonzero, "a"),
):
    _adapt(_func, _ours, _first)


@implements(np.pad, name="pad")
def _np_pad(given):
    return pad(
        _tensor(given["array"], "pad"),
        given["pad_width"],
        given.get("mode", "constant"),
        **given.get("kwargs", {}),
    )


@implements(np.trace, name="trace")
def _np_trace(given):
    g = _only(given, "a", "offset", "axis1", "axis2")
    a = _tensor(g["a"], "trace")
    return trace(a, g.get("offset", 0), g.get("axis1", 0), g.get("axis2", 1))


@implements(np.tensordot, name="tensordot")
def _np_tensordot(given):
    return tensordot(given["a"], given["b"], given.get("axes", 2))


@implements(np.take_along_axis, name="take_along_axis")
def _np_take_along_axis(given):
    return take_along_axis(given["arr"], given["indices"], given.get("axis", -1))


@implements(np.where, name="where")
def _np_where(given):
    """``np.where(condition, x, y)`` (dt.where), or ``np.where(condition)``: nonzero."""
    if len(given) == 1:
        return nonzero(_tensor(given["condition"], "where"))
    if len(given) != 3:
        raise Unsupported("numpy's error for only one of x and y")
    return _where(given["condition"], given["x"], given["y"])


def _stacking(func: Callable, ours: Callable) -> None:
    @implements(func, name=func.__name__)
    def impl(given):
        g = _only(given, "tup", "casting")
        if g.get("casting", "same_kind") != "same_kind":
            raise Unsupported("casting=")
        return ours(g["tup"])


for _func, _ours in (
    (np.hstack, hstack),
    (np.vstack, vstack),
    (np.dstack, dstack),
    (np.column_stack, column_stack),
):
    _stacking(_func, _ours)


for _func, _ours in (
    (np.atleast_1d, atleast_1d),
    (np.atleast_2d, atleast_2d),
    (np.atleast_3d, atleast_3d),
):
    implements(_func, name=_func.__name__)(lambda given, ours=_ours: ours(*given.get("arys", ())))


__all__ = [
    "argwhere",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "column_stack",
    "diag",
    "diagonal",
    "diff",
    "dstack",
    "flatnonzero",
    "flip",
    "fliplr",
    "flipud",
    "hstack",
    "nonzero",
    "pad",
    "roll",
    "take_along_axis",
    "tensordot",
    "trace",
    "tril",
    "triu",
    "vstack",
]
