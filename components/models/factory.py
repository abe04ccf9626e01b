"""Randomly initialised models of a given architecture: the smoke preset's base and the tests' small models."""
from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config


def random_model(config, seed: int = 0, **overrides):
    """A freshly initialised float32 causal LM of `config`'s architecture, with `overrides` (e.g. num_hidden_layers=2)
    applied to a copy of the config."""
    config = copy.deepcopy(config)
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise ValueError(f"{type(config).__name__} has no field {key!r}")
        setattr(config, key, value)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")


def small_llama(tokenizer, seed: int = 0, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                num_kv_heads: int = 2, intermediate_size: int = 128, max_position_embeddings: int = 8192):
    """A small Llama model (SmolLM2's architecture) over `tokenizer`'s vocabulary, for tests and benchmarks."""
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                         intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tokenizer.pad_token_id)
    model = random_model(config, seed=seed)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def small_qwen2(tokenizer, seed: int = 0, hidden_size: int = 256, num_layers: int = 2,
                max_position_embeddings: int = 32768):
    """A small Qwen2.5 Instruct model (the real presets' architecture: biased q/k/v, tied embeddings, rope theta 1e6,
    RMSNorm eps 1e-6, no sliding window) over `tokenizer`'s vocabulary, with 64-wide heads, two key/value heads and
    Qwen2.5-1.5B's MLP ratio (8960 / 1536)."""
    if hidden_size <= 0 or hidden_size % 128:
        raise ValueError(f"hidden_size {hidden_size} must be a positive multiple of 128 (64-wide heads, two "
                         "key/value heads)")
    heads = hidden_size // 64
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=heads, num_key_value_heads=2,
                         intermediate_size=(hidden_size * 8960 // 1536 + 63) // 64 * 64,
                         max_position_embeddings=max_position_embeddings, rope_theta=1_000_000.0,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=end, pad_token_id=tokenizer.pad_token_id)
    model = random_model(config, seed=seed)
    model.generation_config.eos_token_id = end
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def count_parameters(model) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
