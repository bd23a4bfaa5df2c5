"""The compiled host kernels (Note [Host kernels] in kernels/_host.py): each against its numpy
reference on awkward sizes and layouts, in float32 and float64, as accurate as the reference
against a float64 computation and with its NaNs, infinities and zeros where the reference has
them; host.h's exp against the correctly rounded exp (Note [Vector exp]), and the same bits at
every vector width; the inputs the compiled functions leave to the references; what runs
where there is no compiler or the numpy references are asked for; and that disttensor's ops
run them."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys

import numpy as np
import pytest
from mpirun import ROOT

from disttensor import backend
from kernels import KERNELS, _host
from kernels import layer_norm as ln
from kernels import softmax as sm
from kernels import softmax_xent as sx

compiled = pytest.mark.skipif(
    _host.library() is None, reason=f"no compiled host kernels here: {_host.status()}"
)
DTYPES = (np.float32, np.float64)
TOL = {np.float32: {"rtol": 2e-4, "atol": 2e-4}, np.float64: {"rtol": 1e-10, "atol": 1e-10}}
# (shape, offset): one column, one row, short and odd rows, long rows, leading axes, empty
# rows, and rows far from zero (no cancellation in the variance)
LN_CASES = [((7, 1), 0), ((1, 16), 0), ((3, 33), 0), ((5, 1025), 0), ((2, 3, 17), 0),
            ((0, 5), 0), ((6, 40), 1e4)]  # fmt: skip


def close(got, want, dtype) -> None:
    np.testing.assert_allclose(np.asarray(got), want, **TOL[dtype])


def as_accurate(got, ref, exact, dtype, atol=None) -> None:
    """``got`` is as close to the float64 ``exact`` as the numpy reference ``ref`` is (twice
    its error, plus ``atol``, by default the dtype's tolerance): rows far from zero lose digits
    in any float32 sum, the compiled kernel must not lose more."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    err_got = np.max(np.abs(got - exact), initial=0.0)
    err_ref = np.max(np.abs(ref - exact), initial=0.0)
    atol = TOL[dtype]["atol"] if atol is None else atol
    assert err_got <= 2 * err_ref + atol, (err_got, err_ref)


@pytest.mark.skipif(
    _host._compiler() is None
    or os.environ.get("DISTTENSOR_HOST_KERNELS", "").strip().lower() == "numpy",
    reason="no C compiler here, or the numpy references asked for",
)
def test_the_programs_build_where_there_is_a_compiler():
    """A C program that does not compile leaves the references running and the tests of the
    compiled kernels skipped: here that is a failure."""
    assert _host.library() is not None, _host.status()


def test_every_compiled_function_has_a_reference_of_its_name():
    for k in KERNELS.values():
        extra = set(k.load_host()) - set(k.references)
        assert not extra, f"{k.name}: compiled functions without a reference: {extra}"


@compiled
@pytest.mark.parametrize(
    "module, names",
    [
        (ln, {"layer_norm_forward", "layer_norm_backward"}),
        (sm, set(sm.REFERENCES)),
        (sx, {"xent_forward", "xent_backward", "xent_local_sum_exp"}),
    ],
    ids=["layer_norm", "softmax", "softmax_xent"],
)
def test_the_host_backend_runs_the_compiled_kernels(module, names):
    name = module.__name__.rpartition(".")[2]
    host = backend.kernels(backend.NUMPY, name)
    compiled_fns = module.load_host()
    assert set(compiled_fns) == names
    for f in compiled_fns:
        assert host[f] is not module.REFERENCES[f]
        assert host[f].__name__ == f  # functools.wraps: the reference's name and docstring
    assert "compiled with" in _host.status()


@compiled
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("shape, offset", LN_CASES)
@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
def test_layer_norm_against_the_reference(shape, offset, affine, dtype):
    fns = ln.load_host()
    rng = np.random.default_rng([len(shape), shape[-1]])
    x = (rng.standard_normal(shape) * 3 + offset).astype(dtype)
    w = rng.standard_normal(shape[-1:]).astype(dtype) if affine in ("weight", "both") else None
    b = rng.standard_normal(shape[-1:]).astype(dtype) if affine in ("bias", "both") else None
    dy = rng.standard_normal(shape).astype(dtype)
    want = ln.layer_norm_forward(x, w, b)
    got = fns["layer_norm_forward"](x, w, b)
    up = [None if a is None else a.astype(np.float64) for a in (x, w, b, dy)]
    exact = ln.layer_norm_forward(*up[:3])
    for g, r, e in zip(got, want, exact):
        as_accurate(g, r, e, dtype)
    stats = [a.astype(np.float64) for a in want[1:]]
    exact = ln.layer_norm_backward(up[3], up[0], *stats, up[1])
    grads = fns["layer_norm_backward"](dy, x, want[1], want[2], w)
    for g, r, e in zip(grads, ln.layer_norm_backward(dy, x, want[1], want[2], w), exact):
        as_accurate(g, r, e, dtype)
    # strided inputs (a transposed copy's transpose) give the same values
    xs = np.ascontiguousarray(x.swapaxes(0, -1)).swapaxes(0, -1)
    for g, e in zip(fns["layer_norm_forward"](xs, w, b), got):
        close(g, e, dtype)


@compiled
def test_layer_norm_inputs_the_compiled_kernel_does_not_take_go_to_the_reference():
    fns = ln.load_host()
    x = np.arange(12.0).reshape(3, 4)
    w32 = np.ones(4, np.float32)
    for args in ((x.astype(np.int64),), (x, w32), (x.astype(np.float16),)):
        got, want = fns["layer_norm_forward"](*args), ln.layer_norm_forward(*args)
        for g, e in zip(got, want):
            assert g.dtype == e.dtype
            np.testing.assert_array_equal(g, e)
    with np.errstate(all="ignore"):  # rows of no columns: numpy's mean of nothing
        got = fns["layer_norm_forward"](np.zeros((3, 0)))
    assert got[0].shape == (3, 0) and np.isnan(got[1]).all()
    with pytest.raises(ValueError, match="weight must have shape"):
        fns["layer_norm_forward"](x, np.ones(3))


# -- host.h's exp (Note [Vector exp]) ---------------------------------------------------------
def _exp(dtype, x):
    """host.h's dt_expf / dt_exp of each element of ``x``, through the test entries of
    softmax.c."""
    f = getattr(_host.library(), "dt_host_exp_f32" if dtype == np.float32 else "dt_host_exp_f64")
    x = np.ascontiguousarray(x, dtype)
    y = np.empty_like(x)
    f(_host.pointer(x), _host.pointer(y), ctypes.c_longlong(x.size))
    return y


def ulps(got, want):
    """Distance in units of the last place between non-negative floats of one dtype (their
    bit patterns order as integers)."""
    i = np.int32 if got.dtype == np.float32 else np.int64
    return np.abs(got.view(i).astype(np.int64) - want.view(i).astype(np.int64))


def _specials(dtype):
    """NaN, the infinities, zeros, and the edges of overflow and of denormal results (and past
    them) in ``dtype``."""
    if dtype == np.float32:
        edges = [88.72283, 88.72284, 88.7228394, 89.0, 89.1, 1e30, -87.33654, -87.3366,
                 -103.27893, -103.97208, -103.97209, -104.0, -104.1, -1e30]  # fmt: skip
    else:
        edges = [709.782712893384, 709.7827128933841, 710.0, 710.1, 1e300, -708.3964185322641,
                 -708.4, -744.4400719213812, -745.1332191019411, -745.1332191019412, -746.0,
                 -746.1, -1e300]  # fmt: skip
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, *edges], dtype)
    return np.concatenate([x, np.nextafter(x[6:], 0), np.nextafter(x[6:], np.inf)])


