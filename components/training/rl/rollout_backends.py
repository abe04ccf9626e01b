"""Rollout backends, registered by the name `rl.rollout.backend` resolves to (`auto`: the vLLM engine where its
environment exists, transformers otherwise; resolved once, where the run is built): each owns how its sampling
policy is built, its greedy twin for evaluation during training, and the weight sync that keeps it equal to the
trainer after every update.

- `hf`: transformers samples with the very model being trained (`HFPolicy`); nothing to sync, unless the trainer is
  sharded and the rollouts run on a full copy of their own (`ModuleWeightSync` fills it).
- `vllm`: the rollout engine process (`VLLMPolicy`, components/agent/engine_client.py) loaded from the checkpoint,
  its weights pushed after every update (`EngineWeightSync`); its log-probs come from another engine than the
  trainer's, so the mismatch is measured every step.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from components.agent.sampling import Sampling, engine_options, resolve_backend
from components.agent.engine_client import require_engine_python
from components.agent.hf import HFPolicy
from components.agent.types import Policy
from components.agent.vllm_backend import VLLMPolicy
from components.training.rl.weight_sync import EngineWeightSync, ModuleWeightSync, NoWeightSync, WeightSync


@dataclass(frozen=True)
class PolicyInputs:
    """What a backend builds the rollout policy from: the trained model (transformers samples with it), the
    checkpoint directory the engine loads, and how to sample."""

    model: object
    tokenizer: object
    checkpoint: str
    sampling: Sampling
    device: str


@dataclass(frozen=True)
class RolloutBackend:
    name: str
    build: Callable[[PolicyInputs], Policy]
    greedy: Callable[[Policy], Policy]  # the same weights, decoded greedily (a fresh twin per evaluation)
    weight_sync: Callable[[Policy, bool], WeightSync]  # (policy, samples with a copy of its own) -> the sync
    separate_engine: bool  # its log-probs come from another engine: the mismatch is measured on every step


def transformers_policy(inputs: PolicyInputs) -> Policy:
    s = inputs.sampling
    return HFPolicy(inputs.model, inputs.tokenizer, temperature=s.temperature, top_p=s.top_p, greedy=s.greedy,
                    seed=s.seed, max_batch_size=s.max_batch_size, chunk_tokens=s.chunk_tokens)


def transformers_sync(policy: HFPolicy, own_copy: bool) -> WeightSync:
    return ModuleWeightSync(policy.model) if own_copy else NoWeightSync()


def engine_policy(inputs: PolicyInputs) -> Policy:
    require_engine_python()  # a clear error with the command that builds the engine's environment
    s = inputs.sampling
    return VLLMPolicy(inputs.checkpoint, tokenizer=inputs.tokenizer, temperature=s.temperature, top_p=s.top_p,
                      greedy=s.greedy, seed=s.seed, options=engine_options(inputs.checkpoint, s))


def engine_sync(policy: VLLMPolicy, own_copy: bool) -> WeightSync:
    return EngineWeightSync(policy.engine)  # the engine always holds its own copy


ROLLOUT_BACKENDS: dict[str, RolloutBackend] = {
    "hf": RolloutBackend("hf", transformers_policy, lambda policy: policy.twin(greedy=True), transformers_sync,
                         separate_engine=False),
    "vllm": RolloutBackend("vllm", engine_policy, lambda policy: policy.twin(greedy=True), engine_sync,
                           separate_engine=True),
}


def rollout_backend(name: str, device: str | None = None) -> RolloutBackend:
    """The backend `name` (auto | hf | vllm) resolves to; `auto` logs its choice and why."""
    return ROLLOUT_BACKENDS[resolve_backend(name, device)]


def rollout_sampling(rollout, seed: int, dtype: str) -> Sampling:
    """The rollout params (RolloutParams) as a backend's `Sampling`; `dtype` is the trainer's compute dtype (the
    engine's, so that its log-probs are of the same arithmetic)."""
    return Sampling(temperature=rollout.temperature, top_p=rollout.top_p, seed=seed,
                    max_batch_size=rollout.max_batch_size, chunk_tokens=rollout.chunk_tokens, dtype=dtype,
                    gpu_memory_utilization=rollout.gpu_memory_utilization,
                    max_model_len=rollout.max_context_tokens, sleep_mode=rollout.release_engine_memory)
