"""The optimiser wrapper: plain torch AdamW on CPU (and one GPU); accelerate + DeepSpeed ZeRO-2/3 on GPUs.

Both expose the same five operations the trainer uses: `backward(loss)`, `step() -> grad norm`, `lr`,
`save(dir)`, `load(dir)`. DeepSpeed and accelerate are imported lazily and only for `distributed.strategy:
deepspeed`, with an error that says which extra to install.
"""
from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import MutableMapping
from pathlib import Path

from components.errors import UserError

OPTIMIZER_FILE = "optimizer.pt"


def require_gpu_extra(module: str, purpose: str) -> None:
    """Raise a UserError naming the [gpu] extra when `module` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise UserError(
            f"{purpose} needs the '{module}' package, which is not installed. Install the GPU extra on a GPU machine: "
            f"pip install 'star-pipeline[gpu]' (or pip install {module}); on CPU set "
            f"rl.distributed.strategy: none and rl.rollout.backend: hf"
        )


def select_trainable(model, patterns: list[str] | None) -> list[str]:
    """Freeze every parameter whose name matches none of `patterns` (shell-style globs over `named_parameters()`
    names, e.g. `*norm.weight`); None trains them all. Returns the trainable names. The frozen ones keep their
    weights bit for bit, get no gradient and no optimizer state."""
    from fnmatch import fnmatchcase

    names = [name for name, _ in model.named_parameters()]
    if patterns is None:
        return names
    chosen = [name for name in names if any(fnmatchcase(name, pattern) for pattern in patterns)]
    if not chosen:
        raise UserError(f"rl.trainable_parameters {patterns} matches none of the model's parameters, e.g. "
                        f"{', '.join(names[:3])} ... {names[-1]}: use shell-style globs such as '*norm.weight', or "
                        "null to train them all")
    keep = set(chosen)
    for name, param in model.named_parameters():
        param.requires_grad_(name in keep)
    return chosen


def lr_lambda(kind: str, warmup_steps: int, total_steps: int):
    """Multiplier of the base learning rate at scheduler step s: linear warmup, then constant/linear/cosine decay."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if kind == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def advance_schedule(scheduler) -> None:
    """One step of the LR schedule. A step with no optimizer step (no signal: every group tied) still counts, so
    torch's warning about a scheduler stepping first is expected and silenced."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
        scheduler.step()


FINAL_NORM = "model.norm.weight"  # Qwen2/Llama: the RMSNorm weight right before the (bias-free) output layer


class LogitScale:
    """A learned inverse temperature: the final norm's weight w trained only along itself, w = w0 * exp(s).

    Every logit is linear in w (logits = W_out (w * rmsnorm(h)), no bias after it in Qwen2 or Llama), so exp(s)
    multiplies all of them: a policy sampled at temperature T samples at T / exp(s), and its greedy choices are the
    same. It is one direction that every query's reward can favour (docs/tiny_preset.md, sessions 25 and 46), and
    its gradient dL/ds = <dL/dw, w> sums the evidence of every sampled token of the step, where a single weight of
    the 2M gets its own noisy estimate. The scale lives in w, so a checkpoint stays a plain model.
    """

    def __init__(self, model):
        import torch

        weights = dict(model.named_parameters())
        if FINAL_NORM not in weights:
            raise UserError(f"rl.logit_scale_lr needs the final norm '{FINAL_NORM}' in front of the output layer (Qwen2 "
                            f"and Llama models have it); this model's last parameters are {list(weights)[-3:]}: set "
                            "rl.logit_scale_lr: null")
        self.weight = weights[FINAL_NORM]
        self.weight.requires_grad_(True)  # its gradient is the scalar's evidence; the weight itself is not stepped
        self.base = self.weight.detach().clone()
        self.log_scale = torch.zeros((), dtype=torch.float32, device=self.weight.device, requires_grad=True)
        self.last_grad = 0.0  # the latest d loss / d s (> 0: the step lowered the scale, i.e. flattened the policy)

    @property
    def scale(self) -> float:
        return float(self.log_scale.detach().exp())

    def collect_grad(self) -> None:
        """Move the weight's accumulated gradient onto the scalar: d loss / d s = <d loss / d w, w>."""
        grad = self.weight.grad
        self.log_scale.grad = (grad.float() * self.weight.detach().float()).sum() if grad is not None else None
        self.last_grad = float(self.log_scale.grad) if grad is not None else 0.0
        self.weight.grad = None

    def apply(self) -> None:
        """Write w0 * exp(s) into the model (the policy the engine samples from is the trained model)."""
        import torch

        with torch.no_grad():
            self.weight.copy_(self.base * self.log_scale.detach().exp().to(self.base.dtype))

    def restore(self, log_scale: float) -> None:
        """Resume: the loaded model already holds w0 * exp(s); recover w0 and s."""
        import math

        import torch

        with torch.no_grad():
            self.log_scale.fill_(log_scale)
            self.base = self.weight.detach().clone() / math.exp(log_scale)


