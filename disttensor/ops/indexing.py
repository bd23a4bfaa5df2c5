"""Integer-array and boolean keys without gathering the tensor: ``W[ids]``, ``probs[np.arange(N),
y]``, ``X[labels == j]``.

Note [Gathers by index]
    For a key whose integer arrays (or one boolean mask, as its ``nonzero()``) index the
    leading axes of x and whose remaining entries take axes whole, numpy's result is
    ``x[c_0[p], ..., c_{k-1}[p], ...]`` at every position p of the indices' broadcast shape S.
    Every rank knows the indices (numpy arrays as given; DistTensor indices are gathered: their
    bytes, not x's), so every rank can work out, without asking, which rank holds each
    selected item. The result keeps x's splits: a split of an indexed axis becomes a split of
    the result's first axis (the positions p, balanced as any Shard), a split of a trailing
    axis stays on it. Each rank then receives from each holder just the items of its own
    positions, point to point; a rank that holds an item itself copies it. So a row lookup
    moves at most the rows requested, once, and a pick aligned with x's split (``probs[i,
    y[i]]`` with probs split by rows) moves nothing. Backward is the same exchange the other
    way, adding into zeros of x's layout (``np.add.at``: repeated indices accumulate). A
    Partial x stays Partial (each rank picks from its own partial values: the op only moves
    items). Keys of other forms keep the counted replicate fallback.

Note [Lookups in unsplit tensors]
    When no mesh dim splits x (Replicate, Partial, or a Shard over a mesh dim of one rank),
    every rank holds x's whole value (or its part of a Partial sum), so any numpy key (``V[:,
    order]``, masks among slices, several arrays) is numpy's own indexing of the local value:
    no communication, the Partials kept (picking items is linear). A DistTensor integer index
    (``wte[ids]`` with a replicated table and the token ids split by batch) is looked up the
    same way, each rank with its own shard of the indices, so the result is split like the
    indices (Shard(d) of ids is Shard(d) of the result) where x is Replicate: no gather of the
    indices, no communication. An index out of bounds raises numpy's IndexError on the ranks
    that hold it (the others do not see it; under MPI the job then ends, see the guide's
    "Hangs and exits"). Backward adds the output gradient into zeros of x's local shape
    (``np.add.at``): Partial(sum) over the mesh dims that split the indices (each rank has the
    contributions of its own indices), like ``embedding_grad`` for split ids.

Note [Keys on a device]
    On device shards (a GPU's CuPy arrays) the same two paths run with the same exchanges;
    only where the key's numbers live differs. A key's host entries (numpy arrays, lists,
    masks) are metadata: every rank plans with them on the host, as above, and the library
    moves to the device only what its kernels index with (this rank's local rows and output
    positions; in an unsplit lookup, the key itself), explicitly. A device array in a key is
    copied to the host first for the same reason (``host_key``); a DistTensor index is
    gathered to the host as on the CPU, except the unsplit lookup's leading index, which
    stays on the device. Host and device never meet otherwise: a DistTensor or array of
    another backend than x's in the key raises ``backend.mixed`` before anything moves.
    Two CuPy differences are kept out of the results: CuPy wraps indices out of bounds
    around (numpy raises), so host keys are checked by numpy on a stand-in of no memory and
    a device index by one flag read from the device; and CuPy takes one boolean array only
    alone in a key, so a boolean array of one or more axes is passed as its ``nonzero()``
    (numpy's own meaning of it) and a 0-d boolean (``x[True]``) as a new axis indexed by
    ``zeros(1 or 0)`` (``_device_key``). Backward adds with the backend's ``scatter_add``
    (``cupyx.scatter_add`` on a GPU, ``np.add.at`` on the host).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import autograd, backend, comm
from ..accounting import outside_rules
from ..placement import Partial, Replicate, Shard
from ..spec import DistSpec
from ..tensor import DistTensor, reshard


def gather_by_index(x: DistTensor, key: Any) -> DistTensor | None:
    """``x[key]`` by Note [Gathers by index]; None when the key is not of its form."""
    key = host_key("x[key]", x, key)  # Note [Keys on a device]
    spec = x._spec
    mesh = spec.mesh
    if not any(p.is_shard() and n > 1 for p, n in zip(spec.placements, mesh.shape)):
        out = _unsplit_lookup(x, key)  # Note [Lookups in unsplit tensors]
        if out is not None:
            return out
    coords = _leading_coordinates(spec.shape, key)
    if coords is None:
        return None
    k = len(coords)
    s_shape = coords[0].shape if coords else ()
    if not s_shape:
        return None  # every index a scalar: basic indexing
    trailing = spec.shape[k:]
    out_shape = (*s_shape, *trailing)
    shift = len(s_shape) - k
    placements = tuple(
        (Shard(0) if p.dim < k else Shard(p.dim + shift)) if p.is_shard() else p
        for p in spec.placements
    )
    out_spec = DistSpec(mesh, placements, out_shape, spec.dtype)
    plan = _Plan(spec, out_spec, coords)
    local = plan.forward(x._local)
    out = DistTensor(local, out_spec)
    if x.requires_grad and autograd.is_grad_enabled():
        plain = out_spec.without_partials()  # Note [Partial gradients] in autograd.py

        def backward(grads):
            g = grads[0]
            if g._spec != plain:
                g = reshard(g, mesh, list(plain.placements))
            return (DistTensor(plan.backward(g._local), spec.without_partials()),)

        autograd.record("getitem[index]", (x,), (out,), backward)
    return out


def _unsplit_lookup(x: DistTensor, key: Any) -> DistTensor | None:
    """``x[key]`` of an x no mesh dim splits (Note [Lookups in unsplit tensors]); None for keys
    with a DistTensor that is not one integer index on the leading axis (the general path)."""
    spec = x._spec
    mesh = spec.mesh
    parts = key if isinstance(key, tuple) else (key,)
    tensors = [i for i, k in enumerate(parts) if isinstance(k, DistTensor)]
    if not tensors:
        return _lookup(x, key, None)
    idx = parts[0]
    rest = parts[1:]
    if (
        tensors != [0]
        or idx.mesh != mesh
        or idx.dtype.kind not in "iu"
        or any(not (r is Ellipsis or (isinstance(r, slice) and r == slice(None))) for r in rest)
        or len(spec.shape) == 0
    ):
        return None
    for p, q, n in zip(spec.placements, idx.placements, mesh.shape):
        if n > 1 and (q.is_partial() or (q.is_shard() and p.is_partial())):
            return None  # partial indices, or different ids against partial values
    return _lookup(x, key, idx)


def _lookup(x: DistTensor, key: Any, idx: DistTensor | None) -> DistTensor:
    """numpy's ``x[key]`` on this rank's value of an unsplit x; ``idx``: the DistTensor index
    that stands first in ``key``, whose shard replaces it (Note [Lookups in unsplit
    tensors])."""
    spec = x._spec
    mesh = spec.mesh
    coord = mesh.get_coord(comm.get_rank())
    pls = _pls(idx, mesh)
    placements = tuple(
        Shard(q.dim) if q.is_shard() else (p if p.is_partial() else Replicate())
        for p, q in zip(spec.placements, pls)
    )
    split = [q.is_shard() and n > 1 for q, n in zip(pls, mesh.shape)]
    be = backend.of(x._local)
    pre = None  # a device key's first step (_device_key)
    if idx is None:
        local_key = key
        if coord is None or be.device:  # numpy's result shape and checks, on a stand-in
            stand_in = _NO_MEMORY if be.device else np.empty((), spec.dtype)
            out_shape = np.broadcast_to(stand_in, spec.shape)[key].shape
        if be.device:
            pre, local_key = _device_key(be, key)
    else:
        rest = key[1:] if isinstance(key, tuple) else ()
        local_key = (idx._local, *rest)
        out_shape = (*idx.shape, *spec.shape[1:])
        if be.device and coord is not None:
            _check_bounds(idx._local, spec.shape[0], 0)
    if coord is not None:
        local = (x._local if pre is None else x._local[pre])[local_key]
        if idx is None:
            out_shape = local.shape
    out_spec = DistSpec(mesh, placements, out_shape, spec.dtype)
    if coord is None:
        local = be.xp.empty(out_spec.local_shape(None), spec.dtype)
    out = DistTensor(be.xp.ascontiguousarray(local), out_spec)
    if x.requires_grad and autograd.is_grad_enabled():
        plain = out_spec.without_partials()  # Note [Partial gradients] in autograd.py
        grad_spec = spec.without_partials().replace(
            placements=[
                Partial("sum") if s else p
                for p, s in zip(spec.without_partials().placements, split)
            ]
        )

        def backward(grads):
            g = grads[0]
            if g._spec != plain:
                g = reshard(g, mesh, list(plain.placements))
            grad = be.xp.zeros(grad_spec.local_shape(coord), spec.dtype)
            if coord is not None:  # np.add.at on the host, cupyx.scatter_add on a GPU
                be.scatter_add(grad if pre is None else grad[pre], local_key, g._local)
            return (DistTensor(grad, grad_spec),)

        autograd.record("getitem[index]", (x,), (out,), backward)
    return out


def _pls(idx: DistTensor | None, mesh) -> tuple:
    """The index's placements, all Replicate for a numpy key."""
    return tuple(idx.placements) if idx is not None else (Replicate(),) * mesh.ndim


