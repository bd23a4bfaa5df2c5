"""``unique`` of DistTensors (``np.unique``: values, first indices, inverse, counts) after a
distributed sort, without gathering the data (Note [Unique of split data]).

Note [Unique of split data]
    The flattened tensor is sorted (Note [Distributed sort] in ops/sorting.py), with the
    items' flat indices where the first indices or the inverse are asked for; the sort is
    stable, so the first item of each group of equal values is its first occurrence, which
    represents the group (numpy's value too where it sorts stably, with return_index;
    otherwise numpy may show another of the equal values, 0.0 for -0.0). Each
    rank marks where a group starts among its sorted items; whether its first item starts one
    depends on the last item of the nearest earlier rank that holds any, so one small
    all-gather of each rank's first and last keys and its count of starts tells every rank
    the global number of each of its groups, and where the next group after its last one
    starts (its count). Equality is numpy's: -0.0 equals 0.0, and with ``equal_nan`` all
    NaNs (for complex numbers every value with a NaN part) are one group, represented by the
    first in sorted order. The inverse (each item's group number) goes back to the items'
    positions in the input's layout (``sorting.deliver``), so it has the input's
    placements. The size of the result depends on the data; its layout does too: where the
    unique values are at most the data of one rank's shard (U <= N / k over the k ranks
    that split the input), the values, first indices and counts are gathered (one
    all-gather of the result's bytes) and are Replicate, as small results are used whole
    (classes, labels); larger ones are split like the sorted values, array_split over the
    same mesh dims (one exchange that moves each group to its shard, O(local)).
    ``axis=`` of an n-D tensor (rows compared as records) takes the replicate fallback.

    On a device (Note [Sorting on a device] in ops/sorting.py) the groups, the records of the
    all-gather and the results stay on the device; the gathered first and last keys are read
    on the host, where the group boundaries between ranks are decided. A tensor each rank
    holds whole takes this rule on its own rank (``_sorted_unique``: a stable sort by the
    keys) rather than np.unique: the same values, except that a group is represented by its
    first occurrence where numpy's may show another of its equal values (0.0 for -0.0), and
    the NaN groups of ``equal_nan=False`` are numbered in their order.

>>> import numpy as np, disttensor as dt
>>> x = dt.shard_tensor(np.array([[3, 1], [3, 2]]), dt.ProcessMesh([0]), [dt.Shard(0)])
>>> values, counts = np.unique(x, return_counts=True)
>>> values.numpy(), counts.numpy()
(array([1, 2, 3]), array([1, 1, 2]))
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import autograd, backend, comm
from ..placement import Replicate
from ..spec import DistSpec
from ..tensor import DistTensor
from . import sorting
from .ndarray import Unsupported, _plain
from .numpy_interop import implements

_INTP = np.dtype(np.intp)
_R = Replicate()


def _ties(wa, na, wb, nb, kind: str, equal_nan: bool) -> Any:
    """Whether items a equal items b as numpy's unique compares them (keys: Note [Sort keys]
    in ops/sorting.py, which tie -0.0 with 0.0 and every NaN with every NaN)."""
    same = backend.xp(wa[0]).ones(wa[0].shape, bool)
    for x, y in zip(wa, wb):
        same &= x == y
    if kind in "fc":
        same = same | (na & nb) if equal_nan else same & ~na
    return same


def _group_starts(vals: Any, kind: str, equal_nan: bool) -> tuple[Any, list, Any]:
    """Whether each of the sorted items ``vals`` starts a group (differs from the item before
    it, as numpy's unique compares; the first item does), with their key words and NaN
    flags."""
    xp = backend.xp(vals)
    words = sorting.key_words(vals)
    nans = xp.isnan(vals) if kind in "fc" else xp.zeros(len(vals), bool)
    mask = xp.ones(len(vals), bool)
    mask[1:] = ~_ties(
        [w[:-1] for w in words], nans[:-1], [w[1:] for w in words], nans[1:], kind, equal_nan
    )
    return mask, words, nans


def _record(vals: Any, mask: Any, words, nans) -> Any:
    """This rank's part of the all-gather: its item count, group starts after its first
    item and the position of the first of them, the keys and NaN flags of its first and last
    items (int64 words, on the items' backend)."""
    xp = backend.xp(vals)
    n = len(vals)
    inner = xp.flatnonzero(mask[1:])
    head = [xp.asarray(np.array([n, len(inner)]))]
    if not n:
        return xp.concatenate([*head, xp.zeros(1 + 2 * len(words) + 2, np.int64)])
    first = inner[:1] + 1 if len(inner) else xp.full(1, n, np.int64)
    ends = [xp.stack([w[0], w[-1]]).astype(np.uint64).view(np.int64) for w in words]
    flags = xp.stack([nans[0], nans[-1]]).astype(np.int64)
    return xp.concatenate([*head, first.astype(np.int64), *ends, flags])


def _starts(every: np.ndarray, words: int, kind: str, equal_nan: bool) -> np.ndarray:
    """Per member (rows of the gathered records): whether its first item starts a group."""
    first = np.ones(len(every), bool)
    prev = None
    for j, row in enumerate(every):
        if row[0] == 0:
            continue
        if prev is not None:
            keys = row[3 : 3 + 2 * words]
            last = prev[3 : 3 + 2 * words]
            a = [last[2 * i + 1 : 2 * i + 2] for i in range(words)]
            b = [keys[2 * i : 2 * i + 1] for i in range(words)]
            nan_a, nan_b = prev[-1:].astype(bool), row[-2:-1].astype(bool)
            first[j] = not _ties(a, nan_a, b, nan_b, kind, equal_nan)[0]
        prev = row
    return first


def _local_unique(x: DistTensor, flags: tuple[bool, bool, bool], equal_nan: bool) -> list:
    """numpy's unique of a tensor each rank holds whole (or that is empty); on a device, the
    same rule as a split tensor's (``_sorted_unique``)."""
    mesh = x.mesh
    inside = mesh.get_coord(comm.get_rank()) is not None
    xp = backend.xp(x._local)
    local = x._local if inside else xp.empty(0, x.dtype)
    if xp is np:
        got = np.unique(local, *flags, equal_nan=equal_nan)
        got = list(got) if any(flags) else [got]
    else:
        got = _sorted_unique(local, flags, equal_nan)
    rep = tuple(_R for _ in range(mesh.ndim))
    out = []
    for i, a in enumerate(got):
        if i == 1 + flags[0] and flags[1]:  # the inverse: the input's layout
            spec = x._spec.replace(dtype=_INTP)
            a = a.reshape(local.shape) if inside else xp.empty(spec.local_shape(None), _INTP)
        else:
            spec = DistSpec(mesh, rep, a.shape, a.dtype)
        out.append(DistTensor(a, spec))
    return out


def _sorted_unique(local: Any, flags: tuple[bool, bool, bool], equal_nan: bool) -> list:
    """``np.unique(local, *flags, equal_nan=equal_nan)`` (the inverse flat) by Note [Unique of
    split data]'s rule on one rank: a stable sort by the keys, groups compared as numpy's
    unique compares them, each represented by its first occurrence."""
    xp = backend.xp(local)
    flat = local.reshape(-1)
    order = sorting.stable_order(flat)
    vals = flat[order]
    mask = _group_starts(vals, local.dtype.kind, equal_nan)[0]
    starts = xp.flatnonzero(mask)
    out = [vals[starts]]
    if flags[0]:
        out.append(order[starts].astype(_INTP))
    if flags[1]:
        inverse = xp.empty(len(flat), _INTP)
        inverse[order] = xp.cumsum(mask) - 1
        out.append(inverse)
    if flags[2]:
        ends = xp.concatenate([starts[1:], xp.full(1 if len(flat) else 0, len(flat), _INTP)])
        out.append((ends - starts).astype(_INTP))
    return out


def _place(parts: list, sizes: np.ndarray, p: sorting.Plan, group) -> list:
    """Each rank's unique values (and first indices, counts), ``sizes[j]`` on member j, in
    member order, as DistTensors: Replicate when small, else split as the sorted values
    (Note [Unique of split data])."""
    me, total, mesh = p.me, int(sizes.sum()), p.out.mesh
    if total * len(p.members) <= p.n:
        placements = tuple(_R for _ in range(mesh.ndim))
        xp, dtypes = backend.xp(parts[0]), [a.dtype for a in parts]
        size = sum(d.itemsize for d in dtypes)
        got = xp.empty(total * size, np.uint8)
        group.allgather(sorting.pack(parts), got, [int(c) * size for c in sizes])
        parts = [xp.ascontiguousarray(a) for a in sorting.unpack(got, dtypes)]
    else:  # each group to the member whose array_split share holds its number
        placements = p.out.placements
        spec = DistSpec(mesh, placements, (total,), parts[0].dtype)
        bounds = [spec.local_box(mesh.get_coord(r))[0] for r in p.members]
        offsets = (np.cumsum(sizes) - sizes).tolist()

        def overlap(a0, n, b0, m):
            return max(0, min(a0 + n, b0 + m) - max(a0, b0))

        send = [overlap(offsets[me], int(sizes[me]), s, m) for s, m in bounds]
        recv = [overlap(o, int(c), *bounds[me]) for o, c in zip(offsets, sizes)]
        parts = sorting.exchange(group, parts, send, recv)
    return [DistTensor(a, DistSpec(mesh, placements, (total,), a.dtype)) for a in parts]


def unique(
    ar,
    return_index=False,
    return_inverse=False,
    return_counts=False,
    axis=None,
    *,
    equal_nan=True,
    sorted=True,
):
    """``np.unique`` of the flattened tensor (Note [Unique of split data]): a distributed
    sort, each rank's groups, the boundaries between ranks from one small all-gather; the
    inverse has the input's layout.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.array([2.0, -0.0, 2.0, 0.0, np.nan]), dt.ProcessMesh([0]),
    ...                     [dt.Shard(0)])
    >>> [t.numpy() for t in dt.unique(x, return_index=True, return_inverse=True)]
    [array([-0.,  2., nan]), array([1, 0, 4]), array([1, 0, 1, 0, 2])]
    """
    if not isinstance(ar, DistTensor):
        raise Unsupported("not a DistTensor")
    if axis is not None:
        if ar.ndim != 1:
            raise Unsupported("axis= of an n-D tensor (rows compared as records)")
        normalize_axis_index(operator.index(axis), 1)
    flags = (bool(return_index), bool(return_inverse), bool(return_counts))
    if not sorted and not any(flags):
        raise Unsupported("sorted=False (numpy's own order is its hash table's)")
    sorting.key_words(np.empty(0, ar.dtype))  # dtypes without keys: Unsupported
    x = _plain(ar)
    p = sorting.plan(x, None)
    if len(p.members) <= 1 or p.n == 0:
        out = _local_unique(x, flags, equal_nan)
    else:
        out = _distributed(x, p, flags, equal_nan)
    if x.requires_grad and autograd.is_grad_enabled() and x.dtype.kind in "fc":
        autograd.record("unique", (x,), (out[0],), None)  # backward refuses, naming it
    return tuple(out) if any(flags) else out[0]


def _distributed(x: DistTensor, p: sorting.Plan, flags, equal_nan: bool) -> list:
    """Note [Unique of split data] on the ranks of a group that split ``x``."""
    return_index, return_inverse, return_counts = flags
    vals, perm = sorting.sorted_shard(p, True, return_index or return_inverse)
    group = comm.group(p.members)
    k, me, kind = len(p.members), p.me, x.dtype.kind
    xp = backend.xp(vals)
    mask, words, nans = _group_starts(vals, kind, equal_nan)
    mine = _record(vals, mask, words, nans)
    every = xp.empty((k, len(mine)), np.int64)
    group.allgather(mine, every.reshape(-1), [len(mine)] * k)
    every = backend.to_host(every)  # counts and boundary keys: read on the host
    first = _starts(every, len(words), kind, equal_nan)
    sizes = np.where(every[:, 0] > 0, first.astype(np.int64) + every[:, 1], 0)
    offset = int(sizes[:me].sum())
    if len(vals):
        mask[0] = bool(first[me])
    starts = xp.flatnonzero(mask)
    parts = [vals[starts]]
    if return_index:
        parts.append(perm[starts])
    if return_counts:
        nxt = p.n
        for j in range(me + 1, k):
            if every[j, 0] > 0 and (first[j] or every[j, 1] > 0):
                nxt = p.bounds[j] + (0 if first[j] else int(every[j, 2]))
                break
        last = xp.full(1 if len(starts) else 0, nxt - p.bounds[me], starts.dtype)
        parts.append((xp.concatenate([starts[1:], last]) - starts).astype(_INTP))
    out = _place(parts, sizes, p, group)
    if return_inverse:
        groups = (offset + xp.cumsum(mask) - 1).astype(_INTP)
        local = sorting.deliver(groups, perm, x._spec, p.members)
        out.insert(1 + return_index, DistTensor(local, x._spec.replace(dtype=_INTP)))
    return out


@implements(np.unique, name="unique")
def _np_unique(given):
    return unique(**given)


__all__ = ["unique"]
