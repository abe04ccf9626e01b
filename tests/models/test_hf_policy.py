"""The transformers backend: one batched call per turn, identical to one-at-a-time under greedy decoding."""
from __future__ import annotations

import pytest
import torch

from components.agent import tokens
from components.agent.hf import HFPolicy, cut_at_end_of_turn, left_pad
from components.agent.types import TurnRequest
from components.models.loading import end_of_turn_id
from .conftest import scaled_rope


def requests_for(tokenizer, conversations, max_new_tokens=12):
    """Contexts of different lengths (a short system prompt keeps the test fast): prompts, and prompts after a
    tool response."""
    out = []
    for i, conv in enumerate(conversations[:5]):
        prompt = [{"role": "system", "content": "You plan trips with tools."}, conv[1]]
        ids = tokens.prompt_ids(tokenizer, prompt)
        if i % 2:
            ids += tokens.assistant_ids(tokenizer, conv[2]["content"]) + tokens.tool_segment_ids(tokenizer, conv[3]["content"])
        out.append(TurnRequest(messages=prompt, token_ids=ids, max_new_tokens=max_new_tokens))
    return out


def test_batched_generation_equals_one_at_a_time_under_greedy(tiny_model, tiny_tokenizer, conversations):
    policy = HFPolicy(tiny_model, tiny_tokenizer, greedy=True)
    requests = requests_for(tiny_tokenizer, conversations)
    assert len({len(r.token_ids) for r in requests}) > 1  # left padding is exercised
    batched = policy.generate(requests)
    single = [policy.generate([r])[0] for r in requests]
    for b, s in zip(batched, single):
        assert b.token_ids == s.token_ids
        assert b.logprobs == pytest.approx(s.logprobs, abs=1e-4)
        assert b.text == s.text


def test_logprobs_are_those_of_the_sampled_tokens(tiny_model, tiny_tokenizer, conversations):
    policy = HFPolicy(tiny_model, tiny_tokenizer, temperature=0.7, seed=1)
    request = requests_for(tiny_tokenizer, conversations)[1]
    result = policy.generate([request])[0]
    full = torch.tensor([request.token_ids + result.token_ids])
    with torch.no_grad():
        logits = tiny_model(full).logits[0, len(request.token_ids) - 1:-1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result.token_ids)[:, None]).squeeze(-1)
    assert result.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_turn_cut_at_max_new_tokens_is_not_finished(tiny_model, tiny_tokenizer, conversations):
    policy = HFPolicy(tiny_model, tiny_tokenizer, greedy=True)
    short, longer = requests_for(tiny_tokenizer, conversations, max_new_tokens=4)[:2]
    longer.max_new_tokens = 9
    results = policy.generate([short, longer])
    assert [len(r.token_ids) for r in results] == [4, 9]
    assert not any(r.finished for r in results)
    assert all(len(r.logprobs) == len(r.token_ids) for r in results)


def test_generation_stops_at_end_of_turn(tiny_model, tiny_tokenizer, conversations):
    end_id = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    # Make <|im_end|> the model's favourite token by raising its logit through a hook on the output layer.
    hook = tiny_model.lm_head.register_forward_hook(lambda module, args, out: out.index_add(
        -1, torch.tensor([end_id]), torch.full((*out.shape[:-1], 1), 50.0)))
    try:
        result = HFPolicy(tiny_model, tiny_tokenizer, temperature=1.0, seed=0).generate(
            requests_for(tiny_tokenizer, conversations)[:1])[0]
    finally:
        hook.remove()
    assert result.token_ids == [end_id] and result.finished and result.text == ""
    assert result.logprobs[0] == pytest.approx(0.0, abs=1e-6)


def test_sampling_is_seeded(tiny_model, tiny_tokenizer, conversations):
    requests = requests_for(tiny_tokenizer, conversations, max_new_tokens=16)
    first = HFPolicy(tiny_model, tiny_tokenizer, seed=7).generate(requests)
    again = HFPolicy(tiny_model, tiny_tokenizer, seed=7).generate(requests)
    other = HFPolicy(tiny_model, tiny_tokenizer, seed=8).generate(requests)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    assert [r.token_ids for r in first] != [r.token_ids for r in other]


def test_text_requests_are_refused(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="tokenizer"):
        HFPolicy(tiny_model, tiny_tokenizer).generate([TurnRequest(messages=[{"role": "user", "content": "hi"}])])


def test_left_pad_and_cut_at_end_of_turn():
    assert left_pad([[5, 6, 7], [8]], pad_id=0) == ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    assert cut_at_end_of_turn([4, 2, 9, 0, 0], end_ids=2, max_new_tokens=5) == ([4, 2], True)
    assert cut_at_end_of_turn([4, 5, 6, 2], end_ids=2, max_new_tokens=3) == ([4, 5, 6], False)
    assert cut_at_end_of_turn([4, 7, 2], end_ids=(2, 7), max_new_tokens=5) == ([4, 7], True)  # the model's own EOS


