"""``dt.compile``: a step function recorded while it runs eagerly, then replayed as its array
computations alone (Note [Compiled steps])."""

from __future__ import annotations

import functools
import inspect
import math
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from . import autograd, dispatch, recording
from . import comm as _comm
from . import reshard as _reshard
from .comm import agree
from .comm import base as _comm_base
from .explain import HOOKS as _explain
from .ops import mutation
from .recording import Name, Recorder, Slot
from .spec import DistSpec, contiguous
from .tensor import (
    _LAST_WRITE,
    DistTensor,
    _forget_pending,
    _made,
    _packed,
    code_of,
    remembered,
)

# Note [Compiled steps]
#     An iterative program's step (a conjugate gradient iteration, an optimizer update) makes
#     the same calls every iteration: the same ops on tensors of the same specs, the same
#     moves. Eagerly each call pays dispatch (keys, decisions, a DistTensor wrapped for every
#     intermediate) around a numpy call of a microsecond. ``dt.compile(step)`` runs the step
#     eagerly while the lower layers report what they compute (recording.py): each op's
#     kernel on its local arrays (dispatch's general path: its caches are off while a thread
#     records, ``dispatch.caches_off``), each move of a local array (``reshard.execute``, the
#     riders' packed reduction, a pick read from its root, a slice of a split axis), each
#     in-place write (ops/mutation.py). Arrays are numbered slots: the inputs' local arrays and
#     remembered moves, the arrays the program made from Python values (operands such as
#     ``np.arange(k)``), and each event's results.
#     When two calls in a row with the same key (the inputs' structure, specs, identities and
#     Python values, and whether autograd records) record the same events with the same
#     constants, the recording becomes a program: generated straight-line Python that binds
#     the inputs' arrays, calls each event's function (the very kernels and moves, so the
#     values are the eager ones; a kernel called without keyword arguments may name the numpy
#     function it then calls on arrays like the recorded ones, its ``plain``: matmul's
#     ``np.dot`` or ``np.matmul``) and wraps the results, with
#     the remembered moves the eager step leaves on them (Note [One move per tensor]), so the
#     next call's program finds them.
#     Later calls with that key replay it; a call whose inputs lack a remembered move the
#     program reads, or whose written input stands for a numpy view (``_copies``), runs
#     eagerly and records again. A call of only tensors, arrays and Python values takes the
#     latest program first, its key checked by the program itself (``_guards``: one tuple
#     comparison per kind of check, specs by identity, so the results get the inputs' equal
#     specs).
#     Collectives: on each group, the replay's first move is checked as the eager one is (a
#     planned move's fingerprint worked out once, carried in the collective's own message:
#     ``Planned.replay``, ``carry`` with what it reads bound once), so ranks that replay
#     different programs, or replay and run eagerly,
#     raise RanksDiverged; the group's later one-step all-reduces and vector gathers are the
#     bare MPI calls (``MPIComm.unchecked``, counted and watched), since every rank that
#     passed the check runs the same code. The collectives are the eager step's, one check
#     per group where the eager step checks each. With the check off (DISTTENSOR_CHECK=0,
#     ``agree.set_checks``) every one of them is bare; the setting is part of a program's key.
#     A recording is refused, and the step stays eager with the reason in ``.why`` (and a
#     RuntimeWarning), when a replay could differ from the eager run: data reached Python
#     (``float(x)``, ``print``, ``x.numpy()``, ``to_local``), an array whose making was not
#     reported fed an event or is returned (a tensor the step reads but does not take as an
#     argument, one made by a creation function), a write was not reported, a collective ran
#     outside a reported move, a gradient was recorded, an op fell back to Replicate, shards
#     live on a device, a rank is outside a mesh, two arguments hold one array; or six
#     recordings of a key never agreed twice in a row (a value that changes every call).
#     As with jax.jit, Python values and numpy arrays the step reads from outside its
#     arguments are constants of the recording; pass what changes as an argument (a changed
#     Python value or array shape is another key: it records again). Every rank decides
#     alike: the keys, recordings and refusals are the program's, the same on every rank.
MAX_PROGRAMS = 8  # programs kept per compiled function (keys), the oldest dropped
MAX_TRIES = 6  # recordings of one key that never agree twice in a row: it stays eager
MAX_KEYS = 256  # keys whose recordings are counted and kept, per compiled function and world


_ctx = _comm._ctx  # this thread's world, where dt.simulate runs it
_lock = threading.Lock()
_recording = [0]  # threads recording now


