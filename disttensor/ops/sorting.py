"""Sorting DistTensors without gathering them: ``sort``, ``argsort`` (and ``x.sort()`` in
place), ``searchsorted``, with numpy's names and semantics; ops/unique.py builds ``unique`` on
the same machinery.

Along an axis that no mesh dim splits each rank sorts its own lanes, with no communication.
Along a split axis every rank ends with its own shard of the sorted result, in the input's
layout, after one exchange of its items (Note [Distributed sort]); short lanes are gathered
over the ranks that split them instead, where that moves less.

Note [Sort keys]
    Every value maps to unsigned words whose lexicographic order is numpy's sort order: bools
    and unsigned ints as they are; signed ints with the sign bit flipped; floats by sign and
    magnitude bits, with every NaN made one NaN (numpy sorts them last, as ties) and -0.0 made
    0.0 (numpy's comparisons tie them); complex numbers as two words, (real, imag) while both
    are numbers, then numpy's NaN classes R+nanj < nan+Rj < nan+nanj above all numbers.
    complex64 packs into one 64-bit word, complex128 needs two. Keys decide the order only:
    the values themselves travel, so results are numpy's bit for bit.

Note [Distributed sort]
    Lanes along a split axis are sorted by the ranks that split the axis (the group; every
    group of the mesh sorts its own lanes): (1) each rank sorts its items by key, stably;
    (2) the keys at the output's shard boundaries (where each rank's array_split share of
    the sorted lane starts) are selected exactly by a radix select: 8 key bits per pass, one
    all-reduce of the lanes x boundaries x 256 digit counts over the group, every rank
    picking the same digit; a rank's items that match the digits found so far are a run of
    its sorted items, so a pass reads only those runs, and the passes stop once each
    boundary's run holds one item (random float64 data: 3 or 4 passes for a million items);
    (3) one small all-gather of how many items each rank holds below and at each boundary
    key places every item: ties go by global index (ranks hold consecutive runs of the axis,
    in group order), so the result is the stable order, which is one of numpy's valid
    answers for any ``kind`` and exactly its result for ``kind="stable"``; (4) one
    all-to-all sends each item straight to the rank that holds its sorted position, which
    merges the runs it receives by (key, source rank). Each rank sends its own items (and
    their global indices for argsort) once: O(local), never the array. Where lanes are
    short, the digit counts would outweigh gathering the lanes over the group; then the
    lanes are gathered and sorted whole, and each rank keeps its share (``_distributes``).
    ``axis=None`` sorts the flattened tensor: its shards are first made runs of the
    flattened order (mesh dims that split a later axis split axis 0 instead: an all-to-all
    per such mesh dim, O(local)), and the result is 1-D, split over the same mesh dims
    (nested, in mesh-dim order). Partial inputs are reduced first. The gradient of ``sort``
    sends each output gradient back to its item's position (``deliver``).

>>> import numpy as np, disttensor as dt
>>> def program():
...     mesh = dt.ProcessMesh([0, 1])
...     x = dt.shard_tensor(np.array([5.0, 1.0, 4.0, 2.0, 3.0]), mesh, [dt.Shard(0)])
...     y = np.sort(x)
...     return y.placements, y.to_local(), np.argsort(x).numpy()
>>> dt.simulate(2, program)[1]
([Shard(dim=0)], array([4., 5.]), array([1, 3, 4, 2, 0]))
"""

from __future__ import annotations

import math
import operator
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import autograd, backend, comm
from ..placement import Partial, Replicate, Shard
from ..spec import DistSpec
from ..tensor import DistTensor, reshard
from . import shape as sh
from .ndarray import Unsupported, _plain, _to
from .numpy_interop import implements

_R = Replicate()


