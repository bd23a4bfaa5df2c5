"""disttensor._format prints, from the shown elements only, what numpy prints for the full array."""

from __future__ import annotations

import math
import sys
import tracemalloc
import types

import numpy as np
import pytest

from disttensor import _format
from disttensor._format import format_array, shown_indices

PREFIX = "DistTensor("

SHAPES = [
    (),
    (0,),
    (3, 0, 4),
    (1,),
    (5,),
    (6,),
    (7,),
    (8,),
    (1000,),
    (1001,),
    (2000,),
    (6, 6),
    (7, 7),
    (1, 1001),
    (1001, 1),
    (50, 60),
    (3, 400, 5),
    (10, 10, 11),
    (2, 3, 4, 5),
    (7, 8, 9, 10),
]

DTYPES = ["bool", "int64", "float32", "float64", "complex128"]

PRINT_OPTIONS = [
    {},
    {"threshold": 10, "edgeitems": 2, "linewidth": 40, "precision": 3},
    {"threshold": 0, "edgeitems": 1},
    {"edgeitems": 4, "linewidth": 120, "precision": 12},
    {"threshold": 50, "edgeitems": 0},
    {"threshold": 20, "suppress": True, "sign": "+", "floatmode": "fixed"},
    {"threshold": 20, "legacy": "1.13"},
]


def make_full(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size = math.prod(shape)
    if dtype == "bool":
        flat = rng.random(size) < 0.5
    elif dtype == "int64":
        # Mixed widths, negatives and a huge value so column widths matter.
        flat = rng.integers(-50, 50, size) * 10 ** rng.integers(0, 6, size)
        if size > 3:
            flat[size // 2] = 10**15  # in the middle, so often elided
    else:
        # Magnitudes from 1e-6 to 1e8 force scientific notation unless the corners are tame.
        flat = rng.standard_normal(size) * 10.0 ** rng.integers(-6, 9, size)
        if dtype == "complex128":
            flat = flat + 1j * rng.standard_normal(size) * 10.0 ** rng.integers(-3, 4, size)
        if size > 4:
            flat[1] = np.nan
            flat[-2] = np.inf
    return np.asarray(flat).astype(dtype).reshape(shape)


def gather(full: np.ndarray) -> np.ndarray:
    """What a distributed tensor would gather: only the shown elements."""
    indices = shown_indices(full.shape)
    return full if indices is None else full[np.ix_(*indices)]


@pytest.mark.parametrize("options", PRINT_OPTIONS, ids=lambda o: repr(o) or "default")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_numpy(shape: tuple[int, ...], dtype: str, options: dict) -> None:
    full = make_full(shape, dtype)
    with np.printoptions(**options):
        small = gather(full)
        for separator in (", ", " "):
            expected = np.array2string(full, separator=separator, prefix=PREFIX)
            assert format_array(small, shape, prefix=PREFIX, separator=separator) == expected
        assert format_array(small, shape) == np.array2string(full, separator=", ")


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "int32", "uint8"])
def test_tame_values_and_other_dtypes(dtype: str) -> None:
    # Small values that print positionally, to exercise the non-scientific float path too.
    full = (np.arange(3 * 400 * 5) % 97 / 8).astype(dtype).reshape(3, 400, 5)
    small = gather(full)
    assert small.size < full.size
    assert format_array(small, full.shape, PREFIX) == np.array2string(
        full, separator=", ", prefix=PREFIX
    )


@pytest.mark.parametrize("options", PRINT_OPTIONS, ids=lambda o: repr(o) or "default")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_shown_indices_mirror_numpy(shape: tuple[int, ...], options: dict) -> None:
    full = np.arange(math.prod(shape)).reshape(shape)
    with np.printoptions(**options):
        indices = shown_indices(shape)
        opts = np.get_printoptions()
        # None exactly when numpy does not summarize.
        assert (indices is None) == (full.size <= opts["threshold"])
        if indices is None:
            return
        assert len(indices) == len(shape)
        for index, length in zip(indices, shape):
            assert index.dtype == np.int64
            assert np.all(np.diff(index) > 0)
            if length > 2 * opts["edgeitems"] and opts["edgeitems"] > 0:
                assert len(index) == 2 * opts["edgeitems"]
        if _format._PRIVATE is not None and full.ndim > 0:
            # The very same elements numpy's own summarizer keeps.
            leading_trailing = sys.modules[_format._PRIVATE.format_array.__module__]
            expected = leading_trailing._leading_trailing(full, opts["edgeitems"])
            np.testing.assert_array_equal(full[np.ix_(*indices)], expected)


