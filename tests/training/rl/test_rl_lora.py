"""LoRA through peft: only the adapters train, checkpoints hold them alone and resume exactly, the final model is
the base with the adapters merged, and the vLLM weight sync streams merged weights under the base's names."""
from __future__ import annotations

import torch

from components.training.rl.params import RLParams
from components.training.rl.trainer import RLPaths, train

LORA = {"max_steps": 2, "queries_per_step": 1, "num_generations": 2, "learning_rate": 1e-2, "micro_batch_size": 2,
        "entropy_coeff": -0.5,  # a gradient even when the untrained model's rewards tie
        "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096},
        "lora": {"enabled": True, "r": 4, "alpha": 8}}


def paths_in(root, model, world, queries) -> RLPaths:
    return RLPaths(model=model, world=world, queries=queries, out=root / "models/rl", checkpoints=root / "ckpt",
                   metrics=root / "metrics/rl.json", plots=root / "plots/rl")


def weights(directory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


def test_lora_trains_the_adapters_alone_and_merges_them_into_an_ordinary_model(tmp_path, tiny_model_dir,
                                                                               tiny_world_dir, rl_queries_path):
    from components.models.loading import load_policy_model

    paths = paths_in(tmp_path, tiny_model_dir, tiny_world_dir, rl_queries_path)
    train(RLParams.model_validate(LORA), paths, progress_bar=False)
    checkpoint = paths.checkpoints / "step-00000002"
    assert (checkpoint / "adapter_model.safetensors").exists() and not (checkpoint / "model.safetensors").exists()
    base, final = weights(tiny_model_dir), weights(paths.out)
    assert final.keys() == base.keys()  # the base's own names: no lora_ or base_layer entries
    changed = {name for name in base if not torch.equal(base[name], final[name])}
    assert changed and all("_proj." in name for name in changed)  # the adapted projections
    assert not any("embed" in name or "norm" in name for name in changed)  # frozen: only adapted weights move
    load_policy_model(paths.out, dtype="float32", device="cpu")  # an ordinary checkpoint for validate@rl


def test_a_lora_run_resumes_from_its_adapters_to_the_uninterrupted_weights(tmp_path, tiny_model_dir, tiny_world_dir,
                                                                          rl_queries_path):
    straight = paths_in(tmp_path / "straight", tiny_model_dir, tiny_world_dir, rl_queries_path)
    parts = paths_in(tmp_path / "parts", tiny_model_dir, tiny_world_dir, rl_queries_path)
    train(RLParams.model_validate({**LORA, "max_steps": 3}), straight, progress_bar=False)
    train(RLParams.model_validate(LORA), parts, progress_bar=False)
    summary = train(RLParams.model_validate({**LORA, "max_steps": 3}), parts, progress_bar=False)
    assert summary["resumed_from_step"] == 2
    a, b = weights(straight.out), weights(parts.out)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_the_weight_sync_streams_merged_weights_under_the_base_names(tiny_model_dir):
    from types import SimpleNamespace

    from components.models.loading import load_policy_model
    from components.training.rl.lora import attach_lora, merged_model
    from components.training.rl.params import LoraParams
    from components.training.rl.weight_sync import EngineWeightSync

    model, adapters = attach_lora(load_policy_model(tiny_model_dir, dtype="float32", device="cpu"),
                                  LoraParams(enabled=True, r=4, alpha=8))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()  # a trained adapter (B starts at 0)
    loaded = {}
    engine = SimpleNamespace(sleeps=False, push_weights=lambda pairs: loaded.update({n: t.clone() for n, t in pairs}))
    EngineWeightSync(engine).push(model)
    merged = dict(merged_model(adapters).named_parameters())
    assert loaded.keys() == merged.keys()
    assert all(torch.allclose(loaded[name], merged[name].data, atol=1e-6) for name in merged)
    assert any(not torch.equal(loaded[n], weights(tiny_model_dir)[n]) for n in loaded if "q_proj.weight" in n)


def test_lora_needs_the_plain_torch_optimiser():
    import pytest

    with pytest.raises(ValueError, match="lora.enabled trains adapters with the plain torch optimiser"):
        RLParams.model_validate({"lora": {"enabled": True}, "distributed": {"strategy": "deepspeed"}})


def test_a_resumed_lora_run_pushes_its_adapters_to_the_engine_before_the_first_rollout(tmp_path, tiny_model_dir,
                                                                                      tiny_world_dir, rl_queries_path,
                                                                                      monkeypatch):
    """The engine loads the base (a LoRA checkpoint holds adapters only); the resumed adapters reach it, merged,
    through the weight sync before any rollout."""
    import dataclasses

    from components.training.rl import trainer

    paths = paths_in(tmp_path, tiny_model_dir, tiny_world_dir, rl_queries_path)
    train(RLParams.model_validate(LORA), paths, progress_bar=False)
    pushes, sources = [], []

    class Recorder:
        def push(self, model):
            pushes.append(len(pushes))
            return 0

    real = trainer.rollout_backend

    def recording(name, device=None):  # the run's backend, recording what it loads and what it is pushed
        backend = real(name, device)
        return dataclasses.replace(backend, weight_sync=lambda policy, own_copy: Recorder(),
                                   build=lambda inputs: sources.append(inputs.checkpoint) or backend.build(inputs))

    monkeypatch.setattr(trainer, "rollout_backend", recording)
    run = trainer.start_run(RLParams.model_validate({**LORA, "max_steps": 3}), paths, lambda tags: None, None)
    assert run.resumed_from == 2 and pushes == [0] and sources == [str(tiny_model_dir)]
