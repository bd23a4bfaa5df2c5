"""Reshard: move a tensor's local data from one DistSpec to another.

Two parts:

* ``plan`` is pure and cached: (mesh shape, source placements, target placements) -> 1-D
  steps. It is a cheapest-path search over states (one placement per mesh dim), where each
  move changes one mesh dim by one transition of the table below, allowed only where it is
  exact (Note [Nested sharding], Note [Partial order] in spec.py), and costed by the bytes it
  moves. So N-D meshes, nested shards and mixed Partials all get a valid, cheap order.
* ``execute`` runs the steps on this rank's local array with the mesh dim's sub-communicator.

    ==============  ===============  ====================================
    from            to               how
    ==============  ===============  ====================================
    Shard(d)        Replicate        all-gather
    Partial         Replicate        all-reduce
    Partial         Shard(d)         reduce-scatter
    Shard(d)        Shard(e)         all-to-all
    Replicate       Shard(d)         local slice, no communication
    Replicate       Partial          local (sum: zeros off coordinate 0)
    ==============  ===============  ====================================

Anything else goes through Replicate. Mesh dims of size 1 are relabelled for free. A move to
another mesh resolves Partials, then sends each target rank the boxes it needs (send/recv).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from . import backend, comm
from .comm import _ctx as _comm_ctx
from .comm import agree
from .comm.agree import Stack, _doing, fixed_item
from .explain import HOOKS as _explain
from .placement import Partial, Placement, Replicate, Shard, commutes
from .spec import DistSpec, contiguous, split_offset, split_sizes
from .spmd.core import reshard_cost

_R = Replicate()
_ND = np.ndarray


@dataclass(frozen=True)
class Step:
    """One 1-D transition on ``mesh_dim``."""

    mesh_dim: int
    src: Placement
    dst: Placement

    @property
    def kind(self) -> str:
        s, d = self.src, self.dst
        if s.is_shard():
            return "all_gather" if d.is_replicate() else "all_to_all"
        if s.is_partial():
            return "all_reduce" if d.is_replicate() else "reduce_scatter"
        return "slice" if d.is_shard() else "to_partial"

    def __repr__(self) -> str:
        return f"{self.kind}(mesh_dim={self.mesh_dim}: {self.src} -> {self.dst})"


# -- planner ---------------------------------------------------------------------------------
def _valid(mesh_shape: tuple[int, ...], state: tuple[Placement, ...], m: int, q: Placement) -> bool:
    p = state[m]
    if p.is_partial() and not q.is_replicate() and not q.is_shard():
        return False  # Partial(a) -> Partial(b) goes through Replicate
    if p.is_shard() and q.is_partial():
        return False
    # later mesh dims of size 1 split nothing and reduce nothing: they constrain nothing
    later = [x for j, x in enumerate(state[m + 1 :], m + 1) if mesh_shape[j] > 1]
    for pl in (p, q):  # Note [Nested sharding]: only the innermost split of an axis may change
        if isinstance(pl, Shard) and any(isinstance(x, Shard) and x.dim == pl.dim for x in later):
            return False
    if isinstance(p, Partial):  # Note [Partial order]: inner Partials must commute with this one
        if any(
            isinstance(x, Partial) and not commutes(p.reduce_type, x.reduce_type) for x in later
        ):
            return False
    return True


def _cost(
    mesh_shape: tuple[int, ...], state: tuple[Placement, ...], m: int, q: Placement, nbytes: float
) -> float:
    """Wire bytes per rank a step costs, latency included, for a tensor of ``nbytes``.

    The 1-D price table is the rule engine's (spmd.core.reshard_cost: Note [Price of a
    reshard]), so rules and plans agree; a reduce-scatter is priced as what it is.
    """
    f = nbytes / math.prod(n for j, n in enumerate(mesh_shape) if j != m and state[j].is_shard())
    return reshard_cost(state[m], q, mesh_shape[m], f, planner=True)


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded down to a power of two: plans are cached per size class."""
    return 1 << max(int(nbytes).bit_length() - 1, 0)


