"""kernels/softmax.py and softmax.cu (docs/kernels.md): softmax, log softmax, logsumexp and the
attention score path, forward and backward.

The numpy references against the composites of dt ops they replaced (``former_*``: the code of
disttensor/ops/reduction.py before, in numpy; bit for bit on the last axis) and against a
float64 reference in float32, on awkward sizes (one row, one column, empty, odd widths, 0-d,
strided inputs) and odd rows (large offsets, -inf, +inf, NaN: Note [Softmax of odd rows]);
the backward passes against the gradients dt computed through the composites and against
central differences; float32 inputs computed in float32 only (tests/precision.py); inputs
never written. Then every CUDA entry through its loader against the references, on the CPU
emulation (kernels/emulate.py) and on a GPU where CuPy finds one.
"""

from __future__ import annotations

from types import SimpleNamespace

import kernel_devices
import numpy as np
import pytest
from precision import assert_float32_only

import disttensor as dt
from kernels import softmax as sm

DTYPES = (np.float32, np.float64)
dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
# (rows..., cols): one row, one column, empty either way, odd widths past a warp and a block
SHAPES = [(1, 1), (1, 7), (7, 1), (0, 5), (4, 0), (3, 33), (2, 3, 1025), (5, 1000)]
TOL = {np.float32: {"rtol": 2e-5, "atol": 2e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-14}}
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|divide by zero|overflow)")


def assert_bits(got, want) -> None:
    """Same dtype, shape and bytes (NaNs and signed zeros included)."""
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (got.dtype, got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), f"max difference {np.nanmax(np.abs(got - want))}"


def close(got, want, dtype) -> None:
    got = np.asarray(got)
    assert got.shape == np.shape(want) and got.dtype == dtype, (got.dtype, got.shape)
    np.testing.assert_allclose(got, want, equal_nan=True, **TOL[dtype])


# -- the composites the references replaced (disttensor/ops/reduction.py, in numpy) ------------
def former_softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis, keepdims=True))
    return e / np.sum(e, axis, keepdims=True)


def former_logsumexp(x, axis=-1, keepdims=False):
    m = np.max(x, axis, keepdims=True)
    m = np.where(np.isfinite(m), m, np.zeros((), m.dtype))
    s = np.sum(np.exp(x - m), axis, keepdims=True)
    if not keepdims:
        s, m = np.max(s, axis), np.max(m, axis)
    return np.log(s) + m


def former_log_softmax(x, axis=-1):
    return x - former_logsumexp(x, axis, keepdims=True)


def former_attention(s, scale, causal):
    """MultiHeadAttention.forward's three ops before attention_softmax."""
    v = s * scale
    if causal:
        v = np.where(np.tril(np.ones(s.shape[-2:], bool)), v, -np.inf)
    return former_softmax(v)


def data(shape, dtype, seed=0, offset=0.0):
    rng = np.random.default_rng([seed, *shape])
    return (3 * rng.standard_normal(shape) + offset).astype(dtype)


def odd_rows(dtype, cols=9):
    """Rows: plain, shifted by 1e4 (positive and negative), with a -inf, all -inf, with a +inf,
    with a NaN, +inf and -inf together, and a NaN among -infs."""
    x = data((9, cols), dtype)
    x[1] += 1e4
    x[2] -= 1e4
    x[3, 2] = -np.inf
    x[4] = -np.inf
    x[5, 1] = np.inf
    x[6, 4] = np.nan
    x[7, :2] = np.inf, -np.inf
    x[8], x[8, 3] = -np.inf, np.nan
    return x


def awkward(dtype):
    """(label, array) inputs: the shapes, 0-d, offsets, odd rows and strided views."""
    out = [(f"{s}", data(s, dtype)) for s in SHAPES]
    out += [("0-d", np.asarray(data((1,), dtype)[0])), ("odd rows", odd_rows(dtype))]
    out += [("odd rows, long", odd_rows(dtype, 1100))]  # a block per row on a GPU
    out += [("(2, 8200)", data((2, 8200), dtype, 3))]  # blocks of 1024 threads, registers allowing
    out += [("+1e4", data((3, 33), dtype, offset=1e4)), ("-1e4", data((3, 33), dtype, 1, -1e4))]
    wide = data((6, 40), dtype, 2)
    out += [("transposed", wide.T), ("strided", wide[::2, 1::3])]
    return out


FORWARD = {  # reference -> the composite it replaced, over the last axis
    "softmax_forward": former_softmax,
    "log_softmax_forward": former_log_softmax,
    "logsumexp_forward": former_logsumexp,
}