# -- keys on a device (Note [Keys on a device]) ----------------------------------------------------
_NO_MEMORY = np.empty((), "V0")  # a stand-in of no bytes: numpy's indexing of it checks a key


def host_key(what: str, x: DistTensor, key: Any) -> Any:
    """``key`` (one entry or a tuple of entries) with its device arrays copied to the host:
    indices are metadata that every rank plans with (an explicit copy, Note [Keys on a
    device]). ``backend.mixed`` (TypeError) for a DistTensor or an array on another backend
    than x's, before any communication."""
    be = backend.of(x._local)
    parts = key if isinstance(key, tuple) else (key,)
    out = []
    for k in parts:
        local = k._local if isinstance(k, DistTensor) else k
        if isinstance(k, DistTensor) or backend.is_device(local):
            kb = backend.of(local)
            if kb is not be:
                raise backend.mixed(what, kb, be)
            if kb.device and local is k:
                k = kb.to_host(k)
        out.append(k)
    return tuple(out) if isinstance(key, tuple) else out[0]


def _zero_d_bool(k: Any) -> bool:
    return isinstance(k, (bool, np.bool_)) or (
        isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype == np.bool_
    )


def _device_key(be: backend.Backend, key: Any) -> tuple[Any, tuple]:
    """numpy's key ``key`` (checked by numpy already) for an array of device backend ``be``, as
    ``(pre, key)`` with ``a[key]`` numpy's value of it: ``a[pre][key]`` (``pre`` None: no
    first step). Index arrays are moved to the device; a boolean array of one or more axes is
    its ``nonzero()`` (numpy's meaning of it; CuPy takes a mask only alone); a 0-d boolean is
    numpy's new advanced axis of length 1 or 0: a new axis in ``pre``, indexed by ``zeros(1
    or 0)`` in ``key`` (Note [Keys on a device])."""
    parts = key if isinstance(key, tuple) else (key,)
    pre = None
    if any(_zero_d_bool(k) for k in parts):
        pre = tuple(
            None if _zero_d_bool(k) else k if k is None or k is Ellipsis else slice(None)
            for k in parts
        )
        parts = tuple(
            np.zeros(int(k), np.intp) if _zero_d_bool(k) else slice(None) if k is None else k
            for k in parts
        )
    out: list[Any] = []
    for k in parts:
        if isinstance(k, np.integer):
            k = int(k)  # CuPy takes Python ints among index arrays
        elif not (k is None or k is Ellipsis or isinstance(k, (int, slice))):
            a = np.asarray(k)  # an index array: numpy's, a list, a range...
            if a.dtype == np.bool_:
                out.extend(be.asarray(i) for i in np.nonzero(a))
                continue
            if a.size == 0:
                a = a.astype(np.intp)  # numpy takes [] as no indices
            k = be.asarray(a) if a.ndim else a.item()
        out.append(k)
    return pre, tuple(out)