def _start(rec: Recorder) -> Callable[[str, int], None]:
    with _lock:
        if _recording[0] == 0:
            dispatch.caches_off(True)
        _recording[0] += 1
    recording.on.rec = rec

    def outside(kind: str, nbytes: int) -> None:
        if not rec.depth:
            rec.refuse(f"a collective ({kind}) outside an op or a move")

    _comm_base.add_observer(outside)
    return outside


def _stop(observer: Callable[[str, int], None]) -> None:
    recording.on.rec = None
    _comm_base.remove_observer(observer)
    with _lock:
        _recording[0] -= 1
        if _recording[0] == 0:
            dispatch.caches_off(False)


# -- inputs and outputs ------------------------------------------------------------------------
_SCALAR_TYPES = (int, float, bool, complex, str, bytes, type(None), np.generic, np.dtype)
_FLAT = frozenset({DistTensor, np.ndarray, int, float, bool, complex, str, bytes, type(None)})


def _flatten(tree: Any, leaves: list, ids: dict) -> Any:
    """The key of ``tree`` (nested tuples, lists and dicts of DistTensors, numpy arrays and
    Python values); its DistTensors and arrays appended to ``leaves``. None: cannot key."""
    t = type(tree)
    if t is DistTensor:
        i = ids.setdefault(id(tree), len(leaves))
        leaves.append(tree)
        return ("T", tree._spec, type(tree._local), tree.requires_grad, i)
    if t is np.ndarray:
        i = ids.setdefault(id(tree), len(leaves))
        leaves.append(tree)
        return ("A", tree.shape, tree.dtype, tree.strides, i)
    if t is tuple or t is list:
        parts = []
        for x in tree:
            k = _flatten(x, leaves, ids)
            if k is None:
                return None
            parts.append(k)
        return (t, *parts)
    if t is dict:
        parts = []
        for name, x in tree.items():
            k = _flatten(x, leaves, ids)
            if k is None:
                return None
            parts.append((name, k))
        return (dict, *parts)
    if isinstance(tree, _SCALAR_TYPES):
        if isinstance(tree, (float, np.floating)) and tree != tree:
            return ("nan", t)  # NaN is not equal to itself: keyed by its type
        return ("V", t, tree)
    return None


def _same(a: Any, b: Any) -> bool:
    """Whether constants ``a`` and ``b`` of two recordings are the same value."""
    if a is b:
        return True
    ta = type(a)
    if ta is not type(b):
        return False
    if ta is Name:
        return True  # names only (Name's note)
    if ta is np.ndarray:
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
    if ta is tuple or ta is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if ta is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if ta is dispatch.KernelContext:
        return (a.inputs, a.outputs, a.coord, a.shapes) == (b.inputs, b.outputs, b.coord, b.shapes)
    if isinstance(a, (float, np.floating)) and a != a and b != b:
        return True  # NaN constants
    try:
        return bool(a == b)
    except Exception:
        return False


