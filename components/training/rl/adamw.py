"""What every optimiser wrapper of the RL trainer shares: AdamW's learning-rate schedule, stepped once per RL step,
and the `Optimizer` protocol the trainer and the update use (components/training/rl/optim.py: plain torch and
DeepSpeed; fsdp.py: FSDP2; strategies.py picks one by `rl.distributed.strategy`)."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Protocol

import torch

OPTIMIZER_STATE = "optimizer"  # optimizer.json + optimizer.safetensors (no pickle: see checkpoint.py)


def advance_schedule(scheduler) -> None:
    """One step of the LR schedule. A step with no optimizer step (no signal: every group tied) still counts, so
    torch's warning about a scheduler stepping first is expected and silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
        scheduler.step()


class Optimizer(Protocol):
    """The operations the trainer and the update use, whichever strategy holds the model."""

    sharded: bool  # the checkpoints hold each rank's shards (every rank saves), not the whole model (rank 0 does)
    model: torch.nn.Module  # what the update calls (FSDP2: the sharded root)

    def backward(self, loss, sync: bool = True) -> None: ...
    def step(self) -> float: ...
    def schedule_step(self) -> None: ...
    @property
    def lr(self) -> float: ...
    def unwrap(self) -> torch.nn.Module: ...
    def save(self, directory: str | Path) -> None: ...
    def load(self, directory: str | Path) -> None: ...
    def full_state_dict(self) -> dict[str, torch.Tensor] | None: ...


class ScheduledOptimizer:
    """The schedule and learning rate of a wrapper whose torch optimiser is `base_optimizer` and whose schedule is
    `scheduler`; plain backward; the whole model in every checkpoint."""

    sharded = False
    base_optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    def backward(self, loss, sync: bool = True) -> None:
        """Accumulate gradients (`sync` marks the last micro-batch of a mini-batch; plain autograd needs no
        marker)."""
        loss.backward()

    def schedule_step(self) -> None:
        """Advance the LR schedule by one RL step (also when DAPO found nothing to train on this step)."""
        advance_schedule(self.scheduler)

    @property
    def lr(self) -> float:
        return float(self.base_optimizer.param_groups[0]["lr"])

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """None: the unwrapped model holds the whole weights (a sharded wrapper gathers them here)."""
        return None
