"""Shape ops and basic indexing, with numpy's names and semantics.

They only move elements, so a Shard stays wherever the layout lets each rank compute its
output shard from its input shard alone, and Partial inputs stay Partial; anything else is
gathered first (spmd/shape_rules.py: Note [Shape ops move elements], Note [Keeping a shard]).
Results are views of the local shard where numpy returns views (reshape, transpose, slicing).

>>> import numpy as np, disttensor as dt
>>> def program():
...     mesh = dt.ProcessMesh([0, 1])
...     x = dt.shard_tensor(np.arange(12).reshape(4, 3), mesh, [dt.Shard(0)])
...     y = dt.reshape(x, (2, 6))  # rows 0-1 and 2-3 stay where they are: no communication
...     return y.placements, dt.transpose(y).placements, dt.getitem(y, 1).numpy()
>>> dt.simulate(2, program)[0]
([Shard(dim=0)], [Shard(dim=1)], array([ 6,  7,  8,  9, 10, 11]))
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from .. import autograd, backend, comm, recording
from .. import reshard as _reshard
from ..dispatch import KernelContext, Op, fallback, host_method, keyed, with_xp
from ..placement import Shard
from ..recording import on as _recording
from ..spec import DistSpec
from ..spmd.shape_rules import (
    broadcast_shape,
    canonical_key,
    expand_dims_shape,
    index_layout,
    plain_key,
    reshape_shape,
    squeeze_shape,
    within,
)
from ..tensor import DistTensor, code_of, derive, name_unnamed, token
from . import indexing, mutation

_ND = np.ndarray


# -- kernels ---------------------------------------------------------------------------------
def _local(ctx: KernelContext | None, shape_fn: Callable[[], tuple[int, ...]]) -> tuple[int, ...]:
    """The output's local shape on this rank (the global shape on plain numpy input):
    from the rule's global shape when dispatch has it, else from ``shape_fn()``."""
    if ctx is None:
        return tuple(shape_fn())
    if ctx.shapes is not None:
        return ctx.local_shape(0)
    spec = ctx.inputs[0]
    return DistSpec(spec.mesh, ctx.outputs[0], tuple(shape_fn()), spec.dtype).local_shape(ctx.coord)


def _global_shape(x, ctx: KernelContext | None) -> tuple[int, ...]:
    return ctx.inputs[0].shape if ctx is not None else np.shape(x)


def _relaid(out_shape):
    """Kernel of an op that is a reshape of the local shard to the output's local shape (the
    rule only keeps Shards for which that holds). Size-1 axes make it the kernel of squeeze
    and expand_dims too: a sharded size-1 axis is 0 long off coordinate 0, which
    np.squeeze would refuse."""

    def kernel(x, *, ctx: KernelContext | None = None, **attrs):
        shape = _local(ctx, lambda: out_shape(_global_shape(x, ctx), **attrs))
        # an array's method (np.reshape is a Python wrapper around it that costs a
        # microsecond); numpy's function for the Python scalars of a call without tensors
        return x.reshape(shape) if type(x) is _ND else np.reshape(x, shape)

    def device(x, *, ctx: KernelContext | None = None, **attrs):  # the method: any array
        return x.reshape(_local(ctx, lambda: out_shape(_global_shape(x, ctx), **attrs)))

    kernel.device = device
    return kernel


def _broadcast_to(x, shape, scale=None, *, ctx: KernelContext | None = None, xp=np):
    """``scale`` (internal, > 0, so Partials of every reduce type stay exact): the broadcast
    times ``scale`` in one pass, the gradient of a mean (ops/gradients.py). ``xp``: the
    array module (a device's: Note [Array backends] in backend.py)."""
    out = _local(ctx, lambda: broadcast_shape(_global_shape(x, ctx), shape))
    # a copy, not numpy's read-only view: the result is a value of its own like other outputs;
    # filled by assignment (the shapes were checked above), ten times cheaper than
    # np.array(np.broadcast_to(x, out)) on small arrays
    x = xp.asarray(x)
    result = xp.empty(out, x.dtype)
    if scale is None:
        result[...] = x
    else:  # x * scale as numpy computes it (NEP 50: a Python float keeps x's dtype)
        xp.multiply(x, scale, out=result)
    return result


