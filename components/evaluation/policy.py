"""What validate and ood_qa share: the loop limits and decoding params, and loading a checkpoint directory (or Hub
name) as a token policy, the same code for base, SFT, RL and any Hugging Face checkpoint a user names."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import Field

from components.agent.loop import Limits
from components.params import Params


class LimitsParams(Params):
    """Per-episode limits of the agent loop."""

    max_turns: int = Field(30, ge=1)
    max_tokens_per_turn: int = Field(512, ge=1)
    max_context_tokens: int = Field(8192, ge=64)
    max_protocol_errors: int = Field(3, ge=1)

    def to_limits(self) -> Limits:
        """The loop's `Limits`."""
        return Limits(**self.model_dump())


class DecodingParams(Params):
    """Sampling for evaluation: greedy by default (temperature 0), so that a run is reproducible."""

    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0
    batch_size: int = Field(16, ge=1)  # episodes per generate call (transformers backend)
    backend: Literal["auto", "hf", "vllm"] = "auto"  # auto: vLLM on a GPU when installed, else transformers
    dtype: str = "auto"
    device: str | None = None
    gpu_memory_utilization: float = Field(0.8, gt=0.0, le=1.0)


def resolve_backend(backend: str) -> str:
    """`hf` or `vllm`: `auto` picks vLLM when a CUDA GPU is visible and the vllm package is installed."""
    if backend != "auto":
        return backend
    if importlib.util.find_spec("vllm") is None:
        return "hf"
    import torch

    return "vllm" if torch.cuda.is_available() else "hf"


def load_checkpoint_policy(model: str | Path, decoding: DecodingParams, max_model_len: int | None = None):
    """(policy, tokenizer) for `model` with the decoding params; temperature 0 means greedy decoding."""
    from components.models.loading import load_tokenizer

    greedy = decoding.temperature <= 0
    temperature = decoding.temperature if not greedy else 1.0
    tokenizer = load_tokenizer(model)
    if resolve_backend(decoding.backend) == "vllm":
        from components.agent.vllm_backend import VLLMPolicy

        policy = VLLMPolicy(str(model), tokenizer=tokenizer, temperature=temperature, top_p=decoding.top_p,
                            greedy=greedy, seed=decoding.seed, dtype=decoding.dtype, max_model_len=max_model_len,
                            gpu_memory_utilization=decoding.gpu_memory_utilization)
        return policy, tokenizer
    from components.agent.hf import HFPolicy
    from components.models.loading import load_policy_model

    network = load_policy_model(model, dtype=decoding.dtype, device=decoding.device)
    policy = HFPolicy(network, tokenizer, temperature=temperature, top_p=decoding.top_p, greedy=greedy,
                      seed=decoding.seed, max_batch_size=decoding.batch_size)
    return policy, tokenizer
