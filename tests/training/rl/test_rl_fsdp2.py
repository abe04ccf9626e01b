"""`rl.distributed.strategy: fsdp2` rehearsed on a CPU: gloo, two processes, the tiny random Qwen2 model of
test_rl_distributed.py.

Two sharded processes must make the update one process (strategy none) makes on the same global batch, also when
the ranks hold different numbers of micro-batches (idle passes keep FSDP's collectives matched); and a two-process
`star rl` killed outright after step 2's checkpoint resumes from its sharded checkpoint to the weights of an
uninterrupted run, its final model an ordinary Hugging Face checkpoint; and a sharded checkpoint loads exactly onto
another number of processes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from training.rl.test_rl_distributed import (  # noqa: F401 (qwen2_dir is a fixture)
    REPO,
    max_difference,
    one_process_weights,
    qwen2_dir,
    start_weights,
    two_process_updates,
    worker_env,
)

RESHARD_WORKER = Path(__file__).with_name("fsdp2_reshard.py")
CASES = [("grpo", {}), ("dr_grpo", {}), ("dapo", {}), ("arpo", {}),
         # rank 0 trains three groups (3 micro-batches, twice: pi_old is recomputed), rank 1 one group
         ("grpo", {"rank_groups": [[0, 1, 2], [3]], "num_iterations": 2}),
         ("grpo", {"distributed": {"gradient_checkpointing": True}})]


def sharded(knobs: dict) -> dict:
    return {**knobs, "distributed": {**knobs.get("distributed", {}), "strategy": "fsdp2"}}


@pytest.fixture(scope="module")
def sharded_updates(qwen2_dir, tmp_path_factory) -> list[Path]:
    """Every case's sharded update in one two-process world."""
    cases = [[algorithm, sharded(knobs)] for algorithm, knobs in CASES]
    return two_process_updates(qwen2_dir, cases, tmp_path_factory.mktemp("fsdp2"))


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=["grpo", "dr_grpo", "dapo", "arpo", "grpo-uneven", "grpo-gradient_checkpointing"])
def test_two_sharded_processes_make_the_one_process_update(case, sharded_updates, qwen2_dir):
    algorithm, knobs = CASES[case]
    out = sharded_updates[case]
    reference = one_process_weights(qwen2_dir, algorithm, {k: v for k, v in knobs.items()
                                                           if k not in ("rank_groups", "distributed")})
    difference = max_difference(out, reference)
    print(f"fsdp2 {algorithm} {knobs}: max |w_2proc - w_1proc| = {difference:.3g}")
    assert difference <= 1e-5
    assert max_difference(out, start_weights(qwen2_dir)) > 1e-4  # the step moved the weights
    # the weight sync fills a rollout engine's own copy, parameter by parameter from the shards, with those weights
    assert max_difference(out.with_suffix(".synced.safetensors"), reference) <= 1e-5


def test_an_idle_pass_adds_nothing_to_the_gradients(qwen2_dir):
    """What a rank without a micro-batch runs: a forward and backward that leaves every gradient zero."""
    from transformers import AutoModelForCausalLM

    from components.training.rl.update import PolicyLogits, idle_pass, in_lockstep

    model = PolicyLogits(AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32))

    class Backward:
        def backward(self, loss, sync=True):
            loss.backward()

    idle_pass(model, pad_id=0, optimizer=Backward())
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads) and all(torch.count_nonzero(g) == 0 for g in grads)
    from components.training.rl.distributed import SINGLE

    assert in_lockstep([[0], [1]], model, SINGLE) == [[0], [1]]


