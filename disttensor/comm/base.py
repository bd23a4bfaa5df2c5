"""The communicator interface every backend implements, and collective counting.

One calling convention: buffers are contiguous arrays of one dtype, counts are in elements, the
caller allocates receive buffers. ``op`` is one of "sum", "avg", "max", "min"; for bool arrays
sum and max are logical or, min is logical and (numpy's add/maximum/minimum on bools).
The comm layer knows arrays only, never DistTensor or placements.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..backend import is_device, xp
from . import agree

REDUCE_OPS = ("sum", "avg", "max", "min")


# Collective observers (dt.CommCounter) are per thread, so each simulated rank counts its own.
class _Observers(threading.local):
    fns: list | None = None  # a class default: no AttributeError raised on every collective


_observers = _Observers()


def add_observer(fn: Callable[[str, int], None]) -> None:
    """Call ``fn(kind, nbytes)`` for every collective this thread starts."""
    if _observers.fns is None:
        _observers.fns = []
    _observers.fns.append(fn)


def remove_observer(fn: Callable[[str, int], None]) -> None:
    _observers.fns.remove(fn)


def record(kind: str, nbytes: int) -> None:
    """Report one collective of ``kind`` moving ``nbytes`` (the send buffer handed to it);
    kind "check" is the agreement before a collective (Note [Ranks agree before a
    collective] in comm/agree.py)."""
    fns = _observers.fns
    if fns:
        for fn in fns:
            fn(kind, nbytes)


class Work:
    """Handle of a non-blocking call; ``wait()`` returns once the buffers are ready.

    ``test()`` asks without blocking whether the call has finished, and lets the backend
    progress it meanwhile (MPI implementations without an asynchronous progress thread move
    a non-blocking collective forward only inside MPI calls)."""

    def __init__(
        self, wait: Callable[[], None] | None = None, test: Callable[[], bool] | None = None
    ) -> None:
        self._wait = wait
        self._test = test

    def wait(self) -> None:
        if self._wait is not None:
            fn, self._wait = self._wait, None
            fn()

    def test(self) -> bool:
        if self._wait is None:
            return True
        if self._test is not None and self._test():
            self.wait()  # finished: run the completion step (e.g. a float16 copy back)
        return self._wait is None

    def is_completed(self) -> bool:
        return self._wait is None


class Communicator:
    """A group of ranks. ``rank``/``size`` are within the group; ``ranks`` are global ranks.

    Backends implement the ``_``-prefixed methods; the public ones validate, count and delegate.
    """

    rank: int
    size: int
    ranks: tuple[int, ...]
    backend: str = "?"

    def __init__(self) -> None:
        self._groups: dict[tuple[int, ...], Communicator] = {}
        self._seq = 0  # collectives started on this communicator (for diverged-rank messages)

    # -- groups ------------------------------------------------------------------------------
    def group(self, ranks: Sequence[int]) -> Communicator:
        """The sub-communicator of global ``ranks`` (which must hold this rank), created once.

        Creation is collective over the members only, so all of them must ask in the same order.
        """
        if type(ranks) is tuple:  # the meshes' own tuples: found without a new key
            g = self if ranks == self.ranks else self._groups.get(ranks)
            if g is not None:
                return g
        key = tuple(int(r) for r in ranks)
        if key == self.ranks:
            return self
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = self._new_group(key)
        return g

    # -- agreement (Note [Ranks agree before a collective] in comm/agree.py) -------------------
    def agree(self, kind: str, key: tuple) -> None:
        """Check that every rank of the group is about to do the same ``kind`` with an equal
        ``key`` (a tuple of values that must match on every rank: dtypes, ints, strs, tuples
        of those) for the same reason (what the library is doing), and raise
        ``RanksDiverged`` with each rank's call on every rank if not. Collective."""
        self._check(kind, key, None)

    def _check(self, kind: str, key: tuple, call: tuple | None) -> Any:
        """``agree``, offering the backend the collective's own arguments ``call`` to carry
        with the fingerprint (Note [The check rides along]; None: a bare agreement). Returns
        None when the collective has still to run, else what it returns where the backend
        carried it (True for a collective that returns nothing)."""
        self._seq += 1
        if self.size == 1:
            return None
        record("check", 16)
        if agree.DEBUG:
            mine = agree.full(kind, key)
            if all(t == mine for t in self._check_all(mine, kind)):
                return None
        else:
            same, out = self._check_fp(agree.current(kind, key), kind, call)
            if same:
                return out
        self._diverged(kind, key)

    def _diverged(self, kind: str, key: tuple) -> None:
        """After a check that found the ranks' calls differ (every rank of the group found it):
        raise ``RanksDiverged`` naming each rank's call, on every rank."""
        calls = self._check_all((kind, agree.describe(kind, key, self._seq, self.ranks)), kind)
        raise agree.diverged(calls, self.ranks)

    def _agree_before(self, kind: str, key: tuple, call: tuple) -> Any:
        """The agreement before a collective of ``kind`` with arguments ``call``: None when
        the collective has still to run, else its result (``_check``; MPI's backend carries
        small calls in its check). Simulated ranks carry the check in the collective's own
        exchange instead."""
        self.agree(kind, key)
        return None

    # -- collectives: each is checked, counted, then run unless the check carried it -----------
    def allreduce(self, send: np.ndarray, recv: np.ndarray | None, op: str = "sum") -> Any:
        """``recv`` gets the ``op``-reduction of every rank's ``send``; ``send is recv`` reduces
        in place; ``recv`` None: into a new array like ``send``. Returns ``recv``."""
        if recv is None:
            recv = xp(send).empty_like(send)
        carried = agree.CHECK and self._agree_before(
            "all_reduce", (send.dtype, send.size, op), (send, recv, op)
        )
        record("all_reduce", send.nbytes)
        if not carried:
            self._allreduce(send, recv, op)
        return recv

    def iallreduce(self, send: np.ndarray, recv: np.ndarray, op: str = "sum") -> Work:
        """Non-blocking ``allreduce`` (in place too): neither buffer may be touched until
        the returned Work's ``wait()``. Counted as an all_reduce; checked as a kind of its
        own, since MPI never matches it with a blocking one (a rank here and another in
        ``allreduce`` would wait for ever)."""
        work = None
        if agree.CHECK:
            key = (send.dtype, send.size, op)
            work = self._agree_before("iall_reduce", key, (send, recv, op))
        record("all_reduce", send.nbytes)
        return self._iallreduce(send, recv, op) if work is None else work

    def allgather(self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int]) -> None:
        """Rank i contributes ``counts[i]`` elements; ``recv`` gets them concatenated by rank.

        ``counts`` must be the same list on every rank of the group.
        """
        carried = agree.CHECK and self._agree_before(
            "all_gather", (send.dtype, tuple(counts)), (send, recv, counts)
        )
        record("all_gather", send.nbytes)
        if not carried:
            self._allgather(send, recv, counts)

    def iallgather(self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int]) -> Work:
        """Non-blocking ``allgather``: neither buffer may be touched until the returned Work's
        ``wait()``. Counted as an all_gather; checked as a kind of its own, as ``iallreduce``
        is."""
        work = None
        if agree.CHECK:
            key = (send.dtype, tuple(counts))
            work = self._agree_before("iall_gather", key, (send, recv, counts))
        record("all_gather", send.nbytes)
        return self._iallgather(send, recv, counts) if work is None else work

    def reduce_scatter(
        self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int], op: str = "sum"
    ) -> None:
        """``send`` holds ``sum(counts)`` elements; rank i receives the reduced block i."""
        carried = agree.CHECK and self._agree_before(
            "reduce_scatter", (send.dtype, tuple(counts), op), (send, recv, counts, op)
        )
        record("reduce_scatter", send.nbytes)
        if not carried:
            self._reduce_scatter(send, recv, counts, op)

    def ireduce_scatter(
        self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int], op: str = "sum"
    ) -> Work:
        """Non-blocking ``reduce_scatter``: neither buffer may be touched until the returned
        Work's ``wait()``. Counted as a reduce_scatter; checked as a kind of its own, as
        ``iallreduce`` is."""
        work = None
        if agree.CHECK:
            key = (send.dtype, tuple(counts), op)
            work = self._agree_before("ireduce_scatter", key, (send, recv, counts, op))
        record("reduce_scatter", send.nbytes)
        return self._ireduce_scatter(send, recv, counts, op) if work is None else work

    def alltoall(
        self,
        send: np.ndarray,
        send_counts: Sequence[int] | None,
        recv: np.ndarray,
        recv_counts: Sequence[int] | None,
    ) -> None:
        """Block i of ``send`` goes to rank i; block j of ``recv`` comes from rank j.

        Counts ``None`` means equal blocks on every rank of the group; only a caller can know
        that for all ranks (a rank's own counts may look equal when others' do not), and MPI
        runs equal-block all-to-all markedly faster.
        """
        carried = None
        if agree.CHECK:  # per-rank counts differ legitimately; equal blocks are equal sizes
            blocks = (send.size, "equal blocks") if send_counts is None else ()
            carried = self._agree_before(
                "all_to_all", (send.dtype, *blocks), (send, send_counts, recv, recv_counts)
            )
        record("all_to_all", send.nbytes)
        if not carried:
            self._alltoall(send, send_counts, recv, recv_counts)

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        carried = agree.CHECK and self._agree_before(
            "broadcast", (buf.dtype, buf.size, "root", root), (buf, root)
        )
        record("broadcast", buf.nbytes if self.rank == root else 0)
        if not carried:
            self._broadcast(buf, root)

    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Work:
        record("send", buf.nbytes)
        return self._isend(buf, dest, tag)

    def irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> Work:
        return self._irecv(buf, source, tag)

    def send(self, buf: np.ndarray, dest: int, tag: int = 0) -> None:
        self.isend(buf, dest, tag).wait()

    def recv(self, buf: np.ndarray, source: int, tag: int = 0) -> None:
        self.irecv(buf, source, tag).wait()

    def sendrecv(
        self, send: Any, dest: int | None, recv: Any, source: int | None, tag: int = 0
    ) -> None:
        """Send ``send`` to rank ``dest`` of this group and receive ``recv`` from rank
        ``source`` at once, returning when both are done (``send`` or ``recv`` None: that
        message is not made). The pair of a halo exchange in one call, with no deadlock
        whatever the ranks' order; counted as its send. Here: ``isend`` and ``irecv``, then
        both waits; MPI's backend makes one ``Sendrecv``."""
        works = []
        if send is not None:
            works.append(self.isend(send, dest, tag))
        if recv is not None:
            works.append(self.irecv(recv, source, tag))
        for work in works:
            work.wait()

    def barrier(self) -> None:
        carried = agree.CHECK and self._agree_before("barrier", (), ())
        record("barrier", 0)
        if not carried:
            self._barrier()

    def allgather_object(self, obj: Any) -> list[Any]:
        """Small metadata only (shapes, flags): pickled, never used for tensor data."""
        every = None
        if agree.CHECK:
            every = self._agree_before("all_gather_object", (), (obj,))
        record("all_gather_object", 0)
        return self._allgather_object(obj) if every is None else every

    # -- backend hooks -----------------------------------------------------------------------
    def _new_group(self, ranks: tuple[int, ...]) -> Communicator:
        raise NotImplementedError

    def _iallreduce(self, send: np.ndarray, recv: np.ndarray, op: str) -> Work:
        self._allreduce(send, recv, op)
        return Work()

    def _ireduce_scatter(self, send, recv, counts, op) -> Work:
        self._reduce_scatter(send, recv, counts, op)
        return Work()

    def _iallgather(self, send, recv, counts) -> Work:
        self._allgather(send, recv, counts)
        return Work()

    def _allreduce(self, send, recv, op):
        raise NotImplementedError

    def _allgather(self, send, recv, counts):
        raise NotImplementedError

    def _reduce_scatter(self, send, recv, counts, op):
        raise NotImplementedError

    def _alltoall(self, send, send_counts, recv, recv_counts):
        raise NotImplementedError

    def _broadcast(self, buf, root):
        raise NotImplementedError

    def _isend(self, buf, dest, tag):
        raise NotImplementedError

    def _irecv(self, buf, source, tag):
        raise NotImplementedError

    def _barrier(self):
        raise NotImplementedError

    def _allgather_object(self, obj):
        raise NotImplementedError

    def _check_fp(self, fp: int, kind: str, call: tuple | None = None) -> tuple[bool, Any]:
        """(whether every rank of the group passed the same ``fp``, None or the result of
        the collective ``kind`` with arguments ``call`` where the backend carried it with
        the fingerprint: ``_check``). Apart from data traffic; a rank left waiting here is
        reported as waiting in ``kind``."""
        raise NotImplementedError

    def _check_all(self, obj: Any, kind: str) -> list[Any]:
        """Every rank's ``obj`` (small text), apart from data traffic and counting."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.ranks}>"


def equal_counts(buf: np.ndarray, n: int) -> list[int]:
    """The counts of ``buf`` split into ``n`` equal blocks (alltoall with counts None)."""
    return [buf.size // n] * n


def displacements(counts: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


def reduce_arrays(arrays: Sequence[Any], op: str) -> Any:
    """The numpy reference of a reduction over ranks, used by the in-process backend; device
    arrays are reduced with their own array module, in the same order."""
    if type(arrays[0]) is not np.ndarray and is_device(arrays[0]):
        return _reduce_device(arrays, op)
    if op in ("sum", "avg"):
        out = np.array(arrays[0], copy=True)
        for a in arrays[1:]:
            out += a
        if op == "avg":
            out /= len(arrays)
        return out
    ufunc = np.maximum if op == "max" else np.minimum
    return ufunc.reduce(np.stack(arrays), axis=0)


def _reduce_device(arrays: Sequence[Any], op: str) -> Any:
    """``reduce_arrays`` of device arrays: a running sum, or pairwise maximum/minimum in rank
    order (what numpy's ``maximum.reduce`` over the stacked arrays computes); CuPy's ufuncs
    offer no ``reduce`` for every op."""
    out = arrays[0].copy()
    if op in ("sum", "avg"):
        for a in arrays[1:]:
            out += a
        if op == "avg":
            out /= len(arrays)
        return out
    f = getattr(xp(out), "maximum" if op == "max" else "minimum")
    for a in arrays[1:]:
        out = f(out, a)
    return out