@lru_cache(maxsize=4096)
def plan(
    mesh_shape: tuple[int, ...],
    src: tuple[Placement, ...],
    dst: tuple[Placement, ...],
    nbytes: int = 1 << 20,
) -> tuple[Step, ...]:
    """The cheapest valid sequence of 1-D steps from ``src`` to ``dst`` placements, for a
    tensor of ``nbytes`` (the latency of a collective weighs more on small tensors).

    >>> plan((2, 2), (Shard(0), Shard(1)), (Replicate(), Shard(1)))
    (all_gather(mesh_dim=0: Shard(dim=0) -> Replicate()),)
    >>> plan((2,), (Partial(),), (Shard(0),))
    (reduce_scatter(mesh_dim=0: Partial(reduce_type='sum') -> Shard(dim=0)),)
    """
    n = len(mesh_shape)
    # On a mesh dim of size 1 every placement holds the same data: relabel it for free.
    start = tuple(d if mesh_shape[m] == 1 else s for m, (s, d) in enumerate(zip(src, dst)))
    options = [
        sorted({src[m], dst[m], _R}, key=repr) if mesh_shape[m] > 1 else [] for m in range(n)
    ]
    tie = itertools.count()
    heap: list = [(0.0, next(tie), start, ())]
    best = {start: 0.0}
    while heap:
        cost, _, state, steps = heapq.heappop(heap)
        if state == dst:
            return steps
        if cost > best[state]:
            continue
        for m in range(n):
            for q in options[m]:
                if q == state[m] or not _valid(mesh_shape, state, m, q):
                    continue
                c = cost + _cost(mesh_shape, state, m, q, nbytes)
                new = state[:m] + (q,) + state[m + 1 :]
                if c < best.get(new, math.inf) - 1e-12:
                    best[new] = c
                    heapq.heappush(heap, (c, next(tie), new, steps + (Step(m, state[m], q),)))
    raise AssertionError(f"no reshard plan from {src} to {dst}")  # all-Replicate always works


# -- executor --------------------------------------------------------------------------------
class Move:
    """A move from one spec to another, worked out once (``move``): its steps with the
    function and the spec each starts from, and whether it gathers (a Shard becomes whole on
    some mesh dim)."""

    __slots__ = ("bound", "cross", "direct", "gathers", "item", "nbytes", "steps")

    def __init__(self, spec: DistSpec, dst: DistSpec) -> None:
        # what the agreement check names (its hash worked out once), and per world the
        # rank's coordinate and the steps' mesh dims with their communicators (``bind``)
        self.item = fixed_item(describe, spec, dst)
        self.bound: dict[int, tuple] = {}
        self.cross = spec.mesh != dst.mesh
        self.gathers = self.cross or any(
            p.is_shard() and q != p and n > 1
            for p, q, n in zip(spec.placements, dst.placements, spec.mesh.shape)
        )
        self.nbytes = math.prod(dst.shape) * dst.dtype.itemsize  # the global size moved
        self.steps = () if self.cross else tuple(
            (_STEPS[step.kind], step, before) for step, before in _path(spec, dst)
        )  # fmt: skip
        # Note [Planned moves]: (the MPI world, the planned collective, the item) once planned;
        # None: not yet tried; False: the move has none
        self.direct: Any = None

    def bind(self, world: Any, spec: DistSpec) -> tuple:
        """(world, coord, per step (function, spec it starts from, step, its _Dim)) on
        ``world``'s rank; kept for the next call (a few worlds per move: simulated worlds
        come and go)."""
        rank = world.rank
        mesh = spec.mesh
        coord = mesh.get_coord(rank)
        runs = () if coord is None else tuple(
            (fn, before, step, _Dim(mesh, step.mesh_dim, rank, coord))
            for fn, step, before in self.steps
        )  # fmt: skip
        if len(self.bound) >= 8:
            self.bound.clear()
        hit = self.bound[id(world)] = (world, coord, runs)
        return hit


@lru_cache(maxsize=4096)
def move(spec: DistSpec, dst: DistSpec) -> Move:
    """The move from ``spec`` to ``dst`` (cached: a repeated reshard plans nothing)."""
    return Move(spec, dst)


