"""The RL trainer on the real vLLM engine on CPU (components/agent/engine_server.py in .venv-engine): every step logs
the engine/trainer log-prob mismatch and the weight sync's time, and the run stops its engine. Skipped where this
checkout has no engine environment."""
from __future__ import annotations

from pathlib import Path

import pytest

from components.training.rl.params import RLParams
from components.training.rl.trainer import RLPaths, train


def engine_processes(parent: int) -> list[int]:
    """Pids of live engine processes started by process `parent` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"components.agent.engine_server" in command and str(parent).encode() in command and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.integration
def test_rl_on_the_engine_logs_the_mismatch_and_the_sync_time_every_step(engine_python, monkeypatch, tmp_path,
                                                                        small_model_factory, smol_tokenizer,
                                                                        tiny_world_dir, rl_queries_path):
    import os

    from components.models.checkpoints import save_checkpoint

    monkeypatch.setenv("STAR_ENGINE_PYTHON", str(engine_python))
    # head_dim 64: a head size vLLM's CPU attention serves
    model = small_model_factory(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256)
    save_checkpoint(model, smol_tokenizer, tmp_path / "sft", stage="test")
    params = RLParams.model_validate({
        "max_steps": 2, "queries_per_step": 1, "num_generations": 2, "learning_rate": 1e-3, "micro_batch_size": 2,
        "rollout": {"backend": "vllm", "max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096}})
    paths = RLPaths(model=tmp_path / "sft", world=tiny_world_dir, queries=rl_queries_path, out=tmp_path / "rl",
                    checkpoints=tmp_path / "checkpoints", metrics=tmp_path / "rl.json", plots=tmp_path / "plots")
    logged = []
    before = engine_processes(os.getpid())  # other tests' session engines, if any
    train(params, paths, log=lambda metrics, step: logged.append((step, metrics)), progress_bar=False)
    assert [step for step, _ in logged] == [1, 2]
    for _, metrics in logged:
        assert metrics["policy/weight_sync_tensors"] == len(list(model.parameters()))
        assert metrics["policy/weight_sync_s"] > 0
        assert 0 <= metrics["policy/logprob_mismatch"] <= 1e-4  # float32 on both sides
    assert engine_processes(os.getpid()) == before  # the run stopped its engine
