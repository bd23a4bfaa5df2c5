"""dt.visualize_sharding and dt.describe: the picture's cells, ticks and labels against the
independent shard boxes of tests/oracle.py, the labels read back into each block from the
ranks' shards, hand-written golden texts, no communication, and one real mpiexec run."""

from __future__ import annotations

import hashlib
import io
import itertools
import math
import re
import sys

import numpy as np
import oracle
import pytest
from mpirun import run

import disttensor as dt
from disttensor.visualize import sharding_layout

S0, S1, S2, R = dt.Shard(0), dt.Shard(1), dt.Shard(2), dt.Replicate()
PSUM, PAVG, PMAX, PMIN = (dt.Partial(t) for t in ("sum", "avg", "max", "min"))
MESHES = {
    (2,): dt.ProcessMesh([0, 1], ["mp"]),
    (4,): dt.ProcessMesh([0, 1, 2, 3], ["mp"]),
    (2, 2): dt.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"]),
    (2, 3): dt.ProcessMesh([[0, 1, 2], [3, 4, 5]], ["dp", "mp"]),
}
PLACEMENTS_1D = [[S0], [S1], [R], [PSUM], [PMAX]]
PLACEMENTS_2D = [[S0, S1], [S1, S0], [S0, S0], [R, S1], [PSUM, S0], [S1, PMAX], [PAVG, R]]
PLACEMENTS_2D += [[PMAX, PSUM], [R, R], [S1, S1]]


def shapes(n: int) -> list[tuple[int, ...]]:
    """Even, uneven and empty shards (fewer items than ranks), zero-size, 1-D and 0-d."""
    return [(2 * n, 2 * n), (2 * n + 1, n + 1), (n - 1, 2), (0, 3), (n + 1,), (n - 1,), ()]


def cases():
    for mesh in MESHES.values():
        for pl in PLACEMENTS_1D if mesh.ndim == 1 else PLACEMENTS_2D:
            for shape in shapes(mesh.size):
                if all(not p.is_shard() or p.dim < len(shape) for p in pl):
                    yield mesh, pl, shape


# -- reading a label back (Note [Cell labels] in disttensor/visualize.py) -------------------


def parse_label(label: str):
    """Alternatives, each a tree of ("rank", r), ("op", name, items), ("slices", items)."""
    tokens = re.findall(r"\d+-\d+|\d+|[a-z]+|[(),\[\] ]", label)
    assert "".join(tokens) == label, f"unreadable label {label!r}"
    pos = 0

    def items(sep: str, end: str | None) -> list:
        nonlocal pos
        out = []
        while True:
            tok = tokens[pos]
            pos += 1
            if tok.isalpha():
                assert tokens[pos] == "("
                pos += 1
                out.append(("op", tok, items(",", ")")))
            elif tok == "[":
                out.append(("slices", items(" ", "]")))
            else:
                a, _, b = tok.partition("-")
                out += [("rank", r) for r in range(int(a), int(b or a) + 1)]
            if pos == len(tokens) and end is None:
                return out
            tok = tokens[pos]
            pos += 1
            if tok == end:
                return out
            assert tok == sep, f"{label!r}: {tok!r} where {sep!r} was expected"

    return items(",", None)


def ranks_in(label: str) -> set[int]:
    return {int(r) for r in re.findall(r"\d+", re.sub(r"(\d+)-(\d+)", _expand, label))}


def _expand(m: re.Match) -> str:
    return ",".join(map(str, range(int(m[1]), int(m[2]) + 1)))


REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}


def evaluate(node, local: dict[int, np.ndarray], slice_axis: int | None) -> np.ndarray:
    if node[0] == "rank":
        return local[node[1]]
    if node[0] == "op":
        return REDUCE[node[1]](np.stack([evaluate(n, local, slice_axis) for n in node[2]]), 0)
    return np.concatenate([evaluate(n, local, slice_axis) for n in node[1]], axis=slice_axis)


# -- reading the text picture ----------------------------------------------------------------


