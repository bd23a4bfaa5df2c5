"""``dt.save``: every rank writes the pieces it is the writer of; rank 0 writes the metadata
and publishes the directory (Note [Checkpoint layout], Note [Atomic saves])."""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import Any

import numpy as np

from .. import comm
from ..placement import Replicate, Shard
from ..reshard import execute
from ..spec import DistSpec
from ..tensor import DistTensor
from .commit import agree, commit, make_temp, portable, raise_first
from .files import copy_to_host, write_metadata, write_piece
from .tree import flatten


def save(state: Any, path: str | os.PathLike) -> None:
    """Save ``state`` (nested dicts, lists and tuples of DistTensors, numpy arrays and Python
    values) as a checkpoint directory at ``path``, atomically. Collective over every rank.

    Each rank writes only the pieces it holds, one writer per distinct piece; Partial
    tensors are reduced first. Device tensors are written from one host copy per piece
    (Note [Checkpoints of device tensors]). See docs/checkpoints.md.

    >>> import os, tempfile, numpy as np, disttensor as dt
    >>> x = dt.shard_tensor(np.arange(6.0), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> dt.save({"x": x, "step": 3}, path)
    >>> sorted(os.listdir(path))
    ['metadata.json', 't00000.0000.npy']
    """
    path = os.path.abspath(os.fspath(path))
    tree, leaves = flatten(state)  # a TypeError here, on every rank, before any collective
    world = comm.world()
    rank, size = comm.get_rank(), world.size
    tables = [_describe(obj, i) for i, (_, obj) in enumerate(leaves)]

    # 1. the ranks agree on what they save; rank 0 makes the temporary directory
    tmp = error = None
    if rank == 0:
        try:
            tmp = make_temp(path)
        except OSError as e:
            error = e
    got = world.allgather_object((_digest(tree, tables), tmp, portable(error)))
    raise_first([e for _, _, e in got])
    tmp = got[0][1]
    differ = [r for r, (d, _, _) in enumerate(got) if d != got[0][0]]
    if differ:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(
            f"dt.save: ranks {differ} passed a state that differs from rank 0's in its keys, "
            "shapes, dtypes, meshes or placements; every rank must save the same state"
        )

    # 2. every rank writes its pieces (Partials are reduced first: collectives, in order)
    written: dict[str, dict] = {}
    error = None
    for (_, obj), table in zip(leaves, tables):
        local = _stored_local(obj, table)
        for piece in table["pieces"]:
            if piece["rank"] == rank and error is None:
                try:
                    name = os.path.join(tmp, piece["file"])
                    written[piece["file"]] = write_piece(name, copy_to_host(local))
                except OSError as e:
                    error = e
    got = world.allgather_object((written, portable(error)))  # after every rank's fsync
    if any(e is not None for _, e in got) and rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    raise_first([e for _, e in got])

    # 3. rank 0 writes the metadata, last, and publishes the directory
    error = None
    if rank == 0:
        crcs = {name: rec for files, _ in got for name, rec in files.items()}
        for table in tables:
            table.pop("_spec", None)
            for piece in table["pieces"]:
                piece.update(crcs[piece["file"]])
        save_id = os.path.basename(tmp).rsplit("tmp-", 1)[1]
        body = {"world_size": size, "id": save_id, "tree": tree, "tensors": tables}
        try:
            write_metadata(tmp, body)
            commit(tmp, path)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            error = e
    agree(error)  # nobody returns before the checkpoint is in place (or everybody raises)


def stored_spec(spec: DistSpec) -> DistSpec:
    """The layout a tensor is written in: each Partial mesh dim becomes a Shard of the longest
    axis no later mesh dim splits, so that one reduce-scatter reduces it (half an
    all-reduce's bytes) and the writing is spread; Replicate when there is none (0-d).

    >>> import disttensor as dt
    >>> spec = DistSpec.make(dt.ProcessMesh([[0, 1]]), [dt.Partial(), dt.Shard(1)], (9, 8), "f8")
    >>> stored_spec(spec).placements
    (Shard(dim=0), Shard(dim=1))
    """
    if not spec.has_partial():
        return spec
    pls = list(spec.placements)
    for m in reversed(range(len(pls))):  # inner mesh dims first: Note [Nested sharding]
        if pls[m].is_partial():
            taken = {p.dim for p in pls[m + 1 :] if isinstance(p, Shard)}
            free = [a for a in range(len(spec.shape)) if a not in taken]
            pls[m] = Shard(max(free, key=lambda a: spec.shape[a])) if free else Replicate()
    return spec.replace(placements=pls)


def _describe(obj: Any, i: int) -> dict[str, Any]:
    """The tensor table entry of leaf ``i``: what it is and its pieces (distinct non-empty
    boxes, each with its writer), known to every rank without communication."""
    dtype = np.lib.format.dtype_to_descr(obj.dtype)
    if not isinstance(obj, DistTensor):
        shape = tuple(np.shape(obj))
        boxes = {tuple((0, n) for n in shape): [0]}  # rank 0's value is saved
        table = {"kind": "array" if isinstance(obj, np.ndarray) else "scalar"}
    else:
        spec = obj.spec
        stored = stored_spec(spec)
        shape, mesh = spec.shape, spec.mesh
        boxes = {}
        for r in mesh.process_ids:
            boxes.setdefault(stored.local_box(mesh.get_coord(r)), []).append(r)
        table = {
            "kind": "dtensor",
            "mesh": {"shape": list(mesh.shape), "ranks": mesh.process_ids, "names": mesh.dim_names},
            "placements": [repr(p) for p in spec.placements],
            "stored_placements": [repr(p) for p in stored.placements],
            "_spec": stored,
        }
    pieces = []
    for box, holders in boxes.items():
        if any(n == 0 for _, n in box) or obj.dtype.itemsize == 0:
            continue  # nothing to write
        j = len(pieces)
        pieces.append(
            {
                "file": f"t{i:05d}.{j:04d}.npy",
                "offset": [s for s, _ in box],
                "shape": [n for _, n in box],
                "rank": holders[(i + j) % len(holders)],  # replicas take turns writing
            }
        )
    return {**table, "shape": list(shape), "dtype": dtype, "pieces": pieces}


def _stored_local(obj: Any, table: dict[str, Any]) -> Any:
    """This rank's data of the tensor in its stored layout (collective for Partials), on the
    tensor's device."""
    if not isinstance(obj, DistTensor):
        return np.asarray(obj)
    stored = table["_spec"]
    if stored == obj.spec:
        return obj.to_local()
    return execute(obj.to_local(), obj.spec, stored)


def _digest(tree: dict, tables: list[dict]) -> str:
    """What every rank must agree on: the structure (Python values left out: rank 0's are
    saved) and every tensor's kind, shape, dtype, mesh and placements."""

    def skeleton(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (None if k == "value" else skeleton(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [skeleton(v) for v in node]
        return node

    static = [{k: v for k, v in t.items() if k not in ("pieces", "_spec")} for t in tables]
    return hashlib.sha256(repr((skeleton(tree), static)).encode()).hexdigest()
