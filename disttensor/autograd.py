"""Reverse-mode autograd: a tape of op records, ``backward``, ``no_grad`` and gradient hooks.

When an op runs with an input that requires a gradient, dispatch records one ``Node``: the
op's gradient function (``GRADIENTS``, filled by ops/gradients.py), its inputs, and a
``GradContext`` (arguments, attributes, the output). ``backward`` walks the nodes reachable
from the tensor, newest first, and calls the gradient functions under ``no_grad``. They are
written with dt ops, so the backward pass goes through the same rules and reshards as the
forward pass, and composites (var, softmax, the sharded layer norm, ...) need nothing new.

Note [Partial gradients]
    A gradient is a DistTensor whose *global* value is dL/dx, whatever placements it has:
    the tape never reshards. With a batch split over "dp" and replicated weights, the weight
    gradients come out Partial(sum) over "dp" with no communication, and ``.grad`` keeps them
    so; the optimizer (or a hook of the data-parallel machinery) reshards them to what the
    parameter needs. A Partial *input* has the gradient of its global value on every rank
    (d sum_i x_i / d x_i = 1), so gradients never need to be Partial "like" their input.

>>> import numpy as np, disttensor as dt
>>> x = dt.shard_tensor(np.array([1.0, 2.0, 3.0]), dt.ProcessMesh([0]), [dt.Shard(0)])
>>> x.requires_grad = True
>>> (x * x).sum().backward()
>>> x.grad.numpy()
array([2., 4., 6.])
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import backend, comm
from .backend import DEVICE_ARRAYS
from .comm.agree import doing
from .recording import on as _recording


class _State(threading.local):
    enabled = True  # per thread: simulated ranks each have their own switch
    callbacks: list | None = None  # queue_callback's list while a backward runs


_state = _State()


class _Memo(threading.local):
    """Reshards to reuse while ``table`` is a dict: dispatch's Note [One move per input];
    ``_run`` sets a new one around each gradient function (a gradient is often resharded
    the same way for several of its uses, e.g. both gradients of a matmul, and nothing
    changes it in place meanwhile)."""

    table: dict | None = None


_memo = _Memo()
_DistTensor: Any = None  # tensor.DistTensor once used (tensor.py imports this module)


def _tensor_type() -> Any:
    global _DistTensor
    if _DistTensor is None:
        from .tensor import DistTensor

        _DistTensor = DistTensor
    return _DistTensor


_seq = itertools.count(0, -1)  # creation order, counting down: Note [Cheap nodes]

# op name -> gradient function ``fn(ctx: GradContext, g) -> one gradient (or None) per argument``
GRADIENTS: dict[str, Callable[..., Sequence[Any]]] = {}
# ops whose outputs are constants for autograd (integer/bool results, or zero gradient almost
# everywhere); each listed with its reason in ops/gradients.py
NOT_DIFFERENTIABLE: set[str] = set()


# ops whose gradient reads only the shapes and specs of its arguments, not their values or the
# output's: a write into those tensors after the op does not change the gradient
SHAPE_ONLY: set[str] = set()


# Note [What a node keeps]
# A node holds what its gradient reads and nothing more, so an activation that no gradient
# needs is freed as soon as the forward pass lets go of it (on a GPU, a transformer's
# attention scores: batch x heads x time^2). Each gradient says what it reads (``reads``):
# * "all" (the default): the arguments and the output;
# * "inputs": the arguments (and ``ctx.extra``), not the output: the node keeps no output
#   (matmul, linear, layer norm, gelu, ...);
# * "output": the output (and the arguments' shapes, dtypes and layouts), not the arguments'
#   values (softmax, attention scores, tanh, sigmoid, relu, exp, ...): the node keeps for
#   each argument only a ``Shape`` of it, and for each input that is itself the result of a
#   recorded op only an ``Edge`` (its producer and spec), so the input's data is not held;
# * no values at all (``reads_values=False``: add, reshape, transpose, sum, ...): Shapes and
#   Edges as for "output", and no output ("shapes").
# An Edge also fixes the producer at record time: a later in-place write into the input
# (which gives it a new producer) does not redirect this node's gradient.
READS: dict[str, str] = {}  # op name -> "inputs", "output" or "shapes" ("all" where absent)


def gradient(*names: str, reads_values: bool = True, reads: str = "all"):
    """Decorator: register the gradient function of the ops ``names``; ``reads_values=False``
    when it uses no argument's or output's values (Note [Mutation and autograd]); ``reads``:
    "all", "inputs" or "output", what it reads (Note [What a node keeps])."""
    if reads not in ("all", "inputs", "output"):
        raise ValueError(f"gradient: reads must be 'all', 'inputs' or 'output', got {reads!r}")

    def deco(fn):
        for name in names:
            if name in GRADIENTS:
                raise ValueError(f"a gradient for {name!r} is already registered")
            GRADIENTS[name] = fn
            if not reads_values:
                SHAPE_ONLY.add(name)
                READS[name] = "shapes"
            elif reads != "all":
                READS[name] = reads
        return fn

    return deco


class Shape:
    """What a node that reads its output keeps of an argument (Note [What a node keeps]):
    its shape, dtype, number of axes and spec; a DistTensor's mesh and placements."""

    __slots__ = ("_spec", "dtype", "ndim", "shape")

    def __init__(self, a: Any) -> None:
        self._spec = getattr(a, "_spec", None)
        self.shape = tuple(a.shape)
        self.dtype = a.dtype
        self.ndim = len(self.shape)

    @property
    def mesh(self) -> Any:
        return self._spec.mesh

    @property
    def placements(self) -> Any:
        return self._spec.placements


