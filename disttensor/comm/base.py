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

REDUCE_OPS = ("sum", "avg", "max", "min")

# Collective observers (dt.CommCounter) are per thread, so each simulated rank counts its own.
_observers = threading.local()


def add_observer(fn: Callable[[str, int], None]) -> None:
    """Call ``fn(kind, nbytes)`` for every collective this thread starts."""
    if not hasattr(_observers, "fns"):
        _observers.fns = []
    _observers.fns.append(fn)


def remove_observer(fn: Callable[[str, int], None]) -> None:
    _observers.fns.remove(fn)


def record(kind: str, nbytes: int) -> None:
    """Report one collective of ``kind`` moving ``nbytes`` (the send buffer handed to it)."""
    fns = getattr(_observers, "fns", None)
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

    # -- groups ------------------------------------------------------------------------------
    def group(self, ranks: Sequence[int]) -> Communicator:
        """The sub-communicator of global ``ranks`` (which must hold this rank), created once.

        Creation is collective over the members only, so all of them must ask in the same order.
        """
        key = tuple(int(r) for r in ranks)
        if key == self.ranks:
            return self
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = self._new_group(key)
        return g

    # -- collectives -------------------------------------------------------------------------
    def allreduce(self, send: np.ndarray, recv: np.ndarray, op: str = "sum") -> None:
        """``recv`` gets the ``op``-reduction of every rank's ``send``; ``send is recv`` reduces
        in place."""
        record("all_reduce", send.nbytes)
        self._allreduce(send, recv, op)

    def iallreduce(self, send: np.ndarray, recv: np.ndarray, op: str = "sum") -> Work:
        """Non-blocking ``allreduce`` (in place too): neither buffer may be touched until
        the returned Work's ``wait()``."""
        record("all_reduce", send.nbytes)
        return self._iallreduce(send, recv, op)

    def allgather(self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int]) -> None:
        """Rank i contributes ``counts[i]`` elements; ``recv`` gets them concatenated by rank.

        ``counts`` must be the same list on every rank of the group.
        """
        record("all_gather", send.nbytes)
        self._allgather(send, recv, counts)

    def reduce_scatter(
        self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int], op: str = "sum"
    ) -> None:
        """``send`` holds ``sum(counts)`` elements; rank i receives the reduced block i."""
        record("reduce_scatter", send.nbytes)
        self._reduce_scatter(send, recv, counts, op)

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
        record("all_to_all", send.nbytes)
        self._alltoall(send, send_counts, recv, recv_counts)

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        record("broadcast", buf.nbytes if self.rank == root else 0)
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

    def barrier(self) -> None:
        record("barrier", 0)
        self._barrier()

    def allgather_object(self, obj: Any) -> list[Any]:
        """Small metadata only (shapes, flags): pickled, never used for tensor data."""
        record("all_gather_object", 0)
        return self._allgather_object(obj)

    # -- backend hooks -----------------------------------------------------------------------
    def _new_group(self, ranks: tuple[int, ...]) -> Communicator:
        raise NotImplementedError

    def _iallreduce(self, send: np.ndarray, recv: np.ndarray, op: str) -> Work:
        self._allreduce(send, recv, op)
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


def reduce_arrays(arrays: Sequence[np.ndarray], op: str) -> np.ndarray:
    """The numpy reference of a reduction over ranks, used by the in-process backend."""
    if op in ("sum", "avg"):
        out = np.array(arrays[0], copy=True)
        for a in arrays[1:]:
            out += a
        if op == "avg":
            out /= len(arrays)
        return out
    ufunc = np.maximum if op == "max" else np.minimum
    return ufunc.reduce(np.stack(arrays), axis=0)
