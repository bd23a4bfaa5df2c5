"""Optimizers: SGD, Momentum, Adam, AdamW, with a learning-rate schedule hook.

Note [Optimizer placements]
    Each parameter's gradient is first resharded to the parameter's own placements: a
    Partial(sum) gradient of data parallelism becomes Replicate, a gradient that came out in
    another layout is moved. The Partial gradients of replicated parameters are reduced
    together, one all-reduce per group of mesh dims (parallel/buckets.py, Note [Gradients
    reduced at the step]), the rest one by one. From there the update is elementwise on the
    local shards, with no communication, and the optimizer state (momentum, Adam moments)
    has exactly the parameter's placements: a column-sharded weight keeps a column-sharded
    Adam state. The update writes into the parameter's shard, so the model sees it.
    Adam and AdamW run kernels/adam.py's fused update (the numpy reference on the host, bit
    for bit the update written out; the CUDA program on a GPU: backend.kernels), on the
    shards where they live.

>>> import numpy as np, disttensor as dt
>>> w = dt.nn.Parameter(dt.ones((2,), mesh=dt.ProcessMesh([0])))
>>> opt = dt.optim.SGD([w], lr=0.5)
>>> (w * w).sum().backward()
>>> opt.step()
>>> w.numpy()
array([0., 0.])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import backend
from ..autograd import finish_grads, no_grad, note_mutation
from ..comm import agree
from ..parallel.buckets import reduce_remaining
from ..tensor import DistTensor, agree_on_mesh, reshard, shard_tensor

LR = float | Callable[[int], float]


class Optimizer:
    """Base class: holds the parameters, the step count and the learning rate.

    ``lr`` is a number or a schedule ``lr(step) -> float`` (step counts from 1 at the first
    ``step()``); ``set_lr`` replaces it. ``step()`` updates every parameter that has a
    gradient (Note [Optimizer placements]); ``zero_grad()`` drops the gradients.
    ``reductions`` says how the last step reduced Partial gradients together:
    ``{"gradients": n, "all_reduces": k}`` (Note [Gradients reduced at the step]).

    A new optimizer names its per-parameter state in ``state_names`` and defines
    ``apply(w, g, state, lr)``: the update of the local arrays, in place, elementwise (a
    sharded optimizer runs it once on a bucket's slices laid end to end). An update that is not
    elementwise overrides ``update(p, w, g, lr)`` instead, and is then called per parameter.
    """

    state_names: tuple[str, ...] = ()  # the state kept per parameter (load_state_dict checks)

    def __init__(self, params: Iterable[DistTensor], lr: LR) -> None:
        self.params: list[DistTensor] = []
        seen: set[int] = set()
        for p in params:
            if not isinstance(p, DistTensor):
                raise TypeError(f"optimizer parameters must be DistTensors, got {type(p).__name__}")
            if not p.is_leaf:  # PyTorch's rule: its .grad is never set, it would never move
                raise ValueError(
                    f"optimizer: can't optimize a non-leaf tensor (shape {p.shape}, made by "
                    f"{p.grad_fn!r}); optimize the leaf it was computed from, or "
                    "p.detach().requires_grad_() for a new one"
                )
            if any(q.is_partial() for q in p.placements):
                raise ValueError(
                    f"optimizer: a parameter of shape {p.shape} is Partial {p.placements}; "
                    "reshard it to Replicate or Shard placements first"
                )
            if id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        self.set_lr(lr)
        self.step_count = 0
        self.state: dict[int, dict[str, DistTensor]] = {}
        # the last step's reduction of Partial gradients done together: Note [Gradients
        # reduced at the step] (gradients taken, all-reduces made)
        self.reductions = {"gradients": 0, "all_reduces": 0}

    def set_lr(self, lr: LR) -> None:
        if not callable(lr) and not float(lr) >= 0:
            raise ValueError(f"learning rate must be >= 0 or a schedule, got {lr}")
        self._lr = lr

    @property
    def lr(self) -> float:
        """The learning rate of the current (or, before any step, the first) step."""
        lr = self._lr
        return float(lr(max(self.step_count, 1))) if callable(lr) else float(lr)

    def zero_grad(self) -> None:
        finish_grads(self.params, drop=True)  # Note [Gradient finishers]
        for p in self.params:
            p.grad = None

    def _state(self, p: DistTensor, *names: str) -> list[np.ndarray]:
        """Local shards of this parameter's state tensors (zeros at first), with its spec."""
        st = self.state.get(id(p))
        if st is None:
            local = p.to_local()  # the state lives where the parameter does
            st = self.state[id(p)] = {
                n: DistTensor(backend.xp(local).zeros_like(local), p.spec) for n in names
            }
        return [st[n].to_local() for n in names]

    def grad_of(self, p: DistTensor) -> np.ndarray:
        """The local shard of ``p``'s gradient in ``p``'s placements (collective if it moves)."""
        g = p.grad
        if g.spec != p.spec:
            g = reshard(g, p.mesh, p.placements)
        local = g.to_local()
        return local if local.dtype == p.dtype else local.astype(p.dtype)

    def step(self) -> None:
        """One update of every parameter that has a gradient. The ranks of each parameter
        mesh first agree on which parameters have one (a backward on some ranks only would
        otherwise update some shards and not others: ``RanksDiverged`` on every rank)."""
        lr = self._begin_step()
        with no_grad():
            n, k = reduce_remaining(self.params)  # Note [Gradients reduced at the step]
            self.reductions = {"gradients": n, "all_reduces": k}
            for p in self.params:
                if p.grad is None:
                    continue
                g = self.grad_of(p)
                self.update(p, p.to_local(), g, lr)
                note_mutation(p.to_local())  # a backward through the old value now refuses

    def _begin_step(self) -> float:
        """What every step does first (a sharded optimizer's too): finish the reductions in
        flight (Note [Gradient finishers]), agree on which parameters have gradients, count
        the step; returns its learning rate."""
        finish_grads(self.params)
        if agree.CHECK:
            self._agree_on_gradients()
        self.step_count += 1
        return self.lr

    def _agree_on_gradients(self) -> None:
        """Note [Replicas agree] in tensor.py: per mesh, which of its parameters have a
        gradient, checked once (one agreement, CommCounter.checks) before any update."""
        meshes: dict = {}
        for p in self.params:
            meshes.setdefault(p.mesh, []).append("1" if p.grad is not None else "0")
        for mesh, has in meshes.items():
            agree_on_mesh(mesh, "optimizer step", (f"gradients {''.join(has)}",))

    def update(self, p: DistTensor, w: np.ndarray, g: np.ndarray, lr: float) -> None:
        """Update the local shard ``w`` of ``p`` in place from the local gradient ``g``:
        ``apply`` with ``p``'s state. A subclass overrides ``apply`` (or ``update`` itself,
        for an update that is not elementwise)."""
        self.apply(w, g, self._state(p, *self.state_names) if self.state_names else [], lr)

    def apply(self, w: np.ndarray, g: np.ndarray, state: list, lr: float) -> None:
        """The update on local arrays: ``w`` in place from ``g``, ``state`` the local arrays
        of ``state_names`` in that order, updated in place. Elementwise: a sharded optimizer
        (dt.shard_optimizer) runs it once on a bucket's slices laid end to end."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """{"step": n, "state": {parameter index: {name: DistTensor}}}."""
        index = {id(p): i for i, p in enumerate(self.params)}
        return {
            "step": self.step_count,
            "state": {index[k]: dict(v) for k, v in self.state.items() if k in index},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step count and the per-parameter state that ``state_dict()`` returned.

        The state may come from another run, mesh or layout (``dt.load``): each state tensor
        (a DistTensor in any layout, or a global numpy array) is moved to its parameter's
        mesh and placements and cast to its dtype, into memory the optimizer owns. Everything
        is checked first (keys, parameter indices, state names, shapes), on every rank,
        before anything changes or communicates. Collective when a tensor moves.

        >>> import numpy as np, disttensor as dt
        >>> w = dt.nn.Parameter(dt.ones((2,), mesh=dt.ProcessMesh([0])))
        >>> opt = dt.optim.Momentum([w], lr=0.1)
        >>> opt.load_state_dict({"step": 4, "state": {0: {"velocity": np.array([1.0, 2.0])}}})
        >>> opt.step_count, opt.state_dict()["state"][0]["velocity"].to_local()
        (4, array([1., 2.]))
        """
        what = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state, dict) or set(state) != {"step", "state"}:
            got = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f'{what}: expected a dict with keys "step" and "state", got {got}')
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"{what}: step must be an int >= 0, got {step!r}")
        if not isinstance(state["state"], dict):
            raise TypeError(f"{what}: state must be a dict, got {type(state['state']).__name__}")
        checked = []
        for key, entry in state["state"].items():
            i = _param_index(key, len(self.params), what)
            p = self.params[i]
            if not isinstance(entry, dict) or set(entry) != set(self.state_names):
                have = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
                raise ValueError(
                    f"{what}: the state of parameter {i} has {have}; {type(self).__name__} "
                    f"keeps {sorted(self.state_names)}"
                )
            for name, value in entry.items():
                if not isinstance(value, DistTensor):
                    value = np.asarray(value)
                if tuple(value.shape) != p.shape or value.dtype.kind not in "biufc":
                    raise ValueError(
                        f"{what}: state {name!r} of parameter {i} is {tuple(value.shape)} "
                        f"{value.dtype}; the parameter is {p.shape} {p.dtype}"
                    )
            checked.append((p, entry))
        new = {}
        specs = getattr(self, "_state_specs", {})  # a sharded optimizer's slices
        with no_grad():
            for p, entry in checked:
                spec = specs.get(id(p), p.spec)
                new[id(p)] = {name: _state_like(value, p, spec) for name, value in entry.items()}
        self.state = new
        self.step_count = int(step)


