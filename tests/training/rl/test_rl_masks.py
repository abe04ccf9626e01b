"""Masking regression tests (TRAINING.md "Masks and pitfalls"): what is trained, what is attended, what leaks.

Rollouts run through THE agent loop with a scripted token policy, in the real travel environment over the tiny
world, with the tiny test tokenizer: the masks checked here are exactly the ones RL trains on.
"""
import json

import pytest
import torch

from components.agent import loop
from components.agent.types import TurnResult
from components.training.rl.losses import policy_loss
from components.training.rl.update import Rollout, pad_batch, rollout_from_record, sequence_logprobs
from components.travel.env import TravelEnv
from components.travel.queries import load_queries

SAMPLED_LOGPROB = -0.5


def call(tool: str, **arguments) -> str:
    return f'<think>look</think><tool_call>{json.dumps({"name": tool, "arguments": arguments})}</tool_call>'


class ScriptedTokenPolicy:
    """A token backend that plays a script: turn k of every episode is `script[k]`. A turn given as
    ("cut", n) or ("cut", n, text) samples the first tokens of a long text and never reaches `<|im_end|>` (the
    per-turn limit of n tokens cuts it)."""

    def __init__(self, tokenizer, script):
        self.tokenizer = tokenizer
        self.script = script
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, requests):
        results = []
        for request in requests:
            turn = self.script[sum(m["role"] == "assistant" for m in request.messages)]
            if isinstance(turn, tuple):
                text = turn[2] if len(turn) > 2 else "<think>" + "plan " * 50
                ids = self.tokenizer.encode(text, add_special_tokens=False)[: request.max_new_tokens]
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


def test_a_turn_the_environment_rejected_is_marked_and_never_reinforced(tiny_world, tokenizer, query):
    """An episode that recovers from a malformed turn: with reinforce_rejected_turns false, a positive advantage
    reaches every sampled token but the malformed turn's, which a negative advantage still reaches."""
    from components.training.rl.advantages import never_reinforce, token_advantages

    malformed = "<think>oops</think> no call and no answer"
    turns = [call("SearchAttraction", city=query.dest), malformed, "<think>done</think><answer>no plan</answer>"]
    record = run(tiny_world, tokenizer, query, turns)
    assert [t["kind"] for t in record["turns"]][1] == "protocol_error"
    assert rollout_from_record(record, advantage=1.0).rejected is None  # as published: nothing is marked
    rollout = rollout_from_record(record, advantage=1.0, rejected_kinds=["protocol_error"])
    rejected_text = tokenizer.decode([t for t, r in zip(rollout.input_ids, rollout.rejected) if r],
                                     skip_special_tokens=False)
    assert rejected_text == malformed + "<|im_end|>"
    batch = pad_batch([rollout, rollout_from_record(record, advantage=-1.0, rejected_kinds=["protocol_error"])], pad_id=0)
    advantages = never_reinforce(token_advantages(batch["advantages"], batch["loss_mask"]), batch["rejected"])
    reinforced = [t for t, a in zip(rollout.input_ids, advantages[0].tolist()) if a > 0]
    assert tokenizer.decode(reinforced, skip_special_tokens=False) == (turns[0] + "<|im_end|>" + turns[2]
                                                                       + "<|im_end|>")
    assert advantages[1].tolist() == (-batch["loss_mask"][1]).tolist()  # the push-down keeps every sampled token


def test_a_turn_cut_at_the_token_limit_is_marked_rejected(tiny_world, tokenizer, query):
    """A turn that never reached <|im_end|> (the per-turn limit cut it; mostly loops) was never parsed: with
    `truncated` among the rejected kinds, exactly its sampled tokens are marked."""
    turns = [call("SearchAttraction", city=query.dest), ("cut", 64)]
    record = run(tiny_world, tokenizer, query, turns, max_tokens_per_turn=16)
    assert [t["kind"] for t in record["turns"]] == ["tool", "truncated"]
    assert not any(rollout_from_record(record, advantage=-1.0, rejected_kinds=["protocol_error"]).rejected)
    rollout = rollout_from_record(record, advantage=-1.0, rejected_kinds=["protocol_error", "truncated"])
    marked = [t for t, r in zip(rollout.input_ids, rollout.rejected) if r]
    assert len(marked) == 16 and marked == record["response_ids"][-16:]
    assert all(m for m, r in zip(rollout.loss_mask, rollout.rejected) if r)


def test_only_the_repeating_tail_of_a_cut_turn_is_marked_as_a_loop(tiny_world, tokenizer, query):
    """`loop` marks the tokens of a cut turn that repeat the ones before them: not the plan the turn was writing,
    nor the loop's first copy; `truncated` marks the whole cut turn; a cut turn that does not loop gets no mark."""
    prefix = f"<think>Day 1: current_city from {query.org} to {query.dest}"
    looping = [call("SearchAttraction", city=query.dest), ("cut", 96, prefix + " del" * 120)]
    record = run(tiny_world, tokenizer, query, looping, max_tokens_per_turn=96)
    cut = record["response_ids"][-96:]

    def marked(kinds):
        rollout = rollout_from_record(record, advantage=-1.0, rejected_kinds=kinds)
        return [t for t, r in zip(rollout.input_ids, rollout.rejected) if r]

    tail = marked(["loop"])
    head = cut[: len(cut) - len(tail)]
    assert tokenizer.decode(head) == prefix + " del"
    assert ("del" * 120).startswith(tokenizer.decode(tail).replace(" ", ""))  # " del del ... d": cut mid-unit
    assert len(tail) >= 32 and tail == cut[len(head):]
    assert marked(["truncated"]) == cut and marked(["loop", "truncated"]) == cut
    counting = [call("SearchAttraction", city=query.dest), ("cut", 96, " ".join(str(i) for i in range(400)))]
    record = run(tiny_world, tokenizer, query, counting, max_tokens_per_turn=96)
    assert marked(["loop"]) == [] and len(marked(["truncated"])) == 96


