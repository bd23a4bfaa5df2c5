"""Rules of the scans along one axis (cumsum, cumprod): the scanned axis is never split.

A scan is local wherever its axis is whole: every other axis keeps its split, and cumsum is
linear, so Partial(sum)/Partial(avg) inputs stay Partial (cumprod reduces them first). The
scan of a split axis is not a rule's business: ``dt.cumsum`` scans each shard and adds the
exclusive scan of the shard totals (ops/scan.py, Note [Scans of a split axis]); these rules
are only asked about axes that are whole, and gather the axis when they are not.

>>> from disttensor.placement import Shard, Partial
>>> from disttensor.spmd.core import TensorSpec
>>> rule = SCANS["cumsum"]
>>> rule((TensorSpec((8, 4), [Shard(0)]),), (2,), axis=1).outputs
((Shard(dim=0),),)
>>> rule((TensorSpec((8, 4), [Partial("sum")]),), (2,), axis=0).outputs
((Partial(reduce_type='sum'),),)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .core import RuleResult, einsum_result, register


def scan_rule(linear: bool) -> Callable[..., RuleResult]:
    """The rule of a scan; ``linear``: Partial(sum/avg) inputs pass through (cumsum), as
    long as no ``dtype=`` casts the parts (cast(a) + cast(b) need not be cast(a + b))."""

    def rule(specs, mesh_shape, axis=0, dtype=None, reverse=False, **_) -> RuleResult:
        (spec,) = specs
        if not -spec.ndim <= axis < spec.ndim:
            raise np.exceptions.AxisError(axis, spec.ndim)
        letters = "".join(chr(ord("a") + i) for i in range(spec.ndim))
        return einsum_result(
            [letters],
            letters,
            specs,
            mesh_shape,
            unshardable=frozenset(letters[axis % spec.ndim]),
            linearity="linear" if linear and dtype is None else "none",
        )

    return rule


SCANS = {"cumsum": scan_rule(linear=True), "cumprod": scan_rule(linear=False)}
for _name, _rule in SCANS.items():
    register(_name)(_rule)
