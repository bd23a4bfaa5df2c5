"""DistSpec: mesh + placements + global shape + dtype, and the shard layout arithmetic.

Pure values and arithmetic, no communication. Uneven shards follow numpy.array_split: with n
elements over k ranks the first n % k shards get one extra element.

Note [Nested sharding]
    Several mesh dims may shard one tensor axis. The splits apply in mesh-dim order: the first
    such mesh dim splits the axis, the next one splits each of those pieces, and so on. So a 1-D
    step on mesh dim m may only change a ``Shard(d)`` when no later mesh dim also shards ``d``
    (m is then the innermost split of d); reshard.py plans around that.

Note [Partial order]
    With several Partial mesh dims the true value reduces the last (innermost) mesh dim first,
    then the ones before it. Reduce types that commute (equal, or sum with avg) can be reduced
    in any order; reshard.py only reduces a mesh dim early when every later Partial commutes.

>>> from disttensor.mesh import ProcessMesh
>>> from disttensor.placement import Shard, Replicate
>>> spec = DistSpec.make(ProcessMesh([[0, 1], [2, 3]]), [Shard(0), Shard(0)], (7, 2), "f4")
>>> [spec.local_shape(spec.mesh.get_coord(r)) for r in range(4)]
[(2, 2), (2, 2), (2, 2), (1, 2)]
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .backend import is_device
from .mesh import ProcessMesh
from .placement import Partial, Placement, Replicate, Shard


def split_sizes(n: int, k: int) -> tuple[int, ...]:
    """numpy.array_split sizes of ``n`` items over ``k`` parts."""
    q, r = divmod(n, k)
    return tuple(q + 1 if i < r else q for i in range(k))


def split_offset(n: int, k: int, i: int) -> tuple[int, int]:
    """(start, length) of part ``i`` of ``n`` items split ``k`` ways."""
    q, r = divmod(n, k)
    return i * q + min(i, r), q + (1 if i < r else 0)


def contiguous(a: Any) -> Any:
    """``a`` as a C-contiguous array; 0-d stays 0-d (np.ascontiguousarray makes it 1-d). A
    device array stays on its device (Note [Array backends] in backend.py)."""
    if type(a) is not np.ndarray and not is_device(a):  # numpy arrays: no lookup
        a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def normalize_placements(placements: Any, mesh: ProcessMesh, ndim: int) -> tuple[Placement, ...]:
    """Check ``placements`` for a tensor of ``ndim`` axes on ``mesh``; negative Shard dims wrap."""
    if isinstance(placements, Placement) or not isinstance(placements, (list, tuple)):
        raise TypeError(
            f"placements must be a list with one Placement per mesh dim, got {placements!r}"
        )
    if len(placements) != mesh.ndim:
        raise ValueError(
            f"placements has {len(placements)} entries but the mesh has {mesh.ndim} dims "
            f"{mesh.dim_names} (shape {mesh.shape}); give one placement per mesh dim, "
            f"e.g. {[Replicate()] * mesh.ndim}"
        )
    out = []
    for m, p in enumerate(placements):
        if not isinstance(p, Placement):
            raise TypeError(
                f"placements[{m}] is {p!r}; use dt.Shard(dim), dt.Replicate() or dt.Partial()"
            )
        if isinstance(p, Shard):
            if not -ndim <= p.dim < ndim:
                raise ValueError(
                    f"placements[{m}] = {p!r} is out of range for a tensor with {ndim} axes"
                )
            if p.dim < 0:
                p = Shard(p.dim + ndim)
        out.append(p)
    return tuple(out)


@dataclass(frozen=True, eq=False)
class DistSpec:
    """How a global tensor of ``shape``/``dtype`` is laid out over ``mesh``. Hashable, cached on."""

    mesh: ProcessMesh
    placements: tuple[Placement, ...]
    shape: tuple[int, ...]
    dtype: np.dtype

    @staticmethod
    def make(
        mesh: ProcessMesh,
        placements: Sequence[Placement],
        shape: Sequence[int],
        dtype: Any,
        what: str = "DistSpec",
    ) -> DistSpec:
        """Validated constructor (the dataclass one trusts its arguments)."""
        if not isinstance(mesh, ProcessMesh):
            raise TypeError(f"{what}: mesh must be a dt.ProcessMesh, got {type(mesh).__name__}")
        try:
            shape = tuple(operator.index(s) for s in shape)
        except TypeError:
            raise TypeError(
                f"{what}: shape must be an int or a sequence of ints, got {shape!r}"
            ) from None
        if any(s < 0 for s in shape):
            raise ValueError(f"{what}: negative dimensions are not allowed, got shape {shape}")
        dtype = np.dtype(dtype)
        if dtype.kind not in "biufc":
            raise TypeError(f"{what}: dtype must be bool or numeric, got {dtype}")
        placements = normalize_placements(placements, mesh, len(shape))
        if dtype.kind not in "fc" and any(
            isinstance(p, Partial) and p.reduce_type == "avg" for p in placements
        ):
            raise TypeError(
                f"Partial(reduce_type='avg') needs a floating or complex dtype, got {dtype}; "
                "use Partial('sum') or cast first"
            )
        return DistSpec(mesh, placements, shape, dtype)

    def __hash__(self) -> int:  # cached: specs key every dispatch and reshard cache
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.mesh, self.placements, self.shape, self.dtype))
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, DistSpec):
            return NotImplemented
        # the fields, cheapest first: unequal specs differ in their shapes, dtypes or
        # placements before their meshes are compared (comparing the hashes first cost two
        # calls for every pair of equal specs)
        return (
            self.shape == other.shape
            and self.dtype == other.dtype
            and self.placements == other.placements
            and self.mesh == other.mesh
        )

    def __reduce__(self):  # the cached hash must not travel: string hashes differ per process
        # (nor the cached plain spec: it would be rebuilt from the fields anyway)
        return (DistSpec, (self.mesh, self.placements, self.shape, self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def replace(self, **kw: Any) -> DistSpec:
        return DistSpec(
            kw.get("mesh", self.mesh),
            tuple(kw.get("placements", self.placements)),
            tuple(kw.get("shape", self.shape)),
            kw.get("dtype", self.dtype),
        )

    def with_placement(self, mesh_dim: int, placement: Placement) -> DistSpec:
        p = list(self.placements)
        p[mesh_dim] = placement
        return self.replace(placements=p)

    def has_shard(self) -> bool:
        return any(p.is_shard() for p in self.placements)

    def has_partial(self) -> bool:
        return any(p.is_partial() for p in self.placements)

    def without_partials(self) -> DistSpec:
        """This spec with every Partial read as Replicate (what a reduction of them gives);
        cached, like the hash (autograd asks for it on every backward)."""
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self
            if self.has_partial():
                plain = self.replace(
                    placements=[Replicate() if p.is_partial() else p for p in self.placements]
                )
            object.__setattr__(self, "_plain", plain)
        return plain

    def kept(self, name: str, key: Any, make: Any, limit: int) -> Any:
        """``make()`` for ``key``, worked out once and kept in the small dict ``name`` on this
        spec (cleared when it holds ``limit`` keys): what an op works out from the spec
        alone, found again by the tensors of this spec, and gone with it (Note [Slice plans
        kept on the spec] in ops/shape.py, Note [Reshard targets kept on the spec] in
        tensor.py). ``key`` must be hashable (TypeError)."""
        table = self.__dict__.get(name)
        if table is None:
            table = {}
            object.__setattr__(self, name, table)
        hit = table.get(key)
        if hit is None:
            hit = make()
            if len(table) >= limit:
                table.clear()
            table[key] = hit
        return hit

    def local_box(self, coord: tuple[int, ...] | None) -> tuple[tuple[int, int], ...]:
        """(start, length) per tensor axis of the shard at mesh coordinate ``coord``."""
        return _local_box(self.mesh.shape, self.placements, self.shape, coord)

    def local_shape(self, coord: tuple[int, ...] | None) -> tuple[int, ...]:
        return tuple(n for _, n in self.local_box(coord))

    def local_slices(self, coord: tuple[int, ...] | None) -> tuple[slice, ...]:
        return tuple(slice(s, s + n) for s, n in self.local_box(coord))


@lru_cache(maxsize=4096)
def _local_box(
    mesh_shape: tuple[int, ...],
    placements: tuple[Placement, ...],
    shape: tuple[int, ...],
    coord: tuple[int, ...] | None,
) -> tuple[tuple[int, int], ...]:
    if coord is None:  # a rank outside the mesh holds nothing
        return tuple((0, 0) for _ in shape)
    box = [(0, n) for n in shape]
    for m, p in enumerate(placements):  # mesh-dim order: Note [Nested sharding]
        if isinstance(p, Shard):
            start, n = box[p.dim]
            off, size = split_offset(n, mesh_shape[m], coord[m])
            box[p.dim] = (start + off, size)
    return tuple(box)