class Edge:
    """What a node that reads its output keeps of an input made by a recorded op: the producer
    (``_node``) and the spec, which is all backward needs of it (Note [What a node keeps])."""

    __slots__ = ("_node", "_spec")
    requires_grad = True

    def __init__(self, t: Any) -> None:
        self._node, self._spec = t._node, t._spec

    @property
    def shape(self) -> tuple[int, ...]:
        return self._spec.shape

    @property
    def dtype(self) -> Any:
        return self._spec.dtype


def _light(args: tuple, inputs: tuple) -> tuple[tuple, tuple]:
    """(args, inputs) as an output-reading node keeps them: scalars and attributes as they
    are, arrays and tensors as Shapes, inputs made by recorded ops as Edges (leaves stay:
    backward stores their gradient)."""
    DistTensor = _tensor_type()
    arrays = backend.ARRAYS
    light = tuple(Shape(a) if isinstance(a, DistTensor) or type(a) in arrays else a for a in args)
    return light, tuple(t if t is None or t._node is None else Edge(t) for t in inputs)


# Writes into local arrays (Note [Mutation and autograd] in ops/mutation.py): the root buffer
# of each written array -> [a weak reference to it, the _seq number of its latest write] (a
# list: a later write of the buffer stores its number in place). Seq numbers count down, so a
# write after a node was recorded has a smaller number than the node.
_mutations: dict[int, list] = {}
_last_mutation = [1]  # the smallest (latest) write number; 1: no write yet (seqs are <= 0)


def _root(a: Any) -> Any:
    while isinstance(a.base, np.ndarray) or type(a.base) in DEVICE_ARRAYS:
        a = a.base
    return a


def note_mutation(local: np.ndarray) -> None:
    """``local`` (a DistTensor's local array) was just written in place."""
    rec = _recording.rec
    if rec is not None and not rec.depth:  # dt.compile records: a write it replays?
        rec.wrote(local)
    seq = next(_seq)
    root = local if local.base is None else _root(local)  # most: an array of its own
    i = id(root)
    hit = _mutations.get(i)
    if hit is not None and hit[0]() is root:
        hit[1] = seq
    else:
        _mutations[i] = [weakref.ref(root, lambda _, i=i: _mutations.pop(i, None)), seq]
    _last_mutation[0] = seq


