"""Gradients of the primitive ops, written with dt ops (so they run through the same rules
and reshards as the forward pass). Composites (var, std, logsumexp, softmax, log_softmax,
the sharded layer norm and cross entropy, flatten, ravel, ...) are made of these and need
no gradient of their own. Each function takes the ``GradContext`` of the call and the
output's gradient ``g`` and returns one gradient (or None) per argument.

>>> import numpy as np, disttensor as dt
>>> w = dt.shard_tensor(np.array([[1.0, 2.0], [3.0, 4.0]]), dt.ProcessMesh([0]), [dt.Shard(1)])
>>> w.requires_grad = True
>>> (dt.tanh(w @ np.ones(2) / 4)).sum().backward()  # d tanh(u) = 1 - tanh(u)^2
>>> np.round(w.grad.numpy(), 4)
array([[0.1491, 0.1491],
       [0.0285, 0.0285]])
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from .. import backend, creation
from ..autograd import NOT_DIFFERENTIABLE, GradContext, gradient
from ..spec import DistSpec
from ..spmd.core import parse_equation
from ..tensor import DistTensor
from . import layout as lay
from . import linalg as la
from . import nn
from . import reduction as red
from . import shape as sh
from .elementwise import GRAD_OPS, NUMPY_ONLY_OPS
from .elementwise import OPS as EW

# Outputs of these are constants for autograd: integer or bool results, or a gradient that is
# zero almost everywhere (treated as no gradient, so nothing flows back through them).
NOT_DIFFERENTIABLE.update(
    {
        "sign", "floor", "ceil", "round", "floor_divide",  # piecewise constant
        "logical_not", "isnan", "isfinite", "isinf",  # bool results
        "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
        "logical_and", "logical_or", "logical_xor",
        "argmax", "argmin", "all", "any",
        "imag",  # real-valued tensors only: its gradient is zero
        "rint", "trunc", "spacing", "heaviside",  # piecewise constant
        # x moved by one unit in the last place: a probe of the float grid, not a function to
        # differentiate through (PyTorch gives it no gradient either)
        "nextafter",
        "signbit",  # bool results
        "frexp",  # an integer exponent among its outputs (dispatch records no such op)
        # integer results (numpy's integer and bitwise ufuncs: ops/elementwise.py NUMPY_ONLY)
        "bitwise_and", "bitwise_or", "bitwise_xor", "invert", "bitwise_count",
        "left_shift", "right_shift", "gcd", "lcm",
    }
)  # fmt: skip

add, sub, mul, div = EW["add"], EW["subtract"], EW["multiply"], EW["divide"]
where = EW["where"]
_MATMUL = la.OPS["matmul"]  # the ops themselves: gradients pass normalized attributes
_BROADCAST_TO = sh.OPS["broadcast_to"]


def _shape(a: Any) -> tuple[int, ...]:
    """The shape of a DistTensor, an array (a device one too) or host data."""
    shape = getattr(a, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(a))


def _reshaped(g, shape: tuple[int, ...]):
    """``g`` reshaped to ``shape``; ``g`` itself when it has that shape already (no op)."""
    return g if g.shape == shape else sh.reshape(g, shape)


def _sum_to(g, shape: tuple[int, ...]):
    """``g`` summed over the axes broadcasting added or stretched, to ``shape``."""
    gshape = g.shape
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    axes = [*range(lead)]  # the leading axes broadcasting added, then stretched size-1 axes
    for i, n in enumerate(shape):
        if n == 1 and gshape[lead + i] != 1:
            axes.append(lead + i)
    if axes:
        g = red.OPS["sum"](g, axis=tuple(axes))
    return _reshaped(g, shape)


def _binary(ctx: GradContext, gx, gy):
    """Per-argument gradients of a broadcasting op, each summed to its argument's shape
    (``gx``/``gy`` are called only for the arguments that need one)."""
    x, y = ctx.args[:2]
    ins = ctx.inputs
    return (
        _sum_to(gx(), _shape(x)) if ins[0] is not None else None,
        _sum_to(gy(), _shape(y)) if ins[1] is not None else None,
    )


# -- elementwise -----------------------------------------------------------------------------
_LN2, _LN10 = math.log(2.0), math.log(10.0)
_GELU_C = math.sqrt(2 / math.pi)

_UNARY = {  # d out / d x from (x, out)
    "exp": lambda x, o: o,
    "expm1": lambda x, o: o + 1,
    "log": lambda x, o: 1 / x,
    "log1p": lambda x, o: 1 / (x + 1),
    "log2": lambda x, o: 1 / (x * _LN2),
    "log10": lambda x, o: 1 / (x * _LN10),
    "sqrt": lambda x, o: 0.5 / o,
    "rsqrt": lambda x, o: -0.5 * o / x,
    "square": lambda x, o: 2 * x,
    "reciprocal": lambda x, o: -(o * o),
    "sin": lambda x, o: EW["cos"](x),
    "cos": lambda x, o: -EW["sin"](x),
    "tan": lambda x, o: o * o + 1,
    "arctan": lambda x, o: 1 / (x * x + 1),
    "sinh": lambda x, o: EW["cosh"](x),
    "cosh": lambda x, o: EW["sinh"](x),
    "abs": lambda x, o: EW["sign"](x),
    "fabs": lambda x, o: EW["sign"](x),
    "arcsin": lambda x, o: EW["rsqrt"](1 - x * x),
    "arccos": lambda x, o: -EW["rsqrt"](1 - x * x),
    "arcsinh": lambda x, o: EW["rsqrt"](x * x + 1),
    "arccosh": lambda x, o: EW["rsqrt"](x * x - 1),
    "arctanh": lambda x, o: 1 / (1 - x * x),
    "cbrt": lambda x, o: 1 / (o * o * 3),
    "exp2": lambda x, o: o * _LN2,
}


# the derivatives above written in the output alone, and in both (the rest: the input alone);
# Note [What a node keeps]
_OF_OUTPUT = {"exp", "expm1", "sqrt", "reciprocal", "tan", "cbrt", "exp2"}
_OF_BOTH = {"rsqrt"}


# defined on an interval: outside it the output is NaN (numpy warned in the forward pass) and
# so is the derivative, computed without a second warning
_INTERVAL = {"arcsin", "arccos", "arccosh", "arctanh"}


def _unary(name: str):
    deriv = _UNARY[name]
    of_output = name in _OF_OUTPUT or name in _OF_BOTH

    def grad(ctx: GradContext, g):
        return (mul(g, deriv(ctx.args[0], ctx.out if of_output else None)),)

    def quiet(ctx: GradContext, g):
        with np.errstate(invalid="ignore", divide="ignore"):
            return grad(ctx, g)

    return quiet if name in _INTERVAL else grad


for _name in _UNARY:
    _reads = "output" if _name in _OF_OUTPUT else "all" if _name in _OF_BOTH else "inputs"
    gradient(_name, reads=_reads)(_unary(_name))


def _fused_unary(name: str, of_output: bool):
    """The gradient as one fused op (kernels/activations.py) instead of several: written in
    the op's output (tanh, sigmoid, relu) or its input (gelu, silu)."""
    op = GRAD_OPS[f"{name}_grad"]

    def grad(ctx: GradContext, g):
        return (op(g, ctx.out if of_output else ctx.args[0]),)

    return grad


