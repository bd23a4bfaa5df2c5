"""``dt.DataParallel``: fused, overlapped gradient reduction and gradient merge, eagerly.

The eager form of the data-parallel passes of the seed papers: gradients are reduced in a few
large buckets instead of one all-reduce each (Note [Gradient buckets]), a bucket's reduction
starts during backward as soon as its last gradient is final (overlap), nothing scales the
gradients per rank, and ``k_steps`` backward passes accumulate locally before one reduction
(gradient merge). The training loop is the ordinary one::

    dp_model = dt.DataParallel(model, mesh, dim="dp")
    opt = dt.optim.SGD(dp_model.parameters(), lr=0.1)
    for x, y in batches:                      # x, y Shard(0) over "dp"
        loss = loss_fn(dp_model(x), y)
        loss.backward()                       # buckets reduce while backward runs
        opt.step()                            # waits for what is still in flight
        opt.zero_grad()

With ``k_steps=k``, call ``opt.step(); opt.zero_grad()`` after every k-th ``backward()``.

``dim`` defaults to the only dim of a 1-D mesh, and to "dp" on a mesh with more dims.
Parameters built on a mesh of the same ranks and shape that only names its dims otherwise
(the default mesh, whose dim is "d0") are re-labelled onto ``mesh`` (Note [Mesh identity] in
mesh.py): no data moves, and an INFO line on the "disttensor" logger says so.

>>> import numpy as np, disttensor as dt
>>> def train():
...     mesh = dt.ProcessMesh([0, 1], dim_names=["dp"])
...     model = dt.DataParallel(dt.nn.Linear(3, 1, mesh=mesh), mesh, dim="dp")
...     x = dt.shard_tensor(np.ones((4, 3)), mesh, [dt.Shard(0)])
...     with dt.CommCounter() as cc:
...         model(x).sum().backward()     # the bucket's reduction starts here
...         model.finish_gradients()      # and is waited for here
...     return cc.counts, model.module.weight.grad.placements
>>> dt.simulate(2, train)[0]
({'all_reduce': 1}, [Replicate()])
"""

from __future__ import annotations

import logging
import numbers
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import autograd, backend
from ..mesh import ProcessMesh, names_clash, names_differ, same_grid
from ..nn.module import Module
from ..placement import Replicate, Shard
from ..tensor import DistTensor
from .buckets import MiB, Reducer

log = logging.getLogger("disttensor")


