"""Ranks agree on a collective before it starts, so diverged ranks get an error, not mixed data.

Note [Ranks agree before a collective]
    MPI matches collectives by order only: if rank 0 gathers x while rank 1 reduces y, MPI
    either mixes their buffers silently, fails with an internal error, or waits forever. So
    with every collective the comm layer issues, the ranks of its group check that they are
    making the same call, before any result is returned:

    * **By default** each rank hashes what must be equal on every rank of the group into a
      62-bit fingerprint: the collective's kind, dtype, element count or counts list, reduce
      op, root, and what the library is doing (the ``doing`` items the upper layers set: the
      op with its inputs' shapes, dtypes and placements, the reshard with its source and
      target specs and mesh, printing, ``numpy()``, ``float()``, backward, a DataParallel
      bucket, ...), and the lineage of the tensor a move is for (Note [Lineage names the
      tensor] in tensor.py: a hash of the ops, arguments and data that made it). So two
      ranks that make collectives of one kind and size for different reasons (rank 0 prints
      x while rank 1 reshards y; rank 0 gathers a while rank 1 gathers b of another shape or
      placements, or of the very same spec) differ too. The user's source line is left out:
      ranks may make the same call from different lines (``if rank == 0: print(x) else:
      str(x)``).
      How the fingerprints travel is Note [The check rides along]: under MPI, in the same
      message as a small collective's data. Point-to-point sends are not checked.
    * On a mismatch every rank of the group (all of them reached the check) exchanges a
      description of its call: the collective, what the library was doing and the user's
      source line, and raises :class:`RanksDiverged` with the per-rank diff, on every rank,
      before any result is returned.
    * ``DISTTENSOR_DEBUG=1`` compares those full descriptions (minus the source line) before
      every collective instead of the fingerprint: one small all-gather of text per
      collective. ``DISTTENSOR_CHECK=0`` turns the check off.

    A rank that never reaches the check (it left the job, or waits in another group) cannot
    be compared: that is the watchdog's part (comm/watchdog.py). Checks are counted apart from
    the collectives they guard (``CommCounter.checks``), so collective counts stay those of
    the program.

    What the library is doing costs little per collective: each ``doing`` item is described
    and hashed once per distinct (what, arguments), cached by that key (a list argument, the
    inputs of an op, keyed by its tensors' specs, which are all a label reads of them), and
    the items' hashes are combined in stack order.

Note [The check rides along]
    MPI matches collectives by order and nothing else, so a check carried *inside* a data
    collective cannot protect ranks whose calls differ in kind or size: an all-reduce on
    rank 0 against an all-gather on rank 1 waits for ever or mixes bytes inside MPI before
    any fingerprint in it could be compared. So every checked collective of a group, whatever
    its kind, dtype or size, starts with one and the same MPI call: the **envelope**, an
    all-gather of one fixed-size slot per rank on the group's own check channel (a duplicate
    of its communicator). A slot holds the rank's fingerprint, the byte size of its payload
    (-1: none) and the payload: the call's send data, where it fits in ``room`` bytes. Ranks
    in different calls still meet in the envelope, see every rank's fingerprint, and raise
    before any data call is issued.

    * Where every rank's payload fits (an 8-float all-reduce, a small gather, a barrier),
      the envelope *is* the collective: each rank computes its result from the gathered
      slots (reductions in rank order with the MPI backend's dtype rules: float16 summed in
      float32, bool as logical or/and, NaN-propagating max/min, 8- and 16-bit sums wrapping
      around; so every rank gets the same bits). One MPI call instead of the check's round
      trip plus the data call. (mpi.py: ``MPIComm._check`` and the kinds' pack and unpack
      functions; the all-reduce's and the all-gather's written out in ``MPIComm.allreduce`` and
      ``MPIComm.allgather``, each with a plan per call shape kept on the envelope.)
    * Otherwise (a payload too large on some rank, device buffers, a bare ``agree``) the
      envelope is the check alone and the data call follows, as before; the slot's size
      costs nothing next to such data.
    * ``room`` is the rank's share of 2 KiB of payload (mpi.ENVELOPE_BYTES divided by the
      ranks, a multiple of 16; the 16-byte header comes on top): 1024 bytes a rank on 2 ranks,
      512 on 4, 256 on 8, none from 256 ranks, so an envelope gathers at most 2 KiB of
      payload; beyond, 16 bytes a rank (the 16-byte all-reduce it replaces grew with the log
      of the ranks only). The slot is the same size whatever the call (ranks in different
      calls must still meet in one MPI call of one size), so its size is what the smallest
      collectives pay: on 2 ranks (MPICH 5.0.2) an all-gather of 2064-byte slots took 0.3 to
      0.9 us more than one of 1040, which in turn is within 0.1 us of a 32-byte one. The room
      is a round number where the ranks are a power of two because payloads often are: the
      half of a 256-element float64 vector (1 KiB, the gather of ``A @ p`` in a conjugate
      gradient) rides on 2 ranks in one call, where 1008 bytes of room took the envelope and
      then the data call (58.5 -> 50.2 us per iteration of that program).

    The alternatives, as raw mpi4py on 2 ranks (bench/collectives.py --alternatives; MPICH
    5.0.2, an 8-float all-reduce alone 3.42 us; docs/performance.md, "The agreement check
    before each collective"): the 16-byte all-reduce of (f, -f) before the data call (the
    check before issue 23) 6.99 us; that check started non-blocking and waited after the data
    call 6.18 us (on shared memory both collectives' work falls on the same cores) and it
    hangs in the data call where kinds differ; the fingerprint folded into an all-reduce's
    data as extra elements 4.58 us, but it protects only ranks that make the same kind of
    call of the same size (an all-reduce against an all-gather waits for ever in MPICH 5.0.2
    and Open MPI 5.0.11; all-reduces of 4 and 5 elements give rank 0 a truncation error and
    rank 1, under Open MPI, a half-reduced buffer); the envelope 3.77 us, since MPICH's
    all-gather of 2 KiB is cheaper than its all-reduce of 32 bytes. So the envelope.

    Which tensor a call is for, ``reshard.execute`` names: it sets the moved tensor's lineage
    on the thread's ``Stack`` (``lin``), which is folded into the fingerprint apart from the
    items (so a plan's cached fold of the items, ``mpi._folded``, stays good) and shown as
    ``tensor #...`` before the move's item, in messages only where it is what differs
    (``diverged``). Tensors the lineage does not know look alike (Note [Lineage names the
    tensor]).

    Simulated ranks (comm/threads.py) meet in every collective anyway: the fingerprint
    travels in the collective's own exchange. A device communicator (comm/nccl.py) checks
    over its MPI communicator's envelope, then moves device data over NCCL.
    ``DISTTENSOR_DEBUG=1`` compares the texts before the data call and never rides;
    ``DISTTENSOR_CHECK=0`` sends no envelope.
"""

