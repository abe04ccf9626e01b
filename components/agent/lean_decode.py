"""A lean incremental decoder for Llama and Qwen2 models on a CPU: how the transformers policy decodes them.

`generate` rebuilds a left-padded batch cache from the episodes' own caches for every round of decoding, pays for
every row up to the longest context in the batch, and samples with `torch.multinomial` (2-3 ms a token at batch 16
on two cores, against 0.07 ms for an inverse-CDF draw). At the tiny preset's sizes that overhead is about half of a
rollout's time (benchmarks/bench_smollm2.py). This module runs the model's own modules (its weights, norms,
projections, rotary embedding and MLP) one decoding step at a time over per-episode key/value buffers that grow in
place, so nothing is copied between rounds and each row attends over exactly its own context.

It computes the same function as the model's forward: logits agree with `model(ids)` to float rounding
(tests/models/test_lean_decode.py), so greedy turns are the same tokens. Only architectures whose forward it mirrors
exactly are served (`supports`); `HFPolicy` decodes everything else with `generate`.

    caches = [RowCache.empty(model) for _ in contexts]
    prefill(model, caches, [ids[:-1] for ids in contexts])           # each cache now holds its context but the last token
    logits = decode_step(model, caches, [ids[-1] for ids in contexts])  # [rows, vocab]: the next-token logits
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
INITIAL_CAPACITY = 512  # tokens of key/value room a row starts with; it doubles when full


def supports(model) -> bool:
    """Whether this decoder computes exactly what `model`'s forward computes: a Llama or Qwen2 causal LM with full
    attention everywhere and the default rotary embedding, on a CPU (it decodes without gradients)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    rope = getattr(config, "rope_parameters", None) or {}
    return (all(kind == "full_attention" for kind in layer_types)
            and not getattr(config, "use_sliding_window", False)
            and rope.get("rope_type", "default") == "default"
            and next(model.parameters()).device.type == "cpu")


