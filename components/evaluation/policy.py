"""What validate and ood_qa share: the loop limits (`components/agent/params.py`) and decoding params, and loading a
checkpoint directory (or Hub name) as a token policy, the same code for base, SFT, RL and any Hugging Face checkpoint
a user names."""
from __future__ import annotations

from pathlib import Path

from components.agent.params import DecodingParams, LimitsParams
from components.agent.sampling import prestart_engine

__all__ = ["DecodingParams", "LimitsParams", "load_checkpoint_policy", "prestart_checkpoint_engine"]


def prestart_checkpoint_engine(model: str | Path, decoding: DecodingParams, max_model_len: int | None = None) -> bool:
    """Start the engine that `load_checkpoint_policy(model, decoding, max_model_len)` will connect to, now, where
    the decoding runs on it: a stage calls this before its heavy imports and its MLflow run, which then overlap the
    engine's start. Returns whether an engine was started."""
    return prestart_engine(model, decoding.to_sampling(max_model_len), decoding.backend)


def load_checkpoint_policy(model: str | Path, decoding: DecodingParams, max_model_len: int | None = None):
    """(policy, tokenizer) for `model` with the decoding params; temperature 0 means greedy decoding."""
    from components.agent.backends import checkpoint_policy  # torch and transformers: imported when a stage runs
    from components.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model)
    policy = checkpoint_policy(model, tokenizer, decoding.to_sampling(max_model_len), backend=decoding.backend,
                               device=decoding.device)
    return policy, tokenizer
