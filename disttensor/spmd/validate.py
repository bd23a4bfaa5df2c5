"""Check the SPMD rules against numpy: ``python -m disttensor.spmd.validate [--ops add,matmul]
[--mesh 2]``.

For each op it knows how to call (``examples(name, k)``) and every 1-D placement of its tensor
inputs (Shard of each axis, Replicate, Partial sum/avg/max/min where the dtype allows) on a 1-D
mesh of k ranks, with uneven shapes and asymmetric Partial values, it

1. runs the op through dispatch on k simulated ranks (``dt.simulate(k, ...)``), gathers the
   result and compares it with numpy on the global inputs ("wrong": the result differs;
   "error": dispatch raised);
2. checks the rule's decision without dispatch: the raw kernel runs on locals that hold the
   rule's required input placements (fresh asymmetric values, so any locals the placement
   allows), and the rule's claimed output placement must rebuild the numpy result from them
   ("rule": a wrong rule is caught even where dispatch would mask it);
3. compares the collectives dispatch started with a lower bound ("over-communication").

Note [Communication lower bound]
    Every assignment of 1-D input placements is tried on the example as in 2., on six draws
    of fresh global values and splits; it is *exact* when some output placement rebuilds
    numpy's result on every draw (draws whose result is constant, e.g. all False, tell
    nothing and do not count; with no informative draw there is no bound). Moving an input
    costs one collective unless the 1-D transition is a no-op or local (same placement,
    Replicate -> Shard, Replicate -> Partial), and the per-rank wire volume of ring collectives
    on B bytes: all-gather and reduce-scatter (k-1)/k B, all-reduce 2(k-1)/k B, all-to-all
    (k-1)/k^2 B (the price model of reshard_cost in core.py). Dispatch over-communicates when
    an exact assignment is at least as cheap in collectives and in bytes and cheaper in one:
    a plan that spends a second collective to move fewer bytes is a trade-off, not a finding.
    Dispatch's collectives are counted with CommCounter; its bytes are priced from the
    placements the rule asked for. Exactness is tested, not proved, so a finding names the
    cheaper assignment for a human to judge.

This module is a tool on top of the whole package, like a test: nothing in disttensor imports
it, so it may use the op set and dispatch that sit above spmd.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..comm.base import reduce_arrays
from ..mesh import ProcessMesh
from ..placement import Partial, Placement, Replicate, Shard
from ..spec import DistSpec
from .core import TensorSpec, get_rule, registered_ops

_R = Replicate()
REDUCE_TYPES = ("sum", "avg", "max", "min")
FLOAT, F32, INT, BOOL = (np.dtype(t) for t in (np.float64, np.float32, np.int64, np.bool_))
DRAWS = 6  # Note [Communication lower bound]


@dataclass(frozen=True)
class Arg:
    """A tensor argument: its values are drawn afresh (``data``) for every draw."""

    shape: tuple[int, ...]
    dtype: np.dtype = FLOAT
    domain: str = "real"


@dataclass(frozen=True)
class Example:
    """One call of ``op``: ``params`` are ``Arg`` (tensor inputs) or values passed as they are."""

    op: str
    params: tuple
    attrs: dict = field(default_factory=dict)
    ref: Callable[..., Any] | None = None  # numpy reference; default np.<op>
    label: str = ""

    @property
    def single(self) -> bool:
        """Whether a float32 input limits the accuracy of Partial sums (see ``close``)."""
        return any(isinstance(a, Arg) and a.dtype == F32 for a in self.params)

    @property
    def pos(self) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.params) if isinstance(a, Arg))

    def args(self, draw: int = 0) -> tuple:
        rng = _rng(self.describe(), draw)
        return tuple(
            data(p.shape, p.dtype, rng, p.domain) if isinstance(p, Arg) else p for p in self.params
        )

    def expected(self, args: tuple) -> np.ndarray:
        ref = self.ref or getattr(np, self.op)
        with np.errstate(all="ignore"):
            return np.asarray(ref(*args, **self.attrs))

    def describe(self) -> str:
        parts = [
            f"{a.dtype}{list(a.shape)}" if isinstance(a, Arg) else repr(a) for a in self.params
        ]
        parts += [f"{k}={v!r}" for k, v in self.attrs.items()]
        return f"{self.op}({', '.join(parts)})" + (f" [{self.label}]" if self.label else "")


@dataclass(frozen=True)
class Finding:
    """kind: "wrong", "error", "rule" (wrong results) or "over-communication"."""

    op: str
    kind: str
    k: int
    example: str
    placements: tuple[Placement, ...]  # the inputs' 1-D placements
    detail: str

    @property
    def is_wrong(self) -> bool:
        return self.kind != "over-communication"

    def __str__(self) -> str:
        return (
            f"[{self.kind}] k={self.k} {self.example} inputs {_pl(self.placements)}: {self.detail}"
        )


# -- data ----------------------------------------------------------------------------------
def _rng(*key: Any) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def data(shape, dtype, rng: np.random.Generator, domain: str = "real") -> np.ndarray:
    """Random global values in ``domain``: real, positive, nonzero, exponent (small powers),
    small (integers near 0, so ties and zeros occur), special (with nan and inf)."""
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo, hi = {"positive": (1, 10), "small": (-2, 3), "exponent": (0, 4)}.get(domain, (-9, 10))
        v = rng.integers(lo, hi, shape)
        return np.where(v == 0, 7, v).astype(dtype) if domain == "nonzero" else v.astype(dtype)
    if domain == "positive":
        v = rng.uniform(0.5, 4.0, shape)
    elif domain == "nonzero":
        v = rng.uniform(0.5, 4.0, shape) * rng.choice([-1.0, 1.0], shape)
    elif domain == "exponent":
        v = rng.uniform(-2.0, 2.0, shape)
    elif domain == "small":
        v = rng.integers(-2, 3, shape).astype(np.float64)
    else:
        v = rng.normal(0.0, 3.0, shape)
    if domain == "special" and v.size:
        v.reshape(-1)[rng.integers(0, v.size, 3)] = [np.nan, np.inf, -np.inf]
    return v.astype(dtype)


def split_partial(v: np.ndarray, op: str, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """k local values whose ``op`` reduction (comm's reduce_arrays) is ``v``, far from halves.

    sum/avg: per-element weights of mixed sign (e.g. 1.4 and -0.4) plus noise that sums to
    zero, all but the last part multiples of 1/256 so integer-valued floats (and their zeros)
    add up exactly; max/min: a random owner holds the value, the others a little less/more
    (ties and reorderings happen, so non-monotone ops cannot keep Partial(max)); bool
    (sum and max are or, min is and): the owner holds it, the others only drop/add Trues.
    Non-finite floats go whole to their owner (inf * -0.4 would not add back to inf).
    """
    if k == 1:
        return [v.copy()]
    shape = v.shape
    owner = rng.integers(0, k, shape)
    if v.dtype == BOOL:
        noise = rng.random((k, *shape)) < 0.5
        if op == "min":
            return [np.where(owner == i, v, v | noise[i]) for i in range(k)]
        return [np.where(owner == i, v, v & noise[i]) for i in range(k)]
    integer = v.dtype.kind in "iu"
    if op in ("sum", "avg"):
        target = v * k if op == "avg" else v
        if integer:
            parts = list(rng.integers(-5, 6, (k - 1, *shape)).astype(v.dtype))
        else:
            finite = np.isfinite(target)
            t = np.where(finite, target, 0.0).astype(np.float64)
            w = rng.uniform(-0.6, 1.2, (k - 1, *shape))
            raw = t * w + rng.normal(0.0, 1.0, (k - 1, *shape))
            parts = list((np.round(raw * 256) / 256).astype(v.dtype))
        last = target - sum(parts) if parts else target
        if not integer:  # a non-finite value: whole on the last rank, zeros elsewhere
            parts = [np.where(finite, p, 0).astype(v.dtype) for p in parts]
            last = np.where(finite, last, target)
        return [*parts, np.asarray(last).astype(v.dtype)]
    # small steps (1, 2; 0.5 .. 2 by halves) tie with other values, large ones reorder them
    delta = rng.integers(1, 3, (k, *shape)) if integer else rng.integers(1, 5, (k, *shape)) / 2
    delta = delta * rng.choice([1, 4], (k, *shape))
    sign = -1 if op == "max" else 1
    return [np.where(owner == i, v, v + sign * delta[i]).astype(v.dtype) for i in range(k)]


def local_values(g: np.ndarray, p: Placement, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Every rank's local value of ``g`` placed as ``p`` on a 1-D mesh of k ranks."""
    if isinstance(p, Shard):
        return [a.copy() for a in np.array_split(g, k, axis=p.dim)]
    if isinstance(p, Partial):
        return split_partial(g, p.reduce_type, k, rng)
    return [g.copy() for _ in range(k)]


def candidates(ndim: int, dtype) -> list[Placement]:
    """The 1-D placements a tensor may have: Shard of each axis, Replicate, Partials.

    >>> candidates(1, "int64")  # doctest: +NORMALIZE_WHITESPACE
    [Shard(dim=0), Replicate(), Partial(reduce_type='sum'), Partial(reduce_type='max'),
     Partial(reduce_type='min')]
    """
    kinds = REDUCE_TYPES if np.dtype(dtype).kind in "fc" else ("sum", "max", "min")
    return [Shard(d) for d in range(ndim)] + [_R] + [Partial(t) for t in kinds]


# -- comparing -------------------------------------------------------------------------------
def close(got: np.ndarray, want: np.ndarray, single: bool = False) -> bool:
    """Same shape and dtype; equal (integers, bools) or close (floats; nan where numpy has).
    ``single``: an input was float32, so a float64 result is only float32-accurate."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if want.dtype.kind not in "fc":
        return bool(np.array_equal(got, want))
    tol = 2e-4 if single or want.dtype.itemsize <= 4 else 1e-8
    with np.errstate(all="ignore"):
        return bool(np.allclose(got, want, rtol=tol, atol=tol, equal_nan=True))


def rebuild(locals_: Sequence[np.ndarray], p: Placement, shape) -> np.ndarray | None:
    """The global value the locals stand for under output placement ``p`` (None: they cannot)."""
    if len({a.dtype for a in locals_}) != 1:
        return None
    if isinstance(p, Shard):
        if p.dim >= len(shape):
            return None
        sizes = [len(s) for s in np.array_split(np.empty(shape[p.dim]), len(locals_))]
        want = [shape[: p.dim] + (n,) + shape[p.dim + 1 :] for n in sizes]
        return np.concatenate(locals_, p.dim) if [a.shape for a in locals_] == want else None
    if any(a.shape != shape for a in locals_):
        return None
    if isinstance(p, Partial):
        if p.reduce_type == "avg" and locals_[0].dtype.kind not in "fc":
            return None
        return reduce_arrays(locals_, p.reduce_type)
    return locals_[0] if all(close(a, locals_[0]) for a in locals_[1:]) else None


def informative(want: np.ndarray) -> bool:
    """Whether a result can tell placements apart (a constant one rebuilds from anything)."""
    flat = want.reshape(-1)
    if flat.size == 1:  # 0, 1 and bools: what prod/all/any of most data give
        return want.dtype != BOOL and flat[0] not in (0, 1)
    return not np.all(flat == flat[:1])


# -- the ops and their example calls -----------------------------------------------------------
COMPOSITES = ("var", "std", "logsumexp", "softmax", "log_softmax")  # no rule of their own


def op_table() -> dict[str, Any]:
    """Op name -> its dispatch ``Op`` (kernel + rule name), or the function of a composite."""
    from ..ops import elementwise, linalg, reduction

    table: dict[str, Any] = {**elementwise.OPS, **reduction.OPS}
    table.update(linalg.OPS)
    table.update({name: getattr(reduction, name) for name in COMPOSITES})
    return table


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _swap(a, yes):
    return np.swapaxes(a, -1, -2) if yes and a.ndim > 1 else a


def _lse(x, axis=None, keepdims=False):
    return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))


REFS: dict[str, Callable[..., Any]] = {  # references where np.<name> is not one
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x * _sigmoid(x),
    "gelu": lambda x: 0.5 * x * (1 + np.tanh((2 / np.pi) ** 0.5 * (x + 0.044715 * x**3))),
    "astype": lambda x, dtype: x.astype(dtype),
    "einsum": lambda *ops, equation: np.einsum(equation, *ops),
    "matmul": lambda x, y, trans_x=False, trans_y=False: _swap(x, trans_x) @ _swap(y, trans_y),
    "linear": lambda x, w, b: x @ w + b,
    "logsumexp": _lse,
    "softmax": lambda x, axis=-1: np.exp(x - _lse(x, axis, True)),
    "log_softmax": lambda x, axis=-1: x - _lse(x, axis, True),
}
DOMAINS = {  # value domains of the arguments of elementwise ops (default: real)
    **dict.fromkeys(("log", "log2", "log10", "sqrt", "rsqrt", "log1p"), ("positive",)),
    "reciprocal": ("nonzero",),
    **dict.fromkeys(("isnan", "isinf", "isfinite"), ("special",)),
    **dict.fromkeys(("divide", "true_divide", "floor_divide", "mod"), ("real", "nonzero")),
    "power": ("positive", "exponent"),
    **dict.fromkeys(  # ties and zeros make the results informative
        (
            *("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"),
            *("logical_and", "logical_or", "logical_xor", "logical_not"),
        ),
        ("small", "small"),
    ),
}


def _accepted(ex: Example) -> bool:
    """numpy takes the call (np.negative refuses bools, ...): otherwise there is no oracle."""
    try:
        ex.expected(ex.args())
    except (TypeError, ValueError):
        return False
    return True


def _elementwise(name: str, k: int) -> list[Example]:
    from ..ops.elementwise import BINARY

    n, m = 2 * k + 1, k + 1
    d0, d1 = (*DOMAINS.get(name, ()), "real", "real")[:2]
    ref = REFS.get(name)
    out: list[Example] = []
    if name in BINARY:
        for dt in (FLOAT, INT, BOOL):
            out.append(Example(name, (Arg((n, m), dt, d0), Arg((n, m), dt, d1)), ref=ref))
            out.append(Example(name, (Arg((n, m), dt, d0), 3), ref=ref, label="scalar"))
        scalar = 0.5 if d1 == "exponent" else 2.0
        out += [
            Example(name, (Arg((n, m), BOOL, d0), Arg((n, m), INT, d1)), ref=ref),
            Example(name, (Arg((n, m), F32, d0), Arg((n, m), FLOAT, d1)), ref=ref),
            Example(name, (Arg((n, m), FLOAT, d0), Arg((m,), FLOAT, d1)), ref=ref),
            Example(name, (Arg((n, 1), FLOAT, d0), Arg((1, m), FLOAT, d1)), ref=ref),
            Example(name, (Arg((n, m), FLOAT, d0), Arg((), FLOAT, d1)), ref=ref),
            Example(name, (Arg((1, m), FLOAT, d0), Arg((1, m), FLOAT, d1)), ref=ref, label="empty"),
            Example(name, (Arg((n, m), F32, d0), scalar), ref=ref, label="float32 and a scalar"),
            Example(name, (2.5, Arg((n, m), FLOAT, d1)), ref=ref),
        ]
    elif name == "where":
        out += [
            Example(name, (Arg((n, m), BOOL), Arg((n, m)), Arg((n, m)))),
            Example(name, (Arg((n, 1), BOOL), Arg((n, m)), Arg((m,)))),
            Example(name, (Arg((n, m), BOOL), Arg((n, m), INT), 0), label="scalar"),
        ]
    elif name == "clip":
        out += [
            Example(name, (Arg((n, m)), -1.0, 2.0), ref=np.clip),
            Example(name, (Arg((n, m), INT), None, 2), ref=np.clip),
            Example(name, (Arg((n, m)), Arg((n, m)), 1.5), ref=np.clip),
        ]
    elif name == "astype":
        for src, dst in [(FLOAT, F32), (FLOAT, INT), (INT, FLOAT), (BOOL, INT)]:
            out.append(Example(name, (Arg((n, m), src),), {"dtype": dst}, ref=ref))
    else:  # unary
        out += [Example(name, (Arg((n, m), dt, d0),), ref=ref) for dt in (FLOAT, INT, BOOL)]
        out.append(Example(name, (Arg((1, m), F32, d0),), ref=ref, label="empty"))
    return [e for e in out if _accepted(e)]


def _linalg(name: str, k: int) -> list[Example]:
    n, c, m, b = 2 * k + 1, k + 2, k + 1, k + 1

    def mm(*shapes, dtype=FLOAT, **attrs):
        return Example(name, tuple(Arg(s, dtype) for s in shapes), attrs, ref=REFS.get(name))

    if name == "matmul":
        return [
            mm((n, c), (c, m)),
            mm((n, c), (c, m), dtype=F32),
            mm((n, c), (c, m), dtype=INT),
            mm((c, n), (c, m), trans_x=True),
            mm((n, c), (m, c), trans_y=True),
            mm((c, n), (m, c), trans_x=True, trans_y=True),
            mm((c,), (c, m)),
            mm((n, c), (c,)),
            mm((c,), (c,)),
            mm((b, n, c), (c, m)),
            mm((b, 1, n, c), (2, c, m)),
        ]
    if name == "linear":
        return [
            mm((n, c), (c, m), (m,)),
            mm((n, c), (c, m), (m,), dtype=F32),
            mm((c,), (c, m), (m,)),
            mm((b, n, c), (c, m), (m,)),
        ]
    if name == "dot":
        return [mm((n, c), (c, m)), mm((c,), (c,)), mm((2, n, c), (b, c, m)), mm((), (n, m))]
    if name == "outer":
        return [mm((n,), (m,)), mm((n, 2), (m,))]
    equations = {  # einsum
        "ij,jk->ik": ((n, c), (c, m)),
        "ij,jk": ((n, c), (c, m)),
        "ii->i": ((n, n),),
        "ii": ((n, n),),
        "ij->ji": ((n, m),),
        "ij->": ((n, m),),
        "i,i->": ((n,), (n,)),
        "ij,ij->ij": ((n, m), (n, m)),
        "bij,bjk->bik": ((b, n, c), (b, c, m)),
        "...ij,...jk->...ik": ((b, n, c), (c, m)),
        "ij,j": ((n, m), (m,)),
    }
    return [mm(*shapes, equation=eq) for eq, shapes in equations.items()]


def _reduction(name: str, k: int) -> list[Example]:
    n, m = 2 * k + 1, k + 1
    ref = REFS.get(name)
    domain = "small" if name in ("all", "any") else "real"  # zeros matter to all/any
    if name in COMPOSITES:
        if name in ("softmax", "log_softmax"):
            return [Example(name, (Arg((n, m)),), {"axis": ax}, ref=ref) for ax in (0, -1)]
        attrs = [{"axis": 0}, {"axis": None}, {"axis": 1, "keepdims": True}]
        if name in ("var", "std"):
            attrs.append({"axis": 0, "ddof": 1})
        return [Example(name, (Arg((n, m)),), a, ref=ref) for a in attrs]
    axes: list[dict] = [{}, {"axis": 0}, {"axis": -1}, {"axis": (0, 1), "keepdims": True}]
    dtypes = (FLOAT, INT, BOOL)
    if name in ("argmax", "argmin"):  # (bools: the answer is nearly always 0 or 1)
        axes[-1], dtypes = {"axis": 1, "keepdims": True}, (FLOAT, INT)
    out = [Example(name, (Arg((n, m), dt, domain),), a, ref=ref) for dt in dtypes for a in axes]
    tiny = Arg((max(k - 1, 1), m), FLOAT, domain)  # a rank holds an empty shard
    out.append(Example(name, (tiny,), {"axis": 0}, ref=ref, label="empty"))
    if name not in ("argmax", "argmin"):
        out.append(Example(name, (Arg((k, 3, n), FLOAT, domain),), {"axis": (0, 2)}, ref=ref))
    return [e for e in out if _accepted(e)]


def _families() -> dict[str, Callable[[str, int], list[Example]]]:
    from ..ops import elementwise, reduction

    return {
        **dict.fromkeys(elementwise.OPS, _elementwise),
        **dict.fromkeys(("matmul", "dot", "einsum", "outer", "linear"), _linalg),
        **dict.fromkeys((*reduction.OPS, *COMPOSITES), _reduction),
    }


def examples(name: str, k: int) -> list[Example]:
    """The example calls of op ``name`` for a mesh of k ranks (KeyError: it has none)."""
    return _families()[name](name, k)


def known_ops() -> list[str]:
    """The ops ``validate`` has examples for."""
    return sorted(_families())


# -- the rule's decision, on k ranks in this process ----------------------------------------
def _bool_partial_as_dispatched(g: np.ndarray, p: Placement, k: int) -> list[np.ndarray]:
    """The only bool Partial locals a computing op's kernel gets: dispatch reduces a bool
    Partial first (see _seen) and makes it Partial again locally, so Partial(sum) holds the
    value on the first rank and False elsewhere, and max/min hold it on every rank."""
    if p.reduce_type in ("sum", "avg"):
        return [g.copy()] + [np.zeros_like(g) for _ in range(k - 1)]
    return [g.copy() for _ in range(k)]


def run_kernel(op: Any, ex: Example, args: tuple, placements, k: int, seed: Any) -> list:
    """The kernel's local results on k ranks whose inputs hold ``placements``."""
    from ..dispatch import KernelContext

    mesh = ProcessMesh(list(range(k)))
    per_rank = [list(args) for _ in range(k)]
    specs = []
    for j, (i, p) in enumerate(zip(ex.pos, placements)):
        if args[i].dtype == BOOL and p.is_partial():
            values = _bool_partial_as_dispatched(args[i], p, k)
        else:
            values = local_values(args[i], p, k, _rng(seed, j, p))
        for r, loc in enumerate(values):
            per_rank[r][i] = loc
        specs.append(DistSpec(mesh, (p,), args[i].shape, args[i].dtype))
    out = []
    with np.errstate(all="ignore"):
        for r in range(k):
            ctx = {"ctx": KernelContext(tuple(specs), (), (r,))} if op.ctx else {}
            out.append(np.asarray(op.kernel(*per_rank[r], **ctx, **ex.attrs)))
    return out


def exact_outputs(op, ex: Example, placements, k: int) -> tuple[list[Placement], bool]:
    """Output placements under which the kernel's locals rebuild numpy's result on every draw,
    and whether any draw was informative (Note [Communication lower bound])."""
    good: list[Placement] = []
    told = False
    for d in range(DRAWS):
        args = ex.args(d)
        want = ex.expected(args)
        if d == 0:
            good = candidates(want.ndim, want.dtype)
        try:
            locals_ = run_kernel(op, ex, args, placements, k, seed=(ex.describe(), d))
        except Exception:  # a kernel that cannot run on these locals rebuilds nothing
            return [], True
        if d == 0 or informative(want):
            told = told or informative(want)
            good = [p for p in good if _rebuilds(locals_, p, want, ex.single)]
    return good, told


def _rebuilds(locals_, p: Placement, want: np.ndarray, single: bool) -> bool:
    got = rebuild(locals_, p, want.shape)
    return got is not None and close(got, want, single)


@functools.lru_cache(maxsize=4096)
def price(cur: Placement, req: Placement, nbytes: int, k: int) -> tuple[int, float]:
    """(collectives, wire bytes per rank) of a 1-D reshard: Note [Communication lower bound]."""
    if cur == req or cur.is_replicate():
        return 0, 0.0
    wire = nbytes * (k - 1) / k
    if cur.is_partial():
        return 1, wire if req.is_shard() else 2 * wire
    return 1, wire / k if req.is_shard() else wire


def plan_price(cur, req, sizes: Sequence[int], k: int) -> tuple[int, float]:
    """The price of moving inputs of ``sizes`` bytes from placements ``cur`` to ``req``."""
    n, b = 0, 0.0
    for p, q, size in zip(cur, req, sizes):
        dn, db = price(p, q, size, k)
        n, b = n + dn, b + db
    return n, b


# -- dispatch, on simulated ranks ---------------------------------------------------------
def _dispatch_all(call, ex: Example, combos, k: int) -> list[tuple]:
    """On every simulated rank: each combo through dispatch -> (gathered result, collectives)."""
    import disttensor as dt

    rank, mesh, args = dt.get_rank(), dt.ProcessMesh(list(range(k))), ex.args()
    out = []
    for placements in combos:
        dargs = list(args)
        for j, (i, p) in enumerate(zip(ex.pos, placements)):
            loc = local_values(args[i], p, k, _rng("dispatch", ex.describe(), j, p))[rank]
            dargs[i] = dt.dtensor_from_local(loc, mesh, [p], global_shape=args[i].shape)
        try:
            with dt.CommCounter() as cc, np.errstate(all="ignore"):
                res = call(*dargs, **ex.attrs)
            out.append((res.numpy() if isinstance(res, dt.DistTensor) else res, cc.total))
        except Exception as e:  # every rank raises alike: the rule decides the same everywhere
            out.append((e, 0))
    return out


def check_example(call, ex: Example, k: int) -> list[Finding]:
    """The three checks of the module docstring for one example and every input placement."""
    from ..comm import simulate
    from ..dispatch import Op

    args = ex.args()
    want = ex.expected(args)
    tensors = [args[i] for i in ex.pos]
    combos = list(itertools.product(*[candidates(g.ndim, g.dtype) for g in tensors]))
    findings: list[Finding] = []

    def add(kind, placements, detail):
        findings.append(Finding(ex.op, kind, k, ex.describe(), tuple(placements), detail))

    rule = get_rule(call.rule) if isinstance(call, Op) and call.rule else None
    exact = {c: exact_outputs(call, ex, c, k) for c in combos} if rule else {}
    required: dict[tuple, tuple] = {}  # input placements -> the placements the rule asks for
    for c in combos if rule else ():
        specs = tuple(TensorSpec(g.shape, [_seen(g, p)], g.dtype) for g, p in zip(tensors, c))
        try:
            res = rule(specs, (k,), pos=ex.pos, nargs=len(args), **ex.attrs)
        except Exception as e:
            add("rule", c, f"the rule raised {type(e).__name__}: {e}")
            continue
        req = required[c] = tuple(p[0] for p in res.inputs)
        out = res.outputs[0][0]
        good = (exact[req] if req in exact else exact_outputs(call, ex, req, k))[0]
        if out not in good:
            add("rule", c, f"the rule asks {_pl(req)} -> {out}; exact there: {_pl(good)}")
        elif res.shapes is not None and tuple(res.shapes[0]) != want.shape:
            add("rule", c, f"the rule claims shape {res.shapes[0]}, numpy gives {want.shape}")
    sizes = [g.nbytes for g in tensors]
    bounds = [(a, outs) for a, (outs, told) in exact.items() if outs and told]
    try:
        runs = simulate(k, _dispatch_all, call, ex, combos, k, timeout=20.0)
    except Exception as e:
        add("error", (), f"the simulated run failed: {type(e).__name__}: {e}")
        return findings
    for j, c in enumerate(combos):
        got = runs[0][j][0]
        if isinstance(got, Exception):
            add("error", c, f"dispatch raised {type(got).__name__}: {got}")
        elif not close(got, want, ex.single):
            add("wrong", c, _mismatch(np.asarray(got), want))
        elif c in required:
            count = max(r[j][1] for r in runs)
            detail = _dominated(c, count, required[c], bounds, sizes, k)
            if detail:
                add("over-communication", c, detail)
    return findings


def _seen(g: np.ndarray, p: Placement) -> Placement:
    """The placement the rule is shown, as dispatch shows it: a bool Partial is a logical or/and,
    not a sum, so dispatch hands it to rules as Replicate (and reduces it first)."""
    return _R if g.dtype == BOOL and p.is_partial() else p


def _dominated(cur, count: int, req, exact: list, sizes, k: int) -> str | None:
    """Why dispatch's plan (``count`` collectives, to placements ``req``) is dominated by one
    of the ``exact`` (assignment, outputs), if it is."""
    _, wire = plan_price(cur, req, sizes, k)
    best = None
    for a, outs in exact:
        n, b = plan_price(cur, a, sizes, k)
        if n <= count and b <= wire + 1e-9 and (n < count or b < wire - 1e-9):
            if best is None or (n, b) < best[:2]:
                best = (n, b, a, outs)
    if best is None:
        return None
    n, b, a, outs = best
    return (
        f"{count} collective(s), {wire:.0f} B/rank via {_pl(req)}; exact with {n}, {b:.0f} B: "
        f"{_pl(a)} -> {_pl(outs)}"
    )


def _pl(placements) -> str:
    return "(" + ", ".join(map(str, placements)) + ")"


def _mismatch(got: np.ndarray, want: np.ndarray) -> str:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype}{got.shape}, numpy {want.dtype}{want.shape}"
    if want.dtype.kind in "fc":
        bad = np.argwhere(~np.isclose(got, want, equal_nan=True))
    else:
        bad = np.argwhere(got != want)
    at = tuple(int(i) for i in bad[0]) if bad.size else ()
    return f"values differ at {at}: got {got[at]!r}, numpy {want[at]!r} ({len(bad)} differ)"