def execute(
    local: Any, spec: DistSpec, dst: DistSpec, how: Move | None = None, lin: int | None = None
) -> Any:
    """This rank's local array of ``dst`` given its local array of ``spec`` (collective).
    The result is an array of ``local``'s backend: numpy's, or a device's (its buffers move
    as they are; Note [Array backends] in backend.py). ``how``: ``move(spec, dst)``, where
    the caller has it; ``lin``: the lineage of the tensor moved, for the agreement check
    (Note [Lineage names the tensor] in tensor.py; not across meshes, where a rank outside
    the source mesh may not know it)."""
    if how is None:
        how = move(spec, dst)
    direct = how.direct  # Note [Planned moves]
    if (
        direct
        and agree.CHECK
        and type(local) is _ND
        and direct[0] is (_comm_ctx.world or comm._mpi_world)
        and not (agree.DEBUG or _explain.active)
    ):
        out = direct[1](local, None, direct[2], lin)
        if out is not None:
            return out
    # for the message when ranks diverge, and in the fingerprint (Note [Ranks agree before a
    # collective]); under dt.explain a new item each call, by which it tells one execution
    # from the next. Pushed and popped by hand: ``with`` costs two calls more per move.
    item = (describe, (spec, dst)) if _explain.active else how.item  # doing()'s item
    stack = _doing.stack
    if stack is None:
        stack = _doing.stack = Stack()
    stack.append(item)
    named = stack.lin  # the tensor an enclosing move is for: back when this one ends
    if lin is not None:
        stack.lin = None if how.cross else lin
    try:
        world = _comm_ctx.world or comm._mpi_world or comm.world()  # comm.world(), inline
        if how.cross:
            return _cross_mesh(local, spec, dst, world.rank)
        hit = how.bound.get(id(world))
        if hit is None or hit[0] is not world:
            hit = how.bind(world, spec)
        coord = hit[1]
        if coord is None:  # not in the mesh: nothing to hold, nothing to do
            return _empty(dst, coord, local)
        runs = hit[2]
        if len(runs) == 1:  # most moves: one step
            fn, before, step, dim = runs[0]
            out = fn(local, before, step, coord, dim)
            if direct is None and agree.CHECK and not agree.DEBUG and world is comm._mpi_world:
                how.direct = _planned(how, fn, before, step, dim, local, world)
            return out
        for fn, before, step, dim in runs:
            local = fn(local, before, step, coord, dim)
        return local
    finally:
        stack.pop()
        stack.lin = named


# Note [Planned moves]
# The moves of an iterative program's loop repeat with the same specs: a Partial scalar
# all-reduced for ``rs / d``, a vector gathered for ``A @ p``. The first execution of a
# one-step move on the MPI world whose collective rides in the agreement check's envelope
# (Note [The check rides along] in comm/agree.py: an all-reduce that fits, or the gather of
# a vector whose parts fit) plans that collective on its group (``MPIComm.planned``) and
# keeps it on the move (``Move.direct``, with the world and the move's item). Later
# executions on host arrays, with the check on and not in debug mode, outside dt.explain,
# call it straight from ``execute``: the fingerprint is the one the general path computes
# (the move's item folded after what the stack holds, the tensor's lineage after them), the
# counts and the result are the same, and only the layers between (the stack pushes, the
# step function, the communicator's lookups) are left out. The planned call gives None, and
# the general path runs, for a local array it was not planned for (another dtype, shape or
# layout). On a mismatch it puts the move's item on the stack before every rank describes
# its call, so RanksDiverged names the move as before. With the check off nothing is
# planned (the plan lives on the check's envelope): those moves take the general path.
def _planned(how: Move, fn: Any, spec: DistSpec, step: Step, group: _Dim, local: Any, world):
    """``Move.direct`` for a one-step move that just ran (Note [Planned moves]): (world, the
    planned collective, the move's item); False where the move can have none; None where
    this execution's local array cannot be planned from (on a device, not contiguous, of
    another dtype than the spec's) or the group has no envelope yet: the next one tries."""
    planned = getattr(group.comm, "planned", None)  # MPI's communicators plan
    if planned is None or how.cross:
        return False
    if type(local) is not _ND or local.dtype != spec.dtype or not local.flags.c_contiguous:
        return None
    if fn is _all_reduce:
        call = planned("all_reduce", local, step.src.reduce_type)
    elif fn is _all_gather and len(group.memo[1]) == 1:  # a vector (its memo: _all_gather)
        call = planned("all_gather", local, group.memo[3])
    else:
        return False
    return (world, call, how.item) if call else call  # None: no envelope yet; False: none


def describe(spec: DistSpec, dst: DistSpec) -> str:
    """``reshard [Shard(dim=0)] -> [Replicate()] of (8, 4) float64 on mesh (2,)``."""
    where = f"mesh {spec.mesh.shape}"
    if spec.mesh != dst.mesh:
        where = f"mesh {spec.mesh.process_ids} -> {dst.mesh.process_ids}"
    return (
        f"reshard {list(spec.placements)} -> {list(dst.placements)} of {spec.shape} "
        f"{spec.dtype} on {where}"
    )


