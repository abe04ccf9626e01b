"""Shared fixtures: the generated encyclopedia's passages (the tiny preset's sizes), a BM25 retriever over them, and
the real sandbox (skipped, with the reason, where bubblewrap cannot run)."""
from __future__ import annotations

import pytest

from components.toolstar.sandbox import Sandbox, SandboxParams, isolation_problem


@pytest.fixture(scope="session")
def encyclopedia():
    """params/ood_qa.yaml's tiny encyclopedia (300 people, 60 towns, 40 organisations, seed 0)."""
    from components.qa.corpus import build_encyclopedia

    return build_encyclopedia(num_people=300, num_towns=60, num_organisations=40, questions_per_dataset=1, seed=0)


@pytest.fixture(scope="session")
def passages(encyclopedia) -> list[dict]:
    """Its corpus lines, as `star qa build` writes them to data/qa/corpus.jsonl."""
    return [passage.to_dict() for passage in encyclopedia.passages]


@pytest.fixture(scope="session")
def retriever(passages):
    """BM25 over the passages, one passage per search (the tiny preset's top_k)."""
    from components.retrieval import BM25Retriever

    return BM25Retriever(passages, top_k=1)


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    problem = isolation_problem(SandboxParams())
    if problem:
        pytest.skip(f"bubblewrap cannot run here: {problem}")
    return Sandbox(SandboxParams())
