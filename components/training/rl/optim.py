"""The optimiser wrapper: plain torch AdamW on CPU (and one GPU; data parallel over processes); accelerate +
DeepSpeed ZeRO-2/3 on GPUs; FSDP2 over processes (`FSDPOptimizer`, components/training/rl/fsdp.py).

All expose the operations of `adamw.Optimizer` that the trainer uses: `backward(loss)`, `step() -> grad norm`, `lr`,
`unwrap()`, `save(dir)`, `load(dir)` and `schedule_step()` of the learning-rate schedule
(`components.training.schedule`); strategies.py builds the one `rl.distributed.strategy` names.
DeepSpeed is optional (the [gpu] extra): only `distributed.strategy: deepspeed` needs it, and a missing install stops
the run with an error that says which extra to install.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DeepSpeedPlugin

from components.errors import UserError
from components.training.launch import require_launcher
from components.training.rl.adamw import OPTIMIZER_STATE, ScheduledOptimizer
from components.training.rl.checkpoint import load_tree, save_tree
from components.training.rl.distributed import SINGLE, Ranks
from components.training.schedule import lr_schedule


def require_gpu_extra(module: str, purpose: str) -> None:
    """Raise a UserError naming the [gpu] extra when `module` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise UserError(
            f"{purpose} needs the '{module}' package, which is not installed. Install the GPU extra on a GPU machine: "
            f"pip install 'star-pipeline[gpu]' (or pip install {module}); on CPU set "
            f"rl.distributed.strategy: none and rl.rollout.backend: hf"
        )


class TorchOptimizer(ScheduledOptimizer):
    """AdamW over the model's trainable parameters with gradient-norm clipping and an LR schedule; in a world of N
    processes, each a replica of the model (`Ranks`), the gradients are summed over the ranks before each step.
    The checkpoints hold the whole model, written by rank 0."""

    def __init__(self, model, learning_rate: float, weight_decay: float, max_grad_norm: float,
                 scheduler: str, warmup_steps: int, total_steps: int, adam_epsilon: float = 1e-8,
                 ranks: Ranks = SINGLE):
        self.model = model
        self.ranks = ranks
        self.max_grad_norm = max_grad_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=learning_rate, weight_decay=weight_decay, eps=adam_epsilon)
        self.base_optimizer = self.optimizer
        self.scheduler = lr_schedule(self.optimizer, scheduler, warmup_steps, total_steps)

    def step(self) -> float:
        """Sum the accumulated gradients over the ranks (data parallel: every rank holds the whole model and its
        share of the loss), clip, apply and clear them; return the gradient norm before clipping."""
        self.ranks.sum_gradients(self.params)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def unwrap(self):
        return self.model

    def save(self, directory: str | Path) -> None:
        save_tree(directory, OPTIMIZER_STATE,
                  {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()})

    def load(self, directory: str | Path) -> None:
        state = load_tree(directory, OPTIMIZER_STATE)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def deepspeed_config(zero_stage: int, max_grad_norm: float, gradient_accumulation_steps: int = 1) -> dict:
    """A DeepSpeed ZeRO-2/3 config in bf16; batch sizes come from accelerate ("auto")."""
    return {
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": zero_stage,
            "overlap_comm": True,
            "contiguous_gradients": True,
            **({"stage3_gather_16bit_weights_on_model_save": True} if zero_stage == 3 else {}),
        },
        "gradient_clipping": max_grad_norm,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "train_micro_batch_size_per_gpu": 1,  # a micro-batch is one padded forward pass; its size is ours
    }


class AccelerateOptimizer(ScheduledOptimizer):
    """AdamW under `accelerate` with a DeepSpeed ZeRO plugin, in the world of the torchrun that `star rl` starts
    itself under (components/training/launch.py) or of any launcher that started it.

    Gradient accumulation is ours, not DeepSpeed's: the config says 1 accumulation step (so DeepSpeed never rescales
    the loss, which `aggregate_loss` already normalised by the whole mini-batch) and `backward(loss, sync=False)`
    marks the micro-batches before the last one as not being an accumulation boundary.
    """

    def __init__(self, model, learning_rate: float, weight_decay: float, max_grad_norm: float,
                 scheduler: str, warmup_steps: int, total_steps: int, zero_stage: int,
                 adam_epsilon: float = 1e-8):
        require_gpu_extra("deepspeed", "rl.distributed.strategy: deepspeed")
        # `star rl` starts itself under torchrun; the trainer's rollouts and outputs are one process's
        require_launcher("rl.distributed.strategy: deepspeed", most=1)
        # accelerate keeps one global state per process: without a reset, a second run in the same process (a
        # resumed run in a test, a benchmark, a sweep) is refused ("cannot pass in a `deepspeed_plugin` when
        # creating a second `Accelerator`"). The process group itself stays up and is reused.
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        plugin = DeepSpeedPlugin(hf_ds_config=deepspeed_config(zero_stage, max_grad_norm))
        self.accelerator = Accelerator(deepspeed_plugin=plugin)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate,
                                      weight_decay=weight_decay, eps=adam_epsilon)
        # the schedule drives the base optimizer's param groups, which the ZeRO optimizer shares
        self.scheduler = lr_schedule(optimizer, scheduler, warmup_steps, total_steps)
        self.base_optimizer = optimizer
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)

    def backward(self, loss, sync: bool = True) -> None:
        """Backward through the DeepSpeed engine; it reduces gradients and steps only when `sync` is True."""
        self.accelerator.deepspeed_engine_wrapped.backward(loss, sync_gradients=sync)

    def step(self) -> float:
        """DeepSpeed stepped (with clipping) in the last `backward`; return its global gradient norm."""
        norm = self.accelerator.deepspeed_engine_wrapped.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def unwrap(self):
        return self.accelerator.unwrap_model(self.model)

    def save(self, directory: str | Path) -> None:
        self.accelerator.save_state(str(Path(directory) / "accelerate"))
        save_tree(directory, OPTIMIZER_STATE, {"scheduler": self.scheduler.state_dict()})

    def load(self, directory: str | Path) -> None:
        self.accelerator.load_state(str(Path(directory) / "accelerate"))
        self.scheduler.load_state_dict(load_tree(directory, OPTIMIZER_STATE)["scheduler"])