def _as_slice(r: range) -> slice:
    """The slice that picks ``r`` (a negative stop would count from the end)."""
    return slice(r.start, r.stop if r.stop >= 0 else None, r.step)


def _getitem(x, key, *, ctx: KernelContext | None = None, xp=np):
    """``x[key]`` for a canonical key, translated to this rank's shard. On an axis the rule
    left sharded but the key selects from, the rank writes the items it holds into zeros
    (the output is Partial(sum) there); an int held by another rank gives all zeros."""
    if ctx is None:
        return x[tuple(k if k is None or isinstance(k, int) else _as_slice(k) for k in key)]
    plan = ctx.memo  # worked out at the first call with this context: the same key
    if plan is None:
        plan = ctx.memo = _getitem_plan(ctx, key)
    src, dst, out_shape, picked = plan
    if src is None:
        return xp.zeros(out_shape, x.dtype)
    piece = x[src]
    if piece.shape == out_shape:  # this rank holds all of its output shard: a view of it,
        return piece.copy() if picked else piece  # but a pick's (the others hold zeros)
    out = xp.zeros(out_shape, x.dtype)
    out[dst] = piece
    return out


def _getitem_plan(ctx: KernelContext, key: tuple) -> tuple:
    """(index into this rank's shard, or None when it holds none of the output; where the
    piece goes in the output shard; the output shard's shape; whether the output is a pick,
    Partial where the input was split) for ``_getitem``. A pick is a copy on every rank: a
    view of the shard on the rank that holds it beside zeros on the others would follow
    later writes into the input on one rank only, and ranks that disagree on a tensor's
    value disagree on whether its remembered moves still hold (Note [One move per tensor]
    in tensor.py): one rank would reduce it again while another does not."""
    spec = ctx.inputs[0]
    picked = any(p.is_shard() and q.is_partial() for p, q in zip(spec.placements, ctx.outputs[0]))
    box = spec.local_box(ctx.coord)
    out_shape = _local(ctx, lambda: index_layout(spec.shape, key)[0])
    src: list[Any] = []
    dst: list[slice] = []
    axis = 0
    for k in key:
        if k is None:
            src.append(None)
            dst.append(slice(None))
            continue
        start, n = box[axis]
        whole = range(spec.shape[axis])
        axis += 1
        if isinstance(k, int):
            if not start <= k < start + n:
                return None, None, out_shape, picked
            src.append(k - start)
        elif k == whole:  # kept as it is, sharded or not
            src.append(slice(None))
            dst.append(slice(None))
        else:
            j0, j1 = within(k, start, start + n)
            part = k[j0:j1]
            local = range(part.start - start, part.stop - start, part.step)
            src.append(_as_slice(local) if j1 > j0 else slice(0, 0))
            dst.append(slice(j0, j1))
    return tuple(src), tuple(dst), out_shape, picked


def _getitem_grad(g, key, shape, *, ctx: KernelContext | None = None, xp=np):
    """``g`` written at ``key`` into zeros of ``shape`` (the gradient of getitem). Axes the
    rule kept sharded were taken whole, so they line up with this rank's shard of ``g``."""
    out = xp.zeros(_local(ctx, lambda: shape), g.dtype)
    idx: list[Any] = []
    kept: list[int] = []
    axis = 0
    for pos, k in enumerate(k for k in key if not isinstance(k, int)):
        if k is None:
            continue
        kept.append(pos)
    for k in key:
        if k is None:
            continue
        n = shape[axis]
        axis += 1
        if isinstance(k, int):
            idx.append(k)
        else:
            idx.append(slice(None) if k == range(n) else _as_slice(k))
    out[tuple(idx)] = g.reshape([g.shape[i] for i in kept])
    return out


def _relaid_op(name: str, out_shape) -> Op:
    kernel = _relaid(out_shape)
    return Op(name, kernel, rule=name, ctx=True, device=lambda be: kernel.device)