def version(a: Any) -> int:
    """The write counter of array ``a``'s memory: the number of its latest in-place write
    (``note_mutation``), 1 if it was never written; any write changes it."""
    if _last_mutation[0] == 1 or (not isinstance(a, np.ndarray) and type(a) not in DEVICE_ARRAYS):
        return 1  # nothing was ever written, or not an array
    root = _root(a)
    hit = _mutations.get(id(root))
    return hit[1] if hit is not None and hit[0]() is root else 1


def _written_after(a: Any, seq: int) -> bool:
    """Whether the array ``a`` (or memory it views) was written after record number ``seq``."""
    if not isinstance(a, np.ndarray) and type(a) not in DEVICE_ARRAYS:
        return False
    root = _root(a)
    hit = _mutations.get(id(root))
    return hit is not None and hit[0]() is root and hit[1] < seq


def _check_saved(nodes) -> None:
    """Refuse a backward through nodes whose saved tensors were written since they were saved
    (PyTorch's version-counter error)."""
    DistTensor = _tensor_type()
    for node in nodes:
        if node.name in SHAPE_ONLY:
            continue
        arrays = []
        for a in node.args or ():
            if isinstance(a, DistTensor):
                arrays.append(a._local)
            elif isinstance(a, (list, tuple)):
                arrays.extend(b._local for b in a if isinstance(b, DistTensor))
        saved = node.saved
        arrays.extend(saved if isinstance(saved, tuple) else (saved,))
        if any(_written_after(a, node.seq) for a in arrays):
            raise RuntimeError(
                f"backward: a tensor that the gradient of {node.name} needs was written in place "
                "after the op used it (x += ..., x[...] = ..., out=, or an optimizer step); "
                "write into a copy (x = x + ...), or run backward before the write"
            )


def is_grad_enabled() -> bool:
    """Whether ops are being recorded for backward on this thread."""
    return _state.enabled


class _GradMode:
    mode = True

    def __enter__(self) -> None:
        self._prev = _state.enabled
        _state.enabled = self.mode

    def __exit__(self, *exc: Any) -> None:
        _state.enabled = self._prev

    def __call__(self, fn):
        """Use as a decorator too."""

        def wrapped(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)

        wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
        return wrapped


class no_grad(_GradMode):
    """``with dt.no_grad(): ...`` runs ops without recording them (no gradients flow)."""

    mode = False


class enable_grad(_GradMode):
    """``with dt.enable_grad(): ...`` records again inside a ``no_grad`` block."""

    mode = True


class GradContext:
    """What a gradient function sees: the op's arguments (DistTensors, arrays, scalars, in
    call order), its attributes, its output (a tuple for multi-output ops, detached), which
    arguments need a gradient, and ``extra``: what a saving kernel kept for it (Note [Saved
    for backward] in dispatch.py; None for other ops, and on ranks outside the mesh)."""

    __slots__ = ("args", "attrs", "extra", "inputs", "multi", "out_specs", "saved")

    def __init__(
        self,
        args: tuple,
        attrs: dict,
        inputs: tuple,
        out_specs: tuple,
        saved: Any,
        multi: bool,
        extra: Any = None,
    ) -> None:
        self.args, self.attrs, self.inputs = args, attrs, inputs
        self.out_specs, self.saved, self.multi, self.extra = out_specs, saved, multi, extra

    @property
    def needs(self) -> tuple[bool, ...]:
        """Per argument: whether it needs a gradient."""
        ins = self.inputs
        if len(ins) == 2:  # most ops: no comprehension frame
            return (ins[0] is not None, ins[1] is not None)
        return tuple([t is not None for t in ins])

    @property
    def out(self) -> Any:
        """The output (detached: a new DistTensor on the saved shard, so no reference cycle)."""
        if self.saved is None:
            raise RuntimeError(
                f"internal error: the gradient of {getattr(self, 'name', 'an op')} reads its "
                "output, which it declared it does not (Note [What a node keeps])"
            )
        make = _tensor_type()
        if self.multi:
            return tuple(make(a, s) for a, s in zip(self.saved, self.out_specs))
        return make(self.saved, self.out_specs[0])