# relu's gradient reads its output: relu(x) > 0 exactly where x > 0 (NaN in both: not > 0),
# so the node keeps the output, not the input (Note [What a node keeps])
for _name in ("tanh", "sigmoid", "relu"):
    gradient(_name, reads="output")(_fused_unary(_name, of_output=True))
for _name in ("gelu", "silu"):
    gradient(_name, reads="inputs")(_fused_unary(_name, of_output=False))


@gradient("tanh_grad")
def _tanh_grad(ctx, gg):  # of g * (1 - o^2)
    g, o = ctx.args
    return (
        GRAD_OPS["tanh_grad"](gg, o) if ctx.needs[0] else None,
        mul(mul(gg, g), mul(o, -2)) if ctx.needs[1] else None,
    )


@gradient("sigmoid_grad")
def _sigmoid_grad(ctx, gg):  # of g * o (1 - o)
    g, o = ctx.args
    return (
        GRAD_OPS["sigmoid_grad"](gg, o) if ctx.needs[0] else None,
        mul(mul(gg, g), sub(1, mul(o, 2))) if ctx.needs[1] else None,
    )


@gradient("negative", reads_values=False)
def _negative(ctx, g):
    return (-g,)


def _scaled(c: float):
    """The gradient of ``x * c``: deg2rad and radians, rad2deg and degrees (numpy has both)."""
    return lambda ctx, g: (mul(g, c),)


gradient("deg2rad", "radians", reads_values=False)(_scaled(math.pi / 180))
gradient("rad2deg", "degrees", reads_values=False)(_scaled(180 / math.pi))


@gradient("modf", reads_values=False)
def _modf(ctx, gs):  # (fractional, integral) part: d/dx 1 and 0, except at the integers
    return (gs[0],)


@gradient("positive", "conjugate", "real", reads_values=False)
def _identity(ctx, g):
    return (g,)


@gradient("relu_grad")
def _relu_grad(ctx, gg):  # of where(x > 0, g, 0): zero almost everywhere in x
    return (GRAD_OPS["relu_grad"](gg, ctx.args[1]) if ctx.needs[0] else None, None)


@gradient("gelu_grad")
def _gelu_grad(ctx, gg):  # of g gelu'(x)
    """With u = c (x + a x^3), t = tanh(u): gelu''(x) = (1 - t^2) (u' + 3ac x^2 - x t u'^2),
    u' = c (1 + 3a x^2)."""
    g, x = ctx.args
    dg = GRAD_OPS["gelu_grad"](gg, x) if ctx.needs[0] else None
    if not ctx.needs[1]:
        return dg, None
    x2 = x * x
    t = EW["tanh"](x * (_GELU_C + 0.044715 * _GELU_C * x2))
    du = _GELU_C + 0.134145 * _GELU_C * x2
    return dg, gg * g * ((1 - t * t) * (du + 0.134145 * _GELU_C * x2 - x * t * du * du))


@gradient("silu_grad")
def _silu_grad(ctx, gg):  # of g silu'(x); silu''(x) = s (1 - s) (2 + x (1 - 2s))
    g, x = ctx.args
    dg = GRAD_OPS["silu_grad"](gg, x) if ctx.needs[0] else None
    if not ctx.needs[1]:
        return dg, None
    s = EW["sigmoid"](x)
    return dg, gg * g * (s * (1 - s) * (2 + x * (1 - 2 * s)))


