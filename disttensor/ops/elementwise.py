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
from ..dispatch import Op, apply, host_method, stand_in

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
# The rest of numpy's ufuncs (Note [numpy's ufuncs]), exported as dt functions like the ops
# above
UFUNC_UNARY = {
    "arcsinh": np.arcsinh,
    "cbrt": np.cbrt,
    "deg2rad": np.deg2rad,
    "degrees": np.degrees,
    "rad2deg": np.rad2deg,
    "radians": np.radians,
    "exp2": np.exp2,
    "fabs": np.fabs,
    "rint": np.rint,
    "signbit": np.signbit,
    "spacing": np.spacing,
    "trunc": np.trunc,
    "modf": np.modf,  # two outputs: (fractional part, integral part)
    "frexp": np.frexp,  # two outputs: (mantissa, integer exponent)
}
UFUNC_BINARY = {
    "copysign": np.copysign,
    "fmax": np.fmax,
    "fmin": np.fmin,
    "heaviside": np.heaviside,
    "hypot": np.hypot,
    "logaddexp": np.logaddexp,
    "logaddexp2": np.logaddexp2,
    "nextafter": np.nextafter,
    "divmod": np.divmod,  # two outputs: (floor_divide, mod)
}
UNARY.update(UFUNC_UNARY)
BINARY.update(UFUNC_BINARY)
# Exported too, but kept out of UNARY, whose test grids (tests/test_ops_elementwise.py,
# tests/test_grad.py) draw their arguments from all the reals: these are NaN outside [-1, 1]
# or [1, inf). tests/test_ufuncs.py tests them on their domains.
INTERVAL_UNARY = {
    "arccos": np.arccos,
    "arccosh": np.arccosh,
    "arcsin": np.arcsin,
    "arctanh": np.arctanh,
}
# Ops that numpy's ufuncs (``np.bitwise_and(x, y)``, ``np.gcd``, ``np.fmod``, ...), the
# DistTensor operators (``& | ^ ~ << >>``) and the dt functions of the same names run, kept out
# of UNARY and BINARY, whose test grids take float arguments from all the reals: numpy's
# integer and bitwise ufuncs and ldexp (whose exponent is an integer) take no float tensor
# (the op list's gradient probe, disttensor/oplist.py, calls them on integers); fmod and
# float_power have gradients, and a BINARY op's are checked by tests/test_grad.py on arguments
# from all the reals, where central differences of these fail (divisors near 0, negative
# bases): tests/test_ufuncs.py checks them on their domains.
NUMPY_ONLY = {
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "invert": np.invert,  # np.bitwise_not and np.bitwise_invert are this ufunc
    "bitwise_count": np.bitwise_count,
    "left_shift": np.left_shift,  # np.bitwise_left_shift
    "right_shift": np.right_shift,  # np.bitwise_right_shift
    "gcd": np.gcd,
    "lcm": np.lcm,
    "ldexp": np.ldexp,
    "fmod": np.fmod,
    "float_power": np.float_power,
}
# Note [numpy's ufuncs]
#     Every ufunc of numpy runs an op with a rule on DistTensors (tests/test_ufuncs.py checks
#     it for the installed numpy), except those listed there: numpy's aliases (np.acos,
#     np.bitwise_not, np.pow, ...) are the same ufunc objects, so they run the same op
#     (ops/numpy_interop.py). The ops of UFUNC_UNARY, UFUNC_BINARY, INTERVAL_UNARY and
#     NUMPY_ONLY are numpy's ufuncs as kernels with pointwise rules (spmd/rules.py), under
#     numpy's dtype rules: before anything moves, the ufunc runs on 0-d stand-ins of the
#     operands' dtypes (the Python scalars as they are), so a dtype numpy refuses
#     (``np.bitwise_and`` of floats, ``np.ldexp`` with a float exponent, a Python int out of
#     the range of an int8 tensor) raises numpy's own error on every rank before any
#     collective. divmod, modf and frexp return a tuple of DistTensors, each laid out as the
#     op's output. The gufuncs np.vecdot, np.matvec and np.vecmat run dt.einsum
#     (ops/numpy_interop.py).


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