def validate(ops: Sequence[str] | None = None, k: int = 2) -> list[Finding]:
    """Findings for ``ops`` (default: every op with examples) on a 1-D mesh of k ranks.

    >>> found = validate(["sign"], k=2)
    >>> [f for f in found if f.is_wrong]
    []
    """
    table = op_table()
    names = known_ops() if ops is None else list(ops)
    unknown = [n for n in names if n not in table or n not in _families()]
    if unknown:
        raise ValueError(f"validate: no examples for {unknown}; known ops: {known_ops()}")
    return [
        f for name in names for ex in examples(name, k) for f in check_example(table[name], ex, k)
    ]


def _short(p: Placement) -> str:
    if isinstance(p, Shard):
        return f"S{p.dim}"
    return f"P{p.reduce_type}" if isinstance(p, Partial) else "R"


def summarize(findings: Sequence[Finding], top: int = 3) -> dict[str, list[str]]:
    """Per op: its over-communication findings grouped by pattern, most frequent first, e.g.
    ``"12x (Pmax) could stay (Pmax) -> (Pmax) with 0 collective(s)"``."""
    groups: dict[str, dict[str, int]] = {}
    for f in findings:
        if f.is_wrong:
            continue
        n, rest = f.detail.rsplit("exact with ", 1)[1].split(",", 1)
        plan = rest.split(": ", 1)[1]
        for name, short in [("Replicate()", "R"), ("Shard(dim=", "S"), (")", ""), ("(", "")]:
            plan = plan.replace(name, short)
        for t in REDUCE_TYPES:
            plan = plan.replace(f"Partialreduce_type='{t}'", f"P{t}")
        alt, outs = plan.split(" -> ")
        key = f"({', '.join(map(_short, f.placements))}) could use ({alt}) -> ({outs}) with {n}"
        per = groups.setdefault(f.op, {})
        per[key] = per.get(key, 0) + 1
    return {
        op: [f"{c}x {key} collective(s)" for key, c in sorted(per.items(), key=lambda t: -t[1])][
            :top
        ]
        for op, per in groups.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m disttensor.spmd.validate", description="Check SPMD rules against numpy."
    )
    parser.add_argument("--ops", help="comma-separated op names (default: all with examples)")
    parser.add_argument(
        "--mesh", type=int, action="append", help="ranks of the 1-D mesh, repeatable (2 and 3)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print every finding")
    args = parser.parse_args(argv)
    names = args.ops.split(",") if args.ops else known_ops()
    wrong = 0
    for k in args.mesh or [2, 3]:
        print(f"== 1-D mesh of {k} ranks ==")
        for name in names:
            found = validate([name], k)
            bad = [f for f in found if f.is_wrong]
            wrong += len(bad)
            print(f"{name:14s} {len(bad)} wrong, {len(found) - len(bad)} over-communicating")
            for f in found if args.verbose else bad[:5]:
                print(f"    {f}")
            if not args.verbose:
                for line in summarize(found).get(name, []):
                    print(f"    over-communication: {line}")
    if not args.ops:
        rest = sorted(set(registered_ops()) - set(known_ops()))
        print(f"registered ops of other families, not checked here: {', '.join(rest) or '-'}")
    print(f"{'FAIL' if wrong else 'OK'}: {wrong} wrong result(s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
