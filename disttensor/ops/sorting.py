"""Sorting DistTensors without gathering them: ``sort``, ``argsort`` (and ``x.sort()`` in
place), ``searchsorted``, with numpy's names and semantics; ops/unique.py builds ``unique`` on
the same machinery.

Along an axis that no mesh dim splits each rank sorts its own lanes, with no communication.
Along a split axis every rank ends with its own shard of the sorted result, in the input's
layout, after one exchange of its items (Note [Distributed sort]); short lanes are gathered
over the ranks that split them instead, where that moves less. Device shards are sorted on
the device, with the host's collectives (Note [Sorting on a device]).

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

Note [Sorting on a device]
    On device shards (Note [Array backends]) the same steps run with the shards' array
    module: the items, their keys, the orders and every per-item step stay on the device, and
    so do the buffers of every collective (the digit counts, the cut counts, the records of
    the all-to-all and the counts before it), so the collectives are the host's, call for
    call and byte for byte. The selection's bookkeeping (per lane and boundary: the runs
    still open, the digits found, the cuts: lanes x boundaries numbers) is host metadata, read
    from the device after each collective (``backend.to_host``). Orders come from the keys
    alone, also where a rank sorts whole lanes (``stable_order``: CuPy documents its sort and
    argsort as stable, "stable" the only kind they take, but not how its float comparisons
    place NaNs and -0.0; integer keys leave nothing to them); keys of several words are
    ordered by stable argsorts from the least significant word up (``_lexsort``: CuPy's
    lexsort takes 2-D keys with no ``axis`` and does not document its ties' order). CuPy has
    no structured dtypes, so a record is a row of bytes (``pack``), and runs of positions are
    built with a searchsorted (``_repeat``: CuPy's repeat copies run by run).

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
from ..mesh import different_meshes
from ..placement import Partial, Replicate, Shard
from ..spec import DistSpec
from ..tensor import DistTensor, reshard
from . import shape as sh
from .ndarray import Unsupported, _plain, _to
from .numpy_interop import implements

_R = Replicate()


# -- keys (Note [Sort keys]) ---------------------------------------------------------------------
def _float_key(v: Any) -> Any:
    """Unsigned keys of floats in numpy's order: one NaN above +inf, -0.0 tied with 0.0."""
    xp = backend.xp(v)
    utype = np.dtype(f"u{v.dtype.itemsize}")
    top = utype.type(1 << (8 * v.dtype.itemsize - 1))
    v = xp.where(xp.isnan(v), v.dtype.type(np.nan), v)
    u = xp.where(v == 0, v.dtype.type(0), v).view(utype)
    return xp.where(u & top, ~u, u | top)


def key_words(v: Any) -> list:
    """Unsigned words of ``v`` (any shape, any backend's array) whose lexicographic order is
    numpy's sort order."""
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
        xp = backend.xp(v)
        re, im = v.real, v.imag
        kr, ki = _float_key(re), _float_key(im)
        nr, ni = xp.isnan(re), xp.isnan(im)
        full = np.iinfo(kr.dtype).max
        t = kr.dtype.type
        hi = xp.where(nr, xp.where(ni, t(full), t(full - 1)), xp.where(ni, t(full - 2), kr))
        lo = xp.where(nr, xp.where(ni, t(0), ki), xp.where(ni, kr, ki))
        if size == 8:  # two 32-bit words in one
            return [(hi.astype(np.uint64) << np.uint64(32)) | lo.astype(np.uint64)]
        return [hi, lo]
    raise Unsupported(f"sorting {v.dtype} values")


def _passes(dtype: np.dtype) -> int:
    """Radix passes (8 key bits each) of a dtype's keys."""
    return 16 if dtype == np.complex128 else 8 if dtype.kind == "c" else dtype.itemsize


def _key_order(words: list) -> Any:
    """The stable order of items by their keys along the last axis."""
    if len(words) == 1:
        return backend.xp(words[0]).argsort(words[0], axis=-1, kind="stable")
    return _lexsort(tuple(reversed(words)))


def _lexsort(keys: tuple) -> Any:
    """``np.lexsort(keys, axis=-1)``: the stable order by ``keys`` (the last one primary)
    along the last axis. On a device, stable argsorts from the least significant key up (each
    keeps the order of its ties, which the keys before it decided): CuPy's lexsort takes
    2-D keys only, with no ``axis``, and does not document its ties' order; its argsort is
    stable (``kind`` None or "stable")."""
    xp = backend.xp(keys[0])
    if xp is np:
        return np.lexsort(keys, axis=-1)
    order = xp.argsort(keys[0], axis=-1, kind="stable")
    for k in keys[1:]:
        step = xp.argsort(xp.take_along_axis(k, order, -1), axis=-1, kind="stable")
        order = xp.take_along_axis(order, step, -1)
    return order