@lru_cache(maxsize=4096)
def _path(spec: DistSpec, dst: DistSpec) -> tuple[tuple[Step, DistSpec], ...]:
    """The plan's steps, each with the spec it starts from (cached: repeats rebuild nothing)."""
    out = []
    nbytes = size_class(math.prod(spec.shape) * spec.dtype.itemsize)
    for step in plan(spec.mesh.shape, spec.placements, dst.placements, nbytes):
        out.append((step, spec))
        spec = spec.with_placement(step.mesh_dim, step.dst)
    return tuple(out)


class _Dim:
    """This rank's place along one mesh dim; the communicator is made only when a step needs it."""

    __slots__ = ("size", "rank", "_key", "_comm", "memo")

    def __init__(self, mesh, m: int, rank: int, coord: tuple[int, ...]) -> None:
        self.size, self.rank = mesh.shape[m], coord[m]
        self._key = (mesh, m, rank)
        self._comm: comm.Communicator | None = None
        # what the step's function works out from its spec, step and coordinate, kept for
        # the next call (one _Dim per bound step: Move.bind)
        self.memo: Any = None

    @property
    def comm(self) -> comm.Communicator:
        if self._comm is None:
            self._comm = comm.group(_group_ranks(*self._key))
        return self._comm


@lru_cache(maxsize=4096)
def _group_ranks(mesh, m: int, rank: int) -> tuple[int, ...]:
    return mesh.group_ranks(m, rank)


def _empty(spec: DistSpec, coord, like: Any) -> Any:
    """An uninitialized shard of ``spec`` at ``coord``, of ``like``'s backend."""
    xp = np if type(like) is np.ndarray else backend.xp(like)
    return xp.empty(spec.local_shape(coord), spec.dtype)


def _xp(a: Any) -> Any:
    """The array module of shard ``a`` (numpy without a lookup for the common case)."""
    return np if type(a) is np.ndarray else backend.xp(a)


@lru_cache(maxsize=4096)
def _block(spec: DistSpec, m: int, coord) -> tuple[int, ...]:
    """Shape of the whole the group along mesh dim ``m`` holds pieces of."""
    return spec.with_placement(m, _R).local_shape(coord)


@lru_cache(maxsize=4096)
def _split_counts(shape: tuple[int, ...], axis: int, k: int):
    """Sizes along ``axis`` of ``shape`` split k ways, and each piece's element count."""
    sizes = split_sizes(shape[axis], k)
    return sizes, [math.prod(_resized(shape, axis, s)) for s in sizes]


def _resized(shape: tuple[int, ...], axis: int, n: int) -> tuple[int, ...]:
    return shape[:axis] + (n,) + shape[axis + 1 :]


def _take(a: np.ndarray, axis: int, start: int, n: int) -> np.ndarray:
    return a[(slice(None),) * axis + (slice(start, start + n),)]


