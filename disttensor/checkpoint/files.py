"""The files of a checkpoint: .npy pieces with tile checksums, and the metadata document.

A piece is a standard .npy file (numpy.lib.format, version 1.0 header, so ``np.load`` opens
it); its checksums live in the metadata: one crc32 of the header and one per tile of the
array data (tiles.py). The metadata is one JSON document that carries the crc32 of its own
body.

>>> import os, tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> rec = write_piece(os.path.join(d, "p.npy"), np.arange(12.0).reshape(3, 4))
>>> piece = dict(rec, file="p.npy", shape=[3, 4])
>>> read_region(d, piece, np.dtype("f8"), (slice(1, 3), slice(2, 4)))
array([[ 6.,  7.],
       [10., 11.]])
>>> np.load(os.path.join(d, "p.npy"))[2, 3]
np.float64(11.0)
"""

from __future__ import annotations

import io
import json
import math
import os
import threading
import zlib
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import backend
from ..spec import contiguous
from .tiles import span, tile_crc, tile_crcs, tiling, touched, view2d

METADATA = "metadata.json"
FORMAT = "disttensor-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as written: a missing, truncated or corrupt file."""


# -- byte counting (per thread: each simulated rank counts its own) ----------------------------
_observers = threading.local()


class IOCounter:
    """Count the checkpoint bytes and files this rank reads and writes, and the copies of
    tensor data between a device and the host (``device_copies``, ``device_bytes``: Note
    [Checkpoints of device tensors] in the package docstring).

    >>> import os, tempfile, numpy as np
    >>> with IOCounter() as io:
    ...     _ = write_piece(os.path.join(tempfile.mkdtemp(), "a.npy"), np.zeros(10))
    >>> io.files_written, io.bytes_written, io.device_copies
    (1, 208, 0)
    """

    def __init__(self) -> None:
        self.bytes_read = self.bytes_written = self.files_read = self.files_written = 0
        self.device_copies = self.device_bytes = 0

    def _observe(self, kind: str, nbytes: int, files: int) -> None:
        if kind == "read":
            self.bytes_read += nbytes
            self.files_read += files
        elif kind == "write":
            self.bytes_written += nbytes
            self.files_written += files
        else:  # "device": one copy between a device and the host
            self.device_bytes += nbytes
            self.device_copies += files

    def __enter__(self) -> IOCounter:
        if not hasattr(_observers, "fns"):
            _observers.fns = []
        _observers.fns.append(self._observe)
        return self

    def __exit__(self, *exc: Any) -> None:
        _observers.fns.remove(self._observe)

    def __repr__(self) -> str:
        copies = (
            f", copied {self.device_bytes} B in {self.device_copies} device copies"
            if self.device_copies
            else ""
        )
        return (
            f"IOCounter(read {self.bytes_read} B in {self.files_read} files, "
            f"wrote {self.bytes_written} B in {self.files_written} files{copies})"
        )


def _count(kind: str, nbytes: int, files: int = 0) -> None:
    for fn in getattr(_observers, "fns", ()):
        fn(kind, nbytes, files)


# -- device data (Note [Checkpoints of device tensors]) --------------------------------------------
def copy_to_host(a: Any) -> np.ndarray:
    """The data of a piece on the host: a device array copied once (counted), host data as
    it is."""
    if not backend.is_device(a):
        return a
    host = backend.to_host(a)
    _count("device", host.nbytes, 1)
    return host


def copy_to_backend(be: backend.Backend, a: np.ndarray) -> Any:
    """A loaded box on ``be``: copied onto a device once (counted), ``a`` itself on the host."""
    if not be.device:
        return a
    _count("device", a.nbytes, 1)
    return be.asarray(a)


