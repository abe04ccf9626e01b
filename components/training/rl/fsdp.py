"""`rl.distributed.strategy: fsdp2`: the policy sharded over the processes of the world with torch's FSDP2
(`torch.distributed.fsdp.fully_shard`), behind the optimiser interface of optim.py.

Layout (verl's default FSDP2 engine): each decoder layer is its own FSDP unit, and the root unit is a
`PolicyLogits` module (components/training/rl/update.py) that holds the Hugging Face model, so that the embeddings,
the final norm and the output layer are gathered around the one call that computes a micro-batch's logits. Each rank
keeps 1/N of every parameter as float32 master weights (a DTensor shard), of its gradient and of AdamW's moments;
a forward gathers one unit at a time in `rl.dtype` (`MixedPrecisionPolicy`), gradients are reduce-scattered in float32.

The update equals one process's on the same global batch: the loss of each rank is its share of the loss normalised
over the global batch, so the ranks' gradients must be summed, not averaged: every unit's gradient divide factor is
1 with sum-only reductions. Clipping takes the norm over all shards (`total_norm`). Every forward is a collective,
so the update runs the same number of passes on every rank (`update.in_lockstep`).

Checkpoints are sharded: torch.distributed.checkpoint (DCP) writes the model and optimiser state dicts as each rank's
shards plus a metadata file into `<checkpoint>/sharded/` (every rank writes its own: several machines need a shared
filesystem for the checkpoint folder); DCP reshards them onto another number of processes when a run resumes with
one. The final model is gathered to rank 0 on the CPU, one full state dict, and written as an ordinary Hugging Face
checkpoint. The rollout engine holds its own full copy of the weights (vLLM's, or a transformers model per rank),
which the weight sync fills one parameter at a time (weight_sync.py).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from components.errors import UserError
from components.training.rl.checkpoint import load_tree, save_tree
from components.training.rl.distributed import Ranks
from components.training.rl.adamw import ScheduledOptimizer
from components.training.rl.update import PolicyLogits
from components.training.schedule import lr_schedule

SHARDED_STATE = "sharded"  # <checkpoint>/sharded/: DCP's files (.metadata and one __<rank>_0.distcp a rank)
SCHEDULER_STATE = "scheduler"  # scheduler.json + scheduler.safetensors (rank 0's; the schedule is the same on all)
ROOT_PREFIX = "model."  # PolicyLogits holds the Hugging Face model as `model`


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a Hugging Face causal LM (Llama, Qwen2: `model.get_decoder().layers`)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise UserError(f"rl.distributed.strategy: fsdp2 shards each decoder layer, and {type(model).__name__} "
                        "has no decoder `layers` list: use a Llama- or Qwen2-style model, or strategy: none")
    return layers


def shard_model(model: torch.nn.Module, param_dtype: torch.dtype, ranks: Ranks) -> PolicyLogits:
    """`model` (float32, on this rank's device) sharded in place over the world: one FSDP unit per decoder layer,
    then the root `PolicyLogits` around it; computes in `param_dtype`, reduces gradients in float32 as sums."""
    if ranks.size < 2 or not torch.distributed.is_initialized():
        raise UserError("rl.distributed.strategy: fsdp2 shards the model over several processes: set "
                        "rl.distributed.processes: 2 or more (`star rl` starts torchrun itself), or strategy: none")
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (ranks.size,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    root = PolicyLogits(model)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(root, mesh=mesh, mp_policy=policy)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            # each rank's loss is its share of the globally normalised loss: gradients are summed over the ranks
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return root


def total_norm(parameters: list[torch.nn.Parameter]) -> torch.Tensor:
    """The L2 norm of all the gradients, over every rank's shards."""
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None], norm_type=2.0)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


class FSDPOptimizer(ScheduledOptimizer):
    """AdamW over the sharded float32 master weights (`shard_model`), with gradient clipping by the norm over all
    shards and the LR schedule; the same operations as `TorchOptimizer`. `model` is the FSDP root the update calls
    (`PolicyLogits`), `unwrap()` the Hugging Face model inside it (DTensor parameters). FSDP reduce-scatters each
    unit's gradients into the shards during the backward."""

    sharded = True

    def __init__(self, model, learning_rate: float, weight_decay: float, max_grad_norm: float,
                 scheduler: str, warmup_steps: int, total_steps: int, ranks: Ranks, adam_epsilon: float = 1e-8,
                 param_dtype: torch.dtype = torch.float32):
        self.ranks = ranks
        self.max_grad_norm = max_grad_norm
        self.model = shard_model(model, param_dtype, ranks)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=learning_rate, weight_decay=weight_decay, eps=adam_epsilon)
        self.base_optimizer = self.optimizer
        self.scheduler = lr_schedule(self.optimizer, scheduler, warmup_steps, total_steps)

    def step(self) -> float:
        """Clip the summed gradients by their norm over all shards, apply and clear them; return that norm."""
        norm = total_norm(self.params)
        torch.nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def unwrap(self):
        return self.model.model

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights under the Hugging Face names, gathered onto rank 0's CPU (a collective: every
        rank calls it; the others get {}). A tied weight appears once, under its first name (the input embeddings'),
        as `save_pretrained` writes it."""
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        seen, names = set(), []
        for name, tensor in self.unwrap().state_dict(keep_vars=True).items():
            if id(tensor) not in seen:
                seen.add(id(tensor))
                names.append(name)
        return {name: state[ROOT_PREFIX + name] for name in names if ROOT_PREFIX + name in state}

    def save(self, directory: str | Path) -> None:
        """Every rank writes its shards of the model and optimiser state (DCP) into `directory`/sharded; rank 0 the
        schedule. A collective."""
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state},
                 checkpoint_id=str(Path(directory) / SHARDED_STATE))
        if self.ranks.main:
            save_tree(directory, SCHEDULER_STATE, {"scheduler": self.scheduler.state_dict()})

    def load(self, directory: str | Path) -> None:
        """Read this rank's shards back from a checkpoint that `save` wrote (a collective)."""
        path = Path(directory) / SHARDED_STATE
        if not (path / ".metadata").is_file():
            raise UserError(f"checkpoint {directory} holds no sharded state ({path}/.metadata): it was not written "
                            "with rl.distributed.strategy: fsdp2. Move its folder away to start over")
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        self.scheduler.load_state_dict(load_tree(directory, SCHEDULER_STATE)["scheduler"])