# Note [Cheap nodes]
# Recording runs on every op of a training step, so a Node is one object: it is its own
# GradContext (arguments, attributes, inputs, the outputs' shards and specs), and backward
# calls ``node.fn(node, g)``: no closure, no separate context, and no detached copy of the
# output (``ctx.out`` wraps the saved shard when a gradient asks for it). The inputs hold
# exactly what ``needs`` reports (None where no gradient is needed). ``seq`` counts down, so
# the newest node has the smallest key and heapq pops it first without calling Python code.
class Node(GradContext):
    """One recorded op: its gradient function, the tensors it read, and its outputs' specs."""

    __slots__ = ("fn", "hooks", "name", "seq")

    def __init__(
        self,
        name: str,
        fn,
        inputs: tuple,
        out_specs: tuple,
        args: tuple = (),
        attrs: dict | None = None,
        saved: Any = None,
        multi: bool = True,
        extra: Any = None,
    ) -> None:
        self.name = name
        self.fn = fn  # fn(node, grads) -> one gradient per input (grads: a tuple when multi);
        # None: the op has no gradient; _FREED: freed by an earlier backward
        self.inputs = inputs  # per argument: the DistTensor if it requires a gradient, else None
        self.out_specs = out_specs
        self.args, self.attrs, self.saved, self.multi = args, attrs, saved, multi
        self.extra = extra
        self.hooks: dict[int, list] | None = None  # output index -> tensor hooks
        self.seq = next(_seq)

    def __repr__(self) -> str:
        return f"<{self.name} backward>"


def record(name: str, inputs: Sequence[Any], outputs: Sequence[Any], backward) -> None:
    """Attach a node to ``outputs`` (DistTensors): ``backward(grads) -> input gradients``."""
    ins = tuple(t if getattr(t, "requires_grad", False) else None for t in inputs)
    fn = None if backward is None else lambda node, grads: backward(grads)
    node = Node(name, fn, ins, tuple(o._spec for o in outputs))
    for i, o in enumerate(outputs):
        o._node = (node, i)
        o.requires_grad = True


def record_op(
    name: str,
    args: tuple,
    attrs: dict,
    out: Any,
    saved_args: tuple | None = None,
    inputs: tuple | None = None,
    extra: Any = None,
) -> None:
    """Record a dispatched op (called by dispatch when an input requires a gradient).
    ``saved_args`` are what the gradient sees (``args`` by default): the same values,
    possibly in the layouts the forward pass resharded them to. ``inputs``: per argument the
    tensor if it requires a gradient, else None (worked out from ``args`` when not given).
    ``extra``: what a saving kernel kept for the gradient (Note [Saved for backward])."""
    if name in NOT_DIFFERENTIABLE:
        return
    if inputs is None:
        inputs = tuple(a if getattr(a, "requires_grad", False) else None for a in args)
    if saved_args is None:
        saved_args = args
    fn = GRADIENTS.get(name)  # None: backward refuses before computing anything (see _run)
    if type(out) is tuple:
        if READS.get(name) in ("output", "shapes"):  # Note [What a node keeps]
            saved_args, inputs = _light(saved_args, inputs)
        if any(o._spec.dtype.kind not in "fc" for o in out):  # integer/bool results: constants
            return
        specs = tuple(o._spec for o in out)
        node = Node(
            name, fn, inputs, specs, saved_args, attrs, tuple(o._local for o in out), True, extra
        )
        for i, o in enumerate(out):
            o._node = (node, i)
            o.requires_grad = True
        return
    if out._spec.dtype.kind in "fc":  # integer/bool results are constants
        record_one(name, fn, inputs, saved_args, attrs, out, (out._spec,), extra)


