"""The op list of docs/ops.md, generated from the code.

    python -m disttensor.oplist > docs/ops.md

For every op that ``dt`` exports: whether it has an SPMD rule of its own
(``dt.spmd.registered_ops()``) and a gradient, found by calling the op on two simulated ranks
and going backward through it: an op named like a rule need not run that rule's op (one made
of other dt ops, or fused with a composite route where a mesh dim splits a reduced axis), so
its gradient is that of what it runs, not the registry's entry for its name
(``autograd.GRADIENTS``, ``autograd.NOT_DIFFERENTIABLE``); tests/test_op_gradients.py checks
the column on other placements and against the registry. Then the ops with rules that dt uses
inside; then, for the installed numpy, which numpy functions and ufuncs run a dt
implementation on DistTensors and which take the counted replicate fallback.
tests/test_docs.py regenerates the text and fails when docs/ops.md differs.

>>> from disttensor.oplist import gradient_of
>>> gradient_of("add"), gradient_of("argmax"), gradient_of("var"), gradient_of("qr")
('yes', 'constant', 'yes', 'no')
"""

from __future__ import annotations

import functools
import sys
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from . import ops as _ops
from . import spmd
from .ops import numpy_interop as _interop
from .ops.elementwise import ALIASES as _ALIASES

COMMAND = "python -m disttensor.oplist > docs/ops.md"

FAMILIES = {  # module of the op's function -> section title, in reading order
    "elementwise": "Elementwise",
    "linalg": "Linear algebra",
    "reduction": "Reductions",
    "shape": "Shape and indexing",
    "nn": "Neural-network ops",
    "scan": "Scans",
    "layout": "Layout",
    "sorting": "Sorting",
    "unique": "Unique",
    "statistics": "Statistics",
    "order_stats": "Order statistics",
    "decompositions": "Decompositions",
}

# How to call an op for the gradient probe, where ``op(x)`` is not a call it takes or not one
# that carries a gradient (x: a symmetric float64 4 x 4 DistTensor whose rows are split over
# two ranks; where(x) alone is nonzero(x), an integer result).
_PROBES: dict[str, Callable[[Any, Any], Any]] = {
    "astype": lambda dt, x: dt.astype(x, np.float32),
    "broadcast_to": lambda dt, x: dt.broadcast_to(x, (2, 4, 4)),
    "clip": lambda dt, x: dt.clip(x, -0.5, 0.5),
    "cross_entropy": lambda dt, x: dt.cross_entropy(x, dt.argmax(x, axis=1)),
    "einsum": lambda dt, x: dt.einsum("ij,jk->ik", x, x),
    "embedding": lambda dt, x: dt.embedding(dt.argmax(x, axis=1), x),
    "reshape": lambda dt, x: dt.reshape(x, (2, 8)),
    "searchsorted": lambda dt, x: dt.searchsorted(dt.sort(dt.ravel(x)), x),
    "swapaxes": lambda dt, x: dt.swapaxes(x, 0, 1),
    "take_along_axis": lambda dt, x: dt.take_along_axis(x, dt.argsort(x, axis=1), axis=1),
    "where": lambda dt, x: dt.where(dt.greater(x, 0.0), x, 0.0),
    "ldexp": lambda dt, x: dt.ldexp(x, 2),
    "vecdot": lambda dt, x: dt.vecdot(x, x),
    "matvec": lambda dt, x: dt.matvec(x, x[0]),
    "vecmat": lambda dt, x: dt.vecmat(x[0], x),
}
# numpy's integer and bitwise ufuncs (ops/elementwise.py NUMPY_ONLY) take integer tensors
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor", "gcd", "lcm", "left_shift",
              "right_shift"):  # fmt: skip
    _PROBES[_name] = lambda dt, x, n=_name: getattr(dt, n)(dt.astype(x, np.int64), 1)
for _name in ("invert", "bitwise_count"):
    _PROBES[_name] = lambda dt, x, n=_name: getattr(dt, n)(dt.astype(x, np.int64))
# the calls tried in turn for every other op
_TRIES: tuple[Callable[[Callable, Any], Any], ...] = (
    lambda op, x: op(x),
    lambda op, x: op([x, x]),
    lambda op, x: op(x, 1),
    lambda op, x: op(x, x),
)


