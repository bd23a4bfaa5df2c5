"""Writing into DistTensors as numpy does: ``x[key] = value``, ``x += y`` and ``out=``.

Note [Writes keep the layout]
    A write never changes the target's placements. Each rank writes the part of the written
    region that lies in its own shard, into its own local array, so every alias (the same
    object, or a DistTensor whose local array is a view of the same memory) sees the change,
    and a Replicate target stays equal on every rank. The value comes to the target's layout
    for just that region: a scalar or a numpy array is on every rank already; a DistTensor
    value sends each rank only the pieces of the region it holds that it does not hold
    itself, point to point (``reshard.fetch``), so a value already laid out like the region
    moves nothing. A Partial target is written as reshard's Replicate -> Partial step would
    make the value: for Partial(sum) the ranks at coordinate 0 of every Partial(sum) mesh dim
    write the value and the others zeros (their sum is the value); for avg/max/min every rank
    writes it. In-place operators compute the result out of place, through the op's own rule,
    then write it back into the target's buffer the same way (resharded to the target's
    placements when the rule gave others).

Note [Copies where numpy has views]
    A basic slice ``x[2:5]`` is a view in numpy. In dt it is a view of the local array when
    no data moved (the sliced axes are not split, or only taken whole); when the getitem rule
    had to move data (a split axis sliced partly), the result is a copy. Such a copy remembers
    its source and key: a write into it (``y[0] = 7``, ``y += 1``) is written through to the
    source as ``x[key] = y``, and ``x[key] = y`` of that very copy is a no-op, as it is for a
    numpy view. So ``x[2:5] += 1`` and ``y = x[2:5]; y *= 2`` change x as in numpy. A
    difference remains: such a copy does not see later writes into its source.

Note [Integer-array and boolean writes on a device]
    ``x[idx] = v`` and ``x[mask] = v`` work out every written element's global coordinates on
    the host (numpy's indexing of coordinate grids, as for host shards: the key is metadata,
    Note [Keys on a device] in ops/indexing.py), and then move to the device only this rank's
    local coordinates and the values it writes: a host value's selected elements (an explicit
    write, as ``x[key] = host_value`` copies), a device value's by one index on the device.
    A DistTensor value is gathered with the host run's exchange and stays on the device
    (``global_value``). Where a key names an element more than once, numpy stores the last
    value and CuPy leaves which one undefined, so the device write keeps only the last
    occurrence of each element (found on the host). ``x[mask] = scalar`` with a DistTensor
    mask of x's layout writes through the mask's own device shard.

Note [Mutation and autograd]
    A write into a tensor that requires a gradient, or of a value that requires one, raises
    while gradients are recorded: the tape has no in-place ops. Under ``dt.no_grad()`` writes
    are allowed (optimizer updates, ``w -= lr * w.grad``). Each write is noted
    (``autograd.note_mutation``); backward refuses a graph whose saved tensors were written
    after they were saved, as PyTorch's version counter does.

>>> import numpy as np, disttensor as dt
>>> def program():
...     mesh = dt.ProcessMesh([0, 1])
...     x = dt.shard_tensor(np.zeros((4, 3)), mesh, [dt.Shard(0)])
...     y = x                    # an alias
...     x[1:3, 0] = [5.0, 6.0]   # each rank writes the rows it holds
...     y += 1                   # in place: x sees it
...     return x.numpy()[:, 0], x.placements
>>> dt.simulate(2, program)[0]
(array([1., 6., 7., 1.]), [Shard(dim=0)])
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from .. import autograd, backend, comm, dispatch, recording
from .. import reshard as _reshard
from .. import tensor as _tensor
from ..accounting import outside_rules
from ..comm import _ctx
from ..placement import Partial, Replicate
from ..recording import on as _recording
from ..spmd.shape_rules import broadcast_shapes, canonical_key, index_layout, within
from ..tensor import DistTensor, code_of, moved, reshard
from . import indexing


# -- checks ------------------------------------------------------------------------------------
def check_writable(target: DistTensor, value: Any, what: str) -> None:
    """Note [Mutation and autograd]: refuse writes the tape cannot follow (every rank alike,
    before any communication)."""
    if not autograd.is_grad_enabled():
        return
    if target.requires_grad:
        raise RuntimeError(
            f"{what}: the target requires a gradient, and in-place writes are not recorded for "
            "backward; write under dt.no_grad() (a parameter update) or compute out of place "
            "(y = x + 1, dt.where(mask, value, x))"
        )
    if isinstance(value, DistTensor) and value.requires_grad:
        raise RuntimeError(
            f"{what}: the value requires a gradient, which an in-place write cannot pass on; "
            "compute out of place (dt.where(mask, value, x), dt.concatenate(...)) or write "
            "value.detach()"
        )


def _shape(a: Any) -> tuple[int, ...]:
    """``np.shape(a)`` for any value: DistTensors and device arrays too (numpy's functions
    refuse device arrays); Python scalars first, as they are the most frequent values."""
    if isinstance(a, (int, float, complex)):
        return ()
    s = getattr(a, "shape", None)  # DistTensors, numpy's and device arrays, numpy scalars
    return s if s is not None else np.shape(a)


def _strip_leading_ones(shape: tuple[int, ...], ndim: int) -> int:
    """How many leading length-1 axes a value has beyond ``ndim`` (numpy drops them)."""
    k = 0
    while len(shape) - k > ndim and shape[k] == 1:
        k += 1
    return k


def _value_shape_fits(vshape: tuple[int, ...], region: tuple[int, ...]) -> tuple[int, ...]:
    """The value's shape with numpy's extra leading 1s dropped; ValueError (numpy's message)
    unless it broadcasts to ``region``."""
    if vshape == region:  # the common case: the region's own shape
        return vshape
    trimmed = vshape[_strip_leading_ones(vshape, len(region)) :]
    ok = len(trimmed) <= len(region) and all(
        v in (1, r) for v, r in zip(trimmed[::-1], region[::-1])
    )
    if not ok:
        raise ValueError(f"could not broadcast input array from shape {vshape} into shape {region}")
    return trimmed


# -- which ranks write the value, which write zeros (Partial targets) --------------------------
def _writes_value(target: DistTensor, coord: tuple[int, ...]) -> bool:
    """Note [Writes keep the layout]: off coordinate 0 of a Partial(sum) mesh dim a rank
    writes zeros."""
    return all(
        not (isinstance(p, Partial) and p.reduce_type == "sum") or coord[m] == 0
        for m, p in enumerate(target._spec.placements)
    )


# -- copies where numpy has views (Note [Copies where numpy has views]) -----------------------
_copies: dict[int, tuple[Any, Any, tuple]] = {}  # id(copy) -> (ref to it, ref to source, key)


def remember_copy(copy: DistTensor, source: DistTensor, key: tuple) -> None:
    """``copy`` is ``source[key]`` (a canonical basic key) computed with data moved."""
    i = id(copy)
    _copies[i] = (weakref.ref(copy, lambda _, i=i: _copies.pop(i, None)), weakref.ref(source), key)


def _copy_of(t: Any) -> tuple[DistTensor, tuple] | None:
    hit = _copies.get(id(t))
    if hit is None or hit[0]() is not t:
        return None
    source = hit[1]()
    return None if source is None else (source, hit[2])


def _written(target: DistTensor) -> None:
    """After a write into ``target``'s local array: note it for autograd, and write a copy
    that stands for a numpy view through to its source."""
    autograd.note_mutation(target._local)
    target._lin = hash((_WRITE, target._lin))  # another value (Note [Lineage names the tensor])
    hit = _copy_of(target)
    if hit is not None:
        source, key = hit
        with autograd.no_grad():
            write_region(source, key, target)
        _written(source)


_WRITE = code_of("written")


def is_view_of(out_spec, in_spec) -> bool:
    """Whether a basic getitem kept every split of its input (then each rank's result is a
    view of its shard; a split over a mesh dim of one rank that became Replicate was the
    whole axis there, a view too); otherwise it moved data or filled zeros (a Partial
    result)."""
    return not any(
        p.is_shard() and not q.is_shard() and (n > 1 or not q.is_replicate())
        for p, q, n in zip(in_spec.placements, out_spec.placements, in_spec.mesh.shape)
    )


# -- x[key] = value ----------------------------------------------------------------------------
def _basic(k: Any) -> bool:
    return (
        k is None
        or k is Ellipsis
        or isinstance(k, (slice, range))
        or (isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)))
    )


def setitem(target: DistTensor, key: Any, value: Any) -> None:
    """``target[key] = value`` with numpy's semantics: basic keys, integer arrays (numpy,
    lists, DistTensors) and boolean masks; scalar, array or DistTensor values, broadcast.
    Collective over the target's mesh (and the value's). Note [Writes keep the layout]."""
    check_writable(target, value, "x[key] = value")
    parts = key if isinstance(key, tuple) else (key,)
    if all(_basic(k) for k in parts):
        ckey = canonical_key(target.shape, key)
        hit = _copy_of(value)
        if hit is not None and hit[0] is target and hit[1] == ckey:
            return  # x[key] = x[key]: the value is that region (a no-op, as for a numpy view)
        write_region(target, ckey, value)
    else:
        _write_advanced(target, parts, value)
    _written(target)


def assign(target: DistTensor, value: Any) -> DistTensor:
    """``target[...] = value``: the whole tensor, in place; returns ``target``."""
    setitem(target, Ellipsis, value)
    return target


def _region_index(ckey: tuple, box) -> tuple[tuple, tuple] | None:
    """(index into the local array, (start, length) per region axis) of the part of the
    region a shard with ``box`` holds; None when it holds none of it."""
    src: list[Any] = []
    reg: list[tuple[int, int]] = []
    axis = 0
    for k in ckey:
        if k is None:
            src.append(None)
            reg.append((0, 1))
            continue
        start, n = box[axis]
        axis += 1
        if isinstance(k, int):
            if not start <= k < start + n:
                return None
            src.append(k - start)
        else:
            j0, j1 = within(k, start, start + n)
            if j1 <= j0:
                return None
            part = k[j0:j1]
            stop = part.stop - start
            src.append(slice(part.start - start, stop if stop >= 0 else None, part.step))
            reg.append((j0, j1 - j0))
    return tuple(src), tuple(reg)


def write_region(target: DistTensor, ckey: tuple, value: Any) -> None:
    spec = target._spec
    rank = comm.get_rank()
    # kept as Note [Slice plans kept on the spec] in shape.py says
    plan = spec.kept("_writes", (ckey, rank), lambda: _write_plan(target, ckey, rank), 16)
    region, coord, mine, wants = plan
    vshape = _value_shape_fits(tuple(_shape(value)), region)
    if isinstance(value, DistTensor):
        value = _as_region(value, vshape, region)
        vspec = value._spec
        plain = vspec.without_partials()
        fetch = _reshard.fetch_plan(plain, wants, rank)
        if fetch[4] is not None and plain is vspec and type(value._local) is np.ndarray:
            # the value's rows here are its own: copied straight in (numpy minds an overlap,
            # x[1:] = x[:-1]; a device's copy does not, so device values take the box)
            tl, vl = target._local, value._local
            if _recording.rec is None:
                tl[mine[0]] = vl[fetch[4]]
            else:  # Note [Compiled steps] in capture.py
                recording.write(_copy_part, tl, (tl, mine[0], vl, fetch[4]))
            return
        tl = target._local
        if _recording.rec is None:
            _write_fetched(tl, mine, value._local, vspec, fetch)
        else:  # Note [Compiled steps] in capture.py
            recording.write(_write_fetched, tl, (tl, mine, value._local, vspec, fetch))
        return
    if mine is None:
        return
    src, reg = mine
    if not _writes_value(target, coord):
        target._local[src] = 0
        return
    be = backend.of(target._local)
    if backend.is_device(value) and backend.of(value) is not be:
        raise backend.mixed("x[key] = value", backend.of(value), be)
    # a device target: the value copied in (an explicit write: Note [Array backends])
    v = be.asarray(value) if be.device else np.asarray(value)
    if v.ndim == 0:
        target._local[src] = v
        return
    v = be.xp.broadcast_to(v.reshape(vshape), region)
    target._local[src] = v[tuple(slice(s, s + n) for s, n in reg)]


def _write_fetched(dst: Any, mine: Any, local: Any, vspec: Any, fetch: tuple) -> None:
    """The value's rows this rank's part of the region needs, fetched from the ranks that
    hold them (``reshard.deliver``, collective) and written at ``mine``."""
    piece = _reshard.deliver(local, vspec, fetch)
    if mine is None:
        return
    if piece is None:  # a Partial(sum) target off coordinate 0
        dst[mine[0]] = 0
    else:
        dst[mine[0]] = piece


def _copy_part(dst: Any, at: tuple, src: Any, part: tuple) -> None:
    """``dst[at] = src[part]``: a region's rows copied straight in (``write_region``)."""
    dst[at] = src[part]