class TorchOptimizer:
    """AdamW over the model's trainable parameters with gradient-norm clipping and an LR schedule; with
    `logit_scale_lr`, also a learned inverse temperature (LogitScale) in a param group of its own, in place of the
    final norm's weight."""

    def __init__(self, model, learning_rate: float, weight_decay: float, max_grad_norm: float,
                 scheduler: str, warmup_steps: int, total_steps: int, adam_epsilon: float = 1e-8,
                 logit_scale_lr: float | None = None):
        import torch

        self.model = model
        self.max_grad_norm = max_grad_norm
        self.logit_scale = LogitScale(model) if logit_scale_lr else None
        skip = self.logit_scale.weight if self.logit_scale else None
        self.params = [p for p in model.parameters() if p.requires_grad and p is not skip]
        groups = [{"params": self.params}] if self.params else []
        if self.logit_scale:
            groups.append({"params": [self.logit_scale.log_scale], "lr": logit_scale_lr, "weight_decay": 0.0})
        self.optimizer = torch.optim.AdamW(groups, lr=learning_rate, weight_decay=weight_decay, eps=adam_epsilon)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                           lr_lambda(scheduler, warmup_steps, total_steps))

    def backward(self, loss, sync: bool = True) -> None:
        """Accumulate gradients (`sync` marks the last micro-batch of a mini-batch; plain torch needs no marker)."""
        loss.backward()

    def step(self) -> float:
        """Clip, apply and clear the accumulated gradients; return the gradient norm (of the model's trained weights)
        before clipping. The logit scale's step is Adam's on its own gradient, which needs no clipping."""
        import torch

        if self.logit_scale:
            self.logit_scale.collect_grad()
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm) if self.params else torch.zeros(())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.logit_scale:
            self.logit_scale.apply()
        return float(norm)

    def schedule_step(self) -> None:
        """Advance the LR schedule by one RL step (also when DAPO found nothing to train on this step)."""
        advance_schedule(self.scheduler)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def extra_stats(self) -> dict[str, float]:
        """policy/* metrics of the wrapper itself: the learned logit scale (and so the temperature it samples at)."""
        if not self.logit_scale:
            return {}
        return {"logit_scale": self.logit_scale.scale, "logit_scale_grad": self.logit_scale.last_grad}

    def unwrap(self):
        return self.model

    def save(self, directory: str | Path) -> None:
        import torch

        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.logit_scale:
            state["log_scale"] = float(self.logit_scale.log_scale.detach())
        torch.save(state, Path(directory) / OPTIMIZER_FILE)

    def load(self, directory: str | Path) -> None:
        import torch

        state = torch.load(Path(directory) / OPTIMIZER_FILE, weights_only=False)
        if ("log_scale" in state) != bool(self.logit_scale):
            saved = "with" if "log_scale" in state else "without"
            raise UserError(f"{directory} was saved {saved} a learned logit scale (rl.logit_scale_lr), and this run is "
                            f"configured {'with' if self.logit_scale else 'without'} one, so it cannot resume from it: "
                            "restore the run's rl.logit_scale_lr, or delete checkpoints/rl for a fresh start")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.logit_scale:
            self.logit_scale.restore(state["log_scale"])


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


