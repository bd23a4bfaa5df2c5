"""SPMD rules of the shape ops: reshape, transpose, swapaxes, expand_dims, squeeze,
broadcast_to, concatenate, stack, split, tile, repeat and basic indexing (getitem).

The shape arithmetic (``reshape_shape``, ``canonical_key``, ...) lives here too, with numpy's
checks and messages, so the rules and the kernels in ops/shape.py agree on it.

Note [Shape ops move elements]
    Each output element of these ops is a copy of one input element (concatenate, stack: of
    one element of one input). Moving elements commutes with every reduction, so a
    Partial(t) input stays Partial(t) for every t (sum, avg, max, min), with no communication
    (Note [Partial through ops] in core.py). Joining inputs (concatenate, stack) needs one
    Partial type across them; a Replicate input becomes Partial locally for free.

Note [Keeping a shard]
    An output axis keeps a Shard only when every rank's output shard is exactly the elements of
    its input shard, in order: then the kernel runs on the local shard alone. Otherwise that
    mesh dim is resharded to Replicate first. For reshape this holds for the leading axis of
    each block of axes that merge or split (``_same_blocks`` checks the numpy.array_split
    boundaries, nested shards included). A Shard of a size-1 axis means that coordinate 0
    holds the axis and the others hold nothing; any size-1 output axis says the same.

>>> from disttensor.placement import Shard, Replicate
>>> reshape_rule([TensorSpec((8, 3), [Shard(0)])], (4,), shape=(-1,)).outputs  # 2 rows each
((Shard(dim=0),),)
>>> reshape_rule([TensorSpec((6, 3), [Shard(0)])], (4,), shape=(-1,)).outputs  # 2, 2, 1, 1 rows
((Replicate(),),)
"""

from __future__ import annotations

import itertools
import math
import operator
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from ..placement import Partial, Placement, Replicate, Shard
from ..spec import split_sizes
from .core import RuleResult, TensorSpec, register, solve

_R = Replicate()


