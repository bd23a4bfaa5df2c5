"""Communication: the current world communicator, per-group sub-communicators, and backends.

The world is MPI's COMM_WORLD (created on first use, so importing disttensor starts no MPI
work), except inside ``dt.simulate`` where each thread is a simulated rank of an in-process
world. Everything above this layer asks ``world()`` and never names a backend.
"""

from __future__ import annotations

import threading

from .base import Communicator, Work, add_observer, record, remove_observer


class _Context(threading.local):
    world: Communicator | None = None  # a class default: no AttributeError on the hot path


_ctx = _Context()
_mpi_world: Communicator | None = None


def _set_world(comm: Communicator | None) -> None:
    _ctx.world = comm


def world_size_in_context() -> int | None:
    """The size of a simulated world this thread runs in, else None."""
    w = _ctx.world
    return None if w is None else w.size


def world() -> Communicator:
    """The communicator of every rank: a simulated one inside dt.simulate, else MPI's."""
    w = _ctx.world
    if w is not None:
        return w
    global _mpi_world
    if _mpi_world is None:
        from .mpi import world_comm

        _mpi_world = world_comm()
    return _mpi_world


def group(ranks: tuple[int, ...]) -> Communicator:
    """The cached communicator of global ``ranks`` (collective over them on first use)."""
    w = world()
    try:
        return w.group(ranks)
    except ValueError:  # MPI's: a rank of ``ranks`` is not in this world
        if max(ranks) < w.size:
            raise
        raise ValueError(outside_world(tuple(ranks), w.size)) from None


def get_rank() -> int:
    """This process's (or simulated thread's) global rank."""
    w = world()
    return w.ranks[w.rank]


def get_world_size() -> int:
    return world().size


def barrier() -> None:
    """Block until every rank of the world gets here."""
    world().barrier()


from .threads import RankAborted, outside_world, simulate  # noqa: E402  (imports us lazily)

__all__ = [
    "Communicator",
    "RankAborted",
    "Work",
    "add_observer",
    "barrier",
    "get_rank",
    "get_world_size",
    "group",
    "record",
    "remove_observer",
    "simulate",
    "world",
]