def stable_order(v: Any) -> Any:
    """The stable order of ``v``'s items along its last axis by Note [Sort keys]: numpy's
    order on any backend (a device's float comparisons need not place NaNs and -0.0 as
    numpy's do; integer keys leave nothing to the comparison)."""
    return _key_order(key_words(v))


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

    def lanes(self, local: Any) -> Any:
        """A local array of x's layout as (lanes, items along the sorted axis)."""
        if self.axis is None:
            return local.reshape(1, -1)
        moved = backend.xp(local).moveaxis(local, self.axis, -1)
        return moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1])

    def unlanes(self, a: Any) -> Any:
        """(lanes, sorted items) of this rank's output shard as the output's local array."""
        shape = self.out.local_shape(self.out.mesh.get_coord(comm.get_rank()))
        if self.axis is None:
            return a.reshape(shape)
        moved = (*shape[: self.axis], *shape[self.axis + 1 :], shape[self.axis])
        return backend.xp(a).moveaxis(a.reshape(moved), -1, self.axis)


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


def _repeat(values: np.ndarray, counts: np.ndarray, xp: Any) -> Any:
    """``np.repeat(values, counts)`` of host metadata, as an array of ``xp``. On a device each
    position finds its run among the runs' ends (one searchsorted), as CuPy's repeat takes
    per-item counts only as a host list and copies item by item."""
    if xp is np:
        return np.repeat(values, counts)
    ends = np.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    run = xp.searchsorted(xp.asarray(ends), xp.arange(total), side="right")
    return xp.asarray(values)[run]


def _ranges(starts: np.ndarray, lengths: np.ndarray, xp: Any = np) -> tuple[Any, Any]:
    """The positions of the runs [start, start + length) (host metadata), concatenated, and
    each one's run, as arrays of ``xp``."""
    lengths = np.asarray(lengths, np.int64)
    run = _repeat(np.arange(len(lengths)), lengths, xp)
    offsets = np.cumsum(lengths) - lengths
    return xp.arange(int(lengths.sum())) - _repeat(offsets - starts, lengths, xp), run


def _run_counts(w: Any, shift: int, lo: np.ndarray, hi: np.ndarray) -> Any:
    """(lanes, boundaries, 256) counts of the key byte at ``shift`` over each run [lo, hi) of
    the sorted key words ``w`` (lanes, items; on w's backend, the runs on the host); equal
    runs are counted once."""
    xp = backend.xp(w)
    lanes, c = w.shape
    rows = np.stack([np.repeat(np.arange(lanes), lo.shape[1]), lo.ravel(), hi.ravel()], 1)
    runs, which = np.unique(rows, axis=0, return_inverse=True)
    idx, run = _ranges(runs[:, 0] * c + runs[:, 1], runs[:, 2] - runs[:, 1], xp)
    digit = ((w.reshape(-1)[idx] >> w.dtype.type(shift)) & w.dtype.type(255)).astype(np.intp)
    counts = xp.bincount(run * 256 + digit, minlength=len(runs) * 256).reshape(-1, 256)
    return counts[xp.asarray(which.ravel())].reshape(lanes, lo.shape[1], 256)


