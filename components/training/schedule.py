"""The learning-rate schedule of SFT and RL: one definition, transformers' own schedules.

`lr_scheduler` (SFT) / `lr_scheduler_type` (RL) name it: a linear warmup from 0 over the first `warmup_ratio` of the
optimiser steps (rounded up to whole steps), then constant, linear decay to 0 or cosine decay to 0 at the last step.
The multiplier of the peak learning rate at step s (0-based) with W warmup steps of T is

    s < W:     s / W
    constant:  1
    linear:    (T - s) / (T - W)
    cosine:    0.5 * (1 + cos(pi * (s - W) / (T - W)))
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_scheduler

ScheduleKind = Literal["constant", "linear", "cosine"]

# Our names -> transformers' (its "constant" ignores the warmup; "constant_with_warmup" does not).
TRANSFORMERS_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def warmup_steps(warmup_ratio: float, total_steps: int) -> int:
    """`warmup_ratio` of `total_steps` as a whole number of optimiser steps, rounded up (as transformers'
    `TrainingArguments.get_warmup_steps`)."""
    return math.ceil(warmup_ratio * total_steps)


def lr_schedule(optimizer: torch.optim.Optimizer, kind: ScheduleKind, warmup: int, total_steps: int) -> LambdaLR:
    """The schedule `kind` over `optimizer`'s learning rate: `warmup` steps of linear warmup, then the decay over
    the rest of `total_steps`; call its `step()` once per optimiser step."""
    if kind not in TRANSFORMERS_SCHEDULES:
        raise ValueError(f"lr schedule must be one of {', '.join(TRANSFORMERS_SCHEDULES)}, got {kind!r}")
    return get_scheduler(TRANSFORMERS_SCHEDULES[kind], optimizer, num_warmup_steps=warmup,
                         num_training_steps=total_steps)


def lr_multiplier(kind: ScheduleKind, warmup: int, total_steps: int) -> Callable[[float], float]:
    """The multiplier of the peak learning rate at step s of `lr_schedule` (0-based), as a function that also takes
    a fraction of a step (for a schedule that follows the clock instead of the steps)."""
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # transformers builds schedules on one
    return lr_schedule(probe, kind, warmup, total_steps).lr_lambdas[0]