def _pack(local: np.ndarray, axis: int, sizes) -> tuple[np.ndarray, list[int]]:
    """``local``'s pieces along ``axis`` laid out one after another (one copy at most)."""
    counts = [local.size // max(local.shape[axis], 1) * s for s in sizes]
    if local.shape[axis] == 0:
        counts = [0] * len(sizes)
    if math.prod(local.shape[:axis]) == 1 and local.flags.c_contiguous:
        return local, counts  # the pieces already follow each other in memory
    buf = _xp(local).empty(sum(counts), local.dtype)
    off = start = 0
    for s, c in zip(sizes, counts):
        buf[off : off + c].reshape(_resized(local.shape, axis, s))[...] = _take(
            local, axis, start, s
        )
        off, start = off + c, start + s
    return buf, counts


def _unpack(flat: np.ndarray, shape: tuple[int, ...], axis: int, sizes, out: np.ndarray) -> None:
    """Inverse of ``_pack``: pieces of ``flat`` (sizes along ``axis``) into ``out``."""
    off = start = 0
    for s in sizes:
        piece = _resized(shape, axis, s)
        c = math.prod(piece)
        _take(out, axis, start, s)[...] = flat[off : off + c].reshape(piece)
        off, start = off + c, start + s


def _contiguous_along(shape: tuple[int, ...], axis: int) -> bool:
    return math.prod(shape[:axis]) == 1


def _all_gather(local, spec, step, coord, group):
    prep = group.memo  # the gathered block's shape and the parts' counts: the same each call
    if prep is None:
        d = step.src.dim
        full = _block(spec, step.mesh_dim, coord)
        sizes, counts = _split_counts(full, d, group.size)
        prep = group.memo = (d, full, sizes, tuple(counts))
    d, full, sizes, counts = prep
    if type(local) is np.ndarray and local.flags.c_contiguous and len(full) == 1:
        out = np.empty(full, spec.dtype)  # the common case: a vector, no lookups
        group.comm.allgather(local, out, counts)
        return out
    local = contiguous(local)
    xp = _xp(local)
    out = xp.empty(full, spec.dtype)
    if _contiguous_along(full, d):
        group.comm.allgather(local, out, counts)
    else:
        flat = xp.empty(sum(counts), spec.dtype)
        group.comm.allgather(local, flat, counts)
        _unpack(flat, full, d, sizes, out)
    return out


def _all_reduce(local, spec, step, coord, group):
    prep = group.memo  # the communicator's all-reduce and the reduction: the same each call
    if prep is None:
        prep = group.memo = (group.comm.allreduce, step.src.reduce_type)
    if type(local) is not np.ndarray or not local.flags.c_contiguous:
        local = contiguous(local)
    return prep[0](local, None, prep[1])  # into a new array


def _reduce_scatter(local, spec, step, coord, group):
    d = step.dst.dim
    sizes = split_sizes(local.shape[d], group.size)
    send, counts = _pack(local, d, sizes)
    out = _xp(local).empty(_resized(local.shape, d, sizes[group.rank]), spec.dtype)
    group.comm.reduce_scatter(send, out, counts, step.src.reduce_type)
    return out


def _all_to_all(local, spec, step, coord, group):
    d, e = step.src.dim, step.dst.dim
    full = _block(spec, step.mesh_dim, coord)
    d_sizes = split_sizes(full[d], group.size)
    e_sizes = split_sizes(full[e], group.size)
    send, send_counts = _pack(local, e, e_sizes)
    mine = e_sizes[group.rank]
    out_shape = _resized(full, e, mine)
    xp = _xp(local)
    out = xp.empty(out_shape, spec.dtype)
    recv_counts = _split_counts(out_shape, d, group.size)[1]
    if len(set(d_sizes)) == len(set(e_sizes)) == 1:  # the group's sizes: the same on all ranks
        send_counts = recv_counts = None  # equal blocks: the fast collective
    if _contiguous_along(out_shape, d):
        group.comm.alltoall(send, send_counts, out, recv_counts)
    else:
        flat = xp.empty(out.size, spec.dtype)
        group.comm.alltoall(send, send_counts, flat, recv_counts)
        _unpack(flat, out_shape, d, d_sizes, out)
    return out


def _slice(local, spec, step, coord, group):
    d = step.dst.dim
    start, n = split_offset(local.shape[d], group.size, group.rank)
    return _take(local, d, start, n).copy()  # a copy: the slice must not pin the whole buffer


def _to_partial(local, spec, step, coord, group):
    if step.dst.reduce_type == "sum" and group.rank != 0:
        return _xp(local).zeros_like(local)  # the value lives on coordinate 0; zeros add nothing
    return local  # avg/max/min of equal values is the value


_STEPS = {
    "all_gather": _all_gather,
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "slice": _slice,
    "to_partial": _to_partial,
}


# -- another mesh, and arbitrary boxes ---------------------------------------------------------
@lru_cache(maxsize=1024)
def _transfers(
    src: DistSpec, wants: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]
) -> tuple[tuple[int, int, tuple[slice, ...]], ...]:
    """(sender, receiver, global box) for every piece ``fetch`` sends: ``wants`` holds
    (receiver, box as (start, length) per axis) pairs.

    Each receiver takes a piece from itself when it holds one, else from the replicas of
    that source box in turn, so replicated sources share the sending.
    """
    holders: dict[tuple, list[int]] = {}
    for r in src.mesh.process_ids:
        holders.setdefault(src.local_box(src.mesh.get_coord(r)), []).append(r)
    out = []
    for i, (r, want) in enumerate(wants):
        if any(n == 0 for _, n in want):
            continue  # an empty box needs no data
        for box, ranks in holders.items():
            inter = tuple((max(a, b), min(a + n, b + m)) for (a, n), (b, m) in zip(box, want))
            if any(lo >= hi for lo, hi in inter):
                continue
            sender = r if r in ranks else ranks[i % len(ranks)]
            out.append((sender, r, tuple(slice(lo, hi) for lo, hi in inter)))
    return tuple(out)