@pytest.mark.parametrize("ids, expected", [
    (list("abcdefefef"), 6),         # period 2: the second `e f` is the first copy of a copy
    (list("xyz") + ["del"] * 40, 4),  # period 1: every `del` after the first
    (list("xy") + list("abc") * 12 + ["a"], 5),  # a unit cut at the end (the slack)
    (list(range(100)), None),       # nothing repeats
    (list("ab") * 10, None),        # too short a loop (18 repeated tokens < 32)
])
def test_repeating_tail_finds_where_a_loop_starts_copying_itself(ids, expected):
    from components.training.rl.update import repeating_tail

    min_tokens = 4 if expected == 6 else 32
    assert repeating_tail(ids, min_tokens=min_tokens) == expected


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


def test_the_token_that_coined_a_name_is_marked_once_as_a_name_slip(tiny_world, tokenizer, query):
    """`name_slip` marks the one sampled token where a name the policy wrote leaves every name it could have copied:
    here the first token past the destination's name in a call that ran on after it, and the `"` that ended a name a
    syllable short. The run-on name is marked where it was first written, not again after the tool's error echoed
    it back; a name copied right gets no mark."""
    from components.training.rl.name_slips import NameSlipMarker
    from components.travel.names import world_name_words

    run_on, short = query.dest + "zorqua", query.org[:-2]
    turns = [call("SearchAttraction", city=run_on), call("SearchRestaurant", city=run_on),
             call("SearchAccommodation", city=short), call("SearchRestaurant", city=query.dest)]
    record = run(tiny_world, tokenizer, query, turns)
    marks = NameSlipMarker(world_name_words(tiny_world), tokenizer).marks(record)
    assert len(marks) == len(record["response_ids"]) and sum(marks) == 2
    starts = [i for i, m in enumerate(record["response_mask"]) if m and (i == 0 or not record["response_mask"][i - 1])]
    for turn, slip in ((0, turns[0].index(run_on) + len(query.dest)), (2, turns[2].index(short) + len(short))):
        start = starts[turn]
        marked = start + marks[start:].index(1)
        before = tokenizer.decode(record["response_ids"][start:marked], skip_special_tokens=False)
        upto = tokenizer.decode(record["response_ids"][start:marked + 1], skip_special_tokens=False)
        assert len(before) <= slip < len(upto), (before, upto)
    rollout = rollout_from_record(record, advantage=0.5, rejected_kinds=["name_slip"], marks=marks)
    assert rollout.rejected == [0] * len(record["prompt_ids"]) + marks
    with pytest.raises(ValueError, match="token marks"):
        rollout_from_record(record, advantage=0.5, rejected_kinds=["name_slip"], marks=marks[:-1])


def test_the_tokens_that_name_a_place_again_are_marked_as_a_repeat_and_a_probe_trains_only_them(
        tiny_world, tokenizer, query):
    """`repeat` marks the sampled tokens of the answer that name a restaurant a second time (the dinner that repeats
    day 1's lunch), not its first naming nor any other token; a greedy probe's rollout (`only_rejected`) trains
    exactly those tokens."""
    from components.training.rl.repeats import RepeatMarker

    restaurant = tiny_world.restaurants_in(query.dest)[0]["Name"] + ", " + query.dest
    days = [{"days": d, "current_city": query.dest, "transportation": "-", "breakfast": "-", "attraction": "-",
             "lunch": restaurant if d == 1 else "-", "dinner": restaurant if d == 2 else "-",
             "accommodation": "-"} for d in (1, 2, 3)]
    script = [call("SearchRestaurant", city=query.dest),
              "<think>done</think><answer>" + json.dumps(days) + "</answer>"]
    record = run(tiny_world, tokenizer, query, script, max_tokens_per_turn=2000)
    assert record["turns"][-1]["kind"] == "answer"
    marks = RepeatMarker(tokenizer).marks(record)
    marked = tokenizer.decode([t for t, m in zip(record["response_ids"], marks) if m], skip_special_tokens=False)
    assert restaurant in marked and len(marked) < len(restaurant) + 8  # the name, at most a token either side
    answer_start = [i for i, m in enumerate(record["response_mask"]) if m and not record["response_mask"][i - 1]][-1]
    first = tokenizer.decode(record["response_ids"][answer_start:answer_start + marks[answer_start:].index(1)],
                             skip_special_tokens=False)
    assert first.count(restaurant) == 1 and '"dinner"' in first[-14:]  # marks start at the dinner, after the lunch
    probe = rollout_from_record(record, 0.0, ["protocol_error", "repeat"], marks, only_rejected=True)
    assert probe.loss_mask == [0] * len(record["prompt_ids"]) + marks and probe.num_trained == sum(marks)
    own = rollout_from_record(record, 0.0, ["protocol_error", "repeat"], marks, credit=[-4.0] * len(marks))
    assert own.credit == [0.0] * len(record["prompt_ids"]) + [-4.0 * m for m in marks]  # only on marked tokens
    without = run(tiny_world, tokenizer, query, script[:1], max_tokens_per_turn=2000)
    assert sum(RepeatMarker(tokenizer).marks(without)) == 0
    with pytest.raises(ValueError, match="only_rejected"):
        rollout_from_record(record, 0.0, only_rejected=True)
