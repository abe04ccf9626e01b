"""Trajectory filtering: what is kept, why the rest is dropped, SFT records and the train/eval split."""
import copy

from components.synthesis.filter import (FilterParams, estimate_counter, filter_trajectories, split_train_eval,
                                         trajectory_tokens)


def trajectory(idx: int, level: str = "easy", **overrides) -> dict:
    record = {
        "idx": idx, "level": level, "termination": "answer", "plan": [{"days": 1}], "num_turns": 2,
        "num_tool_calls": 1, "num_protocol_errors": 0,
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": f"query {idx}"},
                     {"role": "assistant", "content": "<think>a</think><tool_call>{}</tool_call>"},
                     {"role": "user", "content": "<tool_response>\nobs\n</tool_response>"},
                     {"role": "assistant", "content": "<think>b</think><answer>[]</answer>"}],
        "evaluation": {"strict": {"final_pass": True}, "official": {"final_pass": True}},
    }
    record.update(overrides)
    return record


def test_only_clean_strict_successes_within_limits_are_kept_once():
    records = [
        trajectory(0),
        trajectory(1, "hard", num_protocol_errors=1),
        trajectory(2, "hard", evaluation={"strict": {"final_pass": False}, "official": {"final_pass": True}}),
        trajectory(3, termination="turn_limit", plan=None),
        trajectory(4, num_turns=99),
        trajectory(5, messages=trajectory(5)["messages"] + [{"role": "user", "content": "x" * 5000}]),
        copy.deepcopy(trajectory(0)),
        trajectory(6, "medium"),
    ]
    kept, stats = filter_trajectories(records, FilterParams(max_tokens=1000, max_turns=10),
                                      estimate_counter(4.0))
    assert [r["idx"] for r in kept] == [0, 6]
    assert stats["dropped"] == {"not_answered": 1, "protocol_errors": 1, "failed_strict": 1, "too_many_turns": 1,
                                "too_long": 1, "duplicate": 1}
    assert stats["by_level"]["hard"] == {"dropped": 2, "protocol_errors": 1, "failed_strict": 1}
    assert stats["by_level"]["medium"] == {"kept": 1}
    assert stats["input"] == 8 and stats["kept"] == 2


def test_sft_records_train_on_assistant_messages_only():
    kept, _ = filter_trajectories([trajectory(0)], FilterParams(), estimate_counter(4.0))
    assert [(m["role"], m["train"]) for m in kept[0]["messages"]] == [
        ("system", False), ("user", False), ("assistant", True), ("user", False), ("assistant", True)]


def test_token_counts_prefer_the_trajectory_ids_over_the_estimate():
    record = trajectory(0, prompt_ids=[1] * 7, response_ids=[2] * 5, response_mask=[1] * 5)
    assert trajectory_tokens(record, estimate_counter(4.0)) == 12
    assert trajectory_tokens(trajectory(0), estimate_counter(1.0)) > trajectory_tokens(trajectory(0),
                                                                                       estimate_counter(4.0))
    kept, _ = filter_trajectories([record], FilterParams(), estimate_counter(4.0))
    assert kept[0]["response_mask"] == [1] * 5


def test_split_is_seeded_and_sized_by_the_eval_fraction():
    records = [{"idx": i} for i in range(20)]
    train, evaluation = split_train_eval(records, 0.25, seed=3)
    assert len(evaluation) == 5 and len(train) == 15
    assert {r["idx"] for r in train} | {r["idx"] for r in evaluation} == set(range(20))
    assert split_train_eval(records, 0.25, seed=3) == (train, evaluation)
    assert len(split_train_eval(records[:3], 0.1, seed=0)[1]) == 1  # at least one eval record


def test_a_turn_answered_by_an_argument_error_is_context_not_training():
    messages = trajectory(0)["messages"][:2] + [
        {"role": "assistant", "content": '<think>a</think><tool_call>{"city": "Helca"}</tool_call>'},
        {"role": "user", "content": "<tool_response>\nUnknown city 'Helca' (SearchRestaurant). Use an exact city "
                                    "name; SearchCity(state) lists the cities of a state.\n</tool_response>"},
        {"role": "assistant", "content": "<think>'Helca' is not a city; the exact name is Helcano.</think>..."},
        {"role": "user", "content": "<tool_response>\nThere is no flight from A to B on 2022-03-01.\n</tool_response>"},
        {"role": "assistant", "content": "<think>retry</think>..."},
        {"role": "user", "content": "<tool_response>\nError: SearchFlight is temporarily unavailable (transient "
                                    "service failure). Retry the same call.\n</tool_response>"},
        {"role": "assistant", "content": "<think>b</think><answer>[]</answer>"}]
    kept, _ = filter_trajectories([trajectory(0, messages=messages)], FilterParams(), estimate_counter(4.0))
    assert [m["train"] for m in kept[0]["messages"] if m["role"] == "assistant"] == [False, True, True, True]