class _Program:
    """One recording, checked and turned into code (Note [Compiled steps])."""

    def __init__(self, rec: Recorder, bound: list, outs: Any, tree: Any) -> None:
        self.events = rec.events
        self.shapes = [a.shape for a in rec.arrays]  # each slot's, as recorded
        self.dtypes = [a.dtype for a in rec.arrays]
        # per slot how a replay binds it (``_bind``): ("local", leaf), ("memo", leaf, spec),
        # ("array", leaf), ("const", array), ("made",)
        self.bound = bound
        self.outs = outs  # per output leaf: ("in", leaf), ("new", slot, spec, memos), ("value", v)
        self.tree = tree  # the result's structure, its leaves numbered
        self.source = ""  # the replay's code
        self.run: Callable[[list], Any] | None = None
        self.flat: Callable[[list], Any] | None = None  # run on a flat call's arguments

    def same(self, other: _Program) -> bool:
        if len(self.events) != len(other.events) or len(self.bound) != len(other.bound):
            return False
        for b1, b2 in zip(self.bound, other.bound):
            if b1[0] != b2[0] or not _same(b1[1:], b2[1:]):
                return False
        for e1, e2 in zip(self.events, other.events):
            if e1[0] != e2[0] or e1[4] != e2[4] or not _same(e1[1], e2[1]):
                return False
            if not _same(e1[2], e2[2]) or not _same(e1[3], e2[3]):
                return False
        return _same(self.outs, other.outs) and _same(self.tree, other.tree)

    def build(self, inputs: list, world: Any, flat: list | None = None) -> Callable[[list], Any]:
        """The replay function on ``world``: ``run(L)`` with ``L`` the call's leaves gives
        the result, or None where an input misses a remembered move the program reads or a
        written input stands for a numpy view (nothing done then). ``flat``: the arguments
        of a call without containers, in order: then ``L`` is such a call's arguments and
        ``run`` first checks that they key this program (``_guards``)."""
        ns: dict[str, Any] = {
            "_remembered": remembered,
            "_made": _made,
            "_LW": _LAST_WRITE,  # the latest write's number, as _remember reads it
            "_note": autograd.note_mutation,
            "_copy_of": mutation._copy_of,  # a written input that stands for a numpy view
            "_W": mutation._WRITE,  # a written tensor's new lineage, as mutation._written
            "_ND": np.ndarray,
            "_asarray": np.asarray,
            "_agree": agree,
            "_reduced": _all_reduce_unchecked,
            "_gathered": _all_gather_unchecked,
        }
        consts: dict[int, str] = {}

        def const(v: Any) -> str:
            name = consts.get(id(v))
            if name is None:
                name = consts[id(v)] = f"c{len(consts)}"
                ns[name] = v
            return name

        def expr(v: Any) -> str:
            t = type(v)
            if t is Slot:
                return f"s{v.i}"
            if t is Name:
                return const(v.v)
            if t is tuple:
                if _fixed(v):  # made once: a constant of the program
                    return const(v)
                inner = ", ".join(expr(x) for x in v)
                return f"({inner},)" if v else "()"
            if t is list:
                return "[" + ", ".join(expr(x) for x in v) + "]"
            if t is dict:
                return "{" + ", ".join(f"{k!r}: {expr(x)}" for k, x in v.items()) + "}"
            return const(v)

        specs = [t._spec for t in inputs if type(t) is DistTensor]

        def canon(spec: DistSpec) -> DistSpec:
            """The first input's spec equal to ``spec``: the results get it, so the next
            call's guard finds its inputs' specs by identity."""
            return next((t for t in specs if t == spec), spec)

        lines = ["def run(L):"]
        at = list(range(len(inputs)))  # leaf i is L[at[i]], bound to a{at[i]}
        if flat is not None:
            at = [k for k, v in enumerate(flat) if type(v) is DistTensor or type(v) is np.ndarray]
        n = len(inputs) if flat is None else len(flat)
        lines.append(f"    if len(L) != {n}: return None")
        if n:
            lines.append(f"    {''.join(f'a{k}, ' for k in range(n))}= L")
        if flat is not None:
            lines += _guards(flat, const, canon)
            # the checks' setting the collectives were made for (part of the general key)
            lines.append(
                f"    if _agree.CHECK is not {agree.CHECK} or _agree.DEBUG is not {agree.DEBUG}: "
                "return None"
            )
        leaf_of_slot: dict[int, int] = {}
        for i, b in enumerate(self.bound):
            kind = b[0]
            if kind == "local":
                lines.append(f"    s{i} = a{at[b[1]]}._local")
                leaf_of_slot[i] = at[b[1]]
            elif kind == "memo":
                lines.append(f"    s{i} = _remembered(a{at[b[1]]}, {const(b[2])})")
                lines.append(f"    if s{i} is None: return None")
            elif kind == "array":
                lines.append(f"    s{i} = a{at[b[1]]}")
            elif kind == "const":
                lines.append(f"    s{i} = {const(b[1])}")
        written = sorted({e[4][0] for e in self.events if e[0] == "write"} & set(leaf_of_slot))
        for s in written:  # a written input that stands for a view writes through: eager
            lines.append(f"    if _copy_of(a{leaf_of_slot[s]}) is not None: return None")
        checked: set = set()  # the groups whose first collective of the replay is checked
        for kind, fn, args, kwargs, outs in self.events:
            call = [expr(a) for a in args] + [f"{k}={expr(x)}" for k, x in kwargs.items()]
            if kind == "one" and type(fn) is dispatch._Kernel and not fn.saves:
                # the op's kernel itself (or the numpy function it is without keyword
                # arguments: its ``plain``); a 0-d result may be a numpy scalar, made an
                # array as dispatch._Kernel makes it (a result of other shapes is an array)
                o = f"s{outs[0]}"
                k = fn.kernel
                if not kwargs and getattr(k, "plain", None) is not None:
                    k = k.plain(*(self._like(a) for a in args))
                lines.append(f"    {o} = {const(k)}({', '.join(call)})")
                if self.shapes[outs[0]] == ():
                    lines.append(f"    if type({o}) is not _ND: {o} = _asarray({o})")
                continue
            if kind == "one" and fn is _reshard.execute and not kwargs:
                raw = _unchecked(args, world, checked)
                if raw is not None and raw[0] == "_bare":  # MPIComm.unchecked's call itself
                    lines.append(f"    s{outs[0]} = {const(raw[1])}({expr(args[0])})")
                    continue
                if raw is not None:
                    lines.append(f"    s{outs[0]} = {raw[0]}({expr(args[0])}, {const(raw[1])})")
                    continue
            if kind == "many" and fn is _packed and not kwargs:  # riders: tensor._packed
                raw = _unchecked((None, *args[2:]), world, checked)
                if raw is not None and raw[0] == "_bare":
                    lines += self._packed_inline(args, outs, raw[1], const)
                    continue
                if raw is not None:
                    call.append(f"run={const(_Mover(ns[raw[0]], raw[1]))}")
                text = f"{const(fn)}({', '.join(call)})"
                lines.append(f"    {', '.join(f's{o}' for o in outs)}, = {text}")
                continue
            text = f"{const(fn)}({', '.join(call)})"
            if kind == "one":
                lines.append(f"    s{outs[0]} = {text}")
            elif kind == "many":
                lines.append(f"    {', '.join(f's{o}' for o in outs)}, = {text}")
            else:
                lines.append(f"    {text}")
                lines.append(f"    _note(s{outs[0]})")
                if outs[0] in leaf_of_slot:
                    leaf = leaf_of_slot[outs[0]]
                    lines.append(f"    a{leaf}._lin = hash((_W, a{leaf}._lin))")
        first = next((i for i, t in enumerate(inputs) if type(t) is DistTensor), None)
        if first is not None and any(o[0] == "new" for o in self.outs):
            # the results' lineage: one hash of the program's and the first input's, then
            # one number per result (Note [Lineage names the tensor] in tensor.py)
            lines.append(f"    b = hash(({const(_RESULTS)}, a{at[first]}._lin))")
        base = "b" if first is not None else "0"
        results = []
        for k, o in enumerate(self.outs):
            if o[0] == "in":
                results.append(f"a{at[o[1]]}")
            elif o[0] == "value":
                results.append(const(o[1]))
            else:
                _, slot, spec, memos = o
                # the result, with the remembered moves _remember would leave on it
                moved = ", ".join(f"{const(dst)}: (s{slot}, s{m}, _LW[0])" for dst, m in memos)
                moved = f", {{{moved}}}" if memos else ""
                lines.append(
                    f"    o{k} = _made(s{slot}, {const(canon(spec))}, {base} + {k}{moved})"
                )
                results.append(f"o{k}")
        lines.append(f"    return {_literal(self.tree, results, const)}")
        source = "\n".join(lines)
        exec(source, ns)
        self.source = source
        return ns["run"]

    def _like(self, a: Any) -> Any:
        """A kernel's argument as recorded, for its ``plain``: a slot's shape and dtype (an
        ``_Like``), a constant itself."""
        if type(a) is Slot:
            return _Like(len(self.shapes[a.i]), self.dtypes[a.i])
        return a.v if type(a) is Name else a

    def _packed_inline(self, args: tuple, outs: tuple, call: Any, const: Callable) -> list:
        """``tensor._packed`` written out for a bare all-reduce ``call``: the parts copied
        into a send buffer the program keeps (the call copies it before it returns), each
        result a view of the reduced array."""
        parts = [args[0], *args[1]]
        flat = args[2]  # the packed spec: its dtype and total size
        buf = const(np.empty(flat.shape, flat.dtype))
        lines, at = [], 0
        views = []
        for part in parts:
            shape = self.shapes[part.i]
            n = math.prod(shape)
            if shape == ():
                lines.append(f"    {buf}[{at}] = s{part.i}")
                views.append(f"_r[{at}, ...]")  # a 0-d view
            else:
                lines.append(f"    {buf}[{at}:{at + n}] = s{part.i}.reshape(-1)")
                views.append(f"_r[{at}:{at + n}].reshape({shape!r})")
            at += n
        lines.append(f"    _r = {const(call)}({buf})")
        lines += [f"    s{o} = {v}" for o, v in zip(outs, views)]
        return lines