OPS: dict[str, Op] = {
    "getitem_grad": Op(
        "getitem_grad", _getitem_grad, rule="getitem_grad", ctx=True, device=with_xp(_getitem_grad)
    ),
    "reshape": _relaid_op("reshape", lambda s, shape: reshape_shape(s, shape)),
    "expand_dims": _relaid_op("expand_dims", lambda s, axis: expand_dims_shape(s, axis)),
    "squeeze": _relaid_op("squeeze", lambda s, axis=None: squeeze_shape(s, axis)),
    # the methods numpy's functions wrap in Python (about 1 us), which take the attributes
    # positionally only
    "transpose": Op(
        "transpose",
        lambda x, axes=None: x.transpose(axes) if type(x) is _ND else np.transpose(x, axes),
        rule="transpose",
        device=lambda be: lambda x, axes=None: be.xp.transpose(x, axes),
    ),
    "swapaxes": Op(
        "swapaxes",
        lambda x, axis1, axis2: (
            x.swapaxes(axis1, axis2) if type(x) is _ND else np.swapaxes(x, axis1, axis2)
        ),
        rule="swapaxes",
        device="swapaxes",
    ),
    "broadcast_to": Op(
        "broadcast_to", _broadcast_to, rule="broadcast_to", ctx=True, device=with_xp(_broadcast_to)
    ),
    "tile": Op("tile", lambda x, reps: np.tile(x, reps), rule="tile", device="tile"),
    "repeat": Op(
        "repeat",
        host_method("repeat"),
        rule="repeat",
        device=lambda be: lambda x, repeats, axis: be.xp.repeat(x, repeats, axis),
    ),
    # array_split: the same pieces as split (the rule checked the division), and the right
    # number of them from the stand-ins of a rank outside the mesh too
    "split": Op(
        "split",
        lambda x, indices_or_sections, axis: tuple(np.array_split(x, indices_or_sections, axis)),
        rule="split",
        device=lambda be: (
            lambda x, indices_or_sections, axis: tuple(
                be.xp.array_split(x, indices_or_sections, axis)
            )
        ),
    ),
    "concatenate": Op(
        "concatenate",
        lambda *xs, axis: np.concatenate(xs, axis),
        rule="concatenate",
        device=lambda be: lambda *xs, axis: be.xp.concatenate(xs, axis),
    ),
    "stack": Op(
        "stack",
        lambda *xs, axis: np.stack(xs, axis),
        rule="stack",
        device=lambda be: lambda *xs, axis: be.xp.stack(xs, axis),
    ),
    "getitem": Op("getitem", _getitem, rule="getitem", ctx=True, device=with_xp(_getitem)),
}
# Every op here only moves elements, so a Partial of any type and dtype passes through exactly
# (Note [Shape ops move elements]); dispatch then need not resolve bool Partials first.
OPS = {name: replace(op, moves_only=True) for name, op in OPS.items()}


# -- public functions ------------------------------------------------------------------------
def _ints(v: Any) -> int | tuple[int, ...]:
    """An int or a tuple of ints (lists and numpy ints normalized: attributes are cache keys)."""
    if isinstance(v, (int, np.integer)):
        return operator.index(v)
    return tuple(operator.index(i) for i in v)


def reshape(x, shape):
    """``np.reshape(x, shape)`` (one ``-1`` allowed); keeps the Shards the layout allows."""
    return OPS["reshape"](x, shape=_ints(shape))


def flatten(x):
    """``x.flatten()``: ``reshape(x, -1)``."""
    return reshape(x, (-1,))


def ravel(x):
    """``np.ravel(x)``: ``reshape(x, -1)``."""
    return reshape(x, (-1,))


def transpose(x, axes=None):
    """``np.transpose(x, axes)``; Shards follow their axes, never any communication."""
    return OPS["transpose"](x, axes=None if axes is None else _ints(axes))


def swapaxes(x, axis1, axis2):
    """``np.swapaxes(x, axis1, axis2)``; Shards follow their axes, never any communication."""
    return OPS["swapaxes"](x, axis1=operator.index(axis1), axis2=operator.index(axis2))


def expand_dims(x, axis):
    """``np.expand_dims(x, axis)`` (an int or a tuple); never any communication."""
    return OPS["expand_dims"](x, axis=_ints(axis))


def squeeze(x, axis=None):
    """``np.squeeze(x, axis)``; a sharded size-1 axis moves to a remaining size-1 axis, or is
    gathered when none is left."""
    return OPS["squeeze"](x, axis=None if axis is None else _ints(axis))


def broadcast_to(x, shape):
    """``np.broadcast_to(x, shape)`` as a new array; axes that broadcast are Replicate."""
    return OPS["broadcast_to"](x, shape=_ints(shape))


