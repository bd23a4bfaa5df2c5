"""SPMD rules of the nn ops: softmax, log_softmax, logsumexp, layer_norm, cross_entropy,
embedding, take_labels (the label pick of a vocabulary-parallel cross entropy), the fused
gradients (softmax_grad, log_softmax_grad, logsumexp_grad) and the attention score path
(attention_softmax). All are einsum-core rules (core.py): one letter per tensor axis.

Note [Row-wise rules]
    softmax, log_softmax, logsumexp, layer_norm and cross_entropy normalize over some axes
    (the softmax axes, the normalized axes, the class axis). A single local kernel needs those
    axes whole, so they are unshardable letters (Replicate); the other axes keep their
    sharding, and Partial inputs are resharded (none of these ops is linear). But each runs
    its fused op only when nothing splits those axes (Note [Fused or composite] in ops/nn.py;
    softmax, log_softmax and logsumexp in ops/reduction.py): where a mesh dim splits them, the
    composite of dt reductions keeps the split and all-reduces per-row statistics. The rules
    describe what dispatch does, so ``infer_forward`` tells the truth: on such a mesh dim the
    split stays (logsumexp's output, which has no such axis, is Replicate there; cross
    entropy's loss is Partial(sum), its labels Replicate); the other mesh dims decide as the
    fused kernel's rule would (``_keep_split``). The fused gradients run only where their
    forward op did, so their rules are the plain row-wise ones; they reshard a Partial
    gradient too (softmax_grad is linear in it, but keeping it Partial would only leave the
    gradient of the scores Partial for the matmuls before them to gather).

Lookups are linear in the table they read from: embedding (``weight[ids]``) with the weight's
rows split gives each rank the rows it owns and zeros elsewhere, so the output is Partial(sum)
(the vocabulary letter is "reduced"); take_labels does the same along the class axis.

>>> from disttensor.placement import Shard, Replicate
>>> ids, table = TensorSpec((4, 3), [Replicate()]), TensorSpec((50, 8), [Shard(0)])
>>> embedding_rule((ids, table), (2,)).outputs
((Partial(reduce_type='sum'),),)
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..placement import Partial, Placement, Replicate, Shard
from .core import RuleResult, TensorSpec, einsum_result, get_rule, register

_R = Replicate()


def _letters(n: int) -> str:
    """One lower-case letter per axis (embedding's table axes are the upper-case V and D)."""
    if n > 26:
        raise ValueError(f"nn rules support tensors of at most 26 axes, got {n}")
    return "".join(chr(ord("a") + i) for i in range(n))


def normalize_axis(axis: int, ndim: int, what: str) -> int:
    """``axis`` wrapped into [0, ndim); a TypeError or ValueError that names the op."""
    try:
        if isinstance(axis, bool):
            raise TypeError
        axis = operator.index(axis)
    except TypeError:
        raise TypeError(f"{what}: axis must be an int, got {axis!r}") from None
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what}: axis {axis} is out of range for a tensor with {ndim} axes")
    return axis % ndim


def _rowwise(subs, out, specs, mesh_shape, whole: str) -> RuleResult:
    """Note [Row-wise rules]: the letters in ``whole`` are never split, nothing is linear."""
    return einsum_result(
        subs, out, specs, mesh_shape, reduce=None, linearity="none", unshardable=frozenset(whole)
    )


def _split_dims(spec: TensorSpec, axes, mesh_shape) -> list[int]:
    """The mesh dims (of more than one rank) that split one of ``axes`` of ``spec``."""
    return [
        m
        for m, (p, n) in enumerate(zip(spec.placements, mesh_shape))
        if n > 1 and isinstance(p, Shard) and p.dim in axes
    ]


def _keep_split(fused, mesh_shape, split: list[int], inputs, output) -> RuleResult:
    """Note [Row-wise rules]: the composite route. ``fused(mesh_shape)`` decides the mesh dims
    that do not split the reduced axes (the others made size 1: they keep whatever they
    hold); on a mesh dim m of ``split``, input i gets ``inputs[i](m)`` and the output
    ``output(m)``."""
    res = fused(tuple(1 if m in split else n for m, n in enumerate(mesh_shape)))
    ins = [list(p) for p in res.inputs]
    outs = [list(p) for p in res.outputs]
    for m in split:
        for i, place in enumerate(ins):
            place[m] = inputs[i](m)
        for place in outs:
            place[m] = output(m)
    return RuleResult(tuple(map(tuple, ins)), tuple(map(tuple, outs)), res.shapes)


