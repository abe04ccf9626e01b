"""How a policy backend samples and which one runs, without importing either: `Sampling`, the backend choice
(`resolve_backend`: `auto` is the vLLM engine where its environment exists, transformers otherwise) and the engine's
options for a checkpoint. It imports neither torch nor transformers, so a stage can `prestart_engine` before its own
heavy imports (components/agent/backends.py builds the policies).

    sampling = Sampling(temperature=0.0, greedy=True)
    prestart_engine("models/sft", sampling, backend="auto")   # the engine loads while the stage starts
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from components.agent import engine_client
from components.agent.engine_client import EngineOptions, engine_python

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


def prestart_engine(checkpoint: str | Path, sampling: Sampling, backend: str = "auto") -> bool:
    """Start the engine that `backends.checkpoint_policy(checkpoint, ..., sampling, backend)` will connect to, now
    (`engine_client.prestart`); nothing where the backend is transformers or there is no engine environment.
    Returns whether an engine was started."""
    if resolve_backend(backend, log=False) != "vllm":
        return False
    return engine_client.prestart(checkpoint, engine_options(checkpoint, sampling))
