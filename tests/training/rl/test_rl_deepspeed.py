"""`distributed.strategy: deepspeed` (accelerate + ZeRO-2) through the real trainer, where deepspeed is installed.

DeepSpeed runs on CPU too, so these run wherever `pip install deepspeed` was done (they are skipped in CI, which
installs no [gpu] extra). `star rl` with this strategy starts itself under torchrun (components/training/launch.py);
these tests call the trainer directly, so they set the world of one process a launcher would.
"""
import importlib.util

import pytest
import torch

from components.training.rl.checkpoint import complete_checkpoints
from components.training.rl.params import RLParams
from components.training.rl.trainer import RLPaths, train

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="deepspeed is not installed (the [gpu] extra)")

ZERO2 = {"max_steps": 2, "queries_per_step": 1, "num_generations": 2, "learning_rate": 1e-3, "micro_batch_size": 1,
         "device": "cpu", "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096},
         "distributed": {"strategy": "deepspeed", "zero_stage": 2}}


@needs_deepspeed
@pytest.mark.slow
def test_zero2_trains_checkpoints_and_resumes(tmp_path, tiny_model_dir, tiny_world_dir, rl_queries_path, monkeypatch):
    world = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}
    for key, value in world.items():  # what torchrun --nproc_per_node 1 sets
        monkeypatch.setenv(key, value)
    paths = RLPaths(model=tiny_model_dir, world=tiny_world_dir, queries=rl_queries_path, out=tmp_path / "models/rl",
                    checkpoints=tmp_path / "checkpoints/rl", metrics=tmp_path / "metrics/rl.json",
                    plots=tmp_path / "plots/rl")
    logged = []
    summary = train(RLParams.model_validate({**ZERO2, "max_steps": 1}), paths,
                    log=lambda metrics, step: logged.append(metrics), progress_bar=False)
    assert summary["steps_completed"] == 1 and (paths.out / "config.json").exists()
    assert (complete_checkpoints(paths.checkpoints)[0][1] / "accelerate").is_dir()  # ZeRO's optimizer state

    resumed = train(RLParams.model_validate(ZERO2), paths, progress_bar=False)
    assert resumed["resumed_from_step"] == 1 and resumed["steps_completed"] == 2
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(paths.out)
    assert all(torch.isfinite(p).all() for p in model.parameters())