class DataParallel(Module):
    """Wrap ``model`` for data parallelism over the mesh dim(s) ``dim`` of ``mesh``
    (default: the only dim of a 1-D mesh; on a mesh with more dims, "dp").

    Its forward is the model's and its parameters are the model's (``dp_model.module``).
    Gradients Partial over ``dim`` are packed into buckets of up to ``bucket_size_mb`` MiB
    (the first ``first_bucket_size_mb``), one all-reduce each; ``fuse=False`` reduces every
    gradient on its own. With ``overlap`` a bucket's non-blocking all-reduce starts during
    backward; otherwise all of them run when the gradients are used. ``k_steps`` backward
    passes accumulate before one reduction; ``avg`` divides the merged gradient by the
    number of passes (the mean over the k-times larger batch), else it is their sum.
    Gradients are finished (waited for, made Replicate over ``dim``) by any dt optimizer's
    ``step()`` or by ``finish_gradients()``.

    Parameters on a mesh with ``mesh``'s ranks and shape but other dim names are re-labelled
    onto ``mesh`` (their shards unchanged, logged at INFO). The batch must be split over
    ``dim`` (``dt.shard_tensor(x, mesh, [dt.Shard(0)])``): the first forward whose tensor
    arguments are not (a numpy array, a DistTensor Replicate over ``dim``) warns
    (RuntimeWarning, once per wrapper), since every rank then computes the whole batch.
    """

    def __init__(
        self,
        model: Module,
        mesh: ProcessMesh,
        dim: str | int | Sequence[str | int] | None = None,
        bucket_size_mb: float = 25.0,
        first_bucket_size_mb: float = 1.0,
        overlap: bool = True,
        k_steps: int = 1,
        avg: bool = True,
        fuse: bool = True,
    ) -> None:
        if not isinstance(model, Module):
            raise TypeError(f"DataParallel wraps a dt.nn.Module, got {type(model).__name__}")
        if not isinstance(mesh, ProcessMesh):
            raise TypeError(f"DataParallel needs a dt.ProcessMesh, got {type(mesh).__name__}")
        if dim is None:  # the only dim, or "dp"
            if mesh.ndim == 1:
                dim = mesh.dim_names[0]
            elif "dp" in mesh.dim_names:
                dim = "dp"
            else:
                raise ValueError(
                    f"DataParallel: which dim of the {mesh.ndim}-D mesh {mesh} is "
                    f"data-parallel? dim= defaults to the only dim of a 1-D mesh, else to "
                    f"'dp', which this mesh lacks; pass dim= one of {mesh.dim_names} (or a "
                    "list of them)"
                )
        names = [dim] if isinstance(dim, (str, numbers.Integral)) else list(dim)
        if not names:
            raise ValueError("DataParallel: dim names no mesh dim; give one or a list")
        for d in names:
            if isinstance(d, str) and d not in mesh.dim_names:
                raise ValueError(
                    f"DataParallel: dim={d!r} is not a dim of the mesh: its dim_names are "
                    f"{mesh.dim_names}; pass dim= one of them"
                    + (" (or leave dim= out: a 1-D mesh's only dim)" if mesh.ndim == 1 else "")
                )
        dims = tuple(sorted({mesh.dim_index(d) for d in names}))  # raises on bad indices
        for what, v in (
            ("bucket_size_mb", bucket_size_mb),
            ("first_bucket_size_mb", first_bucket_size_mb),
        ):
            if isinstance(v, bool) or not (isinstance(v, numbers.Real) and v > 0):
                raise ValueError(
                    f"DataParallel: {what} must be a positive number of MiB (inf: no cap), "
                    f"got {v!r}"
                )
        if isinstance(k_steps, bool) or not isinstance(k_steps, numbers.Integral) or k_steps < 1:
            raise ValueError(f"DataParallel: k_steps must be an integer >= 1, got {k_steps!r}")
        k_steps = int(k_steps)
        super().__init__()
        self.module = model
        self.mesh, self.dims = mesh, dims
        self.overlap, self.k_steps, self.avg, self.fuse = bool(overlap), k_steps, bool(avg), fuse
        caps = (float(first_bucket_size_mb) * MiB, float(bucket_size_mb) * MiB) if fuse else (0, 0)
        # every parameter counts backward passes and is scaled by gradient merge; those on
        # the mesh, replicated over the dims, have the gradients that buckets reduce.
        # Parameters on the mesh under other dim names are adopted (re-labelled below, once
        # every check has passed: a failed wrap changes nothing)
        self._all = list(model.parameters())
        adopt = [p for p in self._all if p.mesh != mesh and _adoptable(p.mesh, mesh)]
        adopted = {id(p) for p in adopt}
        self._params = [
            p
            for p in self._all
            if (p.mesh == mesh or id(p) in adopted)
            and all(p.placements[m] == Replicate() for m in dims)
        ]
        self._bucketed = {id(p) for p in self._params}
        if not self._params:
            raise ValueError(_nothing_to_reduce(model, mesh, dims))
        self._caps = caps
        self._reducer = Reducer(self._params, mesh, dims, caps)
        self._micro = 0  # backward passes accumulated since the last reduction
        self._backward = None  # the backward pass now running (autograd's callback list)
        self._round = False  # this reduction round has begun (its buckets are reset)
        self._removers = []
        for p in self._all:
            if autograd._finishers.get(p) is not None:
                raise ValueError(
                    f"DataParallel: a parameter of shape {p.shape} is already wrapped by "
                    "another DataParallel; wrap the model once (or .unwrap() the other)"
                )
        if adopt:
            _relabel(adopt, mesh)
        self._warned = False  # the unsplit-batch warning, once per wrapper
        for p in self._all:
            self._removers.append(p.register_post_accumulate_grad_hook(_weak(self._on_grad)))
            autograd.set_grad_finisher(p, self._finish)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self._warned:
            unsplit = self._unsplit(args, kwargs)
            if unsplit:
                self._warned = True
                warnings.warn(unsplit, RuntimeWarning, stacklevel=3)  # the caller's line
        return self.module(*args, **kwargs)

    def _unsplit(self, args: tuple, kwargs: dict) -> str:
        """The warning for a forward whose batch is not split over every data-parallel dim
        of more than one rank (no tensor argument is Shard over it): every rank then computes
        the whole batch. "" when the batch is split, or nothing is a tensor."""
        mesh, dims = self.mesh, self.dims
        seen, split = [], set()
        for a in _leaves((args, kwargs)):
            if isinstance(a, DistTensor):
                seen.append(a)
                if same_grid(a.mesh, mesh):  # other names: the op's error says so
                    split.update(m for m in dims if isinstance(a.placements[m], Shard))
            elif isinstance(a, np.ndarray) or backend.is_device(a):
                seen.append(a)
        missing = [m for m in dims if m not in split and mesh.shape[m] > 1]  # 1 rank: no loss
        if not seen or not missing:
            return ""
        over = [mesh.dim_names[m] for m in missing]
        if all(not isinstance(a, DistTensor) for a in seen):
            kind = "numpy" if all(isinstance(a, np.ndarray) for a in seen) else "device"
            what = f"the batch is a {kind} array, not split over {over}"
        else:
            what = f"no argument is Shard over {over} (the batch is not split)"
        want = ["dt.Shard(0)" if m in dims else "dt.Replicate()" for m in range(mesh.ndim)]
        return (
            f"DataParallel: {what}, so every rank computes the whole batch and data "
            "parallelism does nothing; split it with "
            f"dt.shard_tensor(x, mesh, [{', '.join(want)}])"
        )

    # -- backward: a gradient is final -----------------------------------------------------
    def _on_grad(self, p: Any) -> None:
        running = autograd._state.callbacks
        if running is not self._backward:  # the first gradient of a new backward pass
            self._backward = running
            self._micro += 1
            if self._micro >= self.k_steps:  # gradient merge: only the k-th pass reduces
                self._reducer.begin()
                self._round = True
                autograd.queue_callback(self._end_of_backward)
        if self._round and id(p) in self._bucketed:
            self._reducer.arrive(p, launch=self.overlap)
            if self.overlap:
                self._reducer.poke()

    def _end_of_backward(self) -> None:
        self._backward = None
        self._reducer.end_of_backward(launch=self.overlap)

    # -- using the gradients ---------------------------------------------------------------
    def _finish(self, drop: bool = False) -> None:
        """Note [Gradient finishers]: wait for (or run) the reductions, then the gradients
        are Replicate over the data-parallel dims; ``drop`` forgets what was accumulated."""
        self._backward = None
        if drop or self._micro == 0:
            self._reducer.wait_all()
            self._micro, self._round = 0, False
            return
        if not self._round:  # fewer than k_steps passes, or none reduced yet: reduce now
            self._reducer.begin()
        self._reducer.flush(self._params[::-1])  # no layout yet: reverse forward order
        scale = 1.0 / self._micro if self.avg and self.k_steps > 1 else 1.0
        done = self._reducer.finish(scale)
        if scale != 1.0:  # gradients no bucket holds (none is Partial on one rank, ZeRO-style
            with autograd.no_grad():  # shards, ...) take the merge's mean one by one
                for p in self._all:
                    if p.grad is not None and id(p) not in done:
                        p.grad = p.grad * scale
        self._micro, self._round = 0, False

    def _release(self, params: list, scatter: Any = None) -> None:
        """A sharding stage reduces the gradients of ``params`` (reduce-scatter, Note
        [Sharding stages]): with ``scatter`` (the stage's view, Note [Gradients scattered in
        backward] in parallel/sharding.py) the buckets reduce-scatter them during backward;
        without, they leave the buckets. Gradient merge still counts and scales them. Called
        between steps, on every rank alike."""
        if scatter is not None:
            if self._reducer.scatter is scatter:
                return
            self._reducer.wait_all()
            self._reducer = Reducer(self._params, self.mesh, self.dims, self._caps)
            self._reducer.scatter = scatter
            self._round = False
            return
        ids = {id(p) for p in params}
        keep = [p for p in self._params if id(p) not in ids]
        if len(keep) == len(self._params):
            return
        self._reducer.wait_all()
        self._params, self._bucketed = keep, {id(p) for p in keep}
        self._reducer = Reducer(keep, self.mesh, self.dims, self._caps)
        self._round = False

    def finish_gradients(self) -> None:
        """Finish the gradients now (what an optimizer's ``step()`` does first): wait for the
        reductions in flight, or run them; afterwards every bucketed ``.grad`` is Replicate
        over the data-parallel dims. Collective over the mesh."""
        self._finish()

    def unwrap(self) -> Module:
        """Finish what is in flight, remove this wrapper's hooks from the parameters, and
        return the model (whose gradients the optimizer then reduces one by one)."""
        self._finish(drop=True)
        for remove in self._removers:
            remove()
        for p in self._all:
            autograd.set_grad_finisher(p, None)
        self._removers = []
        return self.module

    @property
    def buckets(self) -> dict[str, Any]:
        """The bucket layout decided by the first reduction: {"gradients": n, "buckets":
        [{"bytes", "gradients", "dtype", "dims", "reduce", "collective"}, ...]} (empty
        before it); "collective" is "all_reduce", or "reduce_scatter" for the gradients a
        sharding stage splits (dt.shard_optimizer)."""
        return self._reducer.summary()

    def extra_repr(self) -> str:
        names = [self.mesh.dim_names[m] for m in self.dims]
        return f"dim={names}, overlap={self.overlap}, k_steps={self.k_steps}, fuse={self.fuse}"


