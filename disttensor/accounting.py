"""Accounting of the communication that no SPMD rule planned (Note [Communication outside
rules]). Below tensor.py and dispatch.py: both account here.

Note [Communication outside rules]
    Every communication that an op's SPMD rule did not plan is accounted here: the replicate
    fallback (no rule, or arguments the dt op does not take), gathers for keys and values
    that have no rule (integer-array and boolean keys, a slice of a split axis that had to
    move), and implicit conversions to numpy (np.asarray(x), a numpy ``out=``). Each call is
    counted per (op name, reason) with the bytes this rank handed to collectives for it
    (process-wide in FALLBACK_LOG; per rank and per block in dt.CommCounter().fallbacks), and
    logged once per (op, reason), at WARNING, by rank 0. dt.fallback_report() shows the table.
    One row is not communication but its cousin, a copy between a device and the host: a
    fallback on device tensors whose function the device's array module lacks runs numpy's
    on host copies (dispatch.NO_DEVICE_FUNCTION, 0 bytes; Note [The replicate fallback on a
    device] in dispatch.py).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from . import comm

log = logging.getLogger("disttensor")

FALLBACKS: Counter[str] = Counter()  # op name -> calls that communicated outside a rule
FALLBACK_LOG: dict[tuple[str, str], list[int]] = {}  # (op, reason) -> [calls, bytes]
NO_RULE = "no SPMD rule: inputs gathered, computed whole on every rank"
_LOGGED: set[tuple[str, str]] = set()
_fallback_observers = threading.local()


def add_fallback_observer(fn: Callable[[str, str, int], None]) -> None:
    """Call ``fn(op, reason, nbytes)`` for every accounted call on this thread."""
    if not hasattr(_fallback_observers, "fns"):
        _fallback_observers.fns = []
    _fallback_observers.fns.append(fn)


def remove_fallback_observer(fn: Callable[[str, str, int], None]) -> None:
    _fallback_observers.fns.remove(fn)


class outside_rules:
    """``with outside_rules(op, reason): ...`` accounts one call and the bytes the block
    hands to collectives (Note [Communication outside rules]). ``always``: count it even when
    it moved nothing (a fallback on a 1-rank mesh or Replicate inputs still does not split
    the work); else only when a collective ran."""

    __slots__ = ("always", "name", "nbytes", "reason", "started")

    def __init__(self, name: str, reason: str, always: bool = True) -> None:
        self.name, self.reason, self.always = name, reason, always
        self.nbytes = self.started = 0

    def _seen(self, kind: str, nbytes: int) -> None:
        if kind != "check":  # the agreement before a collective is not the collective
            self.started += 1
            self.nbytes += nbytes

    def __enter__(self) -> outside_rules:
        comm.add_observer(self._seen)
        return self

    def __exit__(self, *exc: Any) -> None:
        comm.remove_observer(self._seen)
        if exc[0] is None and (self.always or self.started):
            note_outside_rules(self.name, self.reason, self.nbytes)


def note_outside_rules(name: str, reason: str, nbytes: int) -> None:
    """Account one call of ``name`` that moved ``nbytes`` outside its rule for ``reason``."""
    FALLBACKS[name] += 1
    entry = FALLBACK_LOG.setdefault((name, reason), [0, 0])
    entry[0] += 1
    entry[1] += nbytes
    for fn in getattr(_fallback_observers, "fns", ()):
        fn(name, reason, nbytes)
    if (name, reason) not in _LOGGED and comm.get_rank() == 0:
        _LOGGED.add((name, reason))
        log.warning(
            "disttensor: %s communicates outside an SPMD rule (%s); see dt.fallback_report()",
            name,
            reason,
        )
