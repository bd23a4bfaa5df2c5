"""The one dispatch path every op takes, in five steps (docs/architecture.md).

1. normalize: DistTensors and arrays are tensors (arrays become Replicate on the mesh of the
   DistTensors); Python and numpy scalars pass to the kernel as they are, so numpy's type
   promotion is unchanged;
2. rule: the op's SPMD rule, or the replicate fallback (counted, logged once per op);
   decisions are cached on (op, input specs, argument layout, attributes);
3. reshard the inputs that are not already as the rule needs;
4. run the local kernel on the shards (ranks outside the mesh skip it): the op's numpy kernel
   on host shards, its device kernel on device shards (Note [Array backends] in backend.py);
5. wrap the outputs.
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import autograd, backend, comm, recording
from . import tensor as _tensor
from .accounting import NO_RULE, note_outside_rules, outside_rules
from .autograd import GRADIENTS as _GRADIENTS
from .autograd import NOT_DIFFERENTIABLE as _NOT_DIFFERENTIABLE
from .autograd import _memo  # Note [One move per input]
from .comm import _ctx as _comm_ctx
from .comm.agree import Stack, _doing, doing, fixed_item
from .explain import HOOKS as _explain
from .mesh import different_meshes
from .placement import Replicate
from .recording import on as _recording_on
from .reshard import move as _reshard_move
from .spec import DistSpec
from .spmd import TensorSpec, get_rule
from .tensor import _NAN, DistTensor, code_of, moved, note_partial, remembered, rides, stamp, token

log = logging.getLogger("disttensor")


class KernelContext:
    """What a kernel that needs the global picture gets (``Op(ctx=True)``). Read-only: the
    fast path reuses one per cached decision and coordinate."""

    __slots__ = ("_locals", "coord", "inputs", "memo", "outputs", "shapes")

    def __init__(
        self,
        inputs: tuple[DistSpec, ...],  # the specs the inputs were resharded to
        outputs: tuple[tuple, ...],  # output placements
        coord: tuple[int, ...] | None,
        shapes: tuple[tuple[int, ...], ...] | None = None,  # the rule's global output shapes
    ) -> None:
        self.inputs, self.outputs, self.coord, self.shapes = inputs, outputs, coord, shapes
        self._locals: dict[int, tuple[int, ...]] = {}
        # what the kernel works out from this context and its attributes, for the next call
        # with this context (the fast path's: one decision, so the same attributes)
        self.memo: Any = None

    def local_shape(self, i: int = 0) -> tuple[int, ...]:
        """Output ``i``'s local shape on this rank, from the rule's global shape (which must
        be known: ``shapes`` is not None)."""
        hit = self._locals.get(i)
        if hit is None:
            spec = self.inputs[0]
            out = DistSpec(spec.mesh, self.outputs[i], self.shapes[i], spec.dtype)
            hit = self._locals[i] = out.local_shape(self.coord)
        return hit


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a cache key, cheaply
class Op:
    """An op: its local kernel and the name of its SPMD rule (None: replicate fallback)."""

    name: str
    kernel: Callable[..., Any]
    rule: str | None = None
    ctx: bool = False  # kernel takes ctx=KernelContext
    moves_only: bool = False  # only moves elements, so every Partial passes through exactly
    # the kernel on device shards (Note [Array backends] in backend.py): the name of a
    # function of the array module (``xp.add``), ``factory(backend) -> kernel``, or True when
    # ``kernel`` itself works on any array; None: no device kernel yet, so device data
    # raises NotImplementedError naming the op
    device: Any = None
    # the kernel returns ``(output, saved)``: ``saved`` is kept on the autograd node for the
    # gradient (Note [Saved for backward]); one output only
    saves: bool = False

    def __call__(self, *args: Any, **attrs: Any) -> Any:  # replaced by _call below
        return apply(self, args, attrs)


# Note [One move per input]
# An op moves each distinct input once: when the same tensor object is an operand twice and
# the rule wants it in the same layout both times (``d * d``, ``x @ x``, ``where(m, x, x)``),
# the second operand takes the first one's resharded shard. Resharding is a pure function of
# (tensor, target spec), and nothing can change the tensor between two operands of one call,
# so the reuse is exact. Inside a gradient function the same table lives longer
# (autograd._memo).


# Note [Saved for backward]
# A fused kernel often computes on its way what its gradient needs: layer norm's row mean and
# rstd, cross entropy's log-sum-exp. Recomputing them in backward costs passes over the whole
# input, so such an op is made with ``saves=True``: its kernel (host and device) returns
# ``(output, saved)``, dispatch wraps the output as usual and hands ``saved`` (this rank's
# local arrays, whatever the kernel chose) to the node, where the gradient function reads it
# as ``ctx.extra`` (None on a rank outside the mesh, which holds no shard, and when no
# gradient is recorded: then ``saved`` is dropped at once). The gradient wraps those arrays
# with specs it derives from the saved arguments, which are in the layout the kernel ran on.


# Note [Dispatch fast path]
# The decision cache holds two kinds of keys in one dict (so clearing or replacing ``_cache``
# forgets both):
# * by value: (op name, input specs, argument positions, argument count, attributes) -> plan,
#   found for any equal specs (an op's inputs are often new objects equal to cached ones);
# * by identity: (Op, attributes, per argument id(spec) or None for a non-tensor) -> _Entry.
#   The entry holds weak references to those very spec objects, whose callbacks remove it
#   when one of them is freed: an id in a key never belongs to another object while the
#   entry lives (CPython runs the callback at the deallocation, before the id can be
#   reused), and the cache holds entries only for live specs, so it stays as large as the
#   program's live tensors need (a training loop that makes a new input tensor every step
#   adds no entry per step). Only calls whose tensors are all DistTensors get one.
# A training step calls the same ops on the same spec objects (outputs take their specs from
# the plan), so the identity key hits: no spec hashing, no normalization. When the entry's
# plan moves nothing, has one output and ran on this thread's world before (``last``: the
# coordinate, kernel context, output dtype, spec and local shape, and whether and with which
# gradient function to record: gradients register at import, before any entry is made), the
# call is just: kernel, a dtype and shape check of the result (a wrong rule still fails
# loudly), wrap, record.
# A plan that moves inputs, each in one step (``movable``: the Partial divisor of ``rs / d``
# reduced, the vector of ``A @ p`` gathered), with one output, takes the same path when no
# gradient is to be recorded: ``hows`` holds each moving input's planned move (made once:
# the key's specs are these very objects), and ``_fast_moves`` moves each new tensor
# through the general path's ``_move`` (so a tensor moved before is not moved again, Note
# [One move per tensor]) under the entry's label, the item the general path's ``_named``
# pushes, so the agreement check sees the same call either way. Under dt.explain, inside a
# gradient function (its move memo) and with a gradient to record, the general path runs.
# DistTensor's operators (``x + y``, ``2 * x``, ``x / d``, ``A @ p``, the comparisons) enter
# through ``binary``, which takes the simplest of these calls (two tensors, or one and a
# Python scalar, whose entry keeps no Partial input, has no kernel context and no gradient
# to record, on host shards; inputs that move, ``_fast_moves`` moves) without ``_call``'s
# generic argument handling: 1.4 -> 1.1 us for ``x + y`` of 31 floats; every other call is
# ``_call`` itself.
# Everything else takes the general path, which is the same five steps with every check.


def _forget(key: tuple, _ref: Any) -> None:
    """A spec of identity key ``key`` was freed: its entry goes (Note [Dispatch fast path]).
    At interpreter exit the module's globals may be gone (None) before the last specs."""
    cache = _cache
    if cache is _OFF:  # dt.compile records: the cache is kept aside
        cache = _kept[0]
    if cache is not None:
        cache.pop(key, None)


