"""Pictures and tables of how a tensor is laid out: ``dt.visualize_sharding`` and ``dt.describe``.

Metadata only: everything comes from the spec (mesh, placements, global shape, dtype), which
every rank knows, so neither function communicates and any rank, in the mesh or not, can draw
any tensor. A DistSpec works wherever a DistTensor does:

>>> import disttensor as dt
>>> mesh = dt.ProcessMesh([[0, 1], [2, 3]], dim_names=["dp", "mp"])
>>> spec = dt.DistSpec.make(mesh, [dt.Shard(0), dt.Partial()], (5, 4), "float32")
>>> _ = dt.visualize_sharding(spec, width=24, height=5)
float32 (5, 4) on mesh dp=2 x mp=2: [Shard(dim=0), Partial(reduce_type='sum')]
rows: axis 0, columns: axis 1
               0:4
    +------------------------+
    |                        |
0:3 |        sum(0,1)        |
    |                        |
    +------------------------+
3:5 |        sum(2,3)        |
    |                        |
    +------------------------+
sum(a,b): the block is the sum of the partial values that ranks a, b hold

Note [Cell labels]
    A cell of the picture is one block of the drawn axes. The ranks that hold it differ only
    along the mesh dims that do not split a drawn axis, and its label says how the block is
    made from them, in three layers, outermost first:

    * ``a,b``: replicas (Replicate mesh dims): each of a and b gives the whole block;
    * ``[a b]``: slices (mesh dims that split an axis not drawn): a and b hold the block's
      slices along the axes not drawn, in mesh order;
    * ``sum(a,b)``: partial values (Partial mesh dims, also avg/max/min): the block is the
      reduction of a's and b's values; several Partial dims nest, ``max(sum(0,1),sum(2,3))``,
      the last mesh dim innermost (Note [Partial order] in spec.py).

    The order is canonical, not the mesh's: a Replicate dim does not change a rank's values, so
    any replica serves, and slicing commutes with the elementwise reductions. Three or more
    consecutive ranks are written ``a-b``. ``describe`` writes its Partial lines the same way,
    so a label can be read back into the block (tests/test_visualize.py does that).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from . import comm
from .spec import DistSpec

__all__ = ["Cell", "ShardingLayout", "describe", "sharding_layout", "visualize_sharding"]

_REDUCE_WORDS = {"sum": "sum", "avg": "mean", "max": "elementwise max", "min": "elementwise min"}
_EMPTY = " (empty)"


@dataclass(frozen=True)
class Cell:
    """One block of the picture: the mesh ranks whose shard it is, and its label."""

    ranks: tuple[int, ...]
    label: str  # Note [Cell labels]
    empty: bool  # every rank of the cell holds no elements


@dataclass(frozen=True)
class ShardingLayout:
    """What the picture shows, as data; the text and PNG renderers draw only from this.

    ``rows`` and ``cols`` are the (start, stop) pieces of the drawn axes in order (one piece
    (0, 1) where there is no such axis: a 1-D tensor has no row axis, a 0-d one neither);
    ``cells[i][j]`` is the block rows[i] x cols[j].
    """

    spec: DistSpec
    row_axis: int | None
    col_axis: int | None
    rows: tuple[tuple[int, int], ...]
    cols: tuple[tuple[int, int], ...]
    cells: tuple[tuple[Cell, ...], ...]
    header: tuple[str, ...]
    legend: tuple[str, ...]


def _spec_of(x: Any) -> DistSpec:
    if isinstance(x, DistSpec):
        return x
    spec = getattr(x, "_spec", None)
    if not isinstance(spec, DistSpec):
        raise TypeError(f"expected a DistTensor or a DistSpec, got {type(x).__name__}")
    return spec


def _split_dims(spec: DistSpec, axis: int) -> list[int]:
    """The mesh dims that shard ``axis``, in mesh order (Note [Nested sharding])."""
    return [m for m, p in enumerate(spec.placements) if p.is_shard(axis)]


def _default_axes(spec: DistSpec) -> tuple[int, ...]:
    """Up to two split axes, then the last axes; in axis order."""
    size = spec.mesh.shape
    split = [a for a in range(spec.ndim) if any(size[m] > 1 for m in _split_dims(spec, a))]
    split = split[:2]
    rest = [a for a in reversed(range(spec.ndim)) if a not in split]
    return tuple(sorted(split + rest[: min(2, spec.ndim) - len(split)]))


def _normalize_axes(spec: DistSpec, axes: Any) -> tuple[int, ...]:
    if axes is None:
        return _default_axes(spec)
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    ok = len(axes) <= 2 and all(isinstance(a, int) and -spec.ndim <= a < spec.ndim for a in axes)
    out = tuple(a % spec.ndim for a in axes) if ok else ()
    if not ok or len(set(out)) != len(out) or (spec.ndim and not out):
        raise ValueError(
            f"axes must be one or two distinct axes of a {spec.ndim}-d tensor, got {axes!r}"
        )
    return out


def _pieces(spec: DistSpec, axis: int | None) -> list[tuple[dict[int, int], tuple[int, int]]]:
    """Each piece of ``axis`` in order: the coordinates that pick it and its (start, stop)."""
    if axis is None:
        return [({}, (0, 1))]
    dims = _split_dims(spec, axis)
    out = []
    # lexicographic order of the splitting coordinates is the order along the axis, since the
    # splits nest in mesh-dim order (Note [Nested sharding])
    for key in itertools.product(*(range(spec.mesh.shape[m]) for m in dims)):
        coord = [0] * spec.mesh.ndim
        for m, c in zip(dims, key):
            coord[m] = c
        start, n = spec.local_box(tuple(coord))[axis]
        out.append((dict(zip(dims, key)), (start, start + n)))
    return out


def _join(parts: list[str], sep: str) -> str:
    """``parts`` joined by ``sep``, runs of three or more consecutive ranks as ``a-b``."""
    if len(parts) < 3 or not all(p.isdigit() for p in parts):
        return sep.join(parts)
    out, run = [], [int(parts[0])]
    for r in [int(p) for p in parts[1:]] + [None]:
        if r is not None and r == run[-1] + 1:
            run.append(r)
            continue
        out += [f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(v) for v in run]
        run = [r]
    return sep.join(out)


def _over(spec: DistSpec, coord: list[int], dims: list[int]):
    """Each coordinate that agrees with ``coord`` off ``dims``, in mesh order."""
    for key in itertools.product(*(range(spec.mesh.shape[m]) for m in dims)):
        c = list(coord)
        for m, k in zip(dims, key):
            c[m] = k
        yield c


def _partial_expr(spec: DistSpec, coord: list[int], dims: list[int]) -> str:
    """The reduction over the Partial mesh dims ``dims`` that gives the value at ``coord``."""
    if not dims:
        return str(int(spec.mesh.mesh[tuple(coord)]))
    parts = [_partial_expr(spec, c, dims[1:]) for c in _over(spec, coord, dims[:1])]
    return f"{spec.placements[dims[0]].reduce_type}({_join(parts, ',')})"


def _label(spec: DistSpec, coord: list[int], drawn: set[int]) -> tuple[str, list[int]]:
    """The label of the cell at ``coord`` (Note [Cell labels]) and its ranks in mesh order."""
    kinds: dict[str, list[int]] = {"replica": [], "slice": [], "partial": []}
    for m, p in enumerate(spec.placements):
        if p.is_partial():
            kinds["partial"].append(m)
        elif p.is_replicate() or (p.is_shard() and p.dim not in drawn):
            kinds["replica" if p.is_replicate() else "slice"].append(m)
    alternatives = []
    for c in _over(spec, coord, kinds["replica"]):
        slices = [_partial_expr(spec, s, kinds["partial"]) for s in _over(spec, c, kinds["slice"])]
        alternatives.append(slices[0] if len(slices) == 1 else f"[{_join(slices, ' ')}]")
    free = kinds["replica"] + kinds["slice"] + kinds["partial"]
    ranks = sorted(_over(spec, coord, free))  # coordinates in mesh order
    return _join(alternatives, ","), [int(spec.mesh.mesh[tuple(c)]) for c in ranks]


def _box_text(box: Sequence[tuple[int, int]]) -> str:
    return "[" + ", ".join(f"{s}:{s + n}" for s, n in box) + "]"


def _mesh_text(spec: DistSpec) -> str:
    return " x ".join(f"{n}={k}" for n, k in zip(spec.mesh.dim_names, spec.mesh.shape))


def sharding_layout(x: Any, axes: Any = None) -> ShardingLayout:
    """The picture of ``x``'s layout over ``axes`` as data (cells, pieces, labels); no
    communication.

    >>> import disttensor as dt
    >>> spec = dt.DistSpec.make(dt.ProcessMesh([0, 1, 2]), [dt.Shard(0)], (7,), "int64")
    >>> lay = sharding_layout(spec)
    >>> lay.cols, [c.label for c in lay.cells[0]]
    (((0, 3), (3, 5), (5, 7)), ['0', '1', '2'])
    """
    spec = _spec_of(x)
    picked = _normalize_axes(spec, axes)
    row_axis, col_axis = (None, *picked)[-2:] if picked else (None, None)
    rows, cols = _pieces(spec, row_axis), _pieces(spec, col_axis)
    drawn = set(picked)
    cells = []
    for rkey, _ in rows:
        line = []
        for ckey, _ in cols:
            coord = [0] * spec.mesh.ndim
            for m, c in {**rkey, **ckey}.items():
                coord[m] = c
            label, ranks = _label(spec, coord, drawn)
            empty = all(0 in spec.local_shape(spec.mesh.get_coord(r)) for r in ranks)
            line.append(Cell(tuple(ranks), label, empty))
        cells.append(tuple(line))

    p = spec.placements
    header = [f"{spec.dtype} {spec.shape} on mesh {_mesh_text(spec)}: {list(p)}"]
    if row_axis is not None:
        header.append(f"rows: axis {row_axis}, columns: axis {col_axis}")
    elif col_axis is not None:
        header.append(f"columns: axis {col_axis}")
    names = spec.mesh.dim_names
    for a in range(spec.ndim):
        if a not in drawn:
            dims = [m for m in _split_dims(spec, a) if spec.mesh.shape[m] > 1]
            where = "whole in every cell"
            if dims:
                pieces = " ".join(f"{s}:{e}" for _, (s, e) in _pieces(spec, a))
                where = f"split over {' then '.join(names[m] for m in dims)}: {pieces}"
            header.append(f"axis {a} ({spec.shape[a]}), not drawn: {where}")

    size = spec.mesh.shape
    legend = []
    if any(q.is_replicate() and size[m] > 1 for m, q in enumerate(p)):
        legend.append("a,b: replicas, each holds the whole block")
    if any(q.is_shard() and q.dim not in drawn and size[m] > 1 for m, q in enumerate(p)):
        legend.append("[a b]: a, b hold the block's slices along the axes not drawn, in order")
    for t in dict.fromkeys(q.reduce_type for q in p if q.is_partial()):
        word = _REDUCE_WORDS[t]
        legend.append(
            f"{t}(a,b): the block is the {word} of the partial values that ranks a, b hold"
        )
    if any(c.empty for line in cells for c in line):
        legend.append("(empty): the ranks hold no elements of the tensor there")
    return ShardingLayout(
        spec,
        row_axis,
        col_axis,
        tuple(r for _, r in rows),
        tuple(c for _, c in cols),
        tuple(cells),
        tuple(header),
        tuple(legend),
    )


def _sizes(pieces, budget: int, mins: list[int]) -> list[int]:
    """Sizes proportional to the pieces' extents (``budget`` in all), each at least its min."""
    total = sum(e - s for s, e in pieces)
    return [
        max(low, math.floor(budget * (e - s) / total + 0.5) if total else 0)
        for (s, e), low in zip(pieces, mins)
    ]