@gradient("add", reads_values=False)
def _add(ctx, g):
    x, y = ctx.args[:2]
    ins = ctx.inputs
    return (
        _sum_to(g, _shape(x)) if ins[0] is not None else None,
        _sum_to(g, _shape(y)) if ins[1] is not None else None,
    )


@gradient("subtract", reads_values=False)
def _subtract(ctx, g):
    return _binary(ctx, lambda: g, lambda: -g)


@gradient("multiply", reads="inputs")
def _multiply(ctx, g):
    x, y = ctx.args[:2]
    ins = ctx.inputs
    return (
        _sum_to(mul(g, y), _shape(x)) if ins[0] is not None else None,
        _sum_to(mul(g, x), _shape(y)) if ins[1] is not None else None,
    )


@gradient("divide", "true_divide")
def _divide(ctx, g):
    y = ctx.args[1]
    return _binary(ctx, lambda: div(g, y), lambda: -div(mul(g, ctx.out), y))


@gradient("power")
def _power(ctx, g):
    x, y = ctx.args[:2]

    def gx():
        if type(y) in (int, float) and y != 0:  # x ** 2, x ** 0.5: a Python exponent
            # y - 1 in Python, so it stays a weak scalar: float32 x keeps float32 (numpy 2
            # makes power(float32, <0-d int64 array>) float64, NEP 50)
            if y == 1:
                return g
            d = mul(x, y) if y == 2 else mul(EW["power"](x, y - 1), y)
            return mul(g, d)
        d = mul(y, EW["power"](x, sub(y, 1)))
        return where(EW["equal"](y, 0), 0, mul(g, d))  # x**0: no gradient (not 0 * inf)

    def gy():  # out * log(x), defined for x > 0 (0 elsewhere, as PyTorch does for x = 0)
        safe = where(x > 0, x, 1)
        return where(x > 0, mul(g, mul(ctx.out, EW["log"](safe))), 0)

    return _binary(ctx, gx, gy)


def _extreme_binary(first_wins):
    """maximum/minimum: the gradient goes to the winner; a tie splits it evenly."""

    def grad(ctx, g):
        x, y = ctx.args[:2]
        win, tie = first_wins(x, y), EW["equal"](x, y)
        half = mul(g, 0.5)
        return _binary(
            ctx,
            lambda: where(win, g, where(tie, half, 0)),
            lambda: where(win, 0, where(tie, half, g)),
        )

    return grad


gradient("maximum")(_extreme_binary(lambda x, y: EW["greater"](x, y)))
gradient("minimum")(_extreme_binary(lambda x, y: EW["less"](x, y)))
# fmax/fmin drop a NaN: the other argument wins there
gradient("fmax")(
    _extreme_binary(lambda x, y: EW["logical_or"](EW["greater"](x, y), EW["isnan"](y)))
)
gradient("fmin")(_extreme_binary(lambda x, y: EW["logical_or"](EW["less"](x, y), EW["isnan"](y))))


@gradient("mod")
def _mod(ctx, g):
    x, y = ctx.args[:2]
    return _binary(ctx, lambda: g, lambda: -mul(g, EW["floor_divide"](x, y)))


@gradient("fmod")
def _fmod(ctx, g):  # x - trunc(x / y) * y, whose quotient is exactly (x - out) / y
    x, y = ctx.args[:2]
    return _binary(ctx, lambda: g, lambda: -mul(g, EW["rint"](div(sub(x, ctx.out), y))))


@gradient("divmod")
def _divmod(ctx, gs):  # (floor_divide, mod): the quotient is piecewise constant
    gr, q = gs[1], ctx.out[0]
    return _binary(ctx, lambda: gr, lambda: -mul(gr, q))


@gradient("float_power")
def _float_power(ctx, g):
    """As power's, in float64; d/dy is out * log(x): NaN for x < 0 (no real power near
    there), 0 at x = 0 (as power's)."""
    x, y = ctx.args[:2]

    def gx():
        d = mul(y, NUMPY_ONLY_OPS["float_power"](x, sub(y, 1)))
        return where(EW["equal"](y, 0), 0, mul(g, d))

    def gy():
        zero = EW["equal"](x, 0)
        return where(zero, 0, mul(g, mul(ctx.out, EW["log"](where(zero, 1, x)))))

    return _binary(ctx, gx, gy)


@gradient("copysign", reads="inputs")
def _copysign(ctx, g):  # |x| with y's sign: d/dx sign(x), flipped where y's sign bit is set
    x, y = ctx.args[:2]

    def gx():
        gs = mul(g, EW["sign"](x))
        return where(EW["signbit"](y), -gs, gs)

    return _binary(ctx, gx, lambda: creation.zeros_like(y))  # y's sign only: zero


@gradient("hypot")
def _hypot(ctx, g):
    x, y = ctx.args[:2]
    return _binary(ctx, lambda: div(mul(g, x), ctx.out), lambda: div(mul(g, y), ctx.out))


def _logaddexp(exp):
    """logaddexp(x, y) = log(exp(x) + exp(y)): d/dx exp(x - out) (exp2 for logaddexp2)."""

    def grad(ctx, g):
        x, y = ctx.args[:2]
        return _binary(
            ctx, lambda: mul(g, exp(sub(x, ctx.out))), lambda: mul(g, exp(sub(y, ctx.out)))
        )

    return grad


gradient("logaddexp")(_logaddexp(EW["exp"]))
gradient("logaddexp2")(_logaddexp(EW["exp2"]))


