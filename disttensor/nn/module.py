"""Module: the container of parameters and sub-modules; Sequential and ModuleList.

A parameter is a leaf DistTensor with ``requires_grad=True`` (``Parameter(t)`` makes one).
Assigning a parameter or a module to an attribute registers it, as in PyTorch, so
``named_parameters()`` and ``state_dict()`` see it; ``dt.shard_layer`` replaces parameters
the same way.

>>> import disttensor as dt
>>> net = dt.nn.Sequential(dt.nn.Linear(3, 4, seed=0), dt.nn.ReLU(), dt.nn.Linear(4, 2, seed=1))
>>> [(name, p.shape) for name, p in net.named_parameters()]
[('0.weight', (3, 4)), ('0.bias', (4,)), ('2.weight', (4, 2)), ('2.bias', (2,))]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import autograd
from ..tensor import DistTensor, reshard, shard_tensor


class Parameter(DistTensor):
    """A leaf DistTensor that requires a gradient and that a Module registers when it is
    assigned to an attribute. ``Parameter(t)`` shares ``t``'s shard (no copy)."""

    __slots__ = ()

    def __init__(self, data: Any, spec: Any = None, requires_grad: bool = True) -> None:
        if spec is None:  # Parameter(t)
            if not isinstance(data, DistTensor):
                raise TypeError(f"Parameter needs a DistTensor, got {type(data).__name__}")
            data, spec = data.to_local(), data.spec
        super().__init__(data, spec)
        self.requires_grad_(requires_grad)


# Note [Parameters gathered per module] (parallel/sharding.py, Note [Sharding stages]): a
# stage-3 sharded optimizer keeps its parameters as slices between steps and registers, per
# parameter, the bound method that makes them whole for a module's forward. Calling a module
# first hands that method the module and the registered parameters of it and its
# sub-modules (one call per optimizer); what it gathers is the optimizer's choice (Note
# [Sharding stages]: the whole model at the outermost call, or each module's own parameters
# at its call), and it may return a function that gets the forward's output once the forward
# has run (to hand the parameters back, and gather them again for backward).
_GATHERS = autograd.ParamMethods()


def set_forward_gather(param: DistTensor, method: Any) -> None:
    """Register ``method(params, module)`` to make ``param`` whole before a module that owns
    it runs its forward; it may return ``after(output)``, called once the forward has run
    (None removes the registration)."""
    _GATHERS.set(param, method)


def _gather_own(module: Module) -> list:
    """Hand the registered parameters of ``module`` and its sub-modules to their gather
    methods; returns the ``after`` functions they gave."""
    afters = []
    for fn, params in _GATHERS.by_owner(list(module.parameters())).values():
        after = fn(params, module)
        if after is not None:
            afters.append(after)
    return afters


class Module:
    """Base class of layers: override ``forward``; call the module to run it."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"call Module.__init__() in {type(self).__name__}.__init__ first")
        params, modules = self._parameters, self._modules
        if name in params and value is not None and not isinstance(value, DistTensor):
            raise TypeError(  # PyTorch's rule: a silent unregistering would stop training it
                f"cannot assign {type(value).__name__} as parameter {name!r} of "
                f"{type(self).__name__} (a dt.nn.Parameter, a leaf DistTensor or None "
                "expected); to change its values in place write into it: "
                f"with dt.no_grad(): module.{name}[...] = value"
            )
        if name in params and isinstance(value, DistTensor) and not isinstance(value, Parameter):
            # a parameter replaced by a resharded copy (a shard_fn's dt.shard_tensor(...))
            if not (value.is_leaf and value.requires_grad):
                raise ValueError(
                    f"{type(self).__name__}.{name}: a parameter must be a leaf that requires "
                    "a gradient; use dt.nn.Parameter(t) to make one"
                )
            value = Parameter(value)
        params.pop(name, None)
        modules.pop(name, None)
        if isinstance(value, Parameter):
            params[name] = value
        elif isinstance(value, Module):
            modules[name] = value
        # registered or not, the value is also a plain attribute: ``self.weight`` in a forward
        # is an ordinary lookup (a __getattr__ fallback costs about a microsecond a read);
        # the registries say which attributes are parameters and sub-modules
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not _GATHERS:
            return self.forward(*args, **kwargs)
        afters = _gather_own(self)  # stage-3 parameters of this module made whole first
        out = self.forward(*args, **kwargs)
        for after in afters:
            after(out)
        return out

    # -- traversal --------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module ("" or ``prefix``) and every sub-module, depth first, each once."""
        seen: set[int] = set()

        def walk(m: Module, name: str):
            if id(m) in seen:
                return
            seen.add(id(m))
            yield name, m
            for child_name, child in m._modules.items():
                yield from walk(child, f"{name}.{child_name}" if name else child_name)

        yield from walk(self, prefix)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def children(self) -> Iterator[Module]:
        yield from self._modules.values()

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, DistTensor]]:
        """(dotted name, parameter) for every parameter, each once (shared ones too)."""
        seen: set[int] = set()
        for mod_name, m in self.named_modules(prefix):
            for name, p in m._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self) -> Iterator[DistTensor]:
        for _, p in self.named_parameters():
            yield p

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, DistTensor]:
        """Parameter name -> DistTensor (the parameters themselves, with their placements)."""
        return dict(self.named_parameters())

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Copy values into the parameters, resharded to each parameter's placements (a
        DistTensor on any mesh and placements, or a global array). With ``strict``, missing
        or unexpected names raise before anything is changed."""
        own = self.state_dict()
        if strict:
            missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
            if missing or extra:
                raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {extra}")
        for name, value in state.items():
            p = own.get(name)
            if p is None:
                continue
            shape = value.shape if isinstance(value, DistTensor) else np.shape(value)
            if tuple(shape) != p.shape:
                raise ValueError(
                    f"load_state_dict: {name} has shape {tuple(shape)}, the "
                    f"parameter has shape {p.shape}"
                )
        with autograd.no_grad():
            for name, value in state.items():
                p = own.get(name)
                if p is None:
                    continue
                if isinstance(value, DistTensor):
                    new = reshard(value, p.mesh, p.placements)
                else:
                    new = shard_tensor(np.asarray(value), p.mesh, p.placements)
                p._local[...] = new.to_local()

    def train(self, mode: bool = True) -> Module:
        """Training mode (Dropout drops) for this module and its sub-modules."""
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        """Evaluation mode: ``train(False)``."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Drop the gradients of every parameter (``.grad = None``)."""
        params = list(self.parameters())
        autograd.finish_grads(params, drop=True)  # Note [Gradient finishers]
        for p in params:
            p.grad = None

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            child = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child}")
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"


class ModuleList(Module):
    """A list of modules whose parameters are registered (names "0", "1", ...)."""

    def __init__(self, modules: list[Module] | None = None) -> None:
        super().__init__()
        for m in modules or []:
            self.append(m)

    def append(self, m: Module) -> None:
        setattr(self, str(len(self._modules)), m)

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class Sequential(ModuleList):
    """Modules applied in order; indexable and iterable."""

    def __init__(self, *layers: Module) -> None:
        super().__init__(list(layers))

    def forward(self, x: Any) -> Any:
        for layer in self._modules.values():
            x = layer(x)
        return x
