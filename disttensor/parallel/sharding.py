"""Sharded data parallelism: ``dt.shard_optimizer(opt, dt.ShardingStage1/2/3(dim))``.

Note [Sharding stages]
    Plain data parallelism keeps every parameter, gradient and optimizer state whole on each
    data-parallel rank. A sharding stage splits them over the data-parallel mesh dim ``dim``
    (Paddle's ShardingStage1/2/3, ZeRO 1/2/3, PyTorch's FSDP):

    * Each parameter gets a *slice*: one tensor dim ``d`` split over ``dim`` as
      numpy.array_split splits it (uneven and empty slices allowed). ``d`` is the first
      tensor dim that no mesh dim after ``dim`` shards, so a rank's slice lies inside its
      own shard of the parameter (Note [Nested sharding] in spec.py: mesh dims split in
      order, the later inside the earlier) and slicing needs no communication; a parameter
      with no such dim (a 0-d one, or a vector that a later mesh dim already splits) keeps
      its state whole, and ``memory_report`` counts it. The slice spec is the parameter's
      spec with ``Shard(d)`` on ``dim``: the optimizer state is that DistTensor, so
      ``state_dict()`` holds 1/N of it per rank and ``dt.save`` writes it without gathers.
    * Stage 1: gradients are reduced whole as without sharding (``dt.DataParallel``'s
      buckets, or the step's all-reduces), each rank updates its slice of every parameter
      with its slice of the state, and the updated slices are all-gathered back into the
      whole parameters: one all-gather per bucket of parameters (same group and dtype, up to
      ``bucket_size_mb``), not one per parameter.
    * Stage 2: gradients Partial over ``dim`` are reduce-scattered straight into the
      slices, one reduce-scatter per bucket, and ``p.grad`` becomes the slice (the reduced
      gradient's value, placed ``Shard(d)`` over ``dim``): no rank keeps a whole reduced
      gradient. They are reduce-scattered during backward (Note [Gradients scattered in
      backward]): in a ``dt.DataParallel``'s buckets, with its gradient merge
      (``k_steps``), or, without one, in buckets of this optimizer's own.
    * Stage 3: the parameters themselves live as their slices between steps (``p`` *is*
      the ``Shard(d)`` DistTensor). Calling a module first gathers parameters (Note
      [Parameters gathered per module] in nn/module.py). With ``reshard_after_forward``
      (the default), those of the module's *group*: every split parameter of the module and
      its sub-modules when their whole size fits in a bucket, else the module's own (its
      sub-modules then form groups of their own), in one all-gather per bucket; modules
      called inside a running group gather nothing. After the group's forward they are
      slices again (each slice was kept while its parameter was whole); a hook on the
      group's outputs gathers them once more when backward reaches it, and each goes back
      to its slice when its own gradient is final. From the second forward on, the next
      group's all-gathers are started ahead, non-blocking, while the current group runs
      (Note [Groups gathered ahead]). Without it, the outermost module's call gathers the
      model, whole until the step. Either way backward's gradients come back
      Partial over ``dim`` for the reduce-scatter of stage 2, and the step updates the
      slices (their memory kept from step to step). An op that gets a parameter while it is
      a slice (used outside any module call, or by a gradient function that runs before
      the hook) computes the same value: dt's ops move it as their rules need, once per step
      (Note [One move per tensor]).

    The values are those of the unsharded optimizer: every update is elementwise, so
    updating slices computes the same numbers; the reduce-scatter sums the same elements
    over the same ranks as the all-reduce (MPI may order a sum over three or more ranks
    differently, as any all-reduce may).
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
import tracemalloc
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import autograd, backend, comm
from ..comm.agree import doing
from ..comm.base import displacements
from ..mesh import ProcessMesh, names_differ
from ..nn.module import set_forward_gather
from ..placement import Partial, Shard
from ..spec import DistSpec
from ..tensor import DistTensor, reshard
from .buckets import MiB, Reducer, group_ranks, reduce_remaining


class _Stage:
    """A sharding stage: which mesh dim (name or index) the model state is split over, the
    mesh (default: the parameters'), and the size of the fused collectives' buckets."""

    stage = 0

    def __init__(
        self, dim: str | int, mesh: ProcessMesh | None = None, bucket_size_mb: float = 25.0
    ) -> None:
        if mesh is not None and not isinstance(mesh, ProcessMesh):
            raise TypeError(
                f"{type(self).__name__}: mesh must be a dt.ProcessMesh or None, got "
                f"{type(mesh).__name__}"
            )
        if not isinstance(dim, (str, numbers.Integral)) or isinstance(dim, bool):
            raise TypeError(
                f"{type(self).__name__}: dim names one mesh dim (a name or an index), got {dim!r}"
            )
        if isinstance(bucket_size_mb, bool) or not (
            isinstance(bucket_size_mb, numbers.Real) and bucket_size_mb > 0
        ):
            raise ValueError(
                f"{type(self).__name__}: bucket_size_mb must be a positive number of MiB, "
                f"got {bucket_size_mb!r}"
            )
        self.dim, self.mesh, self.bucket_size_mb = dim, mesh, float(bucket_size_mb)

    def __repr__(self) -> str:
        mesh = f", mesh={self.mesh!r}" if self.mesh is not None else ""
        return f"{type(self).__name__}({self.dim!r}{mesh})"


class ShardingStage1(_Stage):
    """Optimizer state split over ``dim`` (Note [Sharding stages])."""

    stage = 1


class ShardingStage2(_Stage):
    """Optimizer state and gradients split over ``dim`` (Note [Sharding stages])."""

    stage = 2


class ShardingStage3(_Stage):
    """Optimizer state, gradients and parameters split over ``dim`` (Note [Sharding stages]).
    ``reshard_after_forward`` (default True): a module's call gathers its group (its and its
    sub-modules' parameters when their whole size fits in a bucket, else its own), hands it
    back after the forward and gathers it again for its backward, so a rank holds whole only
    the groups running now; False: the outermost module call gathers the whole model, which
    stays whole until the step (fewer all-gathers, a higher peak)."""

    stage = 3

    def __init__(
        self,
        dim: str | int,
        mesh: ProcessMesh | None = None,
        bucket_size_mb: float = 25.0,
        reshard_after_forward: bool = True,
    ) -> None:
        super().__init__(dim, mesh, bucket_size_mb)
        if not isinstance(reshard_after_forward, bool):
            raise TypeError(
                "ShardingStage3: reshard_after_forward is True or False, got "
                f"{reshard_after_forward!r}"
            )
        self.reshard_after_forward = reshard_after_forward


@dataclass
class _Slice:
    """One parameter's slice over the sharding dim on this rank."""

    param: DistTensor
    whole: DistSpec  # the parameter replicated over the dim (stages 1, 2: its own spec)
    part: DistSpec  # Shard(d) over the dim: the state's spec (stage 3: the parameter's)
    d: int | None  # the tensor dim split; None: not split (state whole)
    group: Any  # the communicator along the dim through this rank (None: outside the mesh)
    bounds: tuple[tuple[int, int], ...]  # per rank of the group: (start, length) along d
    # within this rank's whole local array
    me: int  # this rank's index in the group
    shape: tuple[int, ...] = ()  # this rank's whole local shape
    sizes: tuple[int, ...] = ()  # per rank of the group: elements of its slice
    index: tuple = ()  # per rank of the group: the index of its slice in a whole local array

    def __post_init__(self) -> None:
        if self.d is None or self.group is None:
            return
        self.shape = self.whole.local_shape(self.whole.mesh.get_coord(comm.get_rank()))
        d = self.d
        pre, post = math.prod(self.shape[:d]), math.prod(self.shape[d + 1 :])
        self.sizes = tuple(pre * n * post for _, n in self.bounds)
        self.index = tuple(
            (slice(None),) * d + (slice(s, s + n),) for s, n in self.bounds
        )  # fmt: skip

    def take(self, local: Any, r: int) -> Any:
        """Rank ``r``'s slice of a whole local array (a view)."""
        return local[self.index[r]]


class _Layout:
    """A bucket's layout, worked out at its first use and kept (``ShardedOptimizer._layout``):
    per rank the size of its block in the flat buffer (every rank's blocks: the
    reduce-scatter's input, the all-gather's output; one scratch buffer per dtype serves
    every bucket, ``ShardedOptimizer._scratch``), per member and rank the offset of that
    rank's slice, and ``grads``: the reduce-scatter's output, this rank's block, which the
    gradient slices are views of until the next step (kept: reallocating memory of this size
    every step costs more than the step's copies)."""

    def __init__(self, members: list[_Slice]) -> None:
        n = len(members[0].bounds)
        self.counts = [sum(s.sizes[r] for s in members) for r in range(n)]
        at = displacements(self.counts)
        self.offsets = []
        for s in members:
            self.offsets.append(tuple(at))
            at = [a + c for a, c in zip(at, s.sizes)]
        me = members[0].me
        self.base = sum(self.counts[:me])  # where this rank's block starts in the flat buffer
        self.size = sum(self.counts)
        self.grads: Any = None


def _slice_dim(spec: DistSpec, m: int) -> int | None:
    """The first tensor dim that no mesh dim after ``m`` shards (Note [Sharding stages])."""
    later = {p.dim for p in spec.placements[m + 1 :] if isinstance(p, Shard)}
    return next((d for d in range(len(spec.shape)) if d not in later), None)


class ShardedOptimizer:
    """A dt optimizer whose model state is split over a data-parallel mesh dim
    (``dt.shard_optimizer``; Note [Sharding stages]). The training loop is unchanged:
    ``loss.backward(); opt.step(); opt.zero_grad()``; ``opt.optimizer`` is the wrapped
    optimizer, which keeps the state (as slices)."""

    def __init__(self, optimizer: Any, stage: _Stage) -> None:
        from ..optim.optimizer import Optimizer

        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"shard_optimizer wraps a dt.optim optimizer, got {type(optimizer).__name__}"
            )
        if not isinstance(stage, _Stage):
            raise TypeError(
                "shard_optimizer: the second argument is dt.ShardingStage1, 2 or 3 (dim), got "
                f"{type(stage).__name__}"
            )
        if getattr(optimizer, "_sharded", False):
            raise ValueError("shard_optimizer: this optimizer is already sharded")
        if optimizer.state:
            raise ValueError(
                "shard_optimizer: this optimizer has already stepped (it holds whole state); "
                "wrap it before the first step"
            )
        params = optimizer.params
        mesh = stage.mesh if stage.mesh is not None else params[0].mesh
        m = mesh.dim_index(stage.dim)  # raises naming the mesh's dims
        for p in params:  # everything is checked before anything changes
            if p.mesh != mesh:
                clause = names_differ(p.mesh, mesh)
                raise ValueError(
                    f"shard_optimizer: a parameter of shape {p.shape} lives on {p.mesh}, "
                    f"not on the sharding mesh {mesh}{'; ' + clause if clause else ''}; give "
                    f"ShardingStage{stage.stage}(dim, mesh=...) the parameters' mesh, or shard "
                    "each mesh's parameters with an optimizer of its own"
                )
        self.optimizer, self.stage, self.mesh, self.dim = optimizer, stage.stage, mesh, m
        self._cap = stage.bucket_size_mb * MiB
        rank = comm.get_rank()
        coord = mesh.get_coord(rank)
        group = comm.group(group_ranks(mesh, (m,), rank)) if coord is not None else None
        self.slices: dict[int, _Slice] = {}
        self._layouts: dict[tuple, _Layout] = {}  # buckets' layouts, kept
        self._buffers: dict[tuple, Any] = {}  # the collectives' scratch buffers, kept
        self._kept: dict[int, Any] = {}  # stage 3: per slice, the memory it lives in
        self._ends: dict[tuple, tuple] = {}  # per bucket, its state (and slices) end to end
        # Note [Slices updated end to end]: the optimizer's update is its elementwise apply
        self._end_to_end = type(optimizer).update is Optimizer.update
        # stage 3: gather per module and hand back after use (ShardingStage3's
        # reshard_after_forward); each whole parameter's slice, kept while it is whole
        self._per_module = bool(getattr(stage, "reshard_after_forward", False))
        self._slice_of: dict[int, Any] = {}
        self._removers: list = []
        self._gathers: dict[int, int] = {}  # id(parameter) -> its whole bytes on this rank
        self._running: dict[int, Any] = {}  # the parameters of the groups in forward now
        # Note [Groups gathered ahead]: the order the forward gathered its groups in, the
        # group gathered last in this forward, and the all-gathers started ahead
        self._next: dict[tuple, tuple] = {}  # group key -> the group gathered after it
        self._prev: dict[tuple, tuple] = {}  # group key -> the group gathered before it
        self._groups: dict[tuple, list] = {}  # group key -> its parameters
        self._last: tuple | None = None
        self._ahead: dict[tuple, list] = {}  # group key -> its all-gathers in flight
        self._taken = 0  # groups made whole by all-gathers started ahead (a statistic)
        names = optimizer.state_names
        with autograd.no_grad():
            for p in params:
                s = self._slice(p, m, group, coord)
                if s is None:
                    continue
                self.slices[id(p)] = s
                if names:  # the state exists from the start: a state_dict() to load into
                    xp = backend.xp(p.to_local())
                    shape = s.part.local_shape(coord)
                    optimizer.state[id(p)] = {
                        n: DistTensor(xp.zeros(shape, p.dtype), s.part) for n in names
                    }
                if self.stage == 3 and s.d is not None:
                    self._to_slice(s, None)
                    set_forward_gather(p, self._forward_gather)
                    self._gathers[id(p)] = math.prod(s.shape) * p.dtype.itemsize
                    if self._per_module:  # handed back once its gradient is final
                        from .data_parallel import _weak

                        self._removers.append(
                            p.register_post_accumulate_grad_hook(_weak(self._after_backward))
                        )
        # the parameters split over the dim, and those with no dim to split
        self._split = [s.param for s in self.slices.values() if s.d is not None]
        self._whole = [s.param for s in self.slices.values() if s.d is None]
        optimizer._state_specs = {i: s.part for i, s in self.slices.items()}
        optimizer._sharded = True
        # reduce-scatter send buffers: whether the scratch one is in flight, and the extra
        # ones kept for a second in flight (_flat)
        self._lent = False
        self._flats: list = []
        self._scatter = _Scatter(self)
        # stages 2 and 3 without a DataParallel: reduce-scatter buckets of this optimizer's
        # own, started during backward all the same (Note [Gradients scattered in backward])
        self._own: Reducer | None = None
        self._backward = None  # the backward pass now running (autograd's callback list)
        if self.stage >= 2 and self._split and coord is not None:
            from .data_parallel import _weak

            self._own = Reducer(self._split, mesh, (m,), (self._cap, self._cap))
            self._own.scatter = self._scatter
            for p in self._split:
                self._removers.append(p.register_post_accumulate_grad_hook(_weak(self._on_grad)))
        self._release()

    def _on_grad(self, p: DistTensor) -> None:
        """Stages 2 and 3: ``p``'s gradient is final in this backward; with no DataParallel
        to reduce it (whose buckets would: ``_release``), this optimizer's own buckets take
        it."""
        if autograd._finishers.get(p) is not None:
            return
        running = autograd._state.callbacks
        if running is not self._backward:  # the first gradient of a new backward pass
            self._backward = running
            self._own.begin()
            autograd.queue_callback(self._end_of_backward)
        self._own.arrive(p, launch=True)
        self._own.poke()

    def _end_of_backward(self) -> None:
        self._backward = None
        self._own.end_of_backward(launch=True)

    def _slice(self, p: DistTensor, m: int, group: Any, coord: Any) -> _Slice | None:
        """``p``'s slice, or None when ``p`` is already split over the dim (its state is then
        as split as it: the plain optimizer path)."""
        pl = p.placements[m]
        if isinstance(pl, Shard):
            return None
        whole = p.spec
        d = _slice_dim(whole, m)
        if d is None:
            return _Slice(p, whole, whole, None, group, ((0, 0),), 0)
        part = whole.with_placement(m, Shard(d))
        n = self.mesh.shape[m]
        if coord is None:
            return _Slice(p, whole, part, d, None, ((0, 0),) * n, 0)
        start = whole.local_box(coord)[d][0]
        bounds = []
        for r in range(n):
            c = list(coord)
            c[m] = r
            s, length = part.local_box(tuple(c))[d]
            bounds.append((s - start, length))
        return _Slice(p, whole, part, d, group, tuple(bounds), coord[m])

    def _release(self) -> None:
        """Stages 2 and 3 reduce-scatter the gradients: a dt.DataParallel that would
        all-reduce them in its buckets reduce-scatters them instead, during backward, with
        this optimizer's slices (Note [Gradients scattered in backward]); it keeps gradient
        merge."""
        if self.stage < 2:
            return
        for owner in _wrappers(self._split):
            owner._release(self._split, self._scatter)

    # -- the optimizer's interface -----------------------------------------------------------
    @property
    def params(self) -> list[DistTensor]:
        return self.optimizer.params

    @property
    def state(self) -> dict:
        return self.optimizer.state

    @property
    def step_count(self) -> int:
        return self.optimizer.step_count

    @property
    def lr(self) -> float:
        return self.optimizer.lr

    def set_lr(self, lr: Any) -> None:
        self.optimizer.set_lr(lr)

    @property
    def reductions(self) -> dict:
        return self.optimizer.reductions

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's: state tensors are slices, Shard over the dim."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The wrapped optimizer's; each state tensor is moved to its slice's layout."""
        self.optimizer.load_state_dict(state)

    def step(self) -> None:
        """One update (Note [Sharding stages]). Collective over the mesh."""
        opt = self.optimizer
        self._release()  # a DataParallel made after shard_optimizer
        self._running.clear()  # a forward that raised left its group marked
        self._drain()  # gathers started ahead read the slices the step changes
        lr = opt._begin_step()
        with autograd.no_grad():
            if self.stage == 1:  # the gradients reduced whole, as unsharded
                n, k = reduce_remaining(opt.params)
                opt.reductions = {"gradients": n, "all_reduces": k}
            if self._own is not None:  # what this optimizer reduce-scattered in backward
                self._own.finish(1.0)
            grads = self._grad_slices()
            updated, laid = [], []
            # Note [Slices updated end to end]: an optimizer whose update is its apply
            flat = self._end_to_end
            for p in opt.params:
                if p.grad is None:
                    continue
                s = self.slices.get(id(p))
                if s is None:  # split over the dim already: the plain update
                    opt.update(p, p.to_local(), opt.grad_of(p), lr)
                    autograd.note_mutation(p.to_local())
                    continue
                if s.group is None:  # outside the mesh: nothing held
                    continue
                if s.d is None:  # not split: the whole update on every rank
                    w = p.to_local()
                    opt.update(p, w, _as(grads[id(p)], w.dtype), lr)
                    autograd.note_mutation(w)
                    continue
                if self.stage == 3 and not flat:  # updated as the slice, which it becomes
                    # made whole by a forward: its slice, in memory of its own
                    local = p.to_local()
                    w = local if p._spec == s.part else self._own_slice(s, local)
                    opt.update(p, w, _as(grads[id(p)], w.dtype), lr)
                    self._to_slice(s, w)
                    autograd.note_mutation(w)
                    continue
                if flat:  # Note [Slices updated end to end]
                    laid.append((s, p.to_local()))
                    continue
                view = s.take(p.to_local(), s.me)  # contiguous (d = 0): updated in place
                w = view if view.flags.c_contiguous else view.copy()
                opt.update(p, w, _as(grads[id(p)], w.dtype), lr)
                updated.append((s, w))
            for bucket in self._buckets(laid):
                self._update_end_to_end(bucket, grads, lr)
            self._gather(updated)

    # Note [Slices updated end to end]
    #     Every stage updates a bucket's slices in one call of the optimizer's ``apply``
    #     (every dt optimizer's update is elementwise) on this rank's slices laid end to
    #     end: for stages 1 and 2 the block the all-gather then sends as it is (every rank's
    #     slice, its own included, is copied into the whole parameters); for stage 3 one
    #     array per bucket, whose views the parameters are between steps. The gradient
    #     slices are laid out the same way beside them, and each state tensor's local array
    #     is a view of one array per state name and bucket (``_ends``; a state tensor or a
    #     parameter holding another array, after load_state_dict or a forward that left it
    #     whole, is copied in and then made the view). One call per bucket instead of one
    #     per parameter: Adam's fixed cost is about 16 us a call here, so a 100-parameter
    #     model's update took longer than its arithmetic. An optimizer whose ``update`` is
    #     its own (not elementwise) keeps the update per parameter.
    def _update_end_to_end(self, bucket: list[tuple[_Slice, Any]], grads: dict, lr: float):
        """One bucket's update (Note [Slices updated end to end]); stages 1 and 2 then
        all-gather it, stage 3's parameters are the updated slices."""
        opt = self.optimizer
        lay = self._layout(bucket)
        first, me = bucket[0][1], bucket[0][0].me
        n = lay.counts[me]
        three = self.stage == 3
        flat = self._gathered(lay, first)
        g = flat[:n]  # the gradients, until the all-gather writes there
        names = opt.state_names
        key = tuple(id(sl) for sl, _ in bucket)
        ends = self._ends.get(key)  # (per state name its array, per member its views)
        if ends is None:
            xp = backend.xp(first)
            arrays = {name: xp.zeros(n, first.dtype) for name in names}
            if three:  # the slices the parameters are between steps
                arrays[_PARAMS] = xp.empty(n, first.dtype)
            ends = (arrays, [{} for _ in bucket])
            if len(self._ends) >= 64:  # buckets that change from step to step
                self._ends.clear()
            self._ends[key] = ends
        arrays, views = ends
        w = arrays[_PARAMS] if three else self._scratch("mine", n, first)
        for (sl, local), offs, held in zip(bucket, lay.offsets, views):
            at = offs[me] - lay.base
            if three:
                if local is not held.get(_PARAMS):  # a slice of its own, or whole: taken in
                    mine = local if sl.param._spec == sl.part else sl.take(local, me)
                    view = w[at : at + sl.sizes[me]].reshape(mine.shape)
                    view[...] = mine
                    self._to_slice(sl, view)
                    held[_PARAMS] = view
                mine = held[_PARAMS]
            else:
                mine = sl.take(local, me)
                w[at : at + sl.sizes[me]].reshape(mine.shape)[...] = mine
            g[at : at + sl.sizes[me]].reshape(mine.shape)[...] = grads[id(sl.param)]
            if not names:
                continue
            state = opt.state.get(id(sl.param))
            if state is None:  # no state yet (a parameter added after): zeros
                state = opt.state[id(sl.param)] = {
                    name: DistTensor(backend.xp(first).zeros(mine.shape, first.dtype), sl.part)
                    for name in names
                }
            for name in names:
                t = state[name]
                if t._local is not held.get(name):  # its own array: copied in, then a view
                    view = arrays[name][at : at + sl.sizes[me]].reshape(mine.shape)
                    view[...] = t._local
                    t._local = held[name] = view
        opt.apply(w, g, [arrays[name] for name in names], lr)
        if three:
            autograd.note_mutation(w)  # the slices' memory: every view of it
            return
        for _, local in bucket:
            autograd.note_mutation(local)
        wholes = [local for _, local in bucket]
        with doing(_label, "all-gather", len(bucket), first.dtype, self.mesh, self.dim):
            bucket[0][0].group.allgather(w, flat, lay.counts)
        self._unpack(bucket, lay, flat, wholes)

    # -- gradients -------------------------------------------------------------------------
    def _grad_slices(self) -> dict[int, Any]:
        """Per parameter with a gradient and a slice on this rank, the local array of its
        reduced gradient: the slice (split parameters), or whole (``d`` None). Stages 2 and 3
        reduce-scatter the gradients Partial(sum) over the dim in buckets; everything else
        moves by reshard."""
        out: dict[int, Any] = {}
        scatter: list[tuple[_Slice, Any]] = []
        m = self.dim
        if self.stage >= 2:
            # parameters with no dim to split: all-reduced together; the others' Partial
            # dims besides the sharding dim (a layer norm weight under tensor parallelism)
            # too, leaving them Partial over the dim only, for the reduce-scatter
            n, k = reduce_remaining(self._whole)
            n2, k2 = reduce_remaining(self._split, keep=(m,))
            self.optimizer.reductions = {"gradients": n + n2, "all_reduces": k + k2}
        for p in self.optimizer.params:
            s = self.slices.get(id(p))
            g = p.grad
            if s is None or g is None:
                continue
            if s.d is None:
                if g.spec != s.whole:
                    g = p.grad = reshard(g, s.whole.mesh, s.whole.placements)
                out[id(p)] = g.to_local()
                continue
            if self.stage == 1:  # reduced whole (an all-reduce), then sliced locally
                if g.spec != s.whole:
                    g = reshard(g, s.whole.mesh, s.whole.placements)
                    p.grad = g
                if s.group is not None:
                    out[id(p)] = s.take(g.to_local(), s.me)
                continue
            if g.spec.placements[m] == Partial("sum"):
                want = s.whole.with_placement(m, Partial("sum"))
                if g.spec != want:  # another layout on the other dims: moved there first
                    g = reshard(g, want.mesh, want.placements)
                scatter.append((s, g.to_local()))
                continue
            if g.spec != s.part:  # Replicate over the dim: a local slice; else a reshard
                g = reshard(g, s.part.mesh, s.part.placements)
            out[id(p)] = g.to_local()
            p.grad = g
        for bucket in self._buckets(scatter):
            self._reduce_scatter(bucket, out)
        return out

    def _buckets(self, members: list[tuple[_Slice, Any]]) -> list[list[tuple[_Slice, Any]]]:
        """Members (slice, local array) in buckets of one dtype and backend, up to the cap,
        in the order given (the parameters' order: the same on every rank). A member counts
        its parameter's whole bytes on this rank, which every rank of the group shares (its
        own slice's would split uneven slices into different buckets on different ranks)."""
        open_: dict[tuple, list] = {}
        sizes: dict[tuple, int] = {}
        out: list[list] = []
        for s, a in members:
            if s.group is None:
                continue
            key = (a.dtype.str, backend.of(a).name)
            n = math.prod(s.shape) * a.dtype.itemsize
            b = open_.get(key)
            if b is not None and sizes[key] + n > self._cap:
                b = None
            if b is None:
                b = open_[key] = []
                sizes[key] = 0
                out.append(b)
            b.append((s, a))
            sizes[key] += n
        return out

    def _layout(self, bucket: list[tuple[_Slice, Any]]) -> _Layout:
        """The bucket's kept layout (made at its first use)."""
        key = tuple(id(s) for s, _ in bucket)
        lay = self._layouts.get(key)
        if lay is None:
            if len(self._layouts) >= 256:  # gradients present differ from step to step
                self._layouts.clear()
            lay = self._layouts[key] = _Layout([s for s, _ in bucket])
        return lay

    def _scratch(self, which: str, n: int, like: Any) -> Any:
        """``n`` elements of the kept scratch buffer ``which`` ("flat": a bucket's every
        block; "mine": this rank's block to all-gather) of ``like``'s dtype and backend:
        one per kind, as large as the largest bucket (bucket_size_mb), reused by every
        bucket and step."""
        key = (which, like.dtype.str, type(like))
        buf = self._buffers.get(key)
        if buf is None or buf.size < n:
            buf = self._buffers[key] = backend.xp(like).empty(n, like.dtype)
        return buf[:n]

    def _reduce_scatter(self, bucket: list[tuple[_Slice, Any]], out: dict[int, Any]) -> None:
        """One reduce-scatter of the bucket's gradients into their slices, now."""
        flight = self._start_scatter(bucket, blocking=True)
        for s, piece in self._end_scatter(flight, [True] * len(bucket)):
            out[id(s.param)] = piece.to_local()

    def _start_scatter(self, bucket: list[tuple[_Slice, Any]], blocking: bool) -> _InFlight:
        """Pack the bucket's gradients (whole local arrays; None: zeros) so that block r of the
        send buffer holds rank r's slices, member after member, and start the reduce-scatter
        into this rank's block (``blocking``: done on return)."""
        lay = self._layout(bucket)
        first = next(g for _, g in bucket if g is not None)
        me = bucket[0][0].me
        flat = self._flat(lay.size, first)
        mine = lay.grads
        if mine is None or mine.dtype != first.dtype or type(mine) is not type(first):
            mine = lay.grads = backend.xp(first).empty(lay.counts[me], first.dtype)
        for (s, g), offs in zip(bucket, lay.offsets):
            for r, at in enumerate(offs):
                block = flat[at : at + s.sizes[r]]
                if g is None:
                    block[...] = 0
                else:
                    piece = s.take(g, r)
                    block.reshape(piece.shape)[...] = piece
        group = bucket[0][0].group
        with doing(_label, "reduce-scatter", len(bucket), first.dtype, self.mesh, self.dim):
            if blocking:
                group.reduce_scatter(flat, mine, lay.counts, "sum")
                work = None
            else:
                work = group.ireduce_scatter(flat, mine, lay.counts, "sum")
        return _InFlight(work, bucket, lay, mine, flat)

    def _end_scatter(self, flight: _InFlight, present: list[bool]) -> list[tuple[_Slice, Any]]:
        """Wait for a reduce-scatter; each present member's ``.grad`` becomes its slice (a
        view into the bucket's received block); returns (slice, gradient) of those."""
        if flight.work is not None:
            flight.work.wait()
        self._give_back(flight.flat)
        lay, me, out = flight.layout, flight.bucket[0][0].me, []
        for (s, g), offs, here in zip(flight.bucket, lay.offsets, present):
            if not here:
                continue
            at = offs[me] - lay.base
            shape = s.take(g, me).shape
            piece = flight.mine[at : at + s.sizes[me]].reshape(shape)
            spec = s.part if s.part.dtype == piece.dtype else s.part.replace(dtype=piece.dtype)
            s.param.grad = DistTensor(piece, spec)
            out.append((s, s.param.grad))
        return out

    def _flat(self, n: int, like: Any) -> Any:
        """A send buffer of ``n`` elements like ``like`` for a reduce-scatter: the kept
        scratch buffer when no reduce-scatter in flight uses it, else one of the kept
        extra buffers, else a new one (at most two are in flight: Note [Gradients scattered
        in backward]); ``_give_back`` returns it."""
        if not self._lent:
            self._lent = True
            return self._scratch("flat", n, like)
        for i, buf in enumerate(self._flats):
            if buf.size >= n and buf.dtype == like.dtype and type(buf) is type(like):
                return self._flats.pop(i)[:n]
        return backend.xp(like).empty(n, like.dtype)

    def _give_back(self, flat: Any) -> None:
        """A send buffer no reduce-scatter uses any more (``_flat``)."""
        key = ("flat", flat.dtype.str, type(flat))
        scratch = self._buffers.get(key)
        if scratch is not None and (flat is scratch or getattr(flat, "base", None) is scratch):
            self._lent = False
        elif len(self._flats) < 2:
            self._flats.append(flat)

    # -- parameters ------------------------------------------------------------------------
    def _gather(self, updated: list[tuple[_Slice, Any]]) -> None:
        """Stages 1 and 2: the updated slices all-gathered back into the whole parameters,
        one all-gather per bucket."""
        for bucket in self._buckets(updated):
            # a slice updated in place in its parameter needs no copy back
            self._all_gather(
                bucket,
                [s.param.to_local() for s, _ in bucket],
                [_shares(w, s.param.to_local()) for s, w in bucket],
            )
            for s, _ in bucket:
                autograd.note_mutation(s.param.to_local())

    def _forward_gather(self, params: list[DistTensor], module: Any) -> Any:
        """Stage 3, before ``module``'s forward (Note [Parameters gathered per module] in
        nn/module.py; ``params``: this optimizer's parameters of it and its sub-modules).
        Without reshard_after_forward: every one of ``params`` that is a slice (so the
        outermost call gathers the model), whole until the step. With it, the module's
        *group* (Note [Sharding stages]): all of ``params`` when they fit in a bucket, else
        the module's own; none inside a group being run; the function returned hands the
        group back after the forward."""
        if not self._per_module:
            self._unshard(params)
            return None
        split = [p for p in params if id(p) in self._gathers]
        if not self._running and len(split) == len(self._gathers):
            self._last = None  # the outermost module: a new forward pass
        if all(id(p) in self._running for p in split):
            return None  # inside a group's forward: its module gathered these
        if sum(self._gathers[id(p)] for p in split) > self._cap:
            own = {id(p) for p in module._parameters.values() if p is not None}
            split = [p for p in split if id(p) in own]
        group = [p for p in split if id(p) not in self._running]
        if not group:
            return None
        key = tuple(id(p) for p in group)
        self._groups[key] = group
        self._gather_group(key, group)
        if self._last is not None and self._last != key:  # Note [Groups gathered ahead]
            self._next[self._last] = key
            self._prev[key] = self._last
        self._last = key
        self._gather_ahead(self._next.get(key))
        self._running.update((id(p), p) for p in group)
        return functools.partial(self._after_forward, group)

    # Note [Groups gathered ahead]
    #     With reshard_after_forward, stage 3 gathers each group just before its forward and
    #     again before its backward. From the second forward on, the next group's all-gather
    #     is started ahead, non-blocking (Communicator.iallgather), as soon as the current
    #     group is whole, so it can run while the current group computes: in forward the group
    #     the last forward gathered next (``_next``), in backward the one it gathered before
    #     (``_prev``). The order is learned as the forward runs (a new pass starts at the
    #     outermost module, whose call hands over every split parameter), so a model whose
    #     order changes only loses the prediction. A group's gather takes its all-gathers in
    #     flight (``_take``), if every member is still the slice it was at the start and
    #     unwritten; otherwise, and for anything still in flight at the step, the data is
    #     dropped after its wait (every rank decides alike: the order and the writes are the
    #     program's). A rank holds whole at most one group more than without this: the one
    #     gathered ahead. Each all-gather is counted once, when it starts.
    def _gather_group(self, key: tuple, params: list[DistTensor]) -> None:
        """Stage 3, per module: ``params`` (group ``key``) made whole, from the all-gathers
        started ahead where there are some, else now."""
        if not self._take(key):
            self._unshard(params)

    def _gather_ahead(self, key: tuple | None) -> None:
        """Start the all-gathers of group ``key`` (Note [Groups gathered ahead]), if it is
        known and all its members are slices now."""
        if key is None or key in self._ahead:
            return
        params = self._groups.get(key)
        if params is None:
            return
        todo = []
        for p in params:
            s = self.slices.get(id(p))
            if s is None or s.d is None or p._spec != s.part:
                return  # a member whole already, or not ours: gathered as it is needed
            todo.append((s, p.to_local()))
        flights = []
        for bucket in self._buckets(todo):
            lay = self._layout(bucket)
            first, me = bucket[0][1], bucket[0][0].me
            xp = backend.xp(first)
            mine = self._pack(bucket, lay, xp.empty(lay.counts[me], first.dtype))
            flat = xp.empty(lay.size, first.dtype)
            label = ("all-gather ahead", len(bucket), first.dtype, self.mesh, self.dim)
            with doing(_label, *label):
                work = bucket[0][0].group.iallgather(mine, flat, lay.counts)
            stamps = [autograd.version(w) for _, w in bucket]
            flights.append((bucket, stamps, flat, mine, work))
        self._ahead[key] = flights

    def _take(self, key: tuple) -> bool:
        """Finish the all-gathers started ahead for group ``key``: whether they made its
        members whole (each member still the unwritten slice it was at the start)."""
        flights = self._ahead.pop(key, None)
        if flights is None:
            return False
        ok = True
        for bucket, stamps, _, _, work in flights:
            work.wait()
            for (sl, w), stamp in zip(bucket, stamps):
                p = sl.param
                if p._local is not w or p._spec != sl.part or autograd.version(w) != stamp:
                    ok = False
        if not ok:  # dropped: gathered now instead (every rank alike)
            return False
        for bucket, _, flat, _, _ in flights:
            lay = self._layout(bucket)
            xp = backend.xp(flat)
            wholes = [xp.empty(sl.shape, w.dtype) for sl, w in bucket]
            self._unpack(bucket, lay, flat, wholes)
            self._made_whole(bucket, wholes)
        self._taken += 1
        return True

    def _drain(self) -> None:
        """Wait for every all-gather started ahead and drop what it gathered (the step is
        about to change the slices)."""
        for flights in self._ahead.values():
            for *_, work in flights:
                work.wait()
        self._ahead.clear()
        self._last = None

    def _after_forward(self, params: list[DistTensor], out: Any) -> None:
        """Stage 3, per module: after its forward, its parameters become slices again; the
        first gradient that reaches one of its outputs in backward gathers them again (a
        hook on each output that needs a gradient), and each goes back to its slice once its
        own gradient is final (``_after_backward``). An op of its backward that runs while a
        parameter is a slice still computes the right value (its dt ops move the slice as
        their rules need): the hooks save those moves."""
        from .data_parallel import _leaves

        for p in params:
            self._running.pop(id(p), None)
        if autograd.is_grad_enabled():
            outs = [t for t in _leaves(out) if isinstance(t, DistTensor) and t.requires_grad]
            if outs:
                regather = _Regather(self, params)
                for t in outs:
                    t.register_hook(regather)
        self._reshard(params)

    def _regather(self, params: list[DistTensor]) -> None:
        """Stage 3, per module: the group's parameters whole again for its backward (the
        hook on its outputs), and the group before it in forward gathered ahead (Note
        [Groups gathered ahead])."""
        key = tuple(id(p) for p in params)
        self._gather_group(key, params)
        self._gather_ahead(self._prev.get(key))

    def _after_backward(self, p: DistTensor) -> None:
        """Stage 3, per module: ``p``'s gradient is final in this backward: back to its slice."""
        self._reshard([p])

    def _reshard(self, params: list[DistTensor]) -> None:
        """Stage 3: those of ``params`` that are whole become their slices again (the slice
        each held before ``_unshard``, unchanged since; else a copy of it)."""
        for p in params:
            s = self.slices.get(id(p))
            if s is None or s.d is None or p._spec != s.whole:
                continue
            w = self._slice_of.pop(id(p), None)
            if w is None:
                self._to_slice(s, None)
            else:
                p._local, p._spec, p._moved = w, s.part, None

    def _unshard(self, params: list[DistTensor]) -> None:
        """Stage 3, for a module's forward or backward (Note [Parameters gathered per
        module] in nn/module.py): those of ``params`` that are slices now become whole, one
        all-gather per bucket; gathering per module, each slice is kept for ``_reshard``."""
        todo = []
        for p in params:
            s = self.slices.get(id(p))
            if s is not None and s.d is not None and p._spec == s.part:
                todo.append((s, p.to_local()))
        for bucket in self._buckets(todo):
            xp = backend.xp(bucket[0][1])
            wholes = [xp.empty(s.shape, w.dtype) for s, w in bucket]
            self._all_gather(bucket, wholes)
            self._made_whole(bucket, wholes)

    def _all_gather(
        self, bucket: list[tuple[_Slice, Any]], wholes: list[Any], in_place: list | None = None
    ) -> None:
        """One all-gather of the bucket's slices into the whole local arrays ``wholes``
        (``in_place[i]``: member i's own slice is already there)."""
        lay = self._layout(bucket)
        first, me = bucket[0][1], bucket[0][0].me
        flat = self._gathered(lay, first)
        mine = self._pack(bucket, lay, self._scratch("mine", lay.counts[me], first))
        with doing(_label, "all-gather", len(bucket), first.dtype, self.mesh, self.dim):
            bucket[0][0].group.allgather(mine, flat, lay.counts)
        self._unpack(bucket, lay, flat, wholes, in_place)

    def _gathered(self, lay: _Layout, like: Any) -> Any:
        """The buffer a bucket's all-gather writes every rank's block into: the kept scratch,
        or a new one while a reduce-scatter in flight sends from the scratch."""
        if self._lent:
            return backend.xp(like).empty(lay.size, like.dtype)
        return self._scratch("flat", lay.size, like)

    @staticmethod
    def _pack(bucket: list, lay: _Layout, mine: Any) -> Any:
        """The bucket's members' arrays (this rank's slices) laid end to end in ``mine``, this
        rank's block of the all-gather; returns ``mine``."""
        me = bucket[0][0].me
        for (s, w), offs in zip(bucket, lay.offsets):
            at = offs[me] - lay.base
            mine[at : at + s.sizes[me]].reshape(w.shape)[...] = w
        return mine

    def _made_whole(self, bucket: list, wholes: list) -> None:
        """Stage 3: each member's parameter becomes its whole local array; gathering per
        module, the slice it was is kept for ``_reshard``."""
        for (s, w), whole in zip(bucket, wholes):
            p = s.param
            if self._per_module:
                self._slice_of[id(p)] = w
            p._local, p._spec, p._moved = whole, s.whole, None

    @staticmethod
    def _unpack(bucket: list, lay: _Layout, flat: Any, wholes: list, in_place: list | None = None):
        """Every rank's slices in the gathered ``flat`` into the whole local arrays
        ``wholes`` (``in_place[i]``: member i's own slice is already there)."""
        me = bucket[0][0].me
        for i, ((s, _), whole, offs) in enumerate(zip(bucket, wholes, lay.offsets)):
            for r, at in enumerate(offs):
                if r == me and in_place is not None and in_place[i]:
                    continue
                target = s.take(whole, r)
                target[...] = flat[at : at + s.sizes[r]].reshape(target.shape)

    def _own_slice(self, s: _Slice, local: Any) -> Any:
        """Stage 3: this rank's slice of the whole ``local``, copied into memory the slice
        keeps from step to step (the whole array can then go)."""
        keep = self._kept.get(id(s))
        view = s.take(local, s.me)
        if keep is None or keep.shape != view.shape or keep.dtype != view.dtype:
            keep = self._kept[id(s)] = view.copy()
        else:
            keep[...] = view
        return keep

    def _to_slice(self, s: _Slice, w: Any) -> None:
        """Stage 3: the parameter becomes its slice ``w`` (None: taken from its whole local
        array, copied so the whole one can go)."""
        p = s.param
        if w is None:
            w = s.take(p.to_local(), s.me).copy()
        p._local, p._spec, p._moved = w, s.part, None