@gradient("ldexp", reads="inputs")
def _ldexp(ctx, g):  # x * 2**i: d/dx 2**i; the exponent i is an integer (no gradient)
    x, i = ctx.args[:2]
    return (_sum_to(NUMPY_ONLY_OPS["ldexp"](g, i), _shape(x)) if ctx.needs[0] else None, None)


@gradient("arctan2")
def _arctan2(ctx, g):
    y, x = ctx.args[:2]  # np.arctan2(y, x)
    r2 = add(mul(x, x), mul(y, y))
    return _binary(ctx, lambda: div(mul(g, x), r2), lambda: -div(mul(g, y), r2))


@gradient("where", reads="inputs")
def _where(ctx, g):
    c, x, y = ctx.args
    return (
        None,
        _sum_to(where(c, g, 0), _shape(x)) if ctx.needs[1] else None,
        _sum_to(where(c, 0, g), _shape(y)) if ctx.needs[2] else None,
    )


@gradient("clip", reads="inputs")
def _clip(ctx, g):
    """clip = minimum(maximum(x, lo), hi): x gets g inside the bounds, a bound where it won."""
    x, lo, hi = ctx.args
    inside = EW["logical_and"](
        True if lo is None else EW["greater_equal"](x, lo),
        True if hi is None else EW["less_equal"](x, hi),
    )
    out = [_sum_to(where(inside, g, 0), x.shape) if ctx.needs[0] else None, None, None]
    if ctx.needs[1] and lo is not None:
        below = EW["less"](x, lo) if hi is None else EW["logical_and"](x < lo, lo <= hi)
        out[1] = _sum_to(where(below, g, 0), _shape(lo))
    if ctx.needs[2] and hi is not None:
        above = EW["greater"](x, hi) if lo is None else EW["logical_or"](x > hi, lo > hi)
        out[2] = _sum_to(where(above, g, 0), _shape(hi))
    return out


@gradient("astype", reads_values=False)
def _astype(ctx, g):
    return (g.astype(ctx.args[0].dtype),)


# -- linalg ----------------------------------------------------------------------------------
@gradient("matmul", reads="inputs")
def _matmul(ctx, g):
    attrs = ctx.attrs
    x, y = ctx.args
    if not attrs and len(_shape(x)) == 2 == len(_shape(y)):  # matrices, spelled out
        ins = ctx.inputs
        return (
            _MATMUL(g, y, trans_x=False, trans_y=True) if ins[0] is not None else None,
            _MATMUL(x, g, trans_x=True, trans_y=False) if ins[1] is not None else None,
        )
    needs = ctx.needs
    return _matmul_grads(
        x, y, g, needs[0], needs[1], attrs.get("trans_x", False), attrs.get("trans_y", False)
    )


def _matmul_grads(x, y, g, need_x: bool, need_y: bool, trans_x: bool, trans_y: bool):
    """Gradients of ``matmul(x, y, trans_x, trans_y)`` (None where not needed)."""
    sx, sy = _shape(x), _shape(y)
    tx = trans_x and len(sx) >= 2
    ty = trans_y and len(sy) >= 2
    x2 = sh.expand_dims(x, 0) if len(sx) == 1 else x  # 1-D operands as matrices, as numpy does
    y2 = sh.expand_dims(y, -1) if len(sy) == 1 else y
    g2 = sh.expand_dims(g, -1) if len(sy) == 1 else g  # y first: 1-D @ 1-D has a 0-d g
    g2 = sh.expand_dims(g2, -2) if len(sx) == 1 else g2
    gx = gy = None
    if need_x:
        if tx:  # out = x^T y^(T?): dx = (g y'^T)^T
            gx = _MATMUL(y2, g2, trans_x=ty, trans_y=True)
        elif ty:  # out = x y^T: dx = g y
            gx = _MATMUL(g2, y2)
        else:
            gx = _MATMUL(g2, y2, trans_x=False, trans_y=True)
        if gx.shape != sx:  # batch axes broadcast, or a 1-D operand
            gx = _reshaped(_sum_to(gx, _shape(x2)), sx)
    if need_y:
        if ty:  # out = x'^(T?) y^T: dy = (x'^T g)^T
            gy = _MATMUL(g2, x2, trans_x=True, trans_y=tx)
        elif tx:  # out = x^T y: dy = x g
            gy = _MATMUL(x2, g2)
        else:
            gy = _MATMUL(x2, g2, trans_x=True, trans_y=False)
        if gy.shape != sy:
            gy = _reshaped(_sum_to(gy, _shape(y2)), sy)
    return gx, gy


@gradient("linear", reads="inputs")
def _linear(ctx, g):
    """x @ w + b: matmul's gradients, and g summed over every axis but the last for b."""
    x, w, b = ctx.args
    needs = ctx.needs
    n = len(_shape(x))
    if n == 2:  # the common case, spelled out: g w^T and x^T g
        gx = _MATMUL(g, w, trans_x=False, trans_y=True) if needs[0] else None
        gw = _MATMUL(x, g, trans_x=True, trans_y=False) if needs[1] else None
    elif n > 2 and _shape(g)[:-1] == _shape(x)[:-1]:  # (batch, ..., in) rows
        gx = _MATMUL(g, w, trans_x=False, trans_y=True) if needs[0] else None
        # x^T g over every row at once: one GEMM, not one per batch and then a sum
        lead = "abcdefghijklmnopqrstuvwx"[: n - 1]
        gw = la.einsum(f"{lead}y,{lead}z->yz", x, g) if needs[1] else None
    else:  # a 1-D input, or batch axes to sum over
        gx, gw = _matmul_grads(x, w, g, needs[0], needs[1], False, False)
    return gx, gw, _sum_to(g, _shape(b)) if needs[2] else None