@dataclass
class RowCache:
    """One sequence's key/value states, computed on exactly `ids`: per layer, `keys[l]` of shape [kv_heads, head_dim,
    capacity] (transposed: a decoding step's q K^T then reads contiguous rows, 4x faster on a CPU than through a
    transposed view) and `values[l]` of shape [kv_heads, capacity, head_dim], the first `len(ids)` positions filled."""

    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)
    ids: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls, model, capacity: int = INITIAL_CAPACITY) -> "RowCache":
        config = model.config
        dim = head_dim(config)
        dtype = next(model.parameters()).dtype
        heads = config.num_key_value_heads
        layers = range(config.num_hidden_layers)
        return cls(keys=[torch.empty((heads, dim, capacity), dtype=dtype) for _ in layers],
                   values=[torch.empty((heads, capacity, dim), dtype=dtype) for _ in layers])

    @property
    def length(self) -> int:
        return len(self.ids)

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (the buffers keep their room)."""
        del self.ids[length:]

    def copy_from(self, other: "RowCache", start: int, end: int) -> None:
        """Take positions start .. end from `other` (whose ids agree with this row's up to `end`)."""
        self.reserve(end)
        for layer in range(len(self.keys)):
            self.keys[layer][:, :, start:end] = other.keys[layer][:, :, start:end]
            self.values[layer][:, start:end] = other.values[layer][:, start:end]
        self.ids[start:] = other.ids[start:end]

    def reserve(self, length: int) -> None:
        """Make room for `length` positions, doubling the buffers as often as needed."""
        capacity = self.values[0].shape[1]
        if length <= capacity:
            return
        while capacity < length:
            capacity *= 2
        used = self.length
        for layer, (keys, values) in enumerate(zip(self.keys, self.values)):
            self.keys[layer] = torch.empty((keys.shape[0], keys.shape[1], capacity), dtype=keys.dtype)
            self.keys[layer][:, :, :used] = keys[:, :, :used]
            self.values[layer] = torch.empty((values.shape[0], capacity, values.shape[2]), dtype=values.dtype)
            self.values[layer][:, :used] = values[:, :used]


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotate(x, cos, sin):
    """The rotary embedding as transformers' `apply_rotary_pos_emb` computes it: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def attend(query, keys_t, values, scale: float, causal_from: int | None):
    """softmax(q K^T * scale) V for one row: `query` [heads, q_len, dim], `keys_t` [kv_heads, dim, kv_len] (the keys
    transposed), `values` [kv_heads, kv_len, dim].
    With `causal_from` = kv_len - q_len, query i sees keys 0 .. causal_from + i (a prefill); None: every key."""
    heads, q_len, dim = query.shape
    kv_heads, kv_len = keys_t.shape[0], keys_t.shape[2]
    group = heads // kv_heads
    grouped = query.reshape(kv_heads, group * q_len, dim)  # head h = kv_head * group + g, as in the model
    scores = torch.matmul(grouped, keys_t) * scale
    if causal_from is not None and q_len > 1:
        visible = torch.arange(kv_len)[None, :] <= (torch.arange(q_len) + causal_from)[:, None]
        scores = scores.view(kv_heads, group, q_len, kv_len).masked_fill(~visible, torch.finfo(scores.dtype).min)
        scores = scores.view(kv_heads, group * q_len, kv_len)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    return torch.matmul(probs, values).view(heads, q_len, dim)


def attend_one_each(q, k, v, caches: list[RowCache], starts: list[int], index: int, scale: float):
    """Layer `index`'s attention when every row adds one token (a decoding step): writes each row's new key and value
    at its position `starts[i]` and attends over its positions 0 .. starts[i]. `q` [rows, heads, dim], `k`/`v`
    [rows, kv_heads, dim]; returns [rows, heads, dim]. The decoding step's hot loop, so it does only what `attend`
    does for q_len 1, in place where it can."""
    rows, heads, dim = q.shape
    kv_heads = k.shape[1]
    grouped = q.view(rows, kv_heads, heads // kv_heads, dim)
    out = torch.empty(rows, kv_heads, heads // kv_heads, dim, dtype=q.dtype)
    for row, (cache, start) in enumerate(zip(caches, starts)):
        keys_t, values = cache.keys[index], cache.values[index]
        keys_t[:, :, start] = k[row]
        values[:, start] = v[row]
        scores = torch.matmul(grouped[row], keys_t[:, :, :start + 1]).mul_(scale)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
        torch.matmul(probs, values[:, :start + 1], out=out[row])
    return out


def forward_rows(model, caches: list[RowCache], new_ids: list[list[int]], logits: str | None = "last"):
    """Run `new_ids[i]` after `caches[i]`'s tokens for every row, appending their keys and values to the caches.

    Rows are batched through every projection and MLP (their new tokens concatenated) and attend one at a time over
    their own buffers. Returns the logits after each row's last new token, [rows, vocab] (`logits="last"`), after
    every new token, a list of [len(new_ids[i]), vocab] ("all"), or nothing (None: only the caches advance)."""
    inner = model.model
    config = model.config
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, head_dim(config)
    scale = dim ** -0.5
    counts = [len(ids) for ids in new_ids]
    decoding = all(count == 1 for count in counts)
    starts = [cache.length for cache in caches]
    for cache, count in zip(caches, counts):
        cache.reserve(cache.length + count)
    flat = torch.tensor([token for ids in new_ids for token in ids], dtype=torch.long)
    positions = torch.tensor([start + j for start, count in zip(starts, counts) for j in range(count)],
                             dtype=torch.long)
    with torch.no_grad():
        hidden = inner.embed_tokens(flat)[None]  # [1, tokens, hidden]: one "sequence" of all rows' new tokens
        cos, sin = inner.rotary_emb(hidden, positions[None])
        cos, sin = cos[0][:, None, :], sin[0][:, None, :]  # [tokens, 1, dim], broadcast over heads
        hidden = hidden[0]
        for index, layer in enumerate(inner.layers):
            attn = layer.self_attn
            normed = layer.input_layernorm(hidden)
            q = rotate(attn.q_proj(normed).view(-1, heads, dim), cos, sin)
            k = rotate(attn.k_proj(normed).view(-1, kv_heads, dim), cos, sin)
            v = attn.v_proj(normed).view(-1, kv_heads, dim)
            if decoding:
                mixed = attend_one_each(q, k, v, caches, starts, index, scale)
                hidden = hidden + attn.o_proj(mixed.view(len(caches), heads * dim))
                hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
                continue
            outputs, offset = [], 0
            for cache, start, count in zip(caches, starts, counts):
                end = start + count
                cache.keys[index][:, :, start:end] = k[offset:offset + count].permute(1, 2, 0)
                cache.values[index][:, start:end] = v[offset:offset + count].transpose(0, 1)
                out = attend(q[offset:offset + count].transpose(0, 1), cache.keys[index][:, :, :end],
                             cache.values[index][:, :end], scale, causal_from=start)
                outputs.append(out.transpose(0, 1).reshape(count, heads * dim))
                offset += count
            hidden = hidden + attn.o_proj(torch.cat(outputs) if len(outputs) > 1 else outputs[0])
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        for cache, ids in zip(caches, new_ids):
            cache.ids.extend(ids)
        if logits is None:
            return None
        if logits == "last":
            ends = torch.tensor(counts).cumsum(0) - 1
            return model.lm_head(inner.norm(hidden[ends]))
        return list(torch.split(model.lm_head(inner.norm(hidden)), counts))


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def shared_prefixes(held: list[list[int]], contexts: list[list[int]]) -> list[tuple[int, int | None, int]]:
    """Plan a prefill that computes every shared prefix once (prefix caching).

    For row i, whose cache holds `held[i]` and must cover `contexts[i]`: (keep, donor, copy): it keeps the first `keep`
    positions of its own cache, and, when `donor` is not None, copies positions keep .. copy of row `donor`'s cache
    once that row is filled (its context shares those tokens; the donor comes before i). The system prompt is
    shared by every episode, and a query's prompt by its G samples: each is then run through the model once."""
    plan = []
    for i, ids in enumerate(contexts):
        keep = common_prefix_length(held[i], ids)
        best, copy = None, keep
        for j in range(i):
            shared = common_prefix_length(contexts[j], ids)
            if shared > copy:
                best, copy = j, shared
        plan.append((keep, best, copy))
    return plan


def prefill(model, caches: list[RowCache], contexts: list[list[int]]) -> None:
    """Advance every cache to cover exactly its context: each keeps the longest common prefix of what it holds and
    its context, copies what it shares with an earlier row's context from that row (`shared_prefixes`), and the
    rest of every context runs through the model, batched, in as few waves as the copies allow (a row that copies
    waits for its donor)."""
    plan = shared_prefixes([cache.ids for cache in caches], contexts)
    for cache, (keep, _, _) in zip(caches, plan):
        cache.truncate(keep)
    done = [False] * len(caches)
    while not all(done):
        wave = [i for i, (_, donor, _) in enumerate(plan) if not done[i] and (donor is None or done[donor])]
        rows, rests = [], []
        for i in wave:
            keep, donor, copy = plan[i]
            if donor is not None:
                caches[i].copy_from(caches[donor], keep, copy)
            if caches[i].length < len(contexts[i]):
                rows.append(caches[i])
                rests.append(contexts[i][caches[i].length:])
            done[i] = True
        if rows:
            forward_rows(model, rows, rests, logits=None)


def decode_step(model, caches: list[RowCache], tokens: list[int]):
    """One token more for every row: returns the next-token logits, [rows, vocab]."""
    return forward_rows(model, caches, [[token] for token in tokens])