def _write_plan(target: DistTensor, ckey: tuple, rank: int) -> tuple:
    """(the region's shape, this rank's coordinate, its part of the region as
    ``_region_index`` gives it, every writing rank with the region box it needs) of a write
    at ``ckey`` into a tensor of ``target``'s spec."""
    spec = target._spec
    region, _ = index_layout(spec.shape, ckey)
    coord = spec.mesh.get_coord(rank)
    mine = None if coord is None else _region_index(ckey, spec.local_box(coord))
    wants = []
    for r in spec.mesh.process_ids:
        c = spec.mesh.get_coord(r)
        hit = _region_index(ckey, spec.local_box(c))
        if hit is not None and _writes_value(target, c):
            wants.append((r, hit[1]))
    return region, coord, mine, tuple(wants)


def _as_region(value: DistTensor, vshape: tuple[int, ...], region: tuple[int, ...]) -> DistTensor:
    """A DistTensor value with numpy's extra leading 1s dropped and broadcast to the region."""
    if value.shape == region:  # the common case: nothing to reshape or broadcast
        return value
    from . import shape as sh

    with autograd.no_grad():
        if value.shape != vshape:
            value = sh.reshape(value, vshape)
        if value.shape != region:
            value = sh.broadcast_to(value, region)
    return value


