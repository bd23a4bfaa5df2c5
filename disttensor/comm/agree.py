"""Ranks agree on a collective before it starts, so diverged ranks get an error, not mixed data.

Note [Ranks agree before a collective]
    MPI matches collectives by order only: if rank 0 gathers x while rank 1 reduces y, MPI
    either mixes their buffers silently, fails with an internal error, or waits forever. So
    before every collective the comm layer issues, the ranks of its group check that they are
    about to make the same call:

    * **By default** each rank hashes what must be equal on every rank of the group (the
      collective's kind, dtype, element count or counts list, reduce op, root) into a 62-bit
      fingerprint, and the group takes the max of ``(f, -f)`` in one all-reduce of 16 bytes on
      a duplicate of the group's communicator (so it never meets a data collective). Equal
      fingerprints give ``max f == min f``. The price is one small round trip per collective
      (docs/performance.md measures it); point-to-point sends are not checked.
    * On a mismatch every rank of the group (all of them reached the check) exchanges a
      description of its call: the collective, what the library was doing (the op, the
      reshard with its placements, shape and dtype, printing, ...: the ``doing`` context the
      upper layers set) and the user's source line, and raises :class:`RanksDiverged` with
      the per-rank diff, on every rank, before any data moves.
    * ``DISTTENSOR_DEBUG=1`` compares those full descriptions (minus the source line, which
      may legitimately differ) before every collective instead of the fingerprint: one small
      all-gather of text per collective. ``DISTTENSOR_CHECK=0`` turns the check off.

    A rank that never reaches the check (it left the job, or waits in another group) cannot
    be compared: that is the watchdog's part (comm/watchdog.py). Checks are counted apart from
    the collectives they guard (``CommCounter.checks``), so collective counts stay those of
    the program.
"""

from __future__ import annotations

import os
import sys
import threading
import zlib
from collections.abc import Callable
from typing import Any

_mode = os.environ.get("DISTTENSOR_CHECK", "1").strip()
CHECK = _mode not in ("", "0", "off", "false")
DEBUG = os.environ.get("DISTTENSOR_DEBUG", "").strip() not in ("", "0", "off", "false")
MASK = (1 << 62) - 1


class RanksDiverged(RuntimeError, ValueError):
    """The ranks of a group were about to make different collective calls, or passed
    different values where every rank must pass the same (raised on every rank of the group,
    before any data moved). A ValueError too: diverged arguments are bad input."""


def set_checks(on: bool | None = None, debug: bool | None = None) -> tuple[bool, bool]:
    """Turn the check (and its full, debug form) on or off for this process; returns the
    previous (on, debug). Every rank must make the same setting."""
    global CHECK, DEBUG
    prev = (CHECK, DEBUG)
    if on is not None:
        CHECK = bool(on)
    if debug is not None:
        DEBUG = bool(debug)
    return prev


# -- what the library is doing: set by the layers above (tensor, dispatch, reshard) -----------
class _Doing(threading.local):
    stack: list | None = None


_doing = _Doing()


class doing:
    """Context manager: collectives started inside belong to ``what`` (a str, or a function
    called with ``args`` only when a description is needed, so setting it costs nothing)."""

    __slots__ = ("item",)

    def __init__(self, what: str | Callable[..., str], *args: Any) -> None:
        self.item = (what, args)

    def __enter__(self) -> None:
        stack = _doing.stack
        if stack is None:
            stack = _doing.stack = []
        stack.append(self.item)

    def __exit__(self, *exc: Any) -> None:
        _doing.stack.pop()


def context() -> str:
    """What the library is doing now, outermost first ("" when nothing is set)."""
    stack = _doing.stack
    if not stack:
        return ""
    parts = []
    for what, args in stack:
        try:
            parts.append(what(*args) if callable(what) else what)
        except Exception as e:  # a description must never hide the real error
            parts.append(f"<{type(e).__name__} describing the call>")
    return " > ".join(parts)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_THREADING = os.path.abspath(threading.__file__)  # simulated ranks start in its frames


def user_line() -> str:
    """``file:line`` of the innermost frame outside disttensor (the user's call), or ""."""
    frame = sys._getframe(1)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_PACKAGE) and name != _THREADING:
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


# -- fingerprints and descriptions ------------------------------------------------------------
FINGERPRINTS: dict[tuple, int] = {}  # (kind, key) -> fingerprint: a training loop repeats


def fingerprint(kind: str, key: tuple) -> int:
    """A 62-bit hash of (kind, key), the same in every process (no Python hash seed);
    remembered for the next call with an equal key."""
    text = f"{kind}{key!r}".encode()
    fp = ((zlib.crc32(text) << 32) | zlib.adler32(text)) & MASK
    if len(FINGERPRINTS) > 65536:
        FINGERPRINTS.clear()
    FINGERPRINTS[kind, key] = fp
    return fp


def describe(kind: str, key: tuple, seq: int, ranks: tuple[int, ...]) -> str:
    """This rank's call, for the error message."""
    doing_now = context()
    line = user_line()
    call = f"{kind} {_key_text(key)}" if key else kind  # "barrier", not "barrier  (call"
    text = f"{call} (call #{seq} on ranks {list(ranks)})"
    if doing_now:
        text = f"{doing_now} > {text}"
    return f"{text} at {line}" if line else text


def full(kind: str, key: tuple) -> str:
    """DISTTENSOR_DEBUG's fingerprint: the call and what the library is doing."""
    doing_now = context()
    return f"{doing_now} > {kind} {_key_text(key)}" if doing_now else f"{kind} {_key_text(key)}"


def _key_text(key: tuple) -> str:
    """``float64, 8, sum``: dtypes by name, the rest as they print."""
    return ", ".join(getattr(k, "name", None) or str(k) for k in key) if key else ""


# What to do when every rank is at the same agreement but with other values (the others:
# collectives reached in different orders or with different buffers).
HINTS = {
    "shard_tensor": "every rank must pass shard_tensor the same global data, dtype and "
    "placements (values that differ by rank, e.g. an unseeded random draw, give every rank "
    "another tensor); or pass src=rank to take the data from one rank",
    "dtensor_from_local": "every rank must pass the same global_shape, dtype and placements, "
    "and a local shard of the shape its box has (shards follow numpy.array_split)",
    "optimizer step": "every rank must compute the same gradients before opt.step() (a "
    "backward, or a gradient set by hand, on some ranks only would update some shards and not "
    "the others); the digits are the parameters with (1) and without (0) a gradient",
    "random draw": "every rank must draw from the same stream: call dt.manual_seed with the "
    "same seed on every rank, and make the same sequence of dt.rand/dt.randn calls (each "
    "rank draws its own shard of one global tensor)",
}
_COLLECTIVES = (
    "Every rank of a mesh must make the same collective calls in the same order: printing, "
    "numpy(), float(), reshard, backward or an op that communicates on some ranks only, or "
    "with other shapes or placements per rank, diverges them"
)


def diverged(calls: list[tuple[str, str]], ranks: tuple[int, ...]) -> RanksDiverged:
    """The error every rank raises: each rank's (kind, description), one per line."""
    lines = "\n".join(f"  rank {r}: {text}" for r, (_, text) in zip(ranks, calls))
    kinds = {kind for kind, _ in calls}
    kind = kinds.pop() if len(kinds) == 1 else None
    if kind in HINTS:
        return RanksDiverged(
            f"ranks {list(ranks)} passed {kind} different values:\n{lines}\n{HINTS[kind]}"
        )
    return RanksDiverged(
        f"ranks {list(ranks)} were about to make different collective calls:\n{lines}\n"
        + _COLLECTIVES
    )