def _select(words, positions, n: int, group) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Radix select (Note [Distributed sort]) of the global ``positions`` of every lane from
    this rank's sorted key ``words``: per lane and position, how many of this rank's items
    are below the key there, how many equal it, and how many of the equal items (over the
    group, in group order) come before the position (host arrays: the digit counts are
    all-reduced where the keys live, then read on the host)."""
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
            local, total = backend.to_host(local), backend.to_host(total)
            cum = np.cumsum(total, axis=-1)
            d = (cum <= rem[..., None]).sum(axis=-1)[..., None]  # the digit holding rem
            rem -= np.where(d > 0, np.take_along_axis(cum, np.maximum(d - 1, 0), -1), 0)[..., 0]
            mine = np.cumsum(local, axis=-1)
            below = np.where(d > 0, np.take_along_axis(mine, np.maximum(d - 1, 0), -1), 0)
            lo, hi = lo + below[..., 0], lo + np.take_along_axis(mine, d, -1)[..., 0]
            if (np.take_along_axis(total, d, -1) == 1).all():  # each run is one item now
                return lo, hi - lo, rem
    return lo, hi - lo, rem


def pack(arrays: list) -> Any:
    """The items of the 1-D ``arrays`` (one length, one backend) as records side by side, as
    the bytes of one collective: numpy's structured record on the host; on a device, whose
    arrays have no structured dtypes (CuPy), the same bytes in an (items, record) uint8
    array, each field written through a byte view of its array."""
    xp = backend.xp(arrays[0])
    n = len(arrays[0])
    if xp is np:
        out = np.empty(n, np.dtype([(f"f{i}", a.dtype) for i, a in enumerate(arrays)]))
        for i, a in enumerate(arrays):
            out[f"f{i}"] = a
        return out.view(np.uint8)
    out = xp.empty((n, sum(a.dtype.itemsize for a in arrays)), np.uint8)
    at = 0
    for a in arrays:
        size = a.dtype.itemsize
        out[:, at : at + size] = xp.ascontiguousarray(a).view(np.uint8).reshape(n, size)
        at += size
    return out.reshape(-1)


def unpack(buf: Any, dtypes: list) -> list:
    """``pack``'s arrays back from its bytes ``buf`` (on the host, views of the records'
    fields)."""
    xp = backend.xp(buf)
    if xp is np:
        got = buf.view(np.dtype([(f"f{i}", d) for i, d in enumerate(dtypes)]))
        return [got[f"f{i}"] for i in range(len(dtypes))]
    rows = buf.reshape(-1, sum(np.dtype(d).itemsize for d in dtypes))
    out, at = [], 0
    for d in dtypes:
        size = np.dtype(d).itemsize
        out.append(xp.ascontiguousarray(rows[:, at : at + size]).view(d).reshape(-1))
        at += size
    return out


def exchange(group, arrays: list, send: list[int], recv: list[int]) -> list:
    """One all-to-all of the items of ``arrays`` (packed side by side, in blocks by member):
    ``send[j]`` items go to member j, ``recv[j]`` come from it, in member order. The block a
    rank keeps is copied, not handed to the all-to-all (so its bytes count what leaves)."""
    me = group.rank
    xp = backend.xp(arrays[0])
    lo, hi = sum(send[:me]), sum(send[: me + 1])
    out = pack([xp.concatenate([a[:lo], a[hi:]]) for a in arrays])
    size = sum(a.dtype.itemsize for a in arrays)
    got = xp.empty((sum(recv) - recv[me]) * size, np.uint8)
    send = [0 if j == me else c * size for j, c in enumerate(send)]
    came = [0 if j == me else c * size for j, c in enumerate(recv)]
    group.alltoall(out, send, got, came)
    at = sum(recv[:me])
    return [
        xp.concatenate([g[:at], a[lo:hi], g[at:]])
        for g, a in zip(unpack(got, [a.dtype for a in arrays]), arrays)
    ]


def _local(lanes: Any, index: bool):
    """Whole lanes sorted on this rank, stably, and their indices: numpy's stable sort on the
    host, the keys' order on a device (``stable_order``)."""
    if type(lanes) is np.ndarray:
        if not index:
            return np.sort(lanes, axis=-1, kind="stable"), None
        order = np.argsort(lanes, axis=-1, kind="stable")
        return np.take_along_axis(lanes, order, -1), order.astype(np.intp)
    order = stable_order(lanes)
    vals = backend.xp(lanes).take_along_axis(lanes, order, -1)
    return vals, order.astype(np.intp) if index else None


def sorted_shard(p: Plan, values: bool = True, index: bool = False):
    """This rank's shard of the sorted values and/or of their global indices (flat indices
    for ``axis=None``), as local arrays of the output's layout (None where not asked).
    Collective over the mesh of ``p.x``."""
    x = p.x
    if not p.members:  # a rank outside the mesh
        shape = p.out.local_shape(None)
        xp = backend.xp(x._local)
        return xp.empty(shape, x.dtype), xp.empty(shape, np.intp)
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