def same_device(what: str, target: DistTensor, value: Any) -> None:
    """``backend.mixed`` (TypeError) for a value that cannot be written into ``target`` without
    a silent copy: a DistTensor of another backend, or a device array of another backend (a
    host value into device shards is copied in, explicitly)."""
    be = backend.of(target._local)
    local = value._local if isinstance(value, DistTensor) else value
    vb = backend.of(local)
    if vb is not be and (vb.device or isinstance(value, DistTensor)):
        raise backend.mixed(what, vb, be)


def global_value(value: DistTensor) -> Any:
    """``value``'s global value on every rank of its mesh, on its own backend (collective):
    ``value.numpy()`` on the host; on a device the same exchange, its result left there."""
    if not backend.is_device(value._local):
        return value.numpy()
    with autograd.no_grad():
        return reshard(value, value.mesh, [Replicate()] * value.mesh.ndim)._local


def _write_advanced(target: DistTensor, key: tuple, value: Any) -> None:
    """Integer-array and boolean keys: every written element's global coordinates, found by
    numpy's own indexing of broadcast coordinate grids (so numpy decides the result's shape
    and checks the key), then each rank writes the elements its shard holds (on a device:
    Note [Integer-array and boolean writes on a device])."""
    key = indexing.host_key("x[key] = value", target, key)
    same_device("x[key] = value", target, value)
    spec = target._spec
    if _local_mask(target, key, value):
        return
    with outside_rules("setitem", "a DistTensor index: gathered", always=False):
        key = tuple(k.numpy() if isinstance(k, DistTensor) else k for k in key)  # collective
    shape = spec.shape
    grids = [
        np.broadcast_to(
            np.arange(n).reshape([n if j == a else 1 for j in range(len(shape))]), shape
        )
        for a, n in enumerate(shape)
    ]
    coords = [g[key] for g in grids]  # numpy's IndexError for a bad key, on every rank alike
    region = coords[0].shape if coords else np.asarray(0)[key].shape
    vshape = _value_shape_fits(tuple(_shape(value)), region)
    if isinstance(value, DistTensor):
        reason = "the value of an integer-array or boolean write: gathered"
        with outside_rules("setitem", reason, always=False):
            value = global_value(value)  # collective: the value's bytes, once
    vb = backend.of(value)  # numpy for host values
    v = vb.xp.broadcast_to(vb.asarray(value).reshape(vshape), region)
    coord = spec.mesh.get_coord(comm.get_rank())
    if coord is None:
        return
    box = spec.local_box(coord)
    sel = np.ones(region, bool)
    for c, (start, n) in zip(coords, box):
        sel &= (c >= start) & (c < start + n)
    if backend.is_device(target._local):
        _write_on_device(target, coords, box, sel, v, _writes_value(target, coord))
        return
    local = tuple(c[sel] - start for c, (start, _) in zip(coords, box))
    if not shape:  # a 0-d target: the key selects it or not
        local = ()
        if not sel.any():
            return
        target._local[()] = v[sel][-1] if _writes_value(target, coord) else 0
        return
    target._local[local] = v[sel] if _writes_value(target, coord) else 0


