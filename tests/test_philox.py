"""Tests for the counter-based Philox generator (disttensor._philox)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from disttensor._philox import normal, philox4x32, uniform

DRAWS = [uniform, normal]
DTYPES = [np.float64, np.float32]


def full_box(shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


# ----------------------------------------------------------------- block function


@pytest.mark.parametrize(
    ("counter", "key", "expected"),
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_known_answers(counter, key, expected) -> None:
    # Random123's kat_vectors for philox4x32_10.
    out = philox4x32(np.array([counter], dtype=np.uint32), key)
    assert out.dtype == np.uint32 and out.shape == (1, 4)
    assert tuple(int(w) for w in out[0]) == expected


def test_block_function_is_row_wise() -> None:
    # Batched evaluation must equal evaluating each counter alone.
    rng = np.random.default_rng(0)
    counters = rng.integers(0, 2**32, size=(50, 4), dtype=np.uint32)
    batched = philox4x32(counters, (123, 456))
    for row, out in zip(counters, batched):
        np.testing.assert_array_equal(philox4x32(row[None], (123, 456))[0], out)
    assert philox4x32(np.zeros((0, 4), dtype=np.uint32), (0, 0)).shape == (0, 4)


# ------------------------------------------------------------ counter layout


def reference_words(seed: int, stream: int, flat_indices: list[int]) -> np.ndarray:
    """The documented counter layout, written out with Python ints."""
    counters = np.array(
        [(i & 0xFFFFFFFF, i >> 32, stream, 0) for i in flat_indices], dtype=np.uint32
    ).reshape(-1, 4)
    return philox4x32(counters, (seed & 0xFFFFFFFF, seed >> 32)).astype(np.uint64)


def reference_uniform(seed: int, stream: int, flat_indices: list[int]) -> np.ndarray:
    w = reference_words(seed, stream, flat_indices)
    return ((w[:, 0] << np.uint64(21)) | (w[:, 1] >> np.uint64(11))).astype(np.float64) * 2.0**-53


def test_uniform_matches_documented_layout() -> None:
    seed, stream, shape = 0x0123456789ABCDEF, 7, (3, 4, 5)
    expected = reference_uniform(seed, stream, list(range(60))).reshape(shape)
    np.testing.assert_array_equal(uniform(seed, stream, shape, full_box(shape)), expected)


# Pinned outputs: users' seeds depend on these, so they must never change.
GOLDEN_UNIFORM = [
    "0x1.39d5e0a6efea9p-1",
    "0x1.f9b6424ea774dp-1",
    "0x1.a6d8044b510ebp-1",
    "0x1.758e08eb575e1p-1",
]
GOLDEN_NORMAL = [0.3410315357706154, 1.5944727689340674]


def test_golden_values() -> None:
    u = uniform(42, 0, (4,), (slice(0, 4),))
    assert [x.hex() for x in u.tolist()] == GOLDEN_UNIFORM  # bit-exact everywhere
    # normal goes through log/cos, which may differ in the last bits across platforms.
    np.testing.assert_allclose(normal(42, 1, (2,), (slice(0, 2),)), GOLDEN_NORMAL, rtol=1e-14)


def test_float32_uniform_is_truncated_float64() -> None:
    shape = (1000,)
    u64 = uniform(5, 0, shape, full_box(shape), np.float64)
    u32 = uniform(5, 0, shape, full_box(shape), np.float32)
    assert u32.dtype == np.float32
    np.testing.assert_array_equal(u32.astype(np.float64), np.floor(u64 * 2**24) / 2**24)


# ------------------------------------------------------------------ box property


def random_tiling(rng: np.random.Generator, shape: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """Cut every dim at random points; return all boxes of the resulting grid."""
    per_dim = []
    for n in shape:
        cuts = sorted(set(rng.integers(0, n + 1, size=rng.integers(0, 4)).tolist()) | {0, n})
        per_dim.append([slice(a, b) for a, b in itertools.pairwise(cuts)] or [slice(0, 0)])
    return list(itertools.product(*per_dim))


SHAPES = [(), (0,), (1,), (7,), (3, 0, 2), (5, 3), (7, 5, 3), (2, 1, 9, 4), (300, 301)]


@pytest.mark.parametrize("draw", DRAWS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_tiling_reproduces_full_draw(draw, dtype, shape) -> None:
    rng = np.random.default_rng(len(shape) * 1000 + sum(shape))
    full = draw(11, 3, shape, full_box(shape), dtype)
    assert full.shape == shape and full.dtype == dtype
    for _ in range(3):
        assembled = np.full(shape, np.nan, dtype=dtype)
        for box in random_tiling(rng, shape):
            part = draw(11, 3, shape, box, dtype)
            assert part.shape == assembled[box].shape
            assembled[box] = part
        np.testing.assert_array_equal(assembled, full)


@pytest.mark.parametrize("draw", DRAWS)
def test_arbitrary_boxes_match_slicing(draw) -> None:
    shape = (6, 7, 8)
    full = draw(1, 0, shape, full_box(shape))
    boxes = [
        (slice(None), slice(2, 5), slice(-3, None)),
        (slice(4, 2), slice(None), slice(None)),  # empty
        (slice(0, 100), slice(6, 7), slice(1, 2)),  # clipped like numpy
    ]
    for box in boxes:
        np.testing.assert_array_equal(draw(1, 0, shape, box), full[box])


def test_zero_dim() -> None:
    u = uniform(9, 0, (), ())
    assert u.shape == () and 0.0 <= float(u) < 1.0
    assert float(u) == reference_uniform(9, 0, [0])[0]
    assert normal(9, 0, (), ()).shape == ()


# ------------------------------------------------------------ seeds and streams


@pytest.mark.parametrize("draw", DRAWS)
def test_seeds_and_streams_differ(draw) -> None:
    shape = (1000,)
    box = full_box(shape)
    base = draw(0, 0, shape, box)
    others = [draw(1, 0, shape, box), draw(2**32, 0, shape, box), draw(0, 1, shape, box)]
    for other in others:
        # Independent draws: essentially no element coincides.
        assert np.mean(base == other) < 0.01
    np.testing.assert_array_equal(draw(0, 0, shape, box), base)  # deterministic


# -------------------------------------------------------------- distributions


def test_uniform_range_and_moments() -> None:
    for dtype in DTYPES:
        u = uniform(2024, 0, (1000, 1000), (slice(None), slice(None)), dtype)
        assert u.min() >= 0.0 and u.max() < 1.0
        assert abs(u.mean() - 0.5) < 0.005
        assert abs(u.var() - 1 / 12) < 0.002


def test_normal_moments() -> None:
    z = normal(2024, 0, (1000, 1000), (slice(None), slice(None)))
    assert np.isfinite(z).all()
    assert abs(z.mean()) < 0.01
    assert abs(z.std() - 1.0) < 0.01
    assert abs(np.mean(z > 1.0) - 0.158655) < 0.003  # roughly the right shape too


# ---------------------------------------------------------------- huge tensors


@pytest.mark.parametrize("draw", DRAWS)
def test_more_than_2_32_elements(draw) -> None:
    shape = (3, 2**20, 2**12 + 1)  # ~1.3e10 elements: never materialized
    box = (slice(2, 3), slice(2**20 - 2, 2**20), slice(-3, None))
    part = draw(77, 5, shape, box)
    assert part.shape == (1, 2, 3)

    flat = [
        (i * shape[1] + j) * shape[2] + k
        for i in range(2, 3)
        for j in range(2**20 - 2, 2**20)
        for k in range(shape[2] - 3, shape[2])
    ]
    assert all(i >> 32 > 0 for i in flat)  # the counter's high word is in use
    if draw is uniform:
        np.testing.assert_array_equal(part.ravel(), reference_uniform(77, 5, flat))

    # Overlapping boxes near the end agree with each other.
    bigger = draw(77, 5, shape, (slice(2, 3), slice(2**20 - 3, 2**20), slice(-4, None)))
    np.testing.assert_array_equal(bigger[:, 1:, 1:], part)


def test_largest_possible_index() -> None:
    shape = (2**32, 2**32)  # exactly 2**64 elements
    u = uniform(1, 0, shape, (slice(-1, None), slice(-2, None)))
    np.testing.assert_array_equal(u.ravel(), reference_uniform(1, 0, [2**64 - 2, 2**64 - 1]))
    # A single dim beyond 2**63 (uint64 index ranges, not int64).
    u = uniform(1, 0, (2**64,), (slice(2**63 - 1, 2**63 + 1),))
    np.testing.assert_array_equal(u, reference_uniform(1, 0, [2**63 - 1, 2**63]))
    with pytest.raises(ValueError, match="2\\*\\*64"):
        uniform(1, 0, (2**32, 2**32 + 1), (slice(0, 1), slice(0, 1)))


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("draw", DRAWS)
@pytest.mark.parametrize("seed", [-1, 2**64, 2**70])
def test_invalid_seed(draw, seed) -> None:
    with pytest.raises(ValueError, match=r"\[0, 2\*\*64\)"):
        draw(seed, 0, (3,), (slice(0, 3),))


def test_other_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="stream"):
        uniform(0, -1, (3,), (slice(0, 3),))
    with pytest.raises(ValueError, match="stream"):
        uniform(0, 2**32, (3,), (slice(0, 3),))
    with pytest.raises(ValueError, match="step"):
        uniform(0, 0, (3,), (slice(0, 3, 2),))
    with pytest.raises(ValueError, match="slices"):
        uniform(0, 0, (3, 4), (slice(0, 3),))
    with pytest.raises(ValueError, match="dtype"):
        uniform(0, 0, (3,), (slice(0, 3),), np.int32)
    with pytest.raises(ValueError, match="counters"):
        philox4x32(np.zeros((2, 3), dtype=np.uint32), (0, 0))
