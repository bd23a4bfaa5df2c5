"""Rules of the layout ops with a kernel of their own (ops/layout.py): tril, triu, diagonal,
diag_embed (its inverse: a vector written onto a diagonal of zeros), take_along_axis and
its gradient. The ops that move rows between ranks (flip, roll, pad, diff) need no rule:
they fetch boxes point to point (ops/layout.py, Note [Boxes by index maps]).

Note [Triangles with global offsets]
    ``tril(x, k)`` keeps the items with ``col - row <= k``. A shard whose box starts at global
    row r0 and column c0 holds local item (i, j) at (r0 + i, c0 + j), so its part of the
    result is ``np.tril(local, k + r0 - c0)``: every placement stays as it is (each output
    item is its input item or zero, and zeros are the same on every rank, so every Partial
    passes), with no communication for any layout.

Note [Diagonals of split matrices]
    ``diagonal(x, k)`` of (..., n, m) picks ``x[..., j + max(-k, 0), j + max(k, 0)]`` for
    j < L. A split of the row axis stays a split of the result's last axis when the result
    has n items and item j is in row j (k >= 0, L == n): then every rank's rows are its
    output positions; likewise a split of the column axis (k <= 0, L == m). At most one of
    the two axes keeps its splits (a prefix of their nesting); on every other mesh dim that
    splits the rows or the columns each rank writes the diagonal items it holds into zeros
    and the result is Partial(sum) there: no communication, where gathering would move the
    matrix. ``diag_embed`` (np.diag of a vector, and diagonal's gradient) is the inverse: a
    split of the vector stays a split of the rows (or columns) where they line up, else the
    vector (L items, against the L x L result) is gathered on that mesh dim and every rank
    writes the rows it holds, so the result is still split by rows.

>>> from disttensor.placement import Shard, Replicate
>>> rule = diagonal_rule
>>> rule([TensorSpec((6, 6), [Shard(0)])], (2,), offset=0).outputs  # rows are positions
((Shard(dim=0),),)
>>> rule([TensorSpec((6, 6), [Shard(0)])], (2,), offset=1).outputs  # 5 items: picked
((Partial(reduce_type='sum'),),)
"""

from __future__ import annotations

from ..placement import Partial, Placement, Replicate, Shard
from .core import RuleResult, TensorSpec, register, solve
from .shape_rules import _moved, normalize_axis

_R = Replicate()


@register("tril", "triu")
def triangle_rule(specs, mesh_shape, k=0, **_):
    """Note [Triangles with global offsets]: every placement stays."""
    (spec,) = specs
    if spec.ndim < 2:
        raise ValueError("tril/triu: the input must be at least 2-D (1-D broadcasts first)")
    keep = {m: p.dim for m, p in enumerate(spec.placements) if isinstance(p, Shard)}
    return _moved(spec, mesh_shape, keep, [spec.shape])


def diagonal_length(n: int, m: int, k: int) -> int:
    """numpy's length of the k-th diagonal of an n x m matrix."""
    return max(0, min(n, m - k)) if k >= 0 else max(0, min(n + k, m))


def _aligned(spec: TensorSpec, mesh_shape, axis: int, length: int) -> list[int]:
    """The mesh dims (size > 1) that split ``axis``, when those splits are the splits of
    ``length`` items too (array_split boundaries agree only when the lengths do)."""
    if spec.shape[axis] != length:
        return []
    return [m for m, p in enumerate(spec.placements) if p == Shard(axis) and mesh_shape[m] > 1]


@register("diagonal")
def diagonal_rule(specs, mesh_shape, offset=0, **_):
    """Note [Diagonals of split matrices]: the diagonal of the last two axes."""
    (spec,) = specs
    nd = spec.ndim
    if nd < 2:
        raise ValueError("diag requires an array of at least two dimensions")
    n, m = spec.shape[-2:]
    length = diagonal_length(n, m, offset)
    rows, cols = nd - 2, nd - 1
    kept = _aligned(spec, mesh_shape, rows, length) if offset >= 0 else []
    if not kept and offset <= 0:
        kept = _aligned(spec, mesh_shape, cols, length)
    keep = {d: p.dim for d, p in enumerate(spec.placements) if p.is_shard() and p.dim < rows}
    keep.update(dict.fromkeys(kept, rows))
    select = {
        d: Partial("sum")
        for d, p in enumerate(spec.placements)
        if p.is_shard() and p.dim >= rows and d not in keep
    }
    return _moved(spec, mesh_shape, keep, [(*spec.shape[:-2], length)], select)


