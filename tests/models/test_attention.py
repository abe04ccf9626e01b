"""CPU decoding attention: the same numbers as SDPA for decoding steps and cached prefills, SDPA itself for training."""
from __future__ import annotations

import pytest
import torch

from components.models.attention import CPU_DECODE_ATTENTION, causal_mask, register_cpu_decode_attention


def gqa_model(tokenizer, attention: str, kv_heads: int = 2):
    from components.models.factory import small_llama

    model = small_llama(tokenizer, seed=3, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=kv_heads,
                        intermediate_size=96)
    model.set_attn_implementation(attention)
    return model.eval()


def test_causal_mask_aligns_the_queries_with_the_last_keys():
    assert causal_mask(2, 4, "cpu").tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_mask(1, 3, "cpu").tolist() == [[True, True, True]]


@pytest.mark.parametrize("kv_heads", [4, 2])  # full multi-head and grouped-query attention
def test_decoding_and_cached_prefill_match_sdpa_with_left_padding(tiny_tokenizer, kv_heads):
    register_cpu_decode_attention()
    ours, sdpa = gqa_model(tiny_tokenizer, CPU_DECODE_ATTENTION, kv_heads), gqa_model(tiny_tokenizer, "sdpa", kv_heads)
    torch.manual_seed(0)
    ids = torch.randint(5, 200, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding in one row
    with torch.no_grad():
        logits = []
        for model in (ours, sdpa):
            out = model(input_ids=ids[:, :8], attention_mask=mask[:, :8], use_cache=True)
            step = model(input_ids=ids[:, 8:11], attention_mask=mask[:, :11], cache=out.cache, use_cache=True)
            last = model(input_ids=ids[:, 11:], attention_mask=mask, cache=step.cache, use_cache=True)
            logits.append((step.logits, last.logits))
    for a, b in zip(*logits):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("cache", ["dynamic", "static"])  # HFPolicy's growing cache, and a preallocated one
def test_the_decode_of_generate_matches_sdpa(tiny_tokenizer, cache):
    register_cpu_decode_attention()
    ours, sdpa = gqa_model(tiny_tokenizer, CPU_DECODE_ATTENTION), gqa_model(tiny_tokenizer, "sdpa")
    ids = torch.randint(5, 200, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[0, 0] + [1] * 8, [1] * 10])
    runs = [m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, cache_implementation=cache,
                       output_logits=True, return_dict_in_generate=True, pad_token_id=0) for m in (ours, sdpa)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert torch.allclose(torch.stack(runs[0].logits), torch.stack(runs[1].logits), atol=1e-5)


def test_training_forwards_go_to_sdpa(tiny_tokenizer, monkeypatch):
    import transformers.integrations.sdpa_attention as sdpa_module

    register_cpu_decode_attention()
    model = gqa_model(tiny_tokenizer, CPU_DECODE_ATTENTION).train()
    calls = []
    original = sdpa_module.sdpa_attention_forward
    monkeypatch.setattr(sdpa_module, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    loss = model(input_ids=torch.randint(5, 200, (2, 6)), labels=torch.randint(5, 200, (2, 6))).loss
    loss.backward()
    assert len(calls) == 2  # one per layer, with gradients: SDPA's memory-lean kernel
    calls.clear()
    with torch.no_grad():
        model(input_ids=torch.randint(5, 200, (2, 6)))
    assert calls == []  # inference: the matrix products