class _Entry:
    __slots__ = ("code", "dense", "hows", "into", "keeps", "label", "last", "mesh", "movable",
                 "plan", "pos", "refs", "simple")  # fmt: skip

    def __init__(
        self, op: Op, specs: tuple, plan: tuple, pos: tuple, nargs: int, key: tuple
    ) -> None:
        forget = functools.partial(_forget, key)
        self.refs = tuple(weakref.ref(s, forget) for s in specs)  # the entry dies with them
        self.mesh = specs[0].mesh
        self.code = _code(op, key[1])  # of its results' lineage (Note [Lineage names the tensor])
        self.plan = plan
        self.pos = pos
        self.dense = len(pos) == nargs  # every argument a DistTensor
        _, out_placements, out_shapes, moves, _ = plan
        self.simple = moves is None and out_shapes is not None and len(out_placements) == 1
        # the plan moves inputs, each in one step, and has one output: the fast path moves
        # them itself (Note [Dispatch fast path])
        self.movable = (
            moves is not None
            and out_shapes is not None
            and len(out_placements) == 1
            and all(len(chain) <= 1 for chain in moves)
        )
        # (world, coord, kernel ctx, dtype, spec, local shape, recorded, (spec,), gradient
        # function): _finish
        self.last: tuple | None = None
        # the movable plan's moves, per tensor input reshard.move(its spec, target) or None
        # where it does not move (_move's ``hows``); None until the plan first ran
        self.hows: tuple | None = None
        self.label: tuple | None = None  # _named's item
        self.into: tuple | None = None  # (last, whether ``into`` may take it): ``into``
        # the argument positions of Partial inputs the plan does not move: a remembered
        # reduced value is used instead where there is one (Note [Reduced values used])
        keeps = tuple(
            i
            for k, (i, s) in enumerate(zip(pos, specs))
            if s.has_partial() and (moves is None or not moves[k])
        )
        self.keeps = keeps if keeps and not op.moves_only and op.name not in _VIEWS else None


def _code(op: Op, items: tuple) -> int:
    """What ``op`` with attributes ``items`` (``tuple(attrs.items())``) puts in its results'
    lineage, the same on every rank (Note [Lineage names the tensor] in tensor.py)."""
    key = (op, items)
    try:
        code = _CODES.get(key)
    except TypeError:  # an unhashable attribute: worked out each time
        code = None
        key = None
    if code is None:
        code = hash((code_of(op.name), *[token(x) for item in items for x in item]))
        if key is not None:
            if len(_CODES) >= 4096:
                _CODES.clear()
            _CODES[key] = code
    return code


_CODES: dict[tuple, int] = {}
_cache: dict[tuple, Any] = {}


class _Off(dict):
    """``_cache`` while dt.compile records (Note [Compiled steps] in capture.py): it finds
    and keeps nothing, so every call takes the general path, which reports its kernel."""

    def get(self, key: Any, default: Any = None) -> Any:
        return None

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


_OFF = _Off()
_kept: list = [None]  # the cache while ``_cache`` is _OFF


def caches_off(off: bool) -> None:
    """Turn the decision cache off (``off``) or back on: capture.py, while a thread
    records."""
    global _cache
    if off:
        _kept[0], _cache = _cache, _OFF
    else:
        _cache, _kept[0] = _kept[0], None


_CACHE_LIMIT = 65536
_NO_ATTRS = ()
_SCALARS = frozenset({int, float, bool, complex})  # Python scalars: the plan ignores the value
_ND = np.ndarray
_DEVICE = backend.DEVICE_ARRAYS  # mutated in place when a device backend registers
_ARRAYS = backend.ARRAYS
_DEVICE_KERNELS: dict[tuple, Callable[..., Any]] = {}


def device_kernel(op: Op, t: type) -> Callable[..., Any]:
    """``op``'s kernel for device arrays of type ``t``, made once per (op, type); raises
    NotImplementedError naming the op when it has none (Note [Array backends])."""
    k = _DEVICE_KERNELS.get((op, t))
    if k is None:
        be = backend.of_type(t)
        if op.device is None:
            raise backend.unsupported(f"{op.name!r}", be)
        if op.device is True:  # written with array methods and operators only
            k = op.kernel
        else:
            k = getattr(be.xp, op.device) if isinstance(op.device, str) else op.device(be)
        _DEVICE_KERNELS[(op, t)] = k
    return k


def with_xp(fn: Callable[..., Any]) -> Callable[[Any], Callable[..., Any]]:
    """The device kernel factory (``Op(device=...)``) of a kernel written with an ``xp``
    keyword argument (its array module: numpy's by default, the backend's on a device)."""
    return lambda be: functools.partial(fn, xp=be.xp)


def host_method(name: str) -> Callable[..., Any]:
    """The host kernel of numpy's function ``name`` that wraps an array method in Python
    (``np.argmin``, ``np.clip``, ``np.transpose``: about a microsecond each): the method
    itself on an ndarray, numpy's function on anything else (the Python scalars of a call
    without tensors)."""
    function, method = getattr(np, name), getattr(np.ndarray, name)

    def kernel(x: Any, *args: Any, **kwargs: Any) -> Any:
        if type(x) is _ND:
            return method(x, *args, **kwargs)
        return function(x, *args, **kwargs)

    return kernel


def _as_array(result: Any, t: type) -> Any:
    """A kernel's result that is not an array of the shards' type ``t`` (numpy scalars of
    0-d reductions) as one: numpy's on the host, the device's otherwise."""
    if t not in _DEVICE:
        return np.asarray(result)
    return backend.of_type(t).asarray(result)


def apply(op: Op, args: tuple, attrs: dict) -> Any:
    """Run ``op`` on ``args`` with attributes ``attrs``: the five steps (module docstring)."""
    return _call(op, *args, **attrs)


