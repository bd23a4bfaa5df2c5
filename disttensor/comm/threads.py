"""In-process backend: N simulated ranks as threads of one process, no MPI needed.

Every collective is a rendezvous: each rank posts its buffer, all meet at a barrier, each
computes its own result from the posted buffers, and all meet again before the slots are
reused. A rank that raises aborts the others at their next rendezvous, and a rendezvous that
waits longer than ``timeout`` seconds fails with a message naming the collective, so a
mismatched program ends instead of hanging.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from . import agree
from .base import Communicator, Work, displacements, equal_counts, record, reduce_arrays


class RankAborted(RuntimeError):
    """Raised on simulated ranks that stop because another rank failed."""


class _World:
    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.timeout = timeout
        self.lock = threading.Lock()
        self.groups: dict[tuple[int, ...], _Group] = {}
        self.mailboxes: dict[tuple, queue.Queue] = {}
        self.failed: tuple[int, BaseException] | None = None

    def group(self, ranks: tuple[int, ...]) -> _Group:
        with self.lock:
            g = self.groups.get(ranks)
            if g is None:
                g = self.groups[ranks] = _Group(ranks, self)
            return g

    def mailbox(self, key: tuple) -> queue.Queue:
        with self.lock:
            return self.mailboxes.setdefault(key, queue.Queue())

    def fail(self, rank: int, exc: BaseException) -> None:
        with self.lock:
            if self.failed is None:
                self.failed = (rank, exc)
            groups = list(self.groups.values())
        for g in groups:
            g.barrier.abort()

    def check(self) -> None:
        if self.failed is not None:
            raise RankAborted(f"stopped because simulated rank {self.failed[0]} failed")

    def reset(self) -> None:
        """Forget a failure, so the ranks can go on (dt.simulated: the next statement).
        Only while no rank is inside a collective."""
        with self.lock:
            self.failed = None
            self.mailboxes.clear()  # sends nobody received belong to the failed statement
            groups = list(self.groups.values())
        for g in groups:
            g.barrier.reset()


class _Group:
    def __init__(self, ranks: tuple[int, ...], world: _World) -> None:
        self.ranks = ranks
        self.world = world
        self.slots: list[Any] = [None] * len(ranks)
        self.barrier = threading.Barrier(len(ranks))

    def _meet(self, what: str) -> None:
        try:
            self.barrier.wait(self.world.timeout)
        except threading.BrokenBarrierError:
            self.world.check()
            raise TimeoutError(
                f"{what} on ranks {list(self.ranks)} waited more than {self.world.timeout:g} s: "
                "some rank did not reach it. Every rank of the group must call the same "
                "collectives in the same order."
            ) from None

    def exchange(
        self,
        i: int,
        item: Any,
        what: str,
        compute: Callable[[list], Any],
        check: bool = False,
        agreement: Any = None,
    ) -> Any:
        """Post ``item``, then return ``compute(all posted items)`` once every rank has posted.
        Ranks that reached different collectives (``what``) raise a clear error, all of them,
        instead of mixing their buffers. Agreement checks (``check``) of different kinds do
        meet: comparing them is their purpose, and it gives the per-rank ``RanksDiverged``
        that MPI ranks get (MPI runs the checks on a channel of their own). ``agreement``: the
        fingerprint of this rank's call (Note [Ranks agree before a collective]), carried in
        this very exchange; if the ranks' differ, every rank gets MISMATCH, not a result."""
        self.world.check()
        self.slots[i] = (what, check, item, agreement)
        self._meet(what)
        try:
            posted = list(self.slots)
            first = posted[0][3]
            if first is not None and any(p[3] != first for p in posted):
                return MISMATCH  # every rank sees the same slots: all of them return this
            kinds = [p[0] for p in posted]
            if len(set(kinds)) > 1 and not all(p[1] for p in posted):
                raise RuntimeError(
                    f"ranks {list(self.ranks)} called different collectives at the same point: "
                    + ", ".join(f"rank {r}: {k}" for r, k in zip(self.ranks, kinds))
                    + ". Every rank must make the same collective calls in the same order "
                    "(printing, numpy(), float() or an op on some ranks only diverges them)"
                )
            return compute([p[2] for p in posted])
        finally:
            self._meet(what)  # nobody reuses the slots before everyone has read them


