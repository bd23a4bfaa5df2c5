"""Checksum tiles of a piece, so that a reader verifies just the part it reads (Note
[Reading only what overlaps] in the package docstring).

A piece's data is seen as a C-order 2-D array: a row is one index of all axes but the last
(a 0-d or 1-D piece is one row), a column one index of the last axis. Tiles are a grid on
that view, ``rows`` rows by ``cols`` columns each; the crc32 of a tile runs over its row
segments in order. The grid aims at tiles of at least 64 KiB and at most 1024 per file,
shared between the two directions (about as many row bands as column strips), with column
strips no narrower than 4 KiB, a page: the finest split a memory map can read apart.

>>> tiling((4096, 4096), 4)  # 64 MiB: 256 bands of 16 rows x 4 strips of 4 KiB
(16, 1024)
>>> tiling((1 << 20,), 8)  # one long row: 128 strips of 64 KiB
(1, 8192)
"""

from __future__ import annotations

import math
import zlib

import numpy as np

STRIP_MIN = 4 << 10
TILE_MIN = 64 << 10
MAX_TILES = 1024


def view2d(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns) of the 2-D view of an array of ``shape``."""
    if not shape:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]


def tiling(shape: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """(rows, columns) per tile for a piece of ``shape``."""
    rows, cols = view2d(shape)
    row_bytes = cols * itemsize
    want = max(1, min(MAX_TILES, rows * row_bytes // TILE_MIN))
    strips_max = max(1, row_bytes // STRIP_MIN)
    bands = min(rows, max(1, want // min(math.isqrt(want - 1) + 1, strips_max)))
    strips = min(strips_max, max(1, want // bands))
    return -(-rows // bands), -(-cols // strips)


def tile_crcs(raw: np.ndarray, rt: int, cwb: int) -> list[int]:
    """crc32 of every tile (band-major) of ``raw``, the uint8 2-D view (rows, row bytes);
    tiles are ``rt`` rows by ``cwb`` bytes.

    >>> raw = np.arange(12, dtype=np.uint8).reshape(3, 4)
    >>> tile_crcs(raw, 2, 2) == [zlib.crc32(bytes([0, 1, 4, 5])), zlib.crc32(bytes([2, 3, 6, 7])),
    ...                          zlib.crc32(bytes([8, 9])), zlib.crc32(bytes([10, 11]))]
    True
    """
    rows, width = raw.shape
    strips = -(-width // cwb)
    if strips == 1:  # whole rows: each tile is contiguous
        return [zlib.crc32(raw[r : r + rt]) for r in range(0, rows, rt)]
    crcs = [0] * (-(-rows // rt) * strips)
    for r in range(rows):
        row, base = raw[r], (r // rt) * strips
        for j in range(strips):
            crcs[base + j] = zlib.crc32(row[j * cwb : (j + 1) * cwb], crcs[base + j])
    return crcs


def tile_crc(raw: np.ndarray, band: int, strip: int, rt: int, cwb: int) -> tuple[int, int]:
    """(crc32, bytes) of one tile of ``raw``."""
    block = raw[band * rt : (band + 1) * rt, strip * cwb : (strip + 1) * cwb]
    if block.flags.c_contiguous:
        return zlib.crc32(block), block.nbytes
    crc = 0
    for row in block:
        crc = zlib.crc32(row, crc)
    return crc, block.nbytes


def touched(
    shape: tuple[int, ...], region: tuple[slice, ...], rt: int, cw: int
) -> list[tuple[int, int]]:
    """(band, strip) of every tile that holds part of ``region`` of an array of ``shape``.

    >>> touched((6, 8), (slice(2, 4), slice(5, 8)), 2, 4)
    [(1, 1)]
    >>> touched((3, 5, 8), (slice(1, 2), slice(0, 5), slice(0, 8)), 2, 8)
    [(2, 0), (3, 0), (4, 0)]
    """
    if any(s.stop <= s.start for s in region):
        return []
    if not shape:
        return [(0, 0)]
    last = region[-1]
    strips = range(last.start // cw, (last.stop - 1) // cw + 1)
    rows = np.zeros(1, np.int64)
    for j in range(len(shape) - 1):  # the flat row index of every selected outer index
        idx = np.arange(region[j].start, region[j].stop, dtype=np.int64)
        rows = (rows[:, None] + idx[None, :] * math.prod(shape[j + 1 : -1])).reshape(-1)
    return [(int(b), s) for b in np.unique(rows // rt) for s in strips]


def span(
    shape: tuple[int, ...], tiles: list[tuple[int, int]], rt: int, cw: int
) -> tuple[int, int, int, int] | None:
    """When ``tiles`` are one contiguous range of the file (whole rows of consecutive bands,
    or consecutive strips of a one-row band): that range as (first row, end row, first
    column, end column) of the 2-D view; else None.

    >>> span((40, 30), [(1, 0), (2, 0)], 4, 30)  # bands 1 and 2: rows 4 to 11
    (4, 12, 0, 30)
    >>> span((1000,), [(0, 0), (0, 1), (0, 2)], 1, 128)  # one row: strips 0 to 2
    (0, 1, 0, 384)
    >>> span((40, 30), [(1, 0), (2, 0)], 4, 10) is None  # strips of rows: strided
    True
    """
    if not tiles:
        return None
    rows, cols = view2d(shape)
    bands = sorted({b for b, _ in tiles})
    used = sorted({s for _, s in tiles})
    if bands[-1] - bands[0] + 1 != len(bands) or used[-1] - used[0] + 1 != len(used):
        return None
    if len(used) == -(-cols // cw):  # whole rows
        return bands[0] * rt, min(rows, (bands[-1] + 1) * rt), 0, cols
    if len(bands) == 1 and rt == 1:
        return bands[0], bands[0] + 1, used[0] * cw, min(cols, (used[-1] + 1) * cw)
    return None