# -- keys (Note [Sort keys]) ---------------------------------------------------------------------
def _float_key(v: np.ndarray) -> np.ndarray:
    """Unsigned keys of floats in numpy's order: one NaN above +inf, -0.0 tied with 0.0."""
    utype = np.dtype(f"u{v.dtype.itemsize}")
    top = utype.type(1 << (8 * v.dtype.itemsize - 1))
    v = np.where(np.isnan(v), v.dtype.type(np.nan), v)
    u = np.where(v == 0, v.dtype.type(0), v).view(utype)
    return np.where(u & top, ~u, u | top)


def key_words(v: np.ndarray) -> list[np.ndarray]:
    """Unsigned words of ``v`` (any shape) whose lexicographic order is numpy's sort order."""
    kind, size = v.dtype.kind, v.dtype.itemsize
    if kind == "b":
        return [v.view(np.uint8)]
    if kind == "u":
        return [v]
    if kind == "i":
        return [v.view(f"u{size}") ^ np.dtype(f"u{size}").type(1 << (8 * size - 1))]
    if kind == "f" and size <= 8:
        return [_float_key(v)]
    if kind == "c" and size <= 16:
        re, im = v.real, v.imag
        kr, ki = _float_key(re), _float_key(im)
        nr, ni = np.isnan(re), np.isnan(im)
        full = np.iinfo(kr.dtype).max
        t = kr.dtype.type
        hi = np.where(nr, np.where(ni, t(full), t(full - 1)), np.where(ni, t(full - 2), kr))
        lo = np.where(nr, np.where(ni, t(0), ki), np.where(ni, kr, ki))
        if size == 8:  # two 32-bit words in one
            return [(hi.astype(np.uint64) << np.uint64(32)) | lo.astype(np.uint64)]
        return [hi, lo]
    raise Unsupported(f"sorting {v.dtype} values")


def _passes(dtype: np.dtype) -> int:
    """Radix passes (8 key bits each) of a dtype's keys."""
    return 16 if dtype == np.complex128 else 8 if dtype.kind == "c" else dtype.itemsize


def _key_order(words: list[np.ndarray]) -> np.ndarray:
    """The stable order of items by their keys along the last axis."""
    if len(words) == 1:
        return np.argsort(words[0], axis=-1, kind="stable")
    return np.lexsort(tuple(reversed(words)), axis=-1)


# -- the sort of one group's lanes (Note [Distributed sort]) -------------------------------------
class Plan(NamedTuple):
    """How this rank takes part in a sort: ``x`` (Partials reduced; for ``axis=None`` split
    along axis 0 only), its sorted axis (None: flattened), the sorted values' layout, the
    group of ranks that split the axis (global ranks, in axis order) with each member's
    first item and item count per lane, and the k + 1 bounds of the output's shards."""

    x: DistTensor
    axis: int | None
    out: DistSpec
    members: tuple[int, ...]
    n: int
    starts: tuple[int, ...]
    counts: tuple[int, ...]
    bounds: tuple[int, ...]

    @property
    def me(self) -> int:
        return self.members.index(comm.get_rank())

    def lanes(self, local: np.ndarray) -> np.ndarray:
        """A local array of x's layout as (lanes, items along the sorted axis)."""
        if self.axis is None:
            return local.reshape(1, -1)
        moved = np.moveaxis(local, self.axis, -1)
        return moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1])

    def unlanes(self, a: np.ndarray) -> np.ndarray:
        """(lanes, sorted items) of this rank's output shard as the output's local array."""
        shape = self.out.local_shape(self.out.mesh.get_coord(comm.get_rank()))
        if self.axis is None:
            return a.reshape(shape)
        moved = (*shape[: self.axis], *shape[self.axis + 1 :], shape[self.axis])
        return np.moveaxis(a.reshape(moved), -1, self.axis)


def _leading(x: DistTensor) -> DistTensor:
    """``x`` with every mesh dim that splits it splitting axis 0, so each rank holds a run of
    the flattened order: one all-to-all per mesh dim that split another axis (the reshard
    planner gathers over a mesh dim first where the nesting of Shard(0)s needs it)."""
    pls = [
        Shard(0) if p.is_shard() and x.mesh.shape[m] > 1 else p for m, p in enumerate(x.placements)
    ]
    return _to(x, pls)


