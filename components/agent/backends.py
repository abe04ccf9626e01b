"""Choosing and building a token policy backend for a checkpoint: the vLLM rollout engine where its environment
exists (.venv-engine, built by scripts/bootstrap.sh), transformers otherwise. RL rollouts and evaluation both build
their policy here.

    sampling = Sampling(temperature=1.0, top_p=1.0, seed=0)
    policy = checkpoint_policy("models/sft", tokenizer, sampling, backend="auto")

`Sampling` and the backend choice live in components/agent/sampling.py, which imports no model library. vLLM runs
in its own process and environment (`components/agent/engine_client.py`); this environment never imports it.
"""
from __future__ import annotations

from pathlib import Path

from components.agent import vllm_backend
from components.agent.hf import HFPolicy
from components.agent.sampling import Sampling, engine_options, resolve_backend
from components.agent.types import Policy
from components.models import loading


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