_PARAMS = object()  # the key of stage 3's slices in ShardedOptimizer._ends, beside the state names


class _Regather:
    """The backward hook of a stage-3 module's outputs (``ShardedOptimizer._after_forward``):
    gathers the module's parameters again, once they are slices; the optimizer is held
    weakly."""

    def __init__(self, opt: ShardedOptimizer, params: list) -> None:
        self.opt = weakref.ref(opt)
        self.params = params

    def __call__(self, g: Any) -> None:
        opt = self.opt()
        if opt is not None:
            opt._regather(self.params)


@dataclass
class _InFlight:
    """A reduce-scatter started: its Work (None: done), members (slice, whole local
    gradient), layout, received block and send buffer."""

    work: Any
    bucket: list
    layout: _Layout
    mine: Any
    flat: Any


# Note [Gradients scattered in backward]
#     Stages 2 and 3 reduce-scatter during backward, as plain data parallelism all-reduces:
#     a Reducer (parallel/buckets.py) puts the split parameters' gradients, Partial(sum)
#     over the sharding dim and laid out as the parameter otherwise, in buckets of their own
#     in the order they become final; a full bucket is packed by rank block
#     (``_start_scatter``) and its reduce-scatter started, and the bucket started before it
#     is waited for first, so at most two are in flight; when backward ends the last ones
#     are waited for. A bucket waited for hands each gradient its slice (``.grad`` becomes
#     the Shard(d) DistTensor): the whole gradients of the buckets done go while backward
#     runs, and none is left after it. The Reducer is a dt.DataParallel's when one wraps
#     the parameters (``_release``: its gradient merge then holds, only the k-th backward
#     pass launches and the step scales the slices by the merge's mean), else this
#     optimizer's own (``_on_grad``). A gradient in another layout (Partial over other dims
#     too, or already reduced) is left to the step, which reduce-scatters or reshards it.
#     ``_Scatter`` is the Reducer's view of this optimizer.
class _Scatter:
    def __init__(self, opt: ShardedOptimizer) -> None:
        self.opt = opt
        self.ids = {id(p) for p in opt._split}
        m = opt.dim
        self.want = {
            id(s.param): s.whole.with_placement(m, Partial("sum"))
            for s in opt.slices.values()
            if s.d is not None and s.group is not None
        }

    def holds(self, p: Any) -> bool:
        return id(p) in self.ids

    def key(self, p: Any, g: Any) -> tuple | None:
        """The reduce-scatter bucket key of ``p``'s gradient ``g``, or None (left to the
        step)."""
        want = self.want.get(id(p))
        gs = g._spec
        if want is None or gs.placements != want.placements or gs.shape != want.shape:
            return None
        return ((self.opt.dim,), gs.dtype.str, "sum", "scatter")

    def reduced(self, p: Any, g: Any) -> DistSpec:
        part = self.opt.slices[id(p)].part
        return part if part.dtype == g._spec.dtype else part.replace(dtype=g._spec.dtype)

    def launch(self, params: list, grads: list, blocking: bool) -> _InFlight:
        bucket = [(self.opt.slices[id(p)], g) for p, g in zip(params, grads)]
        return self.opt._start_scatter(bucket, blocking)

    def finish(self, flight: _InFlight, present: list[bool]) -> list:
        return [g for _, g in self.opt._end_scatter(flight, present)]

    def drop(self, flight: _InFlight) -> None:
        if flight.work is not None:
            flight.work.wait()
        self.opt._give_back(flight.flat)


