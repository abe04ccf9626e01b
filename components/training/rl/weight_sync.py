"""WeightSync: keep the rollout engine's weights equal to the trainer's after every update.

- transformers rollouts (CPU, tests): the engine samples with the trained model object itself: nothing to do.
- vLLM rollouts (the engine process, CPU or GPU): after each update, the trainer's parameters (gathered first under
  DeepSpeed ZeRO-3, where each rank holds a shard) go to the engine as one safetensors file on tmpfs, which it loads
  through vLLM's in-place reload (`reload_weights`), re-tying a tied output layer, then resets its prefix cache,
  whose keys and values were computed with the old weights (components/agent/engine_server.py).
- a sharded trainer (`rl.distributed.strategy: fsdp2`): the engine holds its own full copy of the weights (vLLM's,
  or with transformers rollouts a model of its own, `ModuleWeightSync`); each parameter is gathered from the ranks'
  shards (`full_tensor`, a collective: every rank pushes) one at a time. `ModuleWeightSync` copies each in before
  the next is gathered; the engine's push collects them into the file it hands over, in host memory.
- between the phases (`release`, before each update): a vLLM engine built with sleep mode
  (`rl.rollout.release_engine_memory`, auto: on a GPU; vLLM's CPU worker has none) sleeps at level 1 (KV cache
  freed, weights offloaded to CPU) so that the update has the GPU memory the rollouts used; the next push wakes its
  weights, loads the new ones, then wakes the KV cache, the order of verl's hybrid engine. The other syncs hold no engine memory to release.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import torch
from torch.distributed.tensor import DTensor


class WeightSync(Protocol):
    """Keeps a rollout policy's weights equal to the trainer's: `push(model)` after each update (returns the number
    of tensors sent), `release()` before it (an engine frees the memory the update needs)."""

    def push(self, model) -> int: ...
    def release(self) -> None: ...


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


class EngineWeightSync:
    """Push trainer weights into the vLLM rollout engine process (`VLLMPolicy.engine`, components/agent/
    engine_client.py); an engine built in sleep mode sleeps between the phases."""

    def __init__(self, engine):
        self.engine = engine
        self.sleeps = engine.sleeps
        self.asleep = False
        self.pushes = 0

    def release(self) -> None:
        """Before an update: the engine sleeps (level 1: KV cache freed, weights offloaded to CPU) where it can."""
        if self.sleeps and not self.asleep:
            self.engine.sleep(level=1)
            self.asleep = True

    def push(self, model) -> int:
        """Send every parameter (gathered, LoRA merged) to the engine, which loads them through vLLM's reload path
        and resets its prefix cache; its weights are woken first and its KV cache after. Returns the number of
        tensors sent."""
        if self.asleep:
            self.engine.wake_up(tags=["weights"])
        sent = self.engine.push_weights(gathered_parameters(model))
        if self.asleep:
            self.engine.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.pushes += 1
        return sent
