"""The tiny preset's model: a Qwen2-architecture causal LM built from a config (a few million parameters)."""
from __future__ import annotations


def tiny_qwen2_config(
    tokenizer,
    hidden_size: int = 192,
    num_layers: int = 3,
    num_heads: int = 6,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    max_position_embeddings: int = 8192,
    rope_theta: float = 10000.0,
):
    """A `Qwen2Config` sized for CPU training whose special-token ids come from `tokenizer`."""
    from transformers import Qwen2Config

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads ({num_kv_heads})")
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope_theta,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def build_tiny_model(tokenizer, seed: int = 0, **config_kwargs):
    """A freshly initialised `Qwen2ForCausalLM` (float32) for `tokenizer`; keyword arguments size it
    (see `tiny_qwen2_config`). Its generation config stops at `<|im_end|>` and pads with `<|endoftext|>`."""
    import torch
    from transformers import Qwen2ForCausalLM

    config = tiny_qwen2_config(tokenizer, **config_kwargs)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def count_parameters(model) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
