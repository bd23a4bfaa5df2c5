"""Placing a model on a mesh: ``shard_layer`` and the tensor-parallel plans.

``dt.shard_layer(layer, mesh, shard_fn)`` calls ``shard_fn(name, sublayer, mesh)`` for every
sub-layer (it may reassign parameters, e.g. ``sublayer.weight = dt.shard_tensor(...)``), then
makes every parameter not yet on ``mesh`` Replicate there. Parameters stay leaves.

Plans (Megatron-style tensor parallelism along one mesh dim, Replicate on the others):

- ``ColwiseParallel``: Linear weight Shard(1), bias Shard(0). The output's last axis is split;
  no communication in forward (the input is Replicate along the mesh dim).
- ``RowwiseParallel``: Linear weight Shard(0), bias Replicate. Takes the split activation of a
  column-parallel layer and gives a Partial(sum) output: the block's one reduction.
- ``VocabParallel``: Embedding weight Shard(0) (rows = vocabulary): lookups give Partial(sum)
  output with no communication; as an output projection (a Linear of (dim, vocab)) use
  ColwiseParallel, and cross entropy over the split vocabulary moves only row statistics.

``megatron_plan`` maps the layers of dt.nn.TransformerBlock to these plans.

>>> import numpy as np, disttensor as dt
>>> def program():
...     mesh = dt.ProcessMesh([0, 1], dim_names=["mp"])
...     mlp = dt.nn.MLP(4, 8, seed=0)
...     dt.shard_layer(mlp, mesh, dt.nn.plan_shard_fn({"fc1": dt.nn.ColwiseParallel(),
...                                                    "fc2": dt.nn.RowwiseParallel()}))
...     return [(n, p.placements) for n, p in mlp.named_parameters()]
>>> dt.simulate(2, program)[0]  # doctest: +NORMALIZE_WHITESPACE
[('fc1.weight', [Shard(dim=1)]), ('fc1.bias', [Shard(dim=0)]),
 ('fc2.weight', [Shard(dim=0)]), ('fc2.bias', [Replicate()])]
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ..mesh import ProcessMesh
from ..placement import Placement, Replicate, Shard
from ..tensor import DistTensor, check_world, shard_tensor
from .module import Module, Parameter


def place(p: DistTensor, mesh: ProcessMesh, placements: list[Placement]) -> DistTensor:
    """Parameter ``p`` resharded to ``mesh`` with ``placements``, as a new leaf parameter.

    Layers are made replicated on a mesh of every rank, so each rank of ``mesh`` takes its
    piece from its own copy: no communication (reshard's moves between meshes send only what
    a rank does not hold).
    """
    return Parameter(shard_tensor(p, mesh, placements), requires_grad=p.requires_grad)


def shard_layer(
    layer: Module,
    mesh: ProcessMesh,
    shard_fn: Callable[[str, Module, ProcessMesh], None] | None = None,
    input_fn: Callable[[Any, ProcessMesh], Any] | None = None,
    output_fn: Callable[[Any, ProcessMesh], Any] | None = None,
) -> Module:
    """Place every parameter of ``layer`` on ``mesh`` (see the module doc); returns ``layer``.

    ``input_fn(inputs, mesh)`` / ``output_fn(outputs, mesh)``, if given, transform the
    arguments and the result of ``layer``'s forward (e.g. shard the batch).
    """
    check_world(mesh, "shard_layer")
    if not isinstance(layer, Module):
        raise TypeError(f"shard_layer needs a dt.nn.Module, got {type(layer).__name__}")
    subs = [sub for _, sub in layer.named_modules()]
    before = [(sub, name, p) for sub in subs for name, p in sub._parameters.items()]
    if shard_fn is not None:
        for name, sub in layer.named_modules():
            shard_fn(name, sub, mesh)
    # A parameter shared by several layers (tied weights) stays one parameter: the layers
    # that still hold the old one get the first replacement made for it.
    new_of: dict[int, DistTensor] = {}
    for sub, name, old in before:
        cur = sub._parameters.get(name)
        if cur is not None and cur is not old:
            first = new_of.setdefault(id(old), cur)
            if first.spec != cur.spec:
                raise ValueError(
                    f"shard_layer: a parameter shared by several layers was placed two ways "
                    f"({first.placements} and {cur.placements}); place it once"
                )
    for sub, name, old in before:
        cur = sub._parameters.get(name)
        if cur is None:  # the shard_fn removed it
            continue
        new = new_of.get(id(old))
        if new is None and cur is old and old.mesh != mesh:  # untouched: Replicate on mesh
            new = new_of[id(old)] = place(old, mesh, [Replicate()] * mesh.ndim)
        if new is not None and cur is not new:
            setattr(sub, name, new)
    if input_fn is not None or output_fn is not None:
        forward = layer.forward

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if input_fn is not None:
                args = input_fn(args, mesh)
            out = forward(*args, **kwargs)
            return out if output_fn is None else output_fn(out, mesh)

        object.__setattr__(layer, "forward", wrapped)
    return layer


class _Plan:
    """Placements for a layer's parameters along ``mesh_dim`` (name or index; default the
    last mesh dim), Replicate on the other mesh dims."""

    shards: ClassVar[Mapping[str, Placement]] = {}

    def __init__(self, mesh_dim: int | str | None = None) -> None:
        self.mesh_dim = mesh_dim

    def _dim(self, mesh: ProcessMesh) -> int:
        if self.mesh_dim is None:
            return mesh.ndim - 1
        if isinstance(self.mesh_dim, str):
            if self.mesh_dim not in mesh.dim_names:
                raise ValueError(
                    f"{type(self).__name__}: the mesh has no dim {self.mesh_dim!r} "
                    f"(its dims are {mesh.dim_names})"
                )
            return mesh.dim_names.index(self.mesh_dim)
        return int(self.mesh_dim)

    def __call__(self, layer: Module, mesh: ProcessMesh) -> None:
        m = self._dim(mesh)
        for pname, placement in self.shards.items():
            p = layer._parameters.get(pname)
            if p is None:
                continue
            placements: list[Placement] = [Replicate()] * mesh.ndim
            placements[m] = placement
            setattr(layer, pname, place(p, mesh, placements))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mesh_dim={self.mesh_dim!r})"


class ColwiseParallel(_Plan):
    """Linear split by output features: weight Shard(1), bias Shard(0)."""

    shards: ClassVar[Mapping[str, Placement]] = {"weight": Shard(1), "bias": Shard(0)}


class RowwiseParallel(_Plan):
    """Linear split by input features: weight Shard(0); the output is Partial(sum)."""

    shards: ClassVar[Mapping[str, Placement]] = {"weight": Shard(0)}


class VocabParallel(_Plan):
    """Embedding split by rows (the vocabulary): weight Shard(0); lookups are Partial(sum)."""

    shards: ClassVar[Mapping[str, Placement]] = {"weight": Shard(0)}


def plan_shard_fn(plan: Mapping[str, _Plan]) -> Callable[[str, Module, ProcessMesh], None]:
    """A ``shard_fn`` that applies ``plan[pattern]`` to sub-layers whose dotted name matches
    the glob ``pattern`` (e.g. ``"blocks.*.attn.q"``)."""

    def shard_fn(name: str, layer: Module, mesh: ProcessMesh) -> None:
        for pattern, p in plan.items():
            if fnmatch.fnmatchcase(name, pattern):
                p(layer, mesh)
                return

    return shard_fn


def megatron_plan(prefix: str | None = None, mesh_dim: int | str | None = None) -> dict[str, _Plan]:
    """The tensor-parallel plan of dt.nn.TransformerBlock layers: q, k, v and mlp.fc1
    column-parallel, attn.proj and mlp.fc2 row-parallel (one reduction per residual branch
    in forward, one in backward). ``prefix`` is a glob for the blocks' names (e.g.
    ``"blocks.*"``); None matches a bare block and blocks at any depth."""
    col, row = ColwiseParallel(mesh_dim), RowwiseParallel(mesh_dim)
    layers = {"attn.q": col, "attn.k": col, "attn.v": col, "attn.proj": row}
    layers.update({"mlp.fc1": col, "mlp.fc2": row})
    plan: dict[str, _Plan] = {}
    for name, p in layers.items():
        if prefix is None:
            plan[name] = p
            plan[f"*.{name}"] = p
        else:
            plan[f"{prefix}.{name}" if prefix else name] = p
    return plan