def _call(op: Op, *args: Any, **attrs: Any) -> Any:
    """``Op.__call__``: the fast path (Note [Dispatch fast path]), else ``_general``."""
    # the identity key and the kernel's arguments, one and two DistTensors spelled out (most
    # calls); ``grad``: whether a DistTensor argument requires a gradient; ``first``: the
    # first DistTensor's shard, whose type picks the kernel (Note [Array backends]: numpy's,
    # or a device's). Once a device backend exists (``_DEVICE``), shards of different types
    # take the general path, which refuses them.
    key: Any = tuple(attrs.items()) if attrs else _NO_ATTRS
    n = len(args)
    if n == 2 and isinstance(x := args[0], DistTensor) and isinstance(y := args[1], DistTensor):
        key = (op, key, id(x._spec), id(y._spec))
        kargs = [first := x._local, yl := y._local]
        if _DEVICE and type(yl) is not type(first):
            key = None
        gx, gy = x.requires_grad, y.requires_grad
        grad = gx or gy
        inputs = args if gx and gy else None  # None: worked out when recording
        form = 2  # which arguments the result's lineage hashes
    elif n == 1 and isinstance(x := args[0], DistTensor):
        key = (op, key, id(x._spec))
        kargs = [first := x._local]
        grad = x.requires_grad
        inputs = args
        form = 1
    elif (
        n == 3
        and isinstance(x := args[0], DistTensor)
        and isinstance(y := args[1], DistTensor)
        and isinstance(z := args[2], DistTensor)
    ):  # linear, where, layer_norm: the key _mixed_key makes, spelled out
        key = (op, key, id(x._spec), id(y._spec), id(z._spec))
        kargs = [first := x._local, yl := y._local, zl := z._local]
        if _DEVICE and not type(first) is type(yl) is type(zl):
            key = None
        gx, gy, gz = x.requires_grad, y.requires_grad, z.requires_grad
        grad = gx or gy or gz
        inputs = (x if gx else None, y if gy else None, z if gz else None)
        form = 3
    elif n == 2 and type(y := args[1]) in _SCALARS and isinstance(x := args[0], DistTensor):
        key = (op, key, id(x._spec), None)  # the key _mixed_key makes, spelled out: x * 2
        kargs = [first := x._local, y]
        grad = x.requires_grad
        inputs = None
        form = 4
    elif n == 2 and type(x := args[0]) in _SCALARS and isinstance(y := args[1], DistTensor):
        key = (op, key, None, id(y._spec))  # 1 - x
        kargs = [x, first := y._local]
        grad = y.requires_grad
        inputs = None
        form = 5
    else:
        items = key
        key, kargs, grad, first = _mixed_key(op, items, args)
        if kargs is _SEQUENCE:  # Note [Lists are arrays]
            if (sub := _sequences(op, args, attrs)) is not None:
                return _call(op, *sub, **attrs)
            key, kargs, grad, first = _mixed_key(op, items, args, sequences=False)
        if key is None and kargs is _ARRAY and (sub := _operands(args)) is not None:
            return _call(op, *sub, **attrs)  # Note [Array operands of one spec]
        inputs = None
        form = 0
    try:
        entry = _cache.get(key) if key is not None else None
    except TypeError:  # unhashable attributes: decide every time
        entry = key = None
    if entry is not None:
        keeps = entry.keeps
        if keeps is not None:  # Note [Reduced values used]
            for i in keeps:
                if args[i]._moved is not None:  # moved before: perhaps reduced
                    if (sub := _reduced(entry, args)) is not None:
                        return _call(op, *sub, **attrs)
                    break
        last = entry.last  # set only where the plan has one output and moves in one step
        if (
            last is not None
            and last[0] is _comm_ctx.world
            and (entry.hows is None or (not grad and _fast_moves(entry, args, kargs)))
        ):
            extra = None
            if not _DEVICE or (t := type(first)) not in _DEVICE:  # host shards: numpy
                t = _ND
                if last[2] is None:
                    result = op.kernel(*kargs, **attrs)
                else:
                    result = op.kernel(*kargs, ctx=last[2], **attrs)
                if op.saves:
                    result, extra = result
                if type(result) is not _ND:
                    result = np.asarray(result)
            else:
                kernel = device_kernel(op, t)
                if last[2] is None:
                    result = kernel(*kargs, **attrs)
                else:
                    result = kernel(*kargs, ctx=last[2], **attrs)
                if op.saves:
                    result, extra = result
                if type(result) is not t:
                    result = _as_array(result, t)
            if result.dtype is last[3] and result.shape == last[5]:
                out = DistTensor(result, last[4])
                # its lineage, as _finish makes it (Note [Lineage names the tensor])
                if form == 2:
                    out._lin = hash((entry.code, x._lin, y._lin))
                elif form == 1:
                    out._lin = hash((entry.code, x._lin))
                elif form == 4:
                    out._lin = hash((entry.code, x._lin, y if y == y else _NAN))
                elif form == 3:
                    out._lin = hash((entry.code, x._lin, y._lin, z._lin))
                elif form == 5:
                    out._lin = hash((entry.code, x if x == x else _NAN, y._lin))
                else:
                    out._lin = hash((entry.code, *[token(a) for a in args]))
                if grad and last[6] and autograd._state.enabled:
                    if inputs is None:
                        inputs = _inputs(args, entry.pos)
                    autograd.record_one(op.name, last[8], inputs, args, attrs, out, last[7], extra)
                elif last[9]:  # small, Partial, no graph (Note [Small reductions ride together])
                    note_partial(out, args)
                return out
            # another dtype (int x + 1 vs x + 1.5) or a wrong rule: the general wrap
            tensors = [args[i] for i in entry.pos]
            return _finish(op, args, attrs, entry, entry.plan, last[4].mesh, last[1], kargs, result,
                           tensors, entry.pos, t, extra)  # fmt: skip
    if _explain.active:  # dt.explain records this thread's calls (Note [Explain hooks])
        return _explain.on_op(_general, op, args, attrs, key, entry)
    return _general(op, args, attrs, key, entry)


Op.__call__ = _call  # type: ignore[method-assign]  # one frame less per op


def binary(op: Op, x: Any, y: Any) -> Any:
    """``op(x, y)`` for DistTensor's operators (``x + y``, ``2 * x``, ``x / d``): the fast
    path's commonest call, a cached decision for two DistTensors or one and a Python scalar,
    on host shards, with no gradient to record, taken without ``_call``'s generic argument
    handling (Note [Dispatch fast path]); any other call is ``_call`` itself."""
    tx, ty = type(x), type(y)
    if (tx is _ND or ty is _ND) and (sub := _operands((x, y))) is not None:
        x, y = sub  # a numpy operand (``labels == np.arange(k)``): Note [Array operands of
        tx = ty = DistTensor  # one spec], as _call makes it, without its generic handling
    if tx is DistTensor:
        xl = x._local
        if ty is DistTensor:
            yl = y._local
            if type(xl) is not _ND or type(yl) is not _ND:
                return _call(op, x, y)
            key = (op, _NO_ATTRS, id(x._spec), id(y._spec))
            grad = x.requires_grad or y.requires_grad
            lx, ly = x._lin, y._lin  # Note [Lineage names the tensor]
        elif ty in _SCALARS and type(xl) is _ND:
            key, yl, grad = (op, _NO_ATTRS, id(x._spec), None), y, x.requires_grad
            lx, ly = x._lin, y if y == y else _NAN
        else:
            return _call(op, x, y)
    elif ty is DistTensor and tx in _SCALARS and type(yl := y._local) is _ND:
        key, xl, grad = (op, _NO_ATTRS, None, id(y._spec)), x, y.requires_grad
        lx, ly = x if x == x else _NAN, y._lin
    else:
        return _call(op, x, y)
    entry = _cache.get(key)
    if entry is not None and not grad and entry.keeps is None:
        last = entry.last
        if last is not None and last[0] is _comm_ctx.world and last[2] is None and not op.saves:
            if entry.hows is not None:  # its inputs move: _call's fast path moves them
                kargs = [xl, yl]
                if not _fast_moves(entry, (x, y), kargs):
                    return _call(op, x, y)
                xl, yl = kargs
            result = op.kernel(xl, yl)
            if type(result) is not _ND:
                result = np.asarray(result)  # a numpy scalar of 0-d shards
            if result.dtype is last[3] and result.shape == last[5]:
                out = DistTensor(result, last[4])
                out._lin = hash((entry.code, lx, ly))
                if last[9]:  # Note [Small reductions ride together] in tensor.py
                    note_partial(out, (x, y))
                return out
            # another dtype or a wrong rule: the general wrap
            tensors = [(x, y)[i] for i in entry.pos]
            return _finish(op, (x, y), {}, entry, entry.plan, last[4].mesh, last[1], [xl, yl],
                           result, tensors, entry.pos, _ND)  # fmt: skip
    return _call(op, x, y)


_tensor._binary = binary  # DistTensor's operators call it


def into(op: Op, ufunc: Any, x: DistTensor, y: Any) -> bool:
    """``x <op>= y`` (``w -= u``, ``x += 1``; ops/mutation.py's ``inplace``) as numpy's
    in-place ufunc on x's local array, where the operator's cached decision for (x, y) moves
    nothing, uses no remembered reduced value, needs no kernel context and lays its result
    out as x itself, on host shards with no gradient to record: the values the op's kernel
    would make (``op``'s kernel is ``ufunc``), written where the general path would copy
    them. False, writing nothing, for any other call; the caller notes the write (Note
    [In-place operators] in ops/mutation.py)."""
    xl = x._local
    ty = type(y)
    if ty is DistTensor:
        yl = y._local
        if type(yl) is not _ND:
            return False
        key = (op, _NO_ATTRS, id(x._spec), id(y._spec))
        grad = x.requires_grad or y.requires_grad
    elif ty in _SCALARS:
        yl = y
        key = (op, _NO_ATTRS, id(x._spec), None)
        grad = x.requires_grad
    else:
        return False
    if type(xl) is not _ND or (grad and autograd._state.enabled):
        return False
    entry = _cache.get(key)
    if entry is None or not entry.simple:
        return False
    if entry.keeps is not None and (
        x._moved is not None or (ty is DistTensor and y._moved is not None)
    ):  # a Partial input perhaps reduced before: Note [Reduced values used]
        return False
    last = entry.last
    if last is None or last[0] is not _comm_ctx.world or last[2] is not None:
        return False
    ok = entry.into
    if ok is None or ok[0] is not last:  # worked out once per decision
        ok = entry.into = (last, _same_layout(last[4], x._spec))
    if not ok[1]:
        return False
    ufunc(xl, yl, out=xl)
    return True