def _text(cell: Cell) -> str:
    return cell.label + (_EMPTY if cell.empty else "")


def _center(s: str, w: int) -> str:
    """``s`` centred in ``w`` columns, the odd space on the right (str.center varies)."""
    left = (w - len(s)) // 2
    return " " * left + s + " " * (w - len(s) - left)


def _grid(lay: ShardingLayout, width: int, height: int) -> list[list[tuple[str, Any]]]:
    """The picture as lines of (text, cell) segments (cell None for borders and ticks)."""
    ticks = [f"{s}:{e}" for s, e in lay.cols] if lay.col_axis is not None else [""] * len(lay.cols)
    mins = [
        max(len(ticks[j]), *(len(_text(line[j])) for line in lay.cells)) + 2
        for j in range(len(lay.cols))
    ]
    widths = _sizes(lay.cols, width, mins) if lay.col_axis is not None else mins
    if lay.row_axis is None:
        row_ticks, heights = [""], [1]
    else:
        row_ticks = [f"{s}:{e}" for s, e in lay.rows]
        heights = _sizes(lay.rows, height, [1] * len(lay.rows))
    margin = max(map(len, row_ticks))
    pad = " " * (margin + 1) if margin else ""
    rule = [(pad + "+" + "+".join("-" * w for w in widths) + "+", None)]
    out = []
    if lay.col_axis is not None:
        top = pad + "".join(" " + _center(t, w) for t, w in zip(ticks, widths))
        out.append([(top.rstrip(), None)])
    out.append(rule)
    for i, line in enumerate(lay.cells):
        for t in range(heights[i]):
            mid = t == (heights[i] - 1) // 2
            left = (row_ticks[i].rjust(margin) + " ") if margin and mid else pad
            segs: list[tuple[str, Any]] = [(left + "|", None)]
            for j, cell in enumerate(line):
                segs += [(_center(_text(cell) if mid else "", widths[j]), (i, j)), ("|", None)]
            out.append(segs)
        out.append(rule)
    return out