def _fixed(v: tuple) -> bool:
    """Whether a recorded tuple argument is the same every call: it holds no array slot, no
    ``Name`` (its value is passed) and no list or dict (which the call could change: made
    anew each call), at any depth."""
    for x in v:
        t = type(x)
        if t is Slot or t is Name or t is list or t is dict or (t is tuple and not _fixed(x)):
            return False
    return True


def _guards(flat: list, const: Callable[[Any], str], canon: Callable[[Any], Any]) -> list:
    """The lines that check that a call's arguments ``a0``, ``a1``, ... (``L`` unpacked) key
    the program recorded with arguments ``flat`` (``_flatten``'s key, written out: specs by
    identity, which the program holds). Each check is one comparison of tuples for all the
    arguments: a tuple compares its items by identity first, then by ``==``, in C (a line per
    argument costs twice as much, on the path of every replayed step)."""
    seen: dict[int, int] = {}
    types, tensors, arrays, values = [], [], [], []
    for k, v in enumerate(flat):
        if id(v) in seen:  # passed as the same object: the same again
            continue
        seen[id(v)] = k
        t = type(v)
        types.append((k, t))
        (tensors if t is DistTensor else arrays if t is np.ndarray else values).append((k, v))
    lines = [f"    if {_tuple(f'type(a{k})' for k, _ in types)} != "
             f"{const(tuple(t for _, t in types))}: return None"]  # fmt: skip
    lines += [f"    if a{k} is not a{seen[id(v)]}: return None"
              for k, v in enumerate(flat) if seen[id(v)] != k]  # fmt: skip
    if tensors:
        specs = tuple(canon(v._spec) for _, v in tensors)
        lines.append(f"    if {_tuple(f'a{k}._spec' for k, _ in tensors)} != {const(specs)}: "
                     "return None")  # fmt: skip
        grads = " or ".join(f"a{k}.requires_grad" for k, _ in tensors)
        lines.append(f"    if {grads}: return None")
        lines.append(f"    if {_tuple(f'type(a{k}._local)' for k, _ in tensors)} != "
                     f"{const((np.ndarray,) * len(tensors))}: return None")  # fmt: skip
    for k, v in arrays:
        lines.append(
            f"    if a{k}.shape != {const(v.shape)} or a{k}.dtype != {const(v.dtype)} or "
            f"a{k}.strides != {const(v.strides)}: return None"
        )
    for k, v in values:  # compared alone: a NaN is not equal to itself (another key)
        lines.append(f"    if a{k} != {const(v)}: return None")
    # arguments passed once were not one object: checked where the checks above let them be
    # one (two tensors of one spec, two arrays of one shape, dtype and strides)
    kinds = {
        k: (DistTensor, canon(v._spec)) if type(v) is DistTensor else (np.ndarray, _array_key(v))
        for k, v in enumerate(flat)
        if type(v) in (DistTensor, np.ndarray) and seen[id(v)] == k
    }
    for k in kinds:
        for j in kinds:
            if j < k and kinds[j] == kinds[k]:
                lines.append(f"    if a{k} is a{j}: return None")
    return lines


