"""The kernels package (docs/kernels.md): each numpy reference against a plain numpy composition
and against disttensor's own optimizer, ops and gradients (which run the references; the cross
entropy forward and the Adam step are also pinned, bit for bit, to the numpy code they
replaced, the layer norm forward, whose row sums are BLAS products now, is close to it:
``former_*`` below); every CUDA source compiled by nvcc
for sm_80 and sm_90; the sources shipped as package data; and every CUDA kernel run against
its reference through its loader, on each backend present: the GPU (CuPy and a device) and
the CPU emulation of kernels/emulate.py (g++).
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import os
import shutil
import subprocess
from importlib import resources
from types import SimpleNamespace

import kernel_devices
import numpy as np
import pytest

import disttensor as dt
from disttensor.ops import nn as dt_nn
from disttensor.parallel.buckets import Bucket, Reducer
from kernels import KERNELS, adam, bucket
from kernels import layer_norm as ln
from kernels import softmax_xent as sx

SIZES = (1, 7, 33, 1000, 1025)  # not multiples of a warp, a block, or each other
DTYPES = (np.float32, np.float64)
TOL = {np.float32: {"rtol": 3e-5, "atol": 3e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-13}}
dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
sizes = pytest.mark.parametrize("cols", SIZES)


def assert_bits(got, want) -> None:
    """Same dtype, shape and bytes (NaNs and signed zeros included)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), f"max difference {np.nanmax(np.abs(got - want))}"


def close(got, want, dtype) -> None:
    np.testing.assert_allclose(np.asarray(got), want, equal_nan=True, **TOL[dtype])


# -- the numpy code the references replaced in disttensor (its CPU results must not change) ----
def former_adam(w, g, m, v, *, step, lr, beta1, beta2, eps, weight_decay, decoupled) -> None:
    """dt.optim.Adam.update before it called kernels/adam.py, in place."""
    if weight_decay and not decoupled:
        g = g + weight_decay * w
    m *= beta1
    m += (1 - beta1) * g
    v *= beta2
    v += (1 - beta2) * (g * g)
    if weight_decay and decoupled:
        w *= 1 - lr * weight_decay
    w -= lr / (1 - beta1**step) * m / (np.sqrt(v / (1 - beta2**step)) + eps)


def former_cross_entropy(logits, labels, axis):
    """ops/nn.py's fused cross entropy kernel before it called kernels/softmax_xent.py."""
    x = np.moveaxis(logits, axis, -1).astype(np.result_type(logits, 1.0), copy=False)
    labels = np.where(labels < 0, labels + x.shape[-1], labels)
    m = np.max(x, axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0)
    lse = np.log(np.sum(np.exp(x - m), axis=-1)) + m[..., 0]
    return lse - np.take_along_axis(x, labels[..., None], -1)[..., 0]


def former_layer_norm(x, weight, bias, begin_norm_axis, epsilon):
    """ops/nn.py's fused layer norm kernel before it called kernels/layer_norm.py."""
    axes = tuple(range(begin_norm_axis, x.ndim))
    d = x - x.mean(axis=axes, keepdims=True)
    y = d / np.sqrt((d * d).mean(axis=axes, keepdims=True) + epsilon)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


@pytest.mark.parametrize(
    "name", ["kernels", *(f"kernels.{m}" for m in ("_cuda", *KERNELS, "emulate"))]
)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_sources_ship_with_the_package():
    files = resources.files("kernels")
    for k in KERNELS.values():
        assert files.joinpath(k.source).is_file(), k.source
        assert 'extern "C" __global__' in k.read_source()
        assert '#include "' not in k.read_source()  # common.cuh pasted in: one program text
    assert files.joinpath("common.cuh").is_file() and files.joinpath("emulator.h").is_file()


