"""ProcessMesh: an immutable, named N-D array of global ranks.

>>> mesh = ProcessMesh([[0, 1], [2, 3]], dim_names=["dp", "mp"])
>>> mesh.shape, mesh.get_dim_size("mp"), mesh.get_coord(2)
((2, 2), 2, (1, 0))
>>> mesh.group_ranks("mp", 2)
(2, 3)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np


class ProcessMesh:
    """Ranks arranged in a grid; a mesh dim is named and is the unit of every 1-D collective."""

    __slots__ = ("_ids", "_dim_names", "_hash", "__dict__")

    def __init__(self, mesh: Any, dim_names: Sequence[str] | None = None) -> None:
        if isinstance(mesh, ProcessMesh):
            mesh = mesh._ids
        try:
            ids = np.array(mesh)
        except ValueError as e:  # ragged nested lists
            raise ValueError(f"ProcessMesh needs a rectangular nested list of ranks: {e}") from None
        if ids.ndim == 0 or ids.size == 0:
            raise ValueError(f"ProcessMesh needs at least one rank, got {mesh!r}")
        if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"ProcessMesh ranks must be integers, got {ids.dtype} values {mesh!r}")
        if ids.min() < 0:
            raise ValueError(f"ProcessMesh ranks must be >= 0, got {ids.tolist()}")
        flat = ids.ravel().tolist()
        if len(set(flat)) != len(flat):
            dup = sorted({r for r in flat if flat.count(r) > 1})
            raise ValueError(
                f"ProcessMesh ranks must be distinct; repeated: {dup} in {ids.tolist()}"
            )
        if dim_names is None:
            dim_names = [f"d{i}" for i in range(ids.ndim)]
        if isinstance(dim_names, str):
            dim_names = [dim_names]
        names = tuple(dim_names)
        if len(names) != ids.ndim or not all(isinstance(n, str) for n in names):
            raise ValueError(
                f"dim_names must be {ids.ndim} strings (one per mesh dim of shape "
                f"{ids.shape}), got {list(names)!r}"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"dim_names must be distinct, got {list(names)!r}")
        ids = ids.astype(np.int64)
        ids.flags.writeable = False
        self._ids = ids
        self._dim_names = names
        self._key = (ids.shape, tuple(flat), names)  # equality by value, as tuples (fast)
        self._hash = hash(self._key)

    # -- the value ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._ids.shape

    @property
    def ndim(self) -> int:
        return self._ids.ndim

    @property
    def size(self) -> int:
        return self._ids.size

    @property
    def dim_names(self) -> list[str]:
        return list(self._dim_names)

    @property
    def mesh(self) -> np.ndarray:
        """The ranks as a (read-only) array of the mesh's shape."""
        return self._ids

    @property
    def process_ids(self) -> list[int]:
        return list(self._flat)

    @cached_property
    def max_rank(self) -> int:
        return int(self._ids.max())

    @cached_property
    def _flat(self) -> tuple[int, ...]:
        return tuple(self._ids.ravel().tolist())

    @cached_property
    def _coords(self) -> dict[int, tuple[int, ...]]:
        return {int(r): tuple(int(i) for i in c) for c, r in np.ndenumerate(self._ids)}

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, ProcessMesh):
            return NotImplemented
        return self._hash == other._hash and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return (
            f"ProcessMesh(shape={self.shape}, process_ids={self.process_ids}, "
            f"dim_names={self.dim_names})"
        )

    def __contains__(self, rank: object) -> bool:
        return rank in self._coords

    def __reduce__(self):  # pickles by value
        return (ProcessMesh, (self._ids.tolist(), list(self._dim_names)))

    # -- lookups -----------------------------------------------------------------------------
    def dim_index(self, dim: int | str) -> int:
        """The index of a mesh dim given by name or (possibly negative) index."""
        if isinstance(dim, str):
            if dim not in self._dim_names:
                raise ValueError(
                    f"mesh dim {dim!r} is not in this mesh's dim_names {self.dim_names}"
                )
            return self._dim_names.index(dim)
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"a mesh dim is a name or an int, got {dim!r}")
        if not -self.ndim <= dim < self.ndim:
            raise IndexError(f"mesh dim {dim} is out of range for a {self.ndim}-D mesh")
        return int(dim) % self.ndim

    def get_dim_size(self, dim: int | str) -> int:
        return self.shape[self.dim_index(dim)]

    def get_coord(self, rank: int) -> tuple[int, ...] | None:
        """The coordinate of ``rank`` in the mesh, or None if the rank is not in it."""
        return self._coords.get(rank)

    def group_ranks(self, dim: int | str, rank: int) -> tuple[int, ...]:
        """The ranks along mesh dim ``dim`` that share every other coordinate with ``rank``."""
        coord = self._coords.get(rank)
        if coord is None:
            raise ValueError(f"rank {rank} is not in {self}")
        m = self.dim_index(dim)
        index = coord[:m] + (slice(None),) + coord[m + 1 :]
        return tuple(self._ids[index].tolist())

    def get_submesh(self, dim: int | str, rank: int | None = None) -> ProcessMesh:
        """The 1-D mesh along ``dim`` that holds ``rank`` (default: the calling rank)."""
        if rank is None:
            from .comm import get_rank  # lazy: the mesh is a value, it never needs comm otherwise

            rank = get_rank()
        m = self.dim_index(dim)
        return ProcessMesh(list(self.group_ranks(m, rank)), [self._dim_names[m]])

    def __getitem__(self, dim: int | str) -> ProcessMesh:
        """``mesh["mp"]``: the 1-D sub-mesh along "mp" that holds the calling rank."""
        return self.get_submesh(dim)


