"""Placements: how a tensor lies along one mesh dim.

Frozen values with exact reprs and no communication code (that lives in ``reshard.py``):

>>> Shard(0), Replicate(), Partial()
(Shard(dim=0), Replicate(), Partial(reduce_type='sum'))
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

REDUCE_TYPES = ("sum", "avg", "max", "min")


class Placement:
    """Base of the three placement kinds; ``is_shard()`` and friends avoid isinstance chains."""

    __slots__ = ()

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self) -> bool:
        return False


@dataclass(frozen=True)
class Shard(Placement):
    """Split tensor axis ``dim`` among the ranks of the mesh dim (numpy.array_split sizes)."""

    dim: int

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool):
            raise TypeError(f"Shard(dim) needs an int tensor axis, got {self.dim!r}")
        try:
            object.__setattr__(self, "dim", operator.index(self.dim))  # numpy ints too
        except TypeError:
            raise TypeError(f"Shard(dim) needs an int tensor axis, got {self.dim!r}") from None

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim


@dataclass(frozen=True)
class Replicate(Placement):
    """Every rank of the mesh dim holds the whole value."""

    def is_replicate(self) -> bool:
        return True


@dataclass(frozen=True)
class Partial(Placement):
    """The true value is the ``reduce_type`` reduction of the ranks' local values.

    See Note [Partial order] in spec.py for several Partial mesh dims at once.
    """

    reduce_type: str = "sum"

    def __post_init__(self) -> None:
        if self.reduce_type not in REDUCE_TYPES:
            raise ValueError(
                f"Partial(reduce_type={self.reduce_type!r}) is not supported; "
                f"use one of {', '.join(map(repr, REDUCE_TYPES))}"
            )

    def is_partial(self) -> bool:
        return True


def commutes(a: str, b: str) -> bool:
    """Whether reducing by ``a`` then ``b`` equals ``b`` then ``a`` (sum and avg are linear)."""
    return a == b or {a, b} == {"sum", "avg"}
