"""Data-parallel RL rehearsed on a CPU: gloo, two processes, a tiny randomly initialised Qwen2 model.

N processes must make the update one process makes on the same global batch (each rank trains whole groups; the
loss is normalised by the global batch and the gradients summed), in one machine's world and in a two-node world
rendezvousing on 127.0.0.1; and `star rl` with two processes writes one reward curve, one MLflow run and one
checkpoint tree, and resumes to the weights of an uninterrupted run.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("dp_update.py")



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory) -> Path:
    """A 2-layer Qwen2 (the real presets' architecture: biased q/k/v, tied embeddings) over a 256-token vocabulary."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True)
    out = tmp_path_factory.mktemp("qwen2")
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def one_process_weights(model_dir: Path, algorithm: str, knobs: dict) -> dict[str, torch.Tensor]:
    sys.path.insert(0, str(WORKER.parent))
    try:
        from dp_update import update
    finally:
        sys.path.pop(0)
    from components.training.rl.distributed import SINGLE

    return {k: v.detach() for k, v in update(str(model_dir), algorithm, knobs, SINGLE).named_parameters()}


def max_difference(saved: Path, reference: dict[str, torch.Tensor]) -> float:
    from safetensors.torch import load_file

    weights = load_file(saved)
    assert weights.keys() == reference.keys()
    return max((weights[k] - reference[k]).abs().max().item() for k in reference)


CASES = [("grpo", {}), ("dr_grpo", {}), ("dapo", {}), ("arpo", {}),
         ("grpo", {"mini_batch_size": 8, "num_iterations": 2, "micro_batch_size": 3})]


def two_process_updates(model_dir: Path, cases: list, out_dir: Path) -> list[Path]:
    """Every case's update in one two-process world (dp_update.py); the weights file of each case."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(WORKER), str(model_dir), str(out_dir), json.dumps(cases)],
                          env=worker_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [out_dir / f"{i}.safetensors" for i in range(len(cases))]


@pytest.fixture(scope="module")
def data_parallel_updates(qwen2_dir, tmp_path_factory) -> list[Path]:
    return two_process_updates(qwen2_dir, CASES, tmp_path_factory.mktemp("data_parallel"))


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{a}{'-' + '-'.join(k) if k else ''}" for a, k in CASES])
def test_two_processes_make_the_one_process_update(case, data_parallel_updates, qwen2_dir):
    algorithm, knobs = CASES[case]
    out = data_parallel_updates[case]
    reference = one_process_weights(qwen2_dir, algorithm, knobs)
    assert max_difference(out, reference) <= 1e-5
    assert max_difference(out, start_weights(qwen2_dir)) > 1e-4  # the step moved the weights


def start_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {k: v.detach() for k, v in model.named_parameters()}


@pytest.mark.slow
def test_two_nodes_rendezvousing_on_localhost_make_the_one_process_update(qwen2_dir, tmp_path):
    """The multi-node path on one machine: two torchrun launchers, `--nnodes 2`, one process each, a c10d
    rendezvous on 127.0.0.1 (what each node of a cluster runs, with the first node's address)."""
    endpoint = f"127.0.0.1:{free_port()}"
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "star-rl-test", "--node-rank", str(node),
         str(WORKER), str(qwen2_dir), str(tmp_path), json.dumps([["grpo", {}]])],
        env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    logs = [launcher.communicate(timeout=300)[0] for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], "\n".join(log[-2000:] for log in logs)
    assert max_difference(tmp_path / "0.safetensors", one_process_weights(qwen2_dir, "grpo", {})) <= 1e-5


def star_rl(tmp_path: Path, run_dir: Path, max_steps: int, model: Path, world: Path, queries: Path):
    """`star rl` as `dvc repro` runs it, with rl.distributed.processes: 2 (it starts torchrun itself); an entropy
    term gives the untrained model's tied rewards a gradient, so every step moves the weights."""
    import yaml

    params = {"max_steps": max_steps, "queries_per_step": 2, "num_generations": 2, "learning_rate": 1e-3,
              "entropy_coeff": -0.5, "micro_batch_size": 2,
              "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096},
              "distributed": {"processes": 2}}
    params_file = run_dir / "rl.yaml"
    run_dir.mkdir(exist_ok=True)
    params_file.write_text(yaml.safe_dump({"rl": params}))
    command = [sys.executable, "-m", "components.cli", "rl", "--params", str(params_file), "--model", str(model),
               "--world", str(world), "--queries", str(queries), "--out", str(run_dir / "models/rl"),
               "--checkpoints", str(run_dir / "checkpoints/rl"), "--metrics", str(run_dir / "metrics/rl.json"),
               "--plots", str(run_dir / "plots/rl"), "--no-register"]
    env = {**worker_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{run_dir / 'mlflow.db'}", "STAR_EXPERIMENT": "dp",
           "STAR_PRESET": "tiny", "STAR_PARENT_RUN_ID": ""}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout + done.stderr


@pytest.mark.slow
def test_star_rl_in_two_processes_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path, tiny_model_dir,
                                                                                  tiny_world_dir, rl_queries_path):
    """Two processes, three steps straight through, against two steps then a resumed third (the run stopped at its
    step budget after step 2's checkpoint): the same weights; one rewards.csv row per step, one MLflow run per
    invocation (rank 0's), one checkpoint tree with both ranks' generator states."""
    from mlflow.tracking import MlflowClient
    from safetensors.torch import load_file

    inputs = (tiny_model_dir, tiny_world_dir, rl_queries_path)
    straight, parts = tmp_path / "straight", tmp_path / "parts"
    log = star_rl(tmp_path, straight, 3, *inputs)
    assert "--nproc_per_node 2" in log
    star_rl(tmp_path, parts, 2, *inputs)
    resumed = star_rl(tmp_path, parts, 3, *inputs)
    assert "resumed from" in resumed and "step 2 of 3" in resumed

    final = [load_file(run / "models/rl/model.safetensors") for run in (straight, parts)]
    start = load_file(tiny_model_dir / "model.safetensors")
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])  # bit-exact
    assert any(not torch.equal(final[0][k], start[k]) for k in start)  # and trained

    for run, invocations in ((straight, 1), (parts, 2)):
        rows = (run / "plots/rl/rewards.csv").read_text().splitlines()
        assert [row.split(",")[0] for row in rows[1:]] == ["1", "2", "3"]
        steps = sorted(p.name for p in (run / "checkpoints/rl").iterdir())
        assert steps == ["step-00000002", "step-00000003"]
        newest = run / "checkpoints/rl/step-00000003"
        assert (newest / "rng.json").exists() and (newest / "rng-rank1.json").exists()
        assert json.loads((newest / "state.json").read_text())["extra"]["world_size"] == 2
        client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
        runs = client.search_runs([client.get_experiment_by_name("dp").experiment_id])
        assert len(runs) == invocations and {r.info.status for r in runs} == {"FINISHED"}


def test_a_checkpoint_of_another_world_size_is_refused_with_the_fix(tmp_path):
    from components.errors import UserError
    from components.training.rl import checkpoint as ckpt
    from components.training.rl.distributed import SINGLE
    from components.training.rl.trainer import WORLD_SIZE_KEY, agreed_checkpoint

    inputs = {"params": "p"}
    state = ckpt.TrainState(step=2, extra={"fingerprint": inputs, WORLD_SIZE_KEY: 2})
    ckpt.save_checkpoint(tmp_path, state, save_model=lambda d: None, save_optimizer=lambda d: None, keep=2,
                         rng_states=[ckpt.capture_rng(), ckpt.capture_rng()])
    with pytest.raises(UserError, match=r"trained by 2 process\(es\) and this run has 1.*processes: 2"):
        agreed_checkpoint(tmp_path, inputs, SINGLE)