@compiled
def test_exp_float32_is_within_one_ulp_of_the_correctly_rounded_exp():
    """Every 331st float32 in [-104, 89] (6.8 million, denormal results included; all 2.2e9 of
    them are within 1 ulp too, checked by hand), and the specials: float64's exp rounded to
    float32 is the correctly rounded one up to ties nothing here is near."""
    hi = int(np.float32(89).view(np.int32))
    lo = int(np.float32(-104).view(np.int32)) & 0x7FFFFFFF
    bits = np.concatenate([np.arange(0, hi, 331), np.arange(0, lo, 331) | 0x80000000])
    x = np.concatenate([bits.astype(np.uint32).view(np.float32), _specials(np.float32)])
    got = _exp(np.float32, x)
    with np.errstate(all="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    nan = np.isnan(x)
    assert np.isnan(got[nan]).all() and not np.isnan(got[~nan]).any()
    assert ulps(got[~nan], want[~nan]).max() <= 1
    big, small = x > 88.7228394, x < -103.972085  # exp(x) rounds to inf, to 0
    assert np.isposinf(got[big]).all() and (got[small] == 0).all()
    assert (got[(x > -103.972) & (x < -87.3366)] > 0).all()  # denormal results, not flushed


@compiled
@pytest.mark.skipif(np.finfo(np.longdouble).nmant < 63, reason="no extended long double here")
def test_exp_float64_is_within_one_ulp_of_the_correctly_rounded_exp():
    """A million float64 over the whole range, a quarter million near 0 and among the
    denormal results, and the specials; the exact exp in x86's 64-bit-mantissa long double."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-746, 710, 1 << 20), rng.uniform(-0.4, 0.4, 1 << 17),
                        rng.uniform(-745.2, -708.3, 1 << 17), _specials(np.float64)])  # fmt: skip
    got = _exp(np.float64, x)
    with np.errstate(all="ignore"):
        want = np.exp(x.astype(np.longdouble)).astype(np.float64)
    nan = np.isnan(x)
    assert np.isnan(got[nan]).all() and not np.isnan(got[~nan]).any()
    assert ulps(got[~nan], want[~nan]).max() <= 1
    assert (got[(x > -745.13) & (x < -708.4)] > 0).all()  # denormal results, not flushed


_CLONE_PROGRAM = r"""
/* host.h's exp and row helpers built once per x86-64 vector extension the clones use */
#define DRIVER(TARGET, NAME)                                                                  \
    TARGET void NAME##_exp_f32(const float* x, float* y, long long n) {                       \
        _Pragma("omp simd") for (long long i = 0; i < n; ++i) y[i] = dt_expf(x[i]);           \
    }                                                                                         \
    TARGET void NAME##_exp_f64(const double* x, double* y, long long n) {                     \
        _Pragma("omp simd") for (long long i = 0; i < n; ++i) y[i] = dt_exp(x[i]);            \
    }                                                                                         \
    TARGET void NAME##_softmax_f32(const float* x, long long n, float* y) {                   \
        const float m = dt_max_f32(x, n, 1.0f), s = dt_expsum_f32(x, n, 1.0f, m, y);          \
        y[n] = dt_dot_f32(x, y, n) + dt_sum_f32(x, n) + s;                                    \
    }                                                                                         \
    TARGET void NAME##_softmax_f64(const double* x, long long n, double* y) {                 \
        const double m = dt_max_f64(x, n, 1.0), s = dt_expsum_f64(x, n, 1.0, m, y);          \
        y[n] = dt_dot_f64(x, y, n) + dt_sum_f64(x, n) + s;                                    \
    }