def device_getitem(a: Any, key: Any) -> Any:
    """numpy's ``a[key]`` on a device array ``a`` with a host key (an advanced key the
    replicate fallback applies to the gathered value): numpy checks the key on a stand-in of
    no memory (its IndexError for indices out of bounds, which CuPy would wrap), then the key
    is made the device's (_device_key)."""
    np.broadcast_to(_NO_MEMORY, a.shape)[key]  # numpy's errors, no data
    pre, local_key = _device_key(backend.of(a), key)
    return (a if pre is None else a[pre])[local_key]


def _check_bounds(idx: Any, n: int, axis: int) -> None:
    """numpy's IndexError for a device index array with entries out of bounds (CuPy wraps them
    around): one flag read from the device, the first bad entry only when there is one."""
    bad = idx >= n if idx.dtype.kind == "u" else (idx < -n) | (idx >= n)
    if backend.to_host(bad.any()):
        first = backend.to_host(idx[bad][:1])[0]
        raise IndexError(f"index {first} is out of bounds for axis {axis} with size {n}")


def _leading_coordinates(shape: tuple[int, ...], key: Any) -> list[np.ndarray] | None:
    """The global coordinates (one array per indexed leading axis, broadcast together) of a
    key of Note [Gathers by index]'s form; None for other keys. numpy's IndexError for
    indices out of bounds."""
    parts = list(key) if isinstance(key, tuple) else [key]
    arrays: list[Any] = []
    i = 0
    while i < len(parts) and not isinstance(parts[i], (slice, type(None), type(Ellipsis))):
        arrays.append(parts[i])
        i += 1
    rest = parts[i:]
    if not arrays or any(
        not (r is Ellipsis or (isinstance(r, slice) and r == slice(None))) for r in rest
    ):
        return None
    with outside_rules("getitem[index]", "a DistTensor index: gathered", always=False):
        arrays = [a.numpy() if isinstance(a, DistTensor) else a for a in arrays]
    arrays = [np.asarray(a) for a in arrays]
    if any(a.dtype == np.bool_ for a in arrays):
        if len(arrays) != 1 or arrays[0].ndim == 0:
            return None  # a mask among other indices, or x[True]: the fallback
        mask = arrays[0]
        if mask.shape != tuple(shape[: mask.ndim]):
            raise IndexError(
                f"boolean index did not match indexed array along axis 0; size of axis is "
                f"{shape[0] if shape else 0} but size of corresponding boolean axis is "
                f"{mask.shape[0] if mask.ndim else 0}"
            )
        arrays = list(np.nonzero(mask))
    if any(a.dtype.kind not in "iu" for a in arrays) or len(arrays) > len(shape):
        return None  # numpy raises its own error through the fallback
    try:
        arrays = list(np.broadcast_arrays(*arrays))
    except ValueError:
        return None
    out = []
    for a, (axis, n) in zip(arrays, enumerate(shape)):
        bad = (a < -n) | (a >= n)
        if bad.any():
            raise IndexError(
                f"index {a[bad].flat[0]} is out of bounds for axis {axis} with size {n}"
            )
        out.append(np.where(a < 0, a + n, a).astype(np.intp))
    return out