# -- Adam --------------------------------------------------------------------------------------
ADAM = {  # optimizer class, its keyword arguments
    "adam": (dt.optim.Adam, {}),
    "adam-l2": (dt.optim.Adam, {"weight_decay": 0.1}),
    "adamw": (dt.optim.AdamW, {}),
    "adamw-betas": (dt.optim.AdamW, {"betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.3}),
}
ADAM_SHAPES = [(1,), (7, 33), (1025,), (200, 201)]  # the last spans two reference blocks


def lr_schedule(t: int) -> float:
    return 0.02 / t


def adam_kwargs(cls, kw: dict, step: int) -> dict:
    """The reference's keyword arguments for the optimizer's step ``step``."""
    b1, b2 = kw.get("betas", (0.9, 0.999))
    wd = kw.get("weight_decay", cls.default_weight_decay)
    return {"step": step, "lr": lr_schedule(step), "beta1": b1, "beta2": b2,
            "eps": kw.get("eps", 1e-8), "weight_decay": wd, "decoupled": cls.decoupled}  # fmt: skip


def adam_case(dtype, steps=3):
    rng = np.random.default_rng(5)
    inits = [rng.standard_normal(s).astype(dtype) for s in ADAM_SHAPES]
    grads = [[rng.standard_normal(s).astype(dtype) for s in ADAM_SHAPES] for _ in range(steps)]
    return inits, grads


@dtypes
@pytest.mark.parametrize("variant", ADAM)
def test_adam_is_the_optimizer_bit_for_bit(variant, dtype):
    cls, kw = ADAM[variant]
    inits, grads = adam_case(dtype)

    def run():
        mesh = dt.ProcessMesh([0])
        params = [dt.shard_tensor(w, mesh, [dt.Replicate()], requires_grad=True) for w in inits]
        opt = cls(params, lr=lr_schedule, **kw)
        for gs in grads:
            for p, g in zip(params, gs):
                p.grad = dt.shard_tensor(g, mesh, [dt.Replicate()])
            opt.step()
        names = ("exp_avg", "exp_avg_sq")
        return [(p.numpy(), *(opt.state[id(p)][n].numpy() for n in names)) for p in params]

    (want,) = dt.simulate(1, run)
    for i, init in enumerate(inits):
        for update in (adam.adam_update, former_adam):  # the kernel, and the code it replaced
            w, m, v = init.copy(), np.zeros_like(init), np.zeros_like(init)
            for t, gs in enumerate(grads, 1):
                update(w, gs[i], m, v, **adam_kwargs(cls, kw, t))
            for got, exp in zip((w, m, v), want[i]):
                assert_bits(got, exp)


@sizes
@pytest.mark.parametrize("decay", ["none", "l2", "decoupled"])
def test_adam_is_the_textbook_update(cols, decay):
    rng = np.random.default_rng(cols)
    w, m, v = rng.standard_normal(cols), np.zeros(cols), np.zeros(cols)
    w0, m0, v0 = w.copy(), m.copy(), v.copy()
    lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-7
    wd = 0.0 if decay == "none" else 0.05
    for t in (1, 2, 3):
        g = rng.standard_normal(cols)
        adam.adam_update(w, g, m, v, step=t, lr=lr, beta1=b1, beta2=b2, eps=eps,
                         weight_decay=wd, decoupled=decay == "decoupled")  # fmt: skip
        g0 = g + wd * w0 if decay == "l2" else g
        m0, v0 = b1 * m0 + (1 - b1) * g0, b2 * v0 + (1 - b2) * g0**2
        shrink = 1 - lr * wd if decay == "decoupled" else 1.0
        w0 = shrink * w0 - lr * (m0 / (1 - b1**t)) / (np.sqrt(v0 / (1 - b2**t)) + eps)
    np.testing.assert_allclose(w, w0, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(v, v0, rtol=1e-13)


def test_adam_strided_arrays_and_errors():
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((7, 66)) for _ in range(4)]
    arrays[2:] = [np.abs(a) for a in arrays[2:]]
    strided = [a[:, ::2] for a in arrays]  # views: updated in place, not blocked
    packed = [s.copy() for s in strided]
    adam.adam_update(*strided, step=2, lr=0.1, weight_decay=0.1)
    adam.adam_update(*packed, step=2, lr=0.1, weight_decay=0.1)
    for s, p in zip(strided, packed):
        assert_bits(s, p)
    w = np.zeros(3)
    with pytest.raises(ValueError, match="step counts from 1"):
        adam.adam_update(w, w, w.copy(), w.copy(), step=0, lr=0.1)
    with pytest.raises(ValueError, match="dtype"):
        adam.adam_update(w, w.astype(np.float32), w.copy(), w.copy(), step=1, lr=0.1)


# -- softmax cross entropy ----------------------------------------------------------------
def xent_case(shape, cols, dtype, odd=False):
    """Logits of ``shape + (cols,)`` and labels in [-cols, cols); ``odd`` rows hold -inf,
    +inf, NaN, and all -inf."""
    rng = np.random.default_rng([cols, len(shape)])
    x = (3 * rng.standard_normal((*shape, cols))).astype(dtype)
    labels = rng.integers(-cols, cols, shape)
    if odd:
        flat = x.reshape(-1, cols)
        flat[0, 0], flat[1, -1], flat[2, cols // 2], flat[3] = -np.inf, np.inf, np.nan, -np.inf
    return x, labels


def log_softmax_at(x, labels):
    """-log(softmax(x)[label]), the plain way."""
    top = x.max(-1, keepdims=True)
    lsm = x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))
    return -np.take_along_axis(lsm, (labels % x.shape[-1])[..., None], -1)[..., 0]


@dtypes
@sizes
def test_xent_forward_is_disttensors_cross_entropy(cols, dtype):
    x, labels = xent_case((3, 11), cols, dtype)
    loss, shift, sum_exp = sx.xent_forward(x, labels)
    # dt runs the host backend's kernel: the compiled one where it is built (Note [Host
    # kernels], tests/test_host_kernels.py), bit for bit; else this reference
    host = dt.backend.kernels(dt.backend.NUMPY, "softmax_xent")["xent_forward"]
    got = dt_nn._cross_entropy_kernel(x, labels, -1)[0]
    assert_bits(got, host(x, labels)[0])
    close(got, loss, dtype)
    assert_bits(loss, former_cross_entropy(x, labels, -1))
    close(loss, log_softmax_at(x, labels), dtype)
    first = np.moveaxis(x, -1, 0).copy()  # classes first: the kernel moves them last (strided)
    last = np.moveaxis(first, 0, -1)
    assert_bits(dt_nn._cross_entropy_kernel(first, labels, 0)[0], host(last, labels)[0])
    assert_bits(sx.xent_forward(last, labels)[0], former_cross_entropy(first, labels, 0))
    assert_bits(shift, x.max(-1))
    close(sum_exp, np.exp(x - x.max(-1, keepdims=True)).sum(-1), dtype)


@dtypes
@np.errstate(all="ignore")
def test_xent_forward_of_infinite_and_nan_rows(dtype):
    x, labels = xent_case((5,), 33, dtype, odd=True)
    loss, shift, sum_exp = sx.xent_forward(x, labels)
    host = dt.backend.kernels(dt.backend.NUMPY, "softmax_xent")["xent_forward"]
    assert_bits(dt_nn._cross_entropy_kernel(x, labels, -1)[0], host(x, labels)[0])
    assert_bits(loss, former_cross_entropy(x, labels, -1))
    assert list(shift[1:4]) == [0, 0, 0] and np.isinf(sum_exp[1]) and np.isnan(sum_exp[2])


def test_xent_labels_like_numpy_indices():
    x = np.zeros((2, 3))
    with pytest.raises(IndexError):
        sx.xent_forward(x, np.array([0, 3]))
    with pytest.raises(IndexError):
        sx.xent_local_max(x, np.array([0, -6]), 3, 5)
    with pytest.raises(TypeError):
        sx.xent_forward(x, np.array([0.0, 1.0]))
    with pytest.raises(ValueError):
        sx.xent_forward(x, np.array([0]))


def dt_grads(fn, *arrays, placements=None, ranks=1):
    """Run ``fn(*tensors)`` (returns the loss) on ``ranks`` simulated ranks with the arrays as
    DistTensors requiring gradients; returns (loss, gradients) as numpy values."""

    def run():
        mesh = dt.ProcessMesh(list(range(ranks)))
        where = placements or [dt.Replicate()]
        ts = [dt.shard_tensor(a, mesh, where, requires_grad=True) for a in arrays]
        out = fn(*ts)
        out.sum().backward()
        return out.numpy(), [t.grad.numpy() for t in ts]

    return dt.simulate(ranks, run)[0]


@dtypes
@pytest.mark.parametrize("cols", (1, 7, 1025))
def test_xent_backward_is_disttensors_gradient(cols, dtype):
    x, labels = xent_case((9,), cols, dtype)
    g = np.random.default_rng(2).standard_normal(9).astype(dtype)
    _, (want,) = dt_grads(lambda t: dt.cross_entropy(t, labels, reduction="none") * g, x)
    _, shift, sum_exp = sx.xent_forward(x, labels)
    got = sx.xent_backward(x, labels, shift, sum_exp, g)
    close(got, want, dtype)
    softmax = np.exp(x - x.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    hot = np.arange(cols) == (labels % cols)[:, None]
    close(got, (softmax - hot) * g[:, None], dtype)


def vocab_parallel(x, labels, g, blocks, fns=None):
    """Loss and gradient composed from the pieces over column blocks, the all-reduces done
    here (Note [Vocabulary-parallel pieces] in kernels/softmax_xent.py)."""
    f = fns or sx.REFERENCES
    put = (lambda a: a) if fns is None else fns["put"]
    get = (lambda a: a) if fns is None else fns["get"]
    cols, starts = x.shape[-1], np.cumsum([0, *(b.shape[-1] for b in blocks)])
    pieces = [f["xent_local_max"](put(b), put(labels), s, cols) for b, s in zip(blocks, starts)]
    top = np.max([get(m) for m, _ in pieces], axis=0)
    shift = get(f["row_shift"](put(top)))
    sum_exp = np.sum([get(f["xent_local_sum_exp"](put(b), put(shift))) for b in blocks], axis=0)
    label = np.sum([get(p) for _, p in pieces], axis=0)
    loss = np.log(sum_exp) + shift - label
    args = (put(labels), put(shift), put(sum_exp), put(g))
    grad = [get(f["xent_backward"](put(b), *args, s, cols)) for b, s in zip(blocks, starts)]
    return loss, np.concatenate(grad, axis=-1), (top, label, shift, sum_exp)


@dtypes
@sizes
@pytest.mark.parametrize("ranks", (2, 3))
def test_vocab_parallel_pieces_compose_to_the_loss(cols, ranks, dtype):
    x, labels = xent_case((4, 3), cols, dtype)
    g = np.linspace(-1, 2, 12, dtype=dtype).reshape(4, 3)
    blocks = np.array_split(x, ranks, axis=-1)  # disttensor's shard boxes; empty ones too
    loss, grad, (top, label, shift, sum_exp) = vocab_parallel(x, labels, g, blocks)
    want, want_shift, _ = sx.xent_forward(x, labels)
    close(loss, want, dtype)
    assert_bits(shift, want_shift)
    assert_bits(top, x.max(-1))
    assert_bits(label, np.take_along_axis(x, (labels % cols)[..., None], -1)[..., 0])
    assert_bits(grad, sx.xent_backward(x, labels, shift, sum_exp, g))


@pytest.mark.parametrize("cols", (1, 7, 1000))
def test_vocab_parallel_pieces_match_disttensors_split_loss(cols):
    x, labels = xent_case((6,), cols, np.float64)
    g = np.linspace(0.5, 1.5, 6)
    loss_fn = lambda t: dt.cross_entropy(t, labels, reduction="none") * g  # noqa: E731
    want_loss, (want_grad,) = dt_grads(loss_fn, x, placements=[dt.Shard(1)], ranks=3)
    loss, grad, _ = vocab_parallel(x, labels, g, np.array_split(x, 3, axis=-1))
    close(loss * g, want_loss, np.float64)
    close(grad, want_grad, np.float64)


# -- layer norm ----------------------------------------------------------------------------------
AFFINE = ("none", "weight", "both")


def ln_case(rows, cols, dtype, affine="both"):
    rng = np.random.default_rng([rows, cols])
    x = (rng.standard_normal((rows, cols)) * 2 + 1).astype(dtype)
    w = rng.standard_normal(cols).astype(dtype) if affine != "none" else None
    b = rng.standard_normal(cols).astype(dtype) if affine == "both" else None
    return x, w, b, rng.standard_normal((rows, cols)).astype(dtype)


@dtypes
@sizes
@pytest.mark.parametrize("affine", AFFINE)
def test_layer_norm_forward_is_disttensors(cols, affine, dtype):
    x, w, b, _ = ln_case(7, cols, dtype, affine)
    y, mean, rstd = ln.layer_norm_forward(x, w, b, eps=1e-5)
    got, (got_mean, got_rstd) = dt_nn._layer_norm_kernel(x, w, b, begin_norm_axis=1, epsilon=1e-5)
    # dt runs the host backend's kernel: the compiled one where it is built (Note [Host
    # kernels], tests/test_host_kernels.py), bit for bit; else this reference
    host = dt.backend.kernels(dt.backend.NUMPY, "layer_norm")["layer_norm_forward"]
    for a, want in zip((got, got_mean, got_rstd), host(x, w, b, 1e-5)):
        assert_bits(a, want)
    for a, want in ((got, y), (got_mean, mean), (got_rstd, rstd)):
        close(a, want, dtype)
    # BLAS row sums (Note [Row blocks] in kernels/layer_norm.py): close to the former kernel
    close(y, former_layer_norm(x, w, b, 1, 1e-5), dtype)
    close(mean, x.astype(np.float64).mean(-1), dtype)
    close(rstd, 1 / np.sqrt(x.astype(np.float64).var(-1) + 1e-5), dtype)


@dtypes
@pytest.mark.filterwarnings("ignore:Mean of empty slice")  # the (4, 0, 3) rows: NaN, as numpy
@pytest.mark.parametrize("shape", [(5, 3, 4), (2, 3, 1, 7), (4, 0, 3)])
def test_layer_norm_over_several_axes_is_the_former_kernel(shape, dtype):
    """Several normalized axes run the last-axis kernel on the flattened rows (a strided input
    copied first), with the statistics of each row of the leading axes."""
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(dtype) * 3 + 1
    w, b = (rng.standard_normal(shape[1:]).astype(dtype) for _ in range(2))
    for xs in (x, np.swapaxes(np.swapaxes(x, 0, 1).copy(), 0, 1)):  # contiguous, strided
        for args in ((w, b), (None, None)):
            with np.errstate(all="ignore"):
                got, (mean, rstd) = dt_nn._layer_norm_kernel(
                    xs, *args, begin_norm_axis=1, epsilon=1e-5
                )
                want = former_layer_norm(xs, *args, 1, 1e-5)
            close(got, want, dtype)
            assert mean.shape == rstd.shape == shape[:1]
            with np.errstate(all="ignore"):
                close(mean, xs.reshape(shape[0], -1).mean(-1), dtype)


@dtypes
@pytest.mark.parametrize("cols", (1, 7, 1025))
@pytest.mark.parametrize("affine", ("none", "both"))
def test_layer_norm_backward_is_disttensors_gradient(cols, affine, dtype):
    x, w, b, dy = ln_case(33, cols, dtype, affine)
    _, mean, rstd = ln.layer_norm_forward(x, w, b)
    dx, dw, db = ln.layer_norm_backward(dy, x, mean, rstd, w)
    if affine == "none":
        _, (want_dx,) = dt_grads(lambda t: dt.layer_norm(t) * dy, x)
        close(dx, want_dx, dtype)
    else:
        _, want = dt_grads(lambda t, tw, tb: dt.layer_norm(t, tw, tb) * dy, x, w, b)
        for got, exp in zip((dx, dw, db), want):
            close(got, exp, dtype)


def test_layer_norm_backward_by_central_differences():
    x, w, b, dy = ln_case(3, 7, np.float64)
    _, mean, rstd = ln.layer_norm_forward(x, w, b)
    grads = ln.layer_norm_backward(dy, x, mean, rstd, w)
    for k, a in enumerate((x, w, b)):
        numeric = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            args = [x.copy(), w.copy(), b.copy()]
            args[k][i] += 1e-6
            up = (ln.layer_norm_forward(*args)[0] * dy).sum()
            args[k][i] -= 2e-6
            numeric[i] = (up - (ln.layer_norm_forward(*args)[0] * dy).sum()) / 2e-6
        np.testing.assert_allclose(grads[k], numeric, rtol=1e-6, atol=1e-8)


# -- gradient buckets ----------------------------------------------------------------------
BUCKET_SHAPES = [(7,), (33, 2), (), (1000,), (0,), (1, 1025)]


def test_bucket_layout_is_the_reducers():
    def layout():
        b = Bucket(key=((0,), "<f8", "sum"), group=None)
        for s in BUCKET_SHAPES:
            b.add(None, None, None, s)
        reducer = Reducer([], dt.ProcessMesh([0]), (), (0, 0))
        reducer.building = {b.key: b}
        reducer._close(b)  # allocates the buffer and lays the members out in it
        return b

    (b,) = dt.simulate(1, layout)
    offsets = bucket.bucket_offsets(BUCKET_SHAPES)
    assert list(offsets) == [m.offset for m in b.members] + [b.size]
    assert np.array_equal(b.offsets, offsets) and b.buffer.shape == (offsets[-1],)


@dtypes
def test_bucket_pack_and_unpack(dtype):
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(dtype) for s in BUCKET_SHAPES]
    arrays[1] = np.asfortranarray(arrays[1])  # a strided member packs the same
    arrays[3] = None  # no gradient this round: zero-filled
    offsets = bucket.bucket_offsets(BUCKET_SHAPES)
    plain = bucket.bucket_pack(arrays, np.full(offsets[-1], np.nan, dtype), offsets)
    want = [np.zeros(s, dtype) if a is None else a for a, s in zip(arrays, BUCKET_SHAPES)]
    assert_bits(plain, np.concatenate([a.reshape(-1) for a in want]))
    scaled = bucket.bucket_pack(arrays, np.empty(offsets[-1], dtype), offsets, scale=0.3)
    plain *= 0.3  # the reducer's order: pack, reduce, scale the buffer
    assert_bits(scaled, plain)
    copies = bucket.bucket_unpack(scaled, offsets, BUCKET_SHAPES, scale=2.5, copy=True)
    views = bucket.bucket_unpack(scaled, offsets, BUCKET_SHAPES, scale=2.5)
    for c, v, a in zip(copies, views, want):
        assert_bits(c, v)
        assert np.shares_memory(v, scaled) or v.size == 0
        assert_bits(c, (a * dtype(0.3)) * dtype(2.5))
    with pytest.raises(ValueError, match="slot"):
        bucket.bucket_pack([np.zeros(3)], np.zeros(4), [0, 4])


# -- nvcc ----------------------------------------------------------------------------------
ARCHS = ("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90")
STRICT = ("-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra", "-Xptxas", "-Werror")


def find_nvcc() -> str | None:
    path = "/usr/local/cuda/bin/nvcc"
    return shutil.which("nvcc") or (path if os.access(path, os.X_OK) else None)


@pytest.fixture(scope="module")
def nvcc_build(tmp_path_factory):
    """One nvcc call: every program, as NVRTC gets it, for both architectures, host code and
    device code, warnings as errors."""
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, /usr/local/cuda/bin): CUDA sources not compiled")
    root = tmp_path_factory.mktemp("nvcc")
    sources = []
    for name, k in KERNELS.items():
        sources.append(root / f"{name}.cu")
        sources[-1].write_text(k.read_source())
    cmd = [nvcc, *ARCHS, "-c", "-std=c++17", *STRICT, "-odir", str(root), *map(str, sources)]
    return root, subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_cuda_source_compiles_for_sm80_and_sm90(nvcc_build, name):
    root, done = nvcc_build
    assert done.returncode == 0, done.stderr
    assert (root / f"{name}.o").stat().st_size > 0