def _einsum_grads(equation: str, args: tuple, needs, g):
    """Gradients of ``np.einsum(equation, *args)``: operand i's is the einsum of g with the
    other operands onto i's subscripts; letters only operand i has are broadcast back."""
    shapes = [_shape(a) for a in args]
    subs, out = parse_equation(equation, [len(s) for s in shapes])
    sizes: dict[str, int] = {}
    for s, shp in zip(subs, shapes):
        for c, n in zip(s, shp):
            sizes[c] = max(sizes.get(c, 1), n)
    grads = []
    for i, (s, shp) in enumerate(zip(subs, shapes)):
        if not needs[i]:
            grads.append(None)
            continue
        if len(set(s)) != len(s):
            raise NotImplementedError(
                f"einsum {equation!r}: no gradient for an operand with a repeated subscript "
                "(a diagonal)"
            )
        others = [(t, a) for j, (t, a) in enumerate(zip(subs, args)) if j != i]
        seen = set(out) | {c for t, _ in others for c in t}
        target = "".join(c for c in s if c in seen)
        eq = ",".join([out] + [t for t, _ in others]) + "->" + target
        gi = la.einsum(eq, g, *[a for _, a in others])
        if target != s:  # letters only this operand has: each item got the same gradient
            full = tuple(sizes[c] if c in seen else 1 for c in s)
            gi = sh.broadcast_to(sh.reshape(gi, full), tuple(sizes[c] for c in s))
        grads.append(_sum_to(gi, shp) if gi.shape != shp else gi)
    return grads


@gradient("einsum", reads="inputs")
def _einsum(ctx, g):
    return _einsum_grads(ctx.attrs["equation"], ctx.args, ctx.needs, g)


@gradient("dot", reads="inputs")
def _dot(ctx, g):
    x, y = ctx.args
    nx, ny = len(_shape(x)), len(_shape(y))
    if nx == 0 or ny == 0:
        return _multiply(ctx, g)
    a = "abcdefghijklm"[:nx]
    b = "nopqrstuvwxyz"[:ny]
    if ny == 1:  # sum over the last axis of x and the only axis of y
        b = a[-1]
        eq = f"{a},{b}->{a[:-1]}"
    else:  # last axis of x with the second-to-last of y
        b = b[: ny - 2] + a[-1] + b[ny - 1 :]
        eq = f"{a},{b}->{a[:-1]}{b[: ny - 2]}{b[-1]}"
    return _einsum_grads(eq, ctx.args, ctx.needs, g)


@gradient("outer", reads="inputs")
def _outer(ctx, g):
    x, y = ctx.args
    fx, fy = sh.ravel(x), sh.ravel(y)
    return (
        sh.reshape(la.matmul(g, fy), _shape(x)) if ctx.needs[0] else None,
        sh.reshape(la.matmul(fx, g), _shape(y)) if ctx.needs[1] else None,
    )


# -- reductions ------------------------------------------------------------------------------
def _reduced(ctx) -> tuple[int, ...]:
    return red._axes(ctx.attrs.get("axis"), ctx.args[0].ndim)


def _spread(ctx, g, scale: float | None = None):
    """``g`` (of the reduction's output) broadcast back to the input's shape (times
    ``scale`` > 0, in the same op)."""
    shape = ctx.args[0].shape
    if g._spec.shape and not ctx.attrs.get("keepdims", False):  # a 0-d g broadcasts as it is
        axes = _reduced(ctx)
        g = _reshaped(g, tuple(1 if a in axes else n for a, n in enumerate(shape)))
    if scale is None:
        return _BROADCAST_TO(g, shape=shape)  # a DistTensor's shape: a tuple of ints already
    return _BROADCAST_TO(g, shape=shape, scale=scale)


@gradient("sum", reads_values=False)
def _sum(ctx, g):
    return (_spread(ctx, g),)


@gradient("mean", reads_values=False)
def _mean(ctx, g):
    shape = ctx.args[0].shape
    axis = ctx.attrs.get("axis")
    count = math.prod(shape) if axis is None else math.prod([shape[a] for a in _reduced(ctx)])
    return (_spread(ctx, g, 1.0 / count) if count else _spread(ctx, g),)


def _extreme(ctx, g):
    """max/min: the gradient is shared evenly by the items equal to the result."""
    x = ctx.args[0]
    hit = EW["equal"](x, _spread(ctx, ctx.out))
    count = red.sum(hit.astype(x.dtype), _reduced(ctx), keepdims=True)
    return (where(hit, div(_spread(ctx, g), count), 0),)


gradient("max", "min")(_extreme)


@gradient("prod")
def _prod(ctx, g):
    """Product of the other items, exact with zeros: one zero gets the product of the rest,
    two or more make every gradient zero."""
    x = ctx.args[0]
    axes = _reduced(ctx)
    zero = EW["equal"](x, 0)
    nonzero = where(zero, 1, x)
    rest = red.prod(nonzero, axes, keepdims=True)
    zeros = red.sum(zero.astype(np.int64), axes, keepdims=True)
    gs = _spread(ctx, g)
    grad = where(
        EW["equal"](zeros, 0),
        div(mul(gs, rest), nonzero),
        where(EW["logical_and"](EW["equal"](zeros, 1), zero), mul(gs, rest), 0),
    )
    return (grad,)


