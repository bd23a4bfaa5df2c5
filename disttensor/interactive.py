"""Simulated ranks at the prompt: ``sim = dt.simulated(4)``, then work statement by statement.

>>> import numpy as np, disttensor as dt
>>> sim = dt.simulated(4)
>>> mesh = sim.init_mesh((2, 2), dim_names=["dp", "mp"])
>>> x = sim.shard_tensor(np.arange(6.0).reshape(2, 3), mesh, [dt.Shard(0), dt.Shard(1)])
>>> x.local_shape  # differs by rank: one line per rank
rank 0: (1, 2)
rank 1: (1, 1)
rank 2: (1, 2)
rank 3: (1, 1)
>>> y = x.reshard(mesh, [dt.Replicate(), dt.Shard(1)])
>>> (y + 1).numpy()  # collective on every rank; they agree, so it shows once
array([[1., 2., 3.],
       [4., 5., 6.]])
>>> _ = sim.visualize_sharding(y, width=20, height=2)  # rank 0 prints
float64 (2, 3) on mesh dp=2 x mp=2: [Replicate(), Shard(dim=1)]
rows: axis 0, columns: axis 1
          0:2        2:3
    +-------------+-------+
0:2 |     0,2     |  1,3  |
    |             |       |
    +-------------+-------+
a,b: replicas, each holds the whole block
>>> with sim.explain() as report:
...     z = x.reshard(mesh, [dt.Replicate(), dt.Replicate()])
>>> report.counts
{'all_gather': 2}
>>> sim.close()

Note [Simulated sessions]
    ``dt.simulate(n, fn)`` runs one function on n threads and ends them; a session keeps
    its n rank threads (each with its simulated world, comm/threads.py) waiting for work, so
    values made by one statement are there for the next:

    * Every call on the session (``sim.shard_tensor(...)``: any ``dt`` name) or on a value it
      returned (a ``Ranked``: attribute access, calls, operators, indexing, numpy functions,
      ``with``) runs on every rank thread at once, with each Ranked argument replaced by that
      rank's value, and returns a Ranked of the per-rank results (None when all are None).
      ``sim.run(fn, *args)`` runs a function of your own the same way.
    * What the ranks print is kept per rank and printed by the calling thread afterwards, in
      rank order (a notebook shows it in the cell that ran the statement, not in the one that
      started the threads).
    * ``repr``/``str`` of a Ranked are every rank's text: once when all ranks agree (a
      DistTensor's global value, a shape), else one line (block) per rank; of dt.explain
      reports, rank 0's (each rank has its own, as under mpiexec). ``bool``,
      ``len``, ``float``, ``int`` and ``np.asarray`` need every rank to agree too;
      ``.per_rank`` gives the values themselves.
    * An exception on one rank stops the others at their next collective; the statement
      raises it (noting the rank), and the session goes on with the next one.
    * After ``close()`` (or the ``with`` block), the ranks are gone: using a Ranked raises a
      clear error, and a DistTensor taken out of one can no longer communicate (its mesh
      names ranks this world lacks: comm.group says so).
"""

from __future__ import annotations

import io
import operator
import queue
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .comm import _set_world
from .comm.threads import RankAborted, ThreadComm, _World
from .explain import Report, _set_origin, _where

__all__ = ["Ranked", "Session", "simulated"]


