"""The tiny Qwen2 model and the one loading path shared with real checkpoints."""
from __future__ import annotations

import pytest
import torch

from components.errors import UserError


def test_tiny_model_is_a_few_million_parameters_of_qwen2(tiny_tokenizer):
    from components.models.factory import build_tiny_model, count_parameters

    model = build_tiny_model(tiny_tokenizer, hidden_size=192, num_layers=3, num_heads=6, num_kv_heads=2)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tiny_tokenizer)
    assert model.config.eos_token_id == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert 1_000_000 < count_parameters(model) < 5_000_000


def test_heads_must_divide_the_hidden_size(tiny_tokenizer):
    from components.models.factory import build_tiny_model

    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tiny_tokenizer, hidden_size=100, num_heads=6)


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
