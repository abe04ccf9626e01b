"""What validate and ood_qa share: the loop limits and decoding params, and loading a checkpoint directory (or Hub
name) as a token policy, the same code for base, SFT, RL and any Hugging Face checkpoint a user names."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from components.agent.backends import Sampling, checkpoint_policy
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
    chunk_tokens: int | None = Field(None, ge=1)  # transformers: decode turns in rounds of this many tokens over the
    # episodes still writing (None: every row of a call runs until the last ends; see components/agent/hf.py)
    decoder: Literal["auto", "lean", "generate"] = "auto"  # transformers: the lean CPU decoder (auto: Qwen2 on a
    # CPU) or `generate`; the same greedy tokens, a different random stream when sampling (components/agent/hf.py)
    backend: Literal["auto", "hf", "vllm"] = "auto"  # auto: vLLM on a GPU when installed, else transformers
    dtype: str = "auto"
    device: str | None = None
    gpu_memory_utilization: float = Field(0.8, gt=0.0, le=1.0)


def load_checkpoint_policy(model: str | Path, decoding: DecodingParams, max_model_len: int | None = None):
    """(policy, tokenizer) for `model` with the decoding params; temperature 0 means greedy decoding."""
    from components.models.loading import load_tokenizer

    greedy = decoding.temperature <= 0
    sampling = Sampling(temperature=decoding.temperature if not greedy else 1.0, top_p=decoding.top_p,
                        greedy=greedy, seed=decoding.seed, max_batch_size=decoding.batch_size,
                        chunk_tokens=decoding.chunk_tokens, decoder=decoding.decoder, dtype=decoding.dtype,
                        gpu_memory_utilization=decoding.gpu_memory_utilization, max_model_len=max_model_len)
    tokenizer = load_tokenizer(model)
    policy = checkpoint_policy(model, tokenizer, sampling, backend=decoding.backend, device=decoding.device)
    return policy, tokenizer