MISMATCH = object()  # exchange's answer when the ranks' agreements differ


class ThreadComm(Communicator):
    backend = "threads"

    def __init__(self, world: _World, ranks: tuple[int, ...], rank: int) -> None:
        super().__init__()
        self.world = world
        self.ranks = ranks
        self.rank = rank
        self.size = len(ranks)
        self._group = world.group(ranks)

    def _new_group(self, ranks):
        if max(ranks) >= self.world.size:  # a rendezvous nobody else would ever reach
            raise ValueError(outside_world(ranks, self.world.size))
        return ThreadComm(self.world, ranks, ranks.index(self.ranks[self.rank]))

    # Note [Ranks agree before a collective] (comm/agree.py), simulated: the ranks meet in
    # every collective anyway, so the agreement travels in the collective's own exchange (a
    # second rendezvous would cost a third of a simulated grid's time); only a mismatch
    # takes another round, to exchange the per-rank descriptions.
    _pending: tuple | None = None  # (kind, key, agreement) of the collective about to start

    def _mine(self, kind: str, key: tuple) -> Any:
        return agree.full(kind, key) if agree.DEBUG else agree.current(kind, key)

    def agree(self, kind, key):
        self._seq += 1
        if self.size == 1:
            return
        record("check", 16)
        mine = self._mine(kind, key)
        got = self._group.exchange(self.rank, None, kind, _ok, check=True, agreement=mine)
        if got is MISMATCH:
            self._diverged(kind, key)

    def _agree_before(self, kind, key, call):
        self._seq += 1
        if self.size > 1:
            record("check", 16)
            self._pending = (kind, key, self._mine(kind, key))
        return None  # the collective runs, and carries the agreement in its exchange

    def _diverged(self, kind: str, key: tuple):
        mine = (kind, agree.describe(kind, key, self._seq, self.ranks))
        calls = self._group.exchange(self.rank, mine, kind, list, check=True)
        raise agree.diverged(calls, self.ranks)

    def _x(self, item, what, compute):
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != what:  # checks off, or a 1-rank group
            return self._group.exchange(self.rank, item, what, compute)
        got = self._group.exchange(self.rank, item, what, compute, agreement=pending[2])
        if got is MISMATCH:
            self._diverged(pending[0], pending[1])
        return got

    def _allreduce(self, send, recv, op, what="all_reduce"):
        if send is recv:  # other ranks read the posted buffer while this one writes recv
            send = send.copy()

        def compute(items):
            recv[...] = reduce_arrays(items, op).reshape(recv.shape)

        self._x(send, what, compute)

    def _iallreduce(self, send, recv, op):
        # done at once, but met as a kind of its own: MPI never matches it with a blocking one
        self._allreduce(send, recv, op, "iall_reduce")
        return Work()

    def _allgather(self, send, recv, counts, what="all_gather"):
        def compute(items):
            flat = recv.reshape(-1)
            for d, c, a in zip(displacements(counts), counts, items):
                flat[d : d + c] = a.reshape(-1)

        self._x(send, what, compute)

    def _iallgather(self, send, recv, counts):
        # done at once, but met as a kind of its own (as _iallreduce)
        self._allgather(send, recv, counts, "iall_gather")
        return Work()

    def _reduce_scatter(self, send, recv, counts, op, what="reduce_scatter"):
        d = displacements(counts)[self.rank]
        c = counts[self.rank]

        def compute(items):
            mine = [a.reshape(-1)[d : d + c] for a in items]
            recv.reshape(-1)[...] = reduce_arrays(mine, op)

        self._x(send, what, compute)

    def _ireduce_scatter(self, send, recv, counts, op):
        # done at once, but met as a kind of its own (as _iallreduce)
        self._reduce_scatter(send, recv, counts, op, "ireduce_scatter")
        return Work()

    def _alltoall(self, send, send_counts, recv, recv_counts):
        send_counts = send_counts or equal_counts(send, self.size)
        recv_counts = recv_counts or equal_counts(recv, self.size)

        def compute(items):
            flat = recv.reshape(-1)
            for j, (d, c) in enumerate(zip(displacements(recv_counts), recv_counts)):
                their_buf, their_counts = items[j]
                start = displacements(their_counts)[self.rank]
                flat[d : d + c] = their_buf.reshape(-1)[start : start + c]

        self._x((send, list(send_counts)), "all_to_all", compute)

    def _broadcast(self, buf, root):
        def compute(items):
            if self.rank != root:
                buf[...] = items[root]

        self._x(buf, "broadcast", compute)

    def _box(self, src: int, dst: int, tag: int) -> queue.Queue:
        return self.world.mailbox((self.ranks, self.ranks[src], self.ranks[dst], tag))

    def _isend(self, buf, dest, tag):
        self._box(self.rank, dest, tag).put(buf.copy())  # any array type, as it is
        return Work()

    def _irecv(self, buf, source, tag):
        box = self._box(source, self.rank, tag)

        def wait() -> None:
            waited = 0.0
            while True:
                self.world.check()
                try:
                    buf[...] = box.get(timeout=0.05)
                    return
                except queue.Empty:
                    waited += 0.05
                    if waited > self.world.timeout:
                        raise TimeoutError(
                            f"recv on rank {self.ranks[self.rank]} from rank "
                            f"{self.ranks[source]} (tag {tag}) waited more than "
                            f"{self.world.timeout:g} s: no matching send"
                        ) from None

        return Work(wait)

    def _barrier(self):
        self._x(None, "barrier", lambda items: None)

    def _allgather_object(self, obj):
        return self._x(obj, "all_gather_object", list)


