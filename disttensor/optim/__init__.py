"""Optimizers (``dt.optim``) and learning-rate schedules."""

from .lr import cosine, linear_warmup, step_decay
from .optimizer import SGD, Adam, AdamW, Momentum, Optimizer

__all__ = ["SGD", "Adam", "AdamW", "Momentum", "Optimizer", "cosine", "linear_warmup", "step_decay"]
