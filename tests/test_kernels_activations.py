"""kernels/activations.py (Note [Fused activations]): every reference against the composite
expression disttensor computed before (``former_*``, written out here) on awkward sizes,
layouts and magnitudes; float32 computed in float32 only; the inputs the fast route does not
take (other dtypes, a broadcasting or promoting gradient) give numpy's own result; the CUDA
kernels through their loader against the references on each backend present (the GPU, and
the CPU emulation of kernels/emulate.py); and dt's ops and gradients running them.

nvcc compiling activations.cu, the loaders' signatures and the docstring examples are checked
by tests/test_kernels.py, which covers every entry of kernels.KERNELS.
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import kernel_devices
import numpy as np
import pytest
from precision import assert_float32_only

import disttensor as dt
from kernels import KERNELS
from kernels import activations as act

C = math.sqrt(2 / math.pi)
F32, F64 = np.float32, np.float64
dtypes = pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])


# -- the composites disttensor ran before (ops/elementwise.py, ops/gradients.py) ----------------
def former_sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(np.result_type(x, 1.0), copy=False)


def former_gelu(x):
    c = np.sqrt(2 / np.pi).astype(np.result_type(x, 1.0))
    return 0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x**3)))


def former_gelu_grad(g, x):
    t = np.tanh(C * (x + 0.044715 * x * x * x))
    return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C * (1 + 0.134145 * x * x))


def former_silu_grad(g, x):
    s = former_sigmoid(x)
    return g * (s * (1 + x * (1 - s)))


FORMER = {
    "gelu_forward": former_gelu,
    "gelu_backward": former_gelu_grad,
    "silu_forward": lambda x: x * former_sigmoid(x),
    "silu_backward": former_silu_grad,
    "sigmoid_forward": former_sigmoid,
    "sigmoid_backward": lambda g, y: g * (y * (1 - y)),
    "tanh_backward": lambda g, y: g * (1 - y * y),
    "relu_backward": lambda g, x: np.where(x > 0, g, 0),
}
FORWARDS = ["gelu_forward", "silu_forward", "sigmoid_forward"]
BACKWARDS = [n for n in FORMER if n not in FORWARDS]
EXACT = {"sigmoid_backward", "tanh_backward", "relu_backward"}  # the former operations, in order
OF_OUTPUT = {"sigmoid_backward": former_sigmoid, "tanh_backward": np.tanh}  # what y is
assert set(FORMER) == set(act.REFERENCES)


def test_the_kernel_is_registered():
    k = KERNELS["activations"]
    assert k.source == "activations.cu" and dict(k.references) == act.REFERENCES


# -- data -----------------------------------------------------------------------------------------
SHAPES = {
    "0-d": (),
    "one": (1,),
    "column": (9, 1),
    "row": (1, 9),
    "empty": (0,),
    "empty rows": (0, 5),
    "odd": (7, 33),
    "wide": (3, 1025),
}


def layouts(a: np.ndarray, put=lambda a: a) -> dict[str, np.ndarray]:
    """``a`` C-contiguous, at an odd offset (contiguous, not 16-byte aligned), transposed,
    strided and reversed: views of arrays ``put`` makes (a device's), the same values each."""
    out = {"contiguous": put(a)}
    if a.size:
        out["offset"] = put(np.concatenate([a.ravel()[:1], a.ravel()]))[1:].reshape(a.shape)
    if a.ndim == 2:
        out["transposed"] = put(np.ascontiguousarray(a.T)).T
        wide = np.zeros((a.shape[0], 2 * a.shape[1]), a.dtype)
        wide[:, ::2] = a
        out["strided"] = put(wide)[:, ::2]
    if a.ndim >= 1:
        out["reversed"] = put(a[::-1].copy())[::-1]
    return out


def laid_out(args, put=lambda a: a):
    """(labels, argument tuples): every argument in each layout its shape has."""
    views = [layouts(a, put) for a in args]
    labels = list(views[0])
    return labels, [tuple(v[k] for v in views) for k in labels]


def inputs(name: str, shape, dtype, scale=4.0, seed=0):
    """Arguments of reference ``name``: x of both signs, g in [-1, 1], y = the forward output
    where the gradient is written in it."""
    rng = np.random.default_rng([seed, len(shape), *shape])
    x = np.asarray(scale * rng.standard_normal(shape), dtype)  # 0-d: an array, not a scalar
    if name in FORWARDS:
        return (x,)
    g = np.asarray(rng.uniform(-1, 1, shape), dtype)
    return (g, np.asarray(OF_OUTPUT[name](x), dtype)) if name in OF_OUTPUT else (g, x)


def call(fn, args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value warnings
        return np.asarray(fn(*args))


def f64_truth(name, args):
    """The former composite evaluated in float64 on the same values."""
    with np.errstate(all="ignore"):
        return np.asarray(FORMER[name](*(a.astype(F64) for a in args)))


# float32 against the float64 composite: a few ulps, and the absolute error of a gradient
# whose tanh rounds near +-1 (|x q| ulp(t) in gelu's, where x q reaches ~60 at |x| = 10)
F32_TOL = {"rtol": 1e-6, "atol": 3e-6}
F64_TOL = {"rtol": 1e-13, "atol": 1e-13}


def assert_bits(got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), f"max difference {np.nanmax(np.abs(got - want))}"


# -- the references against the former composites ------------------------------------------------
@dtypes
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("name", FORMER)
def test_reference_is_the_former_composite(name, shape, dtype):
    ref = act.REFERENCES[name]
    for layout, args in zip(*laid_out(inputs(name, shape, dtype))):
        before = [a.copy() for a in args]
        got = call(ref, args)
        for a, b in zip(args, before):
            assert_bits(a, b)  # the inputs are not written
        assert got.dtype == dtype and got.shape == shape, layout
        want = np.asarray(FORMER[name](*args))
        if name in EXACT:
            assert_bits(got, want)
        elif dtype == F64:
            np.testing.assert_allclose(got, want, **F64_TOL, err_msg=layout)
        else:
            np.testing.assert_allclose(got, f64_truth(name, args), **F32_TOL, err_msg=layout)


@pytest.mark.parametrize("name", [n for n in FORMER if n not in EXACT])
def test_float32_is_as_accurate_as_the_former_composite(name):
    """Over [-15, 15] the float32 kernel's largest error (against float64) is the float32
    composite's, at most twice it."""
    x = np.linspace(-15, 15, 30001, dtype=F32)
    args = (x,) if name in FORWARDS else (np.ones_like(x), x)
    truth = f64_truth(name, args)
    with np.errstate(all="ignore"):
        former = np.abs(FORMER[name](*args) - truth).max()
    assert np.abs(call(act.REFERENCES[name], args) - truth).max() <= 2 * former


LARGE = {  # |x| the forward must take without a warning, NaN or overflow, per dtype
    "gelu": {F32: 1e4, F64: 1e4},
    "silu": {F32: 3e38, F64: 1e308},
    "sigmoid": {F32: 3e38, F64: 1e308},
}


@dtypes
@pytest.mark.parametrize("op", LARGE)
def test_large_magnitudes(op, dtype):
    top = LARGE[op][dtype]
    mag = np.geomspace(1.0, top, 60)
    x = np.concatenate([-mag[::-1], [0.0], mag, [30.0, -30.0, 100.0, -100.0, 800.0, -800.0]])
    x = x.astype(dtype)
    g = np.linspace(-1, 1, x.size, dtype=dtype)
    fwd = call(act.REFERENCES[f"{op}_forward"], (x,))
    second = fwd if op == "sigmoid" else x
    back = call(act.REFERENCES[f"{op}_backward"], (g, second))
    for got in (fwd, back):
        assert np.isfinite(got).all()
    tol = F32_TOL if dtype == F32 else F64_TOL
    # sigmoid and silu keep their relative accuracy on the far left (exp's tail); gelu's
    # 1 + tanh(u) there is a cancellation in its formula, as in the former one
    atol = tol["atol"] if op == "gelu" else 1e-30
    np.testing.assert_allclose(fwd, f64_truth(f"{op}_forward", (x,)), rtol=tol["rtol"], atol=atol)
    np.testing.assert_allclose(back, f64_truth(f"{op}_backward", (g, second)), **tol)
    right, left = x > 100, x < -100
    if op == "sigmoid":
        np.testing.assert_array_equal(fwd[right], 1.0)
        np.testing.assert_array_equal(back[right | left], 0.0)
    else:  # gelu and silu: x on the far right, ~0 on the far left; derivatives 1 and 0
        np.testing.assert_allclose(fwd[right], x[right], rtol=1e-6)
        np.testing.assert_allclose(back[right], g[right], rtol=1e-6)
        np.testing.assert_allclose(fwd[left], 0.0, atol=1e-30)
        np.testing.assert_allclose(back[left], 0.0, atol=1e-30)


def test_relu_backward_selects():
    """np.where's select: an inactive unit's gradient is +0.0 even when g is NaN or inf; an
    active one's is g's bits (a -0.0 too)."""
    x = np.array([-1.0, 0.0, -0.0, np.nan, -np.inf, 2.0, 3.0, np.inf])
    g = np.array([np.nan, np.inf, -5.0, 1.0, -np.inf, -0.0, np.nan, -2.0])
    for dtype in (F32, F64):
        got = act.relu_backward(g.astype(dtype), x.astype(dtype))
        assert_bits(got, np.where(x > 0, g, 0).astype(dtype))
        assert not np.signbit(got[:5]).any()


@pytest.mark.parametrize("name", FORMER)
def test_other_dtypes_take_the_composite(name):
    """Integer and float16 inputs, a broadcasting gradient and a promoting one: the former
    composite's own result (dtype and bits)."""
    rng = np.random.default_rng(3)
    x64 = rng.standard_normal((4, 5))
    cases = [(x64.astype(np.float16),), ((x64 * 3).astype(np.int64),)]
    if name not in FORWARDS:
        y = OF_OUTPUT[name](x64) if name in OF_OUTPUT else x64
        cases = [
            (rng.standard_normal(5), y),  # g broadcasts against y/x
            (rng.standard_normal((4, 5)).astype(F32), y),  # float32 g, float64 x: promotes
            (rng.standard_normal((4, 5)), y.astype(F32)),
            (1.5, y.astype(F32)),  # a Python float: weak, float32 stays
            (rng.standard_normal((4, 5)).astype(np.float16), y.astype(np.float16)),
        ]
    for args in cases:
        with np.errstate(all="ignore"):
            assert_bits(act.REFERENCES[name](*args), FORMER[name](*args))


@pytest.mark.parametrize("name", FORMER)
def test_float32_computes_in_float32(name):
    for shape in ((7, 33), ()):
        args = inputs(name, shape, F32)
        assert_float32_only(act.REFERENCES[name], *args)


def test_lists_and_scalars():
    assert_bits(act.gelu_forward([0.5, -1.0]), act.gelu_forward(np.array([0.5, -1.0])))
    assert act.sigmoid_forward(2.0).dtype == F64
    assert act.silu_forward(np.float32(2.0)).dtype == F32


# -- the CUDA kernels: GPU and CPU emulation -------------------------------------------------------
@pytest.fixture(scope="module", params=kernel_devices.PARAMS)
def device(request):
    """The loader's functions on a backend, with ``put`` (host to device) and ``get``."""
    cp = kernel_devices.array_module(request)
    return SimpleNamespace(cp=cp, fns=act.load(cp), put=cp.asarray, get=lambda a: a.get())


# CUDA's tanhf/expf and contracted arithmetic against numpy's: a few ulps, and the gradients'
# absolute error where tanh rounds near +-1 (as F32_TOL)
DEVICE_TOL = {F32: {"rtol": 3e-6, "atol": 6e-6}, F64: {"rtol": 1e-13, "atol": 1e-13}}
DEVICE_SHAPES = {k: SHAPES[k] for k in ("0-d", "one", "empty", "column", "odd")} | {
    "long": (2113,)  # more than a block of threads, not a multiple of one
}


@dtypes
@pytest.mark.parametrize("shape", DEVICE_SHAPES.values(), ids=DEVICE_SHAPES.keys())
@pytest.mark.parametrize("name", FORMER)
def test_device_kernel_is_the_reference(device, name, shape, dtype):
    """Each layout: device views, strided ones copied by the loader."""
    f, args = device.fns[name], inputs(name, shape, dtype, seed=1)
    want = act.REFERENCES[name](*args)
    for layout, dev_args in zip(*laid_out(args, device.put)):
        got = f(*dev_args)
        assert isinstance(got, device.cp.ndarray)
        got = device.get(got)
        assert got.dtype == dtype and got.shape == shape, layout
        if name in EXACT:
            assert_bits(got, want)
        else:
            np.testing.assert_allclose(got, want, **DEVICE_TOL[dtype], err_msg=layout)


@dtypes
@pytest.mark.parametrize("op", LARGE)
def test_device_large_magnitudes(device, op, dtype):
    mag = np.geomspace(1.0, LARGE[op][dtype], 40)
    x = np.concatenate([-mag[::-1], [0.0], mag]).astype(dtype)
    g = np.linspace(-1, 1, x.size, dtype=dtype)
    fwd = act.REFERENCES[f"{op}_forward"](x)
    second = fwd if op == "sigmoid" else x
    back = act.REFERENCES[f"{op}_backward"](g, second)
    f = device.fns
    got_fwd = device.get(f[f"{op}_forward"](device.put(x)))
    got_back = device.get(f[f"{op}_backward"](device.put(g), device.put(second)))
    atol = DEVICE_TOL[dtype]["atol"] if op == "gelu" else 1e-30  # as in test_large_magnitudes
    np.testing.assert_allclose(got_fwd, fwd, rtol=DEVICE_TOL[dtype]["rtol"], atol=atol)
    np.testing.assert_allclose(got_back, back, **DEVICE_TOL[dtype])


@pytest.mark.parametrize("name", FORMER)
def test_device_other_dtypes_take_the_composite(device, name):
    """What the references give to their composite, the loader computes with the array module:
    numpy's result (an integer input, a broadcasting gradient)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4))
    if name in FORWARDS:
        args = ((x * 3).astype(np.int64),)
    else:
        args = (rng.standard_normal(4), OF_OUTPUT[name](x) if name in OF_OUTPUT else x)
    want = act.REFERENCES[name](*args)
    got = device.get(device.fns[name](*(device.put(a) for a in args)))
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    assert got.dtype == want.dtype


# -- dt's ops run them ----------------------------------------------------------------------------
OPS = {  # dt op -> its forward reference, its gradient's reference and what that takes
    "gelu": ("gelu_forward", "gelu_backward", "x"),
    "silu": ("silu_forward", "silu_backward", "x"),
    "sigmoid": ("sigmoid_forward", "sigmoid_backward", "y"),
    "tanh": (None, "tanh_backward", "y"),
    "relu": (None, "relu_backward", "x"),
}


@dtypes
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("ranks", [1, 3])
def test_dt_ops_and_gradients_are_the_kernels(op, ranks, dtype):
    """The forward and its gradient on sharded tensors: each rank's shard the kernels' result
    on its shard, so the gathered values are the kernels' on the whole, bit for bit."""
    forward, backward, of = OPS[op]
    rng = np.random.default_rng(5)
    x = (3 * rng.standard_normal((7, 5))).astype(dtype)
    g = rng.uniform(-1, 1, (7, 5)).astype(dtype)

    def run():
        mesh = dt.ProcessMesh(list(range(ranks)))
        t = dt.shard_tensor(x, mesh, [dt.Shard(0)], requires_grad=True)
        y = getattr(dt, op)(t)
        (y * dt.shard_tensor(g, mesh, [dt.Shard(0)])).sum().backward()
        return y.numpy(), t.grad.numpy()

    y, grad = dt.simulate(ranks, run)[0]
    if forward is not None:
        assert_bits(y, act.REFERENCES[forward](x))
    assert_bits(grad, act.REFERENCES[backward](g, y if of == "y" else x))