def _param_index(key: Any, n: int, what: str) -> int:
    """A state key as a parameter index (keys that went through JSON may be digit strings)."""
    try:
        i = int(key) if not isinstance(key, (bool, float)) else None
    except (TypeError, ValueError):
        i = None
    if i is None or not 0 <= i < n:
        raise ValueError(
            f"{what}: the state names parameter {key!r}, but this optimizer has {n} "
            f"parameters (indices 0..{n - 1}); load the state of an optimizer over the same "
            "parameters, in the same order"
        )
    return i


def _state_like(value: Any, p: DistTensor, spec: Any) -> DistTensor:
    """``value`` in layout ``spec`` (``p``'s own, or a sharded optimizer's slice of it), in
    ``p``'s dtype, in memory of its own, on ``p``'s device (a host state loaded for a device
    parameter is copied there explicitly)."""
    mesh, placements = spec.mesh, spec.placements
    if isinstance(value, DistTensor):
        if value.spec.mesh != mesh or value.spec.placements != placements:
            value = reshard(value, mesh, placements)
        local = value.to_local()
    else:
        local = shard_tensor(backend.to_host(value), mesh, placements).to_local()
    spec = spec.replace(dtype=p.dtype) if spec.dtype != p.dtype else spec
    home = backend.of(p.to_local())  # the state lives where the parameter does
    if backend.of(local) is not home:
        return DistTensor(home.from_host(backend.to_host(local), p.dtype), spec)
    if backend.is_device(local):
        return DistTensor(local.astype(p.dtype, copy=True), spec)
    return DistTensor(np.array(local, dtype=p.dtype, copy=True), spec)


