"""Compiled host kernels: the package's C programs, built with the machine's C compiler on first
use and loaded with ctypes (Note [Host kernels]).

Note [Host kernels]
    A row-wise kernel written in numpy is several passes over its rows, each streaming the
    whole array (kernels/layer_norm.py's Note [Row blocks]); layer norm's forward and backward
    take about twelve such passes, where one compiled loop over each row takes two. So the
    kernels whose numpy form is far slower than a compiled loop also have a C version
    (``<kernel>.c`` beside the ``.cu`` and the numpy reference), with the reference's names,
    signatures and results to float rounding. They are compiled the first time a process
    needs them, by the C compiler the environment names (``CC``, else ``cc`` or ``gcc`` on
    the PATH), into a cache directory (``DISTTENSOR_CACHE``, else ``~/.cache/disttensor``),
    keyed by the program text, the flags and the compiler, and written atomically, so the ranks
    of a job started at once share one build. No compiler, or a failed build, leaves the numpy
    references in place (``status()`` says why); ``DISTTENSOR_HOST_KERNELS=numpy`` chooses
    them on purpose (the test suite checks one against the other).

    The programs are plain C11 with no Python API (so no ABI to match), their loops written
    for the compiler's vectorizer (``#pragma omp simd`` under ``-fopenmp-simd``). Sums run in
    a fixed number of lanes combined in a fixed order, and contraction into fused
    multiply-adds is off, so a result does not depend on which vector instructions the CPU
    has: ranks on different machines compute the same bits from the same inputs.
    ``-fno-trapping-math`` lets gcc vectorize the clamps of host.h's exp below AVX-512: with
    trapping math, once it has folded the arithmetic after a clamp to a constant on the
    clamped side, it keeps a branch around the rest (an operation that might raise an
    exception flag may not run where the source does not run it), and a loop with a branch
    stays scalar. It changes no value (clang assumes it by default); nothing here reads the
    flags.

>>> isinstance(status(), str)
True
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ._cuda import read_source

SOURCES = ("layer_norm.c", "softmax.c", "softmax_xent.c")  # one program, in this order
FLAGS = ("-std=c11", "-O3", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math",
         "-ffp-contract=off", "-fPIC", "-shared")  # fmt: skip

_lock = threading.Lock()
_state: dict[str, object] = {}  # "lib": the CDLL or None, "why": the reason for None


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or (cc if os.path.isfile(cc) else None)
    return shutil.which("cc") or shutil.which("gcc")


def _cache_dir() -> Path:
    root = os.environ.get("DISTTENSOR_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "disttensor"
    )
    path = Path(root) / "host-kernels"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:  # a read-only home: a private temporary directory
        return Path(tempfile.mkdtemp(prefix="disttensor-host-"))


def program() -> str:
    """The C text compiled: the package's C files, in order, their includes pasted in
    (host.h once: it has a guard)."""
    return "".join(read_source(name) for name in SOURCES)


def _build() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("DISTTENSOR_HOST_KERNELS", "").strip().lower() == "numpy":
        return None, "DISTTENSOR_HOST_KERNELS=numpy: the numpy references run"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (set CC): the numpy references run"
    code = program()
    key = hashlib.sha256("\0".join((code, *FLAGS, os.path.realpath(cc))).encode()).hexdigest()
    lib = _cache_dir() / f"host-{key[:20]}.so"
    if not lib.exists():
        tmp = lib.with_name(f"{lib.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        cmd = [cc, *FLAGS, "-x", "c", "-", "-o", str(tmp), "-lm"]
        try:
            done = subprocess.run(cmd, input=code, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"{cc} could not run ({e}): the numpy references run"
        if done.returncode:
            tmp.unlink(missing_ok=True)
            return None, f"{cc} failed ({done.stderr.strip()[:500]}): the numpy references run"
        os.replace(tmp, lib)  # atomic: ranks building at once each install a whole file
    try:
        return ctypes.CDLL(str(lib)), f"compiled with {cc} ({lib})"
    except OSError as e:
        return None, f"the compiled kernels did not load ({e}): the numpy references run"


def library() -> ctypes.CDLL | None:
    """The compiled program, built on first use; None where it cannot be (``status()``)."""
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                _state["lib"], _state["why"] = _build()
    return _state["lib"]  # type: ignore[return-value]


def status() -> str:
    """Which host kernels run, and why (the compiled ones, or the numpy references)."""
    library()
    return str(_state["why"])


def entries(signatures: dict[str, list]) -> dict[Any, dict[str, Any]] | None:
    """The compiled program's entries ``<name>_f32`` and ``<name>_f64`` of every name of
    ``signatures`` (name -> ctypes argument types; they return nothing), by dtype; None where
    the program is not built (``status()``)."""
    lib = library()
    if lib is None:
        return None
    out: dict[Any, dict[str, Any]] = {}
    for dtype, sfx in ((np.float32, "f32"), (np.float64, "f64")):
        fns = out[np.dtype(dtype)] = {}
        for name, argtypes in signatures.items():
            f = getattr(lib, f"{name}_{sfx}")
            f.argtypes, f.restype = argtypes, None
            fns[name] = f
    return out


def pointer(a) -> ctypes.c_void_p:
    """The address of a numpy array's first element (None: a null pointer)."""
    return ctypes.c_void_p(None if a is None else a.ctypes.data)
