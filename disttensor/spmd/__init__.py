"""SPMD rules: which placements an op needs and produces. Pure; no communication.

>>> import disttensor as dt
>>> mesh = dt.ProcessMesh([[0, 1], [2, 3]])
>>> dt.spmd.infer_forward("matmul", [dt.spmd.TensorSpec((64, 32), [dt.Shard(0), dt.Replicate()]),
...                                  dt.spmd.TensorSpec((32, 48), [dt.Replicate(), dt.Shard(1)])],
...                       mesh, trans_x=False, trans_y=False)
([[Shard(dim=0), Replicate()], [Replicate(), Shard(dim=1)]], [[Shard(dim=0), Shard(dim=1)]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..mesh import ProcessMesh
from . import layout_rules as _layout_rules  # noqa: F401  (each module registers its rules)
from . import nn_rules as _nn_rules  # noqa: F401
from . import rules as _rules  # noqa: F401
from . import scan_rules as _scan_rules  # noqa: F401
from . import shape_rules as _shape_rules  # noqa: F401
from .core import RuleResult, TensorSpec, get_rule, register, registered_ops, replicate_fallback


def infer_forward(
    op: str, input_specs: Sequence[TensorSpec], mesh: ProcessMesh | Sequence[int], **attrs: Any
) -> tuple[list[list], list[list]]:
    """(input placements, output placements) the op's rule picks; the replicate fallback for
    ops without a rule. Works in a single process for any mesh."""
    specs = tuple(input_specs)
    for s in specs:
        if not isinstance(s, TensorSpec):
            raise TypeError(f"infer_forward needs dt.spmd.TensorSpec inputs, got {s!r}")
    mesh_shape = tuple(mesh.shape) if isinstance(mesh, ProcessMesh) else tuple(mesh)
    for s in specs:
        if len(s.placements) != len(mesh_shape):
            raise ValueError(
                f"{s} has {len(s.placements)} placements for a {len(mesh_shape)}-D mesh"
            )
    rule = get_rule(op)
    attrs = {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}
    res = (
        replicate_fallback(specs, mesh_shape) if rule is None else rule(specs, mesh_shape, **attrs)
    )
    return [list(p) for p in res.inputs], [list(p) for p in res.outputs]


__all__ = ["RuleResult", "TensorSpec", "get_rule", "infer_forward", "register", "registered_ops"]