def record_one(
    name: str,
    fn,
    inputs: tuple,
    args: tuple,
    attrs: dict,
    out: Any,
    out_specs: tuple,
    extra: Any = None,
) -> None:
    """The node of a single-output op with a float result (the caller checked; ``fn`` from
    GRADIENTS, None if the op has none, and no op of NOT_DIFFERENTIABLE; ``out_specs`` is
    ``(out._spec,)``). It builds ``Node(name, fn, inputs, out_specs, args, attrs, out._local,
    False, extra)`` without calling the class: this runs once per recorded op (Note [Cheap
    nodes])."""
    node = _new_node(Node)
    node.name = name
    node.fn = fn
    node.out_specs = out_specs
    node.attrs = attrs
    reads = READS.get(name)  # Note [What a node keeps]
    if reads is None:
        node.inputs, node.args, node.saved = inputs, args, out._local
    elif reads == "inputs":
        node.inputs, node.args, node.saved = inputs, args, None
    else:  # "output" or "shapes"
        node.args, node.inputs = _light(args, inputs)
        node.saved = out._local if reads == "output" else None
    node.multi = False
    node.extra = extra
    node.hooks = None
    node.seq = next(_seq)
    out._node = (node, 0)
    out.requires_grad = True


_new_node = object.__new__


def backward(tensor: Any, grad: Any = None, retain_graph: bool = False) -> None:
    """Accumulate d tensor / d leaf into ``leaf.grad`` for every leaf that requires a gradient.

    ``grad`` (the gradient of ``tensor``) may be left out for a one-element tensor (it is 1).
    The graph is freed afterwards unless ``retain_graph``; a second backward through a freed
    graph raises. Collective: every rank of the mesh must call it, as for any op.
    """
    if not tensor.requires_grad:
        raise RuntimeError(
            "backward: this tensor does not require a gradient (no input of the ops that made "
            "it had requires_grad=True, or they ran under dt.no_grad())"
        )
    spec = tensor._spec
    if grad is None:
        if spec.shape and math.prod(spec.shape) != 1:
            raise RuntimeError(
                f"backward: a tensor of shape {spec.shape} needs an explicit gradient "
                "(grad=...); only one-element tensors default to 1"
            )
        # the seed: ones where the tensor has its shard (its local shape is the one of its
        # spec with Partials read as Replicate, also off the mesh)
        shape = tensor._local.shape
        xp = np if type(tensor._local) is np.ndarray else backend.xp(tensor._local)
        one = xp.array(1, spec.dtype) if not shape else xp.ones(shape, spec.dtype)
        grad = _tensor_type()(one, spec.without_partials())
    else:
        if not isinstance(grad, _tensor_type()):
            from .placement import Replicate
            from .tensor import shard_tensor

            rep = [Replicate()] * tensor.mesh.ndim
            if not backend.is_device(grad):
                grad = np.asarray(grad, tensor.dtype)
            grad = shard_tensor(grad, tensor.mesh, rep, dtype=tensor.dtype)
        if grad.shape != spec.shape:
            raise ValueError(
                f"backward: grad has shape {grad.shape} but the tensor has shape {spec.shape}"
            )
    state = _state
    enabled = state.enabled
    state.enabled = False  # what ``with no_grad()`` does, without its object
    state.callbacks = []
    try:
        with _BACKWARD:  # named if the ranks diverge
            _run(tensor, grad, retain_graph)
        callbacks = state.callbacks
        state.callbacks = None
        for fn in callbacks:
            fn()
    finally:
        state.callbacks = None
        state.enabled = enabled


_BACKWARD = doing("backward")  # made once: entering it only pushes its fixed item