def fetch(
    local: Any, spec: DistSpec, wants: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]
) -> Any:
    """Deliver to each receiver rank of ``wants`` the global box it asks for ((start, length)
    per axis) of the tensor whose local array is ``local``; returns this rank's box (None if
    it asks for none). Partials are reduced first; then only the pieces a receiver does not
    hold are sent, point to point. Collective over the source mesh and the receivers; every
    rank must pass the same ``wants``."""
    return deliver(local, spec, fetch_plan(spec.without_partials(), wants, comm.get_rank()))


@lru_cache(maxsize=1024)
def fetch_plan(src: DistSpec, wants: tuple, rank: int) -> tuple:
    """What ``fetch`` does on ``rank`` for a source of plain spec ``src`` (no Partials):
    (the shape of the box it receives or None, its own pieces as (source index, index in the
    box), its sends as (source index, receiver), its receives as (shape, sender, index in
    the box), and the source index of the whole box where it is one piece of its own and
    nothing moves, else None: the box is then a slice of its shard, no copy needed); sends
    and receives in ``_transfers``' order, which is how each pair of ranks matches its
    messages. Worked out once; callers that repeat a fetch keep it."""
    src_box = src.local_box(src.mesh.get_coord(rank))
    mine = next((box for r, box in wants if r == rank), None)
    copies, sends, recvs = [], [], []
    for sender, receiver, box in _transfers(src, wants):
        if sender == rank:
            piece = tuple(slice(s.start - b, s.stop - b) for s, (b, _) in zip(box, src_box))
            if receiver == rank:
                copies.append((piece, _within(box, mine)))
            else:
                sends.append((piece, receiver))
        elif receiver == rank:
            recvs.append((tuple(s.stop - s.start for s in box), sender, _within(box, mine)))
    shape = None if mine is None else tuple(n for _, n in mine)
    own = None
    if shape is not None and not sends and not recvs and len(copies) == 1:
        piece, into = copies[0]
        if all(s.start == 0 and s.stop == n for s, n in zip(into, shape)):
            own = piece
    return shape, tuple(copies), tuple(sends), tuple(recvs), own


def _within(box: tuple[slice, ...], mine: tuple[tuple[int, int], ...]) -> tuple[slice, ...]:
    """Global ``box`` as an index into the received box that starts at ``mine``."""
    return tuple(slice(s.start - b, s.stop - b) for s, (b, _) in zip(box, mine))


def deliver(local: Any, spec: DistSpec, plan: tuple) -> Any:
    """``fetch`` with its plan (``fetch_plan`` of ``spec`` without Partials, the same
    ``wants`` on every rank, this rank)."""
    plain = spec.without_partials()
    if plain is not spec and comm.get_rank() in spec.mesh:
        local = execute(local, spec, plain)
    shape, copies, sends, recvs, _ = plan
    xp = _xp(local)  # every rank's ``local`` is of one backend, off the mesh too
    out = None if shape is None else xp.empty(shape, spec.dtype)
    for src, dst in copies:
        out[dst] = local[src]
    if not sends and not recvs:
        return out
    w = comm.world()
    if len(sends) <= 1 and len(recvs) <= 1:  # a halo's pair (or half of one): one call
        send = recv = None
        receiver = sender = None
        if sends:
            src, receiver = sends[0]
            send = contiguous(local[src])
        if recvs:
            piece, sender, dst = recvs[0]
            recv = xp.empty(piece, spec.dtype)
        w.sendrecv(send, receiver, recv, sender, tag=7)
        if recv is not None:
            out[dst] = recv
        return out
    pending = [(w.isend(contiguous(local[src]), receiver, tag=7), None, None)
               for src, receiver in sends]  # fmt: skip
    for piece, sender, dst in recvs:
        buf = xp.empty(piece, spec.dtype)
        pending.append((w.irecv(buf, sender, tag=7), buf, dst))
    for work, buf, dst in pending:
        work.wait()
        if buf is not None:
            out[dst] = buf
    return out


@lru_cache(maxsize=1024)
def _wanted(dst: DistSpec) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """Every rank of ``dst``'s mesh with the box its shard holds."""
    return tuple((r, dst.local_box(dst.mesh.get_coord(r))) for r in dst.mesh.process_ids)


def _cross_mesh(local: Any, spec: DistSpec, dst: DistSpec, rank: int) -> Any:
    dst_plain = dst.without_partials()
    dst_coord = dst.mesh.get_coord(rank)
    out = fetch(local, spec, _wanted(dst_plain))
    if dst_coord is None:
        return _empty(dst_plain, dst_coord, local)
    return execute(out, dst_plain, dst) if dst.has_partial() else out