def parse_picture(text: str, ticks: bool):
    """Column ticks, widths; per row its tick, height and cell labels (from the text alone)."""
    lines = text.split("\n")
    rules = [k for k, line in enumerate(lines) if line.lstrip().startswith("+-")]
    cuts = [k for k, ch in enumerate(lines[rules[0]]) if ch == "+"]
    spans = list(itertools.pairwise(cuts))
    col_ticks = [lines[rules[0] - 1][a + 1 : b].strip() for a, b in spans] if ticks else None
    rows = []
    for r0, r1 in itertools.pairwise(rules):
        block = lines[r0 + 1 : r1]
        mids = [line for line in block if any(line[a + 1 : b].strip() for a, b in spans)]
        assert len(mids) == 1, block  # every label is one line, all on the row's middle line
        tick = mids[0][: cuts[0]].strip()
        rows.append((tick, len(block), [mids[0][a + 1 : b].strip() for a, b in spans]))
    return col_ticks, [b - a - 1 for a, b in spans], rows


def box_of(mesh, pl, shape, rank) -> tuple[slice, ...]:
    return oracle.local_box(shape, mesh.shape, tuple(pl), oracle.coord_of(mesh.mesh, rank))


def same(sl: slice, piece: tuple[int, int]) -> bool:
    """The oracle's slice and a drawn piece agree (an empty one has no position in the
    oracle, only its length 0; the picture draws it where its split put it)."""
    return piece[1] - piece[0] == 0 if sl.start == sl.stop else piece == (sl.start, sl.stop)


def check_sizes(extents: list[int], sizes: list[int], mins: list[int]) -> None:
    """Cells follow their extents: a longer piece is never drawn smaller, unless the smaller
    one is as small as its label allows (the label sets it, not the extent)."""
    for a, b in itertools.permutations(range(len(extents)), 2):
        if extents[a] > extents[b]:
            assert sizes[a] >= sizes[b] or sizes[b] == mins[b], (extents, sizes, mins)


@pytest.mark.parametrize("mesh_shape", list(MESHES))
def test_picture_matches_the_oracle_boxes(mesh_shape):
    count = 0
    for mesh, pl, shape in cases():
        if mesh.shape != mesh_shape:
            continue
        spec = dt.DistSpec.make(mesh, pl, shape, "float64")
        lay = sharding_layout(spec)
        text = dt.visualize_sharding(spec, rank=-1)  # rank -1 never prints
        col_ticks, widths, rows = parse_picture(text, ticks=len(shape) > 0)
        assert [len(r[2]) for r in rows] == [len(lay.cols)] * len(lay.rows)
        axes = {1: (None, 0), 2: (0, 1)}.get(len(shape), (None, None))
        assert (lay.row_axis, lay.col_axis) == axes
        seen = []
        for rank in mesh.process_ids:
            box = box_of(mesh, pl, shape, rank)
            where = [
                (i, j)
                for i, row in enumerate(rows)
                for j, lab in enumerate(row[2])
                if rank in ranks_in(lab)
            ]
            assert len(where) == 1, (pl, shape, rank, text)
            i, j = where[0]
            cell = lay.cells[i][j]
            assert rank in cell.ranks and ranks_in(cell.label) == set(cell.ranks)
            assert rows[i][2][j] == cell.label + (" (empty)" if cell.empty else "")
            sizes = [
                math.prod(s.stop - s.start for s in box_of(mesh, pl, shape, r)) for r in cell.ranks
            ]
            assert cell.empty == (sum(sizes) == 0 and len(shape) > 0), (pl, shape, rank)
            for a, ticks, pieces, k in [
                (axes[1], col_ticks, lay.cols, j),
                (axes[0], [r[0] for r in rows], lay.rows, i),
            ]:
                if a is not None:
                    assert same(box[a], pieces[k]) and ticks[k] == "{}:{}".format(*pieces[k])
            seen.append(rank)
        assert sorted(seen) == sorted(r for line in lay.cells for c in line for r in c.ranks)
        if axes[1] is not None:
            labels = [[row[2][j] for row in rows] for j in range(len(widths))]
            mins = [max(len(col_ticks[j]), *map(len, labels[j])) + 2 for j in range(len(widths))]
            check_sizes([e - s for s, e in lay.cols], widths, mins)
        if axes[0] is not None:
            check_sizes([e - s for s, e in lay.rows], [r[1] for r in rows], [1] * len(rows))
        count += 1
    assert count > 30


