"""Rank-aware output: ``dt.print0`` prints once, ``dt.get_logger`` tags each line with its rank.

>>> import disttensor as dt
>>> _ = dt.simulate(4, dt.print0, "loss", 0.25)  # every rank calls it; rank 0 prints
loss 0.25

Note [Printing from every rank]
    Under ``mpiexec -n N`` every rank runs the same ``print``, so each line appears N times,
    interleaved. ``print0`` prints on rank 0 only, but it formats its arguments on *every*
    rank first: ``str`` of a DistTensor is collective (every rank of its mesh must take part),
    so a rank-0-only ``str`` would hang the others. It flushes by default, since mpiexec pipes
    each rank's stdout and a buffered line would come out late, out of order with stderr.

    Log records are the other way round: every rank may have something to say, so
    ``get_logger`` keeps all of them and puts ``[rank r]`` in front (``RankFilter`` gives any
    handler a ``rank`` field for its own format). The rank is read when the record is made,
    so under ``dt.simulate`` each simulated rank's thread tags its own lines.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from . import comm

__all__ = ["RankFilter", "get_logger", "print0"]


def print0(
    *args: Any, sep: str | None = " ", end: str | None = "\n", file: TextIO | None = None,
    flush: bool = True, rank: int = 0,
) -> None:  # fmt: skip
    """``print`` on rank ``rank`` (0) only; every rank formats the arguments (collective for
    DistTensors: every rank must call it) and the others print nothing.

    >>> import numpy as np, disttensor as dt
    >>> def show():
    ...     x = dt.shard_tensor(np.arange(3.0), dt.ProcessMesh([0, 1]), [dt.Shard(0)])
    ...     dt.print0("x =", x.numpy(), "on rank", dt.get_rank())
    >>> _ = dt.simulate(2, show)
    x = [0. 1. 2.] on rank 0
    """
    sep = " " if sep is None else sep
    end = "\n" if end is None else end
    text = sep.join(str(a) for a in args) + end  # on every rank: Note [Printing from every rank]
    if comm.get_rank() != rank:
        return
    stream = sys.stdout if file is None else file
    stream.write(text)
    if flush:
        stream.flush()


class RankFilter(logging.Filter):
    """Adds ``rank`` (and ``world_size``) to every record, for a format such as
    ``"[rank %(rank)s] %(message)s"``; with ``ranks`` it keeps only those ranks' records.

    >>> import logging, disttensor as dt
    >>> f = RankFilter(ranks=[1])
    >>> def keep():
    ...     record = logging.LogRecord("x", logging.INFO, __file__, 1, "hi", None, None)
    ...     return f.filter(record), record.rank
    >>> dt.simulate(2, keep)
    [(False, 0), (True, 1)]
    """

    def __init__(self, ranks: Iterable[int] | None = None) -> None:
        super().__init__()
        self.ranks = None if ranks is None else frozenset(ranks)

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = comm.get_rank()
        record.world_size = comm.get_world_size()
        return self.ranks is None or record.rank in self.ranks


class _Stderr(logging.StreamHandler):
    """A handler that writes to ``sys.stderr`` as it is when the record comes (so captured
    streams, notebooks and simulated sessions see the lines)."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # logging.StreamHandler assigns it; sys.stderr wins
        pass


DEFAULT_FORMAT = "[rank %(rank)s] %(levelname)s %(name)s: %(message)s"


def get_logger(
    name: str = "disttensor.user",
    level: int = logging.INFO,
    ranks: Iterable[int] | None = None,
    fmt: str = DEFAULT_FORMAT,
) -> logging.Logger:
    """The logger ``name`` with one handler writing to stderr, each line starting with its
    rank (``[rank 3] INFO name: message``); ``ranks`` keeps only those ranks' lines. Calling it
    again updates the handler, never adds a second one.

    >>> import contextlib, io, disttensor as dt
    >>> log = dt.get_logger("demo", ranks=[1])
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     _ = dt.simulate(2, lambda: log.info("step %d done", 3))
    >>> print(err.getvalue(), end="")
    [rank 1] INFO demo: step 3 done
    """
    logger = logging.getLogger(name)
    logger.setLevel(level)
    handler = next((h for h in logger.handlers if isinstance(h, _Stderr)), None)
    if handler is None:
        handler = _Stderr()
        logger.addHandler(handler)
        logger.propagate = False  # one line per record, not a second one from the root logger
    handler.filters = [RankFilter(ranks)]
    handler.setFormatter(logging.Formatter(fmt))
    return logger