class Session:
    """``world_size`` simulated ranks kept running for statements at the prompt (Note
    [Simulated sessions]); ``timeout`` seconds for a collective some rank never reaches."""

    def __init__(self, world_size: int, timeout: float = 60.0) -> None:
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"dt.simulated needs a world_size >= 1, got {world_size!r}")
        self.world_size = world_size
        self._world = _World(world_size, timeout)
        self._inboxes: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(world_size)]
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # one statement at a time
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, args=(r,), name=f"dt-sim-rank-{r}", daemon=True)
            for r in range(world_size)
        ]
        for t in self._threads:
            t.start()

    # -- the rank threads ----------------------------------------------------------------
    def _serve(self, rank: int) -> None:
        if hasattr(signal, "pthread_sigmask"):  # Ctrl-C goes to the thread at the prompt
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        _set_world(ThreadComm(self._world, tuple(range(self.world_size)), rank))
        inbox = self._inboxes[rank]
        while True:
            task = inbox.get()
            if task is None:
                break
            fn, origin = task
            _set_origin(origin)  # dt.explain's source line for calls made for the prompt
            try:
                self._outbox.put((rank, True, fn(rank)))
            except BaseException as e:
                self._world.fail(rank, e)
                self._outbox.put((rank, False, e))
            finally:
                _set_origin(None)
        _set_world(None)

    def _each(self, fn: Callable[[int], Any]) -> list[Any]:
        """``fn(rank)`` on every rank thread; the per-rank results, or the first error."""
        if self._closed:
            raise RuntimeError(
                f"this simulated session of {self.world_size} ranks has been closed: its values "
                "cannot run anything now (.per_rank still holds them; start dt.simulated(n) "
                "again to go on)"
            )
        file, line, _ = _where()
        with self._lock:
            capture = _Capture({t.ident: r for r, t in enumerate(self._threads)})
            results: list[Any] = [None] * self.world_size
            errors: list[BaseException | None] = [None] * self.world_size
            interrupted = None
            try:
                for inbox in self._inboxes:
                    inbox.put((fn, (file, line) if file else None))
                pending = self.world_size
                while pending:
                    try:
                        rank, ok, value = self._outbox.get()
                    except KeyboardInterrupt as e:  # stop the ranks at their next collective
                        interrupted = e
                        self._world.fail(-1, e)
                        continue
                    pending -= 1
                    if ok:
                        results[rank] = value
                    else:
                        errors[rank] = value
            finally:
                capture.replay()
            if interrupted is not None or any(e is not None for e in errors):
                self._world.reset()  # every rank is back in its loop: the next statement runs
            if interrupted is not None:
                raise interrupted
        real = [(r, e) for r, e in enumerate(errors) if e is not None]
        if real:
            first = next(((r, e) for r, e in real if not isinstance(e, RankAborted)), real[0])
            rank, exc = first
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised on simulated rank {rank} of {self.world_size})")
            raise exc
        return results

    def _apply(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``fn(*args, **kwargs)`` on every rank, Ranked arguments replaced by the rank's value."""
        self._check_args(args, kwargs)

        def one(rank: int) -> Any:
            return _unwrap(fn, rank)(*_unwrap(args, rank), **_unwrap(kwargs, rank))

        values = self._each(one)
        if all(v is None for v in values):
            return None
        return Ranked(self, values)

    def _check_args(self, *trees: Any) -> None:
        for tree in trees:
            for r in _ranked_in(tree):
                if r._session is not self:
                    raise ValueError(
                        "a value of another simulated session: each session has its own ranks"
                    )

    # -- the public surface --------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on every rank (Ranked arguments: each rank's value); a Ranked
        of the results, or None when every rank returned None.

        >>> import disttensor as dt
        >>> with dt.simulated(3) as sim:
        ...     print(sim.run(lambda: dt.get_rank() * 10).per_rank)
        [0, 10, 20]
        """
        return self._apply(fn, args, kwargs)

    def close(self) -> None:
        """End the rank threads (values made on them stop working: Note [Simulated sessions])."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
            for inbox in self._inboxes:
                inbox.put(None)
        for t in self._threads:
            t.join(timeout=10)

    @property
    def closed(self) -> bool:
        return self._closed

    def __getattr__(self, name: str) -> Ranked:
        """``sim.NAME`` is ``dt.NAME`` on every rank: ``sim.shard_tensor(...)``, ``sim.nn``."""
        if name.startswith("_"):
            raise AttributeError(name)
        import disttensor

        try:
            value = getattr(disttensor, name)
        except AttributeError:
            raise AttributeError(f"disttensor has no {name!r} to run on the ranks") from None
        return Ranked(self, [value] * self.world_size)

    def __dir__(self) -> list[str]:
        import disttensor

        return sorted(set(super().__dir__()) | set(disttensor.__all__))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"<dt.simulated session: {self.world_size} ranks{state}>"


def simulated(world_size: int, timeout: float = 60.0) -> Session:
    """A session of ``world_size`` simulated ranks for the prompt or a notebook: every call on
    it, or on what it returns, runs on all ranks (Note [Simulated sessions]). Close it, or use
    ``with dt.simulated(n) as sim:``.

    >>> import disttensor as dt
    >>> with dt.simulated(2) as sim:
    ...     sim.get_rank()
    rank 0: 0
    rank 1: 1
    """
    return Session(world_size, timeout)


# -- per-rank values ---------------------------------------------------------------------------
class Ranked:
    """One value per rank of a simulated session; using it runs on every rank (Note
    [Simulated sessions]). ``per_rank`` is the list of values."""

    __slots__ = ("_session", "_values")
    __array_priority__ = 1000  # numpy hands ndarray + Ranked to Ranked.__radd__

    def __init__(self, session: Session, values: list[Any]) -> None:
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_values", list(values))

    @property
    def per_rank(self) -> list[Any]:
        """The values, rank 0 first (no communication)."""
        return list(self._values)

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._session._apply(fn, (self, *args), kwargs)

    def _agreed(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """``fn`` of every rank's value, which must be one value on all ranks."""
        got = self._session._each(lambda r: fn(self._values[r]))
        first = got[0]
        for v in got[1:]:
            same = v is first or (
                np.array_equal(v, first) if isinstance(v, np.ndarray) else v == first
            )
            if not same:
                raise ValueError(
                    f"{what} differs by rank ({_short(got)}); take one rank's value from "
                    ".per_rank[r]"
                )
        return first

    def _text(self, fn: Callable[[Any], str]) -> str:
        texts = self._session._each(lambda r: fn(self._values[r]))
        if all(t == texts[0] for t in texts):
            return texts[0]
        if all(isinstance(v, Report) for v in self._values):  # one report is what one reads
            return f"{texts[0]}\n(rank 0's report; every rank's: .per_rank)"
        sep = "\n" if any("\n" in t for t in texts) else " "
        return "\n".join(f"rank {r}:{sep}{t}" for r, t in enumerate(texts))

    def __repr__(self) -> str:
        return self._text(repr)

    def __str__(self) -> str:
        return self._text(str)

    def __format__(self, spec: str) -> str:
        return self._text(lambda v: format(v, spec))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # private names and IPython's display probes stay here
            raise AttributeError(name)
        return self._run(getattr, name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._run(setattr, name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._values[0])) | {"per_rank"})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._session._apply(self, args, kwargs)

    def __bool__(self) -> bool:
        return self._agreed("bool()", bool)

    def __len__(self) -> int:
        return self._agreed("len()", len)

    def __float__(self) -> float:
        return self._agreed("float()", float)

    def __int__(self) -> int:
        return self._agreed("int()", int)

    def __index__(self) -> int:
        return self._agreed("the index", operator.index)

    def __complex__(self) -> complex:
        return self._agreed("complex()", complex)

    def __contains__(self, item: Any) -> bool:
        return self._agreed("in", lambda v: item in v)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self._agreed("np.asarray", np.asarray)
        return out if dtype is None else out.astype(dtype, copy=False)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return self._session._apply(getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return self._session._apply(func, args, kwargs)

    def __enter__(self) -> Any:
        return self._run(lambda v: v.__enter__())

    def __exit__(self, *exc: Any) -> Any:
        got = self._run(lambda v: v.__exit__(*exc))
        return bool(got.per_rank[0]) if isinstance(got, Ranked) else None


def _method(fn: Callable[..., Any], reflected: bool = False) -> Callable[..., Any]:
    """A Ranked method that runs ``fn(value, *others)`` on every rank (``fn(other, value)``
    when ``reflected``)."""
    if reflected:
        return lambda self, other: self._session._apply(fn, (other, self), {})
    return lambda self, *others: self._run(fn, *others)


_BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor")
for _name in (*_BINARY, "lshift", "rshift"):
    _fn = getattr(operator, f"{_name}_" if _name in ("and", "or") else _name)
    setattr(Ranked, f"__{_name}__", _method(_fn))
    setattr(Ranked, f"__r{_name}__", _method(_fn, reflected=True))
    setattr(Ranked, f"__i{_name}__", _method(getattr(operator, f"i{_name}")))
_OTHER = ("lt", "le", "eq", "ne", "gt", "ge", "getitem", "setitem", "delitem", "neg", "pos")
for _name in (*_OTHER, "abs", "invert"):
    setattr(Ranked, f"__{_name}__", _method(getattr(operator, _name)))
Ranked.__hash__ = None  # type: ignore[assignment]  # == runs on the ranks


def _unwrap(tree: Any, rank: int) -> Any:
    """``tree`` with every Ranked replaced by its value on ``rank`` (in lists, tuples, dicts)."""
    if isinstance(tree, Ranked):
        return tree._values[rank]
    if type(tree) in (list, tuple):
        return type(tree)(_unwrap(t, rank) for t in tree)
    if type(tree) is dict:
        return {k: _unwrap(v, rank) for k, v in tree.items()}
    return tree


def _ranked_in(tree: Any):
    if isinstance(tree, Ranked):
        yield tree
    elif type(tree) in (list, tuple):
        for t in tree:
            yield from _ranked_in(t)
    elif type(tree) is dict:
        for v in tree.values():
            yield from _ranked_in(v)


def _short(values: list[Any]) -> str:
    text = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
    return text if len(text) <= 200 else text[:197] + "..."


# -- what the ranks print ----------------------------------------------------------------------
class _Capture:
    """While a statement runs, what the rank threads write to sys.stdout/sys.stderr is kept
    per rank; ``replay`` restores the streams and writes it, rank by rank (Note [Simulated
    sessions])."""

    def __init__(self, ranks: dict[int | None, int]) -> None:
        self.ranks = ranks
        self.saved = (sys.stdout, sys.stderr)
        self.kept = {(r, s): io.StringIO() for r in ranks.values() for s in (0, 1)}
        sys.stdout = _Demux(self.saved[0], self, 0)  # type: ignore[assignment]
        sys.stderr = _Demux(self.saved[1], self, 1)  # type: ignore[assignment]

    def replay(self) -> None:
        sys.stdout, sys.stderr = self.saved
        for r in sorted(set(self.ranks.values())):
            for s, stream in enumerate(self.saved):
                text = self.kept[r, s].getvalue()
                if text:
                    stream.write(text)
                    stream.flush()


class _Demux(io.TextIOBase):
    """A stream that keeps the rank threads' writes and passes the others' through."""

    def __init__(self, target: Any, capture: _Capture, which: int) -> None:
        self.target, self.capture, self.which = target, capture, which

    def write(self, text: str) -> int:
        rank = self.capture.ranks.get(threading.get_ident())
        if rank is None:
            return self.target.write(text)
        return self.capture.kept[rank, self.which].write(text)

    def flush(self) -> None:
        if threading.get_ident() not in self.capture.ranks:
            self.target.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", "utf-8")