def _write_on_device(
    target: DistTensor, coords: list, box: tuple, sel: np.ndarray, v: Any, writes: bool
) -> None:
    """The tail of ``_write_advanced`` for device shards (Note [Integer-array and boolean
    writes on a device]): ``sel`` (host) marks the region's elements this rank holds, at
    global ``coords`` (host); ``v`` is the value broadcast to the region (host or device)."""
    be = backend.of(target._local)
    if sel.ndim == 0:  # a 0-d region: one element, or none
        sel, v, coords = sel.reshape(1), v.reshape(1), [c.reshape(1) for c in coords]
    local = [c[sel] - start for c, (start, _) in zip(coords, box)]
    keep = None
    if local and local[0].size > 1:
        flat = np.ravel_multi_index(local, target._local.shape)
        last = flat.size - 1 - np.unique(flat[::-1], return_index=True)[1]
        if last.size < flat.size:  # an element named twice: numpy's last value, only
            keep = np.sort(last)
            local = [c[keep] for c in local]
    if writes:
        vals = v[sel] if not backend.is_device(v) else v[be.asarray(sel)]
        if keep is not None:
            vals = vals[be.asarray(keep) if backend.is_device(vals) else keep]
        vals = be.asarray(vals)  # a host value: its written elements copied in
    else:
        vals = 0
    if not local:  # a 0-d target: the last value that the key names it with
        if sel.any():
            target._local[()] = vals[-1] if writes else 0
        return
    target._local[tuple(be.asarray(c) for c in local)] = vals


