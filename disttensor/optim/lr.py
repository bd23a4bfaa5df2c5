"""Learning-rate schedules: callables ``step -> lr`` (step counts from 1), to pass as an
optimizer's ``lr`` (or to ``set_lr``); any function of the step works the same way.

>>> from disttensor.optim import linear_warmup, cosine
>>> sched = linear_warmup(cosine(0.1, total=100), warmup=10)
>>> round(sched(5), 3), round(sched(10), 3), round(sched(100), 3)
(0.049, 0.098, 0.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable

Schedule = Callable[[int], float]


def step_decay(base: float, every: int, gamma: float = 0.1) -> Schedule:
    """``base * gamma ** ((step - 1) // every)``."""
    return lambda step: base * gamma ** ((step - 1) // every)


def cosine(base: float, total: int, final: float = 0.0) -> Schedule:
    """Cosine from ``base`` (step 0) to ``final`` at step ``total``, then ``final``."""

    def lr(step: int) -> float:
        t = min(step, total) / total
        return final + 0.5 * (base - final) * (1 + math.cos(math.pi * t))

    return lr


def linear_warmup(schedule: Schedule | float, warmup: int) -> Schedule:
    """Ramp linearly over the first ``warmup`` steps to ``schedule`` (a number or a schedule)."""
    inner = schedule if callable(schedule) else (lambda step: float(schedule))

    def lr(step: int) -> float:
        if step < warmup:
            return inner(warmup) * step / warmup
        return inner(step)

    return lr