# -- pieces --------------------------------------------------------------------------------------
def npy_header(arr: np.ndarray) -> bytes:
    """The .npy header numpy writes for ``arr`` (1.0 format; 2.0 when it is too long).

    >>> npy_header(np.zeros((2, 3), "f4"))[:6], len(npy_header(np.zeros((2, 3), "f4")))
    (b'\\x93NUMPY', 128)
    """
    fmt = np.lib.format
    d = fmt.header_data_from_array_1_0(arr)
    buf = io.BytesIO()
    try:
        fmt.write_array_header_1_0(buf, d)
    except ValueError:  # a header over 64 KiB (a shape with very many axes)
        buf = io.BytesIO()
        fmt.write_array_header_2_0(buf, d)
    return buf.getvalue()


def write_piece(path: str, arr: np.ndarray) -> dict[str, Any]:
    """Write ``arr`` as a .npy file, flushed and fsynced; returns its checksum record.

    >>> import tempfile
    >>> rec = write_piece(os.path.join(tempfile.mkdtemp(), "b.npy"), np.ones(3, "i8"))
    >>> sorted(rec)
    ['crc32', 'header_bytes', 'header_crc32', 'tile']
    """
    arr = contiguous(arr)
    header = npy_header(arr)
    rt, cw = tiling(arr.shape, arr.itemsize)
    raw = _raw2d(arr.reshape(-1).view(np.uint8), arr.shape, arr.itemsize)
    crcs = tile_crcs(raw, rt, cw * arr.itemsize)
    with open(path, "wb") as f:
        f.write(header)
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    _count("write", len(header) + raw.nbytes, 1)
    return {
        "header_bytes": len(header),
        "header_crc32": zlib.crc32(header),
        "tile": [rt, cw],
        "crc32": crcs,
    }


def _raw2d(flat: np.ndarray, shape: tuple[int, ...], itemsize: int) -> np.ndarray:
    """The bytes of an array of ``shape`` as its 2-D view (tiles.py): rows x row bytes."""
    rows, cols = view2d(shape)
    return flat.reshape(rows, cols * itemsize)


def _check(f: Any, name: str, piece: dict[str, Any], nbytes: int) -> None:
    """The size of an open piece file and the checksum of its header."""
    head = piece["header_bytes"]
    size = os.fstat(f.fileno()).st_size
    if size != head + nbytes:
        raise CheckpointError(
            f"checkpoint file {name} has {size} bytes but the metadata says {head + nbytes}: "
            "it was truncated or changed after the save"
        )
    header = f.read(head)
    _count("read", head, 1)
    if zlib.crc32(header) != piece["header_crc32"]:
        raise CheckpointError(f"checkpoint file {name}: its .npy header fails its crc32 checksum")