def calls(name: str) -> list[Callable[[Any, Any], Any]]:
    """The calls ``call(dt, x)`` of op ``name`` the gradient probe tries in turn (x: a float
    DistTensor of shape (4, 4)); the first that runs decides."""
    name = _ALIASES.get(name, name)  # dt.acos is dt.arccos: called the same way
    if name in _PROBES:
        return [_PROBES[name]]
    return [lambda dt_, x, t=t: t(getattr(dt_, name), x) for t in _TRIES]


def exported_ops() -> list[str]:
    """The op names ``dt`` exports (``disttensor.ops.__all__``), in their families' order."""
    return sorted(_ops.__all__, key=lambda n: (_family_rank(n), n))


def _family(name: str) -> str:
    import disttensor as dt

    return getattr(dt, name).__module__.rsplit(".", 1)[-1]


def _family_rank(name: str) -> int:
    keys = list(FAMILIES)
    fam = _family(name)
    return keys.index(fam) if fam in keys else len(keys)


def gradient_of(name: str) -> str:
    """ "yes" (``backward()`` goes through it), "no" (backward refuses with a
    NotImplementedError) or "constant" (integer, bool or piecewise-constant results: no
    gradient flows) for op ``name``: what backward does through a call of it on two simulated
    ranks."""
    return _probed()[name]


@functools.cache
def _probed() -> dict[str, str]:
    import disttensor as dt

    names = exported_ops()
    return dict(zip(names, dt.simulate(2, _probe_all, names)[0]))


def _probe_all(names: list[str]) -> list[str]:
    return [_probe(name) for name in names]


def _probe(name: str) -> str:
    import disttensor as dt

    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 4))
    mesh = dt.ProcessMesh([0, 1])
    errors = []
    for call in calls(name):
        x = dt.shard_tensor(a + a.T, mesh, [dt.Shard(0)], requires_grad=True)
        try:
            with np.errstate(all="ignore"):  # log of a negative entry: NaN, and no matter
                out = call(dt, x)
        except Exception as e:  # not a call this op takes: try the next
            errors.append(f"{type(e).__name__}: {e}")
            continue
        flowing = [o for o in _tensors(out) if o.requires_grad]
        if not flowing:
            return "constant"
        try:
            flowing[0].sum().backward()
        except NotImplementedError:
            return "no"
        return "yes" if x.grad is not None else "constant"
    raise RuntimeError(
        f"the op list cannot call dt.{name} to see whether it has a gradient (add a call to "
        f"_PROBES in disttensor/oplist.py); it raised: {errors}"
    )


def _tensors(out: Any) -> Iterable[Any]:
    from .tensor import DistTensor

    if isinstance(out, DistTensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o)


def internal_ops() -> list[str]:
    """Ops with a rule that dt uses inside (gradients, indexing) but does not export."""
    return sorted(set(spmd.registered_ops()) - set(_ops.__all__))


# -- numpy ---------------------------------------------------------------------------------------
_NAMESPACES = (("np", np), ("np.linalg", np.linalg), ("np.fft", np.fft))


def _public(module: Any, kind: type) -> list[tuple[str, Any]]:
    """(name, object) of ``module``'s public objects of type ``kind``, each once, under its
    own ``__name__`` where the module has it under that name (``np.concatenate``, not its
    alias ``np.concat``)."""
    found: dict[int, tuple[str, Any]] = {}
    for attr in sorted(dir(module)):
        f = getattr(module, attr)
        if attr.startswith("_") or not isinstance(f, kind):
            continue
        own = getattr(f, "__name__", attr)
        name = own if getattr(module, own, None) is f else attr
        found.setdefault(id(f), (name, f))
    return sorted(found.values(), key=lambda item: item[0])


def _numpy_functions() -> list[tuple[str, Any]]:
    """numpy's public functions that DistTensors can take over (``__array_function__``):
    (display name, function), by namespace then name; a function is listed once."""
    seen: set[int] = set()
    found = []
    for prefix, module in _NAMESPACES:
        for name, f in _public(module, type(np.sum)):
            if id(f) not in seen:
                seen.add(id(f))
                found.append((f"{prefix}.{name}", f))
    return found


def _ufuncs() -> list[tuple[str, np.ufunc]]:
    return [(f"np.{name}", u) for name, u in _public(np, np.ufunc)]


def numpy_version() -> str:
    """numpy's major.minor: the numpy section of the list depends on it."""
    return ".".join(np.__version__.split(".")[:2])


