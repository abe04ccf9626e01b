"""WeightSync: keep the rollout engine's weights equal to the trainer's after every update.

- transformers rollouts (CPU, tests): the engine samples with the trained model object itself: nothing to do.
- vLLM rollouts (GPU, colocated): after each update, stream the trainer's parameters into the vLLM model with
  `load_weights` (gathered first under DeepSpeed ZeRO-3, where each rank holds a shard) and reset the prefix cache,
  whose cached keys/values were computed with the old weights. Pin the vLLM version in the [gpu] extra: the path to
  the model inside the engine is not a stable API.
- a sharded trainer (`rl.distributed.strategy: fsdp2`): the engine holds its own full copy of the weights (vLLM's,
  or with transformers rollouts a model of its own, `ModuleWeightSync`); each parameter is gathered from the ranks'
  shards (`full_tensor`, a collective: every rank pushes) and copied in before the next one is gathered, so the whole
  trained model is never gathered at once.
- between the phases (`release`, before each update): a vLLM engine built with sleep mode
  (`rl.rollout.release_engine_memory`) sleeps at level 1 (KV cache freed, weights offloaded to CPU) so that the
  update has the GPU memory the rollouts used; the next push wakes its weights, loads the new ones, then wakes the
  KV cache, the order of verl's hybrid engine. The other syncs hold no engine memory to release.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor


class NoWeightSync:
    """The engine is the trained model."""

    def push(self, model) -> int:
        return 0

    def release(self) -> None:
        """Nothing to release: the engine is the trained model."""


class ModuleWeightSync:
    """The engine samples with a transformers model of its own (a sharded trainer's rollouts): copy every trained
    parameter into it, one at a time."""

    def __init__(self, target: torch.nn.Module):
        self.target = target
        self.pushes = 0

    @torch.no_grad()
    def push(self, model) -> int:
        """Copy `model`'s parameters into the engine's model (same names); return the number of tensors copied."""
        targets = dict(self.target.named_parameters())
        sent = 0
        for name, tensor in gathered_parameters(model):
            if name not in targets:
                raise KeyError(f"the rollout model has no parameter {name!r} to receive the trained weights")
            targets[name].copy_(tensor)
            sent += 1
        self.pushes += 1
        return sent

    def release(self) -> None:
        """Nothing to release: a transformers rollout model holds no cache between generate calls."""


def gathered_parameters(model) -> Iterator[tuple[str, object]]:
    """(name, full tensor) for every parameter; under ZeRO-3 and FSDP2 each one is gathered from its shards first
    (one at a time); with LoRA adapters, the base's weights with the adapters merged in, under the base's names."""
    from components.training.rl.lora import has_lora, merged_parameters

    if has_lora(model):
        yield from merged_parameters(model)
        return
    zero3 = any(hasattr(p, "ds_id") for p in model.parameters())
    for name, param in model.named_parameters():
        if zero3:
            import deepspeed

            ctx = deepspeed.zero.GatheredParameters([param], modifier_rank=None)
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            yield name, param.data.full_tensor() if isinstance(param.data, DTensor) else param.data


def vllm_inner_model(llm):
    """The torch module inside a colocated vLLM engine (V0 and V1 single-process layouts)."""
    executor = llm.llm_engine.model_executor
    worker = getattr(executor, "driver_worker", None)
    for path in (("model_runner", "model"), ("worker", "model_runner", "model")):
        node = worker
        for attr in path:
            node = getattr(node, attr, None)
        if node is not None:
            return node
    raise RuntimeError(
        "cannot reach the model inside this vLLM engine to load weights: use the vLLM version pinned in the [gpu] "
        "extra, colocated in one process (VLLM_ENABLE_V1_MULTIPROCESSING=0)"
    )


class VLLMWeightSync:
    """Push trainer weights into a colocated vLLM engine (`VLLMPolicy.llm`); with `sleeps` (an engine built in sleep
    mode) put it to sleep between the phases."""

    def __init__(self, llm, sleeps: bool = False):
        self.llm = llm
        self.sleeps = sleeps
        self.asleep = False
        self.pushes = 0

    def release(self) -> None:
        """Before an update: the engine sleeps (level 1: KV cache freed, weights offloaded to CPU)."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def push(self, model) -> int:
        """Load every parameter into vLLM (its weights woken first, its KV cache after); return the number of
        tensors sent."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        inner = vllm_inner_model(self.llm)
        sent = 0
        for name, tensor in gathered_parameters(model):
            inner.load_weights([(name, tensor)])
            sent += 1
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()
        self.pushes += 1
        return sent


def build_weight_sync(policy, own_copy: bool = False):
    """VLLMWeightSync for a vLLM policy; for a transformers policy, ModuleWeightSync into its model when it samples
    with a copy of its own (`own_copy`: a sharded trainer), else NoWeightSync."""
    llm = getattr(policy, "llm", None)
    if llm is not None:
        return VLLMWeightSync(llm, sleeps=getattr(policy, "sleep_mode", False))
    return ModuleWeightSync(policy.model) if own_copy else NoWeightSync()
