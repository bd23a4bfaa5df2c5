"""The array library of each shard: numpy on the host, CuPy (or a registered stand-in) on a GPU.

Note [Array backends]
    A DistTensor's shard is a numpy array on the host or a device array (a CuPy array on a
    GPU). Everything that computes on shards (local kernels, reshard packing, printing,
    creation, random streams, optimizer updates, bucket packing) asks this module for the
    shard's ``Backend`` (``of(a)``: one dict lookup on ``type(a)``) and uses its array module
    ``xp``, never ``np.`` on device data; host metadata (shapes, indices, dtypes, small numpy
    scalars) stays numpy. A backend is registered once per array type (``register``); CuPy's
    registration is built in (made when a GPU is selected, or when a CuPy array first reaches
    ``lookup``), and a stand-in registers itself the same way (tests/fake_device.py: a CPU
    array that behaves like CuPy, so CI catches numpy-only calls on device data).

    * The CPU path keeps its numpy code (and speed): an op declares its device kernel
      separately (``dispatch.Op(device=...)``), and the dispatch fast path tests the shard's
      type only once a device backend is registered. An op without a device kernel raises
      NotImplementedError naming it and "GPU" on device data (``unsupported``), as do the
      host-only pieces outside dispatch (``host_only``). numpy functions dt does not
      implement run with the device module's function of the same name, or numpy's on host
      copies, accounted (Note [The replicate fallback on a device] in dispatch.py);
      checkpoints go through the host once per piece (Note [Checkpoints of device tensors]
      in checkpoint/__init__.py).
    * Host and device data never mix silently: DistTensors on different backends in one op,
      or a host array of one or more axes among device tensors, raise a TypeError before
      any communication (a 0-d numpy array is a scalar and is moved, as numpy's scalars
      are); the library's own host constants (masks, one-hot tables) are moved explicitly
      (``constant``). ``x.numpy()`` always returns host numpy, ``x.to_local()`` the device
      array, ``x.to_device(...)`` copies explicitly, and a write ``x[key] = host_value``
      copies the value in.
    * ``current()`` is the backend new tensors are made on (factories, ``shard_tensor`` and
      ``dtensor_from_local`` of host data, random streams): "cpu", "gpu" or "auto", from
      ``set_device``, ``dt.init_mesh(..., device=)`` or ``DISTTENSOR_DEVICE``. With "gpu"
      each rank uses GPU ``local_rank % gpu_count``, the local rank from MPI's shared-memory
      split (simulated ranks share the process's first GPU). Inside ``dt.simulate`` the
      setting is per simulated rank; elsewhere it is the process's.
    * The fused kernels of ``kernels/`` run through ``kernels(backend, name)``: the numpy
      references on the host, ``kernels.<name>.load(cupy)`` on a GPU, loaded once per
      process and backend.

>>> import numpy as np
>>> of(np.zeros(2)).name, of(np.zeros(2)).device
('numpy', False)
>>> sorted(kernels(NUMPY, "adam"))
['adam_update']
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np


class Backend:
    """One array library: its module ``xp``, how data moves between it and the host, and
    what the fused kernels and a scatter-add are on it.

    ``to_host(a)`` returns a numpy copy; ``from_host(a, dtype=None)`` a new array of this
    backend holding a numpy array's values; ``load(name)`` the functions of kernel ``name``
    (kernels.KERNELS) for this backend; ``scatter_add(out, idx, values)`` adds rows in place
    as ``np.add.at``; ``device_of(a)`` names the device of an array ("cpu", "cuda:0").
    """

    def __init__(
        self,
        name: str,
        xp: Any,
        array_type: type,
        *,
        device: bool,
        to_host: Callable[[Any], np.ndarray],
        from_host: Callable[..., Any],
        load: Callable[[str], dict[str, Callable[..., Any]]],
        scatter_add: Callable[[Any, Any, Any], None],
        device_of: Callable[[Any], str],
        activate: Callable[[], None] | None = None,
        collectives: str | None = None,
    ) -> None:
        self.name, self.xp, self.array_type, self.device = name, xp, array_type, device
        self.collectives = collectives  # a device collective library ("nccl"), if any
        self.to_host, self.from_host, self.load = to_host, from_host, load
        self.scatter_add, self.device_of = scatter_add, device_of
        self.activate = activate or (lambda: None)  # binds the calling rank to its device
        self._kernels: dict[str, dict[str, Callable[..., Any]]] = {}

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """``a`` (host data or an array of this backend) as an array of this backend: a copy
        from the host where it is host data, ``a`` itself where it already fits."""
        if type(a) is self.array_type:
            return a if dtype is None or a.dtype == dtype else a.astype(dtype)
        if self.device:
            return self.from_host(np.asarray(a), dtype)
        return np.asarray(a, dtype=dtype)

    def __repr__(self) -> str:
        return f"<disttensor backend {self.name}>"


def _np_from_host(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    return np.array(a, dtype=dtype, copy=True)


def _references(name: str) -> dict[str, Callable[..., Any]]:
    """The host functions of kernel ``name``: the compiled ones where there are (Note [Host
    kernels] in kernels/_host.py), the numpy references for the rest."""
    from kernels import KERNELS  # the top-level package next to disttensor

    k = KERNELS[name]
    return {**k.references, **k.load_host()}


NUMPY = Backend(
    "numpy",
    np,
    np.ndarray,
    device=False,
    to_host=lambda a: np.array(a, copy=True),
    from_host=_np_from_host,
    load=_references,
    scatter_add=np.add.at,
    device_of=lambda a: "cpu",
)

# Every array type a shard may have, and the device ones: sets mutated in place by
# ``register``, so modules that bound them at import see later registrations (dispatch's fast
# path tests ``type(result) in ARRAYS``).
ARRAYS: set[type] = {np.ndarray}
DEVICE_ARRAYS: set[type] = set()
_BY_TYPE: dict[type, Backend] = {np.ndarray: NUMPY}
_DEVICES: dict[str, Callable[[], Backend]] = {}  # device name -> factory (makes and registers)
_LAZY: list[Callable[[type], Backend | None]] = []  # array types known before registration


def register(backend: Backend) -> None:
    """Make ``backend`` the backend of its array type (idempotent)."""
    _BY_TYPE[backend.array_type] = backend
    ARRAYS.add(backend.array_type)
    if backend.device:
        DEVICE_ARRAYS.add(backend.array_type)


def register_device(name: str, factory: Callable[[], Backend]) -> None:
    """``set_device(name)`` will use ``factory()`` (called once, at the first selection; it
    registers and returns the backend, or raises a RuntimeError saying what is missing)."""
    _DEVICES[name] = factory


def of(a: Any) -> Backend:
    """The backend of array ``a`` (numpy for anything that is not a registered device array:
    host data, scalars, lists)."""
    b = _BY_TYPE.get(type(a))
    return b if b is not None else lookup(a)


def of_type(t: type) -> Backend:
    """The backend of arrays of type ``t`` (numpy's for host types)."""
    b = _BY_TYPE.get(t)
    if b is not None:
        return b
    for probe in _LAZY:
        b = probe(t)
        if b is not None:
            return b
    return NUMPY


def lookup(a: Any) -> Backend:
    """``of`` for a type not seen yet: a CuPy array registers CuPy's backend here (so
    ``shard_tensor`` and ``dtensor_from_local`` accept one with no device selected)."""
    return of_type(type(a))


def xp(a: Any) -> Any:
    """The array module of ``a``: numpy, cupy, or a registered stand-in's."""
    return of(a).xp


def is_device(a: Any) -> bool:
    """Whether ``a`` is an array on a device (not host data)."""
    return type(a) in DEVICE_ARRAYS or of(a).device


def to_host(a: Any) -> np.ndarray:
    """``a`` as a host numpy array: ``a`` itself when it is one, else a copy from the device."""
    if type(a) is np.ndarray:
        return a
    b = of(a)
    return b.to_host(a) if b.device else np.asarray(a)


def kernels(backend: Backend, name: str) -> dict[str, Callable[..., Any]]:
    """The functions of fused kernel ``name`` (kernels.KERNELS) for ``backend``: the numpy
    references on the host, the CUDA programs on a GPU; loaded once per process."""
    got = backend._kernels.get(name)
    if got is None:
        with _lock:
            got = backend._kernels.get(name)
            if got is None:
                got = backend._kernels[name] = backend.load(name)
    return got


_lock = threading.RLock()  # reentrant: a loader may ask for another backend's kernels


def constant(like: Any, a: np.ndarray) -> Any:
    """Host constant ``a`` (a mask, a one-hot table) on the device of ``like`` (a DistTensor
    or an array) where it lives on one, else ``a`` itself: the library's own explicit copy,
    as host arrays do not mix with device tensors in an op.

    >>> constant(np.zeros(2), np.ones(2))
    array([1., 1.])
    """
    b = of(getattr(like, "_local", like))
    return b.asarray(a) if b.device else a


# -- errors on device data -------------------------------------------------------------------
def unsupported(what: str, backend: Backend) -> NotImplementedError:
    """The error of an op or function that has no device implementation yet."""
    return NotImplementedError(
        f"{what} is not implemented on GPU (device) arrays yet (backend {backend.name}); "
        "compute it on the host: y = dt.<op>(x.to_device('cpu')), then .to_device('gpu')"
    )


def host_only(what: str, *values: Any) -> None:
    """Raise ``unsupported(what)`` when a DistTensor or array among ``values`` (lists and
    tuples searched too) is on a device: the entry check of the host-only families."""
    for v in values:
        if isinstance(v, (list, tuple)):
            host_only(what, *v)
            continue
        local = getattr(v, "_local", v)  # a DistTensor's shard, or the value itself
        if type(local) in DEVICE_ARRAYS:
            raise unsupported(what, _BY_TYPE[type(local)])


def mixed(what: str, a: Backend, b: Backend) -> TypeError:
    """The error of host and device data (or two devices) in one op."""
    return TypeError(
        f"{what}: operands on different devices ({a.name} and {b.name}); disttensor never "
        "copies between them silently: move one with x.to_device(...) (a DistTensor) or "
        "dt.shard_tensor(array, mesh, placements) (an array) first"
    )


# -- device selection ------------------------------------------------------------------------
class _Selected(threading.local):
    backend: Backend | None = None  # a simulated rank's own choice (dt.simulate threads)


_selected = _Selected()
_process: list[Backend | None] = [None]  # the process-wide choice; None: not decided yet


def current() -> Backend:
    """The backend new tensors are made on (Note [Array backends])."""
    b = _selected.backend
    if b is not None:
        return b
    b = _process[0]
    if b is None:
        b = select(os.environ.get("DISTTENSOR_DEVICE", "cpu"))
        b.activate()
        _process[0] = b
    return b


def set_device(device: str) -> Backend:
    """Select where new tensors live: "cpu", "gpu" (CuPy; each rank its GPU ``local_rank %
    count``), "auto" (the GPU when CuPy sees one, else the CPU), or a registered device's
    name. Inside ``dt.simulate`` it applies to the calling simulated rank, elsewhere to the
    process. Returns the backend chosen.

    >>> set_device("cpu").name
    'numpy'
    """
    b = select(device)
    b.activate()
    from . import comm  # the comm layer sits above this module

    if comm.world_size_in_context() is not None:
        _selected.backend = b
    else:
        _process[0] = b
    return b


def get_device() -> str:
    """The selected device: "cpu", "gpu" or a registered device's name.

    >>> get_device()
    'cpu'
    """
    b = current()
    if not b.device:
        return "cpu"
    return next((n for n, f in _DEVICES.items() if _made.get(n) is b), b.name)


_made: dict[str, Backend] = {}


def select(device: Any) -> Backend:
    """The backend of ``device`` ("cpu", "gpu", "auto" or a registered name), without
    selecting it: what ``x.to_device(device)`` copies to.

    >>> select("cpu") is NUMPY
    True
    """
    if not isinstance(device, str):
        raise TypeError(f"device must be a string ('cpu', 'gpu' or 'auto'), got {device!r}")
    name = device.strip().lower()
    if name == "cpu":
        return NUMPY
    if name == "auto":
        try:
            return _make("gpu")
        except RuntimeError:
            return NUMPY
    if name not in _DEVICES:
        raise ValueError(
            f"unknown device {device!r}: use 'cpu', 'gpu' or 'auto'"
            + (f" (registered: {sorted(_DEVICES)})" if len(_DEVICES) > 1 else "")
        )
    return _make(name)


def _make(name: str) -> Backend:
    b = _made.get(name)
    if b is None:
        with _lock:
            b = _made.get(name)
            if b is None:
                b = _made[name] = _DEVICES[name]()
    return b


# -- CuPy ------------------------------------------------------------------------------------
def _cupy_module() -> Any:
    """CuPy, with a GPU it can see; RuntimeError saying which is missing."""
    try:
        import cupy
    except ImportError as e:
        raise RuntimeError(
            "device='gpu' needs CuPy with a visible GPU: CuPy is not installed "
            f"({e}); install the gpu extra (pip install 'disttensor[gpu]', or cupy-cuda12x), "
            "or use device='cpu' (or 'auto', which falls back to the CPU)"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device: CUDARuntimeError
        raise RuntimeError(
            f"device='gpu' needs CuPy with a visible GPU: CuPy finds none ({e}); "
            "use device='cpu' (or 'auto')"
        ) from None
    if count < 1:
        raise RuntimeError("device='gpu' needs CuPy with a visible GPU: CuPy finds none")
    return cupy


def _local_rank() -> int:
    """This rank's index among the ranks on its node: MPI's shared-memory split; 0 for
    simulated ranks (threads of one process: they share its first GPU, so the threads
    backend never copies between devices)."""
    from . import comm

    if comm.world_size_in_context() is not None:
        return 0
    comm.world()  # MPI is started through the comm layer (its watchdog, its abort hook)
    from mpi4py import MPI

    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def _cupy_backend() -> Backend:
    cupy = _cupy_module()
    import cupyx

    def activate() -> None:
        count = cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(_local_rank() % count).use()

    def load(name: str) -> dict[str, Callable[..., Any]]:
        from kernels import KERNELS

        return KERNELS[name].load(cupy)

    b = Backend(
        "cupy",
        cupy,
        cupy.ndarray,
        device=True,
        to_host=cupy.asnumpy,
        from_host=lambda a, dtype=None: cupy.asarray(a, dtype=dtype),
        load=load,
        scatter_add=cupyx.scatter_add,
        device_of=lambda a: f"cuda:{a.device.id}",
        activate=activate,
        collectives="nccl",
    )
    register(b)
    return b


def _cupy_probe(t: type) -> Backend | None:
    cupy = sys.modules.get("cupy")
    if cupy is None or not issubclass(t, cupy.ndarray):
        return None
    return _make("gpu")


register_device("gpu", _cupy_backend)
_LAZY.append(_cupy_probe)
