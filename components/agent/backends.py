"""Choosing and building a token policy backend for a checkpoint: vLLM on a GPU when it is installed, transformers
otherwise. RL rollouts and evaluation both build their policy here.

    sampling = Sampling(temperature=1.0, top_p=1.0, seed=0)
    policy = checkpoint_policy("models/sft", tokenizer, sampling, backend="auto", device="cuda")

vLLM, an optional GPU dependency, is imported only when its backend is built (`components/agent/vllm_backend.py`).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from components.agent import vllm_backend
from components.agent.hf import HFPolicy
from components.agent.types import Policy
from components.models import loading

BACKENDS = ("auto", "hf", "vllm")


@dataclass(frozen=True)
class Sampling:
    """How a backend samples, and how it holds the model.

    `greedy` decodes by argmax (temperature and top_p are then ignored); `max_batch_size` caps the episodes of one
    transformers generate call (None: all); `dtype`, `gpu_memory_utilization` and `max_model_len` configure the vLLM
    engine (`dtype` also the transformers model when it is loaded here)."""

    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    seed: int = 0
    max_batch_size: int | None = None
    chunk_tokens: int | None = None  # transformers: decode a turn in rounds of this many tokens over the open episodes
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.8
    max_model_len: int | None = None
    sleep_mode: bool = False  # vLLM: an engine that can sleep between rollout phases (`VLLMPolicy.sleep_mode`)


def vllm_available() -> bool:
    """Whether the vllm package is installed (it is not imported)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(backend: str, device: str | None = None) -> str:
    """`hf` or `vllm`: `auto` is vLLM when vllm is installed and the device is a CUDA GPU (`device` None or `auto`:
    whether torch sees one), transformers otherwise; `hf` and `vllm` are kept as given."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown policy backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if not vllm_available():
        return "hf"
    return "vllm" if loading.resolve_device(device).startswith("cuda") else "hf"


def checkpoint_policy(checkpoint: str | Path, tokenizer, sampling: Sampling, backend: str = "auto",
                      device: str | None = None, model=None) -> Policy:
    """The Policy for the checkpoint directory (or Hub name) `checkpoint` with `sampling`.

    vLLM loads the checkpoint into its own engine. Transformers samples from `model` when given (RL samples with the
    very model it trains), else from the checkpoint loaded on `device` (None: the default device)."""
    if resolve_backend(backend, device) == "vllm":
        return vllm_backend.VLLMPolicy(str(checkpoint), tokenizer=tokenizer, temperature=sampling.temperature,
                                       top_p=sampling.top_p, greedy=sampling.greedy, seed=sampling.seed,
                                       dtype=sampling.dtype, max_model_len=sampling.max_model_len,
                                       gpu_memory_utilization=sampling.gpu_memory_utilization,
                                       sleep_mode=sampling.sleep_mode)

    if model is None:
        model = loading.load_policy_model(checkpoint, dtype=sampling.dtype, device=device)
    return HFPolicy(model, tokenizer, temperature=sampling.temperature, top_p=sampling.top_p, greedy=sampling.greedy,
                    seed=sampling.seed, max_batch_size=sampling.max_batch_size, chunk_tokens=sampling.chunk_tokens)
