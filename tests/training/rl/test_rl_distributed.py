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
pytestmark = pytest.mark.slow


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


@pytest.mark.parametrize("algorithm, knobs", CASES, ids=[f"{a}{'-' + '-'.join(k) if k else ''}" for a, k in CASES])
def test_two_processes_make_the_one_process_update(algorithm, knobs, qwen2_dir, tmp_path):
    out = tmp_path / "two.safetensors"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(WORKER), str(qwen2_dir), algorithm, str(out), json.dumps(knobs)],
                          env=worker_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = one_process_weights(qwen2_dir, algorithm, knobs)
    assert max_difference(out, reference) <= 1e-5
    assert max_difference(out, start_weights(qwen2_dir)) > 1e-4  # the step moved the weights


def start_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {k: v.detach() for k, v in model.named_parameters()}


def test_two_nodes_rendezvousing_on_localhost_make_the_one_process_update(qwen2_dir, tmp_path):
    """The multi-node path on one machine: two torchrun launchers, `--nnodes 2`, one process each, a c10d
    rendezvous on 127.0.0.1 (what each node of a cluster runs, with the first node's address)."""
    out = tmp_path / "nodes.safetensors"
    endpoint = f"127.0.0.1:{free_port()}"
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "star-rl-test", "--node-rank", str(node),
         str(WORKER), str(qwen2_dir), "grpo", str(out)],
        env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    logs = [launcher.communicate(timeout=300)[0] for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], "\n".join(log[-2000:] for log in logs)
    assert max_difference(out, one_process_weights(qwen2_dir, "grpo", {})) <= 1e-5
