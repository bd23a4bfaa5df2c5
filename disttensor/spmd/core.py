"""TensorSpec, the rule registry, and the einsum-notation core that most rules are built from.

A rule maps input specs (global shape + placements) on a mesh to the placements the inputs must
have, the placements the outputs get, and the outputs' global shapes. It never communicates.

The einsum core decides each mesh dim independently. It lists candidates (everything
Replicate; shard one letter: inputs holding it are Shard, the others Replicate, and the output
is Shard if it keeps the letter else Partial; pass Partial through, as linearity allows), prices
each by the bytes resharding the inputs would move, and takes the cheapest (ties: the first, so
all-Replicate inputs stay Replicate).

Note [Partial through ops]
    An op may keep a Partial input Partial only where that is exact:
    * "linear" ops (add, subtract, negative, sum, shape ops): f(sum x_i) = sum f(x_i) for all
      inputs jointly, so all inputs Partial(t) -> Partial(t), t in sum/avg; a Replicate input
      becomes Partial locally for free (zeros off the first rank).
    * "multilinear" ops (multiply, matmul, einsum, divide by a Replicate): linear in each input
      separately, so exactly one input Partial(t), the others Replicate -> Partial(t).
    * ops may add their own patterns (max of a Partial(max) is Partial(max)).
    Anything else reshards Partial inputs first.
    A Partial is passed through only where that costs no gather: every other input is
    already Replicate, or a Partial that any plan must reduce anyway (a Partial(max) beside a
    Partial(sum): reducing the max and keeping the sum saves the sum's all-reduce; the cost
    model decides which to keep). For a product, only a Partial of another type: two factors
    of one type may be one tensor (``d * d``), reduced once by dispatch, and keeping it
    Partial would leave the product and its gradient Partial. Gathering another operand to
    keep a Partial only
    postpones its reduction, and the Partial then makes every later op gather again (a
    gradient kept Partial through a row-parallel layer's backward would gather the weight and
    then every head-split activation of the attention). So a Partial meets a split operand
    with one reduction, as Megatron's blocks do.

>>> from disttensor.placement import Shard, Replicate
>>> rule = einsum("ij,jk->ik")
>>> out = rule((TensorSpec((8, 4), [Shard(1)]), TensorSpec((4, 6), [Shard(0)])), (2,))
>>> out.outputs
((Partial(reduce_type='sum'),),)
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..placement import Partial, Placement, Replicate, Shard

_R = Replicate()


@dataclass(frozen=True, init=False, repr=False)
class TensorSpec:
    """A tensor's global shape, its placements (one per mesh dim) and, optionally, its dtype
    (what its bytes cost to move: Note [Price of a reshard]; float64 when not given);
    hashable.

    >>> TensorSpec((4, 6), [Shard(-1)])
    TensorSpec(shape=(4, 6), placements=(Shard(dim=1),))
    >>> TensorSpec((4, 6), [Replicate()], dtype="float32").itemsize
    4
    """

    shape: tuple[int, ...]
    placements: tuple[Placement, ...]
    dtype: np.dtype | None

    def __init__(
        self, shape: Sequence[int], placements: Sequence[Placement], dtype: Any = None
    ) -> None:
        try:
            shape = tuple(operator.index(s) for s in shape)
        except TypeError:
            raise TypeError(f"TensorSpec shape must be a sequence of ints, got {shape!r}") from None
        if any(s < 0 for s in shape):
            raise ValueError(f"TensorSpec shape must not be negative, got {shape}")
        if not isinstance(placements, (list, tuple)):
            raise TypeError(
                f"TensorSpec placements must be a list (one per mesh dim), got {placements!r}"
            )
        n = len(shape)
        norm = []
        for p in placements:
            if not isinstance(p, Placement):
                raise TypeError(f"TensorSpec placements must be Placements, got {p!r}")
            if isinstance(p, Shard) and not 0 <= p.dim < n:
                if not -n <= p.dim < 0:
                    raise ValueError(f"{p!r} is out of range for a tensor with {n} axes")
                p = Shard(p.dim % n)
            norm.append(p)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "placements", tuple(norm))
        object.__setattr__(self, "dtype", None if dtype is None else np.dtype(dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return 8 if self.dtype is None else self.dtype.itemsize

    def __repr__(self) -> str:
        dtype = "" if self.dtype is None else f", dtype={self.dtype.name!r}"
        return f"TensorSpec(shape={self.shape}, placements={self.placements}{dtype})"


@dataclass(frozen=True)
class RuleResult:
    """Placements the inputs must have, and the outputs' placements and global shapes."""

    inputs: tuple[tuple[Placement, ...], ...]
    outputs: tuple[tuple[Placement, ...], ...]
    shapes: tuple[tuple[int, ...], ...] | None  # None: only known by running the op


