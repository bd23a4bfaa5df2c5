"""What ``dt.compile`` records while a step runs eagerly (Note [Compiled steps] in
capture.py): the array computations of the lower layers, as events on numbered slots.

The layers that make local arrays (dispatch's kernels, reshard's moves, the in-place writes)
report each computation here while a recording is on in their thread; everything else that
could make a replay wrong (an array of unknown origin, a write nobody reported, data handed to
Python, a collective outside a reported move) refuses the recording, and the step stays eager.
This module knows arrays and callables only; it imports nothing of the package.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np


class _On(threading.local):
    rec: Recorder | None = None  # this thread's recording (each simulated rank has its own)


on = _On()


class Slot:
    """An argument of an event that is the array in slot ``i``."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __eq__(self, other: object) -> bool:
        return type(other) is Slot and other.i == self.i

    def __hash__(self) -> int:
        return hash(("slot", self.i))


class Name:
    """A value that names, never computes (a lineage for the agreement check): not compared
    between recordings, the latest one replayed."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v


class Recorder:
    """One recording: slots (arrays by identity, kept alive so that ids stay theirs), events
    ``(kind, fn, args, kwargs, outputs)`` with slots and constants in ``args``/``kwargs``, and
    the first reason the recording cannot be replayed (``why``)."""

    def __init__(self) -> None:
        self.slots: dict[int, int] = {}
        self.arrays: list[Any] = []
        self.events: list[tuple] = []
        self.why: str | None = None
        self.depth = 0  # > 0: inside a reported computation, whose parts are not events
        self.declared: Any = None  # the array the next reported write is into

    # -- slots ---------------------------------------------------------------------------------
    def slot(self, a: Any) -> int:
        """A new slot for array ``a`` (or its existing one)."""
        i = self.slots.get(id(a))
        if i is not None and self.arrays[i] is a:
            return i
        i = len(self.arrays)
        self.slots[id(a)] = i
        self.arrays.append(a)
        return i

    def known(self, a: Any) -> int | None:
        i = self.slots.get(id(a))
        return i if i is not None and self.arrays[i] is a else None

    def constant(self, a: Any) -> None:
        """``a`` is an array the program made from Python values (``np.arange(k)`` as an
        operand): a constant of the recording (a slot no event makes), unless it already is a
        slot (an input)."""
        self.slot(a)

    def refuse(self, why: str) -> None:
        if self.why is None:
            self.why = why

    # -- events --------------------------------------------------------------------------------
    def _template(self, v: Any) -> Any:
        t = type(v)
        if t is np.ndarray:
            i = self.known(v)
            if i is None:
                self.refuse(f"an array of shape {v.shape} whose making was not recorded")
                return v
            return Slot(i)
        if t is tuple:
            return tuple(self._template(x) for x in v)
        if t is list:
            return [self._template(x) for x in v]
        if t is dict:
            return {k: self._template(x) for k, x in v.items()}
        return v

    def event(self, kind: str, fn: Any, args: tuple, kwargs: dict, outs: tuple) -> None:
        """Record ``fn(*args, **kwargs)``: kind "one" made array ``outs[0]``, "many" the tuple of
        arrays ``outs``, "write" wrote into array ``outs[0]`` (which the next noted write must
        be: ``wrote``)."""
        targs = self._template(args)
        tkw = self._template(kwargs)
        if kind == "write":
            slots = (self.known(outs[0]),)
            self.declared = outs[0]
        else:
            slots = tuple(self.slot(o) for o in outs)
        self.events.append((kind, fn, targs, tkw, slots))

    def wrote(self, a: Any) -> None:
        """A write into array ``a`` is being noted: it must be the one just reported, else
        the recording is refused."""
        if self.declared is a:
            self.declared = None
        else:
            self.refuse("an in-place write of a kind compile does not replay")


def run(fn: Any, args: tuple, kwargs: dict | None = None, name: int = -1) -> Any:
    """``fn(*args, **kwargs)``, an array computation; recorded as one event (its inner
    computations and collectives are part of it) when this thread records, not inside another
    event. ``name``: the position of an argument that only names (a lineage: ``Name``)."""
    kwargs = kwargs or {}
    rec = on.rec
    if rec is None or rec.depth:
        return fn(*args, **kwargs)
    rec.depth += 1
    try:
        out = fn(*args, **kwargs)
    finally:
        rec.depth -= 1
    if name >= 0:
        args = (*args[:name], Name(args[name]), *args[name + 1 :])
    if type(out) is tuple:
        rec.event("many", fn, args, kwargs, out)
    else:
        rec.event("one", fn, args, kwargs, (out,))
    return out


def write(fn: Any, target: Any, args: tuple, kwargs: dict | None = None) -> None:
    """``fn(*args, **kwargs)`` writes into array ``target``; recorded as a write event."""
    kwargs = kwargs or {}
    rec = on.rec
    if rec is None or rec.depth:
        fn(*args, **kwargs)
        return
    rec.depth += 1
    try:
        fn(*args, **kwargs)
    finally:
        rec.depth -= 1
    rec.event("write", fn, args, kwargs, (target,))


def data_out(what: str) -> None:
    """Data of a tensor reaches Python (``float(x)``, ``x.numpy()``, ``x.to_local()``,
    ``print``): a recording made now cannot be replayed (the step's Python may depend on it)."""
    rec = on.rec
    if rec is not None and not rec.depth:
        rec.refuse(f"{what} hands a tensor's data to Python")