def tile(x, reps):
    """``np.tile(x, reps)``; axes repeated more than once are Replicate."""
    return OPS["tile"](x, reps=_ints(reps))


def repeat(x, repeats, axis=None):
    """``np.repeat(x, repeats, axis)`` (axis None: of the flattened array)."""
    if axis is None:
        x, axis = ravel(x), 0
    return OPS["repeat"](x, repeats=_ints(repeats), axis=operator.index(axis))


def split(x, indices_or_sections, axis=0):
    """``np.split(x, indices_or_sections, axis)``: a list of pieces; the split axis is
    Replicate, the others keep their placements."""
    pieces = OPS["split"](
        x, indices_or_sections=_ints(indices_or_sections), axis=operator.index(axis)
    )
    return list(pieces)


def _operands(arrays) -> list:
    """DistTensors and device arrays as they are; anything else as a numpy array."""
    return [a if isinstance(a, DistTensor) or backend.is_device(a) else np.asarray(a)
            for a in arrays]  # fmt: skip


def concatenate(arrays, axis=0):
    """``np.concatenate(arrays, axis)`` (axis None: of the flattened arrays)."""
    arrays = _operands(arrays)
    if axis is None:
        arrays, axis = [ravel(a) for a in arrays], 0
    axis = operator.index(axis)
    from .layout import join_split  # layout is built on this module

    out = join_split(arrays, axis)  # a split joined axis stays split (point to point)
    return out if out is not None else OPS["concatenate"](*arrays, axis=axis)


def stack(arrays, axis=0):
    """``np.stack(arrays, axis)``: join along a new axis."""
    return OPS["stack"](*_operands(arrays), axis=operator.index(axis))


def _basic(k: Any) -> bool:
    if k is None or k is Ellipsis or isinstance(k, slice):
        return True
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


_SLICED = code_of("getitem of a split axis")


def getitem(x, key):
    """``x[key]`` for ints, slices (any step), None and Ellipsis: see the getitem rule in
    spmd/shape_rules.py for the layout. Integer-array and boolean keys use the replicate
    fallback."""
    if not isinstance(x, DistTensor):
        return np.asarray(x)[key]
    spec = x._spec
    plain = plain_key(key)
    if plain is not None:  # Note [Getitem routes kept on the spec]
        routes = spec.__dict__.get("_routes")  # spec.kept's table, read without a call
        route = None if routes is None else routes.get(plain)
        if route is None:
            route = spec.kept("_routes", plain, lambda: _route(spec, key), _ROUTES_PER_SPEC)
    else:
        if not all(_basic(k) for k in (key if isinstance(key, tuple) else (key,))):
            out = indexing.gather_by_index(x, key)  # Note [Gathers by index]
            if out is not None:  # named by the call (Note [Lineage names the tensor])
                return name_unnamed(out, "getitem", (x, key), {})
            reason = "integer-array or boolean key: the tensor gathered"
            key = indexing.host_key("x[key]", x, key)  # device arrays in it: host metadata
            out = fallback(
                "getitem[advanced]", operator.getitem, (x, key), {}, reason,
                on_device=indexing.device_getitem,
            )  # fmt: skip
            return name_unnamed(out, "getitem", (x, key), {})
        route = _route(spec, key)
    ckey = route[0]
    out = None
    if route[1]:
        out = _sliced_split(x, ckey, route[3])
        if out is None:  # the rule takes the key, on every rank alike: from now on at once
            route[1] = False
    if out is not None:  # rows moved between ranks: a copy (Note [Copies where numpy has views])
        mutation.remember_copy(out, x, ckey)
        lin = route[4]  # Note [Lineage names the tensor]
        if lin is None:
            lin = route[4] = hash((_SLICED, token(ckey)))
        out._lin = hash((lin, x._lin))
        return out
    out = keyed(OPS["getitem"], x, ckey, route, 5)
    ospec = out._spec
    if _picked(ospec):  # Note [Picks read from their root] in tensor.py
        index = tuple(k if k is None or isinstance(k, int) else _as_slice(k) for k in ckey)
        derive(out, x, (*index, Ellipsis))  # the Ellipsis: a 0-d array, not a scalar
    view = route[2]
    if view is None or view[0] is not ospec:
        view = route[2] = (ospec, mutation.is_view_of(ospec, spec))
    if not view[1]:
        mutation.remember_copy(out, x, ckey)
    return out