def _softmax_axes(x: TensorSpec, axis: Any, what: str) -> list[int]:
    """The reduced axes of a softmax-like op: ``axis`` (an int, a sequence, or None: all);
    a 0-d tensor has none (numpy's reductions take axis 0 or -1 there)."""
    if axis is None:
        return list(range(x.ndim))
    axes = np.atleast_1d(axis).tolist()
    if x.ndim == 0:
        for a in axes:
            normalize_axis(a, 1, what)
        return []
    return [normalize_axis(a, x.ndim, what) for a in axes]


@register("softmax", "log_softmax")
def softmax_rule(specs: Sequence[TensorSpec], mesh_shape, axis: Any = -1, **_) -> RuleResult:
    (x,) = specs
    letters = _letters(x.ndim)
    axes = _softmax_axes(x, axis, "softmax")
    whole = "".join(letters[a] for a in axes)
    split = _split_dims(x, axes, mesh_shape)
    if not split:
        return _rowwise([letters], letters, specs, mesh_shape, whole)
    return _keep_split(  # the composite keeps a split softmax axis split
        lambda shape: _rowwise([letters], letters, specs, shape, whole),
        mesh_shape,
        split,
        [lambda m: x.placements[m]],
        lambda m: x.placements[m],
    )


def _reduced_letters(x: TensorSpec, axis: Any, keepdims: bool) -> tuple[str, str, str]:
    """(x's letters, the output's, the reduced ones) of a reduction over ``axis`` (with
    ``keepdims`` the reduced axes stay, as letters of their own of length 1)."""
    axes = _softmax_axes(x, axis, "logsumexp")
    letters = _letters(x.ndim)
    kept = "".join(
        (c.upper() if keepdims else "") if i in axes else c for i, c in enumerate(letters)
    )
    return letters, kept, "".join(letters[a] for a in axes)


@register("logsumexp")
def logsumexp_rule(
    specs: Sequence[TensorSpec], mesh_shape, axis: Any = None, keepdims: bool = False, **_
) -> RuleResult:
    """The reduced axes whole, the others keep their sharding; a split reduced axis stays
    split (the composite), and the output is Replicate on that mesh dim."""
    (x,) = specs
    letters, kept, whole = _reduced_letters(x, axis, keepdims)
    split = _split_dims(x, [letters.index(c) for c in whole], mesh_shape)

    def fused(shape):
        return _rowwise([letters], kept, specs, shape, whole)

    if not split:
        return fused(mesh_shape)
    return _keep_split(fused, mesh_shape, split, [lambda m: x.placements[m]], lambda m: _R)


@register("softmax_grad", "log_softmax_grad")
def softmax_grad_rule(specs: Sequence[TensorSpec], mesh_shape, axis: Any = -1, **_) -> RuleResult:
    """Inputs (the output's gradient, the output), of one shape; the softmax axes whole."""
    g, y = specs
    if g.shape != y.shape:
        raise ValueError(f"softmax_grad: the gradient has shape {g.shape}, the output {y.shape}")
    letters = _letters(y.ndim)
    whole = "".join(letters[a] for a in _softmax_axes(y, axis, "softmax_grad"))
    return _rowwise([letters, letters], letters, specs, mesh_shape, whole)


@register("logsumexp_grad")
def logsumexp_grad_rule(
    specs: Sequence[TensorSpec], mesh_shape, axis: Any = None, keepdims: bool = False, **_
) -> RuleResult:
    """Inputs (the output's gradient, x, the output): ``g * exp(x - out)``, x's reduced axes
    whole."""
    x = specs[1]
    letters, kept, whole = _reduced_letters(x, axis, keepdims)
    return _rowwise([kept, letters, kept], letters, specs, mesh_shape, whole)


@register("attention_softmax")
def attention_softmax_rule(
    specs: Sequence[TensorSpec], mesh_shape, causal: bool = True, **_
) -> RuleResult:
    """Scores (..., queries, keys): the keys whole, and the queries too when ``causal`` (the
    mask needs each row's query index); batch and head axes keep their sharding."""
    (s,) = specs
    if s.ndim < 2:
        raise ValueError(f"attention_softmax: scores need two axes, got shape {s.shape}")
    letters = _letters(s.ndim)
    return _rowwise([letters], letters, specs, mesh_shape, letters[-2:] if causal else letters[-1])


