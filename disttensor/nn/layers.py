"""Layers and losses. Parameters start Replicate on ``mesh`` (default: every rank, 1-D) and
are drawn with the seeded global-view random factories, so every mesh and placement starts
from the same weights as one process would; ``dt.shard_layer`` then places them.

Weights of Linear are (in_features, out_features) and ``y = x @ weight + bias``, so a
column-parallel weight is Shard(1) and a row-parallel one Shard(0).

>>> import numpy as np, disttensor as dt
>>> layer = dt.nn.Linear(3, 2, seed=0, dtype=np.float64)
>>> y = layer(np.ones((4, 3)))
>>> y.shape, dt.nn.MSELoss()(y, np.zeros((4, 2))).shape
((4, 2), ())
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import creation, ops
from ..autograd import no_grad
from ..mesh import ProcessMesh
from ..tensor import DistTensor
from .module import Module, Parameter


def _seed(seed: int | None, k: int) -> int | None:
    """The k-th parameter's seed of a layer seeded with ``seed`` (None: the global stream)."""
    return None if seed is None else int(seed) * 1000 + k


def _sizes(layer: str, **sizes: Any) -> None:
    """Refuse a size that is not an int >= 0 naming the layer's argument: a negative size
    would otherwise fail deep inside (``Linear(-4, 3)``: "math domain error" from the
    initialization bound)."""
    for name, n in sizes.items():
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"{layer}: {name} must be an int, got {n!r}")
        if n < 0:
            raise ValueError(f"{layer}: {name} must be >= 0, got {n}")


def _uniform(shape, bound: float, dtype, mesh, seed) -> DistTensor:
    with no_grad():
        u = creation.rand(shape, dtype, seed=seed, mesh=mesh)
        return Parameter((u * 2 - 1) * bound)


class Linear(Module):
    """``x @ weight + bias``; weight (in, out) and bias uniform in +-1/sqrt(in), as PyTorch.

    The parameters are ``dtype`` (float32 by default), but the layer computes as numpy does:
    its result's dtype follows numpy's type promotion of the input's and the weight's. A
    float64 batch through float32 layers gives float64 activations and a float64 loss (the
    parameters and their gradients stay float32), at float64's cost in memory and time. Cast
    the batch, ``x.astype(np.float32)``, to stay in float32.

    >>> import numpy as np, disttensor as dt
    >>> layer = dt.nn.Linear(3, 2, seed=0)
    >>> layer.weight.dtype, layer(np.ones((4, 3))).dtype
    (dtype('float32'), dtype('float64'))
    >>> layer(np.ones((4, 3)).astype(np.float32)).dtype
    dtype('float32')
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        dtype: Any = np.float32,
        mesh: ProcessMesh | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        _sizes("Linear", in_features=in_features, out_features=out_features)
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform((in_features, out_features), bound, dtype, mesh, _seed(seed, 0))
        self.bias = _uniform((out_features,), bound, dtype, mesh, _seed(seed, 1)) if bias else None

    def forward(self, x: Any) -> DistTensor:
        return ops.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """``weight[ids]`` with a (num_embeddings, dim) table drawn from N(0, std^2)."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        std: float = 1.0,
        dtype: Any = np.float32,
        mesh: ProcessMesh | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        _sizes("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        with no_grad():
            w = creation.randn(
                (num_embeddings, embedding_dim), dtype, seed=_seed(seed, 0), mesh=mesh
            )
            self.weight = Parameter(w * std if std != 1 else w)

    def forward(self, ids: Any) -> DistTensor:
        return ops.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """Normalize over the trailing ``normalized_shape`` axes; weight 1, bias 0 to start."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        *,
        dtype: Any = np.float32,
        mesh: ProcessMesh | None = None,
    ) -> None:
        super().__init__()
        given = normalized_shape
        shape = tuple(given) if isinstance(given, (Sequence, np.ndarray)) else (given,)
        for n in shape:  # checked first: int(2.5) would truncate silently
            _sizes("LayerNorm", normalized_shape=n)
        self.normalized_shape = tuple(int(n) for n in shape)
        self.eps = eps
        if elementwise_affine:
            self.weight = Parameter(creation.ones(self.normalized_shape, dtype, mesh=mesh))
            self.bias = Parameter(creation.zeros(self.normalized_shape, dtype, mesh=mesh))
        else:
            self.weight = self.bias = None

    def forward(self, x: Any) -> DistTensor:
        begin = (x.ndim if isinstance(x, DistTensor) else np.ndim(x)) - len(self.normalized_shape)
        return ops.layer_norm(x, self.weight, self.bias, begin_norm_axis=begin, epsilon=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class Dropout(Module):
    """Zero each item with probability ``p`` in training, scale the rest by 1/(1-p).

    The mask is drawn with ``dt.rand`` on the input's layout: item i of the global mask
    depends only on (seed, stream, i), so a sharded run drops exactly the items one process
    drops under the same ``dt.manual_seed`` (and the same sequence of random calls).
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: DistTensor) -> DistTensor:
        if not self.training or self.p == 0:
            return x
        if not isinstance(x, DistTensor):
            raise TypeError("Dropout needs a DistTensor input (its mesh places the mask)")
        plain = x.spec.without_partials().placements
        dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.float64
        keep = creation.rand(x.shape, dtype, mesh=x.mesh, placements=plain) >= self.p
        if self.p == 1:
            return ops.where(keep, x, 0)
        return ops.where(keep, x * (1 / (1 - self.p)), 0)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def _activation(name: str, fn, doc: str):
    def forward(self, x):
        return fn(x)

    return type(name, (Module,), {"forward": forward, "__doc__": doc})


ReLU = _activation("ReLU", ops.relu, "``max(x, 0)``.")
GELU = _activation("GELU", ops.gelu, "GELU, tanh approximation (GPT-2).")
Tanh = _activation("Tanh", ops.tanh, "``tanh(x)``.")
Sigmoid = _activation("Sigmoid", ops.sigmoid, "``1 / (1 + exp(-x))``.")
Identity = _activation("Identity", lambda x: x, "Returns its input.")


class Softmax(Module):
    """``dt.softmax(x, axis)``."""

    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: Any) -> DistTensor:
        return ops.softmax(x, self.axis)


_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str, what: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{what}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


class MSELoss(Module):
    """``mean((input - target)^2)`` (or sum, or none): subtract, square, mean (square's
    gradient is one product, ``2 d g``, where ``d * d``'s would be two and a sum)."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _check_reduction(reduction, "MSELoss")

    def forward(self, input: Any, target: Any) -> DistTensor:
        sq = ops.square(input - target)
        return sq if self.reduction == "none" else getattr(sq, self.reduction)()


class CrossEntropyLoss(Module):
    """``dt.cross_entropy(logits, labels, axis, reduction)``; a split class axis
    (vocabulary-parallel logits) moves only per-row statistics."""

    def __init__(self, reduction: str = "mean", axis: int = -1) -> None:
        super().__init__()
        self.reduction = _check_reduction(reduction, "CrossEntropyLoss")
        self.axis = axis

    def forward(self, logits: Any, labels: Any) -> DistTensor:
        return ops.cross_entropy(logits, labels, axis=self.axis, reduction=self.reduction)