def _on_every_rank(mesh, cases_here):
    """Per case: this rank's shard, the global value, the picture and describe's text, and
    the collectives visualize_sharding and describe started (none)."""
    rank = dt.get_rank()
    out = []
    for n, (pl, shape, axes) in enumerate(cases_here):
        spec = dt.DistSpec.make(mesh, pl, shape, "float64")
        local_shape = spec.local_shape(mesh.get_coord(rank))
        # distinct values on every rank but replicas (equal coordinates off the Replicate dims)
        coord = mesh.get_coord(rank) or (0,) * mesh.ndim
        seed = [n] + [c for c, p in zip(coord, pl) if not p.is_replicate()]
        rng = np.random.default_rng(seed)
        x = dt.dtensor_from_local(rng.normal(size=local_shape), mesh, pl, global_shape=shape)
        value = x.numpy() if rank in mesh else None
        with dt.CommCounter() as cc:
            text = dt.visualize_sharding(x, axes, file=io.StringIO(), use_color=False)
            info = dt.describe(x)
        out.append((x.to_local(), value, text, info, cc.total, cc.fallbacks))
    return out


@pytest.mark.parametrize("mesh_shape", list(MESHES))
def test_labels_rebuild_every_block_from_the_shards(mesh_shape):
    """Each alternative of a label, evaluated on the ranks' shards, is the block's value."""
    mesh = MESHES[mesh_shape]
    here = [(pl, shape, None) for m, pl, shape in cases() if m is mesh]
    if mesh.ndim == 2:  # the slices of an axis not drawn, with a Partial and a replica
        here += [([S1, PSUM], (3, 5, 2), (0, 2)), ([PMAX, S1], (2, 7, 3), (2, 0))]
        here += [([R, S0], (5, 2, 3), (1, 2)), ([S1, PMIN], (3, 1, 2), (0, 2))]  # empty slices
    results = dt.simulate(mesh.size, _on_every_rank, mesh, here)
    for n, (pl, shape, axes) in enumerate(here):
        spec = dt.DistSpec.make(mesh, pl, shape, "float64")
        lay = sharding_layout(spec, axes)
        local = {r: results[r][n][0] for r in mesh.process_ids}
        value = results[0][n][1]
        drawn = [a for a in (lay.row_axis, lay.col_axis) if a is not None]
        hidden = [a for a in range(len(shape)) if a not in drawn]
        for r in mesh.process_ids:
            assert results[r][n][2] == results[0][n][2]  # the same picture on every rank
            assert results[r][n][4] == 0 and not results[r][n][5], "no communication"
            want = spec.local_shape(mesh.get_coord(r))
            box = box_of(mesh, pl, shape, r)
            assert local[r].shape == want == tuple(s.stop - s.start for s in box)
        for i, j in itertools.product(range(len(lay.rows)), range(len(lay.cols))):
            index = [slice(None)] * len(shape)
            for a, (s, e) in ((lay.row_axis, lay.rows[i]), (lay.col_axis, lay.cols[j])):
                if a is not None:
                    index[a] = slice(s, e)
            block = value[tuple(index)]
            for alt in parse_label(lay.cells[i][j].label):
                got = evaluate(alt, local, hidden[0] if hidden else None)
                np.testing.assert_allclose(got, block, err_msg=f"{pl} {shape} {i, j}")


def test_ranks_outside_the_mesh_draw_and_describe_it():
    mesh = dt.ProcessMesh([1, 2], ["mp"])

    def f():
        x = dt.dtensor_from_local(np.ones(2), mesh, [S0], global_shape=(4,))
        buf = io.StringIO()
        with dt.CommCounter() as cc:
            text = dt.visualize_sharding(x, file=buf)
            info = dt.describe(x)
        return text, buf.getvalue(), info, cc.total

    out = dt.simulate(3, f)
    assert out[0][1] == out[0][0] + "\n" and all(o[1] == "" for o in out[1:])  # rank 0 prints
    assert {o[0] for o in out} == {out[0][0]} and {o[2] for o in out} == {out[0][2]}
    assert [o[3] for o in out] == [0, 0, 0]
    assert "|           1            |           2            |" in out[0][0]


def test_printed_by_the_chosen_rank_only():
    spec = dt.DistSpec.make(MESHES[2, 2], [S0, S1], (4, 4), "int8")

    def f(rank):
        buf = io.StringIO()
        dt.visualize_sharding(spec, rank=rank, file=buf)
        return buf.getvalue()

    for rank, printers in [(0, [0]), (3, [3]), (None, [0, 1, 2, 3])]:
        out = dt.simulate(4, f, rank)
        assert [r for r in range(4) if out[r]] == printers