def plan(a: DistTensor, axis: Any) -> Plan:
    """The sort of ``a`` along ``axis`` (None: flattened), on this rank. Raises numpy's
    AxisError on every rank before any collective."""
    if axis is not None:
        axis = normalize_axis_index(operator.index(axis), a.ndim)
    x = _plain(a)
    mesh = x.mesh
    if axis is None:
        if x.ndim == 0:
            x = sh.reshape(x, (1,))
        x = _leading(x)
        split = [p.is_shard() and mesh.shape[m] > 1 for m, p in enumerate(x.placements)]
        pls = [Shard(0) if s else _R for s in split]
        out = DistSpec(mesh, tuple(pls), (x.size,), x.dtype)
        along, per = 0, math.prod(x.shape[1:])
    else:
        out, along, per = x._spec, axis, 1
    coord = mesh.get_coord(comm.get_rank())
    if coord is None:
        return Plan(x, axis, out, (), 0, (), (), ())
    group = [
        m
        for m, p in enumerate(x.placements)
        if p.is_shard() and p.dim == along and mesh.shape[m] > 1
    ]
    index = tuple(slice(None) if m in group else c for m, c in enumerate(coord))
    members = tuple(int(r) for r in np.asarray(mesh.mesh[index]).ravel())
    coords = [mesh.get_coord(r) for r in members]
    boxes = [x._spec.local_box(c)[along] for c in coords]
    out_axis = 0 if axis is None else axis
    n = x.shape[along] * per
    bounds = (*(out.local_box(c)[out_axis][0] for c in coords), n)
    starts = tuple(s * per for s, _ in boxes)
    return Plan(x, axis, out, members, n, starts, tuple(c * per for _, c in boxes), bounds)


def _distributes(n: int, k: int, dtype: np.dtype, positions: int, index: bool) -> bool:
    """Whether the distributed sort of lanes of n items over k ranks receives fewer bytes per
    rank and lane than gathering them: the selection's digit counts (all-reduced: about
    twice their bytes) and the items that leave their rank, against the lane's other shards.
    The same answer on every rank (global sizes only)."""
    select = _passes(dtype) * positions * 256 * 4 * 2 + positions * k * 16
    moved = n * (k - 1) // (k * k) * (dtype.itemsize + (8 if index else 0))
    return select + moved < n * (k - 1) // k * dtype.itemsize


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the runs [start, start + length), concatenated, and each one's run."""
    lengths = np.asarray(lengths, np.int64)
    run = np.repeat(np.arange(len(lengths)), lengths)
    offsets = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum())) - np.repeat(offsets - starts, lengths), run