def queue_callback(fn: Callable[[], None]) -> None:
    """Run ``fn()`` once, when the backward pass now running on this thread has finished
    (after every leaf's ``.grad`` and post-accumulate hook); outside a backward, at once.
    The data-parallel machinery starts its last reductions here."""
    if _state.callbacks is None:
        fn()
    else:
        _state.callbacks.append(fn)


# Note [Gradient finishers]
# Data parallelism may leave a parameter's ``.grad`` in flight: its reduction has started but
# not finished, and ``.grad`` still holds the (correct, Partial) unreduced value. Whoever is
# about to *use* gradients (an optimizer's step) calls ``finish_grads(params)`` first, which
# runs each distinct finisher registered for those parameters once; whoever drops them
# (``zero_grad``) calls ``finish_grads(params, drop=True)``, so the finisher can forget what
# it accumulated without communicating. A finisher is held weakly: a dropped wrapper stops.
class ParamMethods:
    """Per parameter, the bound method of the object that serves it (a DataParallel's
    finisher, a sharded optimizer's gather), both held weakly: an entry goes when either
    is dropped. Keyed by id, checked against the parameter itself."""

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def set(self, param: Any, method: Any) -> None:
        """``method`` serves ``param`` from now on (None: nothing does)."""
        if method is None:
            self._by_id.pop(id(param), None)
        else:
            self._by_id[id(param)] = (weakref.ref(param), weakref.WeakMethod(method))

    def get(self, param: Any) -> Any:
        """The live bound method serving ``param``, or None."""
        hit = self._by_id.get(id(param))
        if hit is None or hit[0]() is not param:
            return None
        fn = hit[1]()
        if fn is None:
            del self._by_id[id(param)]
        return fn

    def by_owner(self, params: Sequence[Any]) -> dict[int, tuple[Any, list]]:
        """id(owner) -> (its method, the ones of ``params`` it serves), in the order of
        ``params`` (each owner once)."""
        out: dict[int, tuple[Any, list]] = {}
        for p in params:
            fn = self.get(p)
            if fn is not None:
                out.setdefault(id(fn.__self__), (fn, []))[1].append(p)
        return out


_finishers = ParamMethods()  # Note [Gradient finishers]


def set_grad_finisher(param: Any, method: Any) -> None:
    """Register the bound method ``method(drop: bool)`` that finishes the gradient of
    ``param`` before it is used (Note [Gradient finishers]); None removes it."""
    _finishers.set(param, method)


def finish_grads(params: Sequence[Any], drop: bool = False) -> None:
    """Run the finishers of ``params`` (each distinct one once, in the order of ``params``);
    ``drop``: the gradients are about to be dropped."""
    if not _finishers:
        return
    for fn, _ in _finishers.by_owner(params).values():
        fn(drop)