def _same_layout(a: DistSpec, b: DistSpec) -> bool:
    """Whether specs ``a`` and ``b`` give every rank the same local array: equal, or equal
    but for placements over mesh dims of one rank (``_relabels``: the rules make a 1-rank
    mesh's results Replicate)."""
    if a is b or a == b:
        return True
    return a.shape == b.shape and a.dtype == b.dtype and a.mesh == b.mesh and _relabels(a, b)


def keyed(op: Op, x: DistTensor, key: tuple, route: list, at: int) -> Any:
    """``op(x, key=key)`` for an op whose caller keeps a list per (x's spec, key): getitem's
    route (Note [Getitem routes kept on the spec] in ops/shape.py). The call's cache entry is
    kept in ``route[at]``, so a repeated call on host shards with no gradient to record, whose
    plan moves nothing, skips ``_call``'s key building and lookup: the kernel, then the wrap
    ``_call``'s fast path makes (Note [Dispatch fast path]); anything else is ``_call``."""
    entry = route[at]
    if (
        entry is not None
        and not x.requires_grad
        and entry.hows is None
        and not op.saves
        and _recording_on.rec is None  # dt.compile records the general path
    ):
        last = entry.last
        xl = x._local
        if last is not None and last[0] is _comm_ctx.world and type(xl) is _ND:
            result = op.kernel(xl, key, ctx=last[2])
            if type(result) is not _ND:
                result = np.asarray(result)
            if result.dtype is last[3] and result.shape == last[5]:
                out = DistTensor(result, last[4])
                # its lineage, as _call makes it (Note [Lineage names the tensor])
                out._lin = hash((entry.code, x._lin))
                if last[9]:  # Note [Small reductions ride together] in tensor.py
                    note_partial(out, (x,))
                return out
    out = _call(op, x, key=key)
    try:
        route[at] = _cache.get((op, (("key", key),), id(x._spec)))  # the key _call made
    except TypeError:  # a key that cannot key a dict: _call decides each time
        route[at] = None
    return out


def _fast_moves(entry: _Entry, args: tuple, kargs: list) -> bool:
    """The fast path's step 3 for an entry whose plan moves inputs (``entry.hows``): ``_move``
    with the entry's planned one-step moves, written out, under its label for the agreement
    check (the general path's ``_named``). False, moving nothing, where the general path
    must run: dt.explain records, or a gradient function's move memo is open."""
    if _explain.active or _memo.table is not None:
        return False
    stack = _doing.stack
    if stack is None:
        stack = _doing.stack = Stack()
    stack.append(entry.label)
    try:  # _move written out for one-step moves: an input given twice (d * d) moves once
        hows = entry.hows
        moves = entry.plan[3]  # per input its chain: one target where it moves
        done: list | None = None  # (tensor, move, its moved array) of this call's moves
        for k, i in enumerate(entry.pos):
            how = hows[k]
            if how is None:  # does not move: kargs holds its local array
                continue
            t = args[i]
            if done is not None:
                for d in done:
                    if d[0] is t and d[1] is how:
                        kargs[i] = d[2]
                        break
                else:
                    kargs[i] = local = moved(t, moves[k][0], None, how)
                    done.append((t, how, local))
                continue
            kargs[i] = local = moved(t, moves[k][0], None, how)
            done = [(t, how, local)]
    finally:
        stack.pop()
    return True


# Note [Reduced values used]
# A Partial tensor whose reduced value is remembered (Note [One move per tensor] in
# tensor.py: it was reduced for an earlier op, or rode along with another's reduction, Note
# [Small reductions ride together]) is used in that reduced form where a plan would have kept
# it Partial: ``sums / m`` after ``sums`` was reduced gives a Replicate result, not a Partial
# one that a later op must reduce again. The value is the same; it is in fact numpy's order
# of operations (the sum first). An entry knows which of its inputs the plan keeps Partial
# (``keeps``), and the call is made again with those inputs that have a reduced value as
# Replicate DistTensors of it (their specs are the inputs' own ``without_partials()``, so the
# new call's entry is found by identity next time). Not for ops that only move elements
# (their results may be views of the input, and a write into such a view must reach the
# tensor itself; ``real`` and ``imag`` too: numpy's are views), nor for an input that
# requires a gradient, nor on a mesh of fewer ranks than the world: a rank outside the mesh
# never moves its tensors, so it remembers no reduced value and must still agree on the
# result's placements.
_VIEWS = frozenset({"real", "imag"})


def _reduced(entry: _Entry, args: tuple) -> list | None:
    """``args`` with the kept-Partial inputs that have a remembered reduced value as
    Replicate DistTensors of it; None where none has (Note [Reduced values used])."""
    if entry.mesh.size != comm.world().size:  # ranks outside the mesh remember nothing
        return None
    sub = None
    for i in entry.keeps:
        a = args[i]
        if a._moved is None or a.requires_grad:
            continue
        plain = a._spec.without_partials()
        value = remembered(a, plain)
        if value is not None:
            if sub is None:
                sub = list(args)
            sub[i] = DistTensor(value, plain)
            sub[i]._lin = a._lin  # the same value (Note [Lineage names the tensor])
    return sub


def _mixed_key(op: Op, attrs_key: tuple, args: tuple, sequences: bool = True) -> tuple:
    """(identity key, kernel arguments, whether a gradient is needed, the first DistTensor's
    shard) of a call with other arguments than one or two DistTensors; the key is None when
    an argument is an array (kernel arguments ``_ARRAY``: Note [Array operands of one
    spec]), or, with ``sequences``, a list, tuple or string (``_SEQUENCE``: Note [Lists are
    arrays]), or the shards' array types differ."""
    key: list[Any] = [op, attrs_key]
    kargs = list(args)
    grad = False
    first = None
    for i, a in enumerate(args):
        if isinstance(a, DistTensor):
            key.append(id(a._spec))
            kargs[i] = a._local
            grad = grad or a.requires_grad
            if first is None:
                first = a._local
            elif type(a._local) is not type(first):
                return None, None, False, None
        elif isinstance(a, np.ndarray) or type(a) in _ARRAYS:
            return None, _ARRAY, False, None
        elif sequences and (
            type(a) in _SEQUENCES
            or (type(a) not in _NUMBERS and isinstance(a, _TEXTS) and _text(a))
        ):  # a string, or a numpy scalar dt cannot hold (np.str_, np.datetime64)
            return None, _SEQUENCE, False, None
        else:
            key.append(None)
    return tuple(key), kargs, grad, first


_ARRAY = ["an array argument"]  # _mixed_key's kernel arguments where an argument is an array
_SEQUENCE = ["a list, tuple or string argument"]  # the same where one is that
_SEQUENCES = frozenset({list, tuple, str, bytes})
_TEXTS = (str, bytes, np.generic)  # what _mixed_key looks at the dtype of
# Python's scalars and numpy's numeric ones: operands _mixed_key need not look at further
_NUMBERS = _SCALARS | frozenset(np.dtype(c).type for c in "?bBhHiIlLqQefdgFDG")


def _text(a: Any) -> bool:
    """Whether ``a`` (a str, bytes or numpy scalar) is text or another value no DistTensor
    holds: a string, or a numpy scalar of a dtype not bool or numeric (np.str_,
    np.datetime64)."""
    return isinstance(a, (str, bytes)) or a.dtype.kind not in "biufc"