# -- golden texts, written by hand from the boxes ---------------------------------------------

GOLDEN_2D = """\
float64 (7, 5) on mesh dp=2 x mp=2: [Shard(dim=0), Shard(dim=1)]
rows: axis 0, columns: axis 1
                  0:3                      3:5
    +-----------------------------+-------------------+
    |                             |                   |
    |                             |                   |
0:4 |              0              |         1         |
    |                             |                   |
    |                             |                   |
    +-----------------------------+-------------------+
    |                             |                   |
4:7 |              2              |         3         |
    |                             |                   |
    +-----------------------------+-------------------+"""

DESCRIBE_2D = """\
DistTensor float64 (7, 5), 280 bytes
mesh dp=2 x mp=2, ranks [0, 1, 2, 3]
placements [Shard(dim=0), Shard(dim=1)]
axis 0 (7): split over dp into 4, 3 (uneven)
axis 1 (5): split over mp into 3, 2 (uneven)
rank  coord   box         local shape  bytes
0     (0, 0)  [0:4, 0:3]  (4, 3)       96
1     (0, 1)  [0:4, 3:5]  (4, 2)       64
2     (1, 0)  [4:7, 0:3]  (3, 3)       72
3     (1, 1)  [4:7, 3:5]  (3, 2)       48"""

GOLDEN_1D = """\
int64 (7,) on mesh d0=3: [Shard(dim=0)]
columns: axis 0
          0:3               3:5            5:7
+---------------------+--------------+--------------+
|          0          |      1       |      2       |
+---------------------+--------------+--------------+"""

GOLDEN_PARTIAL = """\
float32 (5,) on mesh mp=2: [Partial(reduce_type='sum')]
columns: axis 0
                       0:5
+------------------------------------------------+
|                    sum(0,1)                    |
+------------------------------------------------+
sum(a,b): the block is the sum of the partial values that ranks a, b hold"""

DESCRIBE_PARTIAL = """\
DistTensor float32 (5,), 20 bytes
mesh mp=2, ranks [0, 1]
placements [Partial(reduce_type='sum')]
axis 0 (5): whole on every rank
rank  coord  box    local shape  bytes
0     (0,)   [0:5]  (5,)         20
1     (1,)   [0:5]  (5,)         20
Partial over mp (sum): each rank holds a partial value of its box; the box's value is
  rank 0: [0:5] = sum(0,1)
  rank 1: [0:5] = sum(0,1)"""

GOLDEN_NESTED = """\
int32 (7, 4) on mesh dp=2 x mp=2: [Shard(dim=0), Shard(dim=0)]
rows: axis 0, columns: axis 1
                           0:4
    +------------------------------------------------+
0:2 |                       0                        |
    |                                                |
    +------------------------------------------------+
2:4 |                       1                        |
    |                                                |
    +------------------------------------------------+
4:6 |                       2                        |
    |                                                |
    +------------------------------------------------+
6:7 |                       3                        |
    +------------------------------------------------+"""

DESCRIBE_NESTED = """\
DistTensor int32 (7, 4), 112 bytes
mesh dp=2 x mp=2, ranks [0, 1, 2, 3]
placements [Shard(dim=0), Shard(dim=0)]
axis 0 (7): split over dp then mp into 2, 2, 2, 1 (uneven)
axis 1 (4): whole on every rank
rank  coord   box         local shape  bytes
0     (0, 0)  [0:2, 0:4]  (2, 4)       32
1     (0, 1)  [2:4, 0:4]  (2, 4)       32
2     (1, 0)  [4:6, 0:4]  (2, 4)       32
3     (1, 1)  [6:7, 0:4]  (1, 4)       16"""

GOLDEN_EMPTY = """\
float64 (2,) on mesh mp=4: [Shard(dim=0)]
columns: axis 0
           0:1                      1:2                2:2         2:2
+------------------------+------------------------+-----------+-----------+
|           0            |           1            | 2 (empty) | 3 (empty) |
+------------------------+------------------------+-----------+-----------+
(empty): the ranks hold no elements of the tensor there"""