# Note [Getitem routes kept on the spec]
#     ``u[2:, 1:-1]`` every step: a key of Python ints, slices, None and Ellipsis (its
#     ``plain_key``) finds on the tensor's spec what getitem works out from the spec and the
#     key alone: the canonical key, whether a split axis may take the sliced-split path, and
#     (the last output spec, whether such an output is a view of the input). The advanced
#     and unhashable keys decide each time.
_ROUTES_PER_SPEC = 64


def _route(spec: DistSpec, key: Any) -> list:
    """[canonical key, whether the key may take the sliced-split path (the spec splits an
    axis; False once the rule took the key), (output spec, is a view) or None,
    the sliced-split plans per rank (Note [Slice plans kept on the spec]), the key's part of
    a sliced-split result's lineage or None, the getitem op's dispatch entry or None
    (dispatch.keyed)]."""
    return [canonical_key(spec.shape, key), spec.has_shard(), None, {}, None, None]


def _picked(spec: DistSpec) -> bool:
    """Whether a getitem result of ``spec`` is Partial over a mesh dim of several ranks
    (asked on every getitem: kept on the spec, whose outputs come from cached plans)."""
    hit = spec.__dict__.get("_picked")
    if hit is None:
        hit = any(p.is_partial() and n > 1 for p, n in zip(spec.placements, spec.mesh.shape))
        object.__setattr__(spec, "_picked", hit)
    return hit


# Note [Slices of split axes]
# ``x[2:]``, ``u[1:-1, 1:-1]``: a slice of an axis that a mesh dim splits keeps that split,
# over the slice's own length (numpy.array_split of the result, as any Shard). Each rank's
# output rows come from input rows at most a few positions away, so each rank fetches just
# the input box its output needs (reshard.fetch: its own rows, plus the boundary rows of its
# neighbours, point to point): a stencil's shifted slices move O(boundary) bytes, never the
# array. A strided slice fetches the bounding box of its rows and keeps every step-th. The
# gradient is the write of g into zeros of x's layout (ops/mutation.py), the same move back.
# Keys with an int on a split axis, and Partial inputs, keep the getitem rule (which picks
# into zeros, Partial(sum), or gathers).
def _slice_local(local, spec: DistSpec, fetch: tuple, index: tuple, coord, shape: tuple):
    """This rank's local array of a slice of a split axis (``_sliced_split``'s plan)."""
    own = fetch[4]  # the box's index in the shard where every row it needs is its own
    if own is not None:  # one copy of them
        return local[own][index].copy().reshape(shape)
    piece = _reshard.deliver(local, spec, fetch)
    if coord is None:
        return backend.xp(local).empty(shape, spec.dtype)
    out = piece[index]
    if out.base is not None:
        out = backend.xp(out).ascontiguousarray(out)
    return out.reshape(shape)


def _sliced_split(x: DistTensor, ckey: tuple, plans: dict) -> DistTensor | None:
    """``x[ckey]`` moving the rows each rank's slice needs, or None where the getitem rule
    takes the key; ``plans``: per rank, what the key works out on x's spec (its route's)."""
    spec = x._spec
    rank = comm.get_rank()
    plan = plans.get(rank)  # Note [Slice plans kept on the spec]
    if plan is None:
        if len(plans) >= _SLICES_PER_SPEC:
            plans.clear()
        plan = plans[rank] = _slice_plan(spec, ckey, rank)
    if plan is _BY_RULE:
        return None
    out_spec, fetch, index, coord, shape = plan
    if _recording.rec is None:
        local = _slice_local(x._local, spec, fetch, index, coord, shape)
    else:  # dt.compile records (Note [Compiled steps] in capture.py)
        local = recording.run(_slice_local, (x._local, spec, fetch, index, coord, shape))
    out = DistTensor(local, out_spec)
    if x.requires_grad and autograd.is_grad_enabled():

        def backward(grads):
            xp = backend.xp(x._local)  # the shards' array module (Note [Array backends])
            zeros = DistTensor(xp.zeros(spec.local_shape(coord), spec.dtype), spec)
            mutation.write_region(zeros, ckey, grads[0])
            return (zeros,)

        autograd.record("getitem", (x,), (out,), backward)
    return out