def _local_mask(target: DistTensor, key: tuple, value: Any) -> bool:
    """``x[mask] = scalar`` with a DistTensor mask of x's shape: each rank writes through its
    own part of the mask (the mask moves to x's layout only if it is laid out otherwise).
    True when done; False for every other key."""
    if len(key) != 1 or not isinstance(key[0], DistTensor) or isinstance(value, DistTensor):
        return False
    if np.ndim(value) != 0:
        return False
    mask = key[0]
    if mask.dtype != np.bool_ or mask.shape != target.shape:
        return False
    want = target._spec.without_partials()  # the mask's whole value where x has its shard
    if mask._spec.mesh != want.mesh or mask._spec.placements != want.placements:
        reason = "a boolean mask laid out unlike the target: moved"
        with outside_rules("setitem", reason, always=False):
            mask = reshard(mask, want.mesh, list(want.placements))
    coord = target._spec.mesh.get_coord(comm.get_rank())
    if coord is not None:
        if isinstance(value, np.ndarray) and backend.is_device(target._local):
            value = backend.of(target._local).asarray(value)  # a 0-d host array: copied in
        target._local[mask._local] = value if _writes_value(target, coord) else 0
    return True


# -- x += y and out= ---------------------------------------------------------------------------
def _casting_error(name: str, src: np.dtype, dst: np.dtype, casting: str) -> TypeError:
    return TypeError(
        f"Cannot cast ufunc '{name}' output from {src!r} to {dst!r} with casting rule '{casting}'"
    )


# the in-place operators whose result takes the operator's own op (its dispatch fast path)
_OPERATORS = {np.add: "add", np.subtract: "subtract", np.multiply: "multiply",
              np.true_divide: "divide"}  # fmt: skip