# Note [Lists are arrays]
# An op's positional arguments are its data (attributes are keywords), and numpy takes a list
# or tuple there as the array it makes of it: ``x + [1, 2, 3]``, ``np.where(m, x, [0, 1])``.
# Passed to the kernel as it is, a list met each rank's shard instead of the global tensor:
# numpy's broadcasting error for a list of the tensor's length, and a result numpy would
# refuse for one of the shard's. So ``_sequences`` makes each list or tuple argument the
# array numpy makes of it (numeric ones: a list of DistTensors, or of strings, stays as it
# is), which then takes the array operands' path (Note [Array operands of one spec]). A
# string among the data (``np.add(x, "a")``; bytes, a list of strings, a numpy scalar of a
# dtype no DistTensor holds such as np.str_ or np.datetime64) is no array dt can hold: the
# kernel first runs on 0-d stand-ins of the tensors, so numpy's own error comes on every rank
# before anything moves (a Partial x was reduced first), and numpy's value where it has one.
# (``x == "a"`` is numpy's all-False array: Note [Comparisons numpy cannot make] in
# tensor.py.)
def _sequences(op: Op, args: tuple, attrs: dict) -> tuple | None:
    """``args`` with each list or tuple argument as numpy's array of it, where it holds no
    DistTensor and makes a numeric array; None where none does. Raises numpy's error for a
    string argument the kernel refuses."""
    out = None
    probe = None  # the kernel's arguments for numpy's error: stand-ins, the text as it is
    for i, a in enumerate(args):
        ta = type(a)
        if ta not in _NUMBERS and isinstance(a, _TEXTS) and _text(a):
            if probe is None:
                probe = [stand_in(b) for b in args]
        elif (ta is list or ta is tuple) and not any(isinstance(e, DistTensor) for e in a):
            try:
                arr = np.asarray(a)
            except (ValueError, TypeError):  # ragged: numpy refuses it in the op as well
                continue
            if arr.dtype.kind in "biufc":
                if out is None:
                    out = list(args)
                out[i] = arr
            elif arr.dtype.kind != "O":  # strings, dates: numpy's array of them
                if probe is None:
                    probe = [stand_in(b) for b in args]
                probe[i] = arr
    if probe is not None and not op.ctx:
        with np.errstate(all="ignore"):
            op.kernel(*probe, **attrs)  # numpy's error, if it has one
    return None if out is None else tuple(out)


_STAND_INS: dict[np.dtype, np.ndarray] = {}


def stand_in(a: Any) -> Any:
    """A 0-d array of ``a``'s dtype for a DistTensor or an array (device ones too); other
    arguments (Python and numpy scalars, lists, strings) as they are: a kernel run on these
    raises numpy's error for the operands' dtypes, and moves nothing."""
    dtype = getattr(a, "dtype", None)
    if dtype is None or isinstance(a, np.generic):
        return a
    s = _STAND_INS.get(dtype)
    if s is None:
        s = np.zeros((), dtype)
        s.flags.writeable = False  # an extra argument is a ufunc's ``out``: numpy refuses it
        _STAND_INS[dtype] = s
    return s


# Note [Array operands of one spec]
# An op with a numpy array among its arguments (``labels[:, None] == np.arange(k)[None, :]``,
# ``scores + mask``) took the general path every call: the general path makes each array a
# Replicate DistTensor of a new spec, so no identity key could find the call again (about
# 10 us instead of 2). Where every DistTensor argument holds host shards and none requires a
# gradient, ``_operands`` makes each host array of a numeric dtype a Replicate DistTensor
# first, as the general path would, but of one spec per (mesh, shape, dtype), kept in
# _OPERAND_SPECS: the call is then one of DistTensors alone, whose decision the identity
# key finds (Note [Dispatch fast path]). The kernel gets the same arrays and the plan the
# same specs, and the stand-in's lineage is the array's token, so the result's is the one the
# general path gives (Note [Lineage names the tensor] in tensor.py). Calls with a gradient
# keep the general path: their gradient functions see the arrays as the user passed them.
def _operands(args: tuple) -> tuple | None:
    """``args`` with each host array of a numeric dtype as a Replicate DistTensor of a kept
    spec on the DistTensors' mesh, or None where the call keeps the general path."""
    mesh = None
    for a in args:
        if isinstance(a, DistTensor):
            if a.requires_grad or type(a._local) is not _ND:
                return None
            if mesh is None:
                mesh = a._spec.mesh
    if mesh is None:
        return None
    out = list(args)
    for i, a in enumerate(args):
        if type(a) is _ND:
            key = (mesh, a.shape, a.dtype)
            hit = _OPERAND_SPECS.get(key)
            if hit is None:
                if a.dtype.kind not in "biufc":
                    return None
                if len(_OPERAND_SPECS) >= 1024:
                    _OPERAND_SPECS.clear()
                hit = _OPERAND_SPECS[key] = (_replicate(a, mesh)._spec, token(a))
            t = out[i] = DistTensor(a, hit[0])
            t._lin = hit[1]  # an array's token: its shape and dtype
            if (rec := _recording_on.rec) is not None:  # Note [Compiled steps] in capture.py
                rec.constant(a)
        elif type(a) in _ARRAYS:  # a device array, or an array type of another backend
            return None
    return tuple(out)


_OPERAND_SPECS: dict[tuple, tuple] = {}  # (mesh, shape, dtype) -> (spec, the array's token)


def _inputs(args: tuple, pos: tuple) -> tuple:
    """Per argument the tensor if it requires a gradient, else None: ``args`` itself when
    every argument is one (no tuple to build)."""
    if len(pos) == len(args):
        for a in args:
            if not a.requires_grad:
                break
        else:
            return args
    ins: list[Any] = [None] * len(args)
    for i in pos:
        if args[i].requires_grad:
            ins[i] = args[i]
    return tuple(ins)


def _general(op: Op, args: tuple, attrs: dict, idkey: Any, entry: _Entry | None) -> Any:
    if entry is not None:  # decided for these very specs (Note [Dispatch fast path])
        plan, pos = entry.plan, list(entry.pos)
        tensors = [args[i] for i in pos]
        mesh = entry.mesh
        t = type(tensors[0]._local)  # one type: the identity key was made (_mixed_key)
    else:
        plan, mesh, pos, tensors, t = _normalize_and_decide(op, args, attrs, idkey)
        if plan is None:  # no DistTensor: plain arrays
            kernel = op.kernel if t not in _DEVICE else device_kernel(op, t)
            result = kernel(*args, ctx=None, **attrs) if op.ctx else kernel(*args, **attrs)
            return result[0] if op.saves else result
        if idkey is not None:
            if len(_cache) >= _CACHE_LIMIT:
                _cache.clear()
            entry = _cache[idkey] = _Entry(
                op, tuple(t._spec for t in tensors), plan, tuple(pos), len(args), idkey
            )
            if entry.keeps is not None and (sub := _reduced(entry, args)) is not None:
                return _call(op, *sub, **attrs)
    targets, out_placements, out_shapes, moves, _ = plan
    # every rank (its shards are of one backend) knows here whether the op runs on them
    if t not in _DEVICE:
        t, kernel = _ND, op.kernel
    else:
        kernel = device_kernel(op, t)
    # 3. reshard (the plan knows which inputs move)
    coord = mesh.get_coord(comm.get_rank())
    kargs = list(args)
    if moves is None:
        for i, a in zip(pos, tensors):
            kargs[i] = a._local
    elif out_shapes is None:  # the replicate fallback: Note [Communication outside rules]
        with outside_rules(op.name, NO_RULE), _named(op, tensors, entry):
            _move(pos, tensors, moves, kargs)
    else:
        with _named(op, tensors, entry):  # named if the ranks diverge
            _move(pos, tensors, moves, kargs)
    if moves is None and out_shapes is None:  # a fallback with nothing to move
        note_outside_rules(op.name, NO_RULE, 0)
    # 4. kernel
    if (rec := _recording_on.rec) is not None:  # dt.compile records (Note [Compiled steps])
        why = _unreplayable(op, coord, out_shapes, t, tensors)
        if why is None:
            result = _recorded(op, kargs, attrs, coord, plan)
            return _finish(
                op, args, attrs, entry, plan, mesh, coord, kargs, result, tensors, pos, t
            )
        rec.refuse(why)  # the kernel runs as always
    if coord is None:
        result = _probe(op, kargs, pos, attrs, targets, out_placements)
    elif op.ctx:
        result = kernel(
            *kargs, ctx=KernelContext(targets, out_placements, coord, out_shapes), **attrs
        )
    else:
        result = kernel(*kargs, **attrs)
    extra = None
    if op.saves:  # Note [Saved for backward]; the probe's stand-ins save nothing
        if coord is not None:
            result, extra = result
        elif type(result) is tuple:
            result = result[0]
    return _finish(op, args, attrs, entry, plan, mesh, coord, kargs, result, tensors, pos, t, extra)