def star_rl_command(run_dir: Path, max_steps: int, model: Path, world: Path, queries: Path, processes: int = 2,
                    queries_per_step: int = 2) -> tuple[list, dict]:
    """`star rl` with rl.distributed.strategy: fsdp2 over `processes` processes (it starts torchrun itself); an
    entropy term gives the untrained model's tied rewards a gradient, so every step moves the weights."""
    import yaml

    params = {"max_steps": max_steps, "queries_per_step": queries_per_step, "num_generations": 2,
              "learning_rate": 1e-3, "entropy_coeff": -0.5, "micro_batch_size": 2, "keep_checkpoints": 3,
              "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096},
              "distributed": {"processes": processes, "strategy": "fsdp2"}}
    run_dir.mkdir(exist_ok=True)
    params_file = run_dir / "rl.yaml"
    params_file.write_text(yaml.safe_dump({"rl": params}))
    command = [sys.executable, "-m", "components.cli", "rl", "--params", str(params_file), "--model", str(model),
               "--world", str(world), "--queries", str(queries), "--out", str(run_dir / "models/rl"),
               "--checkpoints", str(run_dir / "checkpoints/rl"), "--metrics", str(run_dir / "metrics/rl.json"),
               "--plots", str(run_dir / "plots/rl"), "--no-register"]
    env = {**worker_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{run_dir / 'mlflow.db'}", "STAR_EXPERIMENT": "fsdp2",
           "STAR_PRESET": "tiny", "STAR_PARENT_RUN_ID": ""}
    return command, env


def star_rl(run_dir: Path, max_steps: int, *inputs: Path, **world) -> str:
    command, env = star_rl_command(run_dir, max_steps, *inputs, **world)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout + done.stderr


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, grandchildren, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def killed_after_step_2(run_dir: Path, *inputs: Path) -> None:
    """Start a 3-step run and SIGKILL it, its torchrun and both workers (which torchrun starts in sessions of their
    own, so one killpg would miss them) as soon as step 2's checkpoint is complete."""
    command, env = star_rl_command(run_dir, 3, *inputs)
    log = (run_dir / "killed.log").open("w")
    star = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    marker = run_dir / "checkpoints/rl/step-00000002/state.json"
    deadline = time.monotonic() + 600
    while not marker.exists():
        assert star.poll() is None, (run_dir / "killed.log").read_text()[-4000:]
        assert time.monotonic() < deadline, "step 2's checkpoint never appeared"
        time.sleep(0.02)
    processes = [star.pid, *descendants(star.pid)]
    for pid in reversed(processes):  # the workers first, then torchrun and star rl: none gets to shut down cleanly
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    star.wait(timeout=60)
    log.close()
    assert star.returncode == -signal.SIGKILL
    assert len(processes) >= 4, processes  # star rl, torchrun and two workers
    assert not (run_dir / "checkpoints/rl/step-00000003/state.json").exists(), "killed too late: step 3 finished"


