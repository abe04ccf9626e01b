"""Attention for decoding on a CPU: the new tokens against the key/value cache as two matrix products.

Rollouts and validation decode one token at a time against contexts of 1-3K tokens (and prefill each tool response
against its episode's cache), and that attention is most of a rollout's time on a CPU (benchmarks/RESULTS.md).
PyTorch's fused `scaled_dot_product_attention` kernel is slower there for a few query rows than
`softmax(q K^T * scale) V` as two batched matrix products (`benchmarks/bench_rollout_chunks.py`). Training, GPUs and
long prefills go to transformers' SDPA function unchanged, and the masks are SDPA's, so both compute the same
attention.

    name = register_cpu_decode_attention()          # "star_cpu_decode"; idempotent
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations import sdpa_attention
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

CPU_DECODE_ATTENTION = "star_cpu_decode"
MAX_SCORES = 2**25  # attention scores of one call (batch x heads x queries x keys) computed here; larger go to SDPA


def causal_mask(q_len: int, kv_len: int, device):
    """[q_len, kv_len] booleans: query i (the last q_len positions) sees keys 0 .. kv_len - q_len + i."""
    keys = torch.arange(kv_len, device=device)
    last_visible = torch.arange(q_len, device=device) + (kv_len - q_len)
    return keys[None, :] <= last_visible[:, None]


def cpu_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                         **kwargs):
    """transformers' attention-function signature: `query` [batch, heads, q_len, dim], `key`/`value` [batch, kv_heads,
    kv_len, dim], `attention_mask` SDPA's (boolean, True = attend, or additive; broadcastable to [batch, 1, q_len,
    kv_len]; None: causal) or None. Returns (output [batch, q_len, heads, dim], None).

    Computed here: inference on a CPU (no gradient) with at most MAX_SCORES scores, i.e. decoding steps and the
    prefill of new tokens against a cache, with grouped-query heads folded into the query rows instead of repeating
    the cache. Anything else (training, GPUs, long prefills) is transformers' SDPA function."""
    batch, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    here = (query.device.type == "cpu" and not torch.is_grad_enabled() and batch * heads * q_len * kv_len <= MAX_SCORES
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None)
    if not here:
        return sdpa_attention.sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                                     scaling=scaling, **kwargs)
    group = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    grouped = query.reshape(batch, kv_heads, group * q_len, dim)  # head h = kv_head * group + g
    scores = (torch.matmul(grouped, key.transpose(-1, -2)) * scale).view(batch, kv_heads, group, q_len, kv_len)
    if attention_mask is None:
        mask = causal_mask(q_len, kv_len, query.device) if q_len > 1 else None
    else:
        mask = attention_mask[..., -q_len:, :kv_len].unsqueeze(2)  # [batch or 1, 1, 1, q_len, kv_len]
    if mask is not None:  # the most negative finite score: a query that sees no key at all (left padding) stays finite
        lowest = torch.finfo(scores.dtype).min
        scores = scores.masked_fill(~mask, lowest) if mask.dtype == torch.bool else (scores + mask).clamp_min(lowest)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs.view(batch, kv_heads, group * q_len, kv_len), value)
    return out.view(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


def register_cpu_decode_attention() -> str:
    """Register `cpu_decode_attention` (with SDPA's masks) under CPU_DECODE_ATTENTION and return that name."""
    AttentionInterface.register(CPU_DECODE_ATTENTION, cpu_decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(CPU_DECODE_ATTENTION, sdpa_mask)
    return CPU_DECODE_ATTENTION