from __future__ import annotations

import os
import re
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
class Stack(list):
    """What the library is doing on this thread: the ``doing`` items, outermost first, and in
    ``lin`` the lineage of the tensor a move is for (Note [Lineage names the tensor] in
    tensor.py), or None: folded into the fingerprint apart from the items, so a plan's
    cached fold of them stays good (mpi._folded), and named before the innermost item (the
    move's) in descriptions."""

    __slots__ = ("lin",)

    def __init__(self) -> None:
        super().__init__()
        self.lin: int | None = None


class _Doing(threading.local):
    stack: Stack | None = None


_doing = _Doing()


class doing:
    """Context manager: collectives started inside belong to ``what`` (a str, or a function
    called with ``args`` only when a description is needed, so setting it costs nothing).
    ``doing.fixed(item)`` enters an item that ``fixed_item`` made."""

    __slots__ = ("item",)

    def __init__(self, what: str | Callable[..., str], *args: Any) -> None:
        self.item = (what, args)

    @classmethod
    def fixed(cls, item: tuple) -> doing:
        d = cls.__new__(cls)
        d.item = item
        return d

    def __enter__(self) -> None:
        stack = _doing.stack
        if stack is None:
            stack = _doing.stack = Stack()
        stack.append(self.item)

    def __exit__(self, *exc: Any) -> None:
        _doing.stack.pop()


def context() -> str:
    """What the library is doing now, outermost first ("" when nothing is set)."""
    stack = _doing.stack
    if not stack:
        return ""
    parts = [_describe(item[0], item[1]) for item in stack]
    lin = stack.lin
    if lin is not None:
        parts.insert(len(parts) - 1, f"tensor #{lin & MASK:016x}")
    return " > ".join(parts)


def fixed_item(what: str | Callable[..., str], *args: Any) -> tuple:
    """A ``doing`` item whose description cannot change (its arguments are immutable: specs,
    names), with the hash of that description worked out now, once: a plan that repeats its
    collectives keeps one and enters it with ``doing.fixed``."""
    return (what, args, _hash(_describe(what, args).encode()))


