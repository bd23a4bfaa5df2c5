"""``dt.explain``: what a block of code communicated, op by op, and why.

>>> import numpy as np, disttensor as dt
>>> def step():
...     mesh = dt.ProcessMesh([0, 1], dim_names=["x"])
...     a = dt.shard_tensor(np.arange(8.0).reshape(4, 2), mesh, [dt.Shard(0)])
...     with dt.explain() as report:
...         total = float(a.sum())  # a Partial sum, reduced by float()
...     return report.counts, report.entries[-1].what
>>> dt.simulate(2, step)[0]
({'all_reduce': 1}, 'float() > numpy()')

Note [Explain hooks]
    Explaining must cost nothing when no explain is active, so it is an observer of hooks
    that exist anyway, plus one flag test on dispatch's general path:

    * ``dispatch`` calls ``HOOKS.on_op`` instead of its general path while ``HOOKS.active``
      (some thread explains); the call is decided again from the decision cache (no rule
      runs twice) for the input and required placements, then runs as usual inside an open
      entry. A cached call that moves nothing never reaches the general path (Note [Dispatch
      fast path] in dispatch.py), so such calls are not seen; every call that communicates
      is, since its plan moves data.
    * Every collective reaches the comm layer's observers (``comm.add_observer``), per thread:
      it goes to the innermost open op entry, else to an entry for the call outside dispatch
      that made it, named by what the library says it is doing (``comm.agree.doing``:
      ``numpy()``, ``print (repr)``, ``float()``, ``backward``, a DataParallel bucket), else by
      the library function the user called (``reshard``, ``Optimizer.step``, ``median``).
      Consecutive collectives of one such call share an entry. So every collective is
      attributed, and the entries' counts add up to ``Report.counts``: the totals of a
      ``dt.CommCounter`` that records alongside.
    * Inside an entry, a collective made by ``reshard.execute`` (its ``doing`` item holds the
      source and target specs) is the next communicating step of that reshard's cached plan,
      which names the mesh dim.
    * Communication outside rules (``accounting``'s fallback observers) adds its reason to the
      open op entry, or to the entry of the call that just communicated on the same line.
    * Why an op's inputs moved (``Entry.why``): for an op call whose plan moves an input, the
      rule runs once more, on this thread, with the einsum core recording what it priced on
      each mesh dim (Note [What a rule considered] in spmd/core.py). Only here: dispatch
      never asks, so a program that does not explain prices no alternatives.

    The source line is the innermost frame outside disttensor, numpy and threading (as in
    ``comm.agree.user_line``); the simulated session (``dt.simulated``) gives the prompt's
    line for calls that have no such frame on a rank's thread (``_set_origin``).
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import accounting, comm
from .comm import agree
from .debug import CommCounter

__all__ = ["Choice", "Collective", "Entry", "Move", "Report", "explain"]

_COMMUNICATING = frozenset({"all_gather", "all_reduce", "reduce_scatter", "all_to_all"})


class _Hooks:
    """The hook points dispatch calls (Note [Explain hooks]); ``active`` counts the threads
    explaining now, so dispatch tests one attribute."""

    __slots__ = ("active", "lock")

    def __init__(self) -> None:
        self.active = 0
        self.lock = threading.Lock()

    def on_op(self, general: Callable, op: Any, args: tuple, attrs: dict, key: Any, entry: Any):
        """Run ``general(op, args, attrs, key, entry)`` (dispatch's general path) inside an op
        entry of this thread's report, if it has one."""
        rec = _local.report
        if rec is None:  # another thread explains
            return general(op, args, attrs, key, entry)
        e = rec._open_op(op, args, attrs)
        try:
            out = general(op, args, attrs, key, entry)
        finally:
            rec._close_op(e)
        if e is not None:
            e.outputs = _outputs(out)
        return out


HOOKS = _Hooks()


class _Local(threading.local):
    report: Report | None = None
    origin: tuple[str, int] | None = None  # Note [Explain hooks]: the prompt's line


_local = _Local()


def _set_origin(origin: tuple[str, int] | None) -> None:
    """Source line (file, line) for this thread's calls that have no frame outside the
    package (the simulated session's rank threads run the prompt's calls)."""
    _local.origin = origin


# -- records ---------------------------------------------------------------------------------
@dataclass
class Collective:
    """One collective: its kind, the mesh dim it ran over (None where no reshard step names
    it) and the bytes this rank handed to it."""

    kind: str
    dim: str | None
    nbytes: int


@dataclass
class Move:
    """One reshard of a tensor (``src`` -> ``dst``, DistSpecs) and the collectives it ran."""

    src: Any
    dst: Any
    collectives: list[Collective] = field(default_factory=list)


@dataclass
class Choice:
    """Why an op's rule required the placements it did on one mesh dim (``dim``, its name;
    ``mesh_dim``, its index) where an input moved: ``reason``, one line, and where the
    einsum core priced ways to run the op there (Note [What a rule considered] in
    spmd/core.py), ``current`` (the inputs' placements it started from), ``candidates``
    (``disttensor.spmd.core.Candidate``: per input and output a placement, the price and the
    moves it is priced as) and ``chosen``, the index of the one it took; ``candidates`` is
    empty where the rule prices no alternatives on that mesh dim."""

    dim: str
    mesh_dim: int
    reason: str
    current: tuple = ()
    candidates: list[Any] = field(default_factory=list)
    chosen: int | None = None

    @property
    def taken(self) -> Any:
        """The candidate the rule took (None where it priced none)."""
        return self.candidates[self.chosen] if self.chosen is not None else None

    @property
    def rejected(self) -> list[Any]:
        """The other candidates (each placement once), cheapest first (in the order the rule
        tried them on a tie)."""
        taken = self.taken
        if taken is None:
            return []
        seen = {(taken.inputs, taken.output)}
        others = []
        for c in self.candidates:
            if (c.inputs, c.output) not in seen:
                seen.add((c.inputs, c.output))
                others.append(c)
        return sorted(others, key=lambda c: c.cost)


@dataclass
class Entry:
    """One op call on dispatch's general path (``op`` True), or one call outside dispatch
    that communicated: what it was, where (``file``, ``line``, ``source``), the rule (None for
    the replicate fallback and for calls outside dispatch), the reasons it communicated
    outside rules (``fallbacks``: (op, reason) pairs), and for ops, the inputs (argument
    position, DistSpec it had, DistSpec the rule required, and the position of the first
    argument that is the same tensor moved the same way: Note [One move per input] in
    dispatch.py) and output DistSpecs; ``why``: for an op whose inputs moved, a Choice per
    mesh dim where one did (Note [Explain hooks])."""

    what: str
    op: bool
    file: str = ""
    line: int = 0
    context: str = ""  # what the library was doing around it ("backward", ...)
    rule: str | None = None
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    inputs: list[tuple[int, Any, Any, int]] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)  # those outside a reshard
    checks: int = 0
    why: list[Choice] = field(default_factory=list)

    @property
    def source(self) -> str:
        """The text of the source line ("" when unknown)."""
        return linecache.getline(self.file, self.line).strip() if self.file else ""

    @property
    def where(self) -> str:
        """``path:line`` (relative to the working directory when under it)."""
        if not self.file:
            return "<unknown>"
        path = self.file
        cwd = os.getcwd() + os.sep
        if path.startswith(cwd):
            path = path[len(cwd) :]
        return f"{path}:{self.line}"

    def all_collectives(self) -> list[Collective]:
        """Its collectives: those of its reshards, then the others."""
        return [c for m in self.moves for c in m.collectives] + self.collectives

    @property
    def counts(self) -> dict[str, int]:
        """Collectives by kind."""
        return dict(Counter(c.kind for c in self.all_collectives()))

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.all_collectives())

    @property
    def shown(self) -> bool:
        """Listed by ``str(report)``: it communicated or went outside rules."""
        return bool(self.fallbacks) or bool(self.moves) or bool(self.collectives)


