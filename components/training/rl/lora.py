"""LoRA through peft: RL trains low-rank adapters on a frozen base, the option for a model whose full-weight training
state does not fit its GPU (`star rl --plan`; the qwen2.5-7b preset).

The adapters are injected into the model's own modules (`attach_lora` returns the Hugging Face model, adapters in
place), so the trainer, the lean decoder and the loss see one model as with full weights: the frozen base in
`rl.dtype`, the adapters (the only trainable parameters, what AdamW steps) in float32. A checkpoint holds the adapters
alone (`adapter_model.safetensors`, resumed onto the stage's input model); the final model is the base with the
adapters merged in, an ordinary checkpoint for the stages after RL; the vLLM weight sync streams merged weights under
the base model's parameter names (`merged_parameters`).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from components.errors import UserError
from components.training.rl.params import LoraParams

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_NAME = "default"
BASE_LAYER = ".base_layer."


def import_peft():
    """The `peft` module, or a UserError saying how to install it."""
    try:
        import peft
    except ImportError as exc:
        raise UserError("rl.lora.enabled needs the peft package: pip install peft (or turn rl.lora.enabled off)") \
            from exc
    return peft


def attach_lora(model: torch.nn.Module, lora: LoraParams, adapter_dir: Path | None = None):
    """(`model` with LoRA adapters injected and only they trainable, the PeftModel that owns them); the adapters'
    weights come from `adapter_dir` (a checkpoint) when given, else fresh (B = 0: the model starts as the base)."""
    peft = import_peft()
    config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
    wrapped = peft.get_peft_model(model, config)
    for param in wrapped.parameters():  # the adapters train in float32 whatever the base's dtype
        if param.requires_grad:
            param.data = param.data.float()
    if adapter_dir is not None:
        path = Path(adapter_dir) / ADAPTER_FILE
        if not path.is_file():
            raise UserError(f"checkpoint {adapter_dir} holds no LoRA adapters ({ADAPTER_FILE}); it was not written "
                            "by a run with rl.lora.enabled")
        peft.set_peft_model_state_dict(wrapped, load_file(path))
    return wrapped.get_base_model(), wrapped


def save_adapters(wrapped, directory: str | Path) -> None:
    """Write the adapters' weights (safetensors) into `directory`."""
    peft = import_peft()
    state = peft.get_peft_model_state_dict(wrapped)
    save_file({name: tensor.detach().contiguous().cpu() for name, tensor in state.items()},
              Path(directory) / ADAPTER_FILE)


def merged_model(wrapped) -> torch.nn.Module:
    """The base model with the adapters merged into its weights (an ordinary Hugging Face model; ends training)."""
    return wrapped.merge_and_unload()


def has_lora(model: torch.nn.Module) -> bool:
    return any(".lora_A." in name for name, _ in model.named_parameters())


@torch.no_grad()
def merged_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every base parameter under the base model's own names, each LoRA-wrapped weight with its
    adapter's update W + scale * B A merged in: what a rollout engine without LoRA loads."""
    peft = import_peft()
    layers = {name: module for name, module in model.named_modules()
              if isinstance(module, peft.tuners.lora.LoraLayer)}
    for name, param in model.named_parameters():
        if ".lora_" in name:
            continue
        if BASE_LAYER not in name:
            yield name, param.data
            continue
        owner, leaf = name.rsplit(BASE_LAYER, 1)
        tensor = param.data
        if leaf == "weight" and owner in layers:
            tensor = tensor + layers[owner].get_delta_weight(ADAPTER_NAME).to(tensor.dtype)
        yield f"{owner}.{leaf}", tensor
