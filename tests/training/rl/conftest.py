"""Fixtures for the RL tests: a small random Llama model with SmolLM2's tokenizer saved like any checkpoint, and RL queries over the
tiny synthetic world (tests/conftest.py's `tiny_world_dir`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


def make_queries(world, count: int = 6) -> list[dict]:
    """Three-day, one-city queries between cities of different states (query records of docs/contracts.md)."""
    cities = world.cities
    queries = []
    for i in range(count):
        org = cities[i % len(cities)]
        dest = next(c for c in cities[(i * 5 + 3) % len(cities):] + cities if world.state_of(c) != world.state_of(org))
        queries.append({
            "idx": i, "org": org, "dest": dest, "days": 3, "visiting_city_number": 1,
            "date": ["2022-03-16", "2022-03-17", "2022-03-18"], "people_number": 1 + i % 2,
            "local_constraint": {"house rule": None, "cuisine": None, "room type": None, "transportation": None},
            "budget": 1500 + 100 * i, "level": "easy",
            "query": f"Please plan a 3-day trip from {org} to {dest} from March 16th to March 18th, 2022, "
                     f"for {1 + i % 2} people with a budget of ${1500 + 100 * i}.",
        })
    return queries


@pytest.fixture(scope="session")
def rl_queries_path(tiny_world, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rl_queries") / "rl.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in make_queries(tiny_world)))
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(small_model_factory, smol_tokenizer, tmp_path_factory) -> Path:
    """A randomly initialised 2-layer Llama (hidden 32) with SmolLM2's tokenizer, saved like any checkpoint."""
    from components.models.checkpoints import save_checkpoint

    model = small_model_factory(seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                intermediate_size=64)
    out = tmp_path_factory.mktemp("tiny_model")
    save_checkpoint(model, smol_tokenizer, out, stage="test")
    return out