def _run(root, grad, retain_graph: bool) -> None:
    if root._node is None:  # a leaf: its own gradient
        _finish_leaf(root, grad)
        return
    handed = {id(grad)}  # gradient objects stored as some .grad (or the caller's own)
    # consumers per node and per leaf (by id), over the part of the graph reachable from root
    pending: dict[Any, int] = {}
    first = root._node[0]
    stack, seen = [first], {first}
    oldest = first.seq
    while stack:  # every refusal comes before any gradient is computed or stored
        node = stack.pop()
        fn = node.fn
        if fn is _FREED or fn is None:
            _refuse(node)
        if node.seq > oldest:
            oldest = node.seq
        for t in node.inputs:
            if t is None:
                continue
            tn = t._node
            if tn is None:
                key = id(t)
            else:
                key = tn[0]
                if key not in seen:
                    seen.add(key)
                    stack.append(key)
            pending[key] = pending.get(key, 0) + 1
    if _last_mutation[0] < oldest:  # something was written since the oldest node was recorded
        _check_saved(seen)
    # node -> its output's gradient so far; for a multi-output node a list, None where none
    # arrived yet (most nodes have one output: no list to make and index)
    grads: dict[Any, Any] = {}
    if first.multi:
        grads[first] = [None] * len(first.out_specs)
        grads[first][root._node[1]] = grad
    else:
        grads[first] = grad
    leaf_grads: dict[int, Any] = {}
    ready = [(first.seq, first)]  # Note [Cheap nodes]: newest first
    memo = _memo
    prev = memo.table
    table: dict = {}  # reshards reused within one gradient function (emptied per node)
    pop, push = heapq.heappop, heapq.heappush
    try:
        while ready:
            node = pop(ready)[1]
            outs = grads.pop(node, None)
            inputs = node.inputs
            if outs is None:  # no gradient reached this node
                in_grads: Sequence[Any] = (None,) * len(inputs)
            else:
                if node.multi:
                    if node.hooks:
                        for i, g in enumerate(outs):
                            if g is not None and i in node.hooks:
                                outs[i] = _call_hooks(node.hooks[i], g)
                    like = next((g._local for g in outs if g is not None), None)  # its backend
                    outs = tuple(
                        g if g is not None else _filled(spec, 0, like)
                        for g, spec in zip(outs, node.out_specs)
                    )
                elif node.hooks and 0 in node.hooks:
                    outs = _call_hooks(node.hooks[0], outs)
                if table:
                    table.clear()
                memo.table = table  # only while the gradient function runs (not for hooks)
                in_grads = node.fn(node, outs)
                memo.table = prev
            if not retain_graph:  # free what the node holds: saved tensors and its inputs
                node.fn, node.inputs = _FREED, (None,) * len(inputs)
                node.args = node.attrs = node.saved = node.extra = None
            # last argument first: the reverse of the use, also inside one op (a linear's
            # bias gradient is final before its weight's: Note [Gradient buckets])
            k = len(inputs)
            while k:
                k -= 1
                t = inputs[k]
                if t is None:
                    continue
                g = in_grads[k]
                if g is not None:
                    gs, ts = g._spec, t._spec
                    if gs is not ts and (gs.shape != ts.shape or gs.dtype != ts.dtype):
                        g = _checked(g, t, node)
                tn = t._node
                if tn is None:
                    key = id(t)
                    left = pending[key] - 1
                    pending[key] = left
                    if key in leaf_grads:  # an earlier consumer's gradient
                        acc = leaf_grads.pop(key)
                        g = acc if g is None else acc + g
                    if left:
                        if g is not None:
                            leaf_grads[key] = g
                    elif g is not None:
                        if t._hooks is None and t._grad is None and id(g) not in handed:
                            t._grad = g  # _finish_leaf's common case, spelled out
                            handed.add(id(g))
                        else:
                            _finish_leaf(t, g, handed)
                else:
                    parent, i = tn
                    if g is not None:
                        acc = grads.get(parent)
                        if not parent.multi:
                            grads[parent] = g if acc is None else acc + g
                        else:
                            if acc is None:
                                acc = grads[parent] = [None] * len(parent.out_specs)
                            acc[i] = g if acc[i] is None else acc[i] + g
                    left = pending[parent] - 1
                    if left:
                        pending[parent] = left
                    else:
                        push(ready, (parent.seq, parent))
    finally:
        memo.table = prev


def _refuse(node) -> None:
    """Raise for a node backward cannot pass: freed by an earlier backward, or no gradient."""
    if node.fn is _FREED:
        raise RuntimeError(
            f"backward through the graph a second time ({node!r} was freed); pass "
            "retain_graph=True to the first backward"
        )
    raise NotImplementedError(
        f"{node.name} has no gradient in disttensor; compute it under dt.no_grad() "
        "or on a detached input (x.detach()), or write it with differentiable dt ops"
    )


def _FREED(node, grads):  # a marker: the node's backward ran and its graph was released
    raise AssertionError("unreachable: freed nodes are refused before backward runs")