def _describe(what: str | Callable[..., str], args: tuple) -> str:
    try:
        return what(*args) if callable(what) else what
    except Exception as e:  # a description must never hide the real error
        return f"<{type(e).__name__} describing the call>"


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
    fp = _hash(text)
    if len(FINGERPRINTS) > 65536:
        FINGERPRINTS.clear()
    FINGERPRINTS[kind, key] = fp
    return fp


def _hash(text: bytes) -> int:
    return ((zlib.crc32(text) << 32) | zlib.adler32(text)) & MASK


def current(kind: str, key: tuple) -> int:
    """The fingerprint of this rank's call now: ``fingerprint(kind, key)`` and what the
    library is doing (Note [Ranks agree before a collective])."""
    fp = FINGERPRINTS.get((kind, key))
    if fp is None:
        fp = fingerprint(kind, key)
    return in_context(fp) if _doing.stack else fp


def in_context(fp: int) -> int:
    """Fingerprint ``fp`` of a call with what the library is doing now folded in (``current``
    does it; a caller that keeps the call's own fingerprint calls it directly)."""
    stack = _doing.stack
    if stack:
        fp = with_items(fp, stack)
        lin = stack.lin  # the moved tensor's, apart (mpi._folded keeps the items' fold)
        if lin is not None:
            fp = with_tensor(fp, lin)
    return fp


def with_items(fp: int, stack: Stack) -> int:
    """Fingerprint ``fp`` with the items of ``stack`` folded in, not its ``lin``."""
    h = 0
    for item in stack:  # in order: "numpy() > reshard" is not "reshard > numpy()"
        h = (h * _MIX + _item_hash(item)) & MASK
    return fp ^ h


def with_tensor(fp: int, lin: int) -> int:
    """Fingerprint ``fp`` with the lineage ``lin`` of the moved tensor folded in."""
    return fp ^ ((lin * _MIX) & MASK)


_MIX = 0x100000001B3  # FNV's 64-bit prime
ITEMS: dict[Any, int] = {}  # a doing item's key -> the hash of its description


def _item_hash(item: tuple) -> int:
    """The hash of one ``doing`` item's description, cached by (what, arguments)."""
    if len(item) == 3:  # fixed_item's
        return item[2]
    what, args = item
    key: Any = item
    for a in args:
        if type(a) is list:  # an op's inputs: tensors, keyed by the specs their labels read
            key = (what, *[_specs(a) if type(a) is list else a for a in args])
            break
    try:
        h = ITEMS.get(key)
    except TypeError:  # an argument that cannot key a dict: described each time
        return _hash(_describe(what, args).encode())
    if h is None:
        h = _hash(_describe(what, args).encode())
        if len(ITEMS) > 4096:
            ITEMS.clear()
        ITEMS[key] = h
    return h


def _specs(tensors: list) -> tuple:
    return tuple(getattr(t, "_spec", t) for t in tensors)


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

_TENSOR = re.compile(r"tensor #[0-9a-f]{16} > ")
_TENSORS = (
    ". 'tensor #...' names the tensor a rank moves by a hash of the ops, arguments and data "
    "that made it: ranks that show different numbers move different tensors (made by other "
    "ops, or from other data or Python scalars on each rank)"
)

# called (no arguments) on each rank that is about to raise RanksDiverged: what the layers
# above keep per rank that the ranks' next calls depend on starts over (tensor.py's pending
# reductions, Note [Small reductions ride together])
WHEN_DIVERGED: list[Callable[[], None]] = []


def diverged(calls: list[tuple[str, str]], ranks: tuple[int, ...]) -> RanksDiverged:
    """The error every rank raises: each rank's (kind, description), one per line."""
    for fn in WHEN_DIVERGED:
        fn()
    # the moved tensors' numbers (Note [Lineage names the tensor] in tensor.py) are shown only
    # where they are what differs: the calls are otherwise alike
    texts = [text for _, text in calls]
    plain = [_TENSOR.sub("", text) for text in texts]
    calls_of = {t.split(" (call #")[0] for t in texts}
    tensors = len({t.split(" (call #")[0] for t in plain}) == 1 < len(calls_of)
    shown = texts if tensors else plain
    lines = "\n".join(f"  rank {r}: {text}" for r, text in zip(ranks, shown))
    kinds = {kind for kind, _ in calls}
    kind = kinds.pop() if len(kinds) == 1 else None
    if kind in HINTS:
        return RanksDiverged(
            f"ranks {list(ranks)} passed {kind} different values:\n{lines}\n{HINTS[kind]}"
        )
    hint = _COLLECTIVES + _TENSORS if tensors else _COLLECTIVES
    return RanksDiverged(
        f"ranks {list(ranks)} were about to make different collective calls:\n{lines}\n" + hint
    )
