"""`star sft` / `star rl` start themselves under torchrun where they train in a distributed world
(components/training/launch.py): the decision, the params' checks, the launcher's exit code and signals, and a real
`star sft` with the Trainer backend launched by torchrun on CPU (gloo)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from components.errors import UserError
from components.training import launch
from components.training.rl.params import DistributedParams, RLParams
from components.training.sft_params import SFTParams

ARGV = ["sft", "--params", "params/sft.yaml", "--out", "models/sft"]
WORLD = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
         "MASTER_PORT", "TORCHELASTIC_RUN_ID")


# ------------------------------------------------------------------------------------------------ the decision

def test_a_stage_that_needs_a_world_runs_again_under_torchrun_with_the_same_arguments():
    command = launch.launch_command(ARGV, {"PATH": "/bin"}, 2, python="/venv/bin/python")
    assert command == ["/venv/bin/python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                       "-m", "components.cli", *ARGV]


def test_a_script_can_be_the_target():
    command = launch.launch_command(["--steps", "2"], {}, 1, python="py", target=["benchmarks/bench.py"])
    assert command[:3] == ["py", "-m", "torch.distributed.run"]
    assert command[-3:] == ["benchmarks/bench.py", "--steps", "2"]


@pytest.mark.parametrize("variable", ["WORLD_SIZE", "RANK", "LOCAL_RANK"])
def test_a_process_a_launcher_started_runs_directly(variable):
    assert launch.launch_command(ARGV, {variable: "0"}, 1) is None
    assert launch.launched({variable: "0"}) and not launch.launched({"MASTER_ADDR": "127.0.0.1"})


def test_a_stage_that_needs_no_world_runs_directly():
    assert launch.launch_command(ARGV, {}, None) is None


def test_a_process_count_below_one_is_refused():
    with pytest.raises(UserError, match="at least 1"):
        launch.launch_command(ARGV, {}, 0)


def test_the_trainer_backend_of_sft_launches_its_processes_and_the_torch_loop_none():
    assert launch.sft_processes(SFTParams(backend="trainer")) == 1
    assert launch.sft_processes(SFTParams(backend="trainer", distributed={"strategy": "deepspeed", "zero_stage": 3, "processes": 4})) == 4
    assert launch.sft_processes(SFTParams(backend="auto", distributed={"processes": 2}), cuda_available=True) == 2
    assert launch.sft_processes(SFTParams(backend="auto"), cuda_available=False) is None
    assert launch.sft_processes(SFTParams(backend="torch"), cuda_available=True) is None
    assert launch.sft_processes(SFTParams(backend="auto"), cuda_available=lambda: True) == 1


def test_processes_above_one_with_the_torch_loop_say_which_backend_to_pick():
    with pytest.raises(ValidationError, match=r"processes: 2 needs the transformers Trainer \(backend: trainer"):
        SFTParams(backend="torch", distributed={"processes": 2})
    with pytest.raises(UserError, match=r"toolstar_sft.distributed.processes: 3 needs the transformers Trainer.*"
                                        r"toolstar_sft.backend: trainer"):  # auto on a machine without CUDA
        launch.sft_processes(SFTParams(distributed={"processes": 3}), cuda_available=False, section="toolstar_sft")
    with pytest.raises(ValidationError):
        SFTParams(distributed={"processes": 0})


def test_rl_launches_for_deepspeed_and_for_data_parallel_replicas():
    assert launch.rl_processes(RLParams.model_validate({"distributed": {"strategy": "deepspeed"}})) == 1
    assert launch.rl_processes(RLParams()) is None  # plain torch in this process
    assert launch.rl_processes(RLParams.model_validate({"distributed": {"processes": 2}})) == 2
    with pytest.raises(ValidationError, match="DeepSpeed RL trains in one process"):
        DistributedParams(strategy="deepspeed", processes=2)
    with pytest.raises(ValidationError):
        DistributedParams(processes=0)
    with pytest.raises(ValidationError, match=r"queries_per_step \(3\) must be a multiple of distributed.processes"):
        RLParams.model_validate({"queries_per_step": 3, "distributed": {"processes": 2}})
    with pytest.raises(ValidationError, match=r"mini_batch_size \(3\) must be a multiple"):
        RLParams.model_validate({"queries_per_step": 4, "mini_batch_size": 3, "distributed": {"processes": 2}})


def test_the_deepspeed_paths_without_a_launcher_say_how_to_start_them():
    with pytest.raises(UserError, match=r"sft.distributed.strategy: deepspeed \(zero2\) trains in a torch.distributed "
                                        r"world.*torchrun"):
        launch.require_launcher("sft.distributed.strategy: deepspeed (zero2)", {})
    launch.require_launcher("sft.distributed.strategy: deepspeed (zero2)",
                            {"WORLD_SIZE": "8", "RANK": "3", "LOCAL_RANK": "3"})
    with pytest.raises(UserError, match=r"at most 1 process.*has 2"):
        launch.require_launcher("rl.distributed.strategy: deepspeed", {"WORLD_SIZE": "2", "RANK": "0"}, most=1)


def test_rank_zero_or_a_process_without_a_launcher_is_the_main_one():
    assert launch.is_main_process({}) and launch.is_main_process({"RANK": "0"})
    assert not launch.is_main_process({"RANK": "1"})


def test_the_exit_code_is_the_launchers_with_star_codes_after_a_signal():
    assert launch.exit_code(0) == 0 and launch.exit_code(1) == 1 and launch.exit_code(3) == 3
    assert launch.exit_code(-signal.SIGKILL) == 137
    assert launch.exit_code(1, [signal.SIGTERM]) == 143 and launch.exit_code(1, [signal.SIGINT]) == 130
    assert launch.exit_code(0, [signal.SIGTERM]) == 0  # it finished anyway


def test_relaunch_uses_the_argv_the_cli_kept(monkeypatch):
    ran = []
    monkeypatch.setattr(launch, "run", lambda command, name: ran.append((command, name)) or 7)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert launch.relaunch(SimpleNamespace(argv=ARGV, command="sft"), 1) == 7
    assert ran[0][0][-len(ARGV):] == ARGV and ran[0][1] == "star sft"
    assert launch.relaunch(SimpleNamespace(argv=ARGV, command="sft"), None) is None and len(ran) == 1


# ---------------------------------------------------------------------------------------------- the launcher

def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in WORLD}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def test_run_returns_the_childs_exit_code_and_restores_the_signal_handlers():
    before = signal.getsignal(signal.SIGTERM)
    assert launch.run([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_and_sigint_reach_the_child_and_decide_the_exit_code(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        import pathlib, signal, sys, time
        out = pathlib.Path(sys.argv[1])
        def stop(signum, frame):
            out.with_suffix(".got").write_text(str(signum))
            sys.exit(1)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        out.write_text("ready")
        time.sleep(60)
    """))
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        ready = tmp_path / f"{sig.name}.ready"

        def send():
            deadline = time.monotonic() + 30
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), sig)  # to us, the launching process

        threading.Thread(target=send, daemon=True).start()
        started = time.monotonic()
        assert launch.run([sys.executable, str(script), str(ready)]) == code
        assert ready.with_suffix(".got").read_text() == str(int(sig)) and time.monotonic() - started < 30


