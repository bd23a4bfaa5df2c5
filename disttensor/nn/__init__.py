"""Layers, losses and model sharding (``dt.nn``); ``dt.shard_layer`` lives in sharding.py."""

from .layers import (
    GELU,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Identity,
    LayerNorm,
    Linear,
    MSELoss,
    ReLU,
    Sigmoid,
    Softmax,
    Tanh,
)
from .module import Module, ModuleList, Parameter, Sequential
from .sharding import (
    ColwiseParallel,
    RowwiseParallel,
    VocabParallel,
    megatron_plan,
    place,
    plan_shard_fn,
    shard_layer,
)
from .transformer import MLP, MultiHeadAttention, TransformerBlock

__all__ = [
    "GELU",
    "MLP",
    "ColwiseParallel",
    "CrossEntropyLoss",
    "Dropout",
    "Embedding",
    "Identity",
    "LayerNorm",
    "Linear",
    "MSELoss",
    "Module",
    "ModuleList",
    "MultiHeadAttention",
    "Parameter",
    "ReLU",
    "RowwiseParallel",
    "Sequential",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "TransformerBlock",
    "VocabParallel",
    "megatron_plan",
    "place",
    "plan_shard_fn",
    "shard_layer",
]