def _distributed(p: Plan, lanes: Any, positions: list[int], index: bool):
    """Steps (1)-(4) of Note [Distributed sort] on this rank's lanes."""
    group = comm.group(p.members)
    k, me, n = len(p.members), p.me, p.n
    count, c = lanes.shape
    xp = backend.xp(lanes)
    words = key_words(lanes)
    order = _key_order(words)
    vals = xp.take_along_axis(lanes, order, -1)
    # cuts[s, lane, j]: member s sends its sorted items [cuts[..., j], cuts[..., j + 1]) to j;
    # a bound at 0 cuts before every item, one at n (members whose shard is empty) after all
    cuts = np.zeros((k, count, k + 1), np.int64)
    cuts[..., p.bounds.index(n) :] = np.asarray(p.counts, np.int64)[:, None, None]
    if positions:
        words = [xp.take_along_axis(w, order, -1) for w in words]
        lo, eq, rem = _select(words, positions, n, group)
        every = xp.empty((k, count, len(positions), 2), np.int64)
        mine = xp.asarray(np.stack([lo, eq], -1))  # on the keys' device for the collective
        group.allgather(mine.reshape(-1), every.reshape(-1), [mine.size] * k)
        every = backend.to_host(every)  # lanes x boundaries counts: the cuts are host metadata
        lo_all, eq_all = every[..., 0], every[..., 1]
        before = np.cumsum(eq_all, axis=0) - eq_all  # equal items on earlier members
        cut = lo_all + np.clip(rem - before, 0, eq_all)
        for j, b in enumerate(p.bounds):
            if 0 < b < n:
                cuts[..., j] = cut[..., positions.index(b)]
    sizes = np.diff(cuts[me], axis=-1).T  # (to member, lane)
    starts = cuts[me, :, :-1].T + np.arange(count)[None, :] * c
    take, _ = _ranges(starts.ravel(), sizes.ravel(), xp)
    arrays = [vals.reshape(-1)[take]]
    if index:
        arrays.append((order + p.starts[me]).astype(np.intp).reshape(-1)[take])
    came = cuts[:, :, me + 1] - cuts[:, :, me]  # (from member, lane)
    got = exchange(group, arrays, sizes.sum(1).tolist(), came.sum(1).tolist())
    lane = _repeat(np.tile(np.arange(count), k), came.ravel(), xp)
    # lexsort is stable: equal keys stay in arrival order, by source member (the order of
    # their global indices) and then as each run was sorted
    words = key_words(got[0])
    merged = _key_order(words) if count == 1 else _lexsort((*reversed(words), lane))
    width = p.bounds[me + 1] - p.bounds[me]
    vals = got[0][merged].reshape(count, width)
    return vals, got[1][merged].reshape(count, width) if index else None


# -- items back to their positions ---------------------------------------------------------------
def deliver(values: Any, targets: Any, spec: DistSpec, members) -> Any:
    """This rank's local array of ``spec`` filled with ``values`` sent to their global flat
    positions ``targets`` by the ``members`` of its group (whose shards hold every position of
    the items they exchange): one all-to-all of the counts, one of the items with their local
    positions. Collective over ``members``; on ``values``' backend throughout."""
    mesh = spec.mesh
    shape = spec.local_shape(mesh.get_coord(comm.get_rank()))
    xp = backend.xp(values)
    out = xp.empty(math.prod(shape), values.dtype)
    if spec.ndim == 0 or not members:
        out[...] = values[: out.size]
        return out.reshape(shape)
    k = len(members)
    where = xp.unravel_index(targets, spec.shape)
    owner = xp.zeros(len(targets), np.intp)
    pos = xp.zeros(len(targets), np.int64)
    for j, r in enumerate(members):
        box = spec.local_box(mesh.get_coord(r))
        inside = xp.ones(len(targets), bool)
        for w, (s, m) in zip(where, box):
            inside &= (w >= s) & (w < s + m)
        if inside.any():
            owner[inside] = j
            local = tuple(w[inside] - s for w, (s, _) in zip(where, box))
            pos[inside] = xp.ravel_multi_index(local, tuple(m for _, m in box))
    if k == 1:
        out[pos] = values
        return out.reshape(shape)
    group = comm.group(members)
    order = xp.argsort(owner, kind="stable")
    send = xp.bincount(owner, minlength=k).astype(np.int64)
    recv = xp.empty(k, np.int64)
    group.alltoall(send, None, recv, None)
    send, recv = backend.to_host(send).tolist(), backend.to_host(recv).tolist()  # k counts
    got = exchange(group, [values[order], pos[order]], send, recv)
    out[got[1]] = got[0]
    return out.reshape(shape)


def _targets(p: Plan, idx: Any) -> Any:
    """The global flat positions in ``p.x`` of the items of this rank's output shard, whose
    global indices along the sorted axis are ``idx``."""
    if p.axis is None:
        return idx.astype(np.int64)
    xp = backend.xp(idx)
    shape = p.x.shape
    strides = np.cumprod((1, *shape[:0:-1]))[::-1]  # C order, in items
    flat = idx.astype(np.int64) * strides[p.axis]
    for d, (s, m) in enumerate(p.out.local_box(p.out.mesh.get_coord(comm.get_rank()))):
        if d != p.axis:
            flat = flat + (xp.arange(s, s + m) * strides[d]).reshape(
                [-1 if i == d else 1 for i in range(len(shape))]
            )
    return flat