@dtypes
@pytest.mark.parametrize("name", FORWARD)
def test_forward_is_the_composite_bit_for_bit(name, dtype):
    f, former = sm.REFERENCES[name], FORWARD[name]
    for label, x in awkward(dtype):
        if x.ndim == 0:  # a 0-d input is one row of one element
            assert_bits(f(x), former(x.reshape(1)).reshape(()))
        elif x.shape[-1] == 0 and name == "logsumexp_forward":  # numpy's max refuses these
            assert_bits(f(x), np.full(x.shape[:-1], -np.inf, dtype))  # log(0), as split rows
        elif x.shape[-1] == 0:
            assert_bits(f(x), np.empty(x.shape, dtype))
        else:
            assert_bits(f(x), former(x)), label


@pytest.mark.parametrize("name", FORWARD)
def test_float32_forward_against_float64(name):
    f = sm.REFERENCES[name]
    for label, x in awkward(np.float32):
        if "odd" in label or "1e4" in label:  # float32's rounding of the inputs themselves
            continue
        want = f(x.astype(np.float64))
        close(f(x), want, np.float32)


def test_odd_rows_behave_as_the_composites():
    """Note [Softmax of odd rows], spelled out on the rows of ``odd_rows``."""
    x = odd_rows(np.float64)
    y, ly, lse = sm.softmax_forward(x), sm.log_softmax_forward(x), sm.logsumexp_forward(x)
    assert np.isfinite(y[:4]).all() and y[3, 2] == 0 and ly[3, 2] == -np.inf
    assert np.isnan(y[4:]).all()  # the max is not finite: NaN throughout
    assert list(lse[[4, 5, 7]]) == [-np.inf, np.inf, np.inf] and np.isnan(lse[[6, 8]]).all()
    assert np.isnan(ly[4]).all() and np.isnan(ly[5, 1]) and (np.delete(ly[5], 1) == -np.inf).all()
    np.testing.assert_allclose(lse[1], np.log(np.exp(x[1] - 1e4).sum()) + 1e4, rtol=1e-15)


def test_integers_compute_in_float64_and_complex_is_refused():
    x = np.arange(6).reshape(2, 3)
    assert_bits(sm.softmax_forward(x), former_softmax(x.astype(np.float64)))
    assert sm.logsumexp_forward(x > 2).dtype == np.float64
    with pytest.raises(TypeError, match="complex"):
        sm.softmax_forward(x + 1j)
    with pytest.raises(ValueError, match="shape"):
        sm.softmax_backward(np.ones((2, 3)), np.ones((3, 2)))


# -- backward --------------------------------------------------------------------------------
def dt_gradient(fn, x, g):
    """The gradient of ``sum(fn(x) * g)`` computed by dt through the composites: the axis split
    over two simulated ranks (Note [Fused or composite] in disttensor/ops/nn.py)."""

    def run():
        t = dt.shard_tensor(x, dt.ProcessMesh([0, 1]), [dt.Shard(x.ndim - 1)], requires_grad=True)
        fn(t).backward(grad=g)
        return t.grad.numpy()

    return dt.simulate(2, run)[0]


def central_differences(fn, x, g, eps=1e-6):
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        out[i] = ((fn(up) - fn(down)) * g).sum() / (2 * eps)
    return out


@dtypes
@pytest.mark.parametrize("shape", [(1, 1), (7, 1), (4, 7), (2, 3, 33), (3, 1025)], ids=str)
def test_backward_is_the_composites_gradient(shape, dtype):
    x = data(shape, dtype)
    g = data(shape, dtype, 1)
    y, ly, lse = sm.softmax_forward(x), sm.log_softmax_forward(x), sm.logsumexp_forward(x)
    want = dt_gradient(lambda t: dt.softmax(t, -1), x, g)
    close(sm.softmax_backward(g, y), want, dtype)
    want = dt_gradient(lambda t: dt.log_softmax(t, -1), x, g)
    close(sm.log_softmax_backward(g, ly), want, dtype)
    gl = g[..., 0]
    want = dt_gradient(lambda t: dt.logsumexp(t, -1), x, gl)
    close(sm.logsumexp_backward(gl, x, lse), want, dtype)


