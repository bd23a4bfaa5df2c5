"""Elementwise ops: numpy semantics (broadcasting, type promotion), one table row each.

On device shards each op runs the array module's function of the same name (``cupy.exp``),
or, for the composites, the same expression written with that module (Note [Array backends]
in backend.py). The activations (sigmoid, silu, gelu) and the fused gradients run the kernels
of kernels/activations.py: its numpy references on the host, its CUDA programs on a GPU
(Note [Fused activations] there).

>>> import numpy as np, disttensor as dt
>>> mesh = dt.ProcessMesh([0])
>>> x = dt.shard_tensor(np.array([-1.0, 0.5]), mesh, [dt.Shard(0)])
>>> dt.relu(x).to_local(), (x * 2 + 1).to_local()
(array([0. , 0.5]), array([-1.,  2.]))
"""

from __future__ import annotations

import numpy as np

from kernels import activations as act

from .. import backend
from ..dispatch import Op

UNARY = {
    "negative": np.negative,
    "positive": np.positive,
    "abs": np.abs,
    "exp": np.exp,
    "expm1": np.expm1,
    "log": np.log,
    "log1p": np.log1p,
    "log2": np.log2,
    "log10": np.log10,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "square": np.square,
    "reciprocal": np.reciprocal,
    "sign": np.sign,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "tanh": np.tanh,
    "arctan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "sigmoid": act.sigmoid_forward,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": act.gelu_forward,  # the tanh approximation (as in GPT-2 and BERT)
    "silu": act.silu_forward,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
    "logical_not": np.logical_not,
    "isnan": np.isnan,
    "isfinite": np.isfinite,
    "isinf": np.isinf,
    "conjugate": np.conjugate,
    "real": np.real,
    "imag": np.imag,
}
BINARY = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "true_divide": np.true_divide,
    "power": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "floor_divide": np.floor_divide,
    "mod": np.mod,
    "arctan2": np.arctan2,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}


# Gradients of unary ops as one kernel each (ops/gradients.py), from the gradient g and the
# op's output (tanh, sigmoid) or input (gelu, silu, relu): kernels/activations.py, linear in
# g (spmd/rules.py).
UNARY_GRAD = {
    "tanh_grad": act.tanh_backward,
    "sigmoid_grad": act.sigmoid_backward,
    "gelu_grad": act.gelu_backward,
    "silu_grad": act.silu_backward,
    "relu_grad": act.relu_backward,
}


def _activation(name: str):
    """The device kernel factory of an activation kernel: kernels/activations.py's CUDA
    program on the backend (backend.kernels)."""
    return lambda be: backend.kernels(be, "activations")[name]


# Device kernels (dispatch.Op.device): by default the array module's function of the op's
# name; the composites written with the module (the same operations, so the same values);
# the activations' kernels.
DEVICE = {
    "rsqrt": lambda be: lambda x: 1 / be.xp.sqrt(x),
    "sigmoid": _activation("sigmoid_forward"),
    "relu": lambda be: lambda x: be.xp.maximum(x, 0),
    "gelu": _activation("gelu_forward"),
    "silu": _activation("silu_forward"),
    "round": lambda be: getattr(be.xp, "round", None) or be.xp.around,  # older CuPy: around
    "tanh_grad": _activation("tanh_backward"),
    "sigmoid_grad": _activation("sigmoid_backward"),
    "gelu_grad": _activation("gelu_backward"),
    "silu_grad": _activation("silu_backward"),
    "relu_grad": _activation("relu_backward"),
}

OPS: dict[str, Op] = {
    name: Op(name, k, rule=name, device=DEVICE.get(name, name))
    for name, k in {**UNARY, **BINARY}.items()
}
GRAD_OPS: dict[str, Op] = {
    name: Op(name, k, rule=name, device=DEVICE[name]) for name, k in UNARY_GRAD.items()
}
OPS["where"] = Op("where", np.where, rule="where", device="where")
OPS["clip"] = Op(
    "clip",
    lambda x, lo, hi: np.clip(x, lo, hi),
    rule="clip",
    device=lambda be: lambda x, lo, hi: be.xp.clip(x, lo, hi),
)
OPS["astype"] = Op("astype", lambda x, dtype: x.astype(dtype), rule="astype", device=True)


def where(condition, x, y):
    """``np.where(condition, x, y)`` (the three-argument form)."""
    return OPS["where"](condition, x, y)


def clip(x, a_min=None, a_max=None):
    """``np.clip(x, a_min, a_max)``; bounds may be scalars or tensors."""
    return OPS["clip"](x, a_min, a_max)


class DtypeRefused(TypeError):
    """A dtype no DistTensor can hold; raised as it is, never retried by the gathering
    fallback of numpy functions (which would gather the value first, then fail)."""


def astype(x, dtype):
    """``x.astype(dtype)``; the dtype must be bool or numeric, as every DistTensor's is."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "biufc":
        # object items are pointers into one process (meaningless on another rank), and
        # strings, bytes and dates have no reductions: refused here, before any op runs
        raise DtypeRefused(
            f"astype: a DistTensor's dtype must be bool or numeric, got {dtype}; "
            "for other dtypes convert the gathered value: x.numpy().astype(...)"
        )
    return OPS["astype"](x, dtype=dtype)


def _public(name: str):
    op = OPS[name]

    def f(*args):
        return op(*args)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Elementwise ``{name}`` with numpy semantics, on any placements."
    return f


for _name in (*UNARY, *BINARY):
    globals()[_name] = _public(_name)

__all__ = [*UNARY, *BINARY, "where", "clip", "astype"]
