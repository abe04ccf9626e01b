"""Small random models over SmolLM2's vocabulary and the one loading path shared with real checkpoints."""
from __future__ import annotations

import pytest
import torch

from components.errors import UserError


def test_small_llama_is_smollm2s_architecture_over_its_vocabulary(smol_tokenizer):
    from components.models.factory import count_parameters, small_llama

    hidden, layers, kv_dim, mlp = 64, 3, 2 * 16, 96  # 4 heads of 16, 2 of them for keys and values
    model = small_llama(smol_tokenizer, hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2,
                        intermediate_size=mlp)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == layers
    assert model.config.vocab_size == len(smol_tokenizer) == 49_152
    end_of_turn = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.config.eos_token_id == model.generation_config.eos_token_id == end_of_turn
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as in SmolLM2
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_dim + 3 * hidden * mlp + 2 * hidden  # attention, MLP, norms
    assert count_parameters(model) == 49_152 * hidden + layers * per_layer + hidden  # the tied matrix counted once


def test_random_model_overrides_a_copy_of_the_config_and_refuses_unknown_fields(tiny_model):
    from components.models.factory import random_model

    shallow = random_model(tiny_model.config, seed=1, num_hidden_layers=1)
    assert shallow.config.num_hidden_layers == 1 and tiny_model.config.num_hidden_layers == 2
    assert shallow.config.hidden_size == tiny_model.config.hidden_size and shallow.dtype == torch.float32
    again = random_model(tiny_model.config, seed=1, num_hidden_layers=1)
    assert torch.equal(shallow.model.embed_tokens.weight, again.model.embed_tokens.weight)  # seeded
    with pytest.raises(ValueError, match="has no field 'num_layers'"):
        random_model(tiny_model.config, num_layers=1)


def test_saved_checkpoint_reloads_through_load_policy_model(tiny_model, tiny_tokenizer, tmp_path):
    from components.models.checkpoints import read_manifest, save_checkpoint
    from components.models.loading import load_policy_model, load_tokenizer

    save_checkpoint(tiny_model, tiny_tokenizer, tmp_path / "ckpt", stage="test")
    model = load_policy_model(tmp_path / "ckpt", dtype="auto", device="cpu")
    tokenizer = load_tokenizer(tmp_path / "ckpt")
    ids = torch.tensor([tokenizer.encode("<|im_start|>user\nPlan a trip<|im_end|>")])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, tiny_model.eval()(ids).logits, atol=1e-5)
    assert model.dtype == torch.float32 and not model.training
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert read_manifest(tmp_path / "ckpt")["stage"] == "test"


def test_missing_checkpoint_directory_says_what_to_run(tmp_path):
    from components.models.loading import load_policy_model

    with pytest.raises(UserError, match="does not exist"):
        load_policy_model(tmp_path / "models" / "sft")


def test_dtype_auto_is_float32_on_cpu_and_unknown_dtypes_are_rejected():
    from components.models.loading import resolve_dtype

    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(UserError, match="unknown dtype"):
        resolve_dtype("fp8", "cpu")


def test_cpu_models_decode_with_the_matrix_product_attention():
    from components.models.attention import CPU_DECODE_ATTENTION
    from components.models.loading import attention_implementation

    assert attention_implementation("cpu", torch.bfloat16) == CPU_DECODE_ATTENTION
    assert attention_implementation("cuda", torch.float32) == "sdpa"


def test_snapshot_of_a_local_checkpoint_loads_like_the_original(tiny_model, tiny_tokenizer, tmp_path):
    from components.models.checkpoints import read_manifest, save_checkpoint, snapshot_pretrained
    from components.models.loading import load_policy_model

    save_checkpoint(tiny_model, tiny_tokenizer, tmp_path / "pretrained")
    snapshot_pretrained(str(tmp_path / "pretrained"), tmp_path / "base")
    assert read_manifest(tmp_path / "base")["source"] == str(tmp_path / "pretrained")
    model = load_policy_model(tmp_path / "base", device="cpu")
    assert model.config.hidden_size == tiny_model.config.hidden_size


def test_snapshot_refuses_a_folder_that_is_not_a_checkpoint(tmp_path):
    from components.models.checkpoints import snapshot_pretrained

    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="config.json"):
        snapshot_pretrained(str(tmp_path / "empty"), tmp_path / "base")
