"""Fused gradient reduction: gradients packed into flat buckets, one all-reduce per bucket.

Note [Gradient buckets]
    A parameter replicated over the data-parallel mesh dims gets a gradient that is
    Partial over them (autograd.py, Note [Partial gradients]): each rank holds its batch
    shard's share, the global value is their reduction. Instead of one all-reduce per
    gradient, the gradients that reduce over the same group, with the same dtype and reduce
    type, are copied into one flat buffer (a *bucket*) and reduced with one collective
    straight from it; afterwards each gradient is a view into the bucket (no copy back).

    * Order. Buckets are filled in the order gradients become final during backward (the
      post-accumulate-grad hook: reverse of their forward use), so the first bucket is
      complete early. The first backward decides the layout (a new bucket when the size cap
      is reached, a smaller cap for the first bucket of each key); later backward passes
      reuse it, and a bucket is complete when all its members are in. A layout is the same
      on every rank: the program, and so the gradients' specs, are.
    * Eligibility. A gradient is bucketed when it is Partial over one or more of the
      data-parallel dims with one reduce type, any other Partial dim having that type too
      (so the reductions commute, Note [Partial order]); everything else (a gradient
      already reduced, a parameter sharded over the data-parallel dims, ZeRO-style) is left
      to the optimizer's own reshard. Tensor-parallel dims are never reduced here.
    * Changes. A gradient whose spec differs from its layout slot (or a new one) is left to
      the optimizer for this step; its slot is zero-filled and the layout is rebuilt at the
      next reduction. A member without a gradient this step is zero-filled and gets none.
    * Scaling. The data-parallel mean is already in the gradient's global value (the loss
      is a mean over the global batch, and its gradient divides by the global batch size):
      nothing is scaled per rank. Gradient merge divides the reduced bucket by the number
      of accumulated micro-steps: one multiply on the flat buffer, after the reduction.
    * Kernels. Packing and unpacking are kernels/bucket.py's ``bucket_pack`` and
      ``bucket_unpack`` (the numpy references on the host, the CUDA programs on a GPU:
      backend.kernels), with the layout's offsets from ``bucket_offsets``; the buffer lives
      where the gradients do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernels.bucket import bucket_offsets

from .. import backend, comm
from ..comm.agree import doing
from ..placement import Replicate
from ..spec import DistSpec

log = logging.getLogger("disttensor")

MiB = 1 << 20


@dataclass
class Member:
    param: Any
    spec: DistSpec  # the gradient's spec it was placed with
    reduced: DistSpec  # the spec after the reduction (data-parallel Partials -> Replicate)
    offset: int
    size: int
    shape: tuple[int, ...]  # local shape


@dataclass
class Bucket:
    key: tuple  # (partial mesh dims, dtype, reduce type)
    group: Any  # the communicator over the key's mesh dims that holds this rank
    on: backend.Backend = backend.NUMPY  # where the gradients, and so the buffer, live
    members: list[Member] = field(default_factory=list)
    size: int = 0  # elements
    buffer: Any = None
    offsets: np.ndarray | None = None  # kernels/bucket.py's layout: member k at [o[k], o[k+1])
    work: Any = None  # the reduction in flight
    # a reduce-scatter bucket's launch in flight, and the gradients (slices) it gave this
    # round: Note [Gradients scattered in backward] in parallel/sharding.py
    scattered: Any = None
    slices: list = field(default_factory=list)
    present: list[bool] = field(default_factory=list)  # per member: packed this round
    filled: int = 0  # members accounted for this round (packed, or known absent)
    launched: bool = False

    @property
    def scatters(self) -> bool:
        """A sharding stage's reduce-scatter bucket (its key ends with "scatter": Note
        [Gradients scattered in backward] in parallel/sharding.py), not an all-reduce one."""
        return len(self.key) > 3

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.key[1]).itemsize

    def add(self, p: Any, spec: DistSpec, reduced: DistSpec, shape: tuple[int, ...]) -> None:
        n = int(np.prod(shape, dtype=np.int64))
        self.members.append(Member(p, spec, reduced, self.size, n, shape))
        self.size += n


def bucket_key(spec: DistSpec, dims: tuple[int, ...]) -> tuple | None:
    """(dims it reduces over, dtype, reduce type) of a gradient spec, or None when the
    gradient is not bucketed (Note [Gradient buckets], Eligibility)."""
    placements = spec.placements
    over = tuple(m for m in dims if placements[m].is_partial())
    if not over:
        return None
    types = {
        placements[m].reduce_type for m in range(len(placements)) if placements[m].is_partial()
    }
    if len(types) != 1:
        return None
    return over, spec.dtype.str, types.pop()


def _label(mesh, b: Bucket) -> str:
    """``DataParallel bucket of 3 gradients, float64, sum over dp``."""
    over = ",".join(mesh.dim_names[m] for m in b.key[0])
    n = len(b.members)
    return (
        f"DataParallel bucket of {n} gradient{'s' * (n != 1)}, {np.dtype(b.key[1]).name}, "
        f"{b.key[2]} over {over}"
    )


def reduced_spec(spec: DistSpec, over: tuple[int, ...]) -> DistSpec:
    pl = list(spec.placements)
    for m in over:
        pl[m] = Replicate()
    return spec.replace(placements=pl)


def group_ranks(mesh, over: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """The ranks that share ``rank``'s coordinate on every mesh dim outside ``over``."""
    coord = mesh.get_coord(rank)
    index = tuple(slice(None) if m in over else c for m, c in enumerate(coord))
    return tuple(int(r) for r in mesh.mesh[index].reshape(-1))


