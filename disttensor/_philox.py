"""Counter-based random numbers (Philox4x32-10) that can be drawn shard by shard.

A distributed tensor fills only its local box of the global tensor, yet gets
exactly the values a single process would draw for the whole tensor, because
every element's value depends only on (seed, stream, its global flat index).

Counter layout -- THIS IS A CONTRACT.  Users' seeds depend on it; once shipped,
none of the following may change, or every existing seed draws new numbers.

* ``i`` is the element's row-major (C order) flat index in the global tensor,
  ``0 <= i < prod(global_shape) <= 2**64``.
* counter = ``(i & 0xFFFFFFFF, i >> 32, stream, 0)``, with ``0 <= stream < 2**32``.
* key     = ``(seed & 0xFFFFFFFF, seed >> 32)``,      with ``0 <= seed < 2**64``.
* ``(w0, w1, w2, w3) = philox4x32(counter, key, rounds=10)`` (Random123).
* Let ``top53(a, b) = (a << 21) | (b >> 11)``, the top 53 bits of the 64-bit
  integer ``a * 2**32 + b``.
* ``uniform`` float64: ``top53(w0, w1) * 2**-53``, in ``[0, 1)``.
  ``uniform`` float32: ``(w0 >> 8) * 2**-24``, i.e. the float64 value truncated
  to 24 bits.  (Rounding the float64 value to float32 instead could give 1.0.)
* ``normal``: ``u1 = (top53(w0, w1) + 1) * 2**-53`` in ``(0, 1]`` (so ``log`` is
  finite), ``u2 = top53(w2, w3) * 2**-53`` in ``[0, 1)``,
  ``z = sqrt(-2 ln u1) * cos(2pi * u2)`` computed in float64 (``2pi`` being the
  float64 constant ``2 * math.pi``), then rounded to the requested dtype.  Each element uses a
single counter; the second Box-Muller
  output (``sin``) is discarded so that each element is independent of others.

The uniform values are pure integer arithmetic plus exact power-of-two scaling,
so they are bit-identical on every platform.  The normal values go through
numpy's ``log``/``cos``, which may differ in the last bit between numpy builds
or CPUs (e.g. SIMD vs. libm implementations).  With one numpy on one CPU they
are identical however the tensor is split into boxes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import DTypeLike

__all__ = ["normal", "philox4x32", "uniform"]

_MASK32 = 0xFFFFFFFF
_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85

# Elements per chunk: a chunk needs ~6 uint64 temporaries per element, so 64Ki
# elements (~3 MiB) stay near the CPU caches; measured about twice as fast as
# streaming 1M-element temporaries through memory.
_CHUNK = 1 << 16

# Maps the four output words of a chunk (uint64 arrays, consumed) to values of a dtype.
_Convert = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.dtype], np.ndarray]

_TWO_M53 = 2.0**-53
_TWO_M24 = 2.0**-24


def _rounds(
    x0: np.ndarray, x1: np.ndarray, x2: np.ndarray, x3: np.ndarray, k0: int, k1: int, rounds: int
) -> None:
    """Apply Philox4x32 rounds in place.

    The four words are uint64 arrays holding 32-bit values: this lets the
    32x32->64 products be computed directly, with no dtype conversions per round.
    """
    p0 = np.empty_like(x0)
    p1 = np.empty_like(x0)
    for r in range(rounds):
        if r:  # the key is bumped between rounds, not before the first one
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        np.multiply(x0, _M0, out=p0)
        np.multiply(x2, _M1, out=p1)
        # (x0, x1, x2, x3) <- (hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0).
        # Order matters: x1 and x3 are read before they are overwritten.
        np.right_shift(p1, 32, out=x0)
        x0 ^= x1
        x0 ^= np.uint64(k0)
        np.right_shift(p0, 32, out=x2)
        x2 ^= x3
        x2 ^= np.uint64(k1)
        np.bitwise_and(p1, _MASK32, out=x1)
        np.bitwise_and(p0, _MASK32, out=x3)


def _check_u32(value: int, name: str) -> int:
    value = operator.index(value)
    if not 0 <= value <= _MASK32:
        raise ValueError(f"{name} must be in [0, 2**32), got {value}")
    return value


def philox4x32(counters: np.ndarray, key: tuple[int, int], rounds: int = 10) -> np.ndarray:
    """Philox4x32 block function (Random123, Salmon et al., SC'11).

    ``counters`` is a uint32 array of shape (n, 4); ``key`` is two 32-bit words.
    Returns the uint32 array of shape (n, 4) of output words.
    """
    counters = np.asarray(counters)
    if counters.dtype != np.uint32 or counters.ndim != 2 or counters.shape[1] != 4:
        raise ValueError(
            "counters must be a uint32 array of shape (n, 4), "
            f"got {counters.dtype} {counters.shape}"
        )
    if len(key) != 2:
        raise ValueError(f"key must be two 32-bit words, got {len(key)}")
    k0, k1 = (_check_u32(k, "key word") for k in key)
    rounds = operator.index(rounds)
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    x = [counters[:, j].astype(np.uint64) for j in range(4)]
    _rounds(*x, k0, k1, rounds)
    return np.stack(x, axis=1).astype(np.uint32)


def _box_flat_indices(
    global_shape: tuple[int, ...], box: Sequence[slice]
) -> tuple[tuple[int, ...], np.ndarray]:
    """Return the box's shape and the uint64 global flat indices of its elements (row-major).

    Only the box is materialized: per-dimension index ranges, scaled by the
    row-major strides, are summed by broadcasting.
    """
    if len(box) != len(global_shape):
        raise ValueError(
            f"box has {len(box)} slices but the global shape has {len(global_shape)} dims"
        )
    size = 1
    for n in global_shape:
        size *= n
    if size > 1 << 64:
        raise ValueError(f"global shape {global_shape} has more than 2**64 elements")

    strides = [1] * len(global_shape)
    for d in range(len(global_shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * global_shape[d + 1]

    idx = np.zeros((), dtype=np.uint64)
    box_shape = []
    for n, s, stride in zip(global_shape, box, strides):
        if not isinstance(s, slice):
            raise TypeError(f"box entries must be slices, got {s!r}")
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"box slices must have step 1, got {s!r}")
        length = max(stop - start, 0)
        box_shape.append(length)
        rng = np.arange(start, start + length, dtype=np.uint64) * np.uint64(stride)
        # Each step appends one axis; no sum exceeds the largest flat index < 2**64.
        idx = idx[..., np.newaxis] + rng
    return tuple(box_shape), idx.reshape(-1)


def _draw(
    seed: int,
    stream: int,
    global_shape: tuple[int, ...],
    box: Sequence[slice],
    dtype: np.dtype,
    convert: _Convert,
) -> np.ndarray:
    """Run Philox over the box in chunks and map each chunk's words with ``convert``."""
    seed = operator.index(seed)
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed}")
    stream = _check_u32(stream, "stream")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    global_shape = tuple(operator.index(n) for n in global_shape)
    if any(n < 0 for n in global_shape):
        raise ValueError(f"global shape must be non-negative, got {global_shape}")

    box_shape, idx = _box_flat_indices(global_shape, box)
    out = np.empty(idx.size, dtype=dtype)
    for lo in range(0, idx.size, _CHUNK):
        i = idx[lo : lo + _CHUNK]
        x0 = i & np.uint64(_MASK32)
        x1 = i >> np.uint64(32)
        x2 = np.full_like(i, stream)
        x3 = np.zeros_like(i)
        _rounds(x0, x1, x2, x3, seed & _MASK32, seed >> 32, 10)
        out[lo : lo + _CHUNK] = convert(x0, x1, x2, x3, dtype)
    return out.reshape(box_shape)


