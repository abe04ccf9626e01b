"""Queries synthesised once per session on the tiny world, shared by the synthesis tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_splits(tiny_world):
    """Small SFT/RL/validation sets of the tiny world and the stage summary."""
    from components.travel.queries import QueriesParams, synthesize_splits

    params = QueriesParams(sizes={"sft": 20, "rl": 10, "val": 10}, seed=1)
    return synthesize_splits(tiny_world, params, progress=False)


@pytest.fixture(scope="session")
def many_queries(tiny_world):
    """A few hundred training queries of the tiny world (for the expert's pass-rate and grounding tests)."""
    from components.travel.queries import QueriesParams, synthesize_splits

    splits, _ = synthesize_splits(tiny_world, QueriesParams(sizes={"sft": 240, "rl": 0, "val": 0}, seed=2),
                                  progress=False)
    return splits["sft"]