# backgrounds that keep black text readable, one per cell in turn; standard colours, so
# that 16-colour terminals show them as distinct as true-colour ones
_PALETTE = (
    "bright_cyan",
    "bright_green",
    "bright_yellow",
    "bright_magenta",
    "cyan",
    "green",
    "yellow",
    "magenta",
)


def _print_rich(lines, lay: ShardingLayout, file: TextIO | None, force: bool) -> None:
    from rich.console import Console
    from rich.text import Text

    # soft_wrap: a picture wider than the terminal must not be folded into nonsense
    console = Console(file=file, highlight=False, soft_wrap=True, force_terminal=force or None)
    ncols = len(lay.cols)
    for segs in lines:
        text = Text()
        for s, cell in segs:
            style = None
            if cell is not None:
                i, j = cell
                bg = "grey85" if lay.cells[i][j].empty else _PALETTE[(i * ncols + j) % 8]
                style = f"black on {bg}"
            text.append(s, style=style)
        console.print(text)


def _draw_png(lay: ShardingLayout, path: str) -> None:
    """The same picture drawn with matplotlib (no pyplot: no global figure state)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError:
        raise ImportError(
            "visualize_sharding(png=...) needs matplotlib: pip install 'disttensor[viz]' "
            "(or pip install matplotlib)"
        ) from None

    def spans(pieces, present: bool) -> list[tuple[float, float]]:
        # exact extents; an empty piece gets a sliver so it stays visible
        total = sum(e - s for s, e in pieces)
        sizes = [(e - s) / total if present and total else 1 / len(pieces) for s, e in pieces]
        sizes = [z if z > 0 else 0.12 for z in sizes]
        starts = itertools.accumulate([0.0, *sizes[:-1]])
        return list(zip(starts, sizes))

    xs = spans(lay.cols, lay.col_axis is not None)
    ys = spans(lay.rows, lay.row_axis is not None)
    width, height = xs[-1][0] + xs[-1][1], ys[-1][0] + ys[-1][1]
    fig = Figure(figsize=(8, 2 + (4 if lay.row_axis is not None else 1)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, (y, h) in enumerate(ys):
        for j, (x, w) in enumerate(xs):
            cell = lay.cells[i][j]
            face = "0.85" if cell.empty else f"C{(i * len(xs) + j) % 10}"
            hatch = "//" if cell.empty else None
            ax.add_patch(Rectangle((x, y), w, h, fc=face, ec="black", alpha=0.6, hatch=hatch))
            label = cell.label + ("\n(empty)" if cell.empty else "")
            turn = 90 if w < 0.15 * width and len(cell.label) > 2 else 0
            ax.text(
                x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=9, rotation=turn
            )
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)  # row 0 on top, as in the text picture
    if lay.col_axis is not None:
        ax.set_xticks([x + w / 2 for x, w in xs], [f"{s}:{e}" for s, e in lay.cols])
    else:
        ax.set_xticks([])
    if lay.row_axis is not None:
        ax.set_yticks([y + h / 2 for y, h in ys], [f"{s}:{e}" for s, e in lay.rows])
    else:
        ax.set_yticks([])
    ax.xaxis.tick_top()
    ax.set_title("\n".join(lay.header), fontsize=9, pad=18)  # clear of the top ticks
    if lay.legend:
        ax.set_xlabel("\n".join(lay.legend), fontsize=8)
    fig.savefig(path, dpi=100, bbox_inches="tight")


def visualize_sharding(
    x: Any,
    axes: Any = None,
    *,
    rank: int | None = 0,
    use_color: bool | None = None,
    file: TextIO | None = None,
    png: str | None = None,
    width: int = 48,
    height: int = 8,
) -> str:
    """Draw which ranks hold which block of ``x`` (a DistTensor or DistSpec); no communication.

    A grid over two axes of ``x`` (``axes=(row_axis, col_axis)``; default the split axes,
    else the last two; other axes are summarized above it), cells proportional to the shards'
    extents (``width`` columns and ``height`` lines in all, each cell at least as large as its
    label), each labelled with the ranks that hold it (Note [Cell labels]). Printed by
    ``rank`` only (every rank: ``rank=None``) to ``file`` (default stdout), in colour with
    ``rich`` where it is installed and ``use_color`` is not False; returned as plain text on
    every rank. ``png="file.png"`` draws it with matplotlib too (written by ``rank``, rank 0 for
    ``rank=None``).

    >>> import disttensor as dt
    >>> spec = dt.DistSpec.make(dt.ProcessMesh([0, 1, 2]), [dt.Shard(0)], (7,), "int64")
    >>> _ = dt.visualize_sharding(spec, width=30)
    int64 (7,) on mesh d0=3: [Shard(dim=0)]
    columns: axis 0
          0:3         3:5       5:7
    +-------------+---------+---------+
    |      0      |    1    |    2    |
    +-------------+---------+---------+
    """
    lay = sharding_layout(x, axes)
    lines = _grid(lay, width, height)
    plain = [*lay.header, *("".join(s for s, _ in segs).rstrip() for segs in lines), *lay.legend]
    text = "\n".join(plain)
    if use_color and not _has_rich():
        raise ImportError(
            "visualize_sharding(use_color=True) needs rich: pip install 'disttensor[viz]' "
            "(or pip install rich)"
        )
    me = comm.get_rank()  # no communication: only who prints depends on the rank
    if rank is None or me == rank:
        if use_color is not False and _has_rich():
            out = file if file is not None else sys.stdout
            heads = [[(h, None)] for h in lay.header]
            tails = [[(t, None)] for t in lay.legend]
            _print_rich([*heads, *lines, *tails], lay, out, bool(use_color))
        else:
            print(text, file=file if file is not None else sys.stdout)
    if png is not None and me == (0 if rank is None else rank):
        _draw_png(lay, png)
    return text


def _has_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def describe(x: Any) -> str:
    """Every mesh rank's coordinate, global box, local shape and bytes, and the layout of ``x``
    (a DistTensor or DistSpec), as text; metadata only, no communication.

    >>> import disttensor as dt
    >>> mesh = dt.ProcessMesh([0, 1], dim_names=["mp"])
    >>> print(dt.describe(dt.DistSpec.make(mesh, [dt.Partial("max")], (3,), "float32")))
    DistTensor float32 (3,), 12 bytes
    mesh mp=2, ranks [0, 1]
    placements [Partial(reduce_type='max')]
    axis 0 (3): whole on every rank
    rank  coord  box    local shape  bytes
    0     (0,)   [0:3]  (3,)         12
    1     (1,)   [0:3]  (3,)         12
    Partial over mp (max): each rank holds a partial value of its box; the box's value is
      rank 0: [0:3] = max(0,1)
      rank 1: [0:3] = max(0,1)
    """
    spec = _spec_of(x)
    mesh, item = spec.mesh, spec.dtype.itemsize
    lines = [
        f"DistTensor {spec.dtype} {spec.shape}, {math.prod(spec.shape) * item} bytes",
        f"mesh {_mesh_text(spec)}, ranks {mesh.process_ids}",
        f"placements {list(spec.placements)}",
    ]
    for a in range(spec.ndim):
        dims = _split_dims(spec, a)
        if not dims:
            lines.append(f"axis {a} ({spec.shape[a]}): whole on every rank")
            continue
        sizes = [e - s for _, (s, e) in _pieces(spec, a)]
        flag = " (uneven, empty shards)" if 0 in sizes else " (uneven)"
        over = " then ".join(mesh.dim_names[m] for m in dims)
        lines.append(
            f"axis {a} ({spec.shape[a]}): split over {over} into "
            f"{', '.join(map(str, sizes))}{flag if len(set(sizes)) > 1 else ''}"
        )
    head = ["rank", "coord", "box", "local shape", "bytes", "note"]
    rows = []
    for r in mesh.process_ids:
        coord = mesh.get_coord(r)
        shape = spec.local_shape(coord)
        note = "empty" if 0 in shape else ""
        size = str(math.prod(shape) * item)
        rows.append([str(r), str(coord), _box_text(spec.local_box(coord)), str(shape), size, note])
    if not any(row[-1] for row in rows):
        head, rows = head[:-1], [row[:-1] for row in rows]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    partial = [m for m, p in enumerate(spec.placements) if p.is_partial()]
    if partial:
        over = ", ".join(f"{mesh.dim_names[m]} ({spec.placements[m].reduce_type})" for m in partial)
        lines.append(
            f"Partial over {over}: each rank holds a partial value of its box; the box's value is"
        )
        for r in mesh.process_ids:
            coord = mesh.get_coord(r)
            expr = _partial_expr(spec, list(coord), partial)
            lines.append(f"  rank {r}: {_box_text(spec.local_box(coord))} = {expr}")
    return "\n".join(lines)