Rule = Callable[..., RuleResult]
_RULES: dict[str, Rule] = {}


def register(*names: str) -> Callable[[Rule], Rule]:
    """Decorator: register ``rule`` under each of ``names``."""

    def deco(rule: Rule) -> Rule:
        for name in names:
            if name in _RULES:
                raise ValueError(f"an SPMD rule for {name!r} is already registered")
            _RULES[name] = rule
        return rule

    return deco


def get_rule(name: str) -> Rule | None:
    """The SPMD rule registered for op ``name``, or None (the op uses the replicate fallback)."""
    return _RULES.get(name)


def registered_ops() -> list[str]:
    """Names of the ops that have an SPMD rule (the others use the replicate fallback)."""
    return sorted(_RULES)


def replicate_fallback(specs: Sequence[TensorSpec], mesh_shape: tuple[int, ...]) -> RuleResult:
    """Every input Replicate, one Replicate output of unknown shape."""
    rep = (_R,) * len(mesh_shape)
    return RuleResult(tuple(rep for _ in specs), (rep,), None)


# -- the price of moving data (Note [Price of a reshard]) -------------------------------------
# Note [Price of a reshard]
#     Rules and the reshard planner price a 1-D move in bytes of wire time per rank: a
#     collective costs LATENCY (its fixed time, as the bytes the wire moves meanwhile) plus its
#     ring volume on B bytes: all-gather and reduce-scatter (k-1)/k B, all-reduce twice that,
#     all-to-all (k-1)/k^2 B. Local moves (Replicate -> Shard: a slice; Replicate -> Partial:
#     zeros off coordinate 0) cost a byte or so: they only break ties, since they move nothing
#     and leave each rank less to compute. Measured here (docs/performance.md): a small dt
#     reshard takes about 14 us and the shared-memory wire moves about 14 GB/s, so one
#     collective costs what 200 KB cost on the wire; a network with 5 us latency and 10 GB/s
#     gives 50 KB. LATENCY is 128 KiB, between the two: one collective that moves more wins
#     over two that move less up to about that difference.
#     One deliberate exception: for a rule, Partial -> Shard costs an all-reduce, not the
#     reduce-scatter it is. The split result is usually needed whole later, which costs the
#     other half; so a rule keeps a reduce-scatter only where the split saves elsewhere (an
#     operand already split that way), and otherwise takes the one all-reduce. The planner,
#     asked for an explicit Shard target, prices it as what it is (``planner=True``).
LATENCY = 131072.0
_LOCAL = 1.0  # a local move: a tie-breaker, never a reason to communicate


def reshard_cost(
    cur: Placement, req: Placement, k: int, nbytes: float, planner: bool = False
) -> float:
    """Wire bytes per rank a 1-D move of ``nbytes`` costs, latency included (Note [Price of
    a reshard])."""
    if cur == req:
        return 0.0
    wire = nbytes * (k - 1) / k
    if req.is_replicate():
        return LATENCY + (2 * wire if cur.is_partial() else wire)
    if req.is_shard():
        if cur.is_replicate():
            return _LOCAL
        if cur.is_shard():
            return LATENCY + wire / k
        return LATENCY + (wire if planner else 2 * wire)
    # to Partial: local from Replicate, else through Replicate
    if cur.is_replicate():
        return _LOCAL
    return LATENCY + (2 * wire if cur.is_partial() else wire) + _LOCAL


def _inner_cost(spec: TensorSpec, mesh_shape: tuple[int, ...], m: int):
    """Extra bytes to change mesh dim m when a later mesh dim also splits the same axis: that
    split must be gathered first (Note [Nested sharding] in spec.py)."""

    def cost(cur: Placement, req: Placement) -> float:
        extra = 0.0
        for p in (cur, req):
            if isinstance(p, Shard):
                for j in range(m + 1, len(mesh_shape)):
                    if spec.placements[j] == p:
                        whole = math.prod(spec.shape) * spec.itemsize
                        extra += LATENCY + whole * (mesh_shape[j] - 1) / mesh_shape[j]
        return extra

    return cost


def _local_bytes(spec: TensorSpec, mesh_shape: tuple[int, ...], m: int) -> float:
    others = math.prod(
        n for j, n in enumerate(mesh_shape) if j != m and spec.placements[j].is_shard()
    )
    return math.prod(spec.shape) * spec.itemsize / others