# Note [numpy's ufuncs]: _Checked ops
_CHECKED = {*UFUNC_UNARY, *UFUNC_BINARY, *INTERVAL_UNARY, *NUMPY_ONLY}


def _xp_function(name: str):
    """The device kernel factory of a numpy ufunc: the array module's function of that name,
    or the backend's NotImplementedError naming the op where the module has none."""

    def factory(be):
        f = getattr(be.xp, name, None)
        if f is None:
            raise backend.unsupported(repr(name), be)
        return f

    return factory


class _Checked(Op):
    """A numpy ufunc's op that runs numpy's dtype rules before dispatch (Note [numpy's
    ufuncs]): numpy's TypeError (or OverflowError) on every rank, before anything moves."""

    def check(self, args: tuple, attrs: dict) -> None:
        """numpy's error for these operands' dtypes (and Python scalars), if it has one."""
        with np.errstate(all="ignore"):
            self.kernel(*map(stand_in, args), **attrs)  # raises where numpy raises

    def __call__(self, *args, **attrs):
        self.check(args, attrs)
        return apply(self, args, attrs)


def _op(name: str, kernel) -> Op:
    if name in _CHECKED:
        return _Checked(name, kernel, rule=name, device=_xp_function(name))
    return Op(name, kernel, rule=name, device=DEVICE.get(name, name))


OPS: dict[str, Op] = {
    name: _op(name, k) for name, k in {**UNARY, **BINARY, **INTERVAL_UNARY}.items()
}
# the ops of NUMPY_ONLY (run by numpy's ufuncs, the operators and their dt functions)
NUMPY_ONLY_OPS: dict[str, Op] = {name: _op(name, k) for name, k in NUMPY_ONLY.items()}
GRAD_OPS: dict[str, Op] = {
    name: Op(name, k, rule=name, device=DEVICE[name]) for name, k in UNARY_GRAD.items()
}
# numpy's where without its __array_function__ dispatch (the kernel gets arrays; 0.2 us)
OPS["where"] = Op("where", getattr(np.where, "_implementation", np.where), rule="where",
                  device="where")  # fmt: skip
OPS["clip"] = Op(
    "clip",
    host_method("clip"),
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


def _public(name: str, op: Op | None = None):
    op = OPS[name] if op is None else op

    def f(*args):
        return op(*args)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Elementwise ``{name}`` with numpy semantics, on any placements."
    if name in _TWO_OUTPUTS:
        f.__doc__ += " Returns two DistTensors, both laid out as the op's output."
    return f


_TWO_OUTPUTS = {"divmod", "modf", "frexp"}


for _name in (*UNARY, *BINARY, *INTERVAL_UNARY):
    globals()[_name] = _public(_name)
for _name in NUMPY_ONLY:  # exported too, outside the float test grids (above)
    globals()[_name] = _public(_name, NUMPY_ONLY_OPS[_name])


def _aliases() -> dict[str, str]:
    """numpy's other names of the ufuncs exported here (np.acos is np.arccos, np.pow is
    np.power, np.bitwise_not is np.invert): alias -> the exported name. dt.acos is dt.arccos,
    the same function."""
    exported = {}
    for name in (*UNARY, *BINARY, *INTERVAL_UNARY, *NUMPY_ONLY):
        f = getattr(np, name, None)
        if isinstance(f, np.ufunc):
            exported.setdefault(f, name)
    out = {}
    for name in dir(np):
        f = getattr(np, name)
        if isinstance(f, np.ufunc) and f in exported and name not in globals():
            out[name] = exported[f]
    return out


ALIASES = _aliases()
for _alias, _name in ALIASES.items():
    globals()[_alias] = globals()[_name]

__all__ = [*UNARY, *BINARY, *INTERVAL_UNARY, *NUMPY_ONLY, *ALIASES, "where", "clip", "astype"]
