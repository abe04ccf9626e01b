"""The loop's public stepping API: stepping episodes by hand (as ARPO does) is the very loop `run_episodes` runs."""
import copy

import pytest

from components.agent.loop import (Episode, Limits, advance_episode, finish_episode, generate_turns, limit_at_start,
                                   run_episodes, start_episode)
from components.agent.types import TurnPolicy, TurnResult

from .conftest import ScriptedEnv, ScriptedPolicy

SCRIPT = {"0": ["call one", "BAD", "call two", "ANSWER"]}


def step_by_hand(policy, limits, tokenizer, evaluate=None) -> dict:
    """One episode through start -> (generate, advance)* -> finish."""
    state = start_episode(Episode(idx=0, env=ScriptedEnv(), meta={"level": "easy"}), tokenizer)
    reason = limit_at_start(state, limits, tokenizer)
    while reason is None:
        (result,) = generate_turns(policy, [state], limits, tokenizer)
        reason = advance_episode(state, result, limits, tokenizer)
    return finish_episode(state, reason, tokenizer, evaluate)


def test_stepping_by_hand_builds_the_same_record_as_run_episodes(char_tokenizer):
    evaluate = lambda episode, record: {"turns": record["num_turns"]}  # noqa: E731
    by_hand = step_by_hand(ScriptedPolicy(SCRIPT), Limits(), char_tokenizer, evaluate)
    looped = run_episodes([Episode(idx=0, env=ScriptedEnv(), meta={"level": "easy"})], ScriptedPolicy(SCRIPT),
                          tokenizer=char_tokenizer, evaluate=evaluate, progress=False)[0]
    assert by_hand == looped
    assert by_hand["termination"] == "answer" and by_hand["evaluation"] == {"turns": 4}
    assert by_hand["num_tool_calls"] == 2 and by_hand["num_protocol_errors"] == 1


def test_an_episode_that_cannot_take_a_turn_is_stopped_at_the_start(char_tokenizer):
    state = start_episode(Episode(idx=0, env=ScriptedEnv()), char_tokenizer)
    prompt_length = state.context_length()
    assert limit_at_start(state, Limits(max_context_tokens=prompt_length), char_tokenizer) == "context_limit"
    assert limit_at_start(state, Limits(max_context_tokens=prompt_length + 1), char_tokenizer) is None
    assert limit_at_start(state, Limits(max_turns=0)) == "turn_limit"
    record = run_episodes([Episode(idx=0, env=ScriptedEnv())], ScriptedPolicy(SCRIPT),
                          Limits(max_context_tokens=prompt_length), tokenizer=char_tokenizer, progress=False)[0]
    assert record["termination"] == "context_limit" and record["num_turns"] == 0


def test_after_tool_response_marks_a_turn_that_follows_a_tool_call():
    limits = Limits()
    state = start_episode(Episode(idx=0, env=ScriptedEnv()))
    seen = [state.after_tool_response()]
    for text in ("call one", "BAD", "call two"):
        advance_episode(state, TurnResult(text), limits)
        seen.append(state.after_tool_response())
    assert seen == [False, True, False, True]


def test_a_deep_copy_of_a_state_is_a_snapshot_that_continues_on_its_own(char_tokenizer):
    limits = Limits()
    state = start_episode(Episode(idx=0, env=ScriptedEnv()), char_tokenizer)
    advance_episode(state, TurnResult("call one"), limits, char_tokenizer)
    snapshot = copy.deepcopy(state)
    advance_episode(state, TurnResult("ANSWER"), limits, char_tokenizer)
    assert advance_episode(snapshot, TurnResult("call two"), limits, char_tokenizer) is None
    assert state.record["num_turns"] == snapshot.record["num_turns"] == 2
    assert snapshot.record["num_tool_calls"] == 2 and state.record["num_tool_calls"] == 1
    assert [m["content"] for m in state.messages[2:]] == ["call one", "<tool_response>\nresult of call one\n"
                                                          "</tool_response>", "ANSWER"]
    assert snapshot.messages[:4] == state.messages[:4] and snapshot.messages[4]["content"] == "call two"
    assert snapshot.response_ids != state.response_ids


def test_generate_turns_makes_one_call_and_checks_the_policy_answered_every_request():
    states = [start_episode(Episode(idx=i, env=ScriptedEnv())) for i in range(2)]
    policy = ScriptedPolicy({"0": ["a"], "1": ["b"]})
    assert [r.text for r in generate_turns(policy, states, Limits())] == ["a", "b"]
    assert policy.calls == [["0", "1"]]
    assert generate_turns(policy, [], Limits()) == [] and len(policy.calls) == 1

    class Short(TurnPolicy):
        def generate(self, requests):
            return [TurnResult("a")]

    with pytest.raises(RuntimeError, match="1 turns for 2 requests"):
        generate_turns(Short(), states, Limits())