def solve(
    subs: Sequence[str],
    out: Sequence[str],
    specs: Sequence[TensorSpec],
    mesh_shape: tuple[int, ...],
    *,
    reduce: str | None = "sum",
    linearity: str = "multilinear",
    unshardable: frozenset[str] = frozenset(),
    partial_patterns: Sequence[tuple[tuple[Placement, ...], Placement]] = (),
    linear_in: Sequence[int] | None = None,
    added: Sequence[int] = (),
) -> tuple[tuple[tuple[Placement, ...], ...], tuple[Placement, ...]]:
    """Placements per input and of the (single) output for an einsum-like op.

    ``subs[i]`` are input i's letters, ``out`` the output's; ``reduce`` is the Partial type of
    a sharded letter that the output drops (None: such letters cannot be sharded).
    ``linearity`` is "linear", "multilinear" (then ``linear_in``: the inputs it is linear in,
    default all) or "none": Note [Partial through ops]. ``added``: inputs that are added to
    the multilinear product rather than multiplied into it (a bias; their letters are all
    output letters): wherever the output is Partial(t), t in sum/avg, they are Partial(t)
    too (Note [Bias of a linear] in rules.py).
    """
    letters = [c for c in dict.fromkeys("".join(out) + "".join(subs)) if c not in unshardable]
    log = _recording.log  # None unless dt.explain asks (Note [What a rule considered])
    per_in: list[list[Placement]] = [[] for _ in specs]
    per_out: list[Placement] = []
    for m, k in enumerate(mesh_shape):
        cur = [s.placements[m] for s in specs]
        if k == 1:  # any placement holds the same data: keep the inputs, output Replicate
            for i, p in enumerate(cur):
                per_in[i].append(p if not p.is_partial() else _R)
            per_out.append(_R)
            continue
        cands: list[tuple[tuple[Placement, ...], Placement]] = [((_R,) * len(specs), _R)]
        for c in letters:
            if c not in out and reduce is None:
                continue
            req = tuple(Shard(s.index(c)) if c in s else _R for s in subs)
            if all(r is _R for r in req):
                continue
            if c not in out and added:  # a Partial output: the added inputs are added once
                req = tuple(Partial(reduce) if i in added else r for i, r in enumerate(req))
            cands.append((req, Shard(out.index(c)) if c in out else Partial(reduce)))
        kinds = {p.reduce_type for p in cur if isinstance(p, Partial)}
        for t in sorted(kinds & {"sum", "avg"}):
            if linearity == "linear":
                req = (Partial(t),) * len(specs)
                if all(not a.is_shard() for a in cur):  # others R, or Partials reduced anyway
                    cands.append((req, Partial(t)))
            elif linearity == "multilinear":
                pt = Partial(t)
                for i in linear_in if linear_in is not None else range(len(specs)):
                    req = tuple(pt if j == i or j in added else _R for j in range(len(specs)))
                    # another factor of the same Partial type may be this very tensor
                    # (d * d: dispatch reduces it once; kept, the product and its gradient
                    # stay Partial), so only other types are reduced to keep this one
                    if cur[i] == pt and all(
                        a.is_replicate() or (a.is_partial() and a != pt) or (j in added and a == pt)
                        for j, a in enumerate(cur)
                        if j != i
                    ):
                        cands.append((req, pt))
                if added and any(cur[j] == pt for j in added):  # only an added input Partial:
                    # the product is made Partial locally (R -> P) through its first factor
                    first = next(iter(linear_in if linear_in is not None else range(len(specs))))
                    req = tuple(pt if j in added or j == first else _R for j in range(len(specs)))
                    if all(a.is_replicate() or a == pt for a in cur):
                        cands.append((req, pt))
        cands.extend(partial_patterns)
        sizes = [_local_bytes(s, mesh_shape, m) for s in specs]
        inner = [_inner_cost(s, mesh_shape, m) for s in specs]
        best, best_cost = 0, math.inf
        for j, (req, _o) in enumerate(cands):
            c = sum(
                reshard_cost(a, r, k, b) + (nest(a, r) if a != r else 0.0)
                for a, r, b, nest in zip(cur, req, sizes, inner)
            )
            if c < best_cost:  # strict: ties go to the earlier candidate
                best, best_cost = j, c
            if c == 0.0:
                break  # costs are never negative: nothing later can win
        if log is not None:  # dt.explain asks: Note [What a rule considered]
            log.append(_considered(m, k, specs, mesh_shape, cur, cands, sizes, inner, best))
        req, o = cands[best]
        for i, r in enumerate(req):
            per_in[i].append(r)
        per_out.append(o)
    return tuple(tuple(p) for p in per_in), tuple(per_out)


