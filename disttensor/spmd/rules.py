"""The SPMD rules of the op set: adding a pointwise op is one line in a table, a
matmul-family op one equation. See core.py for the engine and Note [Partial through ops].

Every rule takes the tensor inputs' specs, the mesh shape, and ``pos``/``nargs`` (where the
tensors sit among the op's arguments: Python scalars are arguments too, and they decide
linearity: ``x + 1`` on a Partial x is not ``sum(x_i + 1)``), plus the op's attributes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..placement import Partial, Replicate
from .core import RuleResult, einsum_result, parse_equation, register

_R = Replicate()
_AVG = Partial("avg")

# -- pointwise ------------------------------------------------------------------------------
# linearity: "linear" (jointly in every argument), an int tuple (multilinear: linear in each of
# those argument positions separately), or None.
POINTWISE: dict[str, Any] = {
    # unary
    "negative": "linear",
    "positive": "linear",
    "conjugate": "linear",
    "real": "linear",
    "imag": "linear",
    "abs": None,
    "exp": None,
    "expm1": None,
    "log": None,
    "log1p": None,
    "log2": None,
    "log10": None,
    "sqrt": None,
    "rsqrt": None,
    "square": None,
    "reciprocal": None,
    "sign": None,
    "sin": None,
    "cos": None,
    "tan": None,
    "tanh": None,
    "arctan": None,
    "sinh": None,
    "cosh": None,
    "sigmoid": None,
    "relu": None,
    "gelu": None,
    "silu": None,
    "floor": None,
    "ceil": None,
    "round": None,
    "clip": None,
    "astype": None,
    "logical_not": None,
    "isnan": None,
    "isfinite": None,
    "isinf": None,
    "arccos": None,
    "arccosh": None,
    "arcsin": None,
    "arcsinh": None,
    "arctanh": None,
    "cbrt": None,
    "deg2rad": "linear",  # x * (pi / 180)
    "degrees": "linear",
    "rad2deg": "linear",
    "radians": "linear",
    "exp2": None,
    "fabs": None,
    "rint": None,
    "signbit": None,
    "spacing": None,
    "trunc": None,
    "modf": None,  # two outputs (_OUTPUTS)
    "frexp": None,  # two outputs
    "invert": None,  # ~x is -x - 1 on integers: affine, not linear
    "bitwise_count": None,
    # binary and ternary, with broadcasting
    "add": "linear",
    "subtract": "linear",
    "multiply": (0, 1),
    "divide": (0,),
    "true_divide": (0,),
    "power": None,
    "maximum": None,
    "minimum": None,
    "floor_divide": None,
    "mod": None,
    "arctan2": None,
    "equal": None,
    "not_equal": None,
    "less": None,
    "less_equal": None,
    "greater": None,
    "greater_equal": None,
    "logical_and": None,
    "logical_or": None,
    "logical_xor": None,
    "copysign": None,
    "float_power": None,
    "fmax": None,
    "fmin": None,
    "fmod": None,
    "heaviside": None,
    "hypot": None,
    "logaddexp": None,
    "logaddexp2": None,
    "nextafter": None,
    "divmod": None,  # two outputs (_OUTPUTS)
    "ldexp": (0,),  # x * 2**i: linear in x
    "bitwise_and": None,
    "bitwise_or": None,
    "bitwise_xor": None,
    "left_shift": None,
    "right_shift": None,
    "gcd": None,
    "lcm": None,
    "where": (1, 2),  # where(c, x, y) is linear in x and y jointly
    # fused gradients of unary ops (ops/elementwise.py UNARY_GRAD): linear in the gradient
    "tanh_grad": (0,),
    "sigmoid_grad": (0,),
    "gelu_grad": (0,),
    "silu_grad": (0,),
    "relu_grad": (0,),
}
_JOINT = {"where"}
_OUTPUTS = {"divmod": 2, "modf": 2, "frexp": 2}  # ufuncs with several outputs, each laid out alike
_LINEAR = {"sum", "avg"}  # multilinear entries that are in fact jointly linear

# Note [Partial max/min through monotone ops]
#     A Partial(max) tensor is the max over ranks of their local values; an op f that is
#     non-decreasing in one argument (the others Replicate) gives max_r f(a_r) = f(max_r a_r),
#     so Partial(max) in -> Partial(max) out with no communication (Partial(min) alike; a
#     non-increasing f swaps them). Exact only where f is defined on all of [-inf, inf]: a
#     rank's local value of a Partial(max) can be -inf (an empty shard's max) and one NaN
#     poisons the reduction. So exp, tanh, sigmoid, relu, clip, maximum, ... are listed; log,
#     sqrt, power are not; nor is x + r: -inf + inf is NaN where the true sum is inf.
#     maximum of two Partial(max) tensors is Partial(max) (the max of all of them), minimum of
#     two Partial(min) likewise, and where(c, x, y) of Partial x and y with c Replicate.
#     fmax and fmin are not listed: they drop a NaN, so a rank's NaN that poisons the max of
#     the ranks' values would be dropped instead.
MONOTONE: dict[str, int] = {  # +1 non-decreasing, -1 non-increasing, in its tensor arguments
    **dict.fromkeys(
        ("positive", "exp", "expm1", "tanh", "sigmoid", "arctan", "sinh", "relu", "sign"), 1
    ),
    **dict.fromkeys(("floor", "ceil", "round", "clip", "maximum", "minimum", "where"), 1),
    **dict.fromkeys(("cbrt", "arcsinh", "exp2", "trunc", "rint", "logaddexp", "logaddexp2"), 1),
    **dict.fromkeys(("deg2rad", "degrees", "rad2deg", "radians"), 1),
    "negative": -1,
}
_MONOTONE_ARGS = {"where": (1, 2)}  # where(c, x, y): monotone in x and y, never in c
_JOINT_EXTREMES = {"maximum": ("max",), "minimum": ("min",), "where": ("max", "min")}
_SWAP = {"max": "min", "min": "max"}


def _monotone_patterns(name: str, n: int, pos: tuple[int, ...]) -> list:
    """Note [Partial max/min through monotone ops]: (input placements, output) candidates."""
    sign = MONOTONE.get(name)
    if sign is None:
        return []
    args = [i for i, p in enumerate(pos) if p in _MONOTONE_ARGS.get(name, (p,))]
    out = []
    for t in ("max", "min"):
        o = Partial(t if sign > 0 else _SWAP[t])
        for i in args:
            out.append((tuple(Partial(t) if j == i else _R for j in range(n)), o))
        if len(args) > 1 and t in _JOINT_EXTREMES.get(name, ()):
            out.append((tuple(Partial(t) if j in args else _R for j in range(n)), o))
    return out


def broadcast_subscripts(shapes: Sequence[tuple[int, ...]]) -> tuple[list[str], str, set[str]]:
    """Letters for a broadcasting op: shared letters for matching axes, fresh (unshardable)
    letters for the size-1 axes that broadcast."""
    if all(sh == shapes[0] for sh in shapes):  # the common case, without numpy's machinery
        out_shape = shapes[0]
    else:
        try:
            out_shape = np.broadcast_shapes(*shapes)
        except ValueError as e:
            raise ValueError(f"operands could not be broadcast together: {e}") from None
    nd = len(out_shape)
    out = "".join(chr(ord("a") + i) for i in range(nd))
    fresh = iter(chr(ord("A") + i) for i in range(26))
    subs, broadcast = [], set()
    for shape in shapes:
        s = ""
        for j, n in enumerate(shape):
            axis = j + nd - len(shape)
            if n == out_shape[axis]:
                s += out[axis]
            else:
                c = next(fresh)
                broadcast.add(c)
                s += c
        subs.append(s)
    return subs, out, broadcast


def pointwise_rule(name: str):
    kind = POINTWISE[name]

    def rule(specs, mesh_shape, pos=None, nargs=None, **_):
        pos = tuple(range(len(specs))) if pos is None else tuple(pos)
        nargs = len(specs) if nargs is None else nargs
        subs, out, broadcast = broadcast_subscripts([s.shape for s in specs])
        options: dict[str, Any] = {"unshardable": frozenset(broadcast), "linearity": "none"}
        patterns = _monotone_patterns(name, len(specs), pos)
        if kind == "linear" and nargs == len(specs):  # a scalar argument breaks joint linearity
            options["linearity"] = "linear"
        elif name in ("add", "subtract") and len(specs) == 1:  # x + c: the mean of x_r + c
            patterns.append(((_AVG,), _AVG))  # is the mean of x_r, plus c (a sum's is not)
        elif isinstance(kind, tuple):
            tensors = [i for i, p in enumerate(pos) if p in kind]
            if name in _JOINT:
                # where(c, x, y), all three tensors: x and y may be Partial together, c never
                if len(tensors) == len(kind) and nargs == len(specs):
                    patterns += _where_patterns(specs)
            else:
                options["linearity"] = "multilinear"
                options["linear_in"] = tensors
        if patterns:
            options["partial_patterns"] = patterns
        res = einsum_result(subs, out, specs, mesh_shape, **options)
        n = _OUTPUTS.get(name, 1)
        return res if n == 1 else RuleResult(res.inputs, res.outputs * n, res.shapes * n)

    return rule


def _where_patterns(specs):
    kinds = {p.reduce_type for s in specs[1:] for p in s.placements if isinstance(p, Partial)}

    return [
        ((Replicate(), Partial(t), Partial(t)), Partial(t)) for t in sorted(kinds & {"sum", "avg"})
    ]


for _name in POINTWISE:
    register(_name)(pointwise_rule(_name))


# -- matmul family --------------------------------------------------------------------------
def _matmul_subscripts(nx: int, ny: int, trans_x: bool, trans_y: bool) -> tuple[list[str], str]:
    """numpy.matmul as einsum: 1-D operands promoted and squeezed, batch dims broadcast."""
    if nx == 0 or ny == 0:
        raise ValueError("matmul: operands must have at least one axis (use multiply)")
    x = "mk" if nx >= 2 else "k"
    y = "kn" if ny >= 2 else "k"
    if trans_x and nx >= 2:
        x = x[::-1]
    if trans_y and ny >= 2:
        y = y[::-1]
    out = ("m" if nx >= 2 else "") + ("n" if ny >= 2 else "")
    return [x, y], out


def _matmul_letters(sx, sy, trans_x: bool, trans_y: bool) -> tuple[list[str], str, set[str]]:
    """Letters of numpy.matmul's operands and output, batch axes included (broadcast ones
    get letters of their own that are never split)."""
    if 0 in (sx.ndim, sy.ndim):
        raise ValueError("matmul: both operands need at least one axis (for scalars use multiply)")
    core_x, core_y = min(sx.ndim, 2), min(sy.ndim, 2)
    (x, y), out = _matmul_subscripts(sx.ndim, sy.ndim, trans_x, trans_y)
    bx, by = sx.shape[: sx.ndim - core_x], sy.shape[: sy.ndim - core_y]
    bsubs, bout, broadcast = broadcast_subscripts([bx, by])
    bsubs = [b.replace("m", "M").replace("n", "N").replace("k", "K") for b in bsubs]
    bout = bout.replace("m", "M").replace("n", "N").replace("k", "K")
    return [bsubs[0] + x, bsubs[1] + y], bout + out, broadcast


@register("matmul")
def matmul_rule(specs, mesh_shape, trans_x=False, trans_y=False, **_):
    if len(specs) != 2:
        raise ValueError("matmul: takes two operands")
    _check_core(specs[0], specs[1], trans_x, trans_y)
    subs, out, broadcast = _matmul_letters(specs[0], specs[1], trans_x, trans_y)
    return einsum_result(
        subs, out, specs, mesh_shape, unshardable=frozenset(broadcast), linearity="multilinear"
    )


def _check_core(sx, sy, trans_x: bool, trans_y: bool) -> None:
    """numpy's error for contracted lengths that differ (before the einsum core's own)."""
    if 0 in (sx.ndim, sy.ndim):
        return  # _matmul_letters says so
    kx = sx.shape[-2] if trans_x and sx.ndim >= 2 else sx.shape[-1]
    ky = sy.shape[0] if sy.ndim == 1 else sy.shape[-1] if trans_y else sy.shape[-2]
    if kx != ky:
        raise ValueError(
            "matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc "
            f"signature (n?,k),(k,m?)->(n?,m?) (size {ky} is different from {kx}); shapes "
            f"{sx.shape} and {sy.shape}"
        )


# Note [Bias of a linear]
# ``linear(x, weight, bias)`` is ``x @ weight + bias`` in one op. x and the weight follow the
# matmul rule; the bias is one more operand whose only letter is the output's last one, so it
# is split wherever the output's last axis is. But it is added, not multiplied (``added`` in
# core.solve): where the output is Partial(t) (a split contraction, or a Partial x or weight),
# the bias is Partial(t) too, so that reducing the output adds it once (from Replicate that
# is a local step: the whole bias on one rank and zeros on the others for sum, the bias
# itself for avg); and a Partial bias with Replicate x and weight makes the output Partial.
@register("linear")
def linear_rule(specs, mesh_shape, **_):
    if len(specs) != 3 or specs[1].ndim != 2 or specs[2].shape != specs[1].shape[1:]:
        raise ValueError(
            "linear: takes x, a 2-D weight (in, out) and a bias of shape (out,), got shapes "
            f"{[s.shape for s in specs]}"
        )
    subs, out, broadcast = _matmul_letters(specs[0], specs[1], False, False)
    return einsum_result(
        subs + [out[-1]],
        out,
        specs,
        mesh_shape,
        unshardable=frozenset(broadcast),
        linearity="multilinear",
        linear_in=(0, 1),
        added=(2,),
    )


@register("einsum")
def einsum_rule(specs, mesh_shape, equation: str = "", **_):
    subs, out = parse_equation(equation, [s.ndim for s in specs])
    return einsum_result(subs, out, specs, mesh_shape, linearity="multilinear")


@register("dot")
def dot_rule(specs, mesh_shape, **_):
    sx, sy = specs
    if sx.ndim == 0 or sy.ndim == 0:
        return pointwise_rule("multiply")(specs, mesh_shape)
    if sy.ndim <= 2:
        return matmul_rule(specs, mesh_shape)
    # numpy.dot: sum over x's last axis and y's second-to-last
    x = "".join(chr(ord("a") + i) for i in range(sx.ndim - 1)) + "z"
    y = "".join(chr(ord("n") + i) for i in range(sy.ndim - 2)) + "z" + "y"
    return einsum_result([x, y], x[:-1] + y[:-2] + "y", specs, mesh_shape, linearity="multilinear")


@register("outer")
def outer_rule(specs, mesh_shape, **_):
    sx, sy = specs
    if sx.ndim == 1 and sy.ndim == 1:
        return einsum_result(["i", "j"], "ij", specs, mesh_shape, linearity="multilinear")
    # numpy flattens N-D inputs, which does not follow any input sharding: replicate them
    rep = (Replicate(),) * len(mesh_shape)
    size = (int(np.prod(sx.shape)), int(np.prod(sy.shape)))
    return RuleResult((rep, rep), (rep,), (size,))


# -- reductions ------------------------------------------------------------------------------
def _reduced(ndim: int, axis, keepdims: bool) -> tuple[str, str, frozenset[str]]:
    letters = "".join(chr(ord("a") + i) for i in range(ndim))
    if axis is None:
        axes = set(range(ndim))
    else:
        axes = set()
        for a in axis if isinstance(axis, tuple) else (axis,):
            if not -ndim <= a < max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
                raise np.exceptions.AxisError(a, ndim)
            axes.add(a % ndim if ndim else a)
    kept = "".join(c for i, c in enumerate(letters) if i not in axes)
    if keepdims:  # reduced axes stay as new size-1 letters
        kept = "".join(c if i not in axes else chr(ord("A") + i) for i, c in enumerate(letters))
    return letters, kept, frozenset(chr(ord("A") + i) for i in axes)


# name -> (Partial type of a split reduced axis or None, linearity, extra Partial patterns)
REDUCTIONS: dict[str, tuple[str | None, str, tuple]] = {
    "sum": ("sum", "linear", ()),
    "mean": ("avg", "linear", ()),
    "max": ("max", "none", ((Partial("max"),), Partial("max"))),
    "min": ("min", "none", ((Partial("min"),), Partial("min"))),
    # all/any: a split reduced axis is exact (bool results); Partial inputs are not (numbers)
    "all": ("min", "none", ()),
    "any": ("max", "none", ()),
    "prod": (None, "none", ()),
    "argmax": (None, "none", ()),
    "argmin": (None, "none", ()),
}


def reduction_rule(name: str):
    reduce, linearity, pattern = REDUCTIONS[name]

    def rule(specs, mesh_shape, axis=None, keepdims=False, **_):
        (spec,) = specs
        letters, kept, _new = _reduced(spec.ndim, axis, keepdims)
        patterns = [pattern] if pattern else []
        return einsum_result(
            [letters],
            kept,
            specs,
            mesh_shape,
            reduce=reduce,
            linearity=linearity,
            partial_patterns=patterns,
        )

    return rule


for _name in REDUCTIONS:
    register(_name)(reduction_rule(_name))
