"""``dt.load``: every rank reads, from the pieces that overlap its own box, just the slices
it needs (Note [Reading only what overlaps]); no tensor data moves between ranks. A tensor
for a device is assembled on the host and copied there once (Note [Checkpoints of device
tensors])."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from .. import backend, comm
from ..mesh import ProcessMesh
from ..placement import Replicate, Shard
from ..spec import DistSpec
from ..tensor import from_spec_block
from .commit import portable, raise_first, resolve
from .files import CheckpointError, copy_to_backend, read_metadata, read_region
from .tree import fill, match


def load(template: Any, path: str | os.PathLike) -> Any:
    """Load the checkpoint at ``path`` into the structure of ``template``: every DistTensor
    comes back on the template tensor's mesh, placements and device (any world size; a
    tensor the template has none for on the selected device), Python values and numpy arrays
    as saved. Collective over every rank.

    >>> import os, tempfile, numpy as np, disttensor as dt
    >>> mesh = dt.ProcessMesh([0])
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> dt.save({"x": dt.shard_tensor(np.arange(4.0), mesh, [dt.Shard(0)]), "step": 3}, path)
    >>> state = dt.load({"x": dt.zeros((4,), mesh=mesh, placements=[dt.Replicate()])}, path)
    >>> state["x"].to_local(), state["x"].placements
    (array([0., 1., 2., 3.]), [Replicate()])
    """
    path = os.path.abspath(os.fspath(path))
    world = comm.world()
    rank = comm.get_rank()

    # 1. every rank reads the metadata and checks the template; the ranks agree on the outcome
    error = found = None
    requests: list = []
    try:
        directory = resolve(path)
        body = read_metadata(directory)
        structure = match(template, body["tree"], body["tensors"], requests)
        found = (directory, body["id"])
    except (OSError, ValueError, TypeError, KeyError) as e:
        error = e
    got = world.allgather_object((portable(error), found))
    raise_first([e for e, _ in got])
    if len({f for _, f in got}) > 1:
        raise CheckpointError(
            f"dt.load: the ranks found different checkpoints at {path}: "
            + ", ".join(f"rank {r}: {f[0]} ({f[1]})" for r, (_, f) in enumerate(got))
            + "; load from a file system every rank sees, and not while a save to it runs"
        )

    # 2. every rank reads its part; a file that fails its checks is reported on every rank
    values, failures = [], []
    for table, target, _ in requests:
        try:
            values.append(_read(directory, table, target, rank, world.size))
        except (CheckpointError, OSError) as e:
            failures.append(str(e))
            values.append(None)
    every = world.allgather_object(failures)
    if any(every):
        seen: dict[str, list[int]] = {}
        for r, msgs in enumerate(every):
            for m in msgs:
                seen.setdefault(m, []).append(r)
        raise CheckpointError("; ".join(f"{m} (read by ranks {rs})" for m, rs in seen.items()))
    return fill(structure, values)


def default_spec(shape: tuple[int, ...], dtype: np.dtype, world_size: int) -> DistSpec:
    """Where a saved DistTensor goes when the template has no tensor for it: split along its
    longest axis over every rank (Note [Loading without a template tensor]).

    >>> default_spec((3, 10), np.dtype("f4"), 4).placements
    (Shard(dim=1),)
    """
    mesh = ProcessMesh(list(range(world_size)), dim_names=["world"])
    placement = Shard(int(np.argmax(shape))) if shape else Replicate()
    return DistSpec.make(mesh, [placement], shape, dtype)


def _read(directory: str, table: dict, target: Any, rank: int, world_size: int) -> Any:
    """One loaded leaf: a DistTensor in the target's layout and on its device (the selected
    one for "default"), or the whole value as numpy."""
    dtype = np.lib.format.descr_to_dtype(table["dtype"])
    shape = tuple(table["shape"])
    if isinstance(target, str) and target == "numpy":
        arr = assemble(directory, table, dtype, tuple(slice(0, n) for n in shape))
        return arr[()] if table["kind"] == "scalar" else arr
    if isinstance(target, str):
        spec, be = default_spec(shape, dtype, world_size), backend.current()
    else:
        spec, be = target.spec, backend.of(target.to_local())
    # Partial mesh dims of the template hold the value as Partial placements do (sum: on
    # coordinate 0, zeros elsewhere): a local step after reading the plain box
    return from_spec_block(
        lambda slices: copy_to_backend(be, assemble(directory, table, dtype, slices)), spec, on=be
    )


def assemble(directory: str, table: dict, dtype: np.dtype, box: tuple[slice, ...]) -> np.ndarray:
    """The global ``box`` of a saved tensor, from the slices of the pieces that overlap it."""
    out = np.empty(tuple(s.stop - s.start for s in box), dtype)
    filled = 0
    for piece in table["pieces"]:
        lo = [max(s.start, o) for s, o in zip(box, piece["offset"])]
        hi = [min(s.stop, o + n) for s, o, n in zip(box, piece["offset"], piece["shape"])]
        if any(a >= b for a, b in zip(lo, hi)):
            continue
        region = tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, piece["offset"]))
        where = tuple(slice(a - s.start, b - s.start) for a, b, s in zip(lo, hi, box))
        read_region(directory, piece, dtype, region, out[where] if out.ndim else out)
        filled += math.prod(b - a for a, b in zip(lo, hi))
    if filled != out.size and dtype.itemsize:
        raise CheckpointError(
            f"checkpoint {directory}: the pieces of a tensor cover {filled} of the {out.size} "
            "items this rank needs; its metadata is inconsistent"
        )
    return out
