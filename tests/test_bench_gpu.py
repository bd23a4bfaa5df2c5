"""bench/gpu.py where there is no GPU: the command line, the skip message of ``--quick``, the
bandwidth-floor arithmetic, and each fused kernel against the unfused composition it is
timed against, both run on the CPU (kernels/emulate.py's stand-in for CuPy)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from mpirun import ROOT

spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu)


def test_command_line():
    args = gpu.parse_args([])
    assert (args.only, args.quick, args.rounds, args.dtype) == ("abcde", False, 8, "float32")
    args = gpu.parse_args(["--quick", "--only", "d, B"])
    assert (args.only, args.rounds) == ("bd", 2)
    for bad in (["--only", "f"], ["--only", ","], ["--rounds", "0"], ["--dtype", "int8"]):
        with pytest.raises(SystemExit):
            gpu.parse_args(bad)


def test_quick_run_says_why_it_skips():
    """Here (no CuPy, no GPU) the smoke run exits 0 with the reason; with a GPU it runs the
    four sections at small sizes."""
    out = subprocess.run(
        [sys.executable, "bench/gpu.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    missing = gpu.gpu_missing()
    if missing is not None:
        assert out.stdout == f"bench/gpu.py: skipped: {missing}\n"
        assert "CuPy" in missing
    else:
        for title in ("(a) dispatch", "(b) fused kernels", "(c) demos", "(d) all-reduce"):
            assert title in out.stdout, out.stdout


def test_bandwidth_floor_arithmetic():
    n, r, c = 1000, 10, 300
    assert gpu.bytes_moved("adam_update", (n,), 4) == 7 * n * 4
    assert gpu.bytes_moved("bucket_pack", (3, n), 8) == 2 * 3 * n * 8
    assert gpu.bytes_moved("bucket_unpack", (3, n), 4) == 2 * 3 * n * 4
    assert gpu.bytes_moved("xent_forward", (r, c), 4) == r * c * 4 + r * 8 + 3 * r * 4
    assert gpu.bytes_moved("xent_backward", (r, c), 4) == 2 * r * c * 4 + r * 8 + 3 * r * 4
    assert gpu.bytes_moved("layer_norm_forward", (r, c), 4) == (2 * r * c + 2 * c + 2 * r) * 4
    assert gpu.bytes_moved("layer_norm_backward", (r, c), 4) == (3 * r * c + 2 * r + 3 * c) * 4
    with pytest.raises(ValueError, match="unknown kernel"):
        gpu.bytes_moved("fft", (4,), 4)
    # a 1 GB copy in 1 ms moves 2 TB/s; a kernel moving 3 GB then takes 1.5 ms at the floor
    bw = gpu.copy_bandwidth(10**9, 1e-3)
    assert bw == 2e12 and gpu.floor_ratio(3e-3, 3 * 10**9, bw) == pytest.approx(2.0)
    assert gpu.bus_bandwidth(10**9, 1.0, 2) == 1e9 and gpu.bus_bandwidth(10**9, 1.0, 1) == 1e9
    assert set(gpu.KERNEL_SIZES) == {
        "adam_update",
        "xent_forward",
        "xent_backward",
        "layer_norm_forward",
        "layer_norm_backward",
        "bucket_pack",
        "bucket_unpack",
    }


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")
@pytest.mark.parametrize("name", list(gpu.KERNEL_SIZES))
def test_fused_kernel_and_its_composition_agree_on_the_emulator(name):
    """What (b) times, run on the CPU: the kernel through its CuPy loader on the emulated
    device, the composition with numpy standing in for CuPy's functions; twice, so updates
    of state (Adam's) compound the same way in both."""
    from kernels.emulate import emulated_cupy

    emu = emulated_cupy()
    cp = SimpleNamespace(**{**vars(emu), "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
                            "asnumpy": np.asarray})  # fmt: skip
    dims = {"adam_update": (300,)}.get(name, (3, 70) if name.startswith("bucket") else (5, 37))
    for dtype in (np.float32, np.float64):
        fused, composed = gpu.kernel_pair(cp, name, dims, dtype, np.random.default_rng(2))
        for _ in range(2):
            got, want = fused(), composed()
            assert gpu.outputs_agree(cp, got, want, dtype)
        # the check before the timing fails on a result off by a part in a thousand
        off = [np.asarray(a) * 1.001 for a in (want if isinstance(want, (list, tuple)) else [want])]
        assert not gpu.outputs_agree(cp, got, off, dtype)
