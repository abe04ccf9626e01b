"""The RolloutEngine over THE agent loop: grouped rollouts, and ARPO's branch = a copy of the partial trajectory."""
import random

import pytest

from components.agent import loop
from components.training.rl.arpo import arpo_rollouts
from components.training.rl.engine import RolloutEngine, turn_entropies
from components.agent.types import TurnResult
from components.travel.source import TravelSource
from components.travel.tasks import load_queries

from .test_rl_masks import ScriptedTokenPolicy, call


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from components.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def queries(rl_queries_path):
    return load_queries(rl_queries_path)


def engine_for(tiny_world, tokenizer, script, **kwargs):
    limits = loop.Limits(max_turns=len(script), max_tokens_per_turn=64, max_context_tokens=20000)
    return RolloutEngine(ScriptedTokenPolicy(tokenizer, script), tokenizer, TravelSource(tiny_world), limits, **kwargs)


def test_groups_roll_out_g_evaluated_trajectories_per_query(tiny_world, tokenizer, queries):
    engine = engine_for(tiny_world, tokenizer, [call("SearchAttraction", city=queries[0].dest),
                                                "<think>x</think><answer>not a plan</answer>"])
    engine.begin_step(1)
    groups = engine.groups(queries[:2], 3)
    assert [len(g) for g in groups] == [3, 3]
    assert [r["idx"] for g in groups for r in g] == [queries[0].idx] * 3 + [queries[1].idx] * 3
    record = groups[0][0]
    assert record["termination"] == "answer" and record["num_tool_calls"] == 1
    assert record["plan"] is None  # an answer, but no parseable plan: the strict evaluation says so
    assert record["evaluation"]["strict"]["delivered"] is False
    assert record["evaluation"]["strict"]["plan_error"]


def test_a_branch_copies_the_prefix_masks_and_counters_at_the_tool_response(tiny_world, tokenizer, queries):
    query = queries[0]
    script = [call("SearchAttraction", city=query.dest), call("SearchRestaurant", city=query.dest),
              "<think>x</think><answer>-</answer>"]
    engine = engine_for(tiny_world, tokenizer, script)
    (source,) = engine.start(query, 1)
    engine.advance([source])  # turn 1: a tool call; its response is appended
    at_tool_response = (list(source.state.response_ids), list(source.state.response_mask),
                        source.state.record["num_tool_calls"], source.state.record["num_turns"])
    (info,) = engine.advance([source])  # turn 2, generated right after the tool response
    assert info.after_tool and not info.done
    branch = engine.branch(source)
    assert (branch.state.response_ids, branch.state.response_mask, branch.state.record["num_tool_calls"],
            branch.state.record["num_turns"]) == at_tool_response
    assert branch.state.episode.env.world is tiny_world  # shares the world, copies the episode
    assert branch.state.episode.env is not source.state.episode.env
    assert branch.state.record["branch_of"] == source.state.episode.episode_id
    # both finish on their own; the branch re-samples turn 2 and ends with the same counters as the source
    while not (source.record and branch.record):
        engine.advance([e for e in (source, branch) if e.record is None])
    assert branch.record["num_tool_calls"] == source.record["num_tool_calls"] == 2
    assert branch.record["response_ids"] == source.record["response_ids"]  # same script, same tokens
    assert len(branch.record["response_logprobs"]) == len(branch.record["response_ids"])


def test_arpo_through_the_real_loop_gives_every_query_its_budget(tiny_world, tokenizer, queries):
    script = [call("SearchAttraction", city=queries[0].dest), call("SearchRestaurant", city=queries[0].dest),
              "<think>x</think><answer>-</answer>"]
    engine = engine_for(tiny_world, tokenizer, script)
    engine.begin_step(1)
    # the scripted policy's -log p is 0.5 on every token, so dH = 0 and p = alpha = 1.0: always branch
    result = arpo_rollouts(engine, queries[:2], budget=5, initial_rollouts=2, alpha=1.0, beta=0.0,
                           rng=random.Random(0))
    assert [len(g) for g in result.groups] == [5, 5]
    assert result.stats.branches == 6 and result.stats.fills == 0
    assert all(ep.record["termination"] == "answer" for g in result.groups for ep in g)


def test_turn_entropy_is_estimated_from_sampled_logprobs():
    assert turn_entropies(TurnResult("x", [1, 2], [-0.25, -1.0])) == [0.25, 1.0]