def test_whole_array_when_small() -> None:
    assert shown_indices((10, 100)) is None
    assert shown_indices((0, 10**9)) is None
    with np.printoptions(threshold=999):
        assert shown_indices((10, 100)) is not None


def test_printoptions_block_is_honoured() -> None:
    full = np.linspace(0, 1, 30)
    with np.printoptions(threshold=5, edgeitems=2, precision=2, linewidth=30):
        small = gather(full)
        assert small.shape == (4,)
        text = format_array(small, full.shape)
        assert text == np.array2string(full, separator=", ")
    assert text == "[0.  , 0.03, ..., 0.97, 1.  ]"
    # Outside the block the defaults are back and nothing is summarized.
    assert shown_indices(full.shape) is None


def test_huge_shape_allocates_nothing_of_full_size() -> None:
    # 10**12 elements: only the 6 x 6 corners exist.  A 7 x 7 array with the same corners,
    # printed with a threshold low enough to summarize it, must look the same.
    shape = (10**6, 10**6)
    small = np.arange(36, dtype=np.float64).reshape(6, 6) * 1.25
    with np.printoptions(threshold=10):
        reference = np.zeros((7, 7))
        reference[np.ix_(*shown_indices((7, 7)))] = small
        expected = np.array2string(reference, separator=", ", prefix=PREFIX)
    tracemalloc.start()
    try:
        indices = shown_indices(shape)
        text = format_array(small, shape, prefix=PREFIX)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [len(i) for i in indices] == [6, 6]
    assert text == expected
    assert peak < 1_000_000


def test_zero_d_summarized_when_threshold_is_zero() -> None:
    full = np.array(2.5)
    with np.printoptions(threshold=0):
        indices = shown_indices(())
        assert indices == ()
        small = full[np.ix_(*indices)]  # a numpy scalar, not an array
        assert format_array(small, ()) == np.array2string(full, separator=", ")


def test_wrong_small_shape_is_an_error() -> None:
    with pytest.raises(ValueError, match="shown_indices"):
        format_array(np.zeros(2000), (2000,))


# --- the fallback layout ---------------------------------------------------------------------


def test_private_api_found_on_this_numpy() -> None:
    # Otherwise every exact-match test above would be testing nothing but the fallback.
    assert _format._PRIVATE is not None


def test_private_api_missing_or_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("numpy._core.arrayprint", "numpy.core.arrayprint"):
        monkeypatch.setitem(sys.modules, name, None)  # makes importing it raise ImportError
    assert _format._load_private() is None

    def changed(a, format_function, line_width, next_line_prefix, separator, edge_items):
        raise AssertionError("must not be called")

    module = types.ModuleType("fake_arrayprint")
    module._formatArray = changed
    module._get_format_function = lambda data, **options: str
    module._format_options = dict(np.get_printoptions())
    assert _format._check_module(module) is None


def test_broken_private_api_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _format._PRIVATE is not None

    def broken(*args, **kwargs):
        raise TypeError("changed behaviour")

    full = np.arange(2000)
    small = gather(full)
    plain = _format._format_plain(small, full.shape, PREFIX, ", ")
    monkeypatch.setattr(_format, "_PRIVATE", _format._PRIVATE._replace(format_array=broken))
    assert format_array(small, full.shape, PREFIX) == plain


@pytest.mark.parametrize("options", PRINT_OPTIONS[:4], ids=lambda o: repr(o) or "default")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fallback_layout(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], dtype: str, options: dict
) -> None:
    monkeypatch.setattr(_format, "_PRIVATE", None)
    full = make_full(shape, dtype)
    with np.printoptions(**options):
        small = gather(full)
        text = format_array(small, shape, prefix=PREFIX)
        numpy_text = np.array2string(full, prefix=PREFIX, separator=", ")
        opts = np.get_printoptions()
    if full.size == 0:
        assert text == "[]"
        return
    assert text.count("[") == text.count("]")
    assert text.startswith("[" * full.ndim) and text.endswith("]" * full.ndim)
    # One "..." per elided block, the same count numpy prints.
    if opts["edgeitems"] > 0:
        assert text.count("...") == numpy_text.count("...")
    for line in text.splitlines():
        # Wrapped within linewidth, unless a single item is wider than what is left.
        assert len(line) <= opts["linewidth"] or len(line.strip("[], ").split(", ")) == 1


def test_fallback_matches_numpy_for_plain_ints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_format, "_PRIVATE", None)
    for full in (np.arange(2000), np.array([1, 22, 333]), np.arange(24).reshape(2, 3, 4)):
        expected = np.array2string(full, separator=", ", prefix=PREFIX)
        assert format_array(gather(full), full.shape, prefix=PREFIX) == expected