# -- shape arithmetic (numpy's rules and messages) -------------------------------------------
def normalize_axis(axis: Any, ndim: int) -> int:
    """``axis`` in ``[0, ndim)``; numpy's AxisError (a ValueError and an IndexError) if not."""
    a = operator.index(axis)
    if not -ndim <= a < ndim:
        raise np.exceptions.AxisError(a, ndim)
    return a % ndim


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    out = tuple(normalize_axis(a, ndim) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {axis!r}")
    return out


def reshape_shape(shape: Sequence[int], newshape: Any) -> tuple[int, ...]:
    """numpy's reshape target with ``-1`` resolved."""
    new = (newshape,) if isinstance(newshape, (int, np.integer)) else tuple(newshape)
    new = tuple(operator.index(n) for n in new)
    size = math.prod(shape)
    if new.count(-1) > 1:
        raise ValueError("can only specify one unknown dimension (-1) in a reshape")
    if any(n < -1 for n in new):
        raise ValueError(f"negative dimensions are not allowed in reshape, got {new}")
    if -1 in new:
        known = math.prod(n for n in new if n != -1)
        if known and size % known == 0:
            new = tuple(size // known if n == -1 else n for n in new)
    if -1 in new or math.prod(new) != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {new}")
    return new


def transpose_axes(ndim: int, axes: Any = None) -> tuple[int, ...]:
    """The permutation ``axes`` (None: reversed), checked and non-negative."""
    if axes is None:
        return tuple(range(ndim))[::-1]
    perm = tuple(normalize_axis(a, ndim) for a in axes)
    if sorted(perm) != list(range(ndim)):
        raise ValueError(f"axes {tuple(axes)} are not a permutation of the {ndim} axes")
    return perm


def expand_dims_shape(shape: Sequence[int], axis: Any) -> tuple[int, ...]:
    nd = len(shape) + (len(axis) if isinstance(axis, (tuple, list)) else 1)
    new = _axes(axis, nd)
    rest = iter(shape)
    return tuple(1 if i in new else next(rest) for i in range(nd))


def squeeze_shape(shape: Sequence[int], axis: Any = None) -> tuple[int, ...]:
    if axis is None:
        return tuple(n for n in shape if n != 1)
    axes = _axes(axis, len(shape))
    if any(shape[a] != 1 for a in axes):
        raise ValueError(f"cannot squeeze axis {axis!r} of shape {tuple(shape)}: size is not 1")
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def broadcast_shape(shape: Sequence[int], target: Any) -> tuple[int, ...]:
    target = (target,) if isinstance(target, (int, np.integer)) else tuple(target)
    target = tuple(operator.index(n) for n in target)
    ok = len(target) >= len(shape) and all(n in (1, t) for n, t in zip(shape[::-1], target[::-1]))
    if not ok or any(t < 0 for t in target):
        raise ValueError(f"cannot broadcast an array of shape {tuple(shape)} to shape {target}")
    return target


def split_shapes(shape: Sequence[int], indices_or_sections: Any, axis: int) -> list[tuple]:
    """numpy.split's piece shapes (sections must divide the axis equally)."""
    n = shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        k = operator.index(indices_or_sections)
        if k <= 0 or n % k:
            raise ValueError(
                f"array split does not result in an equal division: {n} into {k} sections"
            )
        bounds = [i * (n // k) for i in range(k + 1)]
    else:
        bounds = [0, *(operator.index(i) for i in indices_or_sections), n]
    lengths = [len(range(n)[a:b]) for a, b in itertools.pairwise(bounds)]
    return [(*shape[:axis], m, *shape[axis + 1 :]) for m in lengths]


def tile_layout(shape: Sequence[int], reps: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(reps, output shape) of numpy.tile, both padded to the output's rank."""
    reps = (reps,) if isinstance(reps, (int, np.integer)) else tuple(reps)
    reps = tuple(operator.index(r) for r in reps)
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: negative repetitions are not allowed, got {reps}")
    nd = max(len(reps), len(shape))
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - len(shape)) + tuple(shape)
    return reps, tuple(n * r for n, r in zip(shape, reps))


def repeat_shape(shape: Sequence[int], repeats: Any, axis: int) -> tuple[int, ...]:
    n = shape[axis]
    if isinstance(repeats, (int, np.integer)):
        reps = [operator.index(repeats)]
        total = n * reps[0]
    else:
        reps = [operator.index(r) for r in repeats]
        if len(reps) not in (1, n):
            raise ValueError(f"repeat: {len(reps)} repeats for an axis of length {n}")
        total = n * reps[0] if len(reps) == 1 else sum(reps)
    if any(r < 0 for r in reps):
        raise ValueError(f"repeat: negative repeats are not allowed, got {repeats!r}")
    return (*shape[:axis], total, *shape[axis + 1 :])


def canonical_key(shape: Sequence[int], key: Any) -> tuple[int | range | None, ...]:
    """A basic-indexing key as one entry per input axis (a non-negative int, or the ``range`` of
    indices a slice picks) plus ``None`` for each new axis; Ellipsis expanded, bounds checked.

    A ``range`` entry is taken as already canonical (the form this function returns). Keys
    repeat (a stencil's shifted slices every step), so results are kept per (shape, key).

    >>> canonical_key((4, 5), (..., slice(None, None, -2), None))
    (range(0, 4), range(4, -1, -2), None)
    """
    key = key if isinstance(key, tuple) else (key,)
    plain = plain_key(key)
    memo = None if plain is None else (tuple(shape), *plain)
    hit = None
    if memo is not None:
        hit = _CANONICAL.get(memo)
    if hit is None:
        hit = _canonical(shape, key)
        if memo is not None:
            if len(_CANONICAL) >= 4096:
                _CANONICAL.clear()
            _CANONICAL[memo] = hit
    return hit


def plain_key(key: Any) -> tuple | None:
    """A basic-indexing key as a hashable tuple, where it holds only Python ints, slices of
    them, None, Ellipsis and ranges (else None): slices are not hashable before Python 3.12,
    so each is its fields (a basic key holds no tuples, so the form is unambiguous); 1.0 == 1
    and True == 1 as dict keys, but not as indices, so those are not plain."""
    key = key if isinstance(key, tuple) else (key,)
    out = []
    for k in key:
        t = type(k)
        if t is slice:
            k = (k.start, k.stop, k.step)
            if not (type(k[0]) in _FIELDS and type(k[1]) in _FIELDS and type(k[2]) in _FIELDS):
                return None
        elif t not in _PLAIN:
            return None
        out.append(k)
    return tuple(out)


_CANONICAL: dict[tuple, tuple] = {}
_PLAIN = frozenset({int, type(None), type(Ellipsis), range})
_FIELDS = frozenset({int, type(None)})


def _canonical(shape: Sequence[int], key: tuple) -> tuple[int | range | None, ...]:
    ellipses = sum(k is Ellipsis for k in key)
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(k is not None and k is not Ellipsis for k in key)
    if used > len(shape):
        raise IndexError(
            f"too many indices for array: array is {len(shape)}-dimensional, "
            f"but {used} were indexed"
        )
    at = next((i for i, k in enumerate(key) if k is Ellipsis), len(key))
    key = key[:at] + (slice(None),) * (len(shape) - used) + key[at + 1 :]
    out: list[int | range | None] = []
    axis = 0
    for k in key:
        if k is None:
            out.append(None)
            continue
        n = shape[axis]
        if isinstance(k, range):
            out.append(k)
        elif isinstance(k, slice):
            out.append(range(n)[k])
        else:
            i = operator.index(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            out.append(i % n)
        axis += 1
    return tuple(out)


@lru_cache(maxsize=4096)
def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """``numpy.broadcast_shapes`` of shape tuples (its ValueError too), remembered: an in-place
    update checks the same shapes every step, and numpy's costs microseconds."""
    if all(s == shapes[0] for s in shapes):
        return shapes[0]
    return np.broadcast_shapes(*shapes)


def index_layout(shape: Sequence[int], key: tuple) -> tuple[tuple[int, ...], dict[int, int]]:
    """(output shape, {input axis: output axis}) of a canonical key; int-indexed axes vanish."""
    out: list[int] = []
    where: dict[int, int] = {}
    axis = 0
    for k in key:
        if k is None:
            out.append(1)
            continue
        if isinstance(k, range):
            where[axis] = len(out)
            out.append(len(k))
        axis += 1
    return tuple(out), where


def within(r: range, start: int, stop: int) -> tuple[int, int]:
    """Positions ``[j0, j1)`` of the items of ``r`` (monotone) that lie in ``[start, stop)``."""
    if r.step > 0:
        return bisect_left(r, start), bisect_left(r, stop)
    up = r[::-1]
    return len(r) - bisect_left(up, stop), len(r) - bisect_left(up, start)


# -- one-input ops that move elements --------------------------------------------------------
def _moved(
    spec: TensorSpec,
    mesh_shape: tuple[int, ...],
    keep: Mapping[int, int],
    out_shapes: Sequence[tuple[int, ...]],
    select: Mapping[int, Placement] | None = None,
) -> RuleResult:
    """The rule result of a one-input op that moves elements: mesh dim m keeps its Shard as
    ``Shard(keep[m])``, or (``select``) keeps the input Shard and gives ``select[m]``; other
    Shards are Replicated first. Replicate and Partial pass (Note [Shape ops move elements]).
    Mesh dims of size 1 hold everything whatever the placement: relabelled Replicate, free."""
    if select is None:
        select = {}
    ins: list[Placement] = []
    outs: list[Placement] = []
    for m, p in enumerate(spec.placements):
        if mesh_shape[m] == 1:
            p = _R
        if isinstance(p, Shard) and m in keep:
            ins.append(p)
            outs.append(Shard(keep[m]))
        elif isinstance(p, Shard) and m in select:
            ins.append(p)
            outs.append(select[m])
        elif isinstance(p, Shard):
            ins.append(_R)
            outs.append(_R)
        else:
            ins.append(p)
            outs.append(p)
    return RuleResult((tuple(ins),), (tuple(outs),) * len(out_shapes), tuple(out_shapes))


def _shards_of(spec: TensorSpec, mesh_shape: tuple[int, ...], axis: int) -> list[int]:
    """The mesh dims (size > 1) that split ``axis``, in nesting order."""
    return [m for m, p in enumerate(spec.placements) if p == Shard(axis) and mesh_shape[m] > 1]


def _same_blocks(n_in: int, inner_in: int, n_out: int, inner_out: int, ks: Sequence[int]) -> bool:
    """Whether splitting ``n_in`` rows of ``inner_in`` items and ``n_out`` rows of ``inner_out``
    items over the nested mesh dims of sizes ``ks`` gives every rank the same flat range.
    The pieces of a split are consecutive, so equal lengths everywhere mean equal ranges."""
    pieces = [(n_in, n_out)]
    for k in ks:
        pieces = [pair for a, b in pieces for pair in zip(split_sizes(a, k), split_sizes(b, k))]
        if any(a * inner_in != b * inner_out for a, b in pieces):
            return False
    return True


def _keep_prefix(
    spec: TensorSpec, mesh_shape: tuple[int, ...], axis: int, out_axis: int, same
) -> dict[int, int]:
    """{mesh dim: out_axis} for the longest run of ``axis``'s nested shards (outermost first)
    for which ``same(ks)`` holds; the inner rest is Replicated (Note [Nested sharding])."""
    dims = _shards_of(spec, mesh_shape, axis)
    for n in range(len(dims), 0, -1):
        if same([mesh_shape[m] for m in dims[:n]]):
            return dict.fromkeys(dims[:n], out_axis)
    return {}


def _blocks(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """The minimal blocks (input axes, output axes) a reshape maps onto each other, size-1 axes
    left out. Needs a non-empty tensor (no zero sizes)."""
    a = [i for i, n in enumerate(src) if n != 1]
    b = [j for j, n in enumerate(dst) if n != 1]
    blocks, i, j = [], 0, 0
    while i < len(a):
        gi, gj = [a[i]], [b[j]]
        pi, pj = src[a[i]], dst[b[j]]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(a[i])
                pi *= src[a[i]]
                i += 1
            else:
                gj.append(b[j])
                pj *= dst[b[j]]
                j += 1
        blocks.append((gi, gj))
    return blocks


def _reshaped(spec: TensorSpec, mesh_shape: tuple[int, ...], out: tuple[int, ...]) -> RuleResult:
    """The rule of the ops whose kernel reshapes the local shard (reshape, expand_dims,
    squeeze): the Shards of Note [Keeping a shard] stay. An empty tensor has only empty
    shards, which reshape to any layout: it keeps its placements and the output is Replicate
    where no Shard maps, with no communication."""
    if math.prod(spec.shape) == 0:
        select = {m: _R for m, p in enumerate(spec.placements) if isinstance(p, Shard)}
        return _moved(spec, mesh_shape, {}, [out], select)
    return _moved(spec, mesh_shape, reshape_keep(spec, mesh_shape, out), [out])


def reshape_keep(
    spec: TensorSpec, mesh_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> dict[int, int]:
    """{mesh dim: output axis} of the Shards a reshape keeps: Note [Keeping a shard]. Needs a
    non-empty tensor."""
    src = spec.shape
    keep: dict[int, int] = {}
    for gi, gj in _blocks(src, out_shape):
        inner_in = math.prod(src[i] for i in gi[1:])
        inner_out = math.prod(out_shape[j] for j in gj[1:])

        def same(ks, gi=gi, gj=gj, inner_in=inner_in, inner_out=inner_out):
            return _same_blocks(src[gi[0]], inner_in, out_shape[gj[0]], inner_out, ks)

        keep.update(_keep_prefix(spec, mesh_shape, gi[0], gj[0], same))
    ones_in = [i for i, n in enumerate(src) if n == 1]
    ones_out = [j for j, n in enumerate(out_shape) if n == 1]
    if ones_out:  # the i-th size-1 input axis goes to the i-th size-1 output axis (or the last)
        for m, p in enumerate(spec.placements):
            if isinstance(p, Shard) and src[p.dim] == 1:
                keep[m] = ones_out[min(ones_in.index(p.dim), len(ones_out) - 1)]
    return keep


@register("reshape")
def reshape_rule(specs, mesh_shape, shape=(), **_):
    (spec,) = specs
    return _reshaped(spec, mesh_shape, reshape_shape(spec.shape, shape))


@register("expand_dims")
def expand_dims_rule(specs, mesh_shape, axis=0, **_):
    (spec,) = specs
    return _reshaped(spec, mesh_shape, expand_dims_shape(spec.shape, axis))


@register("squeeze")
def squeeze_rule(specs, mesh_shape, axis=None, **_):
    (spec,) = specs
    return _reshaped(spec, mesh_shape, squeeze_shape(spec.shape, axis))


def _permuted(spec: TensorSpec, mesh_shape, perm: tuple[int, ...]) -> RuleResult:
    keep = {m: perm.index(p.dim) for m, p in enumerate(spec.placements) if isinstance(p, Shard)}
    return _moved(spec, mesh_shape, keep, [tuple(spec.shape[a] for a in perm)])


@register("transpose")
def transpose_rule(specs, mesh_shape, axes=None, **_):
    (spec,) = specs
    return _permuted(spec, mesh_shape, transpose_axes(spec.ndim, axes))


@register("swapaxes")
def swapaxes_rule(specs, mesh_shape, axis1=0, axis2=1, **_):
    (spec,) = specs
    perm = list(range(spec.ndim))
    a, b = normalize_axis(axis1, spec.ndim), normalize_axis(axis2, spec.ndim)
    perm[a], perm[b] = b, a
    return _permuted(spec, mesh_shape, tuple(perm))


@register("broadcast_to")
def broadcast_to_rule(specs, mesh_shape, shape=(), **_):
    """Axes that keep their length keep their Shard; a size-1 axis that broadcasts, and the new
    leading axes, are Replicate (each rank broadcasts its whole local copy)."""
    (spec,) = specs
    out = broadcast_shape(spec.shape, shape)
    off = len(out) - spec.ndim
    keep = {
        m: p.dim + off
        for m, p in enumerate(spec.placements)
        if isinstance(p, Shard) and spec.shape[p.dim] == out[p.dim + off]
    }
    return _moved(spec, mesh_shape, keep, [out])


@register("tile")
def tile_rule(specs, mesh_shape, reps=1, **_):
    """Axes repeated once keep their Shard; tiled axes are Replicate."""
    (spec,) = specs
    reps, out = tile_layout(spec.shape, reps)
    off = len(out) - spec.ndim
    keep = {
        m: p.dim + off
        for m, p in enumerate(spec.placements)
        if isinstance(p, Shard) and reps[p.dim + off] == 1
    }
    return _moved(spec, mesh_shape, keep, [out])


@register("repeat")
def repeat_rule(specs, mesh_shape, repeats=1, axis=0, **_):
    """Other axes keep their Shard. An int ``repeats`` along a sharded axis keeps it where the
    shard boundaries times ``repeats`` are the array_split boundaries (e.g. an even split)."""
    (spec,) = specs
    axis = normalize_axis(axis, spec.ndim)
    out = repeat_shape(spec.shape, repeats, axis)
    keep = {m: p.dim for m, p in enumerate(spec.placements) if p.is_shard() and p.dim != axis}
    if isinstance(repeats, (int, np.integer)):
        n, r = spec.shape[axis], int(repeats)
        keep.update(
            _keep_prefix(spec, mesh_shape, axis, axis, lambda ks: _same_blocks(n, r, n * r, 1, ks))
        )
    return _moved(spec, mesh_shape, keep, [out])


@register("split")
def split_rule(specs, mesh_shape, indices_or_sections=1, axis=0, **_):
    """The split axis is Replicate (a piece of a sharded axis is no Shard of anything); the
    other axes keep their placements, the same for every piece."""
    (spec,) = specs
    axis = normalize_axis(axis, spec.ndim)
    shapes = split_shapes(spec.shape, indices_or_sections, axis)
    keep = {m: p.dim for m, p in enumerate(spec.placements) if p.is_shard() and p.dim != axis}
    return _moved(spec, mesh_shape, keep, shapes)


@register("getitem")
def getitem_rule(specs, mesh_shape, key=(), **_):
    """Basic indexing. An axis taken whole keeps its Shard. An axis that is sliced or indexed
    by an int either is Replicated first, or, when the result is under half the input (so its
    later all-reduce moves less than gathering the input), keeps its Shard: each rank picks
    the selected items it holds into zeros and the output is Partial(sum) on that mesh dim,
    no communication (the kernel translates the key to the local shard)."""
    (spec,) = specs
    key = canonical_key(spec.shape, key)
    out, where = index_layout(spec.shape, key)
    entries = [k for k in key if k is not None]
    keep, select = {}, {}
    small = 2 * math.prod(out) < math.prod(spec.shape)
    for m, p in enumerate(spec.placements):
        if isinstance(p, Shard):
            if entries[p.dim] == range(spec.shape[p.dim]):
                keep[m] = where[p.dim]
            elif small:
                select[m] = Partial("sum")
    return _moved(spec, mesh_shape, keep, [out], select)


# -- ops that join inputs ----------------------------------------------------------------------
def _letters(n: int) -> str:
    return "".join(chr(ord("a") + i) for i in range(n))


def _joint_partials(specs: Sequence[TensorSpec]) -> list:
    """Every input Partial(t) -> Partial(t), for each t among the inputs: Note [Shape ops move
    elements]. The einsum core prices the R -> Partial moves of the other inputs (free)."""
    kinds = {p.reduce_type for s in specs for p in s.placements if isinstance(p, Partial)}
    return [((Partial(t),) * len(specs), Partial(t)) for t in sorted(kinds)]


def _same_shapes(specs, skip: int | None, what: str) -> None:
    if not specs:
        raise ValueError(f"{what}: need at least one array")
    first = specs[0].shape
    for s in specs[1:]:
        if len(s.shape) != len(first) or any(
            a != b for i, (a, b) in enumerate(zip(s.shape, first)) if i != skip
        ):
            raise ValueError(
                f"{what}: all the input arrays must have the same shape"
                + (f" except along axis {skip}" if skip is not None else "")
                + f", got {[t.shape for t in specs]}"
            )


@register("concatenate")
def concatenate_rule(specs, mesh_shape, axis=0, **_):
    """Axes other than ``axis`` keep a Shard all inputs agree on (the einsum core picks the
    cheapest per mesh dim); ``axis`` itself is Replicate: the local pieces of a sharded axis,
    joined, are no shard of the result."""
    if not specs or specs[0].ndim == 0:
        raise ValueError("concatenate: zero-dimensional arrays cannot be concatenated")
    axis = normalize_axis(axis, specs[0].ndim)
    _same_shapes(specs, axis, "concatenate")
    letters = _letters(specs[0].ndim)
    ins, out = solve(
        [letters] * len(specs),
        letters,
        specs,
        mesh_shape,
        reduce=None,
        linearity="none",
        unshardable=frozenset(letters[axis]),
        partial_patterns=_joint_partials(specs),
    )
    shape = list(specs[0].shape)
    shape[axis] = sum(s.shape[axis] for s in specs)
    return RuleResult(ins, (out,), (tuple(shape),))


@register("stack")
def stack_rule(specs, mesh_shape, axis=0, **_):
    """Like concatenate; the new axis is never sharded, the others keep agreed Shards."""
    _same_shapes(specs, None, "stack")
    nd = specs[0].ndim
    axis = normalize_axis(axis, nd + 1)
    letters = _letters(nd)
    out = letters[:axis] + "Z" + letters[axis:]  # "Z" is held by no input: never sharded
    ins, o = solve(
        [letters] * len(specs),
        out,
        specs,
        mesh_shape,
        reduce=None,
        linearity="none",
        partial_patterns=_joint_partials(specs),
    )
    shape = (*specs[0].shape[:axis], len(specs), *specs[0].shape[axis:])
    return RuleResult(ins, (o,), (shape,))


@register("getitem_grad")
def getitem_grad_rule(specs, mesh_shape, key=(), shape=(), **_):
    """The gradient of getitem: ``g`` (the shape of ``x[key]``) written into zeros of ``x``'s
    ``shape``. An output axis that was taken whole keeps its Shard (as the input axis it came
    from); other Shards are Replicated first. It is linear: Partials pass through."""
    (spec,) = specs
    _, where = index_layout(shape, key)
    entries = [k for k in key if k is not None]
    back = {o: a for a, o in where.items() if entries[a] == range(shape[a])}
    keep = {
        m: back[p.dim]
        for m, p in enumerate(spec.placements)
        if isinstance(p, Shard) and p.dim in back
    }
    return _moved(spec, mesh_shape, keep, [tuple(shape)])