def play_turns(policy, tokenizer, conversations, turns=3):
    """Run a few lockstep turns of five episodes, appending each sampled turn and a tool response."""
    contexts = [r.token_ids for r in requests_for(tokenizer, conversations)]
    sampled = []
    for _ in range(turns):
        requests = [TurnRequest(messages=[], token_ids=ids, max_new_tokens=6 + 2 * i, episode_id=f"ep{i}")
                    for i, ids in enumerate(contexts)]
        results = policy.generate(requests)
        sampled.append([r.token_ids for r in results])
        contexts = [ids + r.token_ids + tokens.tool_segment_ids(tokenizer, conversations[i][3]["content"])
                    for i, (ids, r) in enumerate(zip(contexts, results))]
    return sampled


def generate_turns(model, tokenizer, conversations, turns=3):
    """`play_turns` under greedy decoding with transformers' own `generate` called on the model directly, one episode
    and turn at a time over its whole context: the reference HFPolicy's turns must equal."""
    end_id = end_of_turn_id(tokenizer)
    contexts = [r.token_ids for r in requests_for(tokenizer, conversations)]
    sampled = []
    for _ in range(turns):
        turn = []
        for i, ids in enumerate(contexts):
            with torch.no_grad():
                out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=6 + 2 * i, do_sample=False,
                                     eos_token_id=end_id, pad_token_id=tokenizer.pad_token_id)
            turn.append(cut_at_end_of_turn(out[0, len(ids):].tolist(), end_id, 6 + 2 * i)[0])
        sampled.append(turn)
        contexts = [ids + ids_out + tokens.tool_segment_ids(tokenizer, conversations[i][3]["content"])
                    for i, (ids, ids_out) in enumerate(zip(contexts, turn))]
    return sampled


@pytest.mark.parametrize("model_name", ["tiny_model", "generate_model"])  # served by the lean decoder, by generate
def test_reusing_episode_caches_across_turns_gives_the_same_turns(tiny_tokenizer, conversations, model_name, request):
    model = request.getfixturevalue(model_name)
    cached = HFPolicy(model, tiny_tokenizer, greedy=True)
    fresh = HFPolicy(model, tiny_tokenizer, greedy=True, reuse_cache=False)
    assert cached.lean == (model_name == "tiny_model")
    assert play_turns(cached, tiny_tokenizer, conversations) == play_turns(fresh, tiny_tokenizer, conversations)
    assert cached.cached_episodes == {f"ep{i}" for i in range(5)} and not fresh.cached_episodes


def test_generate_with_reused_caches_gives_generates_own_greedy_turns(generate_model, tiny_tokenizer, conversations):
    policy = HFPolicy(generate_model, tiny_tokenizer, greedy=True, chunk_tokens=3)
    assert not policy.lean
    assert play_turns(policy, tiny_tokenizer, conversations) == generate_turns(generate_model, tiny_tokenizer,
                                                                               conversations)
    assert policy.caches and not policy.rows


def test_reused_caches_are_passed_without_deprecation_warnings(generate_model, tiny_tokenizer, conversations):
    import warnings

    policy = HFPolicy(generate_model, tiny_tokenizer, greedy=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # transformers >= 5.24 warns on `past_key_values=`
        play_turns(policy, tiny_tokenizer, conversations)
    assert policy.caches


@pytest.mark.parametrize("lean", [True, False])  # a model the lean decoder serves, one `generate` serves
def test_caches_are_dropped_when_the_weights_change(small_model_factory, tiny_tokenizer, conversations, lean):
    model = small_model_factory(seed=1, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                intermediate_size=64)
    model = model if lean else scaled_rope(model, seed=1)
    policy = HFPolicy(model, tiny_tokenizer, greedy=True)
    assert policy.lean == lean
    play_turns(policy, tiny_tokenizer, conversations, turns=1)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))  # an in-place update, as an optimiser step does
    after_update = play_turns(policy, tiny_tokenizer, conversations, turns=2)
    reference = play_turns(HFPolicy(model, tiny_tokenizer, greedy=True, reuse_cache=False), tiny_tokenizer,
                           conversations, turns=2)
    assert after_update == reference


@pytest.mark.parametrize("model_name", ["tiny_model", "generate_model"])
def test_decoding_in_rounds_gives_the_same_turns_under_greedy(tiny_tokenizer, conversations, model_name, request):
    # Budgets of 6-14 tokens in rounds of 4: every episode continues across rounds, each ending in a different one.
    model = request.getfixturevalue(model_name)
    whole = HFPolicy(model, tiny_tokenizer, greedy=True)
    rounds = HFPolicy(model, tiny_tokenizer, greedy=True, chunk_tokens=4)
    assert play_turns(rounds, tiny_tokenizer, conversations) == play_turns(whole, tiny_tokenizer, conversations)


