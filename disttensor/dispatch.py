"""The one dispatch path every op takes, in five steps (docs/architecture.md).

1. normalize: DistTensors and arrays are tensors (arrays become Replicate on the mesh of the
   DistTensors); Python and numpy scalars pass to the kernel as they are, so numpy's type
   promotion is unchanged;
2. rule: the op's SPMD rule, or the replicate fallback (counted, logged once per op);
   decisions are cached on (op, input specs, argument layout, attributes);
3. reshard the inputs that are not already as the rule needs;
4. run the local kernel on the shards (ranks outside the mesh skip it);
5. wrap the outputs.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import autograd, comm
from . import reshard as _reshard
from .placement import Replicate
from .spec import DistSpec
from .spmd import TensorSpec, get_rule
from .tensor import DistTensor

log = logging.getLogger("disttensor")

FALLBACKS: Counter[str] = Counter()  # op name -> replicate-fallback calls (dt.debug shows it)


@dataclass(frozen=True)
class KernelContext:
    """What a kernel that needs the global picture gets (``Op(ctx=True)``)."""

    inputs: tuple[DistSpec, ...]  # the specs the inputs were resharded to
    outputs: tuple[tuple, ...]  # output placements
    coord: tuple[int, ...] | None


@dataclass(frozen=True)
class Op:
    """An op: its local kernel and the name of its SPMD rule (None: replicate fallback)."""

    name: str
    kernel: Callable[..., Any]
    rule: str | None = None
    ctx: bool = False  # kernel takes ctx=KernelContext
    moves_only: bool = False  # only moves elements, so every Partial passes through exactly

    def __call__(self, *args: Any, **attrs: Any) -> Any:
        return apply(self, args, attrs)


# Note [One move per input]
# An op moves each distinct input once: when the same tensor object is an operand twice and
# the rule wants it in the same layout both times (``d * d``, ``x @ x``, ``where(m, x, x)``),
# the second operand takes the first one's resharded shard. Resharding is a pure function of
# (tensor, target spec), and nothing can change the tensor between two operands of one call,
# so the reuse is exact. Inside a gradient function the same table lives longer (_Memo).


class _Memo(threading.local):
    """Reshards to reuse while ``table`` is a dict (autograd sets one around each gradient
    function: a gradient is often resharded the same way for several of its uses, e.g. both
    gradients of a matmul, and nothing changes it in place meanwhile)."""

    table: dict | None = None


_memo = _Memo()


def memoized_reshards():
    """Context manager: inside it, an input resharded to the same spec twice moves once."""
    return _MemoScope()


class _MemoScope:
    def __enter__(self) -> None:
        self._prev = _memo.table
        _memo.table = {}

    def __exit__(self, *exc: Any) -> None:
        _memo.table = self._prev


_cache: dict[tuple, tuple] = {}
_CACHE_LIMIT = 65536
_NO_ATTRS = ()


def apply(op: Op, args: tuple, attrs: dict) -> Any:
    # 1. normalize (one pass; arrays become Replicate only when a DistTensor gives the mesh)
    mesh = None
    pos: list[int] = []
    tensors: list[Any] = []
    arrays = False
    for i, a in enumerate(args):
        if isinstance(a, DistTensor):
            m = a._spec.mesh
            if mesh is None:
                mesh = m
            elif m is not mesh and m != mesh:
                raise ValueError(
                    f"{op.name}: operands live on different meshes ({mesh} and {m}); "
                    "move one with dt.reshard(x, mesh, placements)"
                )
            pos.append(i)
            tensors.append(a)
        elif isinstance(a, np.ndarray):
            pos.append(i)
            tensors.append(a)
            arrays = True
    if mesh is None:  # no DistTensor: plain numpy
        return op.kernel(*args, ctx=None, **attrs) if op.ctx else op.kernel(*args, **attrs)
    if arrays:
        tensors = [t if isinstance(t, DistTensor) else _replicate(t, mesh) for t in tensors]
    specs = tuple([t._spec for t in tensors])
    # 2. rule (cached)
    try:
        key = (op.name, specs, tuple(pos), len(args), tuple(attrs.items()) if attrs else _NO_ATTRS)
        plan = _cache.get(key)
    except TypeError:  # unhashable attributes: decide every time
        key, plan = None, None
    if plan is None:
        plan = _decide(op, specs, tuple(pos), len(args), attrs, mesh)
        if key is not None:
            if len(_cache) >= _CACHE_LIMIT:  # programs whose shapes keep changing: start over
                _cache.clear()
            _cache[key] = plan
    targets, out_placements, out_shapes, moves, out_specs = plan
    # 3. reshard (the plan knows which inputs move)
    coord = mesh.get_coord(comm.get_rank())
    kargs = list(args)
    if moves is None:
        for i, t in zip(pos, tensors):
            kargs[i] = t._local
    else:
        # one reshard per distinct input: ``d * d`` on a Partial d reduces d once
        # (Note [One move per input]); autograd's memo also spans a whole gradient function
        memo = _memo.table
        if memo is None and len(tensors) > 1:
            memo = {}
        for i, t, chain in zip(pos, tensors, moves):
            if not chain:
                kargs[i] = t._local
                continue
            hit = memo.get((id(t), chain[-1])) if memo is not None else None
            if hit is not None and hit[0] is t:  # resharded the same way earlier: reuse
                kargs[i] = hit[1]
                continue
            local, spec = t._local, t._spec
            for step in chain:  # usually just the target; see _decide for bool Partials
                local, spec = _reshard.execute(local, spec, step), step
            kargs[i] = local
            if memo is not None:
                memo[(id(t), chain[-1])] = (t, local)
    # 4. kernel
    if coord is None:
        result = _probe(op, kargs, pos, attrs, targets, out_placements)
    elif op.ctx:
        result = op.kernel(*kargs, ctx=KernelContext(targets, out_placements, coord), **attrs)
    else:
        result = op.kernel(*kargs, **attrs)
    # 5. wrap, and record for backward when an input needs a gradient
    out = _wrap(op, result, mesh, coord, out_placements, out_shapes, out_specs)
    for t in tensors:  # the flag first: the thread-local switch only when it matters
        if t.requires_grad:
            if autograd._state.enabled:
                saved = _saved(args, pos, kargs, moves, targets, coord)
                autograd.record_op(op.name, args, attrs, out, saved)
            break
    return out


def _saved(args, pos, kargs, moves, targets, coord):
    """The arguments for the gradient: inputs that were resharded as the layout they were
    computed in (same global value), so backward does not pay for the same reshard again."""
    if moves is None:
        return args
    saved = list(args)
    for i, chain, target in zip(pos, moves, targets):
        if chain:  # the same specs on every rank (a rank outside the mesh holds nothing)
            local = (
                kargs[i] if coord is not None else np.empty(target.local_shape(None), target.dtype)
            )
            saved[i] = DistTensor(local, target)
    return tuple(saved)


def _wrap(op: Op, result, mesh, coord, out_placements, out_shapes, out_specs):
    if out_shapes is None:  # replicate fallback: every rank ran the whole op
        return _wrap_replicated(result, mesh)
    if coord is not None and not isinstance(result, tuple):  # the common case, cached specs
        if type(result) is not np.ndarray:
            result = np.asarray(result)
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
        res = np.asarray(res)
        spec = DistSpec(mesh, pl, shape, res.dtype)
        if coord is None:
            res = np.empty(spec.local_shape(None), res.dtype)
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


def _note_fallback(name: str) -> None:
    FALLBACKS[name] += 1
    if FALLBACKS[name] == 1:
        log.warning(
            "disttensor: %s has no SPMD rule; its inputs are replicated (all-gathered) and every "
            "rank computes the whole result",
            name,
        )


def fallback(name: str, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """The replicate fallback for any numpy function: DistTensors (also inside lists, tuples
    and keyword arguments) become their global values, ``func`` runs on every rank, and array
    results come back Replicate on the operands' mesh. Counted and logged once per name."""
    found: list[DistTensor] = []

    def collect(a) -> None:
        if isinstance(a, DistTensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            for b in a:
                collect(b)

    collect(args)
    collect(list(kwargs.values()))
    meshes = {t.mesh for t in found}
    if len(meshes) > 1:
        raise ValueError(f"{name}: operands live on different meshes {sorted(map(repr, meshes))}")
    if not found:
        return func(*args, **kwargs)
    mesh = found[0].mesh
    _note_fallback(name)
    rep = [Replicate()] * mesh.ndim
    values = {
        id(t): _reshard.execute(t._local, t._spec, t._spec.replace(placements=rep)) for t in found
    }

    def value(a):
        if isinstance(a, DistTensor):
            return values[id(a)]
        if isinstance(a, (list, tuple)):
            return type(a)(value(b) for b in a)
        return a

    result = func(*value(args), **{k: value(v) for k, v in kwargs.items()})
    out = _wrap_replicated(result, mesh)
    if autograd._state.enabled and any(t.requires_grad for t in found):
        outs = out if isinstance(out, tuple) else (out,)
        if all(isinstance(o, DistTensor) for o in outs):  # backward says it has no gradient
            autograd.record_op(f"{name} (replicate fallback)", tuple(found), {}, out)
    return out


def _decide(op: Op, specs, pos, nargs, attrs, mesh):
    rule = get_rule(op.rule) if op.rule else None
    if rule is None:
        _note_fallback(op.name)
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
        tuple(TensorSpec(s.shape, s.placements) for s in firsts),
        mesh.shape,
        pos=pos,
        nargs=nargs,
        **attrs,
    )
    targets = tuple(s.replace(placements=p) for s, p in zip(specs, res.inputs))
    return targets, res.outputs, res.shapes, _moves(specs, firsts, targets), {}


def _moves(specs, firsts, targets):
    """Per input, the specs to reshard through (empty: none); None when nothing moves."""
    chains = []
    for s, f, t in zip(specs, firsts, targets):
        chain, cur = [], s
        for c in (f, t):
            if c != cur:
                chain.append(c)
                cur = c
        chains.append(tuple(chain))
    return tuple(chains) if any(chains) else None


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
    if isinstance(result, (np.ndarray, np.generic)):
        arr = np.asarray(result)
        return _replicate(arr, mesh)
    return result  # Python objects (shapes, bools) as numpy returned them
