"""Choosing and building a token policy backend for a checkpoint: the vLLM rollout engine where its environment
exists (.venv-engine, built by scripts/bootstrap.sh), transformers otherwise. RL rollouts and evaluation both build
their policy here.

    sampling = Sampling(temperature=1.0, top_p=1.0, seed=0)
    policy = checkpoint_policy("models/sft", tokenizer, sampling, backend="auto")

vLLM runs in its own process and environment (`components/agent/engine_client.py`); this environment never imports
it.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from components.agent import vllm_backend
from components.agent.engine_client import EngineOptions, engine_python
from components.agent.hf import HFPolicy
from components.agent.types import Policy
from components.models import loading

BACKENDS = ("auto", "hf", "vllm")


@dataclass(frozen=True)
class Sampling:
    """How a backend samples, and how it holds the model.

    `greedy` decodes by argmax (temperature and top_p are then ignored); `max_batch_size` caps the episodes of one
    transformers generate call (None: all); `dtype`, `gpu_memory_utilization`, `max_model_len`, `sleep_mode` and
    `threads` configure the vLLM engine (`dtype` also the transformers model when it is loaded here)."""

    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    seed: int = 0
    max_batch_size: int | None = None
    chunk_tokens: int | None = None  # transformers: decode a turn in rounds of this many tokens over the open episodes
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.8
    max_model_len: int | None = None
    sleep_mode: bool | str = "auto"  # vLLM: an engine that sleeps between rollout phases (auto: where it can, a GPU)
    threads: int = 1  # vLLM on CPU: the engine's torch threads


def engine_available() -> bool:
    """Whether the rollout engine's environment exists (`engine_client.engine_python`)."""
    return engine_python() is not None


def resolve_backend(backend: str, device: str | None = None, log: bool = True) -> str:
    """`hf` or `vllm`: `auto` is the vLLM engine where its environment exists, transformers otherwise (printed, with
    the reason, when `log`); `hf` and `vllm` are kept as given. (`device` is the transformers model's; the engine runs
    where its environment was built for.)"""
    if backend not in BACKENDS:
        raise ValueError(f"unknown policy backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    python = engine_python()
    chosen = "hf" if python is None else "vllm"
    if log:
        why = f"the engine environment {python}" if python is not None else "no engine environment (.venv-engine)"
        print(f"[policy] backend auto -> {chosen} ({why})", file=sys.stderr, flush=True)
    return chosen


def checkpoint_dtype(checkpoint: str | Path) -> str:
    """The dtype a checkpoint's config records (`auto` when it records none or is not a local directory): the
    engine's `auto` would otherwise run a float32 checkpoint in bfloat16, where transformers' `auto` keeps float32."""
    config = Path(checkpoint) / "config.json"
    if not config.is_file():
        return "auto"
    data = json.loads(config.read_text())
    dtype = data.get("dtype") or data.get("torch_dtype")
    return dtype if dtype in ("float32", "bfloat16", "float16") else "auto"


def engine_options(checkpoint: str | Path, sampling: Sampling) -> EngineOptions:
    """The engine's options for serving `checkpoint` with `sampling`."""
    dtype = checkpoint_dtype(checkpoint) if sampling.dtype == "auto" else sampling.dtype
    return EngineOptions(dtype=dtype, seed=sampling.seed, max_model_len=sampling.max_model_len,
                         threads=sampling.threads, gpu_memory_utilization=sampling.gpu_memory_utilization,
                         sleep_mode=sampling.sleep_mode)


def checkpoint_policy(checkpoint: str | Path, tokenizer, sampling: Sampling, backend: str = "auto",
                      device: str | None = None, model=None) -> Policy:
    """The Policy for the checkpoint directory (or Hub name) `checkpoint` with `sampling`.

    vLLM loads the checkpoint into its own engine process (stopped by the policy's `close`, or when this process
    exits). Transformers samples from `model` when given (RL samples with the very model it trains), else from the
    checkpoint loaded on `device` (None: the default device)."""
    if resolve_backend(backend, device) == "vllm":
        return vllm_backend.VLLMPolicy(str(checkpoint), tokenizer=tokenizer, temperature=sampling.temperature,
                                       top_p=sampling.top_p, greedy=sampling.greedy, seed=sampling.seed,
                                       options=engine_options(checkpoint, sampling))

    if model is None:
        model = loading.load_policy_model(checkpoint, dtype=sampling.dtype, device=device)
    return HFPolicy(model, tokenizer, temperature=sampling.temperature, top_p=sampling.top_p, greedy=sampling.greedy,
                    seed=sampling.seed, max_batch_size=sampling.max_batch_size, chunk_tokens=sampling.chunk_tokens)
