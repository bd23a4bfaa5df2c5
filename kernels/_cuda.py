"""What the CuPy loaders share: the program text, the compiled module, checks and launch shapes.

Nothing here imports CuPy: a loader receives the ``cupy`` module and passes it in, so the
package imports (and its numpy references run) where CuPy is absent.

>>> '#include "common.cuh"' in read_source("adam.cu")
False
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import numpy as np

# NVRTC options of every module: the sources are C++17 and header-free.
OPTIONS = ("--std=c++17",)
THREADS = 256  # threads per block of the elementwise kernels
MAX_BLOCKS = 1 << 16  # grid cap; the kernels loop (grid-stride) over what a grid does not cover

NULL = np.uint64(0)  # an absent array argument: a null device address (8 bytes, as a pointer)

_INCLUDE = re.compile(r'^#include "([\w.]+)"\n', re.M)


def read_source(name: str) -> str:
    """The CUDA program ``name`` of this package as NVRTC compiles it: each local
    ``#include "file"`` line replaced by that file, so the text is the whole program (CuPy's
    compile cache is keyed on it).

    >>> read_source("adam.cu").count("struct Arith<float> {")  # common.cuh, pasted once
    1
    """
    text = resources.files(__package__).joinpath(name).read_text()
    return _INCLUDE.sub(lambda m: read_source(m.group(1)), text)


def build(cupy: Any, name: str) -> Any:
    """``cupy.RawModule`` of the program ``name`` (compiled on the first kernel lookup)."""
    return cupy.RawModule(code=read_source(name), options=OPTIONS)


def suffix(dtype: Any, what: str) -> str:
    """The entry-point suffix of a floating dtype: "f32" or "f64"; else TypeError.

    >>> suffix(np.float32, "x")
    'f32'
    """
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return "f32"
    if dtype == np.float64:
        return "f64"
    raise TypeError(f"{what}: the CUDA kernels take float32 or float64, got {dtype}")


def contiguous(cupy: Any, what: str, **arrays: Any) -> None:
    """Raise unless each of ``arrays`` is a C-contiguous CuPy array (the kernels index flat)."""
    for name, a in arrays.items():
        if not isinstance(a, cupy.ndarray) or not a.flags.c_contiguous:
            raise ValueError(f"{what}: {name} must be a C-contiguous cupy array")


def blocks(n: int, threads: int = THREADS) -> int:
    """Blocks of ``threads`` for a grid-stride loop over ``n`` elements (at least one).

    >>> blocks(1), blocks(257), blocks(10**12)
    (1, 2, 65536)
    """
    return max(1, min(-(-n // threads), MAX_BLOCKS))


def row_threads(cols: int) -> int:
    """Threads of a one-block-per-row kernel: about 8 columns per thread, a multiple of 32
    (the block reductions need whole warps), 32 to 1024.

    >>> row_threads(7), row_threads(1025), row_threads(50257)
    (32, 160, 1024)
    """
    per_thread = -(-cols // 8)
    return min(1024, max(32, -(-per_thread // 32) * 32))