# Note [Mesh identity]
#     A mesh is its ranks, its shape and its dim names: two meshes that differ only in their
#     names are two meshes (placements are positional, but ``dim=`` arguments, plans and
#     messages name the dims, so re-labelling silently could swap what "dp" and "mp" mean).
#     Ops refuse operands on two such meshes, and their message says that only the names
#     differ and how to put both on one mesh: build them with ``mesh=``, or re-label one
#     with ``dt.reshard(x, mesh, x.placements)`` (every rank keeps its shard; nothing is
#     sent unless ``x`` is Partial). ``dt.DataParallel`` re-labels the model's parameters
#     that live on such a mesh itself (they were built on the default mesh, typically),
#     when no name stands for another dim in the other mesh.
def same_grid(a: ProcessMesh, b: ProcessMesh) -> bool:
    """Whether ``a`` and ``b`` hold the same ranks in the same grid, whatever their dim
    names (Note [Mesh identity]).

    >>> same_grid(ProcessMesh([0, 1]), ProcessMesh([0, 1], dim_names=["dp"]))
    True
    >>> same_grid(ProcessMesh([0, 1]), ProcessMesh([[0, 1]]))
    False
    """
    return a is b or (a.shape == b.shape and a._flat == b._flat)


def names_clash(a: ProcessMesh, b: ProcessMesh) -> list[str]:
    """The dim names that ``a`` and ``b`` both use for different mesh dims (``["dp", "mp"]``
    for dims ``["dp", "mp"]`` and ``["mp", "dp"]``): re-labelling one mesh as the other
    would change what such a name means."""
    return [n for i, n in enumerate(a._dim_names) if n in b._dim_names and b.dim_index(n) != i]


def names_differ(a: ProcessMesh, b: ProcessMesh) -> str:
    """For an error about ``a`` and ``b`` being different meshes: when they hold the same
    ranks in the same grid, the clause saying that only their dim names differ; else ""."""
    if a == b or not same_grid(a, b):
        return ""
    return (
        f"the two meshes hold the same ranks {a.process_ids} in the same shape {a.shape} and "
        f"differ only in their dim names ({a.dim_names} vs {b.dim_names}); the names are part "
        "of a mesh (placements and dim= refer to them), so these are two meshes"
    )


def different_meshes(op: str, a: tuple[str, ProcessMesh], b: tuple[str, ProcessMesh]) -> str:
    """The message of ``op`` refusing operands on two meshes: ``a`` and ``b`` are (which
    operand, its mesh); it says where each lives and how to put both on one mesh."""
    (wa, ma), (wb, mb) = a, b
    head = f"{op}: operands live on different meshes: {wa} on {ma}, {wb} on {mb}; "
    clause = names_differ(ma, mb)
    if clause:
        return (
            f"{head}{clause}: build both on one mesh (mesh=...), or re-label one with "
            "dt.reshard(x, mesh, x.placements) (each rank keeps its shard; nothing is sent "
            "unless x is Partial)"
        )
    return f"{head}move one with dt.reshard(x, mesh, placements)"


def init_mesh(
    shape: int | Sequence[int],
    dim_names: Sequence[str] | None = None,
    *,
    device: str | None = None,
) -> ProcessMesh:
    """The world's ranks 0..N-1 reshaped to ``shape`` (N must equal the world size).

    ``device`` ("cpu", "gpu" or "auto"; default: leave the selection as it is) also selects
    where this rank's tensors live, as ``dt.set_device`` does (Note [Array backends] in
    backend.py): with "gpu" each rank uses GPU ``local_rank % gpu_count``.

    >>> init_mesh((1,), device="cpu").shape  # a one-rank world, on the host
    (1,)
    """
    from .comm import get_world_size

    # Checked before the product: a negative or zero size would otherwise turn into advice
    # such as "launch with mpiexec -n -2".
    try:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if any(isinstance(s, (bool, np.bool_)) for s in shape):
            raise TypeError
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(
            f"init_mesh: shape must be an int or a sequence of ints, got {shape!r}"
        ) from None
    if not shape:
        raise ValueError("init_mesh: the mesh needs at least one dim, got shape ()")
    if min(shape) < 1:
        raise ValueError(f"init_mesh: every mesh dim needs a size >= 1, got shape {shape}")
    n = math.prod(shape)
    world = get_world_size()
    if n != world:
        raise ValueError(
            f"init_mesh({shape}) needs {n} ranks but the world has {world}; "
            f"launch with mpiexec -n {n} or build a ProcessMesh of a subset of ranks"
        )
    mesh = ProcessMesh(np.arange(n).reshape(shape), dim_names)
    if device is not None:
        from .backend import set_device  # after the checks: a bad shape selects nothing

        set_device(device)
    return mesh
