"""The agent loop: batching, limits and termination reasons, the trajectory record, token masks."""
from components.agent.loop import Episode, Limits, run_episodes
from components.agent.types import TurnResult

from .conftest import ScriptedEnv, ScriptedPolicy


def episodes(n: int) -> list[Episode]:
    return [Episode(idx=i, env=ScriptedEnv(), meta={"level": "easy"}) for i in range(n)]


def test_every_active_episode_is_stepped_in_one_call_per_turn():
    policy = ScriptedPolicy({"0": ["ANSWER"], "1": ["a", "ANSWER"], "2": ["a", "b", "ANSWER"]})
    records = run_episodes(episodes(3), policy, progress=False)
    assert policy.calls == [["0", "1", "2"], ["1", "2"], ["2"]]
    assert [r["num_turns"] for r in records] == [1, 2, 3]
    assert [r["termination"] for r in records] == ["answer"] * 3


class RoundPolicy(ScriptedPolicy):
    """A ScriptedPolicy whose turns take several decoding rounds: `rounds[episode_id][turn]` rounds (default 1)."""

    def __init__(self, scripts, rounds):
        super().__init__(scripts)
        self.rounds = rounds
        self.done: dict[tuple[str, int], int] = {}
        self.round_calls: list[list[tuple[str, int]]] = []

    def generate_round(self, requests):
        keys = [(r.episode_id, sum(m["role"] == "assistant" for m in r.messages)) for r in requests]
        self.round_calls.append(keys)
        replies = self.generate(requests)
        out = []
        for key, reply in zip(keys, replies):
            self.done[key] = self.done.get(key, 0) + 1
            needed = self.rounds.get(key[0], {}).get(key[1], 1)
            out.append(reply if self.done[key] >= needed else None)
        return out


def test_an_episode_whose_turn_ended_starts_its_next_turn_while_others_still_write():
    scripts = {"0": ["a", "b", "ANSWER"], "1": ["long", "ANSWER"]}
    policy = RoundPolicy(scripts, rounds={"1": {0: 3}})  # episode 1's first turn takes three rounds
    records = run_episodes(episodes(2), policy, progress=False)
    assert policy.round_calls == [[("0", 0), ("1", 0)], [("0", 1), ("1", 0)], [("0", 2), ("1", 0)], [("1", 1)]]
    lockstep = run_episodes(episodes(2), ScriptedPolicy(scripts), progress=False)
    assert records == lockstep  # the same trajectories, in fewer rounds than turns x longest turn


def test_the_record_counts_tool_calls_tool_errors_and_protocol_errors():
    policy = ScriptedPolicy({"0": ["a", "FAIL", "BAD", "ANSWER"]})
    record = run_episodes(episodes(1), policy, progress=False)[0]
    assert record["num_tool_calls"] == 2 and record["num_tool_errors"] == 1 and record["num_protocol_errors"] == 1
    assert [t["kind"] for t in record["turns"]] == ["tool", "tool", "protocol_error", "answer"]
    assert record["turns"][2]["protocol_error"] == "format"
    assert record["plan"] == [{"days": 1}] and record["level"] == "easy"
    assert [m["role"] for m in record["messages"]] == ["system", "user"] + ["assistant", "user"] * 3 + ["assistant"]


def test_turn_limit_ends_an_episode_that_never_answers():
    record = run_episodes(episodes(1), ScriptedPolicy({"0": ["a"]}), Limits(max_turns=4), progress=False)[0]
    assert record["termination"] == "turn_limit" and record["num_turns"] == 4


def test_protocol_errors_end_the_episode_at_the_limit():
    record = run_episodes(episodes(1), ScriptedPolicy({"0": ["BAD"]}), Limits(max_protocol_errors=2),
                          progress=False)[0]
    assert record["termination"] == "protocol_errors" and record["num_protocol_errors"] == 2


def test_a_turn_cut_at_max_tokens_ends_with_token_limit_and_is_not_parsed():
    policy = ScriptedPolicy({"0": ["a", TurnResult(text="<think>long", finished=False)]})
    record = run_episodes(episodes(1), policy, progress=False)[0]
    assert record["termination"] == "token_limit"
    assert record["turns"][-1]["kind"] == "truncated" and record["num_tool_calls"] == 1


def test_context_limit_ends_the_episode_when_the_context_is_full(char_tokenizer):
    policy = ScriptedPolicy({"0": ["a"]})
    record = run_episodes(episodes(1), policy, Limits(max_context_tokens=200), tokenizer=char_tokenizer,
                          progress=False)[0]
    assert record["termination"] == "context_limit"
    assert len(record["prompt_ids"]) + len(record["response_ids"]) >= 200
    # every request asked for no more new tokens than the context had room for
    assert all(len(r.token_ids) + r.max_new_tokens <= 200 for r in policy.requests)


def test_response_mask_is_one_exactly_on_sampled_tokens(char_tokenizer):
    policy = ScriptedPolicy({"0": ["call one", "call two", "ANSWER"]})
    record = run_episodes(episodes(1), policy, tokenizer=char_tokenizer, progress=False)[0]
    ids, mask = record["response_ids"], record["response_mask"]
    assert len(ids) == len(mask)
    sampled = char_tokenizer.decode([t for t, m in zip(ids, mask) if m == 1])
    assert sampled == "call one<|im_end|>call two<|im_end|>ANSWER<|im_end|>"
    rendered = char_tokenizer.decode(record["prompt_ids"] + ids)
    assert rendered == (
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nplan a trip<|im_end|>\n<|im_start|>assistant\n"
        "call one<|im_end|>\n<|im_start|>user\n<tool_response>\nresult of call one\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\ncall two<|im_end|>\n<|im_start|>user\n<tool_response>\nresult of call two\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\nANSWER<|im_end|>")
    assert record["response_logprobs"] is None  # a text backend gives no logprobs


def test_token_backend_ids_and_logprobs_are_kept_verbatim(char_tokenizer):
    call = char_tokenizer.encode("x") + [char_tokenizer.IM_END]
    answer = char_tokenizer.encode("ANSWER") + [char_tokenizer.IM_END]
    policy = ScriptedPolicy({"0": [TurnResult("x", call, [-0.5, -0.1]),
                                   TurnResult("ANSWER", answer, [-0.2] * len(answer))]})
    record = run_episodes(episodes(1), policy, tokenizer=char_tokenizer, progress=False)[0]
    mask, logprobs = record["response_mask"], record["response_logprobs"]
    assert record["response_ids"][:2] == call and mask[:2] == [1, 1]
    assert len(logprobs) == len(mask)
    assert [lp for lp, m in zip(logprobs, mask) if m == 1] == [-0.5, -0.1] + [-0.2] * len(answer)
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0)
    # the second request carried the whole context as ids: prompt + sampled + tool segment, nothing re-tokenised
    second = policy.requests[1].token_ids
    assert second == record["prompt_ids"] + record["response_ids"][: len(second) - len(record["prompt_ids"])]


def test_evaluate_and_on_finished_see_every_episode_once():
    finished = []
    policy = ScriptedPolicy({"0": ["a", "ANSWER"], "1": ["ANSWER"]})
    records = run_episodes(episodes(2), policy, evaluate=lambda ep, rec: {"idx_seen": ep.idx},
                           on_finished=lambda rec: finished.append(rec["idx"]), progress=False)
    assert finished == [1, 0]  # in the order episodes ended
    assert [r["evaluation"] for r in records] == [{"idx_seen": 0}, {"idx_seen": 1}]