# -- the report --------------------------------------------------------------------------------
class Report:
    """What the code run under it communicated on this rank: ``entries`` (Entry, in order),
    ``counts``/``bytes`` by kind (as ``dt.CommCounter`` counts them), ``checks``,
    ``fallbacks``; ``str()`` is the readable report, ``text(all_ops=True)`` also lists the
    op calls that moved nothing. A context manager, or made by ``dt.explain(fn, ...)``."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.result: Any = None  # fn's return value (dt.explain(fn, ...))
        self.rank: int | None = None
        self.world_size: int | None = None
        self._counter = CommCounter()  # the totals: CommCounter's, by construction
        self._open: list[Entry] = []  # op entries being run, innermost last
        self._last: tuple | None = None  # (key, entry) of the last call outside dispatch
        self._moves: dict[int, tuple[Any, Move, list]] = {}  # id(doing item) -> its reshard
        self._state = "new"

    # -- recording -----------------------------------------------------------------------
    def __enter__(self) -> Report:
        if self._state != "new":
            raise RuntimeError("a dt.explain report records once; make a new one")
        if _local.report is not None:
            raise RuntimeError("dt.explain is already recording on this thread")
        self._state = "recording"
        self.rank, self.world_size = comm.get_rank(), comm.get_world_size()
        _local.report = self
        self._counter.__enter__()
        comm.add_observer(self._collective)
        accounting.add_fallback_observer(self._fallback)
        with HOOKS.lock:
            HOOKS.active += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        with HOOKS.lock:
            HOOKS.active -= 1
        comm.remove_observer(self._collective)
        accounting.remove_fallback_observer(self._fallback)
        self._counter.__exit__(*exc)
        _local.report = None
        self._state = "done"
        self._open.clear()
        self._moves.clear()
        self._last = None

    def _open_op(self, op: Any, args: tuple, attrs: dict) -> Entry | None:
        from .dispatch import _normalize_and_decide

        try:  # the decision cache answers (the call itself decides first otherwise)
            plan, _, pos, tensors, _ = _normalize_and_decide(op, args, attrs, None)
        except Exception:  # the call raises the same error itself
            plan = None
        if plan is None:  # no DistTensor, or bad input: not an op on tensors
            self._open.append(None)
            return None
        targets, _, out_shapes, _, _ = plan
        file, line, _ = _where()
        rule = op.rule if out_shapes is not None else None  # None: the replicate fallback
        e = Entry(op.name, True, file, line, _context(), rule)
        seen: dict[tuple, int] = {}  # Note [One move per input]: a tensor twice moves once
        for i, t, target in zip(pos, tensors, targets):
            e.inputs.append((i, t._spec, target, seen.setdefault((id(t), target), i)))
        if rule is not None and plan[3] is not None:  # an input moves: ask the rule why
            try:
                e.why = _why(op, tuple(pos), len(args), attrs, [t._spec for t in tensors], targets)
            except Exception:  # explaining must never break the program
                e.why = []
        self.entries.append(e)
        self._open.append(e)
        self._last = None
        return e

    def _close_op(self, e: Entry | None) -> None:
        self._open.pop()

    def _collective(self, kind: str, nbytes: int) -> None:
        e = self._target()
        if kind == "check":
            e.checks += 1
            return
        move, dim = self._move_of(kind, e)
        c = Collective(kind, dim, nbytes)
        (move.collectives if move is not None else e.collectives).append(c)

    def _target(self) -> Entry:
        """The entry a collective belongs to (Note [Explain hooks])."""
        for e in reversed(self._open):
            if e is not None:
                return e
        file, line, api = _where()
        context = _context()
        label = context or _api_name(api)
        key = (label, file, line, id(api))
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        e = Entry(label, False, file, line, context)
        self.entries.append(e)
        self._last = (key, e)
        return e

    def _move_of(self, kind: str, e: Entry) -> tuple[Move | None, str | None]:
        """The reshard a collective belongs to (the innermost one running) and its mesh dim."""
        from .reshard import _path, describe

        for item in reversed(agree._doing.stack or ()):
            if item[0] is not describe:
                continue
            hit = self._moves.get(id(item))
            if hit is None or hit[0] is not item:
                src, dst = item[1]
                steps = []
                if src.mesh == dst.mesh:
                    path = _path(src, dst)
                    steps = [s for s, _ in path if s.kind in _COMMUNICATING]
                hit = self._moves[id(item)] = (item, Move(src, dst), steps)
                e.moves.append(hit[1])
            _, move, steps = hit
            n = sum(1 for c in move.collectives if c.kind in _COMMUNICATING)
            dim = None
            if kind in _COMMUNICATING and n < len(steps) and steps[n].kind == kind:
                dim = move.src.mesh.dim_names[steps[n].mesh_dim]
            return move, dim
        return None, None

    def _fallback(self, name: str, reason: str, nbytes: int) -> None:
        for e in reversed(self._open):
            if e is not None:
                e.fallbacks.append((name, reason))
                return
        file, line, _ = _where()
        last = self._last[1] if self._last is not None else None
        if last is not None and (last.file, last.line) == (file, line):
            if not last.fallbacks:
                last.what = name
            last.fallbacks.append((name, reason))
            return
        e = Entry(name, False, file, line, _context(), fallbacks=[(name, reason)])
        self.entries.append(e)
        self._last = ((name, file, line, None), e)

    # -- results -------------------------------------------------------------------------
    @property
    def counts(self) -> dict[str, int]:
        """Collectives by kind, as ``dt.CommCounter().counts`` (the entries add up to it)."""
        return self._counter.counts

    @property
    def bytes(self) -> dict[str, int]:
        """Bytes this rank handed to collectives, by kind."""
        return self._counter.bytes

    @property
    def total_bytes(self) -> int:
        return self._counter.total_bytes

    @property
    def checks(self) -> int:
        """Agreement checks before the collectives (CommCounter.checks)."""
        return self._counter.checks

    @property
    def fallbacks(self) -> dict[tuple[str, str], int]:
        """Calls outside SPMD rules by (op, reason), as ``dt.CommCounter().fallbacks``."""
        return self._counter.fallbacks

    def text(self, all_ops: bool = False) -> str:
        """The report; ``all_ops`` also lists the op calls that moved nothing."""
        blocks: list[list] = []  # [where, source, lines, times]: equal neighbours once
        hidden_ops = hidden_other = 0
        for e in self.entries:
            if not (e.shown or (all_ops and e.op)):
                if e.op:
                    hidden_ops += 1
                else:
                    hidden_other += 1
                continue
            body = _entry_lines(e)
            if blocks and blocks[-1][0] == e.where and blocks[-1][2] == body:
                blocks[-1][3] += 1
            else:
                blocks.append([e.where, e.source, body, 1])
        lines: list[str] = []
        where = None
        for block_where, source, body, times in blocks:
            if block_where != where:
                where = block_where
                lines.append(f"{where}  {source}".rstrip())
            lines.append(body[0] + (f"  (x{times})" if times > 1 else ""))
            lines += body[1:]
        lines.append(self._totals(hidden_ops, hidden_other))
        return "\n".join(lines)

    def _totals(self, hidden_ops: int, hidden_other: int) -> str:
        counts = self.counts
        n = sum(counts.values())
        kinds = ", ".join(f"{k} {c}" for k, c in sorted(counts.items()))
        text = f"total: {_plural(n, 'collective')}"
        if n:
            text += f" ({kinds}), {self.total_bytes} bytes"
        nf = sum(self.fallbacks.values())
        text += f"; calls outside SPMD rules: {nf}; agreement checks: {self.checks}"
        rest = []
        if hidden_ops:
            rest.append(f"{_plural(hidden_ops, 'op call')} that moved nothing")
        if hidden_other:
            rest.append(f"{_plural(hidden_other, 'call')} with agreement checks only")
        if rest:
            text += "\nnot listed: " + ", ".join(rest)
        return text

    def __str__(self) -> str:
        return self.text()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython, Jupyter: the text
        printer.text(self.text())

    def __repr__(self) -> str:
        return (
            f"<dt.explain report: {len(self.entries)} entries, counts {self.counts}, "
            f"{self.total_bytes} bytes>"
        )


def explain(fn: Callable[..., Any] | None = None, *args: Any, **kwargs: Any) -> Report:
    """Run ``fn(*args, **kwargs)`` and return the Report of its communication on this rank
    (``report.result`` is fn's value); with no ``fn``, a Report to use as ``with
    dt.explain() as report:``. Each rank reports its own; print rank 0's.

    >>> import numpy as np, disttensor as dt
    >>> def f():
    ...     mesh = dt.ProcessMesh([0, 1])
    ...     x = dt.shard_tensor(np.ones((4, 3)), mesh, [dt.Shard(0)])
    ...     return dt.explain(dt.reshard, x, mesh, [dt.Replicate()]).counts
    >>> dt.simulate(2, f)
    [{'all_gather': 1}, {'all_gather': 1}]
    """
    report = Report()
    if fn is None:
        if args or kwargs:
            raise TypeError("dt.explain() takes arguments only after a function to run")
        return report
    with report:
        report.result = fn(*args, **kwargs)
    return report


# -- helpers ---------------------------------------------------------------------------------
def _outputs(out: Any) -> list[Any]:
    from .tensor import DistTensor

    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o._spec for o in outs if isinstance(o, DistTensor)]


def _context() -> str:
    """What the library is doing now, without the reshards and op labels (which the entry
    shows itself): ``backward``, ``numpy()``, ``print (repr)``, ..."""
    from .dispatch import _label
    from .reshard import describe

    parts = []
    for item in agree._doing.stack or ():
        what, args = item[0], item[1]
        if what is describe or what is _label:
            continue
        try:
            parts.append(what(*args) if callable(what) else what)
        except Exception as e:  # a label must never break the program
            parts.append(f"<{type(e).__name__}>")
    return " > ".join(parts)


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SKIPPED = (
    os.path.dirname(os.path.abspath(np.__file__)) + os.sep,
    os.path.abspath(threading.__file__),
    # the simulated session's own frames: the library function is the one it called
    os.path.join(_PACKAGE, "interactive.py"),
)
_KINDS: dict[str, int] = {}  # file name -> 0 user, 1 disttensor, 2 skipped


def _kind(filename: str) -> int:
    k = _KINDS.get(filename)
    if k is None:
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        k = 2 if path.startswith(_SKIPPED) else 1 if path.startswith(_PACKAGE) else 0
        _KINDS[filename] = k
    return k


def _where() -> tuple[str, int, Any]:
    """(file, line) of the innermost user frame, and the outermost disttensor frame it
    called (the library function the user called; None when there is none)."""
    frame = sys._getframe(1)
    api = None
    while frame is not None:
        k = _kind(frame.f_code.co_filename)
        if k == 0:
            return frame.f_code.co_filename, frame.f_lineno, api
        if k == 1:
            api = frame
        frame = frame.f_back
    origin = _local.origin
    return (*origin, api) if origin is not None else ("", 0, api)


def _api_name(frame: Any) -> str:
    """The library function the user called: its qualified name, or the numpy function
    that numpy handed to ``__array_function__``/``__array_ufunc__``."""
    if frame is None:
        return "communication"
    code = frame.f_code
    if code.co_name in ("__array_function__", "__array_ufunc__"):
        local = frame.f_locals
        fn = local.get("func", local.get("ufunc"))
        if fn is not None:
            return f"np.{getattr(fn, '__name__', fn)}"
    return getattr(code, "co_qualname", code.co_name)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _pl(p: Any) -> str:
    if p.is_shard():
        return f"S({p.dim})"
    if p.is_partial():
        return f"P({p.reduce_type})"
    return "R"


def placements_text(placements: Any) -> str:
    """``[S(0), P(sum)]``: Shard(0), Partial("sum"); R is Replicate.

    >>> import disttensor as dt
    >>> placements_text([dt.Shard(1), dt.Replicate(), dt.Partial("max")])
    '[S(1), R, P(max)]'
    """
    return "[" + ", ".join(_pl(p) for p in placements) + "]"


def _collectives_text(cs: list[Collective]) -> str:
    parts = []
    for c in cs:
        over = f" over {c.dim}" if c.dim else ""
        parts.append(f"{c.kind}{over} {c.nbytes} bytes")
    return ", ".join(parts)


def _grouped(cs: list[Collective]) -> str:
    """Collectives outside a reshard, by kind: ``send x3 240 bytes``."""
    by: dict[tuple[str, str | None], list[int]] = {}
    for c in cs:
        by.setdefault((c.kind, c.dim), []).append(c.nbytes)
    parts = []
    for (kind, dim), sizes in by.items():
        times = f" x{len(sizes)}" if len(sizes) > 1 else ""
        over = f" over {dim}" if dim else ""
        parts.append(f"{kind}{over}{times} {sum(sizes)} bytes")
    return ", ".join(parts)


def _why(op: Any, pos: tuple, nargs: int, attrs: dict, specs: list, targets: tuple) -> list[Choice]:
    """Per mesh dim where an input moves, why (Note [Explain hooks]): the rule run again on
    the inputs as dispatch's ``_decide`` hands them to it, recording what it priced."""
    from .spmd import core

    # as _decide: a bool Partial (a logical or/and, not a sum) is reduced before the rule sees
    # it, except by ops that only move elements
    firsts = [
        s.without_partials() if s.dtype == np.bool_ and s.has_partial() and not op.moves_only else s
        for s in specs
    ]
    mesh = specs[0].mesh
    try:
        _, log = core.considered(
            core.get_rule(op.rule),
            [core.TensorSpec(s.shape, s.placements, s.dtype) for s in firsts],
            mesh.shape,
            pos=pos,
            nargs=nargs,
            **attrs,
        )
    except Exception:  # the call decided without error; explaining must not raise
        log = []
    choices = []
    for m, name in enumerate(mesh.dim_names):
        had = tuple(s.placements[m] for s in specs)
        cur = tuple(s.placements[m] for s in firsts)
        need = tuple(t.placements[m] for t in targets)
        if had == need:
            continue
        reasons = [
            f"in {pos[j]} is a bool Partial, reduced first (a logical or/and, not a sum)"
            for j, (a, b) in enumerate(zip(had, cur))
            if a != b
        ]
        found = next(  # the last decision of this mesh dim that is the rule's answer
            (
                c
                for c in reversed(log)
                if c.mesh_dim == m and c.current == cur and c.candidates[c.chosen].inputs == need
            ),
            None,
        )
        if found is not None and found.candidates[found.chosen].cost > 0:
            choice = Choice(name, m, "", cur, list(found.candidates), found.chosen)
            rejected = choice.rejected
            tie = bool(rejected) and rejected[0].cost == choice.taken.cost
            reasons.append(
                f"{op.name}'s rule has no way to run on {_inputs_text(pos, cur)} as they are; "
                f"it took the cheapest{' (the first of equals)' if tie else ''} of the "
                f"{len(rejected) + 1} it priced ({_bytes(core.LATENCY)} a collective + the "
                "bytes a rank sends)"
            )
            choice.reason = "; ".join(reasons)
            choices.append(choice)
            continue
        if cur != need:
            reasons.append(
                f"rule {op.rule} requires {_inputs_text(pos, need)} here (it prices no "
                "alternatives on this mesh dim)"
            )
        choices.append(Choice(name, m, "; ".join(reasons), cur))
    return choices


def _inputs_text(pos: tuple, placements: tuple) -> str:
    return ", ".join(f"in {i} {_pl(p)}" for i, p in zip(pos, placements))


def _bytes(n: float) -> str:
    """``131,096 bytes``: exact, so that close prices compare (a fraction where a priced
    all-to-all has one)."""
    return f"{n:,.0f} bytes" if n == int(n) else f"{n:,.1f} bytes"


_SHOWN_REJECTED = 3  # rejected candidates listed per mesh dim, cheapest first


def _choice_lines(e: Entry, c: Choice) -> list[str]:
    pos = tuple(i for i, *_ in e.inputs)
    lines = [f"    why over {c.dim}: {c.reason}"]
    if c.taken is None:
        return lines
    mesh = e.inputs[0][1].mesh

    def text(word: str, cand: Any) -> str:
        moves = []
        for j, kind, wire, nested in cand.moves:
            over = f" over {mesh.dim_names[nested]} first" if nested is not None else ""
            moves.append(
                f"in {pos[j]} {kind}{over}" + (f" {_bytes(wire)}" if kind != "local" else "")
            )
        label = f"{_inputs_text(pos, cand.inputs)} -> out {_pl(cand.output)}"
        return f"      {word:<8} {label}: {_bytes(cand.cost)} ({', '.join(moves)})"

    lines.append(text("chose", c.taken))
    rejected = c.rejected
    lines += [text("rejected", r) for r in rejected[:_SHOWN_REJECTED]]
    rest = rejected[_SHOWN_REJECTED:]
    if rest:
        lines.append(f"      rejected {len(rest)} more, {_bytes(rest[0].cost)} or more")
    return lines


def _spec_text(spec: Any) -> str:
    return f"{spec.shape} {spec.dtype} {placements_text(spec.placements)}"


def _entry_lines(e: Entry) -> list[str]:
    head = f"  {e.what}"
    if e.op:
        if e.rule is not None:
            head += f"  rule {e.rule}"
        else:
            head += "  replicate fallback"
        if e.context:
            head += f"  (in {e.context})"
    lines = [head]
    for name, reason in e.fallbacks:
        which = "" if name == e.what else f" ({name})"
        lines.append(f"    outside SPMD rules{which}: {reason}")
    moves = list(e.moves)
    for i, had, need, first in e.inputs:
        text = f"    in {i}: {_spec_text(had)}"
        if need != had and first != i:
            text += f" -> {placements_text(need.placements)}: moved once, with in {first}"
        elif need != had:
            text += f" -> {placements_text(need.placements)}"
            mine = [m for m in moves if m.src == had]
            for m in mine:
                moves.remove(m)
            cs = [c for m in mine for c in m.collectives]
            text += f": {_collectives_text(cs)}" if cs else " (local)"
        lines.append(text)
    for m in moves:
        cs = _collectives_text(m.collectives) or "local"
        lines.append(
            f"    reshard {m.src.shape} {m.src.dtype} {placements_text(m.src.placements)} -> "
            f"{placements_text(m.dst.placements)}: {cs}"
        )
    if e.collectives:
        lines.append(f"    {_grouped(e.collectives)}")
    for spec in e.outputs:
        lines.append(f"    out: {_spec_text(spec)}")
    if e.moves or e.collectives:  # it communicated: why its inputs moved
        for c in e.why:
            lines += _choice_lines(e, c)
    out: list[str] = []  # equal neighbouring lines once, counted
    times = []
    for line in lines:
        if out and len(out) > 1 and out[-1] == line:
            times[-1] += 1
        else:
            out.append(line)
            times.append(1)
    return [line + (f"  (x{n})" if n > 1 else "") for line, n in zip(out, times)]