def _run_counts(w: np.ndarray, shift: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """(lanes, boundaries, 256) counts of the key byte at ``shift`` over each run [lo, hi) of
    the sorted key words ``w`` (lanes, items); equal runs are counted once."""
    lanes, c = w.shape
    rows = np.stack([np.repeat(np.arange(lanes), lo.shape[1]), lo.ravel(), hi.ravel()], 1)
    runs, which = np.unique(rows, axis=0, return_inverse=True)
    idx, run = _ranges(runs[:, 0] * c + runs[:, 1], runs[:, 2] - runs[:, 1])
    digit = ((w.reshape(-1)[idx] >> w.dtype.type(shift)) & w.dtype.type(255)).astype(np.intp)
    counts = np.bincount(run * 256 + digit, minlength=len(runs) * 256).reshape(-1, 256)
    return counts[which.ravel()].reshape(lanes, lo.shape[1], 256)


def _select(words, positions, n: int, group) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Radix select (Note [Distributed sort]) of the global ``positions`` of every lane from
    this rank's sorted key ``words``: per lane and position, how many of this rank's items
    are below the key there, how many equal it, and how many of the equal items (over the
    group, in group order) come before the position."""
    lanes, c = words[0].shape
    t = len(positions)
    lo = np.zeros((lanes, t), np.int64)
    hi = np.full((lanes, t), c, np.int64)
    rem = np.tile(np.asarray(positions, np.int64), (lanes, 1))
    ctype = np.int32 if n < 2**31 else np.int64
    for w in words:
        for shift in range(8 * w.dtype.itemsize - 8, -8, -8):
            local = _run_counts(w, shift, lo, hi)
            total = local.astype(ctype)
            group.allreduce(total, total, "sum")
            cum = np.cumsum(total, axis=-1)
            d = (cum <= rem[..., None]).sum(axis=-1)[..., None]  # the digit holding rem
            rem -= np.where(d > 0, np.take_along_axis(cum, np.maximum(d - 1, 0), -1), 0)[..., 0]
            mine = np.cumsum(local, axis=-1)
            below = np.where(d > 0, np.take_along_axis(mine, np.maximum(d - 1, 0), -1), 0)
            lo, hi = lo + below[..., 0], lo + np.take_along_axis(mine, d, -1)[..., 0]
            if (np.take_along_axis(total, d, -1) == 1).all():  # each run is one item now
                return lo, hi - lo, rem
    return lo, hi - lo, rem


def exchange(group, arrays: list[np.ndarray], send: list[int], recv: list[int]) -> list:
    """One all-to-all of the items of ``arrays`` (packed side by side, in blocks by member):
    ``send[j]`` items go to member j, ``recv[j]`` come from it, in member order. The block a
    rank keeps is copied, not handed to the all-to-all (so its bytes count what leaves)."""
    me = group.rank
    lo, hi = sum(send[:me]), sum(send[: me + 1])
    record = np.dtype([(f"f{i}", a.dtype) for i, a in enumerate(arrays)])
    out = np.empty(len(arrays[0]) - (hi - lo), record)
    for i, a in enumerate(arrays):
        out[f"f{i}"] = np.concatenate([a[:lo], a[hi:]])
    got = np.empty(sum(recv) - recv[me], record)
    size = record.itemsize
    send = [0 if j == me else c * size for j, c in enumerate(send)]
    came = [0 if j == me else c * size for j, c in enumerate(recv)]
    group.alltoall(out.view(np.uint8), send, got.view(np.uint8), came)
    at = sum(recv[:me])
    return [
        np.concatenate([got[f"f{i}"][:at], a[lo:hi], got[f"f{i}"][at:]])
        for i, a in enumerate(arrays)
    ]


def _local(lanes: np.ndarray, index: bool):
    """Whole lanes sorted on this rank (numpy's stable sort), and their indices."""
    if not index:
        return np.sort(lanes, axis=-1, kind="stable"), None
    order = np.argsort(lanes, axis=-1, kind="stable")
    return np.take_along_axis(lanes, order, -1), order.astype(np.intp)


def sorted_shard(p: Plan, values: bool = True, index: bool = False):
    """This rank's shard of the sorted values and/or of their global indices (flat indices
    for ``axis=None``), as local arrays of the output's layout (None where not asked).
    Collective over the mesh of ``p.x``."""
    x = p.x
    if not p.members:  # a rank outside the mesh
        shape = p.out.local_shape(None)
        return np.empty(shape, x.dtype), np.empty(shape, np.intp)
    k, n = len(p.members), p.n
    lanes = p.lanes(x._local)
    positions = sorted({b for b in p.bounds[1:-1] if 0 < b < n})
    if k == 1 or n == 0 or lanes.shape[0] == 0:
        vals, idx = _local(lanes, index)
    elif not _distributes(n, k, x.dtype, len(positions), index):
        vals, idx = _gathered(p, index)
    else:
        vals, idx = _distributed(p, lanes, positions, index)
    return p.unlanes(vals) if values else None, p.unlanes(idx) if index else None


def _gathered(p: Plan, index: bool):
    """The lanes gathered over the group (one all-gather), sorted whole; this rank's part."""
    x, along = p.x, 0 if p.axis is None else p.axis
    pls = [
        _R if q.is_shard() and q.dim == along and x.mesh.shape[m] > 1 else q
        for m, q in enumerate(x.placements)
    ]
    with autograd.no_grad():
        whole = reshard(x, x.mesh, pls)
    vals, idx = _local(p.lanes(whole._local), index)
    mine = slice(p.bounds[p.me], p.bounds[p.me + 1])
    return vals[:, mine], None if idx is None else idx[:, mine]


def _distributed(p: Plan, lanes: np.ndarray, positions: list[int], index: bool):
    """Steps (1)-(4) of Note [Distributed sort] on this rank's lanes."""
    group = comm.group(p.members)
    k, me, n = len(p.members), p.me, p.n
    count, c = lanes.shape
    words = key_words(lanes)
    order = _key_order(words)
    vals = np.take_along_axis(lanes, order, -1)
    # cuts[s, lane, j]: member s sends its sorted items [cuts[..., j], cuts[..., j + 1]) to j;
    # a bound at 0 cuts before every item, one at n (members whose shard is empty) after all
    cuts = np.zeros((k, count, k + 1), np.int64)
    cuts[..., p.bounds.index(n) :] = np.asarray(p.counts, np.int64)[:, None, None]
    if positions:
        words = [np.take_along_axis(w, order, -1) for w in words]
        lo, eq, rem = _select(words, positions, n, group)
        every = np.empty((k, count, len(positions), 2), np.int64)
        mine = np.stack([lo, eq], -1)
        group.allgather(mine.reshape(-1), every.reshape(-1), [mine.size] * k)
        lo_all, eq_all = every[..., 0], every[..., 1]
        before = np.cumsum(eq_all, axis=0) - eq_all  # equal items on earlier members
        cut = lo_all + np.clip(rem - before, 0, eq_all)
        for j, b in enumerate(p.bounds):
            if 0 < b < n:
                cuts[..., j] = cut[..., positions.index(b)]
    sizes = np.diff(cuts[me], axis=-1).T  # (to member, lane)
    starts = cuts[me, :, :-1].T + np.arange(count)[None, :] * c
    take, _ = _ranges(starts.ravel(), sizes.ravel())
    arrays = [vals.reshape(-1)[take]]
    if index:
        arrays.append((order + p.starts[me]).astype(np.intp).reshape(-1)[take])
    came = cuts[:, :, me + 1] - cuts[:, :, me]  # (from member, lane)
    got = exchange(group, arrays, sizes.sum(1).tolist(), came.sum(1).tolist())
    lane = np.repeat(np.tile(np.arange(count), k), came.ravel())
    # lexsort is stable: equal keys stay in arrival order, by source member (the order of
    # their global indices) and then as each run was sorted
    words = key_words(got[0])
    merged = _key_order(words) if count == 1 else np.lexsort((*reversed(words), lane))
    width = p.bounds[me + 1] - p.bounds[me]
    vals = got[0][merged].reshape(count, width)
    return vals, got[1][merged].reshape(count, width) if index else None


# -- items back to their positions ---------------------------------------------------------------
def deliver(values: np.ndarray, targets: np.ndarray, spec: DistSpec, members) -> np.ndarray:
    """This rank's local array of ``spec`` filled with ``values`` sent to their global flat
    positions ``targets`` by the ``members`` of its group (whose shards hold every position of
    the items they exchange): one all-to-all of the counts, one of the items with their local
    positions. Collective over ``members``."""
    mesh = spec.mesh
    shape = spec.local_shape(mesh.get_coord(comm.get_rank()))
    out = np.empty(math.prod(shape), values.dtype)
    if spec.ndim == 0 or not members:
        out[...] = values[: out.size]
        return out.reshape(shape)
    k = len(members)
    where = np.unravel_index(targets, spec.shape)
    owner = np.zeros(len(targets), np.intp)
    pos = np.zeros(len(targets), np.int64)
    for j, r in enumerate(members):
        box = spec.local_box(mesh.get_coord(r))
        inside = np.ones(len(targets), bool)
        for w, (s, m) in zip(where, box):
            inside &= (w >= s) & (w < s + m)
        if inside.any():
            owner[inside] = j
            local = tuple(w[inside] - s for w, (s, _) in zip(where, box))
            pos[inside] = np.ravel_multi_index(local, tuple(m for _, m in box))
    if k == 1:
        out[pos] = values
        return out.reshape(shape)
    group = comm.group(members)
    order = np.argsort(owner, kind="stable")
    send = np.bincount(owner, minlength=k).astype(np.int64)
    recv = np.empty(k, np.int64)
    group.alltoall(send, None, recv, None)
    got = exchange(group, [values[order], pos[order]], send.tolist(), recv.tolist())
    out[got[1]] = got[0]
    return out.reshape(shape)


def _targets(p: Plan, idx: np.ndarray) -> np.ndarray:
    """The global flat positions in ``p.x`` of the items of this rank's output shard, whose
    global indices along the sorted axis are ``idx``."""
    if p.axis is None:
        return idx.astype(np.int64)
    shape = p.x.shape
    strides = np.cumprod((1, *shape[:0:-1]))[::-1]  # C order, in items
    flat = idx.astype(np.int64) * strides[p.axis]
    for d, (s, m) in enumerate(p.out.local_box(p.out.mesh.get_coord(comm.get_rank()))):
        if d != p.axis:
            flat = flat + (np.arange(s, s + m) * strides[d]).reshape(
                [-1 if i == d else 1 for i in range(len(shape))]
            )
    return flat


def _sort_gradient(p: Plan, idx: np.ndarray):
    """d sort / d x: each output gradient goes back to its item's position. A Partial
    gradient stays Partial on mesh dims where the output is Replicate (a permutation commutes
    with every reduction)."""

    def backward(grads):
        (g,) = grads
        pls = [
            q if o.is_replicate() and q.is_partial() else o
            for q, o in zip(g.placements, p.out.placements)
        ]
        g = _to(g, pls)
        spec = p.x._spec
        local = deliver(g._local.reshape(-1), _targets(p, idx).reshape(-1), spec, p.members)
        kept = [q if q.is_partial() else s for q, s in zip(pls, spec.placements)]
        return (DistTensor(local, spec.replace(placements=kept, dtype=g.dtype)),)

    return backward


# -- sort, argsort, searchsorted -----------------------------------------------------------------
def _checked(a: Any, kind: Any, order: Any, stable: Any, func) -> None:
    """Arguments numpy takes (its errors for kind= and stable=, on every rank alike)."""
    if order is not None:
        raise Unsupported("order= (structured dtypes)")
    if not isinstance(a, DistTensor):
        raise Unsupported("no DistTensor to sort")
    key_words(np.empty(0, a.dtype))
    func(np.empty(0, a.dtype), kind=kind, stable=stable)


def sort(a, axis=-1, kind=None, order=None, *, stable=None):
    """``np.sort``: local along an axis no mesh dim splits, else distributed (Note
    [Distributed sort]); the result keeps the input's layout (Partials reduced), and ties
    keep their order for every ``kind``.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([[3, 1], [2, 9]]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.sort(x, axis=0).numpy(), dt.sort(x, axis=None).numpy()
    (array([[2, 1],
           [3, 9]]), array([1, 2, 3, 9]))
    """
    backend.host_only("sort", a, axis, kind, order)
    _checked(a, kind, order, stable, np.sort)
    p = plan(a, axis)
    x = p.x
    grad = autograd.is_grad_enabled() and x.requires_grad and x.dtype.kind in "fc"
    vals, idx = sorted_shard(p, True, grad)
    out = DistTensor(vals, p.out)
    if grad:
        autograd.record("sort", (x,), (out,), _sort_gradient(p, idx))
    return out


def argsort(a, axis=-1, kind=None, order=None, *, stable=None):
    """``np.argsort``: global indices along ``axis`` (flat ones for ``axis=None``), laid
    out as ``np.sort``'s result; ties in index order for every ``kind``.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([2.0, np.nan, -1.0, 2.0]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> dt.argsort(x).numpy()
    array([2, 0, 3, 1])
    """
    backend.host_only("argsort", a, axis, kind, order)
    _checked(a, kind, order, stable, np.argsort)
    p = plan(a, axis)
    _, idx = sorted_shard(p, False, True)
    return DistTensor(idx, p.out.replace(dtype=np.dtype(np.intp)))


def searchsorted(a, v, side="left", sorter=None):
    """``np.searchsorted``: each rank counts the items of its shard of ``a`` below each value
    (``side="right"``: not above it); the counts, summed over the mesh dims that split ``a``
    (an all-reduce, or a reduce-scatter where ``v`` is split there too), are the indices. The
    result has ``v``'s layout; it moves bytes of ``v``, never of ``a``.

    >>> import numpy as np, disttensor as dt
    >>> a = dt.shard_tensor(np.array([1.0, 2.0, 2.0, 5.0]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> np.searchsorted(a, [2.0, 9.0]).numpy(), int(a.searchsorted(2.0, side="right"))
    (array([1, 4]), 3)
    """
    backend.host_only("searchsorted", a, v, side, sorter)
    if sorter is not None:
        raise Unsupported("sorter=")
    vdtype = v.dtype if isinstance(v, DistTensor) else np.asarray(v).dtype
    adtype = a.dtype if isinstance(a, DistTensor) else np.asarray(a).dtype
    ndim = a.ndim if isinstance(a, DistTensor) else np.ndim(a)
    np.searchsorted(np.empty((0,) * ndim, adtype), np.empty(0, vdtype), side)  # numpy's errors
    if isinstance(a, DistTensor) and isinstance(v, DistTensor) and v.mesh != a.mesh:
        raise ValueError(f"searchsorted: a and v live on different meshes ({a.mesh}, {v.mesh})")
    if not isinstance(a, DistTensor):
        a_np = np.asarray(a)
        v = _plain(v)
        coord = v.mesh.get_coord(comm.get_rank())
        local = np.searchsorted(a_np, v._local, side) if coord is not None else v._local
        return DistTensor(np.asarray(local, np.intp), v._spec.replace(dtype=np.dtype(np.intp)))
    a = _plain(a)
    mesh = a.mesh
    if not isinstance(v, DistTensor):
        value = np.asarray(v)
        spec = DistSpec(mesh, (_R,) * mesh.ndim, value.shape, value.dtype)
        inside = mesh.get_coord(comm.get_rank()) is not None
        v = DistTensor(value if inside else np.empty(spec.local_shape(None), value.dtype), spec)
    v = _plain(v)
    split = [p.is_shard() and mesh.shape[m] > 1 for m, p in enumerate(a.placements)]
    with autograd.no_grad():
        whole = _to(v, [_R if s else q for s, q in zip(split, v.placements)])
    counts = whole._local
    if mesh.get_coord(comm.get_rank()) is not None:
        counts = np.searchsorted(a._local, whole._local, side)
    pls = [Partial("sum") if s else q for s, q in zip(split, whole.placements)]
    spec = whole._spec.replace(placements=tuple(pls), dtype=np.dtype(np.intp))
    return _to(DistTensor(np.asarray(counts, np.intp), spec), v.placements)


@implements(np.searchsorted, name="searchsorted")
def _np_searchsorted(given):
    return searchsorted(**given)


__all__ = ["argsort", "searchsorted", "sort"]
