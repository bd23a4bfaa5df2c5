"""An independent oracle for shard layouts and reshard collective counts.

It shares no code with disttensor/spec.py or disttensor/reshard.py: the boxes come from
``numpy.array_split`` itself and the counts from the rule below, so a test that compares the
library with it cannot be wrong in the same way as the library. It reads placements only through
their public attributes (``is_shard()``, ``dim``, ``is_partial()``, ``reduce_type``).

The contract: ``Shard(d)`` on mesh dim m splits tensor axis d among the ranks along m like
``numpy.array_split`` (the first n % k pieces get one extra element; empty pieces are legal).
Several mesh dims sharding one axis split it in mesh-dim order: the outer mesh dim splits first,
then each piece is split again by the next mesh dim sharding that axis.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np

# -- shard layout ------------------------------------------------------------------------------


def coord_of(ids, rank: int) -> tuple[int, ...] | None:
    """Coordinate of ``rank`` in the grid of process ids ``ids`` (None: not in it)."""
    hits = np.argwhere(np.asarray(ids) == rank)
    return tuple(int(c) for c in hits[0]) if len(hits) else None


@lru_cache(maxsize=1 << 14)
def local_box(global_shape, mesh_shape, placements, coord) -> tuple[slice, ...]:
    """The slices of the global tensor the rank at mesh ``coord`` holds (``coord=None``: none)."""
    ndim = len(global_shape)
    if coord is None:
        return tuple(slice(0, 0) for _ in global_shape)
    index = [np.arange(n) for n in global_shape]
    for m, p in enumerate(placements):  # mesh-dim order: the outer mesh dim splits first
        if p.is_shard():
            d = p.dim % ndim
            index[d] = np.array_split(index[d], mesh_shape[m])[coord[m]]
    box = []
    for ix in index:
        if len(ix) == 0:
            box.append(slice(0, 0))
        else:
            assert np.array_equal(ix, np.arange(ix[0], ix[-1] + 1))  # pieces are contiguous
            box.append(slice(int(ix[0]), int(ix[-1]) + 1))
    return tuple(box)


def local_shard(g: np.ndarray, mesh, placements, rank: int) -> np.ndarray:
    """``rank``'s piece of the global array ``g`` (a view; empty off the mesh)."""
    coord = coord_of(mesh.mesh, rank)
    return g[local_box(g.shape, tuple(mesh.shape), tuple(placements), coord)]


# -- collective counts -----------------------------------------------------------------------
#
# The model (the library's documented one, reshard.py's table): a reshard is a sequence of 1-D
# steps, each changing one mesh dim's placement. Leaving a Shard or a Partial moves data over
# the wire (all_gather, all_to_all, all_reduce, reduce_scatter: one collective each); leaving
# Replicate is local (slice, or zeros for Partial('sum')). Shard -> Partial and Partial ->
# Partial(other type) go through Replicate: one collective. Mesh dims of size 1 hold the same
# data under every placement: free, and they constrain nothing.
#
# Two constraints make a step on mesh dim m illegal while a LATER mesh dim j (size > 1) holds:
#   * Shard(d), when m leaves or arrives at Shard(d): m is then not the innermost split of axis
#     d, and its pieces are not whole on the rank (Note [Nested sharding] in spec.py);
#   * Partial(b), when m leaves Partial(a) and a, b do not commute: the true value reduces the
#     inner mesh dim first (Note [Partial order] in spec.py).
# Arriving at Partial, or leaving/arriving at Replicate, is never constrained.
#
# The exact minimum in that model:
#   * Every mesh dim that must change and does not start Replicate costs at least one
#     collective (the only free steps leave Replicate), and exactly one suffices: route it
#     through Replicate (one collective to leave, then a free step to the target).
#   * A mesh dim j with src[j] == dst[j] != Replicate costs nothing if left alone, but it is
#     "forced" when an earlier mesh dim m that moves conflicts with src[j] (above): m can then
#     never take its step while j sits there, so j must leave and come back: one collective.
#     Forced dims move too, so they can force later ones: the forced set is the least fixpoint
#     of that rule, and every dim in it is necessary (by induction on the fixpoint's rounds).
#   * The count is reached: take every moving dim to Replicate from the innermost out (each
#     step then sees only Replicate or untouched dims after it, which conflict with nothing by
#     the fixpoint), then to its target from the outermost in (the later moving dims are still
#     Replicate). So count = (moving dims not starting Replicate) + (forced dims), exactly.
# Upper bound for comparison: gathering every non-Replicate mesh dim, then slicing, costs
# (mesh dims of size > 1 not starting Replicate); the rule never exceeds it.