class _Kernel:
    """An op's host kernel as a compiled step replays it: the result as ``_wrap`` takes it
    (its arrays, a saving kernel's saved values left out), one object per op."""

    __slots__ = ("kernel", "saves")

    def __init__(self, op: Op) -> None:
        self.kernel, self.saves = op.kernel, op.saves

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.kernel(*args, **kwargs)
        if self.saves:
            result = result[0]
        if type(result) is tuple:
            return tuple(r if type(r) is _ND else np.asarray(r) for r in result)
        return result if type(result) is _ND else np.asarray(result)


_KERNELS: dict[Op, _Kernel] = {}


def _unreplayable(op: Op, coord, out_shapes, t: type, tensors: list) -> str | None:
    """Why a compiled step's replay could not repeat this call's kernel (a recording is then
    refused: Note [Compiled steps] in capture.py), or None."""
    if coord is None:
        return "a rank outside a tensor's mesh"
    if out_shapes is None:
        return f"{op.name!r} has no rule (the replicate fallback)"
    if t is not _ND:
        return "device shards"
    if autograd._state.enabled and any(a.requires_grad for a in tensors):
        return "a gradient to record"
    return None


def _recorded(op: Op, kargs: list, attrs: dict, coord, plan) -> Any:
    """Step 4 while dt.compile records this thread, for a call a replay can repeat
    (``_unreplayable``): the host kernel run as an event of the recording, its result as
    ``_wrap`` takes it (nothing records a gradient, so a saving kernel's saved values go)."""
    targets, out_placements, out_shapes, _, _ = plan
    k = _KERNELS.get(op)
    if k is None:
        k = _KERNELS[op] = _Kernel(op)
    kw = attrs
    if op.ctx:
        kw = {**attrs, "ctx": KernelContext(targets, out_placements, coord, out_shapes)}
    return recording.run(k, tuple(kargs), kw)


def _named(op: Op, tensors: list, entry: _Entry | None) -> doing:
    """What the agreement check names while the inputs move: the op and its inputs; an
    entry's label is made once (its specs are the very ones of this call)."""
    if entry is None:
        return doing(_label, op.name, tensors)
    item = entry.label
    if item is None:
        item = entry.label = fixed_item(_label, op.name, [t._spec for t in tensors])
    return doing.fixed(item)


def _label(name: str, tensors: list) -> str:
    """``matmul of (8, 4) float64 [Shard(dim=0)], (4, 4) float64 [Replicate()]``."""
    ins = ", ".join(f"{t.shape} {t.dtype} {list(t.placements)}" for t in tensors)
    return f"{name} of {ins}"


def _move(pos, tensors, moves, kargs, hows=None) -> None:
    """Step 3: reshard the inputs that move, into ``kargs``. One reshard per distinct input:
    ``d * d`` on a Partial d reduces d once (Note [One move per input]); autograd's memo also
    spans a whole gradient function. ``hows``: per input its planned one-step move, where
    the caller keeps them (the fast path's entry)."""
    memo = _memo.table
    if memo is None and len(tensors) > 1:
        memo = {}
    for k, (i, t, chain) in enumerate(zip(pos, tensors, moves)):
        if not chain:
            kargs[i] = t._local
            continue
        hit = memo.get((id(t), chain[-1])) if memo is not None else None
        if hit is not None and hit[0] is t:  # resharded the same way earlier: reuse
            kargs[i] = hit[1]
            continue
        # the chain is usually just the target; see _decide for bool Partials. A tensor moved
        # there by an earlier op is not moved again (Note [One move per tensor] in tensor.py)
        local = moved(t, chain[-1], chain, None if hows is None else hows[k])
        kargs[i] = local
        if memo is not None:
            memo[(id(t), chain[-1])] = (t, local)


def _normalize_and_decide(op: Op, args: tuple, attrs: dict, idkey: Any):
    """Steps 1 and 2 of the general path: (plan, mesh, tensor positions, tensors, the shards'
    array type), with arrays as Replicate DistTensors; plan None when no argument is a
    DistTensor. Host and device data in one call raise here (Note [Array backends])."""
    mesh = None
    first = 0  # the position of the first DistTensor (for the message)
    pos: list[int] = []
    tensors: list[Any] = []
    arrays = False
    t: Any = None
    for i, a in enumerate(args):
        if isinstance(a, DistTensor):
            m = a._spec.mesh
            if mesh is None:
                mesh, first = m, i
            elif m is not mesh and m != mesh:
                raise ValueError(
                    different_meshes(op.name, (f"operand {first}", mesh), (f"operand {i}", m))
                )
            ta = type(a._local)
            if t is None:
                t = ta
            elif ta is not t and (ta in _DEVICE or t in _DEVICE):
                raise backend.mixed(op.name, backend.of_type(t), backend.of_type(ta))
            pos.append(i)
            tensors.append(a)
        elif isinstance(a, np.ndarray) or type(a) in _ARRAYS:
            pos.append(i)
            tensors.append(a)
            arrays = True
    if mesh is None:  # plain arrays: the first device array's type decides the kernel
        return None, None, pos, tensors, next((type(a) for a in tensors if type(a) in _DEVICE), _ND)
    if arrays:
        if (rec := _recording_on.rec) is not None:  # arrays the program made (or its inputs)
            for a in tensors:
                if not isinstance(a, DistTensor):
                    rec.constant(a)
        tensors = [
            a if isinstance(a, DistTensor) else _replicate(_on(op, a, t), mesh) for a in tensors
        ]
    specs = tuple([t._spec for t in tensors])
    tpos = tuple(pos)
    try:
        key = (op.name, specs, tpos, len(args), tuple(attrs.items()) if attrs else _NO_ATTRS)
        plan = _cache.get(key)
    except TypeError:  # unhashable attributes: decide every time
        key, plan = None, None
    if plan is None:
        plan = _decide(op, specs, tpos, len(args), attrs, mesh)
        if key is not None:
            if len(_cache) >= _CACHE_LIMIT:  # programs whose shapes keep changing: start over
                _cache.clear()
            _cache[key] = plan
    return plan, mesh, pos, tensors, t


def _on(op: Op, a: Any, t: type) -> Any:
    """Array operand ``a`` among shards of type ``t``: as it is when both are host or both of
    that device; a 0-d host array (a scalar, as numpy's are) moved to the device; anything
    else refused (Note [Array backends])."""
    ta = type(a)
    if ta is t or (ta not in _DEVICE and t not in _DEVICE):
        return a
    if ta not in _DEVICE and a.ndim == 0:
        return backend.of_type(t).asarray(a)
    raise backend.mixed(op.name, backend.of(a), backend.of_type(t))