GOLDENS = {
    "2d": (MESHES[2, 2], [S0, S1], (7, 5), "float64", GOLDEN_2D, DESCRIBE_2D),
    "1d-uneven": (dt.ProcessMesh([0, 1, 2]), [S0], (7,), "int64", GOLDEN_1D, None),
    "partial": (MESHES[2,], [PSUM], (5,), "float32", GOLDEN_PARTIAL, DESCRIBE_PARTIAL),
    "nested": (MESHES[2, 2], [S0, S0], (7, 4), "int32", GOLDEN_NESTED, DESCRIBE_NESTED),
    "empty": (MESHES[4,], [S0], (2,), "float64", GOLDEN_EMPTY, None),
}


@pytest.mark.parametrize("name", list(GOLDENS))
def test_golden_texts(name):
    mesh, pl, shape, dtype, picture, described = GOLDENS[name]

    def f():
        x = dt.shard_tensor(np.zeros(shape, dtype), mesh, pl)
        buf = io.StringIO()
        return dt.visualize_sharding(x, file=buf, use_color=False), buf.getvalue(), dt.describe(x)

    text, printed, info = dt.simulate(mesh.size, f)[0]
    assert text == picture
    assert printed == picture + "\n"
    if described is not None:
        assert info == described


def test_describe_lists_every_rank():
    for mesh, pl, shape in cases():
        spec = dt.DistSpec.make(mesh, pl, shape, "float32")
        lines = dt.describe(spec).split("\n")
        assert lines[0] == f"DistTensor float32 {shape}, {4 * math.prod(shape)} bytes"
        head = lines.index(next(line for line in lines if line.startswith("rank  coord")))
        table = lines[head + 1 : head + 1 + mesh.size]
        for line, rank in zip(table, mesh.process_ids):
            coord = oracle.coord_of(mesh.mesh, rank)
            box = box_of(mesh, pl, shape, rank)
            size = math.prod(s.stop - s.start for s in box)
            cols = re.split(r"\s{2,}", line)
            pieces = [tuple(map(int, p.split(":"))) for p in re.findall(r"\d+:\d+", cols[2])]
            assert len(pieces) == len(shape) and all(map(same, box, pieces)), (pl, shape, line)
            want = [str(rank), str(coord), str(tuple(s.stop - s.start for s in box)), str(4 * size)]
            assert cols[:2] + cols[3:5] == want, (pl, shape, line)
            assert (cols[5:] == ["empty"]) == (size == 0 and len(shape) > 0), line
        partial = [m for m, p in enumerate(pl) if p.is_partial()]
        lines_p = [line for line in lines if line.startswith("  rank ")]
        assert len(lines_p) == (mesh.size if partial else 0)
        for line, rank in zip(lines_p, mesh.process_ids):
            coord = oracle.coord_of(mesh.mesh, rank)
            group = {
                int(mesh.mesh[c])
                for c in np.ndindex(*mesh.shape)
                if all(c[m] == coord[m] for m in range(mesh.ndim) if m not in partial)
            }
            assert ranks_in(line.split(" = ")[1]) == group, line
            assert all(pl[m].reduce_type + "(" in line for m in partial), line


def test_axes_of_higher_rank_tensors():
    mesh = dt.ProcessMesh(np.arange(8).reshape(2, 2, 2), ["a", "b", "c"])
    spec = dt.DistSpec.make(mesh, [S0, PSUM, S2], (4, 6, 8), "float64")
    lay = sharding_layout(spec)
    assert (lay.row_axis, lay.col_axis) == (0, 2)  # the split axes
    assert "axis 1 (6), not drawn: whole in every cell" in lay.header
    lay = sharding_layout(spec, axes=(-1, 0))  # negative axes count from the end
    assert (lay.row_axis, lay.col_axis) == (2, 0)
    lay = sharding_layout(spec, axes=(2, 1))  # transposed: rows from axis 2
    assert (lay.row_axis, lay.col_axis, lay.rows) == (2, 1, ((0, 4), (4, 8)))
    assert "axis 0 (4), not drawn: split over a: 0:2 2:4" in lay.header
    assert lay.cells[0][0].label == "[sum(0,2) sum(4,6)]"
    # a cell is flagged empty only when all its ranks are: here one slice of axis 1 is
    some = dt.DistSpec.make(MESHES[2, 2], [S1, PSUM], (3, 1, 2), "float64")
    assert [c.empty for c in sharding_layout(some, axes=(0, 2)).cells[0]] == [False]
    unsplit = dt.DistSpec.make(mesh, [R, PSUM, R], (4, 6, 8), "float64")
    assert (sharding_layout(unsplit).row_axis, sharding_layout(unsplit).col_axis) == (1, 2)
    one = dt.DistSpec.make(mesh, [R, S0, R], (4, 6, 8), "float64")
    assert (sharding_layout(one).row_axis, sharding_layout(one).col_axis) == (0, 2)
    for bad in [(0, 0), (0, 3), (0, 1, 2), ()]:
        with pytest.raises(ValueError, match="axes must be"):
            sharding_layout(spec, axes=bad)
    with pytest.raises(TypeError, match="DistTensor or a DistSpec"):
        dt.visualize_sharding(np.zeros(3))