# -- the page ------------------------------------------------------------------------------------
def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _names(items: Iterable[str]) -> list[str]:
    """``items`` in code font, comma-separated, ending in a full stop, wrapped at 100."""
    return textwrap.wrap(", ".join(f"`{i}`" for i in items) + ".", 100, break_on_hyphens=False)


def _dt_name(op: str) -> str:
    return f"`dt.{op}`" if op in _ops.__all__ else f"`{op}`"


def ops_part() -> list[str]:
    """The numpy-independent part of the page: the header and the dt op tables."""
    lines = [
        "# Ops",
        "",
        "<!-- generated: do not edit; tests/test_docs.py checks it against the code -->",
        f"Generated from the code by `{COMMAND}`;",
        "run it again after adding or changing an op.",
        "",
        "Every op `dt` exports, by family. **SPMD rule**: yes if the op has a sharding rule of its",
        "own (`dt.spmd.registered_ops()`), which keeps its inputs' placements where it can and",
        "says what must move; no if it is made of other dt ops and collectives (its docstring,",
        "`help(dt.<op>)`, says how it moves data). Neither is the replicate fallback.",
        "**Gradient**: yes if `backward()` goes through it; constant if its results carry no",
        "gradient (integer, bool or piecewise-constant results); no if `backward()` refuses it",
        "with a `NotImplementedError` (compute it under `dt.no_grad()`). The numpy functions and",
        "ufuncs that run these ops on DistTensors are under [numpy functions](#numpy-functions).",
        "",
    ]
    by_family: dict[str, list[str]] = {}
    for name in exported_ops():
        by_family.setdefault(_family(name), []).append(name)
    rules = set(spmd.registered_ops())
    for fam, names in by_family.items():
        lines += [f"## {FAMILIES.get(fam, fam)}", "", _row("op", "SPMD rule", "gradient")]
        lines.append(_row("---", "---", "---"))
        for name in names:
            rule = "yes" if _ALIASES.get(name, name) in rules else "no"
            lines.append(_row(f"`dt.{name}`", rule, gradient_of(name)))
        lines.append("")
    lines += [
        "## Ops inside dt",
        "",
        "Ops with an SPMD rule that dt runs for you (gradients, indexing) and does not export:",
        *_names(internal_ops()),
        "",
    ]
    return lines


def numpy_part() -> list[str]:
    """The part that depends on the installed numpy: which of its functions run dt's ops."""
    ufuncs = _ufuncs()
    ours_u = [(n, _interop.implemented_by(u)) for n, u in ufuncs]
    reduces = [(f"np.{u.__name__}.reduce", red.__name__) for u, red in _interop._REDUCE.items()]
    funcs = [(n, _interop.implemented_by(f)) for n, f in _numpy_functions()]
    lines = [
        "## numpy functions",
        "",
        f"<!-- numpy {numpy_version()} -->",
        f"With numpy {numpy_version()}. numpy's ufuncs, the ufunc reductions below, and the",
        "functions of `np`, `np.linalg` and `np.fft` take DistTensors. Those listed with a dt",
        "implementation run it (arguments it does not take, such as `dtype=`, go to the",
        "fallback); the others take the counted replicate fallback: the inputs are gathered and",
        "every rank computes numpy's own result, logged and counted by `dt.fallback_report()`.",
        "In the tables, `dt.<name>` is the dt op a function runs; a bare name is a DistTensor",
        "method or attribute.",
        "",
        "### ufuncs with a dt implementation",
        "",
        _row("numpy", "dt"),
        _row("---", "---"),
    ]
    lines += [_row(f"`{n}`", _dt_name(op)) for n, op in ours_u if op is not None]
    lines += [_row(f"`{n}`", _dt_name(op)) for n, op in reduces]
    lines += [
        "",
        "### functions with a dt implementation",
        "",
        _row("numpy", "dt"),
        _row("---", "---"),
    ]
    lines += [_row(f"`{n}`", _dt_name(op)) for n, op in funcs if op is not None]
    lines += [
        "",
        "### ufuncs that take the fallback",
        "",
        *_names(n for n, op in ours_u if op is None),
        "",
        "### functions that take the fallback",
        "",
        *_names(n for n, op in funcs if op is None),
    ]
    return lines


def page() -> str:
    """The whole of docs/ops.md."""
    return "\n".join([*ops_part(), *numpy_part()]) + "\n"


def main() -> None:
    sys.stdout.write(page())


if __name__ == "__main__":
    main()
