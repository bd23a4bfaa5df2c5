"""Communication: the current world communicator, per-group sub-communicators, and backends.

The world is MPI's COMM_WORLD (created on first use, so importing disttensor starts no MPI
work), except inside ``dt.simulate`` where each thread is a simulated rank of an in-process
world. Everything above this layer asks ``world()`` and never names a backend.
"""

from __future__ import annotations

import logging
import threading

from ..backend import current as current_backend
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
    """The cached communicator of global ``ranks`` (collective over them on first use); on a
    GPU, its device communicator where one serves it (``device_communicator``)."""
    w = world()
    try:
        g = w.group(ranks)
    except ValueError:  # MPI's: a rank of ``ranks`` is not in this world
        if max(ranks) < w.size:
            raise
        raise ValueError(outside_world(tuple(ranks), w.size)) from None
    if g.backend == "mpi" and current_backend().collectives is not None:
        return device_communicator(g)
    return g


# Note [Device communicators]
# On a GPU (a backend whose ``collectives`` names a device library: CuPy's says "nccl") the
# groups of the mesh dims move device arrays with that library: ``device_communicator``
# imports disttensor.comm.nccl and asks ``nccl_group`` for the group's NCCL communicator
# (collective over the group, made once and cached; host buffers and the agreement checks
# still go over MPI underneath). Where the module cannot be imported, or NCCL cannot serve
# the group (no library, two ranks on one GPU: ``nccl_group`` gives None and logs why), the
# MPI communicator itself is used, which stages device arrays through host memory (Note
# [Host staging] in comm/mpi.py). Rank 0 logs once which path is in use. Simulated ranks
# (threads) pass device arrays between each other directly and never get here.
_device_groups: dict[int, tuple[Communicator, Communicator]] = {}


def device_communicator(g: Communicator) -> Communicator:
    """``g``'s communicator for device data: NCCL's where it serves ``g``, else ``g`` (MPI,
    host staging); decided once per group (Note [Device communicators])."""
    hit = _device_groups.get(id(g))
    if hit is not None and hit[0] is g:
        return hit[1]
    try:
        from .nccl import nccl_group
    except ImportError as e:  # the module, or what it imports, is missing
        _say_once(f"host staging over MPI: disttensor.comm.nccl cannot be imported ({e})")
        dev = g
    else:
        dev = nccl_group(g) or g  # None: it said why, once
    _device_groups[id(g)] = (g, dev)
    return dev


_said: set[str] = set()


def _say_once(text: str) -> None:
    if text not in _said and get_rank() == 0:
        _said.add(text)
        logging.getLogger("disttensor").warning("disttensor: device %s", text)


def get_rank() -> int:
    """This process's (or simulated thread's) global rank."""
    w = world()
    return w.ranks[w.rank]


def get_world_size() -> int:
    """The number of ranks in the world: processes under ``mpiexec``, threads under
    ``dt.simulate``, 1 in a plain ``python``."""
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
    "device_communicator",
    "get_rank",
    "get_world_size",
    "group",
    "record",
    "remove_observer",
    "simulate",
    "world",
]