# Note [What a rule considered]
#     dt.explain says why an op's inputs moved: which placements the einsum core priced on each
#     mesh dim, at what price, and which it took. ``considered(rule, specs, mesh_shape,
#     **attrs)`` runs a rule again with a recorder on this thread; ``solve`` then appends a
#     Considered per mesh dim it decides (of more than one rank), every candidate priced as in
#     the decision (Note [Price of a reshard]) and split into the moves that make its price
#     (``price_moves``). Nothing else records: the recorder is None outside ``considered``,
#     and ``solve`` reads it once per call (rules run only when dispatch's decision cache
#     misses), so ordinary runs compute no alternatives. Read-only: the rule's result is the
#     same with the recorder on. Rules that decide a mesh dim without ``solve`` (shape ops,
#     a split softmax axis kept split) record nothing for it.
class _Recording(threading.local):
    log: list | None = None


_recording = _Recording()


@dataclass(frozen=True)
class Candidate:
    """One way ``solve`` priced running an op on one mesh dim: the placement each input must
    have there, the output's, the price (bytes, Note [Price of a reshard]: what ``solve``
    compares) and the moves it is priced as, ``(input, kind, wire bytes, mesh dim)``: kind
    ``all_gather``, ``all_reduce``, ``all_to_all`` (each also costs LATENCY) or ``local``
    (costs a byte); mesh dim is another mesh dim whose split of the same axis is gathered
    first (Note [Nested sharding] in spec.py), else None."""

    inputs: tuple[Placement, ...]
    output: Placement
    cost: float
    moves: tuple[tuple[int, str, float, int | None], ...]


@dataclass(frozen=True)
class Considered:
    """What ``solve`` weighed on mesh dim ``mesh_dim``: the inputs' placements there
    (``current``), every candidate in the order it tried them, and the index of the one it
    took (``chosen``: the cheapest, the first of equals)."""

    mesh_dim: int
    current: tuple[Placement, ...]
    candidates: tuple[Candidate, ...]
    chosen: int


def considered(rule: Rule, specs: Sequence[TensorSpec], mesh_shape: tuple[int, ...], **attrs):
    """``(rule's RuleResult, [Considered, ...])``: the rule run on ``specs`` with what the
    einsum core weighed on each mesh dim it decided (Note [What a rule considered]).

    >>> from disttensor.placement import Shard
    >>> x, w = TensorSpec((8, 4), [Shard(1)]), TensorSpec((4, 6), [Replicate()])
    >>> res, (dim0,) = considered(einsum("ij,jk->ik"), (x, w), (2,))
    >>> [(c.inputs, c.output, c.cost) for c in dim0.candidates][dim0.chosen]
    ((Shard(dim=1), Shard(dim=0)), Partial(reduce_type='sum'), 1.0)
    """
    previous = _recording.log
    log: list[Considered] = []
    _recording.log = log
    try:
        res = rule(tuple(specs), tuple(mesh_shape), **attrs)
    finally:
        _recording.log = previous
    return res, log


def price_moves(cur: Placement, req: Placement, k: int, nbytes: float, planner: bool = False):
    """The moves ``reshard_cost`` prices a 1-D move of ``nbytes`` as: ``[(kind, wire bytes)]``
    (kinds as in Candidate; a ``reduce_scatter`` for the planner). Each collective's LATENCY
    plus its bytes, and a byte for each local move, add up to ``reshard_cost``.

    >>> from disttensor.placement import Shard
    >>> price_moves(Shard(0), Partial(), 2, 64.0)
    [('all_gather', 32.0), ('local', 0.0)]
    """
    if cur == req:
        return []
    wire = nbytes * (k - 1) / k
    if req.is_replicate():
        return [("all_reduce", 2 * wire) if cur.is_partial() else ("all_gather", wire)]
    if req.is_shard():
        if cur.is_replicate():
            return [("local", 0.0)]
        if cur.is_shard():
            return [("all_to_all", wire / k)]
        return [("all_reduce", 2 * wire) if not planner else ("reduce_scatter", wire)]
    if cur.is_replicate():
        return [("local", 0.0)]
    first = ("all_reduce", 2 * wire) if cur.is_partial() else ("all_gather", wire)
    return [first, ("local", 0.0)]