def _tuple(items: Any) -> str:
    """A tuple display of the expressions ``items``."""
    return "(" + "".join(f"{x}, " for x in items) + ")"


def _array_key(a: np.ndarray) -> tuple:
    return (a.shape, a.dtype, a.strides)


def _literal(tree: Any, results: list, const: Callable[[Any], str]) -> str:
    """The result's structure as a Python expression of its leaves ``results``."""
    t = tree[0]
    if t == "leaf":
        return results[tree[1]]
    if t is dict:
        return (
            "{" + ", ".join(f"{const(k)}: {_literal(v, results, const)}" for k, v in tree[1]) + "}"
        )
    inner = [_literal(v, results, const) for v in tree[1]]
    if t is list:
        return "[" + ", ".join(inner) + "]"
    return _tuple(inner)


def _unchecked(args: tuple, world: Any, checked: set) -> tuple | None:
    """(the name of a replay's call, its constant) for a move (``reshard.execute``'s
    arguments as recorded), or None: the move as recorded. A group's first move of the replay
    is checked: a planned one (Note [Planned moves] in reshard.py) calls its plan with the
    fingerprint worked out once, in the collective's own message. A later one-step
    all-reduce, or gather of a vector, on that group (``checked`` holds the groups) makes the
    bare MPI call (``MPIComm.unchecked``): every rank runs the same code from there (Note
    [Compiled steps]); with the check off, every such move is bare. The same on every rank:
    it depends on the specs alone (and the check's setting, part of the program's key)."""
    _, spec, dst, how, name = args
    if how is None or how.cross or agree.DEBUG or not isinstance(spec, DistSpec):
        return None
    hit = how.bound.get(id(world))  # execute's binding: its groups' memos (the gather's)
    if hit is None or hit[0] is not world:
        hit = how.bind(world, spec)
    if hit[1] is None or len(hit[2]) != 1:
        return None
    fn, before, step, dim = hit[2][0]
    group = (spec.mesh, step.mesh_dim)
    if group not in checked and agree.CHECK:  # with the check off, every move bare
        checked.add(group)
        lin = name.v
        direct = how.direct
        if direct and direct[0] is world:
            plan, item = direct[1], direct[2]
            general = functools.partial(_general, (spec, dst, how, lin))
            return "_bare", plan.replay(plan.fingerprint(item, lin), item, lin, general)
        return None
    make = getattr(dim.comm, "unchecked", None)  # MPI's: the bare call
    if fn is _reshard._all_reduce:
        raw = make and make("all_reduce", before.dtype, step.src.reduce_type)
        if raw:
            return "_bare", raw
        return "_reduced", (dim, step.src.reduce_type)
    if fn is _reshard._all_gather and dim.memo is not None and len(dim.memo[1]) == 1:
        raw = make and make("all_gather", before.dtype, dim.memo[3])
        if raw:
            return "_bare", raw
        return "_gathered", (dim, dim.memo[1], before.dtype, dim.memo[3])
    return None