def _sort_gradient(p: Plan, idx: Any):
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
    _checked(a, kind, order, stable, np.argsort)
    p = plan(a, axis)
    _, idx = sorted_shard(p, False, True)
    return DistTensor(idx, p.out.replace(dtype=np.dtype(np.intp)))


def _operand(value: Any, like: DistTensor) -> Any:
    """``value`` (not a DistTensor) as an array beside ``like``'s shards: numpy among host
    shards; among device shards a device array of theirs as it is, host values copied onto
    the device (the explicit copy the replicate fallback makes of a numpy function's host
    arguments: Note [The replicate fallback on a device] in dispatch.py); a device array
    among host shards refused before any communication."""
    be, vb = backend.of(like._local), backend.of(value)
    if vb is be:
        return value if be.device else np.asarray(value)
    if not vb.device:
        return be.asarray(value)
    raise backend.mixed("searchsorted", vb, be)


def searchsorted(a, v, side="left", sorter=None):
    """``np.searchsorted``: each rank counts the items of its shard of ``a`` below each value
    (``side="right"``: not above it); the counts, summed over the mesh dims that split ``a``
    (an all-reduce, or a reduce-scatter where ``v`` is split there too), are the indices. The
    result has ``v``'s layout; it moves bytes of ``v``, never of ``a``. Among device tensors
    a plain ``v`` (or ``a``) of host values is copied onto the device (``_operand``).

    >>> import numpy as np, disttensor as dt
    >>> a = dt.shard_tensor(np.array([1.0, 2.0, 2.0, 5.0]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> np.searchsorted(a, [2.0, 9.0]).numpy(), int(a.searchsorted(2.0, side="right"))
    (array([1, 4]), 3)
    """
    if sorter is not None:
        raise Unsupported("sorter=")
    vdtype = v.dtype if isinstance(v, DistTensor) or backend.is_device(v) else np.asarray(v).dtype
    adtype = a.dtype if isinstance(a, DistTensor) or backend.is_device(a) else np.asarray(a).dtype
    ndim = a.ndim if isinstance(a, DistTensor) or backend.is_device(a) else np.ndim(a)
    np.searchsorted(np.empty((0,) * ndim, adtype), np.empty(0, vdtype), side)  # numpy's errors
    if isinstance(a, DistTensor) and isinstance(v, DistTensor):
        if v.mesh != a.mesh:
            raise ValueError(different_meshes("searchsorted", ("a", a.mesh), ("v", v.mesh)))
        if backend.of(v._local) is not backend.of(a._local):
            raise backend.mixed("searchsorted", backend.of(a._local), backend.of(v._local))
    if not isinstance(a, DistTensor):
        whole = _operand(a, v)  # ``a``, whole on every rank
        v = _plain(v)
        xp = backend.xp(v._local)
        coord = v.mesh.get_coord(comm.get_rank())
        local = xp.searchsorted(whole, v._local, side) if coord is not None else v._local
        return DistTensor(xp.asarray(local, np.intp), v._spec.replace(dtype=np.dtype(np.intp)))
    value = v if isinstance(v, DistTensor) else _operand(v, a)
    a = _plain(a)
    mesh = a.mesh
    xp = backend.xp(a._local)
    if not isinstance(v, DistTensor):
        spec = DistSpec(mesh, (_R,) * mesh.ndim, value.shape, value.dtype)
        inside = mesh.get_coord(comm.get_rank()) is not None
        v = DistTensor(value if inside else xp.empty(spec.local_shape(None), value.dtype), spec)
    v = _plain(v)
    split = [p.is_shard() and mesh.shape[m] > 1 for m, p in enumerate(a.placements)]
    with autograd.no_grad():
        whole = _to(v, [_R if s else q for s, q in zip(split, v.placements)])
    counts = whole._local
    if mesh.get_coord(comm.get_rank()) is not None:
        counts = xp.searchsorted(a._local, whole._local, side)
    pls = [Partial("sum") if s else q for s, q in zip(split, whole.placements)]
    spec = whole._spec.replace(placements=tuple(pls), dtype=np.dtype(np.intp))
    return _to(DistTensor(xp.asarray(counts, np.intp), spec), v.placements)


@implements(np.searchsorted, name="searchsorted")
def _np_searchsorted(given):
    return searchsorted(**given)


__all__ = ["argsort", "searchsorted", "sort"]
