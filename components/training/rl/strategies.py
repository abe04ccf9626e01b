"""Training strategies, registered by the name `rl.distributed.strategy` takes: how the trained model is held,
stepped and checkpointed.

- `none`: plain torch AdamW over float32 master weights, computing in rl.dtype under autocast; data parallel over
  `rl.distributed.processes` replicas (gradients summed over the ranks; optim.py `TorchOptimizer`).
- `deepspeed`: accelerate + DeepSpeed ZeRO-2/3 in one process, its own bf16 mode and float32 master copy (the [gpu]
  extra; optim.py `AccelerateOptimizer`).
- `fsdp2`: torch FSDP2 shards float32 master weights, gradients and optimiser state over the processes and computes
  in rl.dtype by its mixed-precision policy (fsdp.py `FSDPOptimizer`). Its checkpoints are each rank's shards, which
  load onto any number of processes, so the process count is left out of the run's fingerprint; the rollouts sample
  through a full copy of the weights (the sharded forward is a collective, and each rank's episodes differ in
  length), which the weight sync fills.

A strategy is a `Strategy` and one `register_strategy`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from components.training.rl.params import RLParams
from components.training.rl.registry import add, lookup

if TYPE_CHECKING:  # the wrappers (and torch) load when a run builds its optimiser: `star rl --plan` needs neither
    import torch

    from components.training.rl.adamw import Optimizer
    from components.training.rl.distributed import Ranks

OptimizerFactory = Callable[["torch.nn.Module", RLParams, dict, "Ranks"], "Optimizer"]


@dataclass(frozen=True)
class Strategy:
    """One way to hold and step the trained model."""

    name: str
    optimizer: OptimizerFactory  # (model, params, the AdamW and schedule settings, ranks) -> the wrapper
    float32_master: bool  # the model is loaded in float32 (master weights); else in rl.dtype
    autocast: bool  # the update autocasts to rl.dtype over the float32 weights (else the strategy casts itself)
    # bytes per parameter of the training state on one process (before sharding): weights, gradients, optimiser
    bytes_per_parameter: tuple[int, int, int] = (4, 4, 8)  # float32 weights and gradients, AdamW's two moments
    sharded: bool = False  # the state is split over the processes, the model starts from the input model, the
    # checkpoints hold shards and the rollouts sample from a full copy of the weights
    reshardable: bool = False  # a checkpoint loads onto another number of processes (dropped from the fingerprint)

    def weights_dtype(self, params: RLParams) -> str:
        return "float32" if self.float32_master else params.dtype

    def state_bytes(self, parameters: int, processes: int) -> tuple[int, int, int]:
        """(weights, gradients, optimiser state) bytes on each process for a model of `parameters`."""
        per_process = processes if self.sharded else 1
        weights, gradients, optimizer = (-(-n * parameters // per_process) for n in self.bytes_per_parameter)
        return weights, gradients, optimizer

    def fingerprint(self, dump: dict) -> dict:
        """The params dump a run's checkpoints are keyed by, less what this strategy lets change across a resume."""
        if self.reshardable:
            dump["distributed"].pop("processes", None)
        return dump


def plain_optimizer(model, params: RLParams, common: dict, ranks: Ranks) -> Optimizer:
    from components.training.rl.optim import TorchOptimizer

    return TorchOptimizer(model, ranks=ranks, **common)


def deepspeed_optimizer(model, params: RLParams, common: dict, ranks: Ranks) -> Optimizer:
    from components.training.rl.optim import AccelerateOptimizer

    return AccelerateOptimizer(model, zero_stage=params.distributed.zero_stage, **common)


def fsdp2_optimizer(model, params: RLParams, common: dict, ranks: Ranks) -> Optimizer:
    from components.models.loading import resolve_dtype
    from components.training.rl.fsdp import FSDPOptimizer

    device = str(next(model.parameters()).device)
    return FSDPOptimizer(model, ranks=ranks, param_dtype=resolve_dtype(params.dtype, device), **common)


STRATEGIES: dict[str, Strategy] = {}


def register_strategy(strategy: Strategy) -> Strategy:
    return add(STRATEGIES, strategy.name, strategy, "strategy")


def get_strategy(name: str) -> Strategy:
    return lookup(STRATEGIES, name, "rl.distributed.strategy")


register_strategy(Strategy("none", plain_optimizer, float32_master=True, autocast=True))
# DeepSpeed's bf16 mode: bf16 weights and gradients, float32 master weights and moments (12 bytes)
register_strategy(Strategy("deepspeed", deepspeed_optimizer, float32_master=False, autocast=False,
                           bytes_per_parameter=(2, 2, 12)))
register_strategy(Strategy("fsdp2", fsdp2_optimizer, float32_master=True, autocast=False, sharded=True,
                           reshardable=True))


def build_optimizer(model: torch.nn.Module, params: RLParams, total_steps: int, ranks: Ranks | None = None) -> Optimizer:
    """The optimiser wrapper of `params.distributed.strategy` over `model`, with rl's AdamW and schedule settings
    (`ranks`: the data-parallel world; None: this process alone)."""
    from components.training.rl.distributed import SINGLE
    from components.training.schedule import warmup_steps

    ranks = SINGLE if ranks is None else ranks
    common = dict(learning_rate=params.learning_rate, weight_decay=params.weight_decay,
                  adam_epsilon=params.adam_epsilon, max_grad_norm=params.max_grad_norm,
                  scheduler=params.lr_scheduler_type, warmup_steps=warmup_steps(params.warmup_ratio, total_steps),
                  total_steps=total_steps)
    return get_strategy(params.distributed.strategy).optimizer(model, params, common, ranks)