def _top53(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Top 53 bits of the 64-bit integer a * 2**32 + b (consumes ``a`` in place)."""
    a <<= np.uint64(21)
    b >>= np.uint64(11)
    a |= b
    return a


def _to_uniform(
    w0: np.ndarray, w1: np.ndarray, w2: np.ndarray, w3: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    if dtype == np.float32:
        # 24 bits fit float32 exactly; the result is the float64 draw truncated.
        return (w0 >> np.uint64(8)).astype(np.float32) * np.float32(_TWO_M24)
    # Integers below 2**53 convert to float64 exactly, so u <= 1 - 2**-53 < 1.
    return _top53(w0, w1).astype(np.float64) * _TWO_M53


def _to_normal(
    w0: np.ndarray, w1: np.ndarray, w2: np.ndarray, w3: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    u1 = _top53(w0, w1).astype(np.float64)
    u1 += 1.0  # (0, 1] so that log(u1) is finite
    u1 *= _TWO_M53
    u2 = _top53(w2, w3).astype(np.float64) * (2.0 * np.pi * _TWO_M53)
    np.log(u1, out=u1)
    u1 *= -2.0
    np.sqrt(u1, out=u1)
    np.cos(u2, out=u2)
    u1 *= u2
    return u1


def uniform(
    seed: int,
    stream: int,
    global_shape: tuple[int, ...],
    box: tuple[slice, ...],
    dtype: DTypeLike = np.float64,
) -> np.ndarray:
    """Uniform [0, 1) values of the global tensor ``global_shape``, restricted to ``box``.

    ``box`` holds one step-1 slice per dimension (possibly empty).  The result
    has the box's shape and equals ``full[box]`` where ``full`` is the draw for
    the whole tensor; see the module docstring for the exact construction.
    """
    return _draw(seed, stream, global_shape, box, dtype, _to_uniform)


def normal(
    seed: int,
    stream: int,
    global_shape: tuple[int, ...],
    box: tuple[slice, ...],
    dtype: DTypeLike = np.float64,
) -> np.ndarray:
    """Standard normal values (Box-Muller) of the global tensor, restricted to ``box``.

    Same box semantics as :func:`uniform`; see the module docstring for the
    exact construction.
    """
    return _draw(seed, stream, global_shape, box, dtype, _to_normal)
