"""Fixtures for the model tests: SmolLM2's tokenizer and a small random Llama model over it."""
from __future__ import annotations

import json

import pytest

CITIES = ["Ithaca", "Charlotte", "Denver", "Austin", "Boston", "Tucson"]


def conversation(i: int) -> list[dict]:
    """A travel episode in the real protocol: system prompt with tool schemas, query, one search, the plan."""
    from components.travel.protocol import PLAN_EXAMPLE, system_prompt, tool_response
    from components.travel.tools import TOOL_SCHEMAS

    origin, dest = CITIES[i % len(CITIES)], CITIES[(i + 1) % len(CITIES)]
    flight = f"F{3600000 + 97 * i}"
    call = {"name": "SearchFlight", "arguments": {"departure": origin, "destination": dest, "date": "2022-03-16"}}
    return [
        {"role": "system", "content": system_prompt(TOOL_SCHEMAS)},
        {"role": "user", "content": f"Plan a 3-day trip from {origin} to {dest} on 2022-03-16 for $1,{i}00."},
        {"role": "assistant", "content": f"<think>First the flights from {origin}.</think>"
                                         f"<tool_call>{json.dumps(call)}</tool_call>"},
        {"role": "user", "content": tool_response(f"Flight Number Price DepTime\n{flight} {100 + i} 05:38")},
        {"role": "assistant", "content": f"<think>I take {flight}, {100 + i} dollars.</think>"
                                         f"<answer>{json.dumps(PLAN_EXAMPLE)}</answer>"},
    ]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One torch thread: these models are tiny, and on a shared 2-core machine two threads spin-wait for each other."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def conversations() -> list[list[dict]]:
    return [conversation(i) for i in range(24)]


@pytest.fixture(scope="session")
def tiny_tokenizer(smol_tokenizer):
    return smol_tokenizer


@pytest.fixture(scope="session")
def tiny_model(small_model_factory):
    return small_model_factory(seed=0, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                               intermediate_size=128, max_position_embeddings=4096)


def scaled_rope(model, seed: int = 0):
    """`model`'s architecture with a linearly scaled rotary embedding and random weights from `seed`: a model the lean
    decoder does not serve, so HFPolicy decodes its cached turns with transformers' `generate`, as it does every
    model on a GPU and other architectures on a CPU."""
    from components.models.factory import random_model

    rope = {**model.config.rope_parameters, "rope_type": "linear", "factor": 2.0}
    scaled = random_model(model.config, seed=seed, rope_parameters=rope).eval()
    scaled.generation_config.eos_token_id = model.generation_config.eos_token_id
    scaled.generation_config.pad_token_id = model.generation_config.pad_token_id
    return scaled


@pytest.fixture(scope="session")
def generate_model(tiny_model):
    """The tiny model's architecture, served by `generate` (scaled_rope)."""
    return scaled_rope(tiny_model)