class _Like:
    """A recorded array's ``ndim`` and ``dtype``: what a kernel's ``plain`` reads of it."""

    __slots__ = ("ndim", "dtype")

    def __init__(self, ndim: int, dtype: np.dtype) -> None:
        self.ndim, self.dtype = ndim, dtype


class _Mover:
    """A replay's call in ``reshard.execute``'s place (``tensor._packed``'s ``run``)."""

    __slots__ = ("fn", "c")

    def __init__(self, fn: Callable[[Any, tuple], Any], c: tuple) -> None:
        self.fn, self.c = fn, c

    def __call__(self, local: Any, *_: Any) -> Any:
        return self.fn(local, self.c)


def _general(c: tuple, local: Any) -> Any:
    """A group's first planned move of a replay for another local array than the plan's
    (``Planned.replay``'s ``other``): ``reshard.execute``'s call (the two agree: Note
    [Planned moves])."""
    return _reshard.execute(local, *c)


def _all_reduce_unchecked(local: Any, c: tuple) -> Any:
    """``reshard._all_reduce`` without the check: the backend's call, counted."""
    comm = c[0].comm
    if type(local) is not np.ndarray or not local.flags.c_contiguous:
        local = contiguous(local)
    out = np.empty_like(local)
    _comm_base.record("all_reduce", local.nbytes)
    comm._allreduce(local, out, c[1])
    return out


def _all_gather_unchecked(local: Any, c: tuple) -> Any:
    """``reshard._all_gather`` of a vector without the check: the backend's call, counted."""
    if type(local) is not np.ndarray or not local.flags.c_contiguous:
        local = contiguous(local)
    out = np.empty(c[1], c[2])
    _comm_base.record("all_gather", local.nbytes)
    c[0].comm._allgather(local, out, c[3])
    return out


_RESULTS = code_of("compiled step")  # in its results' lineage


def _outputs(result: Any, inputs: list, ids: dict, rec: Recorder) -> tuple[list, Any]:
    """(per output leaf its binding, the result's structure with leaves numbered)."""
    outs: list = []
    made: dict[int, int] = {}  # a new tensor returned twice: one tensor in the replay too

    def walk(x: Any) -> Any:
        t = type(x)
        if t is tuple or t is list:
            return (t, [walk(y) for y in x])
        if t is dict:
            return (dict, [(k, walk(y)) for k, y in x.items()])
        if t is DistTensor and id(x) in made:
            return ("leaf", made[id(x)])
        k = len(outs)
        if (t is DistTensor or t is np.ndarray) and id(x) in ids and inputs[ids[id(x)]] is x:
            outs.append(("in", ids[id(x)]))
        elif t is DistTensor:
            slot = rec.known(x._local)
            if slot is None:
                rec.refuse("a result whose making was not recorded")
            elif x.requires_grad:
                rec.refuse("a result that requires a gradient")
            memos = []
            if x._moved:
                for dst in list(x._moved):
                    m = remembered(x, dst)
                    if m is not None and rec.known(m) is not None:
                        memos.append((dst, rec.known(m)))
            outs.append(("new", slot, x._spec, tuple(memos)))
            made[id(x)] = k
        elif t is np.ndarray:
            rec.refuse("a numpy array result (return DistTensors)")
            outs.append(("value", x))
        elif isinstance(x, _SCALAR_TYPES):
            outs.append(("value", x))
        else:
            rec.refuse(f"a result of type {t.__name__}")
            outs.append(("value", x))
        return ("leaf", k)

    tree = walk(result)
    return outs, tree


class _State:
    """A compiled function's recordings and programs on one world (a simulated rank's own)."""

    __slots__ = ("world", "programs", "last", "tries")

    def __init__(self, world: Any) -> None:
        self.world = world
        self.programs: dict[Any, list[_Program]] = {}  # per key, the latest first
        self.last: dict[Any, _Program] = {}  # per key, the latest recording
        self.tries: dict[Any, int] = {}  # per key, its recordings