def _wrappers(params: list) -> list:
    """The dt.DataParallel wrappers that finish the gradients of ``params``, each once."""
    from .data_parallel import DataParallel

    owners = (fn.__self__ for fn, _ in autograd._finishers.by_owner(params).values())
    return [owner for owner in owners if isinstance(owner, DataParallel)]


def _shares(view: Any, base: Any) -> bool:
    """``view`` is a view into ``base`` (numpy's or a device's: by ``.base``)."""
    return view is not base and getattr(view, "base", None) is base


def _as(a: Any, dtype: Any) -> Any:
    return a if a.dtype == dtype else a.astype(dtype)


def _label(what: str, n: int, dtype: Any, mesh: ProcessMesh, m: int) -> str:
    """``sharded optimizer: reduce-scatter of 3 parameters, float64, over dp``."""
    return (
        f"sharded optimizer: {what} of {n} parameter{'s' * (n != 1)}, {np.dtype(dtype).name}, "
        f"over {mesh.dim_names[m]}"
    )


def shard_optimizer(optimizer: Any, stage: _Stage) -> ShardedOptimizer:
    """Split ``optimizer``'s model state over a data-parallel mesh dim: ``stage`` is
    ``dt.ShardingStage1(dim)`` (optimizer state), ``ShardingStage2(dim)`` (and gradients) or
    ``ShardingStage3(dim)`` (and parameters); Note [Sharding stages]. Returns the optimizer
    to step. Stage 3 re-places the parameters (collective-free: each rank keeps its slice).

    >>> import numpy as np, disttensor as dt
    >>> def train():
    ...     mesh = dt.ProcessMesh([0, 1], dim_names=["dp"])
    ...     w = dt.nn.Parameter(dt.shard_tensor(np.arange(4.0), mesh, [dt.Replicate()]))
    ...     opt = dt.shard_optimizer(dt.optim.Adam([w], lr=0.1), dt.ShardingStage1("dp"))
    ...     (w * w).sum().backward()
    ...     opt.step()
    ...     return opt.state[id(w)]["exp_avg"].placements, w.placements
    >>> dt.simulate(2, train)[0]
    ([Shard(dim=0)], [Replicate()])
    """
    return ShardedOptimizer(optimizer, stage)