# Note [Slice plans kept on the spec]
# A stencil slices the same tensor the same way every step (``u[2:, 1:-1]``), and the tensor
# is the same object, or one whose spec is the same cached object. So what a slice of a split
# axis works out (the output spec, which boxes each rank fetches from where, the index into
# the fetched box) is kept per rank in the key's route on the input's spec (Note [Getitem
# routes kept on the spec]; ranks: dt.simulate's threads share the spec): the next call only
# moves the rows and indexes them, and its output has the same spec object, which the
# dispatch cache of the ops after it knows (Note [Dispatch fast path] in dispatch.py). The
# plans die with the spec, at most _SLICES_PER_SPEC ranks' per route.
_SLICES_PER_SPEC = 16
_BY_RULE = "rule"  # a key the getitem rule takes (every split kept: a view; or Partial)


def _slice_plan(spec: DistSpec, ckey: tuple, rank: int) -> tuple | str:
    """(output spec, this rank's fetch plan, index into the fetched box, coordinate, local
    shape) of ``x[ckey]`` for a tensor of ``spec`` (Note [Slices of split axes]), or
    ``_BY_RULE``."""
    mesh = spec.mesh
    entries = [k for k in ckey if k is not None]
    split = {p.dim for m, p in enumerate(spec.placements) if p.is_shard() and mesh.shape[m] > 1}
    if any(isinstance(entries[a], int) for a in split) or any(
        p.is_partial() and mesh.shape[m] > 1 for m, p in enumerate(spec.placements)
    ):
        return _BY_RULE
    if all(entries[a] == range(spec.shape[a]) for a in split):
        return _BY_RULE  # every split axis taken whole: the rule keeps the splits, a view
    out_shape, where = index_layout(spec.shape, ckey)
    placements = tuple(Shard(where[p.dim]) if p.is_shard() else p for p in spec.placements)
    out_spec = DistSpec(mesh, placements, out_shape, spec.dtype)
    wants = tuple(
        (r, _source_box(ckey, where, out_spec, mesh.get_coord(r))) for r in mesh.process_ids
    )
    coord = mesh.get_coord(rank)
    index = None
    if coord is not None:
        index = _within_box(ckey, where, out_spec.local_box(coord), dict(wants)[rank])
    fetch = _reshard.fetch_plan(spec.without_partials(), wants, rank)
    return out_spec, fetch, index, coord, out_spec.local_shape(coord)


def _source_box(ckey: tuple, where: dict, out_spec: DistSpec, coord) -> tuple:
    """The input box (start, length per input axis) the shard at ``coord`` of the sliced
    output comes from: the bounding box of its rows on each axis."""
    obox = out_spec.local_box(coord)
    box = []
    axis = 0
    for k in ckey:
        if k is None:
            continue
        if isinstance(k, int):
            box.append((k, 1))
        else:
            j0, n = obox[where[axis]]
            rows = k[j0 : j0 + n]
            if n == 0:
                box.append((0, 0))
            else:
                lo, hi = min(rows[0], rows[-1]), max(rows[0], rows[-1])
                box.append((lo, hi - lo + 1))
        axis += 1
    return tuple(box)


def _within_box(ckey: tuple, where: dict, obox: tuple, box: tuple) -> tuple:
    """Index into the fetched input box that gives this rank's output shard (new axes, ints
    and every step-th row)."""
    idx: list[Any] = []
    axis = 0
    for k in ckey:
        if k is None:
            idx.append(None)
            continue
        start = box[axis][0]
        if isinstance(k, int):
            idx.append(k - start)
        else:
            j0, n = obox[where[axis]]
            rows = k[j0 : j0 + n]
            idx.append(
                _as_slice(range(rows.start - start, rows.stop - start, rows.step))
                if n
                else slice(0, 0)
            )
        axis += 1
    return tuple(idx)


__all__ = [
    "broadcast_to",
    "concatenate",
    "expand_dims",
    "flatten",
    "getitem",
    "ravel",
    "repeat",
    "reshape",
    "split",
    "squeeze",
    "stack",
    "swapaxes",
    "tile",
    "transpose",
]