def _owner_coordinate(spec: DistSpec, axis: int, idx: np.ndarray) -> dict[int, np.ndarray]:
    """For each mesh dim that splits ``axis``, the coordinate along it of the shard holding
    each index (nested splits in mesh-dim order: Note [Nested sharding] in spec.py)."""
    start = np.zeros(idx.shape, np.intp)
    length = np.full(idx.shape, spec.shape[axis], np.intp)
    out = {}
    for m, p in enumerate(spec.placements):
        if not (p.is_shard() and p.dim == axis):
            continue
        k = spec.mesh.shape[m]
        q, r = np.divmod(length, k)  # numpy.array_split: the first r parts one longer
        rel = idx - start
        big = r * (q + 1)  # the items in the longer parts
        c = np.where(rel < big, rel // np.maximum(q + 1, 1), r + (rel - big) // np.maximum(q, 1))
        out[m] = c
        start = start + c * q + np.minimum(c, r)
        length = q + (c < r)
    return out


class _Plan:
    """Who sends which positions to whom, worked out the same on every rank."""

    def __init__(self, spec: DistSpec, out_spec: DistSpec, coords: list[np.ndarray]) -> None:
        self.spec, self.out_spec = spec, out_spec
        mesh = spec.mesh
        self.rank = comm.get_rank()
        self.coord = mesh.get_coord(self.rank)
        k = len(coords)
        owners: dict[int, np.ndarray] = {}
        for a, c in enumerate(coords):
            owners.update(_owner_coordinate(spec, a, c))
        self.k = k
        self.coords = coords
        # per receiver: its positions (a flat index into S, C order) and each one's sender
        self.sends: dict[int, list[tuple[int, np.ndarray]]] = {}  # sender -> [(receiver, pos)]
        self.mine_from: list[tuple[int, np.ndarray]] = []  # (sender, positions) for this rank
        s_shape = coords[0].shape
        flat_owner = {m: o.reshape(-1) for m, o in owners.items()}
        row = math.prod(s_shape[1:])
        for r in mesh.process_ids:
            rc = mesh.get_coord(r)
            j0, n = out_spec.local_box(rc)[0]
            pos = np.arange(j0 * row, (j0 + n) * row)
            if pos.size == 0:
                continue
            sender_coord = np.broadcast_to(np.array(rc, np.intp), (pos.size, len(rc))).copy()
            for m, o in flat_owner.items():
                sender_coord[:, m] = o[pos]
            senders = mesh.mesh[tuple(sender_coord.T)]
            for s in np.unique(senders):
                chosen = pos[senders == s]
                self.sends.setdefault(int(s), []).append((r, chosen))
                if r == self.rank:
                    self.mine_from.append((int(s), chosen))

    def _local_rows(self, positions: np.ndarray, xp: Any) -> tuple[Any, ...]:
        """This rank's local coordinates on the indexed axes of the items at ``positions``, as
        arrays of the shards' module ``xp`` (planned on the host, moved to a device: Note
        [Keys on a device])."""
        box = self.spec.local_box(self.coord)
        return tuple(
            xp.asarray(c.reshape(-1)[positions] - box[a][0]) for a, c in enumerate(self.coords)
        )

    def _out_rows(self, positions: np.ndarray, xp: Any) -> Any:
        j0, _ = self.out_spec.local_box(self.coord)[0]
        return xp.asarray(positions - j0 * math.prod(self.coords[0].shape[1:]))

    def forward(self, local: Any) -> Any:
        xp = backend.xp(local)  # numpy, or the device's module: buffers on the shards' device
        shape = self.out_spec.local_shape(self.coord)
        if self.coord is None:
            return xp.empty(shape, self.spec.dtype)
        trailing = local.shape[self.k :]
        out = xp.empty((math.prod(shape[: len(shape) - len(trailing)]), *trailing), local.dtype)
        w = comm.world()
        pending = []
        for r, pos in self.sends.get(self.rank, []):
            rows = local[self._local_rows(pos, xp)]
            if r == self.rank:
                out[self._out_rows(pos, xp)] = rows
            else:
                pending.append((w.isend(xp.ascontiguousarray(rows), r, tag=11), None, None))
        for s, pos in self.mine_from:
            if s != self.rank:
                buf = xp.empty((pos.size, *trailing), local.dtype)
                pending.append((w.irecv(buf, s, tag=11), buf, pos))
        for work, buf, pos in pending:
            work.wait()
            if buf is not None:
                out[self._out_rows(pos, xp)] = buf
        return out.reshape(shape)

    def backward(self, g: Any) -> Any:
        """The items of ``g`` (this rank's output shard) added back where they came from
        (the backend's scatter-add: np.add.at, cupyx.scatter_add)."""
        be = backend.of(g)
        xp = be.xp
        shape = self.spec.local_shape(self.coord)
        grad = xp.zeros(shape, self.spec.dtype)
        if self.coord is None:
            return grad
        trailing = shape[self.k :]
        # the positions counted, not -1: an empty trailing axis (an empty shard) leaves -1 open
        flat = g.reshape(math.prod(g.shape[: g.ndim - len(trailing)]), *trailing)
        w = comm.world()
        pending = []
        for s, pos in self.mine_from:
            rows = flat[self._out_rows(pos, xp)]
            if s == self.rank:
                be.scatter_add(grad, self._local_rows(pos, xp), rows)
            else:
                pending.append((w.isend(xp.ascontiguousarray(rows), s, tag=12), None, None))
        for r, pos in self.sends.get(self.rank, []):
            if r != self.rank:
                buf = xp.empty((pos.size, *trailing), self.spec.dtype)
                pending.append((w.irecv(buf, r, tag=12), buf, pos))
        for work, buf, pos in pending:
            work.wait()
            if buf is not None:
                be.scatter_add(grad, self._local_rows(pos, xp), buf)
        return grad


__all__: list[str] = []  # reached through x[key] (ops/shape.py getitem)
