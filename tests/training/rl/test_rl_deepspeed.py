"""`distributed.strategy: deepspeed` (accelerate + ZeRO-2) through the real trainer, where deepspeed is installed.

DeepSpeed runs on CPU too, so these run wherever `pip install deepspeed` was done (they are skipped in CI, which
installs no [gpu] extra). A plain `star rl` with this strategy is a world of one process: no launcher needed.
"""
import importlib.util

import pytest
import torch

from components.training.rl.checkpoint import complete_checkpoints
from components.training.distributed import single_process_defaults
from components.training.rl.params import RLParams
from components.training.rl.trainer import RLPaths, train

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="deepspeed is not installed (the [gpu] extra)")

ZERO2 = {"max_steps": 2, "queries_per_step": 1, "num_generations": 2, "learning_rate": 1e-3, "micro_batch_size": 1,
         "device": "cpu", "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096},
         "distributed": {"strategy": "deepspeed", "zero_stage": 2}}


def test_a_plain_run_becomes_a_world_of_one_and_a_launchers_variables_win():
    environ = {}
    assert single_process_defaults(environ) == environ
    assert environ["WORLD_SIZE"] == "1" and environ["RANK"] == "0" and environ["MASTER_ADDR"] == "127.0.0.1"
    launched = {"WORLD_SIZE": "8", "RANK": "3", "MASTER_ADDR": "10.0.0.1"}
    assert single_process_defaults(launched) == {} and launched["RANK"] == "3"


@needs_deepspeed
@pytest.mark.slow
def test_zero2_trains_checkpoints_and_resumes(tmp_path, tiny_model_dir, tiny_world_dir, rl_queries_path, monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_PORT", "29517")
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
