"""The typed params every family that runs the agent loop shares, each declared once: an episode's limits, an
OpenAI-compatible endpoint, and how a checkpoint policy decodes. The families (teacher, validate, ood_qa, rl) nest
them in their own sections, so the YAML keys stay where they are."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from components.agent.http import EndpointConfig
from components.agent.loop import Limits
from components.agent.sampling import Sampling
from components.params import Params


class LimitsParams(Params):
    """Per-episode limits of the agent loop (`Limits`); reaching one ends the episode."""

    max_turns: int = Field(30, ge=1)
    max_tokens_per_turn: int = Field(512, ge=1)
    max_context_tokens: int = Field(8192, ge=64)
    max_protocol_errors: int = Field(3, ge=1)

    def to_limits(self) -> Limits:
        """The loop's `Limits`."""
        return Limits(**{name: getattr(self, name) for name in LimitsParams.model_fields})


def limits_defaulting_to(**defaults: Any) -> Any:
    """The type of a family's `limits` section whose keys, when the section leaves them out, take the family's
    `defaults` instead of LimitsParams' own (give the field `LimitsParams(**defaults)` as its default too)."""
    def fill(value: Any) -> Any:
        return {**defaults, **value} if isinstance(value, Mapping) else value

    return Annotated[LimitsParams, BeforeValidator(fill)]


class EndpointParams(Params):
    """An OpenAI-compatible endpoint (`components/agent/http.py`); the API key is read from the env var named by
    `api_key_env`."""

    base_url: str
    model: str
    api_key_env: str | None = None
    temperature: float = 0.7
    concurrency: int = 4
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 1.0

    def config(self) -> EndpointConfig:
        """The HTTP client's `EndpointConfig`."""
        return EndpointConfig(**self.model_dump())


class DecoderParams(Params):
    """Which backend decodes a checkpoint's turns, and how the transformers backend does it."""

    backend: Literal["auto", "hf", "vllm"] = "auto"  # auto: the vLLM engine where .venv-engine exists, else hf
    chunk_tokens: int | None = Field(None, ge=1)  # transformers: decode turns in rounds of this many tokens over the
    # episodes still writing (None: every row of a call runs until the last ends; see components/agent/hf.py)


class DecodingParams(DecoderParams):
    """Sampling for evaluation: greedy by default (temperature 0), so that a run is reproducible; `backend` and
    `chunk_tokens` as in `DecoderParams`."""

    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0
    batch_size: int = Field(16, ge=1)  # episodes per generate call (transformers backend)
    dtype: str = "auto"
    device: str | None = None
    gpu_memory_utilization: float = Field(0.8, gt=0.0, le=1.0)

    def to_sampling(self, max_model_len: int | None = None) -> Sampling:
        """The backend's `Sampling` (temperature 0: greedy), with the engine's context length `max_model_len`."""
        greedy = self.temperature <= 0
        return Sampling(temperature=self.temperature if not greedy else 1.0, top_p=self.top_p, greedy=greedy,
                        seed=self.seed, max_batch_size=self.batch_size, chunk_tokens=self.chunk_tokens,
                        dtype=self.dtype, gpu_memory_utilization=self.gpu_memory_utilization,
                        max_model_len=max_model_len)
