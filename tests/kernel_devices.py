"""The array modules the CUDA kernels' tests run on: CuPy on a GPU, and kernels/emulate.py's
stand-in for CuPy on the CPU (g++). One fixture parameter each; a missing one is skipped."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from kernels.emulate import emulated_cupy

PARAMS = ["emulated", "gpu"]


def array_module(request: Any) -> Any:
    """The ``cupy`` module (or its CPU stand-in) of the fixture parameter, or a skip."""
    if request.param == "gpu":
        cupy = pytest.importorskip("cupy", reason="CuPy is not installed: no GPU run")
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                pytest.skip("CuPy finds no CUDA device")
        except cupy.cuda.runtime.CUDARuntimeError as e:
            pytest.skip(f"CuPy finds no CUDA device: {e}")
        return cupy
    if shutil.which("g++") is None:
        pytest.skip("g++ not found: the CPU emulation of the CUDA kernels is not run")
    return emulated_cupy()
