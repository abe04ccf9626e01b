"""Prefix caching in the lean decoder: a prefix shared by several rows (the system prompt of every episode, a query's
prompt for its G samples) runs through the model once, and the caches it fills are exactly those of rows run alone."""
from __future__ import annotations

import pytest


def test_the_plan_copies_each_shared_prefix_from_the_earliest_row():
    from components.agent.lean_decode import shared_prefixes

    system, q1, q2 = [1, 2, 3, 4], [7, 8], [9]
    contexts = [system + q1 + [10], system + q1 + [11], system + q2, system + q1 + [10, 12]]
    plan = shared_prefixes([[], [], [], system], contexts)
    assert plan == [(0, None, 0), (0, 0, 6), (0, 0, 4), (4, 0, 7)]


def test_a_row_keeps_its_own_cache_when_no_earlier_row_shares_more():
    from components.agent.lean_decode import shared_prefixes

    assert shared_prefixes([[1, 2, 3], []], [[1, 2, 3, 4], [1, 2, 5]]) == [(3, None, 3), (0, 0, 2)]


@pytest.mark.parametrize("held", [0, 3])
def test_shared_prefill_gives_the_caches_of_rows_run_alone(tiny_model, held):
    import torch

    from components.agent import lean_decode as ld

    system = list(range(100, 140))
    contexts = [system + [5, 6, 7], system + [5, 6, 8], system + [9], system + [5, 6, 7, 1, 2]]
    shared = [ld.RowCache.empty(tiny_model, capacity=8) for _ in contexts]
    alone = [ld.RowCache.empty(tiny_model, capacity=8) for _ in contexts]
    with torch.no_grad():
        if held:  # a row whose cache already holds part of its context keeps that part
            ld.forward_rows(tiny_model, [shared[2]], [system[:held]], logits=None)
        ld.prefill(tiny_model, shared, contexts)
        for cache, ids in zip(alone, contexts):
            ld.forward_rows(tiny_model, [cache], [ids], logits=None)
        assert [c.ids for c in shared] == contexts
        next_tokens = [3, 4, 5, 6]
        ours = ld.decode_step(tiny_model, shared, next_tokens)
        reference = ld.decode_step(tiny_model, alone, next_tokens)
    assert torch.allclose(ours, reference, atol=1e-5)
