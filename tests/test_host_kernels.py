"""The compiled host kernels (Note [Host kernels] in kernels/_host.py): each against its numpy
reference on awkward sizes and layouts, in float32 and float64; what runs where there is no
compiler or the numpy references are asked for; and that disttensor's ops run them."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from mpirun import ROOT

from disttensor import backend
from kernels import KERNELS, _host
from kernels import layer_norm as ln

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


def as_accurate(got, ref, exact, dtype) -> None:
    """``got`` is as close to the float64 ``exact`` as the numpy reference ``ref`` is (twice
    its error, plus the dtype's tolerance): rows far from zero lose digits in any float32 sum,
    the compiled kernel must not lose more."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    err_got = np.max(np.abs(got - exact), initial=0.0)
    err_ref = np.max(np.abs(ref - exact), initial=0.0)
    assert err_got <= 2 * err_ref + TOL[dtype]["atol"], (err_got, err_ref)


def test_every_compiled_function_has_a_reference_of_its_name():
    for k in KERNELS.values():
        extra = set(k.load_host()) - set(k.references)
        assert not extra, f"{k.name}: compiled functions without a reference: {extra}"


@compiled
def test_the_host_backend_runs_the_compiled_kernels():
    host = backend.kernels(backend.NUMPY, "layer_norm")
    compiled_fns = ln.load_host()
    assert set(compiled_fns) == {"layer_norm_forward", "layer_norm_backward"}
    for name in compiled_fns:
        assert host[name] is not ln.REFERENCES[name]
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


def _status_with(env: dict) -> str:
    code = "import kernels._host as h, kernels.layer_norm as ln; print(h.status(), ln.load_host())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
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
    """Four processes with an empty cache: each builds, one file is left, all load it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISTTENSOR_CACHE": str(tmp_path)}
    code = "import kernels._host as h; assert h.library() is not None, h.status()"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env) for _ in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    assert len(list((tmp_path / "host-kernels").glob("*.so"))) == 1
    assert not list((tmp_path / "host-kernels").glob("*.tmp"))