def test_torchrun_sets_the_world_of_the_process_it_starts(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        names = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
        with open(sys.argv[1], "w") as f:
            json.dump({n: os.environ.get(n) for n in names}, f)
        sys.exit(int(sys.argv[2]))
    """))
    out = tmp_path / "env.json"
    command = launch.launch_command([str(out), "0"], clean_env(), 1, target=[str(script)])
    assert launch.run(command, env=clean_env()) == 0
    seen = json.loads(out.read_text())
    assert seen["WORLD_SIZE"] == "1" and seen["RANK"] == "0" and seen["LOCAL_RANK"] == "0"
    assert seen["MASTER_PORT"] and seen["TORCHELASTIC_RUN_ID"]
    # a failed worker fails the command (torchrun reports any worker's failure as 1)
    command = launch.launch_command([str(out), "3"], clean_env(), 1, target=[str(script)])
    assert launch.run(command, env=clean_env()) == 1


def test_sigterm_stops_torchrun_and_its_workers(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import os, pathlib, signal, sys, time
        out = pathlib.Path(sys.argv[1])
        def stop(signum, frame):
            out.with_suffix(".got").write_text(str(signum))
            sys.exit(143)
        signal.signal(signal.SIGTERM, stop)
        out.write_text(str(os.getpid()))
        time.sleep(120)
    """))
    ready = tmp_path / "worker.ready"

    def send():
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=send, daemon=True).start()
    command = launch.launch_command([str(ready)], clean_env(), 1, target=[str(script)])
    assert launch.run(command, env=clean_env()) == 143
    assert ready.with_suffix(".got").read_text() == str(int(signal.SIGTERM))
    with pytest.raises(ProcessLookupError):  # the worker is gone
        os.kill(int(ready.read_text()), 0)