# The kind of collective each 1-D transition uses (none if not listed, or equal placements).
EXPECTED_1D = {
    ("shard", "replicate"): "all_gather",
    ("partial", "replicate"): "all_reduce",
    ("partial", "shard"): "reduce_scatter",
    ("shard", "shard"): "all_to_all",
    ("partial", "partial"): "all_reduce",  # another reduce type: via Replicate
    ("shard", "partial"): "all_gather",  # via Replicate
}


def kind(p) -> str:
    return "shard" if p.is_shard() else "partial" if p.is_partial() else "replicate"


def _commute(a: str, b: str) -> bool:
    """Reducing by a then b equals b then a: the same op, or sum with avg (both linear)."""
    return a == b or {a, b} == {"sum", "avg"}


def _shard_dim(p, ndim):
    return p.dim % ndim if p.is_shard() else None


def _conflicts(src_m, dst_m, held_j, ndim) -> bool:
    """Whether mesh dim m may not step from src_m to dst_m while a later dim holds held_j."""
    dj = _shard_dim(held_j, ndim)
    if dj is not None and dj in (_shard_dim(src_m, ndim), _shard_dim(dst_m, ndim)):
        return True
    return (
        src_m.is_partial()
        and held_j.is_partial()
        and not _commute(src_m.reduce_type, held_j.reduce_type)
    )


def _forced(mesh_shape, src, dst, ndim) -> set[int]:
    """Mesh dims with src == dst != Replicate that must still leave and come back (fixpoint)."""
    live = [m for m, k in enumerate(mesh_shape) if k > 1]
    moving = {m for m in live if src[m] != dst[m]}
    still = [j for j in live if src[j] == dst[j] and not src[j].is_replicate()]
    forced: set[int] = set()
    grew = True
    while grew:
        grew = False
        for j in still:
            if j not in forced and any(
                m < j and _conflicts(src[m], dst[m], src[j], ndim) for m in moving
            ):
                forced.add(j)
                moving.add(j)
                grew = True
    return forced


def reshard_count(mesh_shape, src, dst, ndim: int) -> int:
    """The fewest collectives a reshard from ``src`` to ``dst`` placements needs (see above)."""
    live = [m for m, k in enumerate(mesh_shape) if k > 1]
    direct = sum(1 for m in live if src[m] != dst[m] and not src[m].is_replicate())
    count = direct + len(_forced(mesh_shape, src, dst, ndim))
    assert direct <= count <= sum(1 for m in live if not src[m].is_replicate())
    return count


def reshard_kinds(mesh_shape, src, dst, ndim: int) -> dict[str, int] | None:
    """The exact collectives by kind where no constraint applies (each mesh dim moves directly
    by the 1-D table, in any order), else None (only the count is then pinned down)."""
    live = [m for m, k in enumerate(mesh_shape) if k > 1]
    for m in live:
        if src[m] == dst[m]:
            continue
        for j in live:
            if j > m and any(_conflicts(src[m], dst[m], x, ndim) for x in (src[j], dst[j])):
                return None
    kinds = Counter(
        EXPECTED_1D[kind(src[m]), kind(dst[m])]
        for m in live
        if src[m] != dst[m] and (kind(src[m]), kind(dst[m])) in EXPECTED_1D
    )
    return dict(kinds)