def test_backward_by_central_differences():
    x, g = data((3, 5), np.float64), data((3, 5), np.float64, 1)
    grads = {
        "softmax": sm.softmax_backward(g, sm.softmax_forward(x)),
        "log_softmax": sm.log_softmax_backward(g, sm.log_softmax_forward(x)),
    }
    for name, got in grads.items():
        f = sm.REFERENCES[f"{name}_forward"]
        np.testing.assert_allclose(got, central_differences(f, x, g), rtol=1e-6, atol=1e-8)
    got = sm.logsumexp_backward(g[:, 0], x, sm.logsumexp_forward(x))
    want = central_differences(sm.logsumexp_forward, x, g[:, 0])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_backward_without_vecdot(monkeypatch):
    """numpy < 2 has no np.vecdot: the row dot of softmax's backward is a product and a sum."""
    x, g = data((4, 33), np.float64), data((4, 33), np.float64, 1)
    y = sm.softmax_forward(x)
    want = sm.softmax_backward(g, y)
    monkeypatch.setattr(sm, "_VECDOT", None)
    close(sm.softmax_backward(g, y), want, np.float64)
    assert_float32_only(sm.softmax_backward, g.astype(np.float32), y.astype(np.float32))


def test_backward_of_0d_and_empty_inputs():
    x = np.asarray(2.5)
    assert_bits(sm.softmax_backward(np.asarray(3.0), sm.softmax_forward(x)), np.asarray(0.0))
    assert_bits(sm.log_softmax_backward(np.asarray(3.0), np.asarray(0.0)), np.asarray(0.0))
    assert_bits(sm.logsumexp_backward(np.asarray(3.0), x, x), np.asarray(3.0))
    e = np.zeros((0, 4), np.float32)
    assert sm.softmax_backward(e, e).shape == (0, 4)
    assert sm.logsumexp_backward(np.zeros(4, np.float32), np.zeros((4, 0)), np.zeros(4)).shape == (
        4,
        0,
    )


# -- the attention score path -------------------------------------------------------------------
ATTENTION = [  # (shape, causal): square, one query, more keys than queries, fewer, 2-D
    ((2, 3, 8, 8), True),
    ((2, 3, 8, 8), False),
    ((4, 1, 1), True),
    ((2, 3, 5), True),
    ((2, 5, 3), True),
    ((33, 33), True),
    ((2, 70, 70), True),
    ((3, 1030), True),  # longer rows than a warp holds
]


@dtypes
@pytest.mark.parametrize("shape,causal", ATTENTION, ids=str)
def test_attention_forward_is_the_three_ops(shape, causal, dtype):
    s = data(shape, dtype)
    for scale in (0.125, -0.7):  # a negative scale flips which entry is the max
        want = former_attention(s, scale, causal)
        assert_bits(sm.attention_softmax_forward(s, scale, causal), want)
    assert_bits(sm.attention_softmax_forward(s, 1.0, False), sm.softmax_forward(s))


@dtypes
@pytest.mark.parametrize("shape,causal", ATTENTION[:5], ids=str)
def test_attention_backward(shape, causal, dtype):
    s, g = data(shape, dtype), data(shape, dtype, 1)
    y = sm.attention_softmax_forward(s, 0.3, causal)
    got = sm.attention_softmax_backward(g, y, 0.3)
    close(got, 0.3 * sm.softmax_backward(g, y), dtype)
    if causal:  # the masked entries (y = 0) get no gradient
        hidden = np.triu(np.ones(shape[-2:], bool), 1)
        assert (got[..., hidden] == 0).all()
    if dtype == np.float64 and s.size < 100:
        f = lambda a: sm.attention_softmax_forward(a, 0.3, causal)  # noqa: E731
        np.testing.assert_allclose(got, central_differences(f, s, g), rtol=1e-6, atol=1e-8)


def test_attention_needs_two_axes():
    with pytest.raises(ValueError, match="two axes"):
        sm.attention_softmax_forward(np.zeros(3), 1.0, False)


# -- float32 stays float32; inputs are read only --------------------------------------------------
def _calls(dtype, rows=(4, 9)):
    """(name, function, float32 arguments) of every reference."""
    x, g = data(rows, dtype), data(rows, dtype, 1)
    y, lse = sm.softmax_forward(x), sm.logsumexp_forward(x)
    s = data((2, 5, 5), dtype)
    return [
        ("softmax_forward", sm.softmax_forward, (x,)),
        ("softmax_backward", sm.softmax_backward, (g, y)),
        ("log_softmax_forward", sm.log_softmax_forward, (x,)),
        ("log_softmax_backward", sm.log_softmax_backward, (g, np.log(y))),
        ("logsumexp_forward", sm.logsumexp_forward, (x,)),
        ("logsumexp_backward", sm.logsumexp_backward, (g[:, 0], x, lse)),
        ("attention_softmax_forward", lambda a: sm.attention_softmax_forward(a, 0.125, True), (s,)),
        ("attention_softmax_backward",
         lambda a, b: sm.attention_softmax_backward(a, b, 0.125), (s, sm.softmax_forward(s))),
    ]  # fmt: skip