class Reducer:
    """Buckets the Partial gradients of ``params`` over mesh ``dims`` and reduces them
    (Note [Gradient buckets]). ``caps`` are (first bucket, other buckets) in bytes; a cap of
    0 puts every gradient in its own bucket (fusion off)."""

    def __init__(
        self, params: list, mesh, dims: tuple[int, ...], caps: tuple[float, float]
    ) -> None:
        self.params = params
        self.mesh = mesh
        self.dims = tuple(m for m in dims if mesh.shape[m] > 1)  # size 1: nothing to reduce
        self.caps = caps
        self.buckets: list[Bucket] = []  # the layout, in launch order
        self.slots: dict[int, tuple[Bucket, int]] = {}  # id(param) -> (bucket, member index)
        self.building: dict[tuple, Bucket] | None = None  # open buckets while a layout forms
        self.stale = False
        self.announced = False
        # a sharding stage that reduce-scatters the gradients of its split parameters
        # (Note [Gradients scattered in backward] in parallel/sharding.py)
        self.scatter: Any = None

    # -- one round: members arrive (final gradients), buckets launch, finish waits ----------
    def begin(self) -> None:
        """A new round of reductions: no layout yet (or a stale one) means build one."""
        self.wait_all()
        if not self.buckets or self.stale:
            self.buckets, self.slots, self.stale = [], {}, False
            self.building = {}
        for b in self.buckets:
            b.present = [False] * len(b.members)
            b.filled, b.launched = 0, False

    def arrive(self, p: Any, launch: bool) -> None:
        """``p.grad`` is final for this round: place it; launch its bucket when complete
        (``launch``) or leave it for ``flush``."""
        g = p.grad
        if self.building is not None:
            self._place_new(p, g, launch)
            return
        slot = self.slots.get(id(p))
        if slot is None:  # a gradient the layout does not know
            if self._key(p, g) is not None:
                self.stale = True
            return
        b, i = slot
        if b.launched or b.present[i]:
            return  # already reduced this round (a second backward before the step)
        if g._spec != b.members[i].spec:
            self.stale = True  # left to the optimizer; the slot is zero-filled
        else:
            b.present[i] = True
        b.filled += 1
        if launch and b.filled == len(b.members):
            self._launch(b, blocking=False)

    def _key(self, p: Any, g: Any) -> tuple | None:
        """The bucket key of ``p``'s gradient ``g``: a reduce-scatter bucket's for the split
        parameters of a sharding stage, else ``bucket_key``'s."""
        if self.scatter is not None and self.scatter.holds(p):
            return self.scatter.key(p, g)
        return bucket_key(g._spec, self.dims)

    def _place_new(self, p: Any, g: Any, launch: bool) -> None:
        key = self._key(p, g)
        if key is None or id(p) in self.slots:
            return
        b = self.building.get(key)
        itemsize = g._spec.dtype.itemsize
        if b is not None and b.members:  # each bucket holds up to its cap (one gradient more
            first = not any(x.key == key for x in self.buckets)  # only when that one is larger)
            if b.nbytes + g._local.size * itemsize > self.caps[0 if first else 1]:
                self._close(b)
                if launch:
                    self._launch(b, blocking=False)
                b = None
        if b is None:
            group = comm.group(group_ranks(self.mesh, key[0], comm.get_rank()))
            b = self.building[key] = Bucket(key, group, backend.of(g._local))
        reduced = reduced_spec(g._spec, key[0]) if len(key) == 3 else self.scatter.reduced(p, g)
        b.add(p, g._spec, reduced, g._local.shape)
        b.present.append(True)
        b.filled += 1
        self.slots[id(p)] = (b, len(b.members) - 1)

    def _close(self, b: Bucket) -> None:
        del self.building[b.key]
        if not b.scatters:  # a reduce-scatter bucket packs into the stage's buffers at launch
            b.buffer = b.on.xp.empty(b.size, np.dtype(b.key[1]))
            b.offsets = bucket_offsets([m.shape for m in b.members])  # host arithmetic
        self.buckets.append(b)

    def end_of_backward(self, launch: bool) -> None:
        """The backward pass has ended: close the buckets still forming, launch the rest."""
        if self.building is not None:
            for b in list(self.building.values()):
                self._close(b)
            self.building = None
            self._announce()
        if launch:
            for b in self.buckets:
                if not b.launched:
                    self._launch(b, blocking=False)
            for b in self.buckets:  # reduce-scatters: no whole gradient stays after backward
                if b.scattered is not None:
                    self._finish_scatter(b)

    def poke(self) -> None:
        """Let MPI progress the reductions in flight: one test call runs the progress engine
        for all of them, so only the oldest is tested."""
        for b in self.buckets:
            work = b.work if b.scattered is None else b.scattered.work
            if work is not None:
                work.test()
                return

    def flush(self, order: list) -> None:
        """Reduce now, blocking, every bucket not yet launched, after ``begin`` (this round's
        arrivals, if any, are placed). Members that did not arrive are taken from their
        current ``.grad``; ``order`` places the parameters when no layout exists yet."""
        if self.building is not None:
            for p in order:
                if p.grad is not None:
                    self._place_new(p, p.grad, launch=False)
            self.end_of_backward(launch=False)
        else:
            for b in self.buckets:
                if b.launched:
                    continue
                for i, m in enumerate(b.members):
                    if not b.present[i]:
                        g = m.param.grad
                        b.present[i] = g is not None and g._spec == m.spec
        for b in self.buckets:
            if not b.launched:
                self._launch(b, blocking=True)

    def _launch(self, b: Bucket, blocking: bool) -> None:
        if b.scatters:  # Note [Gradients scattered in backward]
            self._launch_scatter(b, blocking)
            return
        buf = b.buffer
        grads = [m.param.grad._local if here else None for m, here in zip(b.members, b.present)]
        backend.kernels(b.on, "bucket")["bucket_pack"](grads, buf, b.offsets)  # absent: zeros
        b.launched = True
        with doing(_label, self.mesh, b):  # names the reduction (diverged ranks, dt.explain)
            if blocking:
                b.group.allreduce(buf, buf, b.key[2])
            else:
                b.work = b.group.iallreduce(buf, buf, b.key[2])

    def _launch_scatter(self, b: Bucket, blocking: bool) -> None:
        """Start a reduce-scatter bucket (Note [Gradients scattered in backward]): the
        buckets launched before it are finished first, so at most two are in flight and
        each one's whole gradients go as soon as it is done."""
        for older in self.buckets:
            if older is not b and older.scattered is not None:
                self._finish_scatter(older)
        b.launched = True
        grads = [m.param.grad._local if here else None for m, here in zip(b.members, b.present)]
        b.scattered = self.scatter.launch([m.param for m in b.members], grads, blocking)

    def _finish_scatter(self, b: Bucket) -> None:
        """Wait for a reduce-scatter bucket; its present members' gradients become their
        slices (scaled by ``finish``)."""
        b.slices = self.scatter.finish(b.scattered, b.present)
        b.scattered = None

    def finish(self, scale: float) -> set[int]:
        """Wait for every launched bucket, multiply by ``scale`` (gradient merge's mean),
        and make each present member's gradient a view into its bucket; returns the ids of
        those parameters."""
        from ..tensor import DistTensor

        done = set()
        for b in self.buckets:
            if not b.launched:
                continue
            if b.scatters:  # its slices (finished, or now)
                if b.scattered is not None:
                    self._finish_scatter(b)
                for m, g in zip((m for m, here in zip(b.members, b.present) if here), b.slices):
                    if m.param.grad is g:  # not accumulated into since: scaled here, once
                        if scale != 1.0:
                            g._local *= scale
                        done.add(id(m.param))
                b.slices, b.launched = [], False
                continue
            if b.work is not None:
                b.work.wait()
                b.work = None
            # views into the buffer, scaled in place
            views = backend.kernels(b.on, "bucket")["bucket_unpack"](
                b.buffer, b.offsets, [m.shape for m in b.members], scale
            )
            for m, here, view in zip(b.members, b.present, views):
                if here:
                    m.param.grad = DistTensor(view, m.reduced)
                    done.add(id(m.param))
            b.launched = False
        return done

    def wait_all(self) -> None:
        """Wait for reductions in flight without using them (buffers about to be reused)."""
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()
                b.work = None
            if b.scattered is not None:
                self.scatter.drop(b.scattered)
                b.scattered = None
            b.launched = False

    def _announce(self) -> None:
        if self.announced or not self.buckets:
            return
        self.announced = True
        n = sum(len(b.members) for b in self.buckets)
        names = self.mesh.dim_names
        over = sorted({tuple(names[m] for m in b.key[0]) for b in self.buckets})
        sizes = ", ".join(f"{b.nbytes / MiB:.1f} MiB" for b in self.buckets)
        log.info(
            "disttensor: %d gradient all-reduces fused into %d bucket%s (%s) over %s",
            n,
            len(self.buckets),
            "" if len(self.buckets) == 1 else "s",
            sizes,
            " and ".join("x".join(o) for o in over),
        )

    def summary(self) -> dict[str, Any]:
        """The layout: gradients, buckets, and each bucket's bytes and member count."""
        return {
            "gradients": sum(len(b.members) for b in self.buckets),
            "buckets": [
                {
                    "bytes": b.nbytes,
                    "gradients": len(b.members),
                    "dtype": b.key[1],
                    "dims": [self.mesh.dim_names[m] for m in b.key[0]],
                    "reduce": b.key[2],
                    # a sharding stage's bucket (Note [Gradients scattered in backward] in
                    # parallel/sharding.py) keeps no buffer of its own between steps
                    "collective": "reduce_scatter" if b.scatters else "all_reduce",
                }
                for b in self.buckets
            ],
        }