def _nested_moves(spec: TensorSpec, mesh_shape: tuple[int, ...], m: int, cur, req) -> list:
    """The gathers ``_inner_cost`` prices: ``[(mesh dim, wire bytes)]``."""
    out = []
    for p in (cur, req):
        if isinstance(p, Shard):
            for j in range(m + 1, len(mesh_shape)):
                if spec.placements[j] == p:
                    whole = math.prod(spec.shape) * spec.itemsize
                    out.append((j, whole * (mesh_shape[j] - 1) / mesh_shape[j]))
    return out


def _considered(m, k, specs, mesh_shape, cur, cands, sizes, inner, best) -> Considered:
    """Every candidate of mesh dim ``m`` priced as ``solve`` prices it, with its moves."""
    priced = []
    for req, o in cands:
        cost = sum(
            reshard_cost(a, r, k, b) + (nest(a, r) if a != r else 0.0)
            for a, r, b, nest in zip(cur, req, sizes, inner)
        )
        moves: list[tuple[int, str, float, int | None]] = []
        for i, (a, r, b, s) in enumerate(zip(cur, req, sizes, specs)):
            if a == r:
                continue
            moves += [(i, "all_gather", w, j) for j, w in _nested_moves(s, mesh_shape, m, a, r)]
            moves += [(i, kind, w, None) for kind, w in price_moves(a, r, k, b)]
        priced.append(Candidate(tuple(req), o, cost, tuple(moves)))
    return Considered(m, tuple(cur), tuple(priced), best)


def parse_equation(equation: str, ndims: Sequence[int]) -> tuple[list[str], str]:
    """numpy einsum subscripts with '...' expanded to letters not used elsewhere."""
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    subs = lhs.split(",")
    if len(subs) != len(ndims):
        raise ValueError(f"einsum equation {equation!r} has {len(subs)} operands, got {len(ndims)}")
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    nell = max(
        (n - len(s.replace("...", "")) for s, n in zip(subs, ndims) if "..." in s), default=0
    )
    ell = "".join(free[:nell])
    out_subs = []
    for s, n in zip(subs, ndims):
        if "..." in s:
            k = n - len(s.replace("...", ""))
            s = s.replace("...", ell[nell - k :])
        if len(s) != n:
            raise ValueError(f"einsum operand {s!r} does not match an input with {n} axes")
        out_subs.append(s)
    if "->" not in eq:  # numpy's implicit output: letters used once, sorted, after the ellipsis
        counts: dict[str, int] = {}
        for s in out_subs:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        rhs = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        rhs = rhs.replace("...", ell)
    return out_subs, rhs


def einsum(equation: str, **options: Any) -> Rule:
    """A rule from a fixed equation (letters per axis), e.g. ``einsum("mk,kn->mn")``."""

    def rule(specs: Sequence[TensorSpec], mesh_shape: tuple[int, ...], **_: Any) -> RuleResult:
        subs, out = parse_equation(equation, [s.ndim for s in specs])
        return einsum_result(subs, out, specs, mesh_shape, **options)

    return rule


def einsum_result(subs, out, specs, mesh_shape, **options) -> RuleResult:
    sizes: dict[str, int] = {}
    for s, spec in zip(subs, specs):
        for c, n in zip(s, spec.shape):
            if sizes.setdefault(c, n) != n and 1 not in (sizes[c], n):
                raise ValueError(
                    f"axis {c!r} has length {sizes[c]} in one operand and {n} in another"
                )
            sizes[c] = max(sizes[c], n)
    # an axis of length 1 against a longer one broadcasts (as numpy allows for '...' axes):
    # it gets a letter of its own that is never split
    fresh = (c for c in "αβγδεζηθικλμνξοπρστυφχψω" if c not in "".join(subs) + out)
    broadcast = set()
    renamed = []
    for s, spec in zip(subs, specs):
        t = ""
        for c, n in zip(s, spec.shape):
            if n == 1 and sizes[c] > 1:
                c = next(fresh)
                broadcast.add(c)
            t += c
        renamed.append(t)
    subs = renamed
    options["unshardable"] = options.get("unshardable", frozenset()) | broadcast
    repeated = frozenset(c for s in subs for c in s if s.count(c) > 1)  # diagonals: never split
    options["unshardable"] = options.get("unshardable", frozenset()) | repeated
    ins, o = solve(subs, out, specs, mesh_shape, **options)
    return RuleResult(ins, (o,), (tuple(sizes.get(c, 1) for c in out),))
