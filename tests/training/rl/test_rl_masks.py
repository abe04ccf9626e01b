"""Masking regression tests: what is trained, what is attended, what leaks.

Rollouts run through THE agent loop with a scripted token policy, in the real travel environment over the tiny
world, with the tiny test tokenizer: the masks checked here are exactly the ones RL trains on.
"""
import json

import pytest
import torch

from components.agent import loop
from components.agent.types import TurnPolicy, TurnResult
from components.training.rl.losses import policy_loss
from components.training.rl.update import Rollout, pad_batch, rollout_from_record, sequence_logprobs
from components.travel.env import TravelEnv
from components.travel.tasks import load_queries

SAMPLED_LOGPROB = -0.5


def call(tool: str, **arguments) -> str:
    return f'<think>look</think><tool_call>{json.dumps({"name": tool, "arguments": arguments})}</tool_call>'


class ScriptedTokenPolicy(TurnPolicy):
    """A token backend that plays a script: turn k of every episode is `script[k]`. A turn given as ("cut", n)
    samples the first tokens of a long text and never reaches `<|im_end|>` (the per-turn limit of n tokens cuts it)."""

    def __init__(self, tokenizer, script):
        self.tokenizer = tokenizer
        self.script = script
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, requests):
        results = []
        for request in requests:
            turn = self.script[sum(m["role"] == "assistant" for m in request.messages)]
            if isinstance(turn, tuple):
                ids = self.tokenizer.encode("<think>" + "plan " * 50, add_special_tokens=False)
                ids = ids[: request.max_new_tokens]
                results.append(TurnResult(self.tokenizer.decode(ids), ids, [SAMPLED_LOGPROB] * len(ids), finished=False))
            else:
                ids = self.tokenizer.encode(turn, add_special_tokens=False) + [self.end_id]
                results.append(TurnResult(turn, ids, [SAMPLED_LOGPROB] * len(ids), finished=True))
        return results


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from components.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def query(rl_queries_path):
    return load_queries(rl_queries_path)[0]


def run(tiny_world, tokenizer, query, script, max_tokens_per_turn=64):
    episode = loop.Episode(idx=query.idx, env=TravelEnv(tiny_world, query), meta={"level": query.level})
    limits = loop.Limits(max_turns=len(script), max_tokens_per_turn=max_tokens_per_turn, max_context_tokens=20000)
    (record,) = loop.run_episodes([episode], ScriptedTokenPolicy(tokenizer, script), limits, tokenizer=tokenizer,
                                  progress=False)
    return record


def trained_text(tokenizer, rollout: Rollout) -> str:
    return tokenizer.decode([t for t, m in zip(rollout.input_ids, rollout.loss_mask) if m], skip_special_tokens=False)


def test_only_sampled_turns_and_their_end_of_turn_token_are_trained(tiny_world, tokenizer, query):
    turns = [call("SearchAttraction", city=query.dest), call("SearchRestaurant", city=query.dest),
             "<think>done</think><answer>no plan</answer>"]
    record = run(tiny_world, tokenizer, query, turns)
    rollout = rollout_from_record(record, advantage=1.0)
    assert trained_text(tokenizer, rollout) == "<|im_end|>".join(turns) + "<|im_end|>"
    assert rollout.loss_mask[: len(record["prompt_ids"])] == [0] * len(record["prompt_ids"])
    # the tool responses are there, untrained
    untrained = tokenizer.decode([t for t, m in zip(record["response_ids"], record["response_mask"]) if not m],
                                 skip_special_tokens=False)
    assert untrained.count("<tool_response>") == 2


def test_the_generation_prompt_after_a_tool_response_is_prompt_not_policy_output(tiny_world, tokenizer, query):
    record = run(tiny_world, tokenizer, query, [call("SearchAttraction", city=query.dest), "<think>x</think><answer>-</answer>"])
    ids, mask = record["response_ids"], record["response_mask"]
    first_sampled_after_tool = next(i for i in range(1, len(mask)) if mask[i] == 1 and mask[i - 1] == 0)
    generation_prompt = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    start = first_sampled_after_tool - len(generation_prompt)
    assert ids[start:first_sampled_after_tool] == generation_prompt
    assert mask[start:first_sampled_after_tool] == [0] * len(generation_prompt)


def test_a_turn_cut_at_the_token_limit_trains_no_forced_end_of_turn(tiny_world, tokenizer, query):
    record = run(tiny_world, tokenizer, query, [call("SearchAttraction", city=query.dest), ("cut", 12)],
                 max_tokens_per_turn=12)
    assert record["termination"] == "token_limit"
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rollout = rollout_from_record(record, advantage=1.0)
    trained = [t for t, m in zip(rollout.input_ids, rollout.loss_mask) if m]
    assert trained.count(end_id) == 1  # the first, finished turn's; none was invented for the cut one
    assert rollout.input_ids[-1] != end_id and rollout.loss_mask[-12:] == [1] * 12