_SCALARS = (int, float, complex, bool)


def inplace(ufunc: np.ufunc, target: DistTensor, other: Any) -> DistTensor:
    """``target <op>= other`` (``x += y``, ``p -= lr * g``, ``a @= b``), written into the
    target's buffer; returns ``target``. ``+=``, ``-=``, ``*=`` and ``/=`` run numpy's in-place
    ufunc where they can, else compute the result as the operator does (``w - u``) and copy
    it in (Note [In-place operators]); other ufuncs take numpy's ``out=`` path."""
    op = _OPERATORS.get(ufunc)
    if op is not None:  # Note [In-place operators]
        if (
            type(other) is DistTensor
            and not ((target.requires_grad or other.requires_grad) and autograd._state.enabled)
            and (how := _summed_into(target, other)) is not None
        ):  # the reduced shard, straight in
            v, tl = moved(other, target._spec, None, how), target._local
            if _recording.rec is None:
                ufunc(tl, v, out=tl)
            else:  # dt.compile records (Note [Compiled steps] in capture.py)
                recording.write(ufunc, tl, (tl, v), {"out": tl})
            _written(target)
            return target
        ops = _EW or _ops_ew()
        if _into(ops[op], ufunc, target, other):
            _written(target)
            return target
    if (
        op is not None
        and not (autograd.is_grad_enabled() and (target.requires_grad or _needs_grad(other)))
        and (type(other) in _SCALARS or (type(other) is DistTensor and other.shape == target.shape))
    ):
        if type(other) is DistTensor and _partial_into_whole(other, target):
            with autograd.no_grad():  # another backend or mesh than _summed_into takes
                other = reshard(other, target.mesh, target.placements)
        result = (_EW or _ops_ew())[op](target, other)
        rspec = result._spec
        if rspec is target._spec or rspec == target._spec:  # same layout, shape and dtype:
            if _recording.rec is None:
                target._local[...] = result._local  # copied in
            else:  # Note [Compiled steps] in capture.py
                recording.write(np.copyto, target._local, (target._local, result._local))
            _written(target)
        else:  # a cast, another layout: as below
            write_out(ufunc.__name__, result, target, "same_kind")
        return target
    from . import array_ufunc

    name = f"{ufunc.__name__} (in place)"
    check_writable(target, other, name)
    if ufunc is not np.matmul:
        want = broadcast_shapes(target.shape, tuple(_shape(other)))
        if want != target.shape:
            raise ValueError(
                f"non-broadcastable output operand with shape {target.shape} doesn't match "
                f"the broadcast shape {want}"
            )
    result = array_ufunc(ufunc, "__call__", (target, other), {})
    write_out(ufunc.__name__, result, target, "same_kind")
    return target


# Note [In-place operators]
# ``x += y``, ``x -= y``, ``x *= y`` and ``x /= y`` with a tensor of x's shape or a Python
# scalar write numpy's in-place ufunc's values into x's buffer, on every placement:
# * Where the operator's own cached decision for (x, y) moves nothing and lays the result
#   out as x (``dispatch.into``: ``x += y`` of one layout, ``w -= 0.1`` of a Replicate w),
#   the ufunc runs in place on x's local array: what the op's kernel would compute, without
#   the out-of-place result and its copy.
# * Where y is Partial on x's mesh and x is not (``w -= lr * g`` with a Partial gradient),
#   the sum comes first, as numpy computes it: y is reduced to x's layout (an all-reduce, or
#   a reduce-scatter into a split x) and the ufunc runs in place with the reduced shard (the
#   op's rule would keep ``w - u`` Partial and move the result). On host shards of a mesh of
#   every rank the decision is kept per pair of specs (``_summed_into``), so a loop's update
#   is the move and the ufunc; elsewhere y is resharded first and the next case runs.
# * Otherwise the result is computed out of place through the op's rule and copied in (or
#   written out in the target's layout where the rule gave another one).
# Any other in-place ufunc goes through numpy's ``out=`` (``array_ufunc``, then ``write_out``).
# (id(x's spec), id(y's spec)) -> (x's spec, y's, the world, the move or None)
_SUMMED: dict[tuple, tuple] = {}