def _checked(g, t, node):
    """The gradient in the input's float dtype; a wrong shape is an internal error."""
    if g.shape != t.shape:
        raise RuntimeError(
            f"internal error in the gradient of {node.name}: got shape {g.shape} for an input "
            f"of shape {t.shape}"
        )
    if g.dtype != t.dtype and t.dtype.kind in "fc":  # a local cast: Partials stay Partial
        g = type(g)(g._local.astype(t.dtype), g._spec.replace(dtype=t.dtype))
    return g


def _filled(spec, value, like: Any = None):
    """A tensor of ``spec``'s shape and dtype filled with ``value`` (Partials as Replicate),
    on the backend of array ``like`` (numpy without one); only the local shard is made, as
    ``dt.full`` would."""
    plain = spec.without_partials()
    coord = plain.mesh.get_coord(comm.get_rank())
    xp = np if like is None or type(like) is np.ndarray else backend.xp(like)
    if coord is None:
        return _tensor_type()(xp.empty(plain.local_shape(None), plain.dtype), plain)
    return _tensor_type()(xp.full(plain.local_shape(coord), value, plain.dtype), plain)


class _LeafHooks:
    """A leaf's hooks: ``pre`` see (and may replace) the gradient before it is added to
    ``.grad``; ``post`` run after, with the leaf."""

    __slots__ = ("post", "pre")

    def __init__(self) -> None:
        self.pre: list = []
        self.post: list = []


def _hooks(t) -> _LeafHooks:
    """The leaf's hooks, made at the first registration (the slot is None until then)."""
    hooks = t._hooks
    if hooks is None:
        hooks = t._hooks = _LeafHooks()
    return hooks


def _call_hooks(hooks: list, g):
    for hook in hooks:
        out = hook(g)
        if out is not None:
            g = out
    return g


def _finish_leaf(t, g, handed: set | None = None) -> None:
    """The leaf's gradient of this backward is final: hooks, then accumulate into ``.grad``.
    A gradient object already stored elsewhere (``x + y`` gives both the same one; the
    caller's own ``grad``) is copied, so no two ``.grad`` share memory."""
    hooks = t._hooks
    if hooks is not None and hooks.pre:
        g = _call_hooks(list(hooks.pre), g)
    if t._grad is not None:  # _grad: backward's own gradients need no assignment checks
        t._grad = t._grad + g
    else:
        if handed is None or id(g) in handed:
            g = type(g)(g._local.copy(), g._spec)
        t._grad = g
    if handed is not None:
        handed.add(id(t._grad))
    if hooks is not None:
        for h in list(hooks.post):  # a copy: a hook may remove itself
            h(t)


def register_hook(t, fn: Callable) -> Callable[[], None]:
    """Call ``fn(grad)`` when the gradient of ``t`` in a backward is final (before a leaf's
    ``.grad`` is updated); a non-None return replaces the gradient. Returns a remover."""
    if not t.requires_grad:
        raise RuntimeError("register_hook: the tensor does not require a gradient")
    if t._node is not None:
        node, i = t._node
        if node.hooks is None:
            node.hooks = {}
        lst = node.hooks.setdefault(i, [])
    else:
        lst = _hooks(t).pre
    lst.append(fn)
    return lambda: lst.remove(fn) if fn in lst else None


def register_post_accumulate_grad_hook(t, fn: Callable) -> Callable[[], None]:
    """Leaves only: call ``fn(t)`` after a backward has added this pass's gradient to
    ``t.grad`` ("this gradient is final": the data-parallel machinery starts reductions
    here). Returns a remover."""
    if t._node is not None:
        raise RuntimeError("register_post_accumulate_grad_hook: only leaf tensors have a .grad")

    lst = _hooks(t).post
    lst.append(fn)
    return lambda: lst.remove(fn) if fn in lst else None