def test_special_token_text_in_a_tool_response_is_neutralised(tiny_world, tokenizer, query):
    record = run(tiny_world, tokenizer, query, [call("SearchAttraction", city="Nowhere<|im_end|>"), "<think>x</think><answer>-</answer>"])
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    untrained = [t for t, m in zip(record["response_ids"], record["response_mask"]) if not m]
    assert untrained.count(end_id) == 1  # only the one that closes the tool message
    assert "Nowhere" in record["messages"][3]["content"]


def test_multi_turn_responses_are_never_truncated_to_the_per_turn_limit(tiny_world, tokenizer, query):
    turns = [call("SearchAttraction", city=query.dest)] * 3 + ["<think>x</think><answer>-</answer>"]
    record = run(tiny_world, tokenizer, query, turns, max_tokens_per_turn=64)
    rollout = rollout_from_record(record, advantage=1.0)
    assert len(record["response_ids"]) > 64
    assert len(rollout.input_ids) == len(record["prompt_ids"]) + len(record["response_ids"])
    assert rollout.num_trained == sum(record["response_mask"])


def test_padding_is_on_the_right_and_never_trained():
    short = Rollout(input_ids=[5, 6, 7], loss_mask=[0, 1, 1], advantage=1.0)
    long = Rollout(input_ids=[5, 6, 7, 8, 9], loss_mask=[0, 1, 0, 1, 1], advantage=-1.0)
    batch = pad_batch([short, long], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1, 0, 0], [0, 1, 0, 1, 1]]


def test_masked_tokens_stay_in_the_attention_context(tiny_model_dir):
    """Changing an untrained (tool-response) token changes the log-probability of a later trained token."""
    from components.models.loading import load_policy_model

    model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
    ids = torch.tensor([[11, 12, 13, 14, 15, 16]])
    changed = ids.clone()
    changed[0, 2] = 40  # position 2 is a masked tool token
    with torch.no_grad():
        a, _ = sequence_logprobs(model, ids)
        b, _ = sequence_logprobs(model, changed)
    assert not torch.allclose(a[0, 5], b[0, 5])


def test_logprobs_at_masked_positions_never_reach_the_loss():
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0]], requires_grad=True)
    clean_old = torch.tensor([[0.0, -2.1, 0.0, -3.9]])
    dirty_old = torch.tensor([[float("nan"), -2.1, float("-inf"), -3.9]])
    adv = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    clean, _ = policy_loss(logp, clean_old, adv, mask)
    dirty, stats = policy_loss(logp, dirty_old, adv, mask)
    assert torch.isfinite(dirty) and dirty.item() == pytest.approx(clean.item())
    assert stats["ratio_mean"] == pytest.approx((torch.exp(torch.tensor(0.1)) + torch.exp(torch.tensor(-0.1))).item() / 2)


def test_a_padded_batch_gives_each_sequence_the_logprobs_it_has_alone(tiny_model_dir):
    """Right padding with causal attention: the padding after a sequence never changes its log-probabilities."""
    from components.models.loading import load_policy_model
    from components.training.rl.update import fill_logprobs

    model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
    short = Rollout(input_ids=[11, 12, 13], loss_mask=[0, 1, 1], advantage=1.0)
    long = Rollout(input_ids=[11, 12, 13, 14, 15, 16, 17], loss_mask=[0, 1, 1, 1, 1, 1, 1], advantage=1.0)
    together = fill_logprobs(model, [long, short], micro_batch_size=2, pad_id=0, temperature=1.0, overwrite=False)
    alone = fill_logprobs(model, [short], micro_batch_size=1, pad_id=0, temperature=1.0, overwrite=False)
    assert len(together[1]) == 3
    assert together[1] == pytest.approx(alone[0], abs=1e-5)


def test_scoring_only_trained_positions_matches_the_full_output_layer(tiny_model_dir):
    from components.models.loading import load_policy_model

    model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
    ids = torch.tensor([[11, 12, 13, 14, 15, 16], [21, 22, 23, 24, 0, 0]])
    trained = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        full, _ = sequence_logprobs(model, ids, temperature=0.7)
        only, _ = sequence_logprobs(model, ids, temperature=0.7, positions=trained)
    assert torch.allclose(only[trained.bool()], full[trained.bool()], atol=1e-5)
    assert only[~trained.bool()].abs().max().item() == 0.0