# -- shape ops -------------------------------------------------------------------------------
@gradient("reshape", "expand_dims", "squeeze", reads_values=False)
def _reshape_back(ctx, g):
    return (sh.reshape(g, ctx.args[0].shape),)


@gradient("transpose", reads_values=False)
def _transpose(ctx, g):
    axes = ctx.attrs.get("axes")
    if axes is None:
        return (sh.transpose(g),)
    nd = ctx.args[0].ndim
    return (sh.transpose(g, tuple(int(i) for i in np.argsort([a % nd for a in axes]))),)


@gradient("swapaxes", reads_values=False)
def _swapaxes(ctx, g):
    return (sh.swapaxes(g, ctx.attrs["axis1"], ctx.attrs["axis2"]),)


@gradient("broadcast_to", reads_values=False)
def _broadcast_to(ctx, g):
    scale = ctx.attrs.get("scale")
    g = _sum_to(g, ctx.args[0].shape)
    return (g if scale is None else mul(g, scale),)


@gradient("tile", reads_values=False)
def _tile(ctx, g):
    x = ctx.args[0]
    reps = ctx.attrs["reps"]
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    d = max(x.ndim, len(reps))
    shp = (1,) * (d - x.ndim) + x.shape
    reps = (1,) * (d - len(reps)) + reps
    inter = tuple(v for r, n in zip(reps, shp) for v in (r, n))
    g = red.sum(sh.reshape(g, inter), tuple(range(0, 2 * d, 2)))
    return (sh.reshape(g, x.shape),)


@gradient("repeat", reads_values=False)
def _repeat(ctx, g):
    x = ctx.args[0]
    axis, repeats = ctx.attrs["axis"] % x.ndim, ctx.attrs["repeats"]
    n = x.shape[axis]
    if isinstance(repeats, tuple) and len(repeats) == 1:
        repeats = repeats[0]
    if isinstance(repeats, int):  # each item's copies are consecutive
        split = x.shape[:axis] + (n, repeats) + x.shape[axis + 1 :]
        return (red.sum(sh.reshape(g, split), axis + 1),)
    owner = np.repeat(np.arange(n), repeats)  # output position -> input item
    onehot = backend.constant(g, (owner[:, None] == np.arange(n)[None, :]).astype(g.dtype))
    letters = "abcdefghijklmnopqrstuvwx"[: x.ndim]
    src = letters[:axis] + "y" + letters[axis + 1 :]
    return (la.einsum(f"{src},yz->{letters[:axis]}z{letters[axis + 1 :]}", g, onehot),)


@gradient("split", reads_values=False)
def _split(ctx, gs):
    return (sh.concatenate(list(gs), ctx.attrs["axis"]),)


@gradient("concatenate", reads_values=False)
def _concatenate(ctx, g):
    axis = ctx.attrs["axis"] % g.ndim
    out, start = [], 0
    for a, need in zip(ctx.args, ctx.needs):
        n = _shape(a)[axis]
        key = (slice(None),) * axis + (slice(start, start + n),)
        out.append(sh.getitem(g, key) if need else None)
        start += n
    return out


@gradient("stack", reads_values=False)
def _stack(ctx, g):
    axis = ctx.attrs["axis"] % g.ndim
    lead = (slice(None),) * axis
    return [sh.getitem(g, (*lead, i)) if need else None for i, need in enumerate(ctx.needs)]


@gradient("getitem", reads_values=False)
def _getitem(ctx, g):
    x = ctx.args[0]
    return (sh.OPS["getitem_grad"](g, key=ctx.attrs["key"], shape=x.shape),)


@gradient("getitem_grad", reads_values=False)
def _getitem_grad(ctx, g):  # linear: the gradient of a scatter is the gather
    return (sh.OPS["getitem"](g, key=ctx.attrs["key"]),)


# -- nn --------------------------------------------------------------------------------------
def _sum_over(g, axes):
    return red.sum(g, axes) if axes else g


@lru_cache(maxsize=1024)
def _rows_spec(spec: DistSpec, ndim: int) -> DistSpec:
    """``spec`` on its first ``ndim`` axes: the layout of row statistics of a tensor laid out
    as ``spec`` whose other axes are whole (Note [Saved for backward] in dispatch.py)."""
    return spec.replace(shape=spec.shape[:ndim])


def _saved(ctx, spec: DistSpec) -> tuple:
    """``ctx.extra``'s arrays as DistTensors of ``spec``; empty shards on a rank outside the
    mesh, which holds none (its kernel was skipped)."""
    if ctx.extra is not None:
        return tuple(DistTensor(a, spec) for a in ctx.extra)
    xp = backend.xp(ctx.saved)
    return tuple(DistTensor(xp.empty(spec.local_shape(None), spec.dtype), spec) for _ in (0, 1))