@register("layer_norm")
def layer_norm_rule(
    specs: Sequence[TensorSpec], mesh_shape, begin_norm_axis: int = -1, **_
) -> RuleResult:
    """Inputs (x, [weight], [bias]); weight and bias have x's normalized shape."""
    x = specs[0]
    begin = normalize_axis(begin_norm_axis, x.ndim, "layer_norm")
    letters = _letters(x.ndim)
    for s in specs[1:]:
        if s.shape != x.shape[begin:]:
            raise ValueError(
                f"layer_norm: weight and bias need the normalized shape {x.shape[begin:]}, "
                f"got {s.shape}"
            )
    subs = [letters] + [letters[begin:]] * (len(specs) - 1)
    split = _split_dims(x, range(begin, x.ndim), mesh_shape)
    if not split:
        return _rowwise(subs, letters, specs, mesh_shape, letters[begin:])

    def param(m: int) -> Placement:  # weight and bias split like x's normalized axes
        return Shard(x.placements[m].dim - begin)

    return _keep_split(
        lambda shape: _rowwise(subs, letters, specs, shape, letters[begin:]),
        mesh_shape,
        split,
        [lambda m: x.placements[m]] + [param] * (len(specs) - 1),
        lambda m: x.placements[m],
    )


@register("layer_norm_grad")
def layer_norm_grad_rule(
    specs: Sequence[TensorSpec], mesh_shape, begin_norm_axis: int = -1, wants: str = "xwb", **_
) -> RuleResult:
    """The fused layer norm's gradients: inputs (g, x, mean, rstd[, weight]), the statistics
    of shape ``x.shape[:begin]``; outputs those ``wants`` names: dx ("x", x's shape), dweight
    ("w") and dbias ("b", the normalized shape).

    Per mesh dim: x keeps a split of a batch axis (the layout the forward ran in), g and the
    statistics follow it, the weight is whole, dx is split as x is and dweight/dbias, sums over
    the rows, are Partial(sum) there. Every output is linear in g, so a Partial(sum) g passes
    through where x is whole (the gradient of a layer norm feeding a column-parallel linear:
    no reduction here).
    """
    g, x = specs[0], specs[1]
    begin = normalize_axis(begin_norm_axis, x.ndim, "layer_norm_grad")
    rows = x.shape[:begin]
    for name, s in (("g", g), ("mean", specs[2]), ("rstd", specs[3])):
        want = x.shape if name == "g" else rows
        if s.shape != want:
            raise ValueError(f"layer_norm_grad: {name} must have shape {want}, got {s.shape}")
    pg_in: list[Placement] = []
    px_in: list[Placement] = []
    out_x: list[Placement] = []
    out_p: list[Placement] = []
    for m in range(len(mesh_shape)):
        px, pg = x.placements[m], g.placements[m]
        base = px if isinstance(px, Shard) and px.dim < begin else _R
        if base is _R and isinstance(pg, Partial) and pg.reduce_type == "sum":
            pg_in.append(pg)
            px_in.append(_R)
            out_x.append(pg)
            out_p.append(pg)
        else:
            pg_in.append(base)
            px_in.append(base)
            out_x.append(base)
            out_p.append(Partial("sum") if base is not _R else _R)
    ins = [tuple(pg_in), tuple(px_in), tuple(px_in), tuple(px_in)]
    ins += [(_R,) * len(mesh_shape)] * (len(specs) - 4)
    found = {"x": (tuple(out_x), x.shape), "w": (tuple(out_p), x.shape[begin:])}
    found["b"] = found["w"]
    outs = [found[k] for k in wants]
    return RuleResult(tuple(ins), tuple(o for o, _ in outs), tuple(sh for _, sh in outs))


def _label_letters(logits: TensorSpec, labels: TensorSpec, axis: int, what: str):
    """Letters of logits, of labels (logits' without the class axis) and the class letter."""
    axis = normalize_axis(axis, logits.ndim, what)
    letters = _letters(logits.ndim)
    rest = letters[:axis] + letters[axis + 1 :]
    want = logits.shape[:axis] + logits.shape[axis + 1 :]
    if labels.shape != want:
        raise ValueError(
            f"{what}: labels need the logits' shape without the class axis {axis}, {want}; "
            f"got {labels.shape}"
        )
    return letters, rest, letters[axis]