def test_each_round_batches_only_the_episodes_still_writing(tiny_model, tiny_tokenizer, conversations):
    policy = HFPolicy(tiny_model, tiny_tokenizer, greedy=True, chunk_tokens=4)
    calls = []
    original = policy._generate_batch
    policy._generate_batch = lambda requests, caching: calls.append(
        [r.max_new_tokens for r in requests]) or original(requests, caching)
    requests = [TurnRequest(messages=[], token_ids=r.token_ids, max_new_tokens=budget, episode_id=f"ep{i}")
                for i, (r, budget) in enumerate(zip(requests_for(tiny_tokenizer, conversations), [3, 4, 6, 9, 12]))]
    results = policy.generate(requests)
    for result, budget in zip(results, [3, 4, 6, 9, 12]):  # a turn is cut only at its own budget
        assert result.finished or len(result.token_ids) == budget
    assert calls[0] == [3, 4, 4, 4, 4]  # round 1: everyone, at most 4 tokens each
    assert [len(c) for c in calls] == sorted((len(c) for c in calls), reverse=True)  # rounds only shrink
    assert len(calls[-1]) < len(calls[0]) and all(len(c) <= 5 for c in calls)


def test_sampled_rounds_are_seeded_and_report_the_sampled_logprobs(tiny_model, tiny_tokenizer, conversations):
    requests = [TurnRequest(messages=[], token_ids=r.token_ids, max_new_tokens=10, episode_id=f"ep{i}")
                for i, r in enumerate(requests_for(tiny_tokenizer, conversations))]
    first = HFPolicy(tiny_model, tiny_tokenizer, temperature=0.7, seed=5, chunk_tokens=3).generate(requests)
    again = HFPolicy(tiny_model, tiny_tokenizer, temperature=0.7, seed=5, chunk_tokens=3).generate(requests)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    request, result = requests[1], first[1]
    full = torch.tensor([request.token_ids + result.token_ids])
    with torch.no_grad():
        logits = tiny_model(full).logits[0, len(request.token_ids) - 1:-1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result.token_ids)[:, None]).squeeze(-1)
    assert result.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_rounds_of_no_tokens_are_refused(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="chunk_tokens"):
        HFPolicy(tiny_model, tiny_tokenizer, chunk_tokens=0)


def test_a_round_returns_the_turns_that_ended_and_continues_the_others_next_call(tiny_model, tiny_tokenizer,
                                                                               conversations):
    budgets = [3, 4, 6, 9, 12]
    requests = [TurnRequest(messages=[], token_ids=r.token_ids, max_new_tokens=budget, episode_id=f"ep{i}")
                for i, (r, budget) in enumerate(zip(requests_for(tiny_tokenizer, conversations), budgets))]
    policy = HFPolicy(tiny_model, tiny_tokenizer, greedy=True, chunk_tokens=4)
    first = policy.generate_round(requests)
    assert first[0] is not None and first[1] is not None  # budgets of 3 and 4 end in the first round of 4
    assert all(r is None or r.finished or len(r.token_ids) <= 4 for r in first)
    results, open_rows, rounds = list(first), [i for i, r in enumerate(first) if r is None], 1
    while open_rows:
        rounds += 1
        for i, result in zip(open_rows, policy.generate_round([requests[i] for i in open_rows])):
            results[i] = result
        open_rows = [i for i in open_rows if results[i] is None]
    assert rounds <= 3 and not policy.partial
    whole = HFPolicy(tiny_model, tiny_tokenizer, greedy=True).generate(requests)
    assert [r.token_ids for r in results] == [w.token_ids for w in whole]
    assert all(r.logprobs == pytest.approx(w.logprobs, abs=1e-4) for r, w in zip(results, whole))


def test_a_round_without_chunk_tokens_is_the_whole_turn(tiny_model, tiny_tokenizer, conversations):
    requests = [TurnRequest(messages=[], token_ids=r.token_ids, max_new_tokens=8, episode_id=f"ep{i}")
                for i, r in enumerate(requests_for(tiny_tokenizer, conversations))]
    results = HFPolicy(tiny_model, tiny_tokenizer, greedy=True).generate_round(requests)
    assert all(r is not None for r in results)
    assert [r.token_ids for r in results] == [
        r.token_ids for r in HFPolicy(tiny_model, tiny_tokenizer, greedy=True).generate(requests)]


def test_a_new_context_for_an_episode_starts_a_new_turn(tiny_model, tiny_tokenizer, conversations):
    request = TurnRequest(messages=[], token_ids=requests_for(tiny_tokenizer, conversations)[1].token_ids,
                          max_new_tokens=12, episode_id="ep")
    policy = HFPolicy(tiny_model, tiny_tokenizer, greedy=True, chunk_tokens=2)
    policy.generate_round([request])
    shorter = TurnRequest(messages=[], token_ids=request.token_ids[:-3], max_new_tokens=12, episode_id="ep")
    policy.generate_round([shorter])  # not a continuation of the first turn: it starts over on its own context
    assert policy.partial["ep"].context == shorter.token_ids and len(policy.partial["ep"].ids) <= 2
    same_length = TurnRequest(messages=[], token_ids=[request.token_ids[0]] + shorter.token_ids[:-1],
                              max_new_tokens=12, episode_id="ep")
    policy.generate_round([same_length])  # as long as the last context, but other ids: a new turn too
    assert policy.partial["ep"].context == same_length.token_ids and len(policy.partial["ep"].ids) <= 2