def _adoptable(have: ProcessMesh, mesh: ProcessMesh) -> bool:
    """A parameter on ``have`` can be re-labelled onto ``mesh``: the same ranks in the same
    grid, and no dim name that stands for another dim in the other mesh."""
    return same_grid(have, mesh) and not names_clash(have, mesh)


def _relabel(params: list, mesh: ProcessMesh) -> None:
    """Put ``params`` (and their gradients) on ``mesh``, whose ranks and shape are theirs:
    the spec's mesh changes, every shard stays as it is (no communication)."""
    meshes = sorted({repr(p.mesh) for p in params})
    for p in params:
        for t in (p, p.grad):
            if t is not None:
                # its remembered moves (Note [One move per tensor]) start from the old mesh
                t._spec = t._spec.replace(mesh=mesh)
                t._moved = None
    log.info(
        "DataParallel: %d parameter%s on %s re-labelled onto %s (the same ranks and shape, "
        "other dim names; no data moved)",
        len(params),
        "" if len(params) == 1 else "s",
        " and ".join(meshes),
        mesh,
    )


def _nothing_to_reduce(model: Module, mesh: ProcessMesh, dims: tuple) -> str:
    """Why no parameter of ``model`` has a gradient to reduce over ``dims`` of ``mesh``:
    where its parameters live (per mesh and placements, a name each), and the fix."""
    over = [mesh.dim_names[m] for m in dims]
    head = f"DataParallel: no parameter of the model lives on {mesh} replicated over {over}"
    where: dict[tuple, list[str]] = {}
    for name, p in model.named_parameters():
        where.setdefault((p.mesh, tuple(p.placements)), []).append(name)
    if not where:
        return f"{head}: the model has no parameters"
    parts = []
    hints = []
    for (m, placements), names in list(where.items())[:4]:
        n = len(names)
        parts.append(
            f"{n} parameter{'' if n == 1 else 's'} (e.g. {names[0]!r}) on {m} as {list(placements)}"
        )
        clause = names_differ(m, mesh)
        if clause and clause not in hints:
            clash = names_clash(m, mesh)
            hints.append(
                f"{clause}; DataParallel re-labels parameters onto its mesh only where no dim "
                f"name means another dim in the other mesh, and here {clash} do"
                if clash
                else clause
            )
    more = f" and {len(where) - 4} more layouts" if len(where) > 4 else ""
    return (
        f"{head}; its parameters: {'; '.join(parts)}{more}. "
        + "".join(f"{h[0].upper()}{h[1:]}. " for h in hints)
        + "Build the model on this mesh (e.g. Linear(..., mesh=mesh)) or place it with "
        "dt.shard_layer(model, mesh) first; parameters Shard over a data-parallel dim "
        "(ZeRO-style) are left to the optimizer"
    )


def _leaves(a: Any):
    """The values inside nested tuples, lists and dicts (a forward's arguments)."""
    if isinstance(a, (tuple, list)):
        for b in a:
            yield from _leaves(b)
    elif isinstance(a, dict):
        for b in a.values():
            yield from _leaves(b)
    else:
        yield a


def _weak(method: Callable) -> Callable:
    """A hook that calls the bound ``method`` while its object lives: the parameters' hook
    lists do not keep a dropped wrapper alive (Note [Gradient finishers])."""
    ref = weakref.WeakMethod(method)

    def hook(p: Any) -> None:
        fn = ref()
        if fn is not None:
            fn(p)

    return hook