class Compiled:
    """A step function compiled by ``dt.compile``: call it as the function itself."""

    def __init__(self, fn: Callable[..., Any], warn: bool = True) -> None:
        self.fn = fn
        self.warn = warn
        self.why: str | None = None  # why the latest recording could not become a program
        self.calls = self.replays = self.recordings = 0
        self._states: dict[int, _State] = {}
        # (world, keyword names, the latest replayed program's run on a flat call's arguments)
        self._fast: tuple | None = None
        self.__wrapped__ = fn
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__name__ = getattr(fn, "__name__", "step")

    def __repr__(self) -> str:
        n = sum(len(s.programs) for s in self._states.values())
        why = f"; not compiled: {self.why}" if self.why else ""
        return (
            f"<dt.compile({self.__name__}): {self.calls} calls, {self.replays} replayed, "
            f"{n} program(s){why}>"
        )

    @property
    def source(self) -> str:
        """The code of this rank's latest program ("" if none): what a replay runs."""
        state = self._states.get(id(_comm._ctx.world or _comm.world()))
        for programs in reversed(list(state.programs.values()) if state else []):
            return programs[0].source
        return ""

    def _state(self) -> _State:
        world = _comm._ctx.world or _comm.world()
        state = self._states.get(id(world))
        if state is None or state.world is not world:
            if len(self._states) >= 16:  # simulated worlds come and go
                del self._states[next(iter(self._states))]
            state = self._states[id(world)] = _State(world)
        return state

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        fast = self._fast
        if fast is not None and fast[0] is (_ctx.world or _comm._mpi_world) and not _explain.active:
            if kwargs:
                out = fast[2]([*args, *kwargs.values()]) if tuple(kwargs) == fast[1] else None
            else:
                out = None if fast[1] else fast[2](list(args))
            if out is not None:
                self.replays += 1
                return out
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        """A call the latest program did not take (``__call__``): another program of its
        key, a recording, or the function itself."""
        if _explain.active:  # dt.explain sees every op
            return self.fn(*args, **kwargs)
        leaves: list = []
        ids: dict = {}
        # the checks' setting too: a replay's collectives are made for it (_unchecked)
        key = _flatten(
            (args, kwargs, autograd._state.enabled, agree.CHECK, agree.DEBUG), leaves, ids
        )
        if key is None:
            self._refuse("an argument that is not a tensor, array, Python value or container")
            return self.fn(*args, **kwargs)
        state = self._state()
        programs = state.programs.get(key)
        if programs:
            for p in programs:
                out = p.run(leaves)
                if out is not None:
                    self.replays += 1
                    if p.flat is not None:  # the next call like this one takes it first
                        self._fast = (state.world, tuple(kwargs), p.flat)
                    return out
        if state.tries.get(key, 0) >= MAX_TRIES:
            return self.fn(*args, **kwargs)
        return self._record(state, key, leaves, ids, args, kwargs)

    def _refuse(self, why: str) -> None:
        if self.why != why and self.warn:
            warnings.warn(
                f"dt.compile({self.__name__}): runs eagerly, not replayed: {why}",
                RuntimeWarning,
                stacklevel=4,
            )
        self.why = why

    def _record(self, state: _State, key: Any, leaves: list, ids: dict, args, kwargs) -> Any:
        self.recordings += 1
        if len(state.tries) >= MAX_KEYS and key not in state.tries:  # shapes that keep changing
            state.tries.clear()
            state.last.clear()
        state.tries[key] = state.tries.get(key, 0) + 1
        rec = Recorder()
        bound: list = []
        for i, x in enumerate(leaves):
            if ids[id(x)] != i:
                continue
            if type(x) is DistTensor:
                if rec.known(x._local) is not None:  # a replay would bind the other's
                    rec.refuse("two arguments that hold one array")
                rec.slot(x._local)
                bound.append(("local", i))
                if x._moved:
                    for dst in list(x._moved):
                        m = remembered(x, dst)
                        if m is None or m is x._local:  # a move that kept the array
                            continue
                        if rec.known(m) is not None:
                            rec.refuse("two arguments that hold one array")
                        rec.slot(m)
                        bound.append(("memo", i, dst))
            else:
                if rec.known(x) is not None:
                    rec.refuse("two arguments that hold one array")
                rec.slot(x)
                bound.append(("array", i))
        before = [(x, x._local, x._spec) for x in leaves if type(x) is DistTensor]
        _forget_pending()  # riders are the step's own (Note [Compiled steps])
        observer = _start(rec)
        try:
            result = self.fn(*args, **kwargs)
        finally:
            _stop(observer)
        _forget_pending()
        for x, local, spec in before:
            if x._local is not local or x._spec is not spec:
                rec.refuse("an input's array or layout was replaced")
        outs, tree = _outputs(result, leaves, ids, rec)
        if rec.why is not None:
            self._refuse(rec.why)
            state.tries[key] = MAX_TRIES  # the step itself does what no replay repeats
            return result
        program = _Program(rec, _bind(rec, bound), outs, tree)
        last = state.last.get(key)
        state.last[key] = program
        if last is not None and last.same(program):
            program.run = program.build(leaves, state.world)
            if all(type(v) in _FLAT for v in (*args, *kwargs.values())):
                program.flat = program.build(leaves, state.world, [*args, *kwargs.values()])
            programs = state.programs.setdefault(key, [])
            programs.insert(0, program)
            del programs[2:]  # the inputs' remembered moves differ at most at the start
            if len(state.programs) > MAX_PROGRAMS:
                del state.programs[next(iter(state.programs))]
            self.why = None
        elif state.tries[key] >= MAX_TRIES:
            self._refuse("no two recordings in a row agree (a value changes every call)")
        return result


