"""Inspection tools: CommCounter (more arrive with later issues)."""

from __future__ import annotations

from collections import Counter

from . import comm


class CommCounter:
    """Count the collectives this rank starts, by kind, and the bytes it hands to them.

    Kinds: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send, barrier,
    all_gather_object (small metadata). Bytes are the send buffer's size.

    >>> import disttensor as dt
    >>> def f():
    ...     mesh = dt.ProcessMesh([0, 1])
    ...     x = dt.ones((4, 2), mesh=mesh, placements=[dt.Shard(0)])
    ...     with dt.CommCounter() as cc:
    ...         dt.reshard(x, mesh, [dt.Replicate()])
    ...     return cc.counts
    >>> dt.simulate(2, f)[0]
    {'all_gather': 1}
    """

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._bytes: Counter[str] = Counter()

    def _observe(self, kind: str, nbytes: int) -> None:
        self._counts[kind] += 1
        self._bytes[kind] += nbytes

    def __enter__(self) -> CommCounter:
        comm.add_observer(self._observe)
        return self

    def __exit__(self, *exc) -> None:
        comm.remove_observer(self._observe)

    @property
    def counts(self) -> dict[str, int]:
        """Collectives by kind."""
        return dict(self._counts)

    @property
    def bytes(self) -> dict[str, int]:
        """Bytes sent by kind."""
        return dict(self._bytes)

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    @property
    def total_bytes(self) -> int:
        return sum(self._bytes.values())

    def __getitem__(self, kind: str) -> int:
        return self._counts[kind]

    def __repr__(self) -> str:
        return f"CommCounter(counts={self.counts}, bytes={self.bytes})"
