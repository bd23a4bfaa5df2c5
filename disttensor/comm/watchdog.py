"""No silent hangs under MPI: a rank waiting in a call that another rank will never make ends
the whole job with a message saying where it waited and why.

Note [Waiting for a rank that is gone]
    Every blocking MPI call of the backend (collectives, and the waits of non-blocking calls)
    is registered while it runs. A daemon thread looks at them twice a second:

    * A rank that leaves the job (its interpreter exits, by returning from the script or by
      ``sys.exit`` / ``SystemExit``) first tells every other rank so, point to point on a tag
      of its own (``goodbye``), then waits until every other rank has left too before MPI is
      finalized. A rank waiting in a call whose group holds a rank that has left can never
      finish: the watchdog prints the call, its group, the leaving rank and the waiting rank's
      Python stack, and aborts the job (exit code 1) within about a second. A rank that
      leaves while the others are still busy (rank 0 writing a file) just waits for them.
    * Any call waiting longer than ``DISTTENSOR_TIMEOUT`` seconds (default 300; 0: never) ends
      the job the same way: a rank that took another branch and waits in a collective of
      another group, or computes forever, would otherwise keep the others waiting for good.

    Ranks that reach *different* collectives of one group get a clear error at once instead
    (comm/agree.py: Note [Ranks agree before a collective]).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from threading import get_ident
from time import monotonic
from typing import Any

GOODBYE_TAG = 32011  # point-to-point tag of the leaving message; no other message uses it
_POLL = 0.5  # seconds between the watchdog's looks


def timeout() -> float:
    try:
        return float(os.environ.get("DISTTENSOR_TIMEOUT", "300"))
    except ValueError:
        return 300.0


class _Watch:
    """The blocking calls now running (per thread), the ranks known to have left."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[str, tuple[int, ...], float]] = {}
        self.gone: set[int] = set()
        self.thread: threading.Thread | None = None
        self.mpi: Any = None
        self.registered_exit = False

    def start(self, mpi: Any) -> None:
        if self.thread is not None:
            return
        self.mpi = mpi
        if mpi.COMM_WORLD.Get_size() == 1:
            return
        self.thread = threading.Thread(target=self._run, name="disttensor-watchdog", daemon=True)
        self.thread.start()
        if not self.registered_exit:  # after mpi4py's own exit hook: this runs first (LIFO)
            self.registered_exit = True
            atexit.register(self._leave)

    # enter and exit run around every blocking MPI call, so they take no lock: each thread
    # writes only its own key, a dict store or pop is atomic under the GIL, and the watchdog
    # thread reads a copy (dict.copy runs in C, without letting another thread in)
    def enter(self, what: str, ranks: tuple[int, ...]) -> int:
        key = get_ident()
        self.pending[key] = (what, ranks, monotonic())
        return key

    def exit(self, key: int) -> None:
        self.pending.pop(key, None)

    # -- the watchdog thread --------------------------------------------------------------
    def _run(self) -> None:
        limit = timeout()
        world = self.mpi.COMM_WORLD
        while True:
            time.sleep(_POLL)
            pending = self.pending.copy().items()
            if not pending:
                continue
            self._collect_goodbyes(world)
            now = time.monotonic()
            for thread, (what, ranks, t0) in pending:
                left = sorted(self.gone & set(ranks))
                if left:
                    names = ", ".join(map(str, left))
                    self._abort(
                        thread, what, ranks, now - t0,
                        f"rank{'s' if len(left) > 1 else ''} {names} left the job (the script "
                        "ended or called sys.exit there) and will never make this call",
                    )  # fmt: skip
                if limit > 0 and now - t0 > limit:
                    self._abort(
                        thread, what, ranks, now - t0,
                        f"no reply after DISTTENSOR_TIMEOUT={limit:g} s: another rank of the "
                        "group is not making the same call (a different branch, a different "
                        "collective, or a rank that stopped)",
                    )  # fmt: skip

    def _collect_goodbyes(self, world: Any) -> None:
        mpi = self.mpi
        status = mpi.Status()
        while world.Iprobe(source=mpi.ANY_SOURCE, tag=GOODBYE_TAG, status=status):
            source = status.Get_source()
            world.recv(source=source, tag=GOODBYE_TAG)
            self.gone.add(source)

    def _abort(self, thread: int, what: str, ranks, waited: float, why: str) -> None:
        rank = self.mpi.COMM_WORLD.Get_rank()
        frame = sys._current_frames().get(thread)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        sys.stderr.write(
            f"{stack}disttensor: rank {rank} has waited {waited:.1f} s in {what} over ranks "
            f"{list(ranks)}: {why}. Aborting the MPI job.\n"
        )
        sys.stderr.flush()
        sys.stdout.flush()
        time.sleep(0.2)  # let mpiexec forward the message before the job is killed
        self.mpi.COMM_WORLD.Abort(1)

    # -- leaving --------------------------------------------------------------------------
    def _leave(self) -> None:
        """At interpreter exit: tell every other rank, then wait until all have left."""
        mpi = self.mpi
        if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
            return
        world = mpi.COMM_WORLD
        rank, size = world.Get_rank(), world.Get_size()
        sends = [world.isend(rank, dest=r, tag=GOODBYE_TAG) for r in range(size) if r != rank]
        others = set(range(size)) - {rank}
        self.pending.clear()  # nothing of this rank waits any more: the thread stays quiet
        while not others <= self.gone:
            self._collect_goodbyes(world)
            time.sleep(0.01)
        mpi.Request.Waitall(sends)


WATCH = _Watch()