def _bind(rec: Recorder, bound: list) -> list:
    """Per slot how a replay binds it: the inputs' (``bound``), then the constants, and
    "made" for the slots an event makes."""
    made = set()
    for e in rec.events:
        if e[0] != "write":
            made.update(e[4])
    out = list(bound)
    for i in range(len(bound), len(rec.arrays)):
        out.append(("made",) if i in made else ("const", rec.arrays[i]))
    return out


def _compiled(fn: Callable[..., Any], warn: bool) -> Compiled:
    """``dt.compile(fn)``: a Compiled, of a class of its own whose ``__call__`` takes
    ``fn``'s own parameters where they are all positional-or-keyword (``_with_signature``)."""
    made = _with_signature(fn)
    if made is None:
        return Compiled(fn, warn=warn)
    cls, ns = made
    me = ns["_dt_me"] = cls(fn, warn=warn)
    return me


def _with_signature(fn: Callable[..., Any]) -> tuple[type, dict] | None:
    """(a class of Compiled whose ``__call__`` is ``fn``'s parameters, the namespace whose
    ``_dt_me`` must name its one instance), or None where a parameter is not
    positional-or-keyword. A call by name then binds as a call by position, into the same
    key, and the fast path makes no dict of keyword arguments and compares no names (half
    of its cost); a call that does not bind raises ``fn``'s own TypeError."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(
        p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD or p.name.startswith("_dt_")
        for p in params
    ):
        return None
    ns: dict[str, Any] = {"_dt_ctx": _ctx, "_dt_comm": _comm, "_dt_explain": _explain}
    heads = []
    for k, p in enumerate(params):
        if p.default is p.empty:
            heads.append(p.name)
        else:
            ns[f"_dt_d{k}"] = p.default
            heads.append(f"{p.name}=_dt_d{k}")
    names = ", ".join(p.name for p in params)
    source = f"""def call({", ".join(heads)}):
    _dt_me.calls += 1
    _dt_fast = _dt_me._fast
    if (
        _dt_fast is not None
        and _dt_fast[0] is (_dt_ctx.world or _dt_comm._mpi_world)
        and not _dt_fast[1]
        and not _dt_explain.active
    ):
        _dt_out = _dt_fast[2]([{names}])
        if _dt_out is not None:
            _dt_me.replays += 1
            return _dt_out
    return _dt_me._call(({names}{"," if params else ""}), {{}})
"""
    exec(source, ns)
    call = ns["call"]
    name = getattr(fn, "__name__", "step")
    names_it = {"co_name": name}  # its binding errors name fn
    if hasattr(call.__code__, "co_qualname"):  # Python 3.11 on
        names_it["co_qualname"] = name
    call.__code__ = call.__code__.replace(**names_it)
    call.__name__ = call.__qualname__ = name
    return type("Compiled", (Compiled,), {"__call__": staticmethod(call)}), ns


def compile(fn: Callable[..., Any] | None = None, *, warn: bool = True) -> Any:
    """``fn`` recorded while it runs and replayed as its array computations once two calls in
    a row record the same (Note [Compiled steps]); a decorator too (``@dt.compile``).

    The replay makes the same kernel calls and collectives as the eager step and gives the
    same values, without dispatch's work around each op. Arguments: DistTensors, numpy
    arrays, Python values, and tuples, lists and dicts of them; results the same. Python
    values and arrays read from outside the arguments are constants of the recording (pass
    what changes as an argument). A step whose Python reads tensor data (``float(x)``,
    ``print``), records a gradient, falls back to Replicate or runs on device shards stays
    eager, with a RuntimeWarning (``warn=False``: none) and the reason in ``.why``. Where
    every parameter of ``fn`` is positional-or-keyword, a call binds its arguments as ``fn``
    does: by name or by position is one call (a default is its value), and a call that does
    not bind raises ``fn``'s own TypeError."""
    if fn is None:
        return lambda f: _compiled(f, warn)
    return _compiled(fn, warn)