@gradient("layer_norm", reads="inputs")
def _layer_norm(ctx, g):
    """The fused op's gradient: one fused kernel from the forward's row mean and rstd (its
    normalized axes are whole, so their statistics are local)."""
    x, w, b = ctx.args
    needs = ctx.needs
    begin = ctx.attrs["begin_norm_axis"]
    wants = "x" * needs[0] + "w" * (w is not None and needs[1]) + "b" * (b is not None and needs[2])
    if not wants:
        return None, None, None
    spec = ctx.out_specs[0]
    stats = spec.replace(dtype=np.result_type(x.dtype, 1.0))  # the forward's (kernels/)
    mean, rstd = _saved(ctx, _rows_spec(stats, begin))
    args = (g, x, mean, rstd) if w is None else (g, x, mean, rstd, w)
    outs = nn.LAYER_NORM_GRAD(*args, begin_norm_axis=begin, wants=wants)
    found = dict(zip(wants, outs if len(wants) > 1 else (outs,)))
    return found.get("x"), found.get("w"), found.get("b")


@gradient("embedding", reads="inputs")
def _embedding(ctx, g):
    ids, w = ctx.args
    if not ctx.needs[1]:
        return None, None
    like = tuple(w.placements) if isinstance(w, DistTensor) else ()
    return None, nn.EMBEDDING_GRAD(ids, g, vocab=w.shape[0], like=like)


@gradient("embedding_grad")
def _embedding_grad(ctx, g):  # linear in its rows: the gradient of a scatter-add is a lookup
    ids = ctx.args[0]
    return None, nn.embedding(ids, g)


def _onehot(labels, axis: int, classes: int, ndim: int):
    """Bool tensor, True at each label along ``axis`` (labels broadcast along it)."""
    labels = where(EW["less"](labels, 0), add(labels, classes), labels)
    shape = [1] * ndim
    shape[axis] = classes
    return EW["equal"](
        sh.expand_dims(labels, axis), backend.constant(labels, np.arange(classes).reshape(shape))
    )


@gradient("cross_entropy", reads="inputs")
def _cross_entropy(ctx, g):
    """One fused kernel from the forward's row shift and sum of exponentials."""
    logits, labels = ctx.args
    if not ctx.needs[0]:
        return None, None
    shift, sum_exp = _saved(ctx, ctx.out_specs[0])
    return nn.CROSS_ENTROPY_GRAD(logits, labels, shift, sum_exp, g, axis=ctx.attrs["axis"]), None


@gradient("take_labels", reads="inputs")
def _take_labels(ctx, g):
    x, labels = ctx.args
    axis = ctx.attrs["axis"]
    hot = _onehot(labels, axis, x.shape[axis], x.ndim)
    return where(hot, sh.expand_dims(g, axis), 0), None


# -- softmax, log_softmax, logsumexp (ops/reduction.py), attention_softmax (ops/nn.py) ---------
# The fused ops' gradients are one fused op each, from the forward's output (and input, for
# logsumexp); the gradients of those are written with dt ops.
@gradient("softmax", reads="output")
def _softmax(ctx, g):
    return (red.SOFTMAX_GRAD(g, ctx.out, axis=ctx.attrs.get("axis", -1)),)


@gradient("attention_softmax", reads="output")
def _attention_softmax(ctx, g):  # Note [Attention scores] in ops/nn.py
    return (red.SOFTMAX_GRAD(g, ctx.out, axis=-1, scale=ctx.attrs.get("scale", 1.0)),)


@gradient("log_softmax", reads="output")
def _log_softmax(ctx, g):
    return (red.LOG_SOFTMAX_GRAD(g, ctx.out, axis=ctx.attrs.get("axis", -1)),)


@gradient("logsumexp")
def _logsumexp(ctx, g):
    attrs = {"axis": ctx.attrs.get("axis"), "keepdims": ctx.attrs.get("keepdims", False)}
    return (red.LOGSUMEXP_GRAD(g, ctx.args[0], ctx.out, **attrs),)


@gradient("softmax_grad")
def _softmax_grad(ctx, gg):
    """Of ``dx = scale * y * (g - sum(g * y))``: in g the same map (it is symmetric); in y
    ``scale * (gg * (g - sum(g * y)) - g * sum(gg * y))``."""
    g, y = ctx.args
    scale = ctx.attrs.get("scale", 1.0)
    axes = red._axes(ctx.attrs.get("axis", -1), y.ndim)
    gy = None
    if ctx.needs[1]:
        s, t = (red.sum(mul(a, y), axes, keepdims=True) for a in (g, gg))
        gy = sub(mul(gg, sub(g, s)), mul(g, t))
        gy = gy if scale == 1.0 else mul(gy, scale)
    return (red.SOFTMAX_GRAD(gg, y, **ctx.attrs) if ctx.needs[0] else None), gy


@gradient("log_softmax_grad")
def _log_softmax_grad(ctx, gg):
    """Of ``dx = g - exp(y) * sum(g)``: in g ``gg - sum(gg * exp(y))``, in y
    ``-gg * exp(y) * sum(g)``."""
    g, y = ctx.args
    axes = red._axes(ctx.attrs.get("axis", -1), y.ndim)
    e = mul(gg, EW["exp"](y))
    gg_g = sub(gg, red.sum(e, axes, keepdims=True)) if ctx.needs[0] else None
    gg_y = -mul(e, red.sum(g, axes, keepdims=True)) if ctx.needs[1] else None
    return gg_g, gg_y