def single_process_defaults(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Make a plain `star rl` (no `accelerate launch` / `torchrun`) a DeepSpeed world of one process.

    Without these variables DeepSpeed goes looking for an MPI launcher. Variables a launcher already set are kept;
    returns the ones it set."""
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    if "WORLD_SIZE" in environ or "RANK" in environ:
        return {}
    added = {key: value for key, value in defaults.items() if key not in environ}
    environ.update(added)
    return added


class AccelerateOptimizer:
    """AdamW under `accelerate` with a DeepSpeed ZeRO plugin (multi-GPU and multi-node through `accelerate launch`).

    Gradient accumulation is ours, not DeepSpeed's: the config says 1 accumulation step (so DeepSpeed never rescales
    the loss, which `aggregate_loss` already normalised by the whole mini-batch) and `backward(loss, sync=False)`
    marks the micro-batches before the last one as not being an accumulation boundary.
    """

    def __init__(self, model, learning_rate: float, weight_decay: float, max_grad_norm: float,
                 scheduler: str, warmup_steps: int, total_steps: int, zero_stage: int,
                 adam_epsilon: float = 1e-8):
        require_gpu_extra("deepspeed", "rl.distributed.strategy: deepspeed")
        import torch
        from accelerate import Accelerator
        from accelerate.utils import DeepSpeedPlugin

        from accelerate.state import AcceleratorState, GradientState

        single_process_defaults()
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
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(scheduler, warmup_steps, total_steps))
        self.base_optimizer = optimizer
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)

    def backward(self, loss, sync: bool = True) -> None:
        """Backward through the DeepSpeed engine; it reduces gradients and steps only when `sync` is True."""
        self.accelerator.deepspeed_engine_wrapped.backward(loss, sync_gradients=sync)

    def step(self) -> float:
        """DeepSpeed stepped (with clipping) in the last `backward`; return its global gradient norm."""
        norm = self.accelerator.deepspeed_engine_wrapped.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def schedule_step(self) -> None:
        advance_schedule(self.scheduler)

    def extra_stats(self) -> dict[str, float]:
        return {}

    @property
    def lr(self) -> float:
        return float(self.base_optimizer.param_groups[0]["lr"])

    def unwrap(self):
        return self.accelerator.unwrap_model(self.model)

    def save(self, directory: str | Path) -> None:
        import torch

        self.accelerator.save_state(str(Path(directory) / "accelerate"))
        torch.save({"scheduler": self.scheduler.state_dict()}, Path(directory) / OPTIMIZER_FILE)

    def load(self, directory: str | Path) -> None:
        import torch

        self.accelerator.load_state(str(Path(directory) / "accelerate"))
        self.scheduler.load_state_dict(torch.load(Path(directory) / OPTIMIZER_FILE, weights_only=False)["scheduler"])


def build_optimizer(model, params, total_steps: int):
    """The optimiser wrapper for `params.distributed.strategy` (RLParams)."""
    select_trainable(model, params.trainable_parameters)
    warmup = int(params.warmup_ratio * total_steps)
    common = dict(learning_rate=params.learning_rate, weight_decay=params.weight_decay,
                  adam_epsilon=params.adam_epsilon, max_grad_norm=params.max_grad_norm, scheduler=params.lr_scheduler_type,
                  warmup_steps=warmup, total_steps=total_steps)
    if params.distributed.strategy == "deepspeed":
        if params.logit_scale_lr:
            raise UserError("rl.logit_scale_lr is implemented for the plain torch optimiser only: set "
                            "rl.distributed.strategy: none, or rl.logit_scale_lr: null with deepspeed")
        return AccelerateOptimizer(model, zero_stage=params.distributed.zero_stage, **common)
    return TorchOptimizer(model, logit_scale_lr=params.logit_scale_lr, **common)
