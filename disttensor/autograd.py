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
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class _State(threading.local):
    enabled = True  # per thread: simulated ranks each have their own switch
    callbacks: list | None = None  # queue_callback's list while a backward runs


_state = _State()
_seq = itertools.count()  # creation order: backward runs the newest node first

# op name -> gradient function ``fn(ctx: GradContext, g) -> one gradient (or None) per argument``
GRADIENTS: dict[str, Callable[..., Sequence[Any]]] = {}
# ops whose outputs are constants for autograd (integer/bool results, or zero gradient almost
# everywhere); each listed with its reason in ops/gradients.py
NOT_DIFFERENTIABLE: set[str] = set()


def gradient(*names: str):
    """Decorator: register the gradient function of the ops ``names``."""

    def deco(fn):
        for name in names:
            if name in GRADIENTS:
                raise ValueError(f"a gradient for {name!r} is already registered")
            GRADIENTS[name] = fn
        return fn

    return deco


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
    call order), its attributes, its output (a tuple for multi-output ops, detached), and
    which arguments need a gradient."""

    __slots__ = ("args", "attrs", "needs", "out")

    def __init__(self, args: tuple, attrs: dict, out: Any, needs: tuple[bool, ...]) -> None:
        self.args, self.attrs, self.out, self.needs = args, attrs, out, needs


class Node:
    """One recorded op: its gradient function, the tensors it read, and its outputs' specs."""

    __slots__ = ("backward", "hooks", "inputs", "name", "out_specs", "seq")

    def __init__(self, name: str, backward, inputs: tuple, out_specs: tuple) -> None:
        self.name = name
        self.backward = backward  # grads of the outputs (tuple) -> one gradient per input;
        # None: the op has no gradient; _FREED: freed by an earlier backward
        self.inputs = inputs  # per input: the DistTensor if it requires a gradient, else None
        self.out_specs = out_specs
        self.hooks: dict[int, list] | None = None  # output index -> tensor hooks
        self.seq = next(_seq)

    def __lt__(self, other: Node) -> bool:  # heap order: newest first
        return self.seq > other.seq

    def __repr__(self) -> str:
        return f"<{self.name} backward>"


def _detached(t):
    return type(t)(t._local, t._spec)


def record(name: str, inputs: Sequence[Any], outputs: Sequence[Any], backward) -> None:
    """Attach a node to ``outputs`` (DistTensors): ``backward(grads) -> input gradients``."""
    ins = tuple(t if getattr(t, "requires_grad", False) else None for t in inputs)
    node = Node(name, backward, ins, tuple(o._spec for o in outputs))
    for i, o in enumerate(outputs):
        o._node = (node, i)
        o.requires_grad = True


def record_op(
    name: str, args: tuple, attrs: dict, out: Any, saved_args: tuple | None = None
) -> None:
    """Record a dispatched op (called by dispatch when an input requires a gradient).
    ``saved_args`` are what the gradient sees (``args`` by default): the same values,
    possibly in the layouts the forward pass resharded them to."""
    if name in NOT_DIFFERENTIABLE:
        return
    fn = GRADIENTS.get(name)
    outs = out if isinstance(out, tuple) else (out,)
    if any(o._spec.dtype.kind not in "fc" for o in outs):  # integer/bool results: constants
        return
    needs = tuple(bool(getattr(a, "requires_grad", False)) for a in args)
    multi = isinstance(out, tuple)
    saved = tuple(_detached(o) for o in outs) if multi else _detached(out)
    ctx = GradContext(args if saved_args is None else saved_args, attrs, saved, needs)
    if fn is None:  # backward refuses before computing anything (see _run)
        record(name, args, outs, None)
        return

    def backward(grads: tuple) -> Sequence[Any]:  # refers to nothing of the outputs: no cycle
        return fn(ctx, grads if multi else grads[0])

    record(name, args, outs, backward)


def backward(tensor: Any, grad: Any = None, retain_graph: bool = False) -> None:
    """Accumulate d tensor / d leaf into ``leaf.grad`` for every leaf that requires a gradient.

    ``grad`` (the gradient of ``tensor``) may be left out for a one-element tensor (it is 1).
    The graph is freed afterwards unless ``retain_graph``; a second backward through a freed
    graph raises. Collective: every rank of the mesh must call it, as for any op.
    """
    from .tensor import DistTensor

    if not tensor.requires_grad:
        raise RuntimeError(
            "backward: this tensor does not require a gradient (no input of the ops that made "
            "it had requires_grad=True, or they ran under dt.no_grad())"
        )
    if grad is None:
        if tensor.size != 1:
            raise RuntimeError(
                f"backward: a tensor of shape {tensor.shape} needs an explicit gradient "
                "(grad=...); only one-element tensors default to 1"
            )
        grad = _filled(tensor._spec, 1)
    elif not isinstance(grad, DistTensor):
        from .placement import Replicate
        from .tensor import shard_tensor

        rep = [Replicate()] * tensor.mesh.ndim
        grad = shard_tensor(np.asarray(grad, tensor.dtype), tensor.mesh, rep)
    if grad.shape != tensor.shape:
        raise ValueError(
            f"backward: grad has shape {grad.shape} but the tensor has shape {tensor.shape}"
        )
    with no_grad():
        _state.callbacks = []
        try:
            _run(tensor, grad, retain_graph)
            callbacks = _state.callbacks
            _state.callbacks = None
            for fn in callbacks:
                fn()
        finally:
            _state.callbacks = None


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
_finishers: dict[int, tuple[Any, Any]] = {}  # id(param) -> (weakref to param, WeakMethod)


