"""Factories that allocate only the local shard: zeros, ones, full, empty, arange, rand, randn.

``rand``/``randn`` use a counter-based generator (``_philox.py``): element i of the global
tensor is a function of (seed, i) alone, so every mesh and placement gives bit-identical global
values, equal to what one process draws, without the global tensor ever existing.

Tensors are made on the selected device (``dt.set_device``; Note [Array backends] in
backend.py): zeros, ones, empty and full by the device's own array module, the others
(arange, the random streams) on the host and copied (Note [Random streams on a device]).

>>> import disttensor as dt
>>> mesh = dt.ProcessMesh([0])
>>> dt.arange(4, mesh=mesh, placements=[dt.Shard(0)]).to_local()
array([0, 1, 2, 3])
>>> bool((dt.rand((2, 3), seed=7, mesh=mesh, placements=[dt.Shard(1)]).to_local() < 1).all())
True
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _philox, backend, comm
from .mesh import ProcessMesh
from .placement import Placement, Replicate
from .spec import DistSpec
from .tensor import DistTensor, agree_on_mesh, check_world, code_of, from_spec_block, token


def _spec(
    shape: Any,
    dtype: Any,
    mesh: ProcessMesh | None,
    placements: Sequence[Placement] | None,
    what: str,
) -> DistSpec:
    if mesh is None:  # default: the whole world as a 1-D mesh, replicated
        mesh = ProcessMesh(list(range(comm.get_world_size())))
    check_world(mesh, what)
    if placements is None:
        placements = [Replicate()] * mesh.ndim
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    return DistSpec.make(mesh, placements, shape, dtype, what=what)


def _factory(fill):
    def make(shape, dtype=None, *, mesh=None, placements=None, requires_grad=False):
        spec = _spec(shape, np.float64 if dtype is None else dtype, mesh, placements, fill.__name__)
        be = backend.current()
        f = fill if not be.device else getattr(be.xp, fill.__name__)  # made on the device
        out = from_spec_block(
            lambda sl: f(tuple(s.stop - s.start for s in sl), spec.dtype), spec, requires_grad, be
        )
        return _named(out, code, spec.shape, spec.dtype)

    code = code_of(fill.__name__)
    make.__name__ = fill.__name__
    make.__doc__ = f"The global tensor of ``np.{fill.__name__}(shape, dtype)``, local shard only."
    return make


zeros = _factory(np.zeros)
ones = _factory(np.ones)
empty = _factory(np.empty)


def full(
    shape: Any,
    fill_value: Any,
    dtype: Any = None,
    *,
    mesh: ProcessMesh | None = None,
    placements: Sequence[Placement] | None = None,
    requires_grad: bool = False,
) -> DistTensor:
    """The global tensor of ``np.full(shape, fill_value, dtype)``, local shard only."""
    dtype = np.asarray(fill_value).dtype if dtype is None else dtype
    spec = _spec(shape, dtype, mesh, placements, "full")
    be = backend.current()
    out = from_spec_block(
        lambda sl: be.xp.full(tuple(s.stop - s.start for s in sl), fill_value, spec.dtype),
        spec,
        requires_grad,
        be,
    )
    return _named(out, _FULL, spec.shape, spec.dtype, fill_value)


def _named(out: DistTensor, *made: Any) -> DistTensor:
    """``out`` with the lineage of how it was made (Note [Lineage names the tensor] in
    tensor.py): a factory's code and arguments."""
    out._lin = hash(tuple(token(m) for m in made))
    return out


_FULL = code_of("full")
_ARANGE = code_of("arange")
_RANDOM = code_of("random")


