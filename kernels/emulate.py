"""Run this package's CUDA programs on the CPU: a stand-in for the ``cupy`` module, for
checking the kernels and their loaders where there is no GPU.

``emulated_cupy()`` gives the part of CuPy's API the loaders use. Its arrays are numpy arrays
(a subclass with CuPy's ``.data.ptr`` and ``.get()``); its ``RawModule`` compiles the program
text the loader passes (the text NVRTC would get) with g++ and kernels/emulator.h, which runs
each block as one fiber per CUDA thread on one CPU thread. A launch first checks its
arguments against the kernel's parameter types, so a loader that passes the wrong number or
kind of arguments fails here as it would corrupt memory on a GPU. Each CUDA thread costs a
context switch per barrier: for small sizes only.

>>> cp = emulated_cupy()
>>> x = cp.asarray([1.0, 2.0])
>>> x.data.ptr == x.__array_interface__["data"][0], x.get()
(True, array([1., 2.]))
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

# one letter per parameter type, as emulator.h's signature() writes them
_CODES = {
    np.dtype(np.float32): ("f", ctypes.c_float),
    np.dtype(np.float64): ("d", ctypes.c_double),
    np.dtype(np.int32): ("i", ctypes.c_int),
    np.dtype(np.int64): ("q", ctypes.c_longlong),
    np.dtype(np.uint64): ("Q", ctypes.c_ulonglong),
}
_FLAGS = ("-std=c++17", "-O1", "-ffp-contract=off", "-fPIC", "-shared")
_ENTRY = re.compile(r'extern "C" EMU_ENTRY void (\w+)\s*\(')
_built: dict[str, ctypes.CDLL] = {}  # compiled programs by their text's hash
_workdir: list[str] = []


class EmulatedArray(np.ndarray):
    """A numpy array that answers to CuPy's ``.data.ptr`` and ``.get()``."""

    @property
    def data(self) -> Any:  # CuPy's MemoryPointer, as far as the loaders look
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def get(self) -> np.ndarray:
        """A plain numpy copy (CuPy's device-to-host transfer)."""
        return np.array(self)


def _wrap(a: Any) -> EmulatedArray:
    return np.asarray(a).view(EmulatedArray)


def _compile(code: str) -> ctypes.CDLL:
    """The program built with a launcher ``emu_<name>`` and ``emu_sig_<name>`` per entry."""
    key = hashlib.sha256(code.encode()).hexdigest()[:16]
    if key in _built:
        return _built[key]
    gxx = shutil.which("g++")
    if gxx is None:
        raise RuntimeError("emulated CUDA needs g++ on the PATH")
    # the entry names, from the program with its macros expanded (no headers: it has none)
    pre = subprocess.run(
        [gxx, "-E", "-P", "-x", "c++", "-D__global__=EMU_ENTRY", "-"],
        input=code,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = _ENTRY.findall(pre)
    wrappers = "".join(
        f'extern "C" int emu_{n}(const unsigned* g, const unsigned* b, void** a)'
        f" {{ return emu::launch({n}, g, b, a); }}\n"
        f'extern "C" const char* emu_sig_{n}() {{ return emu::signature({n}); }}\n'
        for n in names
    )
    if not _workdir:
        _workdir.append(tempfile.mkdtemp(prefix="disttensor-emu-"))
    lib = Path(_workdir[0]) / f"{key}.so"
    with resources.as_file(resources.files(__package__) / "emulator.h") as header:
        cmd = [gxx, *_FLAGS, "-include", str(header), "-x", "c++", "-", "-o", str(lib)]
        done = subprocess.run(cmd, input=code + wrappers, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"g++ could not build the emulated program:\n{done.stderr}")
    _built[key] = ctypes.CDLL(str(lib))
    return _built[key]


class _Function:
    """One entry point: ``f(grid, block, args)`` as CuPy's RawKernel is called."""

    def __init__(self, lib: ctypes.CDLL, name: str) -> None:
        self.name = name
        self.launch = getattr(lib, f"emu_{name}")
        sig = getattr(lib, f"emu_sig_{name}")
        sig.restype = ctypes.c_char_p
        self.signature = sig().decode()

    def __call__(self, grid: tuple, block: tuple, args: tuple) -> None:
        codes, values = "", []
        for a in args:
            if isinstance(a, np.ndarray):  # an array argument is its address
                codes += "p"
                values.append(ctypes.c_void_p(a.__array_interface__["data"][0]))
            elif isinstance(a, np.generic) and a.dtype in _CODES:
                code, ctype = _CODES[a.dtype]
                codes += code
                values.append(ctype(a.item()))
            else:
                raise TypeError(f"{self.name}: cannot pass {type(a).__name__} to a kernel")
        null = [
            c == "Q" and k == "p" and v.value == 0 for c, k, v in zip(codes, self.signature, values)
        ]
        if any(null):  # the loaders pass a 64-bit 0 for an absent array: a null pointer
            codes = "".join("p" if n else c for c, n in zip(codes, null))
        if codes != self.signature:
            raise TypeError(
                f"{self.name}: arguments {codes!r}, kernel parameters {self.signature!r}"
            )
        dims = [(ctypes.c_uint * 3)(*(tuple(d) + (1, 1))[:3]) for d in (grid, block)]
        argv = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        if self.launch(dims[0], dims[1], argv):
            raise RuntimeError(f"{self.name}: the block deadlocked at a barrier")


class _RawModule:
    def __init__(self, code: str, options: tuple = ()) -> None:
        self.lib = _compile(code)

    def get_function(self, name: str) -> _Function:
        return _Function(self.lib, name)


def emulated_cupy() -> SimpleNamespace:
    """A ``cupy`` stand-in for the loaders: arrays on the host, kernels emulated on the CPU.

    >>> cp = emulated_cupy()
    >>> cp.zeros(2, np.float32).get()
    array([0., 0.], dtype=float32)
    """

    def asarray(a: Any, dtype: Any = None) -> EmulatedArray:
        if isinstance(a, EmulatedArray) and (dtype is None or a.dtype == dtype):
            return a
        return _wrap(np.array(a, dtype))  # from the host: new memory, as a transfer makes

    return SimpleNamespace(
        ndarray=EmulatedArray,
        RawModule=_RawModule,
        asarray=asarray,
        ascontiguousarray=lambda a: _wrap(np.asarray(a, order="C")),
        empty=lambda shape, dtype=float: _wrap(np.empty(shape, dtype)),
        zeros=lambda shape, dtype=float: _wrap(np.zeros(shape, dtype)),
        empty_like=lambda a: _wrap(np.empty_like(a)),
        broadcast_to=lambda a, shape: _wrap(np.broadcast_to(a, shape)),
        where=lambda c, a, b: _wrap(np.where(c, a, b)),
        isfinite=lambda a: _wrap(np.isfinite(a)),
        # what the activations' composites (kernels/activations.py) call
        abs=lambda a: _wrap(np.abs(a)),
        exp=lambda a: _wrap(np.exp(a)),
        tanh=lambda a: _wrap(np.tanh(a)),
        result_type=np.result_type,
    )