@register("cross_entropy")
def cross_entropy_rule(
    specs: Sequence[TensorSpec], mesh_shape, axis: int = -1, reduction: str = "none", **_
) -> RuleResult:
    """Inputs (logits, labels) -> the per-sample loss; a ``reduction`` ("mean"/"sum") is then
    a dt.mean/dt.sum of it, whose rule is chained here so infer_forward shows the whole op."""
    logits, labels = specs
    letters, rest, cls = _label_letters(logits, labels, axis, "cross_entropy")
    split = _split_dims(logits, (letters.index(cls),), mesh_shape)
    if not split:
        res = _rowwise([letters, rest], rest, specs, mesh_shape, cls)
    else:  # vocabulary-parallel: logits stay, labels whole there, the loss Partial(sum)
        res = _keep_split(
            lambda shape: _rowwise([letters, rest], rest, specs, shape, cls),
            mesh_shape,
            split,
            [lambda m: logits.placements[m], lambda m: _R],
            lambda m: Partial("sum"),
        )
    if reduction == "none":
        return res
    if reduction not in ("mean", "sum"):
        raise ValueError(
            f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
        )
    red = get_rule(reduction)((TensorSpec(res.shapes[0], res.outputs[0]),), mesh_shape)
    return RuleResult(res.inputs, red.outputs, red.shapes)


@register("cross_entropy_grad")
def cross_entropy_grad_rule(specs: Sequence[TensorSpec], mesh_shape, axis: int = -1, **_):
    """The fused cross entropy's gradient: inputs (logits, labels, shift, sum_exp, g), all but
    the logits of the loss's shape; the output has the logits' shape. The class axis is
    whole (Note [Row-wise rules]); the output is linear in g, so a Partial g passes through."""
    logits, labels = specs[0], specs[1]
    letters, rest, cls = _label_letters(logits, labels, axis, "cross_entropy_grad")
    return einsum_result(
        [letters, rest, rest, rest, rest],
        letters,
        specs,
        mesh_shape,
        reduce=None,
        linearity="multilinear",
        linear_in=[4],
        unshardable=frozenset(cls),
    )


@register("take_labels")
def take_labels_rule(specs: Sequence[TensorSpec], mesh_shape, axis: int = -1, **_) -> RuleResult:
    """``x[..., labels, ...]`` along ``axis`` (labels: x's shape without it). A split class
    axis gives Partial(sum): each rank picks the labels it owns and writes zeros elsewhere."""
    x, labels = specs
    letters, rest, _cls = _label_letters(x, labels, axis, "take_labels")
    return einsum_result(
        [letters, rest], rest, specs, mesh_shape, linearity="multilinear", linear_in=[0]
    )


@register("embedding")
def embedding_rule(specs: Sequence[TensorSpec], mesh_shape, **_) -> RuleResult:
    """``weight[ids]``: ids' sharding carries to the leading output axes; weight columns split
    -> the last output axis split; weight rows split (vocabulary-parallel) -> Partial(sum)."""
    ids, weight = specs
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (vocab, dim), got shape {weight.shape}")
    a = _letters(ids.ndim)
    return einsum_result(
        [a, "VD"], a + "D", specs, mesh_shape, linearity="multilinear", linear_in=[1]
    )


@register("embedding_grad")
def embedding_grad_rule(specs: Sequence[TensorSpec], mesh_shape, vocab=0, like=(), **_):
    """The weight gradient of embedding: rows of ``g`` added into a (vocab, dim) table at
    ``ids``. Per mesh dim, following the weight's placement ``like``:

    - weight rows split (vocabulary-parallel): ids and g whole, each rank adds only the rows
      it owns -> Shard(0), no communication;
    - weight columns split: g split on its last axis -> Shard(1);
    - otherwise ids split on a batch axis (data parallel): g split the same way, each rank adds
      its samples -> Partial(sum); a Partial g passes through (the op is linear in g);
      else everything Replicate.
    """
    ids, g = specs
    n = ids.ndim
    ins_ids: list[Placement] = []
    ins_g: list[Placement] = []
    outs: list[Placement] = []
    for m, k in enumerate(mesh_shape):
        pi, pg = ids.placements[m], g.placements[m]
        want = like[m] if like else Replicate()
        if k == 1:
            row = (Replicate(), Replicate(), Replicate())
        elif want == Shard(0):
            row = (Replicate(), Replicate(), Shard(0))
        elif want == Shard(1):
            row = (Replicate(), Shard(n), Shard(1))
        elif isinstance(pg, Partial) and pg.reduce_type == "sum":
            row = (Replicate(), pg, pg)
        elif isinstance(pi, Shard):
            row = (pi, Shard(pi.dim), Partial("sum"))
        else:
            row = (Replicate(), Replicate(), Replicate())
        ins_ids.append(row[0])
        ins_g.append(row[1])
        outs.append(row[2])
    return RuleResult((tuple(ins_ids), tuple(ins_g)), (tuple(outs),), ((int(vocab), g.shape[-1]),))
