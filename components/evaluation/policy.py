"""What validate and ood_qa share: the loop limits (`components/agent/params.py`) and decoding params, and loading a
checkpoint directory (or Hub name) as a token policy, the same code for base, SFT, RL and any Hugging Face checkpoint
a user names."""
from __future__ import annotations

from pathlib import Path

from components.agent.backends import Sampling, checkpoint_policy
from components.agent.params import DecodingParams, LimitsParams
from components.models.loading import load_tokenizer

__all__ = ["DecodingParams", "LimitsParams", "load_checkpoint_policy"]


def load_checkpoint_policy(model: str | Path, decoding: DecodingParams, max_model_len: int | None = None):
    """(policy, tokenizer) for `model` with the decoding params; temperature 0 means greedy decoding."""
    greedy = decoding.temperature <= 0
    sampling = Sampling(temperature=decoding.temperature if not greedy else 1.0, top_p=decoding.top_p,
                        greedy=greedy, seed=decoding.seed, max_batch_size=decoding.batch_size,
                        chunk_tokens=decoding.chunk_tokens, dtype=decoding.dtype,
                        gpu_memory_utilization=decoding.gpu_memory_utilization, max_model_len=max_model_len)
    tokenizer = load_tokenizer(model)
    policy = checkpoint_policy(model, tokenizer, sampling, backend=decoding.backend, device=decoding.device)
    return policy, tokenizer