def _ok(items: list) -> bool:
    return True


def outside_world(ranks: tuple[int, ...], size: int) -> str:
    """The error for a group naming ranks this world does not have: usually data made on
    simulated ranks that have ended."""
    return (
        f"ranks {list(ranks)} cannot communicate here: this world has {size} "
        f"rank{'s' * (size != 1)}. Data made on simulated ranks (dt.simulate) cannot communicate "
        "once they have ended: return what you need (x.numpy(), str(x)) from the simulated "
        "function, or keep the ranks running with dt.simulated(n)"
    )


def simulate(
    world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 60.0, **kwargs: Any
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` as an SPMD program on ``world_size`` simulated ranks.

    Returns the per-rank results. If a rank raises, its exception is re-raised here (the
    others stop at their next collective). No MPI is involved.

    >>> import disttensor as dt
    >>> dt.simulate(3, dt.get_rank)
    [0, 1, 2]
    """
    from . import _set_world, world_size_in_context

    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"simulate needs a world_size >= 1, got {world_size!r}")
    if world_size_in_context() is not None:
        raise RuntimeError("dt.simulate cannot be nested inside another dt.simulate")
    world = _World(world_size, timeout)
    everyone = tuple(range(world_size))
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def run(rank: int) -> None:
        _set_world(ThreadComm(world, everyone, rank))
        try:
            results[rank] = fn(*args, **kwargs)
        except BaseException as e:
            errors[rank] = e
            world.fail(rank, e)
        finally:
            _set_world(None)

    threads = [threading.Thread(target=run, args=(r,), name=f"dt-rank-{r}") for r in everyone]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [
        (r, e) for r, e in enumerate(errors) if e is not None and not isinstance(e, RankAborted)
    ]
    if real:
        rank, exc = real[0]
        if hasattr(exc, "add_note"):
            exc.add_note(f"(raised on simulated rank {rank} of {world_size})")
        raise exc
    return results