@gradient("logsumexp_grad")
def _logsumexp_grad(ctx, gg):
    """Of ``dx = g * exp(x - out)`` (g and out per row): in g ``sum(gg * exp(x - out))``, in
    x ``gg * dx``, in out ``-sum(gg * dx)``."""
    _, x, out = ctx.args
    axis, keepdims = ctx.attrs.get("axis"), ctx.attrs.get("keepdims", False)
    axes = red._axes(axis, x.ndim)
    gx = mul(gg, ctx.out)
    grad_g = grad_out = None
    if ctx.needs[0]:
        kept = _reshaped(out, red._kept_shape(x.shape, axes))
        grad_g = red.sum(mul(gg, EW["exp"](sub(x, kept))), axes, keepdims=keepdims)
    if ctx.needs[2]:
        grad_out = -red.sum(gx, axes, keepdims=keepdims)
    return grad_g, gx if ctx.needs[1] else None, grad_out


# -- scans (ops/scan.py) -----------------------------------------------------------------------
def _as_input_dtype(gx, x):
    """A gradient computed in a scan's ``dtype=`` cast back to its input's dtype."""
    return gx if gx.dtype == x.dtype else EW["astype"](gx, x.dtype)


@gradient("cumsum", reads_values=False)
def _cumsum(ctx, g):
    """The reverse cumsum of ``g`` (one more scan: on a split axis one small all-gather)."""
    from .scan import scan

    axis, reverse = ctx.attrs.get("axis", 0), ctx.attrs.get("reverse", False)
    return (_as_input_dtype(scan("sum", g, axis, reverse=not reverse), ctx.args[0]),)


@gradient("cumprod")
def _cumprod(ctx, g):
    """d/dx_i of sum_j g_j y_j is sum_{j >= i} g_j y_j / x_i where x_i != 0, exact with zeros:
    at the first zero along the axis it is the reverse cumsum of g times the cumprod with that
    zero read as 1; later items (zero or not) get zero, as their products all hold it."""
    from .scan import scan

    x, y = ctx.args[0], ctx.out
    axis, dtype = ctx.attrs.get("axis", 0), ctx.attrs.get("dtype")
    zero = EW["equal"](x, 0)
    first = EW["logical_and"](zero, EW["equal"](scan("sum", zero, axis), 1))
    y1 = scan("prod", where(first, 1, x), axis, dtype)
    before = div(scan("sum", mul(g, y), axis, reverse=True), where(zero, 1, x))
    at_zero = scan("sum", mul(g, y1), axis, reverse=True)
    return (_as_input_dtype(where(zero, at_zero, before), x),)


# -- layout ops (ops/layout.py) ----------------------------------------------------------------
@gradient("remap", reads_values=False)
def _remap(ctx, g):
    """The inverse map: the same exchange back (Note [Boxes by index maps])."""
    x = ctx.args[0]
    maps = lay.inverse_maps(ctx.attrs["maps"], x.shape)
    return (lay.remap(g, maps, x.shape),)


@gradient("join", reads_values=False)
def _join(ctx, g):
    """Each input's slot of g (Note [Joins along a split axis]): the same exchange back."""
    axis, start, out = ctx.attrs["axis"], 0, []
    for size, need in zip(ctx.attrs["sizes"], ctx.needs):
        out.append(lay.crop(g, axis, start, size) if need else None)
        start += size
    return out


@gradient("diff", reads_values=False)
def _diff(ctx, g):
    """diff is linear; the adjoint of one difference is ``-diff(pad(g, 1, 1))``."""
    axis, n = ctx.attrs["axis"], ctx.attrs["n"]
    length = ctx.args[0].shape[axis]
    if n >= length:  # the result is empty along the axis: a zero gradient of x's length
        return (lay.shift_axis(g, axis, 0, length),)
    for _ in range(n):
        g = -lay.diff(lay.shift_axis(g, axis, 1, 1), 1, axis)
    return (g,)


def _triangle(name: str):
    def grad(ctx, g):  # the same mask: tril/triu are projections
        return (lay.OPS[name](g, k=ctx.attrs.get("k", 0)),)

    return grad


gradient("tril", reads_values=False)(_triangle("tril"))
gradient("triu", reads_values=False)(_triangle("triu"))


@gradient("diagonal", reads_values=False)
def _diagonal(ctx, g):
    """The diagonal written into zeros (Note [Diagonals of split matrices])."""
    x = ctx.args[0]
    return (lay.diag_embed(g, ctx.attrs.get("offset", 0), x.shape[-2:]),)


@gradient("diag_embed", reads_values=False)
def _diag_embed(ctx, g):
    return (lay.OPS["diagonal"](g, offset=ctx.attrs.get("offset", 0)),)


@gradient("take_along_axis")
def _take_along_axis(ctx, g):
    """g added back at the indices (repeated indices accumulate), summed over the axes
    along which arr was broadcast."""
    arr, idx = ctx.args
    if not ctx.needs[0]:
        return None, None
    axis = ctx.attrs["axis"]
    if _shape(idx) != g.shape:
        if isinstance(idx, DistTensor):
            idx = sh.broadcast_to(idx, g.shape)
        else:
            xp = backend.xp(idx)  # a host or device index array, as the shards are
            idx = xp.ascontiguousarray(xp.broadcast_to(idx, g.shape))
    gx = lay.OPS["take_along_axis_grad"](g, idx, axis=axis, length=arr.shape[axis])
    return _sum_to(gx, arr.shape), None


@gradient("take_along_axis_grad")
def _take_along_axis_grad(ctx, gg):  # linear in g: its gradient is the gather
    idx = ctx.args[1]
    return lay.OPS["take_along_axis"](gg, idx, axis=ctx.attrs["axis"]), None