def arange(
    start: Any,
    stop: Any = None,
    step: Any = 1,
    dtype: Any = None,
    *,
    mesh: ProcessMesh | None = None,
    placements: Sequence[Placement] | None = None,
    requires_grad: bool = False,
) -> DistTensor:
    """``np.arange`` as a 1-D DistTensor; each rank computes its own values (same as numpy's)."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("arange: step must not be zero")
    if dtype is None:  # numpy's rule: the common type of start, stop and step
        dtype = np.result_type(*(np.asarray(v) for v in (start, stop, step)))
    # numpy's first two values; it fills the rest as first + i * (second - first) in the dtype
    head = np.arange(start, start + 2 * step, step, dtype=dtype)
    n = max(0, math.ceil((stop - start) / step))
    spec = _spec((n,), head.dtype, mesh, placements, "arange")
    first = head[0]
    delta = head[1] - head[0] if len(head) > 1 else head.dtype.type(step)

    def block(sl):
        out = first + np.arange(sl[0].start, sl[0].stop).astype(spec.dtype) * delta
        if len(out) and sl[0].start == 0:
            out[0] = first
        return out

    out = from_spec_block(block, spec, requires_grad)
    return _named(out, _ARANGE, spec.shape, spec.dtype, first, delta)


# -- random ------------------------------------------------------------------------------------
# Note [Random streams on a device]
# The random streams are global-view: element i of a tensor is f(seed, stream, i)
# (_philox.py), so every mesh and placement draws the same bits. On a device the shard is
# drawn on the host with the same Philox code and copied (one host-to-device copy of the
# shard, which costs less than drawing it on the host): the device's values are then
# bit-identical to the CPU's and to every other mesh's, with no second implementation of
# the counter layout (its contract) to keep in step.
_rng = threading.local()  # per thread, so simulated ranks each keep their own (equal) stream


def manual_seed(seed: int) -> None:
    """Seed the stream that ``rand``/``randn`` use when no ``seed=`` is given.

    Unseeded calls take the next stream of that seed in program order, so all ranks agree as
    long as they make the same calls (they must anyway). The default seed is 0. Every rank
    must pass the same seed: the ranks of a mesh check, at each draw, that they draw the same
    stream (``RanksDiverged`` on every rank otherwise, naming each rank's seed; a
    rank-dependent seed would give every rank other "replicated" values).
    """
    try:
        _rng.seed, _rng.calls = operator.index(seed), 0
    except TypeError:
        raise TypeError(f"manual_seed needs an integer seed, got {seed!r}") from None


def _draw(kind: int, seed: int | None) -> tuple[int, int]:
    """(seed, stream): stream 2*c + kind, c = 0 for an explicit seed, else 1, 2, ... per call."""
    if seed is not None:
        return int(seed), kind
    if not hasattr(_rng, "seed"):  # the default seed: the same everywhere, nothing to check
        _rng.seed, _rng.calls = 0, 0
    _rng.calls += 1
    return _rng.seed, 2 * _rng.calls + kind


def _random(draw, kind: int, name: str):
    def make(shape, dtype=None, *, seed=None, mesh=None, placements=None, requires_grad=False):
        dtype = np.dtype(np.float64 if dtype is None else dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"{name}: dtype must be float32 or float64, got {dtype}")
        spec = _spec(shape, dtype, mesh, placements, name)
        s, stream = _draw(kind, seed)
        # Note [Replicas agree] in tensor.py: every rank draws its shard of the same stream
        agree_on_mesh(
            spec.mesh, "random draw", (f"seed {s}", f"stream {stream}", spec.shape, spec.placements)
        )
        out = from_spec_block(
            lambda sl: draw(s, stream, spec.shape, sl, dtype), spec, requires_grad
        )
        return _named(out, _RANDOM, s, stream, spec.shape, dtype)

    make.__name__ = name
    return make


rand = _random(_philox.uniform, 0, "rand")
rand.__doc__ = "Uniform [0, 1) values; with a seed the same global values on every mesh/placement."
randn = _random(_philox.normal, 1, "randn")
randn.__doc__ = (
    "Standard normal values; with a seed the same global values on every mesh/placement."
)


# -- like another tensor: its mesh and layout, no communication ---------------------------------
def _like_spec(a: DistTensor, dtype: Any, shape: Any, device: Any, what: str) -> DistSpec:
    """``a``'s spec with Partials read as Replicate (a Partial layout would make the value a
    reduction of the ranks' shards: every rank holding ones would sum to k), another dtype or
    shape if asked. A new shape keeps ``a``'s placements where they still fit, else
    Replicate."""
    if device not in (None, "cpu"):
        raise ValueError(f"Unsupported device: {device}. Only 'cpu' is accepted.")
    spec = a.spec.without_partials()
    if dtype is not None:
        spec = spec.replace(dtype=np.dtype(dtype))
    if shape is not None:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if shape != spec.shape:
            try:
                spec = DistSpec.make(spec.mesh, spec.placements, shape, spec.dtype, what=what)
            except ValueError:  # a Shard axis the new shape does not have
                spec = DistSpec.make(spec.mesh, [Replicate()] * spec.mesh.ndim, shape, spec.dtype)
    return spec


def _like(name: str, fill):
    def make(a, dtype=None, order="K", subok=True, shape=None, *, device=None, requires_grad=False):
        if not isinstance(a, DistTensor):
            return getattr(np, name)(a, dtype, order, subok, shape, device=device)
        spec = _like_spec(a, dtype, shape, device, name)
        be = backend.of(a.to_local())  # like a: on its device
        f = fill if not be.device else getattr(be.xp, fill.__name__)
        out = from_spec_block(
            lambda sl: f(tuple(s.stop - s.start for s in sl), spec.dtype), spec, requires_grad, be
        )
        return _named(out, code, spec.shape, spec.dtype)

    code = code_of(fill.__name__)
    make.__name__ = make.__qualname__ = name
    return make


zeros_like = _like("zeros_like", np.zeros)
zeros_like.__doc__ = (
    "``np.zeros_like(a)``: a's mesh and placements (Partials read as Replicate), no communication."
)
ones_like = _like("ones_like", np.ones)
ones_like.__doc__ = (
    "``np.ones_like(a)``: a's mesh and placements (Partials read as Replicate, so the global "
    "value is ones), no communication."
)
empty_like = _like("empty_like", np.empty)
empty_like.__doc__ = (
    "``np.empty_like(prototype)``: a's mesh and placements (Partials read as Replicate), "
    "values unset, no communication."
)


def full_like(
    a: Any,
    fill_value: Any,
    dtype: Any = None,
    order: str = "K",
    subok: bool = True,
    shape: Any = None,
    *,
    device: Any = None,
    requires_grad: bool = False,
) -> Any:
    """``np.full_like(a, fill_value)``: a's mesh and placements (Partials read as Replicate, so
    the global value is ``fill_value``), no communication (a DistTensor ``fill_value`` is
    gathered first).

    >>> import disttensor as dt
    >>> x = dt.ones((2, 3), mesh=dt.ProcessMesh([0]), placements=[dt.Partial()])
    >>> y = dt.full_like(x, 7, dtype=int)
    >>> y.placements, y.to_local()
    ([Replicate()], array([[7, 7, 7],
           [7, 7, 7]]))
    """
    if not isinstance(a, DistTensor):
        if isinstance(fill_value, DistTensor):
            fill_value = fill_value.numpy()
        return np.full_like(a, fill_value, dtype, order, subok, shape, device=device)
    spec = _like_spec(a, dtype, shape, device, "full_like")
    if isinstance(fill_value, DistTensor):
        fill_value = fill_value.numpy()  # collective over its mesh
    be = backend.of(a.to_local())  # like a: on its device
    if be.device and backend.is_device(fill_value):
        fill_value = backend.to_host(fill_value)  # the value is the global one: host-sized
    value = np.asarray(fill_value)
    if value.ndim:  # an array broadcast to the shape (numpy's error when it does not fit)
        value = np.broadcast_to(value, spec.shape)
        out = from_spec_block(lambda sl: value[sl], spec, requires_grad, be)
        return _named(out, _FULL, spec.shape, spec.dtype, value)  # its shape only
    fill = value if not be.device else value[()]  # a device takes a scalar, not a host array
    out = from_spec_block(
        lambda sl: be.xp.full(tuple(s.stop - s.start for s in sl), fill, spec.dtype),
        spec,
        requires_grad,
        be,
    )
    return _named(out, _FULL, spec.shape, spec.dtype, value[()])