# -- the CUDA kernels against their references: GPU and CPU emulation ----------------------------
@pytest.fixture(scope="module", params=kernel_devices.PARAMS)
def device(request):
    """The loaders' functions on a backend, with ``put`` (host to device) and ``get``."""
    cp = kernel_devices.array_module(request)
    fns = {"put": cp.asarray, "get": lambda a: a.get()}
    for k in KERNELS.values():
        fns.update(k.load(cp))
    return SimpleNamespace(cp=cp, fns=fns, put=cp.asarray, get=lambda a: a.get())


def test_device_functions_take_the_references_arguments(device):
    def params(f, **how):
        return [
            (p.name, p.kind, p.default) for p in inspect.signature(f, **how).parameters.values()
        ]

    for k in KERNELS.values():
        for name, ref in k.references.items():
            assert params(device.fns[name], follow_wrapped=False) == params(ref), name


@dtypes
def test_device_adam_bit_for_bit(device, dtype):
    inits, grads = adam_case(dtype)
    for i, init in enumerate(inits):
        host = [init.copy(), None, np.zeros_like(init), np.zeros_like(init)]
        dev = [device.put(a) for a in (init, init, host[2], host[3])]
        for step, gs in enumerate(grads, 1):
            c, k = ADAM["adam-l2"] if step == 2 else ADAM["adamw-betas"]  # both decays
            host[1], dev[1] = gs[i], device.put(gs[i])
            adam.adam_update(*host, **adam_kwargs(c, k, step))
            device.fns["adam_update"](*dev, **adam_kwargs(c, k, step))
        for h, d in zip(host, dev):
            assert_bits(device.get(d), h)
    strided = device.put(np.zeros((4, 4), dtype))[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        device.fns["adam_update"](strided, strided, strided, strided, step=1, lr=0.1)


@dtypes
@sizes
@np.errstate(all="ignore")
def test_device_softmax_xent(device, cols, dtype):
    f, put, get = device.fns, device.put, device.get
    x, labels = xent_case((11, 3), cols, dtype, odd=cols > 1)
    g = np.linspace(-1, 1, 33, dtype=dtype).reshape(11, 3)
    want = sx.xent_forward(x, labels)
    got = f["xent_forward"](put(x), put(labels))
    for a, b in zip(got, want):
        close(get(a), b, dtype)
    close(get(f["xent_backward"](put(x), put(labels), *map(put, want[1:]), put(g))),
          sx.xent_backward(x, labels, *want[1:], g), dtype)  # fmt: skip
    for ranks in (2, 3):
        blocks = np.array_split(x, ranks, axis=-1)
        loss, grad, (top, label, *_) = vocab_parallel(x, labels, g, blocks, f)
        want_loss, want_grad, (want_top, want_label, *_) = vocab_parallel(x, labels, g, blocks)
        assert_bits(top, want_top)
        assert_bits(label, want_label)
        close(loss, want_loss, dtype)
        close(grad, want_grad, dtype)
    with pytest.raises(IndexError):
        f["xent_forward"](put(x), put(np.full((11, 3), cols)))


@dtypes
@sizes
@pytest.mark.parametrize("affine", AFFINE)
def test_device_layer_norm(device, cols, affine, dtype):
    f, put, get = device.fns, device.put, device.get
    rows = 130 if cols == 33 else 7  # 130: three chunks of the weight gradient's first stage
    x, w, b, dy = ln_case(rows, cols, dtype, affine)
    want = ln.layer_norm_forward(x, w, b)
    opt = lambda a: None if a is None else put(a)  # noqa: E731
    for got, exp in zip(f["layer_norm_forward"](put(x), opt(w), opt(b)), want):
        close(get(got), exp, dtype)
    grads = f["layer_norm_backward"](put(dy), put(x), put(want[1]), put(want[2]), opt(w))
    for got, exp in zip(grads, ln.layer_norm_backward(dy, x, want[1], want[2], w)):
        close(get(got), exp, dtype)


@dtypes
def test_device_bucket(device, dtype):
    f, put, get = device.fns, device.put, device.get
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s).astype(dtype) for s in BUCKET_SHAPES]
    arrays[2] = None
    offsets = bucket.bucket_offsets(BUCKET_SHAPES)
    members = [None if a is None else put(a) for a in arrays]
    for scale in (1.0, 0.3):
        packed = bucket.bucket_pack(arrays, np.empty(offsets[-1], dtype), offsets, scale)
        buffer = put(np.full(offsets[-1], np.nan, dtype))
        assert_bits(get(f["bucket_pack"](members, buffer, offsets, scale)), packed)
    for copy in (True, False):
        want = bucket.bucket_unpack(packed.copy(), offsets, BUCKET_SHAPES, 2.5, copy)
        buffer = put(packed)
        for a, b in zip(f["bucket_unpack"](buffer, offsets, BUCKET_SHAPES, 2.5, copy), want):
            assert_bits(get(a), b)
        assert_bits(get(buffer), packed if copy else packed * dtype(2.5))  # views: in place