def read_region(
    directory: str,
    piece: dict[str, Any],
    dtype: np.dtype,
    region: tuple[slice, ...],
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``region`` of a piece file (into ``out`` if given). Only the header and the tiles that
    hold the region are read, each verified: with one positioned read when the tiles are
    contiguous in the file (tiles.span), else through a memory map (strips of rows).
    Raises CheckpointError naming the file when it is missing, truncated or corrupt."""
    name = os.path.join(directory, piece["file"])
    shape, head = tuple(piece["shape"]), piece["header_bytes"]
    size = dtype.itemsize
    rt, cw = piece["tile"]
    rows, cols = view2d(shape)
    if out is None:
        out = np.empty(tuple(s.stop - s.start for s in region), dtype)
    tiles = touched(shape, region, rt, cw)
    found = span(shape, tiles, rt, cw)
    start = sum(s.start * math.prod(shape[j + 1 :]) for j, s in enumerate(region))
    direct = False
    try:
        with open(name, "rb") as f:
            _check(f, name, piece, math.prod(shape) * size)
            if found is None:
                data = np.memmap(f, np.uint8, "r", offset=head, shape=(rows * cols * size,))
                raw, first = _raw2d(data, shape, size), (0, 0)
            else:  # one read of just the tiles' bytes
                r0, r1, c0, c1 = found
                base = r0 * cols + c0
                # the region is those bytes exactly: read them straight into the result
                direct = start == base and out.size == (r1 - r0 - 1) * cols + c1 - c0
                if direct and out.flags.c_contiguous:
                    raw = out.reshape(-1).view(np.uint8).reshape(r1 - r0, -1)
                else:
                    direct, raw = False, np.empty((r1 - r0, (c1 - c0) * size), np.uint8)
                f.seek(head + base * size)
                if f.readinto(raw) != raw.nbytes:
                    raise CheckpointError(f"checkpoint file {name} ended early while read")
                first = (r0 // rt, c0 // cw)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {name} is missing") from None
    strips = -(-cols // cw)
    for band, strip in tiles:
        crc, nbytes = tile_crc(raw, band - first[0], strip - first[1], rt, cw * size)
        _count("read", nbytes)
        if crc != piece["crc32"][band * strips + strip]:
            raise CheckpointError(
                f"checkpoint file {name}: rows {band * rt} to {band * rt + rt - 1}, columns "
                f"{strip * cw} to {strip * cw + cw - 1} of its data (as rows of the last axis) "
                "fail their crc32 checksum (a corrupt file)"
            )
    if found is None:
        out[...] = data.view(dtype).reshape(shape)[region]  # lies in the verified tiles
    elif not direct:  # the region inside the tiles read, with the piece's strides
        steps = [math.prod(shape[j + 1 :]) * size for j in range(len(shape))]
        first_item = raw.reshape(-1)[(start - base) * size :].view(dtype)
        # as_strided checks nothing: a region reaching past the bytes read would read memory
        # that is not the file's (a wrong tile plan), so refuse it instead of crashing
        reach = sum((n - 1) * st for n, st in zip(out.shape, steps)) + size if out.size else 0
        if start < base or reach > first_item.nbytes:
            raise CheckpointError(
                f"checkpoint file {name}: the region {region} lies outside the bytes read for it "
                "(an internal error of the tile plan; please report it)"
            )
        out[...] = as_strided(first_item, out.shape, steps, writeable=False)
    return out


# -- metadata ------------------------------------------------------------------------------------
def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def write_metadata(directory: str, body: dict[str, Any]) -> None:
    """Write the metadata document (with the crc32 of its canonical body), fsynced.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> write_metadata(d, {"x": [1, 2.5, None]})
    >>> read_metadata(d)
    {'x': [1, 2.5, None]}
    """
    doc = {"format": FORMAT, "version": VERSION, "body_crc32": zlib.crc32(_canonical(body))}
    text = _readable({**doc, "body": body}).encode()
    with open(os.path.join(directory, METADATA), "wb") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    _count("write", len(text), 1)


def _readable(doc: dict[str, Any]) -> str:
    """JSON with one line per top-level entry, per body entry and per tensor."""

    def lines(d: dict[str, Any], indent: str) -> str:
        out = []
        for k, v in d.items():
            if k == "body":
                text = lines(v, indent + " ")
            elif k == "tensors":
                rows = ",\n".join(f"{indent}  {json.dumps(t)}" for t in v)
                text = f"[\n{rows}\n{indent}]"
            else:
                text = json.dumps(v)
            out.append(f"{indent}{json.dumps(k)}: {text}")
        return "{\n" + ",\n".join(out) + "\n" + indent[:-1] + "}"

    return lines(doc, " ") + "\n"


def read_metadata(directory: str) -> dict[str, Any]:
    """The body of the metadata document, its checksum verified (CheckpointError if not)."""
    name = os.path.join(directory, METADATA)
    with open(name, "rb") as f:
        text = f.read()
    _count("read", len(text), 1)
    try:
        doc = json.loads(text)
        body, crc = doc["body"], doc["body_crc32"]
        fmt, version = doc["format"], doc["version"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint metadata {name} is corrupt: {e}") from None
    if fmt != FORMAT:
        raise CheckpointError(f"{name} is not a disttensor checkpoint (format {fmt!r})")
    if zlib.crc32(_canonical(body)) != crc:
        raise CheckpointError(f"checkpoint metadata {name} fails its crc32 checksum (corrupt)")
    if version != VERSION:
        raise CheckpointError(
            f"{name} is checkpoint format version {version}; this disttensor reads {VERSION}"
        )
    return body