def test_zero_d_is_one_cell_and_runs_of_ranks_are_compressed():
    spec = dt.DistSpec.make(MESHES[2, 3], [R, R], (), "float64")
    text = dt.visualize_sharding(spec, rank=-1)
    assert text.split("\n")[1:] == ["+-----+", "| 0-5 |", "+-----+", _REPLICAS]
    spec = dt.DistSpec.make(MESHES[2, 3], [PMIN, R], (3,), "float64")
    assert [c.label for c in sharding_layout(spec).cells[0]] == ["min(0,3),min(1,4),min(2,5)"]
    spec = dt.DistSpec.make(dt.ProcessMesh([0, 1, 3, 4, 5, 7]), [R], (2,), "float64")
    assert sharding_layout(spec).cells[0][0].label == "0,1,3-5,7"


_REPLICAS = "a,b: replicas, each holds the whole block"


def test_colour_and_png_need_their_packages(monkeypatch, tmp_path):
    spec = dt.DistSpec.make(MESHES[2,], [S0], (4,), "float64")
    monkeypatch.setitem(sys.modules, "rich", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"needs rich: pip install 'disttensor\[viz\]'"):
        dt.simulate(1, dt.visualize_sharding, spec, use_color=True)
    with pytest.raises(ImportError, match=r"needs matplotlib: pip install 'disttensor\[viz\]'"):
        dt.simulate(1, dt.visualize_sharding, spec, file=io.StringIO(), png=str(tmp_path / "a"))
    buf = io.StringIO()  # use_color=None: plain text without rich
    assert dt.simulate(1, dt.visualize_sharding, spec, file=buf)[0] + "\n" == buf.getvalue()


def test_colour_with_rich():
    pytest.importorskip("rich")
    spec = dt.DistSpec.make(MESHES[2, 2], [PSUM, S0], (5, 3), "float64")
    buf = io.StringIO()
    text = dt.simulate(1, dt.visualize_sharding, spec, file=buf, use_color=True)[0]
    assert "\x1b[" in buf.getvalue()
    assert re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue()) == text + "\n"
    buf = io.StringIO()  # use_color=None: rich decides, and a StringIO is no terminal
    assert dt.simulate(1, dt.visualize_sharding, spec, file=buf)[0] + "\n" == buf.getvalue()


def test_png(tmp_path):
    pytest.importorskip("matplotlib")
    spec = dt.DistSpec.make(MESHES[2, 3], [S0, S1], (5, 7), "float64")
    path = tmp_path / "x.png"
    dt.simulate(1, dt.visualize_sharding, spec, file=io.StringIO(), png=str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


SCRIPT = """
import hashlib, sys, numpy as np, disttensor as dt
mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
x = dt.shard_tensor(np.zeros((7, 5)), mesh, [dt.Shard(0), dt.Shard(1)])
text = dt.visualize_sharding(x, use_color=False)
dt.barrier()
digest = hashlib.sha256(text.encode()).hexdigest()
sys.stdout.write(f"rank {dt.get_rank()} returned {digest}\\n")  # one write: lines stay whole
"""


@pytest.mark.mpi
def test_under_mpiexec_printed_once_by_rank_0():
    code, out = run(4, ["-c", SCRIPT], timeout=120)
    assert code == 0, out
    assert out.count(GOLDEN_2D) == 1, out
    assert out.count("rows: axis 0, columns: axis 1") == 1, out
    digest = hashlib.sha256(GOLDEN_2D.encode()).hexdigest()
    for r in range(4):
        assert f"rank {r} returned {digest}" in out, out