@pytest.mark.parametrize("i", range(8), ids=[c[0] for c in _calls(np.float32)])
def test_float32_computes_in_float32(i):
    name, f, args = _calls(np.float32)[i]
    assert_float32_only(f, *args, least=3)
    assert f(*args).dtype == np.float32, name


def test_references_cover_every_entry():
    assert sorted(c[0] for c in _calls(np.float32)) == sorted(sm.REFERENCES)


@pytest.mark.parametrize("i", range(8), ids=[c[0] for c in _calls(np.float64)])
def test_inputs_are_never_written(i):
    _, f, args = _calls(np.float64)[i]
    frozen = [a.copy() for a in args]
    for a in frozen:
        a.flags.writeable = False  # a write into one raises
    assert_bits(f(*frozen), f(*args))


# -- the CUDA kernels through their loaders: GPU and CPU emulation --------------------------------
@pytest.fixture(scope="module", params=kernel_devices.PARAMS)
def device(request):
    """softmax.cu's loader on a backend, with ``put`` (host to device) and ``get``."""
    cp = kernel_devices.array_module(request)
    return SimpleNamespace(fns=sm.load(cp), put=cp.asarray, get=lambda a: a.get())


def _device_inputs(dtype):
    """The awkward inputs, small enough for the emulator (each CUDA thread is a fiber)."""
    return [(label, x) for label, x in awkward(dtype) if x.size <= 20000]


@dtypes
@pytest.mark.parametrize("name", FORWARD)
def test_device_forward(device, name, dtype):
    f, ref = device.fns[name], sm.REFERENCES[name]
    for label, x in _device_inputs(dtype):
        got = device.get(f(device.put(x)))
        if "1e4" in label or "odd" in label:  # exp of a float32 difference: compare relative
            np.testing.assert_allclose(got, ref(x), rtol=3e-5, atol=0, equal_nan=True)
        else:
            close(got, ref(x), dtype)


@dtypes
def test_device_backward(device, dtype):
    f, put, get = device.fns, device.put, device.get
    for label, x in _device_inputs(dtype):
        g = data(x.shape, dtype, 1)
        y, ly = sm.softmax_forward(x), sm.log_softmax_forward(x)
        close(get(f["softmax_backward"](put(g), put(y))), sm.softmax_backward(g, y), dtype)
        want = sm.log_softmax_backward(g, ly)
        close(get(f["log_softmax_backward"](put(g), put(ly))), want, dtype)
        lse, gl = sm.logsumexp_forward(x), np.asarray(data(x.shape[:-1], dtype, 2))
        want = sm.logsumexp_backward(gl, x, lse)
        close(get(f["logsumexp_backward"](put(gl), put(x), put(lse))), want, dtype), label
    # g broadcast to the rows (a scalar gradient of a sum)
    x = data((3, 7), dtype)
    lse = sm.logsumexp_forward(x)
    close(get(f["logsumexp_backward"](2.0, put(x), put(lse))),
          sm.logsumexp_backward(2.0, x, lse), dtype)  # fmt: skip


@dtypes
@pytest.mark.parametrize("shape,causal", ATTENTION, ids=str)
def test_device_attention(device, shape, causal, dtype):
    f, put, get = device.fns, device.put, device.get
    s, g = data(shape, dtype), data(shape, dtype, 1)
    want = sm.attention_softmax_forward(s, 0.125, causal)
    y = f["attention_softmax_forward"](put(s), 0.125, causal)
    close(get(y), want, dtype)
    if causal:  # masked entries exactly 0, in forward and backward
        assert (get(y)[..., np.triu(np.ones(shape[-2:], bool), 1)] == 0).all()
    got = get(f["attention_softmax_backward"](put(g), y, 0.125))
    close(got, sm.attention_softmax_backward(g, want, 0.125), dtype)


def test_device_odd_inputs(device):
    f, put, get = device.fns, device.put, device.get
    x = np.arange(12).reshape(3, 4)  # integers: computed in float64, as the references
    close(get(f["softmax_forward"](put(x))), sm.softmax_forward(x), np.float64)
    with pytest.raises(TypeError):
        f["softmax_forward"](put(x.astype(np.float16)))
    with pytest.raises(ValueError, match="shape"):
        f["softmax_backward"](put(np.ones((2, 3))), put(np.ones((3, 2))))
    with pytest.raises(ValueError, match="two axes"):
        f["attention_softmax_forward"](put(np.ones(3)), 1.0, True)