@pytest.mark.slow
def test_a_killed_sharded_run_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path, tiny_model_dir,
                                                                            tiny_world_dir, rl_queries_path):
    """Two fsdp2 processes, three steps straight through, against a run SIGKILLed after step 2's checkpoint and
    resumed: the same weights (bit-exact), one rewards.csv row per step; the checkpoints hold both ranks' shards,
    and the final model is a whole Hugging Face checkpoint."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    inputs = (tiny_model_dir, tiny_world_dir, rl_queries_path)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    log = star_rl(straight, 3, *inputs)
    assert "--nproc_per_node 2" in log
    killed.mkdir()
    killed_after_step_2(killed, *inputs)
    resumed = star_rl(killed, 3, *inputs)
    assert "resumed from" in resumed and "step 2 of 3" in resumed

    final = [load_file(run / "models/rl/model.safetensors") for run in (straight, killed)]
    start = load_file(tiny_model_dir / "model.safetensors")
    assert final[0].keys() == final[1].keys() == start.keys()  # a whole model, under the Hugging Face names
    assert all(final[0][k].dtype == torch.float32 and final[0][k].shape == start[k].shape for k in start)
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])  # bit-exact
    assert any(not torch.equal(final[0][k], start[k]) for k in start)  # and trained
    AutoModelForCausalLM.from_pretrained(straight / "models/rl")  # loads as any checkpoint

    for run in (straight, killed):
        rows = (run / "plots/rl/rewards.csv").read_text().splitlines()
        assert [row.split(",")[0] for row in rows[1:]] == ["1", "2", "3"]
        newest = run / "checkpoints/rl/step-00000003"
        shards = sorted(p.name for p in (newest / "sharded").iterdir())
        assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert not (newest / "model.safetensors").exists()  # sharded: no whole copy in a checkpoint
        assert (newest / "rng.json").exists() and (newest / "rng-rank1.json").exists()
        assert json.loads((newest / "state.json").read_text())["extra"]["world_size"] == 2
    assert not list((killed / "checkpoints/rl").glob("*.tmp-*"))  # the killed step's partial folder was removed


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_on_another_number_of_processes(tmp_path, tiny_model_dir, tiny_world_dir,
                                                                     rl_queries_path):
    """Two processes write step 2's shards; three load them (DCP reshards): the weights are exactly the two-process
    run's, and the run goes on from step 3 with three shards per checkpoint."""
    from safetensors.torch import load_file

    inputs, run = (tiny_model_dir, tiny_world_dir, rl_queries_path), tmp_path / "run"
    star_rl(run, 2, *inputs, processes=2, queries_per_step=6)
    two = load_file(run / "models/rl/model.safetensors")
    log = star_rl(run, 2, *inputs, processes=3, queries_per_step=6)  # resumes at its last step: the loaded weights
    assert "step 2 of 2" in log and "its shards are resharded" in log
    three = load_file(run / "models/rl/model.safetensors")
    assert two.keys() == three.keys() and all(torch.equal(two[k], three[k]) for k in two)
    start = load_file(tiny_model_dir / "model.safetensors")
    assert any(not torch.equal(two[k], start[k]) for k in start)

    star_rl(run, 3, *inputs, processes=3, queries_per_step=6)
    rows = (run / "plots/rl/rewards.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["1", "2", "3"]
    newest = run / "checkpoints/rl/step-00000003"
    assert sorted(p.name for p in (newest / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp",
                                                                       "__2_0.distcp"]
    assert json.loads((newest / "state.json").read_text())["extra"]["world_size"] == 3
    assert not any(torch.equal(load_file(run / "models/rl/model.safetensors")[k], two[k]) for k in two)


@pytest.mark.slow
def test_dcp_reshards_the_weights_and_adam_moments_exactly(qwen2_dir, tmp_path):
    """A checkpoint written by two processes after one step, loaded by three: every weight and both AdamW moments of
    every parameter are the ones the two processes held."""
    from safetensors.torch import load_file

    held = {}
    for mode, processes in (("save", 2), ("load", 3)):
        out = tmp_path / f"{mode}.safetensors"
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                               str(processes), str(RESHARD_WORKER), str(qwen2_dir), mode, str(tmp_path / "ckpt"),
                               str(out)], env=worker_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        held[mode] = load_file(out)
    saved, loaded = held["save"], held["load"]
    assert saved.keys() == loaded.keys() and any(k.startswith("exp_avg_sq/") for k in saved)
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert any(torch.count_nonzero(saved[k]) for k in saved if k.startswith("exp_avg/"))  # a step was taken


def test_only_a_sharded_checkpoint_is_taken_by_another_number_of_processes(tmp_path):
    from components.errors import UserError
    from components.training.rl import checkpoint as ckpt
    from components.training.rl.distributed import SINGLE
    from components.training.rl.trainer import WORLD_SIZE_KEY, agreed_checkpoint

    inputs = {"params": "p"}
    state = ckpt.TrainState(step=2, extra={"fingerprint": inputs, WORLD_SIZE_KEY: 2})
    ckpt.save_checkpoint(tmp_path, state, save_model=lambda d: None, save_optimizer=lambda d: None, keep=2,
                         rng_states=[ckpt.capture_rng(), ckpt.capture_rng()])
    chosen, resumed = agreed_checkpoint(tmp_path, inputs, SINGLE, reshardable=True)
    assert chosen == tmp_path / "step-00000002" and resumed.step == 2
    with pytest.raises(UserError, match="trained by 2 process"):
        agreed_checkpoint(tmp_path, inputs, SINGLE)


def test_fsdp2_needs_several_processes_and_full_weights():
    from components.training.rl.params import RLParams

    with pytest.raises(ValueError, match="strategy: fsdp2 shards the model over several processes"):
        RLParams.model_validate({"distributed": {"strategy": "fsdp2"}})
    with pytest.raises(ValueError, match="lora.enabled trains adapters .*strategy is fsdp2: set distributed.strategy: "
                                         "none"):
        RLParams.model_validate({"lora": {"enabled": True}, "queries_per_step": 4,
                                 "distributed": {"strategy": "fsdp2", "processes": 2}})
    assert RLParams.model_validate({"distributed": {"strategy": "fsdp2", "processes": 2}}).distributed.processes == 2