def _summed_into(target: DistTensor, other: DistTensor) -> Any:
    """The move that reduces Partial ``other`` to ``target``'s layout before an in-place
    operator, where it goes straight into the ufunc (Note [In-place operators]), else None;
    kept per pair of specs and world (the entry holds both specs, so their ids stay theirs)."""
    tspec, ospec = target._spec, other._spec
    hit = _SUMMED.get((id(tspec), id(ospec)))
    if hit is None or hit[0] is not tspec or hit[1] is not ospec or hit[2] is not _ctx.world:
        how = None
        if (
            tspec.shape == ospec.shape
            and _partial_into_whole(other, target)
            and tspec.mesh.size == comm.world().size
        ):
            how = _reshard.move(ospec, tspec)
        if len(_SUMMED) >= 256:
            _SUMMED.clear()
        hit = _SUMMED[id(tspec), id(ospec)] = (tspec, ospec, _ctx.world, how)
    how = hit[3]
    if how is None or type(target._local) is not np.ndarray or type(other._local) is not np.ndarray:
        return None
    return how


def _partial_into_whole(other: DistTensor, target: DistTensor) -> bool:
    """Whether ``other`` is Partial on ``target``'s mesh, ``target`` is not Partial, and both
    are of one floating (or complex) dtype, so the result has the target's dtype and no
    casting error can come after the move: the in-place operators reduce ``other`` to the
    target's layout first."""
    o, t = other._spec, target._spec  # without_partials: cached, the spec itself if none
    return (
        o.without_partials() is not o
        and t.without_partials() is t
        and o.dtype == t.dtype
        and t.dtype.kind in "fc"
        and o.mesh == t.mesh
    )


def _needs_grad(value: Any) -> bool:
    return type(value) is DistTensor and value.requires_grad


_EW: Any = None  # the operators' ops (tensor._EW), once looked up
_into = dispatch.into
_tensor._inplace = inplace  # DistTensor's in-place operators call it


def _ops_ew() -> Any:
    global _EW
    from .. import tensor

    _EW = tensor._EW
    return _EW


def write_out(
    name: str, result: Any, out: Any, casting: str = "same_kind", where: Any = True
) -> Any:
    """Write ``result`` into ``out`` (a DistTensor, or a numpy array that gets the global
    value on every rank) as an ``out=`` argument does: numpy's casting rule, broadcasting to
    ``out``'s shape, and a ufunc's ``where=`` (out keeps its values where it is False);
    returns ``out``."""
    rdtype = result.dtype if isinstance(result, DistTensor) else np.asarray(result).dtype
    odtype = out.dtype
    if not np.can_cast(rdtype, odtype, casting=casting):
        raise _casting_error(name, rdtype, odtype, casting)
    rshape, oshape = tuple(_shape(result)), tuple(_shape(out))
    try:
        ok = broadcast_shapes(rshape, oshape) == oshape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"non-broadcastable output operand with shape {oshape} doesn't match the "
            f"broadcast shape {rshape}"
        )
    if isinstance(out, DistTensor):
        check_writable(out, result, f"{name}(..., out=)")
        if where is not True:
            from .elementwise import where as _where

            with autograd.no_grad():
                result = _where(where, result, out)
        if (
            isinstance(result, DistTensor)
            and rshape == oshape
            and result._spec.mesh == out._spec.mesh
        ):
            if result._spec.placements != out._spec.placements:
                with autograd.no_grad():
                    result = reshard(result, out.mesh, out.placements)
            if out._spec.mesh.get_coord(comm.get_rank()) is not None:
                copyto = backend.xp(out._local).copyto
                ol = out._local
                recording.write(copyto, ol, (ol, result._local), {"casting": "unsafe"})
            _written(out)
        else:
            with autograd.no_grad():
                setitem(out, Ellipsis, result)
        return out
    reason = "a numpy output array: the global value gathered"
    with outside_rules(f"{name} (out=)", reason, always=False):
        value = result.numpy() if isinstance(result, DistTensor) else result
        if isinstance(where, DistTensor):
            where = where.numpy()
    np.copyto(out, value, casting="unsafe", where=where)
    return out


__all__: list[str] = []  # reached as methods and numpy's out=, not as dt functions
