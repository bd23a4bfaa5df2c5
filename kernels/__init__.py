"""Local kernels that are not single library calls: each a CUDA source next to its numpy
reference (docs/kernels.md).

``KERNELS`` lists them by name. Each entry gives the ``.cu`` file shipped in this package, the
numpy reference functions (plain numpy, any sizes; what the CPU path runs) and a loader that,
given the ``cupy`` module, compiles the source with ``cupy.RawModule`` and returns CuPy
functions of the same names and signatures. CuPy is only touched by a loader, so this package
imports, and its references run, without it. ``kernels.emulate`` stands in for CuPy on the
CPU (g++), to run the CUDA programs where there is no GPU.

>>> sorted(KERNELS)
['activations', 'adam', 'bucket', 'layer_norm', 'softmax', 'softmax_xent']
>>> sorted(KERNELS["layer_norm"].references)
['layer_norm_backward', 'layer_norm_forward']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import activations, adam, bucket, layer_norm, softmax, softmax_xent
from ._cuda import read_source


@dataclass(frozen=True)
class Kernel:
    """One kernel: its CUDA ``source`` file, numpy ``references`` by name, its ``load`` and
    ``load_host``: the compiled host versions of some references (Note [Host kernels] in
    kernels/_host.py), or nothing where there are none or they cannot be built."""

    name: str
    source: str
    references: Mapping[str, Callable[..., Any]]
    load: Callable[[Any], dict[str, Callable[..., Any]]]
    load_host: Callable[[], dict[str, Callable[..., Any]]] = dict

    def read_source(self) -> str:
        """The program as NVRTC compiles it (includes pasted in).

        >>> "adam_update_f64" in KERNELS["adam"].read_source()
        True
        """
        return read_source(self.source)


KERNELS: dict[str, Kernel] = {
    k.name: k
    for k in (
        Kernel(name, m.SOURCE, m.REFERENCES, m.load, getattr(m, "load_host", dict))
        for name, m in (
            ("adam", adam),
            ("softmax_xent", softmax_xent),
            ("layer_norm", layer_norm),
            ("softmax", softmax),
            ("bucket", bucket),
            ("activations", activations),
        )
    )
}

__all__ = ["KERNELS", "Kernel", "read_source"]