def set_grad_finisher(param: Any, method: Any) -> None:
    """Register the bound method ``method(drop: bool)`` that finishes the gradient of
    ``param`` before it is used (Note [Gradient finishers]); None removes it."""
    if method is None:
        _finishers.pop(id(param), None)
    else:
        _finishers[id(param)] = (weakref.ref(param), weakref.WeakMethod(method))


def finish_grads(params: Sequence[Any], drop: bool = False) -> None:
    """Run the finishers of ``params`` (each distinct one once, in the order of ``params``);
    ``drop``: the gradients are about to be dropped."""
    if not _finishers:
        return
    done: set[int] = set()
    for p in params:
        hit = _finishers.get(id(p))
        if hit is None or hit[0]() is not p:
            continue
        fn = hit[1]()
        if fn is None:
            del _finishers[id(p)]
        elif id(fn.__self__) not in done:
            done.add(id(fn.__self__))
            fn(drop)


def _add(a, b):
    return b if a is None else a + b


def _run(root, grad, retain_graph: bool) -> None:
    from .dispatch import memoized_reshards

    if root._node is None:  # a leaf: its own gradient
        _finish_leaf(root, grad)
        return
    handed = {id(grad)}  # gradient objects stored as some .grad (or the caller's own)
    # consumers per node output and per leaf, over the part of the graph reachable from root
    pending: dict[Any, int] = {}
    leaves: dict[int, Any] = {}
    stack, seen = [root._node[0]], {id(root._node[0])}
    while stack:  # every refusal comes before any gradient is computed or stored
        node = stack.pop()
        if node.backward is _FREED:
            raise RuntimeError(
                f"backward through the graph a second time ({node!r} was freed); pass "
                "retain_graph=True to the first backward"
            )
        if node.backward is None:
            raise NotImplementedError(
                f"{node.name} has no gradient in disttensor; compute it under dt.no_grad() "
                "or on a detached input (x.detach()), or write it with differentiable dt ops"
            )
        for t in node.inputs:
            if t is None:
                continue
            key = t._node[0] if t._node is not None else id(t)
            pending[key] = pending.get(key, 0) + 1
            if t._node is None:
                leaves[id(t)] = t
            elif id(t._node[0]) not in seen:
                seen.add(id(t._node[0]))
                stack.append(t._node[0])
    grads: dict[tuple, Any] = {(id(root._node[0]), root._node[1]): grad}
    leaf_grads: dict[int, Any] = {}
    ready = [root._node[0]]
    while ready:
        node = heapq.heappop(ready)
        outs = []
        for i in range(len(node.out_specs)):
            g = grads.pop((id(node), i), None)
            if g is not None and node.hooks and i in node.hooks:
                g = _call_hooks(node.hooks[i], g)
            outs.append(g)
        if any(g is not None for g in outs):
            outs = [
                g if g is not None else _filled(spec, 0) for g, spec in zip(outs, node.out_specs)
            ]
            with memoized_reshards():
                in_grads = node.backward(tuple(outs))
        else:
            in_grads = (None,) * len(node.inputs)
        inputs = node.inputs
        if not retain_graph:  # free what the node holds: saved tensors and its inputs
            node.backward, node.inputs = _FREED, (None,) * len(inputs)
        for t, g in zip(inputs, in_grads):
            if t is None:
                continue
            if g is not None:
                g = _checked(g, t, node)
            if t._node is None:
                if g is not None:
                    leaf_grads[id(t)] = _add(leaf_grads.get(id(t)), g)
                pending[id(t)] -= 1
                if pending[id(t)] == 0 and leaf_grads.get(id(t)) is not None:
                    _finish_leaf(t, leaf_grads.pop(id(t)), handed)
            else:
                parent, i = t._node
                if g is not None:
                    grads[(id(parent), i)] = _add(grads.get((id(parent), i)), g)
                pending[parent] -= 1
                if pending[parent] == 0:
                    heapq.heappush(ready, parent)


def _FREED(grads):  # a marker: the node's backward ran and its graph was released
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


def _filled(spec, value):
    """A tensor of ``spec``'s shape and dtype filled with ``value`` (Partials as Replicate)."""
    from .creation import full

    plain = spec.without_partials()
    return full(plain.shape, value, plain.dtype, mesh=plain.mesh, placements=plain.placements)


def _hooks(t, create: bool = False) -> list | None:
    """A leaf's hook list (the slot is left unset until a hook is registered: one store less
    per tensor an op makes)."""
    hooks = getattr(t, "_hooks", None)
    if hooks is None and create:
        hooks = t._hooks = []
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
    hooks = _hooks(t)
    if hooks:
        g = _call_hooks([h for h in hooks if not getattr(h, "_post", False)], g)
    if t.grad is not None:
        t.grad = t.grad + g
    else:
        if handed is None or id(g) in handed:
            g = type(g)(g._local.copy(), g._spec)
        t.grad = g
    if handed is not None:
        handed.add(id(t.grad))
    if hooks:
        for h in hooks:
            if getattr(h, "_post", False):
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
        lst = _hooks(t, create=True)
    lst.append(fn)
    return lambda: lst.remove(fn) if fn in lst else None


def register_post_accumulate_grad_hook(t, fn: Callable) -> Callable[[], None]:
    """Leaves only: call ``fn(t)`` after a backward has added this pass's gradient to
    ``t.grad`` ("this gradient is final": the data-parallel machinery starts reductions
    here). Returns a remover."""
    if t._node is not None:
        raise RuntimeError("register_post_accumulate_grad_hook: only leaf tensors have a .grad")

    def post(tensor):
        fn(tensor)

    post._post = True  # type: ignore[attr-defined]
    lst = _hooks(t, create=True)
    lst.append(post)
    return lambda: lst.remove(post) if post in lst else None
