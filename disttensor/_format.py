"""Print a distributed tensor exactly like numpy, from only the elements numpy would show.

When an array is larger than the ``threshold`` print option, numpy prints only the first and
last ``edgeitems`` entries of each long axis.  A distributed tensor therefore gathers just those
entries (``shown_indices``) into a small local array and formats that as if it were the full one
(``format_array``), so printing never moves or allocates anything of the full size.

The exact output relies on numpy's private ``arrayprint`` helpers.  If they are missing or have
changed, ``format_array`` falls back to a simpler layout of its own so that printing never fails.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
from collections.abc import Callable
from contextvars import ContextVar
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

__all__ = ["format_array", "shown_indices"]

_log = logging.getLogger(__name__)


def shown_indices(shape: tuple[int, ...]) -> tuple[np.ndarray, ...] | None:
    """Indices, per axis, of the elements numpy shows when printing an array of ``shape``.

    Returns None when numpy prints the whole array (size <= the ``threshold`` print option);
    otherwise one sorted int64 index array per axis, suitable for ``np.ix_``.
    """
    kept = _kept_ranges(shape)
    if kept is None:
        return None
    return tuple(
        np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in ranges])
        for ranges in kept
    )


def _kept_ranges(shape: tuple[int, ...]) -> list[list[range]] | None:
    """Per axis, the index ranges numpy._core.arrayprint._leading_trailing keeps."""
    options = np.get_printoptions()
    # math.prod on Python ints: no overflow and no array of the full size.
    if math.prod(shape) <= options["threshold"]:
        return None
    edgeitems = options["edgeitems"]
    kept = []
    for length in shape:
        axis = range(length)
        if length > 2 * edgeitems:
            # Slice a range exactly as numpy slices the axis (a[:e] and a[-e:]) so that even
            # its corner case matches: with edgeitems == 0, a[-0:] is the whole axis, which
            # numpy then uses to pick the column width.  Range slices are lazy.
            kept.append([axis[:edgeitems], axis[-edgeitems:]])
        else:
            kept.append([axis])
    return kept


def format_array(
    small: np.ndarray, shape: tuple[int, ...], prefix: str = "", separator: str = ", "
) -> str:
    """What ``np.array2string(full, separator=separator, prefix=prefix)`` returns for ``full``.

    ``full`` has ``shape`` and is never materialised: ``small`` must hold the shown elements,
    ``full[np.ix_(*shown_indices(shape))]``, or all of ``full`` when that is None.  The current
    print options (including a ``with np.printoptions(...)`` block) apply, and must be the same
    ones that were in force when ``shown_indices`` was called.
    """
    shape = tuple(int(n) for n in shape)
    # asarray: full[np.ix_()] of a 0-d array is a numpy scalar, not an array.
    small = np.asarray(small)
    # Check the shape from ranges, without building the index arrays.
    kept = _kept_ranges(shape)
    expected = shape if kept is None else tuple(sum(map(len, ranges)) for ranges in kept)
    if small.shape != expected:
        raise ValueError(
            f"small has shape {small.shape}, but printing shape {shape} shows {expected}; "
            "gather it with shown_indices() under the same print options"
        )

    if _PRIVATE is not None:
        try:
            return _format_exact(_PRIVATE, small, shape, prefix, separator)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            # The private helpers exist but no longer behave as they did (the errors API drift
            # gives).  Printing must not fail, so use the plain layout rather than raise.
            _log.debug("numpy's private arrayprint helpers failed; plain layout", exc_info=True)
    return _format_plain(small, shape, prefix, separator)


# --- exact layout, with numpy's private arrayprint helpers ---------------------------------------


class _Private(NamedTuple):
    format_array: Callable[..., str]  # arrayprint._formatArray
    get_format_function: Callable[..., Callable[[Any], str]]  # arrayprint._get_format_function
    get_options: Callable[[], dict[str, Any]]  # numpy's internal print options, as numpy uses them


# The signature this module was written against (numpy 1.22 up to at least 2.4).
_FORMAT_ARRAY_PARAMS = [
    "a",
    "format_function",
    "line_width",
    "next_line_prefix",
    "separator",
    "edge_items",
    "summary_insert",
    "legacy",
]


def _check_module(arrayprint: ModuleType) -> _Private | None:
    """The helpers we need from an arrayprint module, or None if they are not as expected."""
    format_array_ = getattr(arrayprint, "_formatArray", None)
    get_format_function = getattr(arrayprint, "_get_format_function", None)
    if not callable(format_array_) or not callable(get_format_function):
        return None
    try:
        params = list(inspect.signature(format_array_).parameters)
    except (TypeError, ValueError):
        return None
    if params != _FORMAT_ARRAY_PARAMS:
        return None
    get_options = _options_getter(arrayprint)
    if get_options is None:
        return None
    return _Private(format_array_, get_format_function, get_options)


def _options_getter(arrayprint: ModuleType) -> Callable[[], dict[str, Any]] | None:
    # The internal options, not np.get_printoptions(): they differ in how 'legacy' is stored
    # (an int such as 113 or sys.maxsize internally, '1.13' or False publicly), and the private
    # helpers expect the internal form of whichever numpy is installed.
    for name in ("format_options", "_format_options"):
        holder = getattr(arrayprint, name, None)
        if isinstance(holder, ContextVar):  # numpy 2.x: context-local, so np.printoptions works
            return lambda holder=holder: dict(holder.get())
        if isinstance(holder, dict):  # numpy 1.x: a module-level dict
            return lambda holder=holder: dict(holder)
    return None


def _load_private(
    module_names: tuple[str, ...] = ("numpy._core.arrayprint", "numpy.core.arrayprint"),
) -> _Private | None:
    for name in module_names:
        try:
            arrayprint = importlib.import_module(name)
        except ImportError:
            continue
        # Only check the first module found: on numpy 2, numpy.core is a deprecated alias.
        return _check_module(arrayprint)
    return None


_PRIVATE: _Private | None = _load_private()


class _FullShapeView:
    """Stands in for the full array inside ``_formatArray``: full shape, data from ``small``.

    _formatArray only reads ``a.shape``, ``a.ndim`` and single elements ``a[index]``.  On an axis
    it elides it reads indices 0 .. edgeitems-1 and -edgeitems .. -1, which in ``small`` (the
    leading then the trailing items) are the same elements; on other axes ``small`` is complete.
    So an index passes straight through.
    """

    def __init__(self, small: np.ndarray, shape: tuple[int, ...]) -> None:
        self._small = small
        self.shape = shape
        self.ndim = len(shape)

    def __getitem__(self, index: tuple[int, ...]) -> Any:
        return self._small[index]


def _format_exact(
    private: _Private, small: np.ndarray, shape: tuple[int, ...], prefix: str, separator: str
) -> str:
    # Follows numpy's array2string and _array2string step by step.
    options = private.get_options()
    legacy = options["legacy"]
    if legacy <= 113 and shape == () and small.dtype.names is None:
        return repr(small.item())
    size = math.prod(shape)
    if size == 0:
        return "[]"
    summary_insert = "..." if size > options["threshold"] else ""
    # numpy picks widths and precision from the shown elements only, which is exactly `small`.
    format_function = private.get_format_function(small, **options)
    return private.format_array(
        _FullShapeView(small, shape),
        format_function,
        options["linewidth"],
        " " + " " * len(prefix),  # skip over the prefix and the opening "["
        separator,
        options["edgeitems"],
        summary_insert,
        legacy,
    )


# --- plain layout, when the private helpers are unusable -----------------------------------------


def _format_plain(small: np.ndarray, shape: tuple[int, ...], prefix: str, separator: str) -> str:
    """A readable numpy-like layout: nested rows, "..." where items are elided, wrapped lines."""
    options = np.get_printoptions()
    if math.prod(shape) == 0:
        return "[]"
    summarize = shown_indices(shape) is not None
    edgeitems = options["edgeitems"]
    words = [_plain_word(x, options["precision"]) for x in small.flat]
    width = max(len(word) for word in words)
    # Right-justify to one width so that columns line up, as numpy does.
    cells = np.array([word.rjust(width) for word in words], dtype=object).reshape(small.shape)

    def render(sub: np.ndarray, axis: int) -> str:
        if sub.ndim == 0:
            return str(sub.item())
        if sub.ndim == 1:
            parts = list(sub)  # already strings: indexing an object array yields its items
        else:
            parts = [render(sub[i], axis + 1) for i in range(sub.shape[0])]
        if summarize and shape[axis] > 2 * edgeitems:
            parts.insert(edgeitems, "...")  # between the leading and the trailing items
        indent = " " * (len(prefix) + axis + 1)  # under the first item, after prefix and "["s
        if sub.ndim == 1:
            # Like numpy, keep room for the separator or "]" after the last word of a line,
            # and for the "]"s that close the enclosing axes.
            limit = options["linewidth"] - axis - max(len(separator.rstrip()), 1)
            return "[" + _wrap(parts, separator, limit, indent) + "]"
        glue = separator.rstrip() + "\n" * (sub.ndim - 1) + indent
        return "[" + glue.join(parts) + "]"

    return render(cells, 0)


def _plain_word(x: np.generic, precision: int) -> str:
    if isinstance(x, np.floating):
        return f"{float(x):.{precision}g}"
    if isinstance(x, np.complexfloating):
        return f"{complex(x):.{precision}g}"
    return str(x)


def _wrap(words: list[str], separator: str, limit: int, indent: str) -> str:
    """Join words with separator, starting a new indented line before a word passes limit."""
    text, line = "", ""
    for i, word in enumerate(words):
        if i:
            line += separator
        if line.strip() and len(indent) + len(line) + len(word) > limit:
            text += line.rstrip() + "\n" + indent
            line = ""
        line += word
    return text + line