_TRACE_LOCK = threading.Lock()
_trace = {"users": 0, "ours": False}  # memory_report(step=) calls tracing now; started by us


def _tracing(change: int) -> None:
    """Start tracemalloc for the first step traced (unless the user had), stop it after the
    last: simulated ranks are threads of one process, which has one tracemalloc (so under
    dt.simulate a step's peak counts every simulated rank's allocations)."""
    with _TRACE_LOCK:
        if change > 0 and _trace["users"] == 0 and not tracemalloc.is_tracing():
            tracemalloc.start()
            _trace["ours"] = True
        _trace["users"] += change
        if _trace["users"] == 0 and _trace["ours"]:
            tracemalloc.stop()
            _trace["ours"] = False


def memory_report(
    model: Any = None, optimizer: Any = None, step: Callable[[], Any] | None = None
) -> dict[str, int]:
    """Bytes this rank holds for the model state (no communication): ``parameters``,
    ``gradients`` (the ``.grad`` arrays now), ``optimizer_state``, ``buffers`` (what the
    gradient reductions keep between steps beyond those: dt.DataParallel's buckets, a
    sharded optimizer's scratch buffers, as large as its largest bucket) and their
    ``total``. ``model`` is a dt.nn.Module or a list of parameters (default: the
    optimizer's); the memory of each array is counted once (a gradient that is a view into
    a bucket counts the bucket).

    ``step``: a function that runs one training step (forward, backward, ``opt.step()``;
    collective, as the step is). It is called under Python's tracemalloc, which numpy
    reports its arrays to, and ``step_peak`` is the most host memory allocated at once
    during it above what was allocated when it began (activations, gradients, buckets and
    temporaries; device memory is not traced; under dt.simulate every simulated rank's); the
    other fields are counted after it. The tracing slows the step down: measure times
    without it."""
    if model is None and optimizer is None:
        raise TypeError("memory_report needs a model (or parameter list), an optimizer, or both")
    if step is not None and not callable(step):
        raise TypeError(f"memory_report: step must be a function of no arguments, got {step!r}")
    peak = None
    if step is not None:
        _tracing(+1)
        try:
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            step()
            peak = max(tracemalloc.get_traced_memory()[1] - base, 0)
        finally:
            _tracing(-1)
    if model is None:
        params = list(optimizer.params)
    elif hasattr(model, "parameters"):
        params = list(model.parameters())
    else:
        params = list(model)
    seen: set[int] = set()

    def nbytes(a: Any) -> int:
        """The bytes of the memory ``a`` lives in, the first time that memory is seen (a
        gradient that is a view into a bucket counts the bucket, once)."""
        while getattr(a, "base", None) is not None and hasattr(a.base, "nbytes"):
            a = a.base
        if a is None or id(a) in seen:
            return 0
        seen.add(id(a))
        return int(a.nbytes)

    report = {
        "parameters": sum(nbytes(p.to_local()) for p in params),
        "gradients": sum(nbytes(p.grad.to_local()) for p in params if p.grad is not None),
        "optimizer_state": 0,
        "buffers": 0,
    }
    if optimizer is not None:
        report["optimizer_state"] = sum(
            nbytes(t.to_local()) for entry in optimizer.state.values() for t in entry.values()
        )
    # communication buffers kept between steps: DataParallel's buckets (beyond the gradients
    # that are views into them), a sharded optimizer's scratch and gradient blocks
    kept = [b.buffer for dp in _wrappers(params) for b in dp._reducer.buckets]
    if isinstance(optimizer, ShardedOptimizer):
        kept += list(optimizer._buffers.values())
        kept += optimizer._flats  # reduce-scatter send buffers (Note [Gradients scattered...])
        kept += [lay.grads for lay in optimizer._layouts.values()]
    kept = [b for b in kept if b is not None]  # a reduce-scatter bucket has no buffer
    report["buffers"] = sum(nbytes(b) for b in kept)
    report["total"] = sum(report.values())
    if peak is not None:
        report["step_peak"] = int(peak)
    return report


__all__ = [
    "ShardedOptimizer",
    "ShardingStage1",
    "ShardingStage2",
    "ShardingStage3",
    "memory_report",
    "shard_optimizer",
]