def _finish(op, args, attrs, entry, plan, mesh, coord, kargs, result, tensors, pos, t, extra=None):
    """5. wrap, and record for backward when an input needs a gradient (``t``: the shards'
    array type; ``extra``: what a saving kernel kept, Note [Saved for backward])."""
    targets, out_placements, out_shapes, moves, out_specs = plan
    out = _wrap(op, result, mesh, coord, out_placements, out_shapes, out_specs, t)
    # Note [Lineage names the tensor]: the fast path makes the same hash
    code = (
        entry.code if entry is not None else _code(op, tuple(attrs.items()) if attrs else _NO_ATTRS)
    )
    stamp(out, hash((code, *[token(a) for a in args])))
    # a small Partial result's ride key (Note [Small reductions ride together] in tensor.py);
    # an op that only moves elements makes views, which would keep their bases alive
    pends = None
    if type(out) is DistTensor and not op.moves_only:
        pends = rides(out._spec)
    if (
        entry is not None
        and (entry.simple or entry.movable)
        and coord is not None
        and type(out) is DistTensor
    ):
        if entry.movable and entry.hows is None:
            entry.hows = tuple(
                _reshard_move(a._spec, chain[0]) if chain else None
                for a, chain in zip(tensors, moves)
            )
            if entry.label is None:
                entry.label = fixed_item(_label, op.name, [a._spec for a in tensors])
        # the fast path may take the next call (Note [Dispatch fast path])
        kctx = KernelContext(targets, out_placements, coord, out_shapes) if op.ctx else None
        # integer/bool results and the ops of NOT_DIFFERENTIABLE are constants for autograd
        recorded = out.dtype.kind in "fc" and op.name not in _NOT_DIFFERENTIABLE
        entry.last = (
            _comm_ctx.world,
            coord,
            kctx,
            out.dtype,
            out._spec,
            out._local.shape,
            recorded,
            (out._spec,),
            _GRADIENTS.get(op.name),  # None: backward refuses (autograd._refuse)
            pends,
        )
    for a in tensors:  # the flag first: the thread-local switch only when it matters
        if a.requires_grad:
            if autograd._state.enabled:
                saved = _saved(args, pos, kargs, moves, targets, coord, t)
                inputs = tuple(a if getattr(a, "requires_grad", False) else None for a in args)
                autograd.record_op(op.name, args, attrs, out, saved, inputs, extra)
            break
    if pends and coord is not None and not out.requires_grad:
        note_partial(out, args)
    return out


def _saved(args, pos, kargs, moves, targets, coord, t):
    """The arguments for the gradient: inputs that were resharded as the layout they were
    computed in (same global value), so backward does not pay for the same reshard again."""
    if moves is None:
        return args
    saved = list(args)
    xp = np if t not in _DEVICE else backend.of_type(t).xp
    for i, chain, target in zip(pos, moves, targets):
        if chain:  # the same specs on every rank (a rank outside the mesh holds nothing)
            local = (
                kargs[i] if coord is not None else xp.empty(target.local_shape(None), target.dtype)
            )
            saved[i] = DistTensor(local, target)
    return tuple(saved)


def _wrap(op: Op, result, mesh, coord, out_placements, out_shapes, out_specs, t=_ND):
    if out_shapes is None:  # replicate fallback: every rank ran the whole op
        return _wrap_replicated(result, mesh)
    if coord is not None and not isinstance(result, tuple):  # the common case, cached specs
        if type(result) is not t:
            result = _as_array(result, t)
        # per (dtype, coordinate): threads of dt.simulate share plans; int x + 1 and x + 1.5 too
        hit = out_specs.get((result.dtype, coord))
        if hit is None:
            spec = DistSpec(mesh, out_placements[0], out_shapes[0], result.dtype)
            hit = out_specs[(result.dtype, coord)] = (spec, spec.local_shape(coord))
        if result.shape != hit[1]:
            _wrong_rule(op, result.shape, hit[0], coord)
        return DistTensor(result, hit[0])
    results = result if isinstance(result, tuple) else (result,)
    outs = []
    for res, pl, shape in zip(results, out_placements, out_shapes):
        res = res if type(res) is t else _as_array(res, t)
        spec = DistSpec(mesh, pl, shape, res.dtype)
        if coord is None:  # the probe's stand-in: an empty shard of the inputs' backend
            res = (np if t not in _DEVICE else backend.of_type(t).xp).empty(
                spec.local_shape(None), res.dtype
            )
        elif res.shape != spec.local_shape(coord):
            _wrong_rule(op, res.shape, spec, coord)
        outs.append(DistTensor(res, spec))
    return tuple(outs) if isinstance(result, tuple) else outs[0]


def _wrong_rule(op: Op, got: tuple, spec: DistSpec, coord) -> None:
    raise RuntimeError(
        f"internal error in the SPMD rule of {op.name!r}: the kernel made a local shape {got} "
        f"where {spec} needs {spec.local_shape(coord)}"
    )


def _replicate(a: np.ndarray, mesh) -> DistTensor:
    spec = DistSpec.make(mesh, [Replicate()] * mesh.ndim, a.shape, a.dtype, what="operand")
    return DistTensor(a, spec)


# Note [The replicate fallback on a device]
# A numpy function disttensor does not implement runs on the gathered values (``fallback``).
# On device tensors (every DistTensor operand on one device backend; host and device
# DistTensors together raise backend.mixed before anything moves) it runs where the data is:
# * the function of the same name and module path in the device's array module
#   (numpy.polyval -> xp.polyval, numpy.linalg.inv -> xp.linalg.inv, numpy.add.accumulate ->
#   xp.add.accumulate) gets the gathered device values; host numpy arrays among the other
#   arguments are copied onto the device first (the user handed them to a numpy function, as
#   parameters: weights, bins, coefficients; a device module takes no host arrays; an
#   operator or a dt op refuses a host operand instead), everything else goes as it is, so a
#   device function that takes fewer forms than numpy's (a list for an array) raises its own
#   error; a caller may give its own device function (``on_device``: getitem's advanced keys);
# * where the module has no such function, where ``func`` is not numpy's own (the
#   copy-and-write wrappers of the in-place writers, ``operator.getitem``), and for numpy's
#   functions that write into an argument (``_WRITERS``, ufunc.at: a numpy array the user
#   passed must be written as numpy writes it, not a device copy of it), numpy's runs on host
#   copies of the gathered values, explicitly: the call is accounted a second time under
#   NO_DEVICE_FUNCTION (so dt.fallback_report() and dt.CommCounter().fallbacks show it) and
#   a RuntimeWarning names the function, once per name and process.
# Array results (numpy scalars too) come back Replicate on the device, as numpy's come back
# Replicate on the host; other results (Python bools, ints, dtypes) as the function returned
# them. The collectives are the host run's (the same gathers), and so is the gradient record:
# a node that says the function has no gradient.
NO_DEVICE_FUNCTION = (
    "no device function: numpy's run on host copies, array results copied back to the device"
)
# numpy's functions that write into an argument (ops/numpy_interop.py's writers, called here
# with a numpy target)
_WRITERS = frozenset({np.copyto, np.put, np.putmask, np.place, np.fill_diagonal, np.put_along_axis})
_warned: set[str] = set()  # names warned about (NO_DEVICE_FUNCTION), once per process
_warned_lock = threading.Lock()


