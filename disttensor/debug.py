"""Inspection tools: CommCounter and the report of communication outside SPMD rules."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from . import accounting, comm


class CommCounter:
    """Count the collectives this rank starts, by kind, and the bytes it hands to them.

    Kinds: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send, barrier,
    all_gather_object (small metadata). Bytes are the send buffer's size. The small check
    that precedes each collective (the ranks agree on the call first: Note [Ranks agree
    before a collective] in comm/agree.py) is counted apart, in ``checks``.

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
        self._outside: Counter[tuple[str, str]] = Counter()
        self.checks = 0  # agreement checks (Note [The check rides along] in comm/agree.py)

    def _observe(self, kind: str, nbytes: int) -> None:
        if kind == "check":
            self.checks += 1
            return
        self._counts[kind] += 1
        self._bytes[kind] += nbytes

    def _observe_outside(self, name: str, reason: str, nbytes: int) -> None:
        self._outside[name, reason] += 1

    def __enter__(self) -> CommCounter:
        comm.add_observer(self._observe)
        accounting.add_fallback_observer(self._observe_outside)
        return self

    def __exit__(self, *exc) -> None:
        comm.remove_observer(self._observe)
        accounting.remove_fallback_observer(self._observe_outside)

    @property
    def fallbacks(self) -> dict[tuple[str, str], int]:
        """Calls on this rank that communicated (or computed whole) outside an SPMD rule, by
        (op, reason): the replicate fallback, gathered keys, implicit conversions (see
        ``dt.fallback_report()``). Their collectives are in ``counts`` too."""
        return dict(self._outside)

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


@dataclass(frozen=True)
class FallbackRow:
    op: str
    reason: str
    calls: int
    bytes: int


class FallbackReport:
    """What communicated outside an SPMD rule in this process so far, by (op, reason):
    Note [Communication outside rules] in accounting.py. ``rows`` are FallbackRow(op, reason,
    calls, bytes), most bytes first; ``str()`` is a table. Under ``dt.simulate`` the counts are
    the simulated ranks' together; under mpiexec each rank has its own."""

    def __init__(self, rows: list[FallbackRow]) -> None:
        self.rows = rows

    @property
    def total_calls(self) -> int:
        return sum(r.calls for r in self.rows)

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def __str__(self) -> str:
        if not self.rows:
            return "no communication outside SPMD rules"
        head = ("op", "reason", "calls", "bytes")
        body = [(r.op, r.reason, str(r.calls), str(r.bytes)) for r in self.rows]
        widths = [max(len(x[i]) for x in [head, *body]) for i in range(4)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
        return "\n".join(lines)

    __repr__ = __str__


def fallback_report(reset: bool = False) -> FallbackReport:
    """The calls that communicated outside an SPMD rule so far (no communication itself);
    ``reset`` starts the count again.

    >>> import numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(6.0), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> _ = dt.fallback_report(reset=True)
    >>> _ = np.unwrap(x)  # no dt implementation: gathered, computed whole on every rank
    >>> [(r.op, r.calls, r.bytes) for r in dt.fallback_report().rows]
    [('unwrap', 1, 0)]
    """
    rows = [
        FallbackRow(op, reason, calls, nbytes)
        for (op, reason), (calls, nbytes) in accounting.FALLBACK_LOG.items()
    ]
    rows.sort(key=lambda r: (-r.bytes, -r.calls, r.op))
    if reset:
        accounting.FALLBACK_LOG.clear()
    return FallbackReport(rows)