# -- the optimizer's reduction of the gradients nothing reduced during backward ---------------
def reduce_remaining(params: list, keep: tuple[int, ...] = ()) -> tuple[int, int]:
    """Note [Gradients reduced at the step]: reduce, in one all-reduce per group, the
    gradients of ``params`` that are Partial where their parameter is Replicate; each becomes
    a view into its group's buffer, Replicate over those dims. Returns (gradients reduced so,
    all-reduces made); the rest are left to the optimizer's reshard. Mesh dims in ``keep``
    stay Partial (a sharding stage reduce-scatters over them afterwards).

    Note [Gradients reduced at the step]
        After backward, a gradient may still be Partial where its parameter is replicated:
        over the data-parallel dims without dt.DataParallel, or over tensor-parallel dims
        (a layer norm weight or a bias used on both sides of a row-parallel matmul). The
        optimizer would reshard each one (one all-reduce per gradient: 52 per step in the
        GPT demo on a 2x2 mesh). Instead the gradients that reduce over the same mesh dims
        with the same dtype, reduce type and backend are packed (kernels/bucket.py) into
        one flat buffer, reduced with one all-reduce over that group, and unpacked as
        views: a collective per group, not per gradient (a group of one is left to the
        reshard: the same single all-reduce). The values are those of the per-gradient
        all-reduces (the reduction is elementwise, each element summed over the same ranks;
        MPI may choose another algorithm for the larger message, so a sum over three or more
        ranks may round differently, as any all-reduce's may). A gradient is taken when
        every Partial dim of it is Replicate in the parameter, with one reduce type: a
        Partial dim the parameter shards is left to the reshard (a reduce-scatter moves
        less than an all-reduce), and a gradient that must also move between Shard layouts
        is reduced here and moved by the reshard after, as dt.DataParallel's buckets do.
        Every rank of the mesh takes the same groups in the same order (the specs come from
        the program), and Optimizer.step has agreed beforehand on which parameters have
        gradients.
    """
    from ..tensor import DistTensor

    groups: dict[tuple, list] = {}
    for p in params:
        g = p.grad
        if g is None:
            continue
        gs, ps = g._spec, p._spec
        if gs == ps or gs.mesh != ps.mesh or gs.shape != ps.shape:
            continue
        dims = tuple(m for m in range(len(gs.placements)) if m not in keep)
        # every Partial dim not kept; one reduce type over all of them, kept ones included
        key = bucket_key(gs, dims)
        if key is None or not all(ps.placements[m].is_replicate() for m in key[0]):
            continue
        groups.setdefault((gs.mesh, *key, backend.of(g._local)), []).append(p)
    rank = comm.get_rank()
    done = made = 0
    for (mesh, over, dtype, op, be), members in groups.items():
        if len(members) < 2 or mesh.get_coord(rank) is None:
            continue  # one gradient: the reshard is the same single all-reduce
        shapes = [p.grad._local.shape for p in members]
        offsets = bucket_offsets(shapes)
        buf = be.xp.empty(int(offsets[-1]), np.dtype(dtype))
        kernels = backend.kernels(be, "bucket")
        kernels["bucket_pack"]([p.grad._local for p in members], buf, offsets)
        group = comm.group(group_ranks(mesh, over, rank))
        with doing(_step_label, mesh, over, len(members), dtype, op):
            group.allreduce(buf, buf, op)
        views = kernels["bucket_unpack"](buf, offsets, shapes, 1.0)
        for p, view in zip(members, views):
            p.grad = DistTensor(view, reduced_spec(p.grad._spec, over))
        done += len(members)
        made += 1
    return done, made


def _step_label(mesh, over: tuple[int, ...], n: int, dtype: str, op: str) -> str:
    """``optimizer step: 12 gradients reduced together, float64, sum over dp``."""
    names = ",".join(mesh.dim_names[m] for m in over)
    return (
        f"optimizer step: {n} gradients reduced together, {np.dtype(dtype).name}, {op} over {names}"
    )