def fallback(
    name: str,
    func: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    reason: str = "no dt implementation: inputs gathered, computed whole on every rank",
    on_device: Callable[..., Any] | None = None,
) -> Any:
    """The replicate fallback for any numpy function: DistTensors (also inside lists, tuples
    and keyword arguments) become their global values, ``func`` runs on every rank, and array
    results come back Replicate on the operands' mesh. Accounted per (name, ``reason``):
    Note [Communication outside rules]. On device tensors the device's function of the same
    name runs (or ``on_device``, a function of the caller's that takes device arrays), or
    numpy's on host copies: Note [The replicate fallback on a device]."""
    if (rec := _recording_on.rec) is not None:  # Note [Compiled steps] in capture.py
        rec.refuse(f"{name!r} has no rule (the replicate fallback)")
    found: list[DistTensor] = []

    def collect(a) -> None:
        if isinstance(a, DistTensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            for b in a:
                collect(b)

    collect(args)
    collect(list(kwargs.values()))
    other = next((t.mesh for t in found if t.mesh != found[0].mesh), None)
    if other is not None:
        raise ValueError(different_meshes(name, ("one operand", found[0].mesh), ("another", other)))
    if not found:
        return func(*args, **kwargs)
    be = _one_backend(name, found) if _DEVICE else backend.NUMPY
    mesh = found[0].mesh
    rep = [Replicate()] * mesh.ndim
    with outside_rules(name, reason):
        # a zero-size tensor's global value is known on every rank without a gather: numpy
        # then decides (np.ptp of an empty axis raises its own error) before anything moves
        values = {
            id(t): be.xp.empty(t.shape, t.dtype)
            if 0 in t.shape
            else moved(t, t._spec.replace(placements=rep))
            for t in found
        }
    move = None  # what other array arguments become on a device (None: as they are)
    if be.device and on_device is not None:  # the caller's: its arguments as they are
        func = on_device
    elif be.device:
        run = _device_function(func, be.xp)
        if run is None:  # numpy's on host copies
            values = {k: backend.to_host(v) for k, v in values.items()}
            move = _host_leaf
        else:
            func, move = run, functools.partial(_device_leaf, be)

    def value(a):
        if isinstance(a, DistTensor):
            return values[id(a)]
        if isinstance(a, (list, tuple)):
            return type(a)(value(b) for b in a)
        return a if move is None else move(a)

    result = func(*value(args), **{k: value(v) for k, v in kwargs.items()})
    if be.device:
        if move is _host_leaf:
            note_outside_rules(name, NO_DEVICE_FUNCTION, 0)
            _warn_host(name, be)
        result = _on_backend(result, be)
    out = _wrap_replicated(result, mesh)
    if autograd._state.enabled and any(t.requires_grad for t in found):
        outs = out if isinstance(out, tuple) else (out,)
        if all(isinstance(o, DistTensor) for o in outs):  # backward says it has no gradient
            autograd.record_op(f"{name} (replicate fallback)", tuple(found), {}, out)
    return out


def _one_backend(name: str, found: list) -> backend.Backend:
    """The backend of the fallback's DistTensor operands; backend.mixed when host and device
    (or two devices) meet."""
    t = type(found[0]._local)
    for x in found[1:]:
        tx = type(x._local)
        if tx is not t and (tx in _DEVICE or t in _DEVICE):
            raise backend.mixed(name, backend.of_type(t), backend.of_type(tx))
    return backend.of_type(t)


def _device_function(func: Callable[..., Any], xp: Any) -> Callable[..., Any] | None:
    """numpy's ``func`` in the array module ``xp``: the function of the same name under the
    same module path (numpy.linalg.inv -> xp.linalg.inv), a ufunc or a ufunc's method the
    same (numpy.add.accumulate -> xp.add.accumulate); None where ``xp`` has none, where
    ``func`` is not one of numpy's public functions or ufuncs, and for numpy's writers
    (Note [The replicate fallback on a device])."""
    owner = getattr(func, "__self__", None)
    if isinstance(owner, np.ufunc):  # np.hypot.__call__, np.add.accumulate
        ours = getattr(xp, owner.__name__, None)
        if func.__name__ == "__call__" or ours is None:
            return ours
        return getattr(ours, func.__name__, None) if func.__name__ != "at" else None
    name, module = getattr(func, "__name__", None), getattr(func, "__module__", None) or ""
    if not name or not (module == "numpy" or module.startswith("numpy.")):
        return None
    path = module.split(".")[1:]
    if any(p.startswith("_") for p in path):  # numpy._core.umath, numpy.lib._..._impl: top level
        path = []
    home, there = np, xp
    for part in path:
        home, there = getattr(home, part, None), getattr(there, part, None)
    if home is None or getattr(home, name, None) is not func or func in _WRITERS:
        return None  # not numpy's public function, or one that writes into an argument
    return getattr(there, name, None) if there is not None else None


def _device_leaf(be: backend.Backend, a: Any) -> Any:
    """An argument of a device function: a host array copied onto the device."""
    return be.asarray(a) if isinstance(a, np.ndarray) else a


def _host_leaf(a: Any) -> Any:
    """An argument of numpy's function run for device tensors: a device array copied out."""
    return backend.to_host(a) if type(a) in _DEVICE else a


def _on_backend(result: Any, be: backend.Backend) -> Any:
    """A function's result with its host arrays and numpy scalars on ``be``'s device."""
    if isinstance(result, tuple):
        return tuple(_on_backend(r, be) for r in result)
    if isinstance(result, list):
        return [_on_backend(r, be) for r in result]
    if isinstance(result, (np.ndarray, np.generic)):
        return be.asarray(result)
    return result


def _warn_host(name: str, be: backend.Backend) -> None:
    """The RuntimeWarning of NO_DEVICE_FUNCTION, once per function name and process."""
    with _warned_lock:
        if name in _warned:
            return
        _warned.add(name)
    warnings.warn(
        f"disttensor: {name} has no device function disttensor can call on {be.name} arrays; "
        f"numpy's {name} ran on host copies of the gathered values and its array results "
        "were copied back to the device (dt.fallback_report() counts these calls; this "
        "warning is given once per function)",
        RuntimeWarning,
        stacklevel=3,
    )


def _decide(op: Op, specs, pos, nargs, attrs, mesh):
    rule = get_rule(op.rule) if op.rule else None
    if rule is None:  # the replicate fallback: accounted per call in _general
        rep = (Replicate(),) * mesh.ndim
        targets = tuple(s.replace(placements=rep) for s in specs)
        return targets, None, None, _moves(specs, specs, targets), {}
    # A bool Partial is a logical or/and, not a sum, so an op that computes must not pass it
    # through as one: such an input is reduced first (a reshard to its Partial-free spec), and
    # its rule sees that. Ops that only move elements keep it (Note [Shape ops move elements]).
    firsts = tuple(
        s.without_partials() if s.dtype == np.bool_ and s.has_partial() and not op.moves_only else s
        for s in specs
    )
    res = rule(
        tuple(TensorSpec(s.shape, s.placements, s.dtype) for s in firsts),
        mesh.shape,
        pos=pos,
        nargs=nargs,
        **attrs,
    )
    targets = tuple(_target(s, p) for s, p in zip(specs, res.inputs))
    return targets, res.outputs, res.shapes, _moves(specs, firsts, targets), {}


def _target(spec: DistSpec, placements: tuple) -> DistSpec:
    """``spec`` with ``placements``; where that is its Partials read as Replicate (a
    reduction), the very object ``without_partials`` keeps on it, so moves and remembered
    values compare it by identity (``tensor._together``, the memo's dict)."""
    plain = spec.without_partials()
    placements = tuple(placements)
    return plain if plain.placements == placements else spec.replace(placements=placements)


def _moves(specs, firsts, targets):
    """Per input, the specs to reshard through (empty: none); None when nothing moves. A
    chain that only relabels mesh dims of size 1 (``Shard(0)`` as ``Replicate`` on a mesh of
    one rank) is empty: the local array is the same, so the op runs as if nothing moved."""
    chains = []
    for s, f, t in zip(specs, firsts, targets):
        chain, cur = [], s
        for c in (f, t):
            if c != cur:
                chain.append(c)
                cur = c
        if chain and all(_relabels(s, c) for c in chain):
            chain = []
        chains.append(tuple(chain))
    return tuple(chains) if any(chains) else None


def _relabels(spec: DistSpec, dst: DistSpec) -> bool:
    """Whether ``spec`` and ``dst`` differ only in the placements of mesh dims of size 1,
    whose one rank holds the same local array under any placement."""
    return all(
        p == q or n == 1 for p, q, n in zip(spec.placements, dst.placements, spec.mesh.shape)
    )


def _probe(op: Op, kargs, pos, attrs, targets, out_placements):
    """Output dtypes on a rank outside the mesh: the kernel on one-element stand-ins."""
    for i, t in zip(pos, targets):
        kargs[i] = np.zeros((1,) * len(t.shape), t.dtype)
    try:
        with np.errstate(all="ignore"):  # stand-in values: their warnings mean nothing
            if op.ctx:
                return op.kernel(*kargs, ctx=KernelContext(targets, out_placements, None), **attrs)
            return op.kernel(*kargs, **attrs)
    except Exception:  # shape-dependent kernels fail on stand-ins: the first input's dtype
        stand_in = np.zeros((), targets[0].dtype)
        return tuple(stand_in for _ in out_placements) if len(out_placements) > 1 else stand_in


def _wrap_replicated(result, mesh):
    if isinstance(result, tuple):
        return tuple(_wrap_replicated(r, mesh) for r in result)
    if isinstance(result, list):
        return [_wrap_replicated(r, mesh) for r in result]
    if isinstance(result, (np.ndarray, np.generic)) or type(result) in _ARRAYS:
        arr = result if type(result) in _DEVICE else np.asarray(result)
        return _replicate(arr, mesh)
    return result  # Python objects (shapes, bools) as numpy returned them