# -------------------------------------------------------------------------------- star sft, really launched

def chat_record(i: int) -> dict:
    city = ["Osk", "Tirrel", "Bram", "Vale"][i % 4]
    return {"messages": [
        {"role": "system", "content": "Plan trips with the tools.", "train": False},
        {"role": "user", "content": f"Find a hotel in {city}.", "train": False},
        {"role": "assistant", "content": f"<think>Hotels in {city}.</think><answer>Inn {i}, {city}</answer>",
         "train": True},
    ]}


@pytest.fixture(scope="module")
def sft_project(small_model_factory, smol_tokenizer, tmp_path_factory) -> Path:
    """A folder with a tiny random model (SmolLM2's tokenizer, saved like models/base) and SFT records."""
    from components.models.checkpoints import save_checkpoint

    root = tmp_path_factory.mktemp("launched_sft")
    save_checkpoint(small_model_factory(seed=0, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                        intermediate_size=64), smol_tokenizer, root / "models/base")
    (root / "data/sft").mkdir(parents=True)
    for name, indices in (("train", range(8)), ("eval", range(8, 10))):
        (root / f"data/sft/{name}.jsonl").write_text("".join(json.dumps(chat_record(i)) + "\n" for i in indices))
    return root


def star_sft(root: Path, processes: int, tag: str) -> subprocess.CompletedProcess:
    """`star sft` as its own process (as dvc runs it), Trainer backend, `processes` processes, no launcher."""
    (root / "params").mkdir(exist_ok=True)
    (root / f"params/{tag}.yaml").write_text(
        f"sft:\n  backend: trainer\n  distributed: {{processes: {processes}}}\n  max_steps: 2\n  batch_size: 2\n"
        f"  micro_batch_size: 1\n  eval_every: 2\n  learning_rate: 0.01\n  cutoff_len: 256\n")
    env = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", STAR_EXPERIMENT=f"test-launch-{tag}")
    env.pop("STAR_PARENT_RUN_ID", None)
    return subprocess.run(
        [sys.executable, "-m", "components.cli", "sft", "--params", f"params/{tag}.yaml", "--model", "models/base",
         "--data", "data/sft", "--out", f"models/{tag}", "--metrics", f"metrics/{tag}.json",
         "--plots", f"plots/{tag}/loss.csv"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)


def check_launched_run(root: Path, result: subprocess.CompletedProcess, tag: str, processes: int) -> None:
    assert result.returncode == 0, result.stderr[-4000:]
    assert "star sft: starting a distributed world:" in result.stderr and "torch.distributed.run" in result.stderr
    assert f"--nproc_per_node {processes}" in result.stderr
    metrics = json.loads((root / f"metrics/{tag}.json").read_text())
    # the Trainer ran in torchrun's world (WORLD_SIZE set by torchrun, not by hand: the parent had none)
    assert metrics["backend"] == "trainer" and metrics["launched"] is True and metrics["processes"] == processes
    assert metrics["steps"] == 2
    assert (root / f"models/{tag}/model.safetensors").exists() and (root / f"models/{tag}/tokenizer.json").exists()
    assert not (root / f"models/{tag}/_trainer").exists()


@pytest.fixture(scope="module")
def one_process(sft_project) -> dict:
    """The metrics of `star sft` launched as one process."""
    check_launched_run(sft_project, star_sft(sft_project, 1, "one"), "one", 1)
    return json.loads((sft_project / "metrics/one.json").read_text())


@pytest.mark.slow
def test_star_sft_with_the_trainer_backend_runs_under_torchrun(one_process):
    assert one_process["processes"] == 1 and one_process["launched"] is True


@pytest.mark.slow
def test_star_sft_trains_in_two_cpu_processes_under_torchrun_as_in_one(sft_project, one_process):
    """Two ranks over gloo, one sequence each per step, train as one process accumulating two: the same losses
    and gradients; rank 0 alone tracks and writes (one MLflow run)."""
    from mlflow.tracking import MlflowClient

    check_launched_run(sft_project, star_sft(sft_project, 2, "two"), "two", 2)
    two = json.loads((sft_project / "metrics/two.json").read_text())
    for key in ("first_train_loss", "final_train_loss", "initial_eval_loss", "final_eval_loss"):
        assert two[key] == pytest.approx(one_process[key], rel=1e-4), key
    client = MlflowClient(tracking_uri=f"sqlite:///{sft_project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("test-launch-two")
    assert [r.info.run_name for r in client.search_runs([experiment.experiment_id])] == ["sft"]
