"""A GPT-style transformer block: causal multi-head attention and an MLP, each behind a
pre-layer-norm residual. Sharded Megatron-style by ``dt.nn.megatron_plan`` (sharding.py):
q/k/v and the first MLP linear column-parallel, the output projections row-parallel, so each
of the two residual branches does one reduction in forward and one in backward.

>>> import numpy as np, disttensor as dt
>>> block = dt.nn.TransformerBlock(8, 2, seed=0, dtype=np.float64)
>>> block(dt.randn((2, 3, 8), seed=1)).shape
(2, 3, 8)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import ops
from ..mesh import ProcessMesh
from ..ops.nn import attention_softmax
from .layers import GELU, Dropout, LayerNorm, Linear, _seed
from .module import Module


class MultiHeadAttention(Module):
    """Causal (by default) self-attention with ``heads`` heads over (batch, time, dim) input."""

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        causal: bool = True,
        dropout: float = 0.0,
        dtype: Any = np.float32,
        mesh: ProcessMesh | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"MultiHeadAttention: dim {dim} is not divisible by heads {heads}")
        self.dim, self.heads, self.causal = dim, heads, causal
        kw = {"dtype": dtype, "mesh": mesh}
        self.q = Linear(dim, dim, seed=_seed(seed, 0), **kw)
        self.k = Linear(dim, dim, seed=_seed(seed, 1), **kw)
        self.v = Linear(dim, dim, seed=_seed(seed, 2), **kw)
        self.proj = Linear(dim, dim, seed=_seed(seed, 3), **kw)
        self.drop = Dropout(dropout)

    def _heads(self, t, b: int, n: int):
        """(b, n, dim) -> (b, heads, n, dim / heads); a split dim becomes split heads."""
        return ops.transpose(
            ops.reshape(t, (b, n, self.heads, self.dim // self.heads)), (0, 2, 1, 3)
        )

    def forward(self, x: Any) -> Any:
        b, n, _ = x.shape
        q, k, v = (self._heads(f(x), b, n) for f in (self.q, self.k, self.v))
        # scale, causal mask and softmax in one op (Note [Attention scores] in ops/nn.py)
        scores = ops.matmul(q, k, trans_y=True)
        scale = 1 / math.sqrt(self.dim // self.heads)
        att = self.drop(attention_softmax(scores, scale, causal=self.causal))
        out = ops.transpose(ops.matmul(att, v), (0, 2, 1, 3))
        return self.proj(ops.reshape(out, (b, n, self.dim)))


class MLP(Module):
    """``Linear(dim, hidden) -> GELU -> Linear(hidden, dim)``."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        *,
        dtype: Any = np.float32,
        mesh: ProcessMesh | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.fc1 = Linear(dim, hidden, seed=_seed(seed, 0), dtype=dtype, mesh=mesh)
        self.act = GELU()
        self.fc2 = Linear(hidden, dim, seed=_seed(seed, 1), dtype=dtype, mesh=mesh)

    def forward(self, x: Any) -> Any:
        return self.fc2(self.act(self.fc1(x)))


class TransformerBlock(Module):
    """``x + attn(ln1(x))``, then ``x + mlp(ln2(x))`` (pre-norm, as GPT-2)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        dtype: Any = np.float32,
        mesh: ProcessMesh | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        kw = {"dtype": dtype, "mesh": mesh}
        self.ln1 = LayerNorm(dim, **kw)
        self.attn = MultiHeadAttention(dim, heads, dropout=dropout, seed=_seed(seed, 0), **kw)
        self.ln2 = LayerNorm(dim, **kw)
        self.mlp = MLP(dim, mlp_ratio * dim, seed=_seed(seed, 1), **kw)

    def forward(self, x: Any) -> Any:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