DRIVER(__attribute__((target("avx512f"))), avx512f)
DRIVER(__attribute__((target("avx2"))), avx2)
DRIVER(, sse2)
int has_avx512f(void) { return __builtin_cpu_supports("avx512f"); }
int has_avx2(void) { return __builtin_cpu_supports("avx2"); }
"""


@compiled
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 clones")
def test_every_vector_width_computes_the_same_bits(tmp_path):
    """host.h's exp and row sums built for AVX-512, AVX2 and the SSE2 baseline with the
    library's flags, run on the widths this CPU has: the same bits (Note [Host kernels])."""
    lib = tmp_path / "clones.so"
    code = _host.program().split("#endif /* DISTTENSOR_KERNELS_HOST_H */")[0] + "#endif\n"
    cmd = [_host._compiler(), *_host.FLAGS, "-x", "c", "-", "-o", str(lib), "-lm"]
    done = subprocess.run(cmd, input=code + _CLONE_PROGRAM, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    so = ctypes.CDLL(str(lib))
    widths = [w for w in ("avx512f", "avx2") if getattr(so, f"has_{w}")()] + ["sse2"]
    assert len(widths) > 1, "one vector width here: nothing to compare"
    rng = np.random.default_rng(1)
    for dtype, sfx in ((np.float32, "f32"), (np.float64, "f64")):
        x = np.concatenate([rng.uniform(-120, 100, 5000), rng.standard_normal(1001) * 700,
                            _specials(dtype)]).astype(dtype)  # fmt: skip
        row = (3 * rng.standard_normal(1037)).astype(dtype)  # 64 lanes' blocks and a tail
        got = {}
        for w in widths:
            y, r = np.empty_like(x), np.empty(row.size + 1, dtype)
            getattr(so, f"{w}_exp_{sfx}")(_host.pointer(x), _host.pointer(y),
                                          ctypes.c_longlong(x.size))  # fmt: skip
            getattr(so, f"{w}_softmax_{sfx}")(_host.pointer(row), ctypes.c_longlong(row.size),
                                              _host.pointer(r))  # fmt: skip
            got[w] = y.tobytes() + r.tobytes()
        assert len(set(got.values())) == 1, f"{sfx}: the widths {widths} differ"


# -- softmax.c against kernels/softmax.py ------------------------------------------------------
def _data(shape, dtype, seed=0, offset=0.0):
    rng = np.random.default_rng([seed, *shape])
    return (3 * rng.standard_normal(shape) + offset).astype(dtype)


def _odd_rows(dtype, cols=21):
    """Rows (Note [Softmax of odd rows]): plain, shifted by +-1e4, with a -inf, all -inf, with
    a +inf, with a NaN, +inf beside -inf, and a NaN among -infs."""
    x = _data((9, cols), dtype, 5)
    x[1] += 1e4
    x[2] -= 1e4
    x[3, 2] = -np.inf
    x[4] = -np.inf
    x[5, 1] = np.inf
    x[6, 4] = np.nan
    x[7, :2] = np.inf, -np.inf
    x[8], x[8, 3] = -np.inf, np.nan
    return x


def _rows(dtype):
    """(label, x): one column, one row, empty either way, odd widths (below, at and past the
    16 lanes), long rows (GPT-2's vocabulary), leading axes, 0-d, rows far from zero, odd rows
    and strided views."""
    out = [(str(s), _data(s, dtype)) for s in [(7, 1), (1, 16), (1, 7), (0, 5), (4, 0), (3, 33),
                                                (2, 3, 47), (2, 50257)]]  # fmt: skip
    out += [("0-d", np.asarray(_data((1,), dtype)[0])), ("odd", _odd_rows(dtype))]
    out += [("odd, long", _odd_rows(dtype, 1100))]
    out += [("+1e4", _data((3, 33), dtype, 1, 1e4)), ("-1e4", _data((3, 33), dtype, 2, -1e4))]
    wide = _data((6, 40), dtype, 3)
    return out + [("transposed", wide.T), ("strided", wide[::2, 1::3])]


def same_specials(got, want, label) -> None:
    """NaN, +inf, -inf and 0 exactly where the reference has them."""
    for test in (np.isnan, np.isposinf, np.isneginf, lambda a: a == 0):
        np.testing.assert_array_equal(test(got), test(want), err_msg=label)


def against_reference(got, ref, exact, dtype, label) -> None:
    """``got`` has ``ref``'s dtype, shape and special entries, and its finite entries are as
    accurate as the reference's (against the float64 ``exact``), to a few ulps of their
    largest magnitude."""
    got, ref, exact = np.asarray(got), np.asarray(ref), np.asarray(exact)
    assert (got.dtype, got.shape) == (ref.dtype, ref.shape), (label, got.dtype, got.shape)
    same_specials(got, ref, label)
    finite = np.isfinite(ref) & np.isfinite(exact)
    scale = np.max(np.abs(exact[finite]), initial=0.0)
    try:
        as_accurate(got[finite], ref[finite], exact[finite], dtype,
                    atol=16 * np.finfo(dtype).eps * max(scale, 1e-30))  # fmt: skip
    except AssertionError as e:
        raise AssertionError(f"{label}: {e}") from None


def _up(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


@compiled
@pytest.mark.filterwarnings("ignore:(invalid value|divide by zero|overflow)")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize(
    "name", ["softmax_forward", "log_softmax_forward", "logsumexp_forward"]
)  # fmt: skip
def test_softmax_forward_against_the_reference(name, dtype):
    f, ref = sm.load_host()[name], sm.REFERENCES[name]
    for label, x in _rows(dtype):
        frozen = x.copy()
        against_reference(f(x), ref(x), ref(*_up(x)), dtype, label)
        np.testing.assert_array_equal(x, frozen)  # the input is not written


@compiled
@pytest.mark.filterwarnings("ignore:(invalid value|divide by zero|overflow)")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize(
    "name", ["softmax_backward", "log_softmax_backward", "logsumexp_backward"]
)  # fmt: skip
def test_softmax_backward_against_the_reference(name, dtype):
    fns = sm.load_host()
    f, ref = fns[name], sm.REFERENCES[name]
    forward = sm.REFERENCES[name.replace("backward", "forward")]
    for label, x in _rows(dtype):
        y = forward(x)
        # logsumexp's g is per row, with the forward's output; the others' full-size
        per_row = name == "logsumexp_backward"
        args = (_data(y.shape, dtype, 7), x, y) if per_row else (_data(x.shape, dtype, 7), y)
        frozen = [a.copy() for a in args]
        against_reference(f(*args), ref(*args), ref(*_up(*args)), dtype, label)
        for a, b in zip(args, frozen):
            np.testing.assert_array_equal(a, b)
    if name == "logsumexp_backward":  # g and out broadcast to the rows
        x = _data((4, 9), dtype)
        out = sm.logsumexp_forward(x)
        for g, o in ((np.asarray(2.0, dtype), out), (out[:1], out), (out, out[:1])):
            against_reference(f(g, x, o), ref(g, x, o), ref(*_up(g, x, o)), dtype, "broadcast")


def _scores(dtype):
    """(label, scores): more keys than queries, fewer, one query, one key, a long row, odd
    rows (in the masked part too), strided."""
    odd = _odd_rows(dtype, 9)
    out = [(str(s), _data(s, dtype, 4)) for s in [(2, 3, 5, 7), (4, 6, 3), (1, 1025), (5, 1),
                                                   (2, 9, 40)]]  # fmt: skip
    out += [("odd", odd), ("odd, transposed", np.ascontiguousarray(odd.T).T)]
    return out + [("strided", _data((2, 8, 20), dtype, 6)[:, ::2, ::3])]


@compiled
@pytest.mark.filterwarnings("ignore:(invalid value|divide by zero|overflow)")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_attention_softmax_against_the_reference(causal, dtype):
    fns = sm.load_host()
    fwd, bwd = fns["attention_softmax_forward"], fns["attention_softmax_backward"]
    for label, s in _scores(dtype):
        for scale in (0.125, -0.7):
            lab = f"{label}, scale {scale}"
            y = sm.attention_softmax_forward(s, scale, causal)
            exact = sm.attention_softmax_forward(*_up(s), scale, causal)
            got = fwd(s, scale, causal)
            against_reference(got, y, exact, dtype, lab)
            if causal:  # the masked entries: 0, or NaN in a row the reference makes NaN
                hidden = np.triu(np.ones(s.shape[-2:], bool), 1) & ~np.isnan(y)
                assert (got[..., hidden] == 0).all(), lab
            g = _data(s.shape, dtype, 8)
            want = sm.attention_softmax_backward(g, y, scale)
            exact = sm.attention_softmax_backward(*_up(g, y), scale)
            against_reference(bwd(g, y, scale), want, exact, dtype, lab)


# -- softmax_xent.c against kernels/softmax_xent.py --------------------------------------------
def _logits(dtype):
    """(label, logits, labels): one class, one row, odd widths, a long row, leading axes, rows
    far from zero, odd rows (-inf, +inf, NaN, all -inf), strided; labels in [-cols, cols)."""
    out = []
    for i, shape in enumerate([(7, 1), (1, 16), (3, 33), (2, 50257), (2, 3, 17), (0, 5)]):
        x = _data(shape, dtype, 10 + i)
        labels = np.random.default_rng(i).integers(-shape[-1], shape[-1], shape[:-1])
        out.append((str(shape), x, labels))
    out.append(("+1e4", _data((3, 33), dtype, 1, 1e4), np.arange(3)))
    out.append(("odd", _odd_rows(dtype), np.arange(9) - 4))
    x = _data((30, 6), dtype, 2)
    return out + [("strided", x.T[:, ::3], np.array([0, 3, -1, 9, -10, 7]))]


@compiled
@pytest.mark.filterwarnings("ignore:(invalid value|divide by zero|overflow)")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_cross_entropy_against_the_reference(dtype):
    fns = sx.load_host()
    for label, x, labels in _logits(dtype):
        frozen = x.copy()
        loss, shift, sum_exp = sx.xent_forward(x, labels)
        got = fns["xent_forward"](x, labels)
        exact = sx.xent_forward(*_up(x), labels)
        for g, r, e in zip(got, (loss, shift, sum_exp), exact):
            against_reference(g, r, e, dtype, label)
        np.testing.assert_array_equal(got[1], shift)  # the shift exactly: a max, or 0
        against_reference(fns["xent_local_sum_exp"](x, shift), sx.xent_local_sum_exp(x, shift),
                          sx.xent_local_sum_exp(*_up(x, shift)), dtype, label)  # fmt: skip
        g = _data(loss.shape, dtype, 9)
        for grad_loss in (g, 1.0 / max(g.size, 1)):  # per row, and a mean's one number
            args = (x, labels, shift, sum_exp, grad_loss)
            want, exact = sx.xent_backward(*args), sx.xent_backward(*_up(*args[:1]), *args[1:])
            against_reference(fns["xent_backward"](*args), want, exact, dtype, label)
        np.testing.assert_array_equal(x, frozen)


@compiled
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_cross_entropy_of_a_vocabulary_block(dtype):
    """A block of the columns [20, 40) of 60 classes (Note [Vocabulary-parallel pieces]): the
    label's -g only in the rows whose label the block holds, at its column."""
    f = sx.load_host()["xent_backward"]
    x = _data((6, 20), dtype, 3)
    labels = np.array([0, 20, 39, 45, -1, -21])  # before, first, last, after, 59, 39
    shift = np.full(6, 4.0, dtype)
    sum_exp = sx.xent_local_sum_exp(x, shift) + 7  # the other blocks' share
    args = (x, labels, shift, sum_exp, 0.5, 20, 60)
    got = f(*args)
    exact = sx.xent_backward(*_up(x), *args[1:])
    against_reference(got, sx.xent_backward(*args), exact, dtype, "block")
    base = f(x, np.zeros(6, np.int64), shift, sum_exp, 0.5, 20, 60)  # no label in the block
    held = np.zeros(x.shape, bool)
    held[[1, 2, 5], [0, 19, 19]] = True
    assert (got[~held] == base[~held]).all()
    np.testing.assert_allclose(got[held] - base[held], -0.5, rtol=1e-6)
    with pytest.raises(IndexError):
        f(x, np.array([59, 0, 0, 0, 0, 0]), shift, sum_exp, 0.5, 20, 59)  # 59 of 59 classes


@compiled
@pytest.mark.filterwarnings("ignore:(invalid value|divide by zero|overflow)")
def test_inputs_the_compiled_softmax_kernels_do_not_take_go_to_the_reference():
    """float16, mixed dtypes, ndarray subclasses and per-row arguments that do not broadcast to
    the rows run the reference (its result, bit for bit, or its error); integers compute in
    float64 as the reference does; the reference's errors for the rest."""

    class Sub(np.ndarray):
        pass

    fns, sxf = sm.load_host(), sx.load_host()
    x = _data((3, 5), np.float32)
    x16, sub = x.astype(np.float16), x.view(Sub)
    y64 = sm.softmax_forward(x.astype(np.float64))
    cases = [
        ("softmax_forward", (x16,)),
        ("softmax_forward", (sub,)),
        ("log_softmax_forward", (x16,)),
        ("logsumexp_forward", (sub,)),
        ("softmax_backward", (x, y64)),  # float32 g, float64 y
        ("log_softmax_backward", (x16, x16)),
        ("logsumexp_backward", (x[:, 0], x, x[:, 0].astype(np.float64))),
        ("attention_softmax_forward", (x16, 0.5, True)),
        ("attention_softmax_backward", (x, y64, 0.5)),
    ]
    for name, args in cases:
        got, want = fns[name](*args), sm.REFERENCES[name](*args)
        assert type(got) is type(want) and got.dtype == want.dtype, name
        assert got.tobytes() == want.tobytes(), name
    for name, args in [
        ("xent_forward", (x16, np.arange(3))),
        ("xent_local_sum_exp", (x16, np.zeros(3))),
        ("xent_backward", (x16, np.arange(3), np.zeros(3), np.ones(3), 1.0)),
    ]:
        for got, want in zip(
            np.atleast_1d(sxf[name](*args)), np.atleast_1d(sx.REFERENCES[name](*args))
        ):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
    ints = np.arange(12).reshape(3, 4)
    for name in ("softmax_forward", "log_softmax_forward", "logsumexp_forward"):
        got, want = fns[name](ints), sm.REFERENCES[name](ints)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-14)
    loss = sxf["xent_forward"](ints, np.arange(3))[0]
    np.testing.assert_allclose(loss, sx.xent_forward(ints, np.arange(3))[0], rtol=1e-14)
    with pytest.raises(TypeError, match="complex"):
        fns["softmax_forward"](x.astype(np.complex64))
    with pytest.raises(ValueError, match="two axes"):
        fns["attention_softmax_forward"](x[0], 0.5, True)
    with pytest.raises(ValueError, match="gradient has shape"):
        fns["softmax_backward"](x[:2], x)
    with pytest.raises(ValueError):  # g does not broadcast to the rows: numpy says so
        fns["logsumexp_backward"](np.ones(4, np.float32), x, x[:, 0])
    with pytest.raises(IndexError):
        sxf["xent_forward"](x, np.array([0, 5, 1]))
    with pytest.raises(TypeError, match="integers"):
        sxf["xent_forward"](x, np.zeros(3))
    with pytest.raises(ValueError, match="labels must have shape"):
        sxf["xent_backward"](x, np.arange(2), np.zeros(3), np.ones(3), 1.0)
    with pytest.raises(ValueError):  # a shift that does not broadcast to the rows
        sxf["xent_backward"](x, np.arange(3), np.zeros(2), np.ones(3), 1.0)
    with pytest.raises(ValueError, match="class axis"):
        sxf["xent_forward"](np.float32(1.0), np.arange(1))


def _status_with(env: dict) -> str:
    """A fresh process's status() and layer norm's load_host() under ``env`` (and not a
    DISTTENSOR_HOST_KERNELS this run was started with: it would decide first)."""
    code = "import kernels._host as h, kernels.layer_norm as ln; print(h.status(), ln.load_host())"
    inherited = {k: v for k, v in os.environ.items() if k != "DISTTENSOR_HOST_KERNELS"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**inherited, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_without_a_compiler_the_references_run():
    out = _status_with({"CC": "/nonexistent/cc"})
    assert "no C compiler found" in out and out.strip().endswith("{}")


def test_the_numpy_references_on_request():
    out = _status_with({"DISTTENSOR_HOST_KERNELS": "numpy"})
    assert "DISTTENSOR_HOST_KERNELS=numpy" in out and out.strip().endswith("{}")


@compiled
def test_a_failed_build_says_why(tmp_path):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'this compiler always fails' >&2\nexit 1\n")
    cc.chmod(0o755)
    out = _status_with({"CC": str(cc), "DISTTENSOR_CACHE": str(tmp_path / "cache")})
    assert "this compiler always fails" in out and out.strip().endswith("{}")


@compiled
def test_ranks_building_at_once_share_one_library(tmp_path):
    """Four processes with an empty cache: each builds, one file is left, all load it (the
    program is layer_norm.c alone: the race is the point, and four builds of the whole
    program at once take most of a minute on two cores)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISTTENSOR_CACHE": str(tmp_path)}
    code = (
        "import kernels._host as h; h.SOURCES = ('layer_norm.c',); "
        "assert h.library() is not None, h.status()"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env) for _ in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    assert len(list((tmp_path / "host-kernels").glob("*.so"))) == 1
    assert not list((tmp_path / "host-kernels").glob("*.tmp"))