@register("diag_embed")
def diag_embed_rule(specs, mesh_shape, offset=0, shape=(0, 0), **_):
    """Note [Diagonals of split matrices]: v (..., L) onto the ``offset`` diagonal of zeros of
    (..., n, m) = (..., *shape)."""
    (spec,) = specs
    if spec.ndim < 1:
        raise ValueError("diag_embed: the input must be at least 1-D")
    n, m = shape
    last = spec.ndim - 1
    length = spec.shape[-1]
    if diagonal_length(n, m, offset) != length:
        raise ValueError(f"diag_embed: {length} items do not fill diagonal {offset} of {shape}")
    out_shape = (*spec.shape[:-1], n, m)
    rows, cols = last, last + 1
    if offset >= 0 and n == length:
        to = rows
    elif offset <= 0 and m == length:
        to = cols
    else:
        to = None
    ins: list[Placement] = []
    outs: list[Placement] = []
    for d, p in enumerate(spec.placements):
        if mesh_shape[d] == 1:
            p = _R
        if isinstance(p, Shard) and p.dim == last:
            ins.append(p if to is not None else _R)
            outs.append(Shard(to if to is not None else rows))
        else:
            ins.append(p)
            outs.append(p)
    return RuleResult((tuple(ins),), (tuple(outs),), (out_shape,))


def _along_letters(nd: int, axis: int, at: str) -> str:
    letters = "".join(chr(ord("a") + i) for i in range(nd))
    return letters[:axis] + at + letters[axis + 1 :]


@register("take_along_axis")
def take_along_axis_rule(specs, mesh_shape, axis=0, **_):
    """``arr`` needs ``axis`` whole (its mesh dims that split it are gathered, nothing else);
    ``indices`` keep their splits, ``axis`` included, and the result takes them; the other
    axes broadcast and keep agreed splits. It only moves items of ``arr``: a Partial ``arr``
    stays Partial (of any type) when ``indices`` are Replicate on that mesh dim."""
    arr, idx = specs
    if arr.ndim != idx.ndim:
        raise ValueError("`indices` and `arr` must have the same number of dimensions")
    axis = normalize_axis(axis, arr.ndim)
    kinds = sorted({p.reduce_type for p in arr.placements if isinstance(p, Partial)})
    patterns = [((Partial(t), _R), Partial(t)) for t in kinds]
    subs = [_along_letters(arr.ndim, axis, "Z"), _along_letters(arr.ndim, axis, "Y")]
    shape = tuple(
        idx.shape[d] if d == axis else max(arr.shape[d], idx.shape[d]) for d in range(arr.ndim)
    )
    ins, out = solve(
        [_fresh(subs[0], arr, shape, axis), _fresh(subs[1], idx, shape, axis)],
        subs[1],
        specs,
        mesh_shape,
        reduce=None,
        linearity="none",
        unshardable=frozenset("Z"),
        partial_patterns=patterns,
    )
    return RuleResult(ins, (out,), (shape,))


def _fresh(sub: str, spec: TensorSpec, shape, axis: int) -> str:
    """``sub`` with each broadcast size-1 axis renamed to a letter of its own (never split: it
    is in no output and nothing is reduced)."""
    return "".join(
        c.upper() if d != axis and spec.shape[d] == 1 and shape[d] > 1 else c
        for d, c in enumerate(sub)
    )


@register("take_along_axis_grad")
def take_along_axis_grad_rule(specs, mesh_shape, axis=0, length=0, **_):
    """``g`` added at ``indices`` along ``axis`` into zeros with ``length`` items on it (g and
    indices of one shape). ``axis`` is whole in the output; where g and indices are split
    along it, each rank adds its part and the output is Partial(sum). Linear in g."""
    g, idx = specs
    if g.shape != idx.shape:
        raise ValueError(f"take_along_axis_grad: g {g.shape} and indices {idx.shape} differ")
    axis = normalize_axis(axis, g.ndim)
    sub = _along_letters(g.ndim, axis, "Y")
    ins, out = solve(
        [sub, sub],
        _along_letters(g.ndim, axis, "Z"),
        specs,
        mesh_shape,
        reduce="sum",
        linearity="multilinear",
        linear_in=(0,),
    )
    shape = tuple(length if d == axis else n for d, n in enumerate(g.shape))
    return RuleResult(ins, (out,), (shape,))