class SGD(Optimizer):
    """``w -= lr * (g + weight_decay * w)``."""

    def __init__(self, params: Iterable[DistTensor], lr: LR = 0.01, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.weight_decay = weight_decay

    def apply(self, w, g, state, lr):
        if self.weight_decay:
            g = g + self.weight_decay * w
        w -= lr * g


class Momentum(Optimizer):
    """Heavy ball: ``v = momentum * v + g``; ``w -= lr * v`` (Nesterov optional)."""

    state_names = ("velocity",)

    def __init__(
        self,
        params: Iterable[DistTensor],
        lr: LR = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        super().__init__(params, lr)
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov

    def apply(self, w, g, state, lr):
        if self.weight_decay:
            g = g + self.weight_decay * w
        (v,) = state
        v *= self.momentum
        v += g
        w -= lr * (g + self.momentum * v if self.nesterov else v)


class Adam(Optimizer):
    """Adam (Kingma and Ba) with bias correction; ``weight_decay`` is added to the gradient
    (L2), as in PyTorch's Adam. For decoupled decay use AdamW."""

    decoupled = False
    default_weight_decay = 0.0
    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Iterable[DistTensor],
        lr: LR = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float | None = None,
    ):
        super().__init__(params, lr)
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.weight_decay = self.default_weight_decay if weight_decay is None else weight_decay

    def apply(self, w, g, state, lr):
        m, v = state
        if w.dtype.kind == "f":  # the fused kernel (real floats)
            be = backend.of(w)
            if be.device and not g.flags.c_contiguous:  # the CUDA kernel indexes flat
                g = be.xp.ascontiguousarray(g)
            adam = backend.kernels(be, "adam")["adam_update"]
            hyper = {"beta1": self.beta1, "beta2": self.beta2, "eps": self.eps}
            adam(w, g, m, v, step=self.step_count, lr=lr, **hyper,
                 weight_decay=self.weight_decay, decoupled=self.decoupled)  # fmt: skip
            return
        # complex parameters: the same update written out
        if self.weight_decay and not self.decoupled:
            g = g + self.weight_decay * w
        b1, b2, t = self.beta1, self.beta2, self.step_count
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * (g * g)
        if self.weight_decay and self.decoupled:
            w *= 1 - lr * self.weight_decay
        step = lr / (1 - b1**t)
        w -= step * m / (np.sqrt(v / (1 - b2**t)) + self.eps)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter): ``w *= 1 - lr * wd``;
    ``weight_decay`` defaults to 0.01."""

    decoupled = True
    default_weight_decay = 0.01
