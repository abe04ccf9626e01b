"""The RL trainer end to end on the tiny model and world: every algorithm runs, and a killed run resumes.

The model is untrained, so rewards are mostly the format reward; what is checked is the machinery: files, rows,
checkpoints, resumption, and that the update really changes the weights when advantages are non-zero.

Each set of params trains once per session (conftest.py's `finished_rl_run`): the tests that read a run share it,
and the resume tests continue a copy of `tiny_run`'s checkpoints.
"""
import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.training.rl.checkpoint import complete_checkpoints, load_state
from components.training.rl.params import RLParams
from components.training.rl.trainer import RLPaths, load_task_source, train

REPO = Path(__file__).resolve().parents[3]

TINY = {"max_steps": 2, "queries_per_step": 1, "num_generations": 2, "learning_rate": 1e-3, "micro_batch_size": 2,
        "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096},
        "arpo": {"budget": 3, "initial_rollouts": 2, "entropy_tokens": 4}}


def tiny_with(knob: dict) -> dict:
    """TINY with `knob`'s values, sections merged key by key."""
    return {**TINY, **{k: {**TINY.get(k, {}), **v} if isinstance(v, dict) else v for k, v in knob.items()}}


def read_steps(csv_path: Path) -> list[int]:
    with csv_path.open() as handle:
        return [int(row["step"]) for row in csv.DictReader(handle)]


@pytest.fixture(scope="module")
def tiny_run(finished_rl_run):
    """TINY's two steps, trained once and tracked as run-1: the run the resume tests copy and continue."""
    return finished_rl_run(TINY, run_id="run-1")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo", "dapo", "arpo", "aepo"])
def test_every_algorithm_trains_and_writes_its_outputs(algorithm, finished_rl_run):
    run = finished_rl_run({**TINY, "algorithm": algorithm, "max_steps": 1,
                           "dynamic_sampling": {"max_extra_rounds": 0}})
    paths = run.paths
    assert (paths.out / "config.json").exists() and json.loads(paths.metrics.read_text()) == run.summary
    assert read_steps(paths.rewards_csv) == [1]
    (logged,) = run.logged
    metrics = logged.metrics
    for key in ("reward/mean", "reward/std", "reward/cs_micro", "reward/success", "reward/format_error_rate",
                "episode/turns", "episode/tool_calls", "episode/tool_error_rate", "episode/sampled_tokens",
                "policy/lr", "time/rollout_s", "time/reward_s", "time/update_s", "throughput/rollout_tokens_per_s"):
        assert key in metrics, key
    if metrics["policy/optimizer_steps"]:
        for key in ("policy/entropy", "policy/kl", "policy/clip_fraction", "policy/grad_norm"):
            assert key in metrics, key
    else:  # an untrained model may tie every group (all rewards 0): no signal, so no optimizer step
        assert metrics["reward/std"] == 0.0
    if algorithm in ("arpo", "aepo"):
        assert metrics["batch/trajectories"] == 3 and "arpo/branches" in metrics
    if algorithm == "aepo":  # pre-monitoring split the budget of 3
        assert 1 <= metrics["aepo/global_rollouts"] <= 3 and metrics["aepo/monitor_rollouts"] == 1


@pytest.mark.slow
def test_a_resumed_run_continues_from_the_newest_checkpoint_without_redoing_steps(tiny_run, tmp_path):
    # a step's checkpoint exists before its metrics go to tracking (which may hang or die)
    assert [(logged.step, logged.checkpoints) for logged in tiny_run.logged] == [(1, [1]), (2, [1, 2])]
    paths = tiny_run.copy_to(tmp_path)
    paths.rewards_csv.unlink()  # `dvc repro` deletes the stage's outputs; the checkpoint's history restores them
    seen, tags = [], []
    summary = train(RLParams.model_validate({**TINY, "max_steps": 3}), paths, run_id="run-2",
                    log=lambda metrics, step: seen.append(step), tag=tags.append, progress_bar=False)
    assert seen == [3] and summary["resumed_from_step"] == 2
    assert tags == [{"star.resumed_from_run": "run-1", "star.resumed_from_step": 2}]  # the run links to its first part
    assert read_steps(paths.rewards_csv) == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("change", ["reward", "model", "queries"])
def test_a_checkpoint_of_other_inputs_is_not_resumed_and_every_step_trains(change, tiny_run, tmp_path,
                                                                           tiny_model_dir, rl_queries_path, capsys):
    """After a SUM run, a MACRO run (`dvc exp run -S params/rl.yaml:rl.reward.kind=macro`), a new SFT model or new
    queries train from step 0: the SUM run's checkpoints are moved aside with the reason (never deleted), and the run
    says why."""
    import shutil

    paths = tiny_run.copy_to(tmp_path)  # the SUM run's two checkpoints
    params = RLParams.model_validate(TINY)
    if change == "reward":
        params = RLParams.model_validate({**TINY, "reward": {"kind": "macro"}})
    elif change == "model":
        paths.model = shutil.copytree(tiny_model_dir, tmp_path / "other_model")
        (paths.model / "generation_config.json").write_text((paths.model / "generation_config.json").read_text()
                                                            .replace("{", '{"top_k": 7,', 1))
    else:
        paths.queries = tmp_path / "other_queries.jsonl"
        paths.queries.write_text("".join(reversed(rl_queries_path.read_text().splitlines(keepends=True))))
    capsys.readouterr()
    seen = []
    summary = train(params, paths, log=lambda metrics, step: seen.append(step), progress_bar=False)
    printed = capsys.readouterr().out
    assert seen == [1, 2] and summary["resumed_from_step"] == 0
    expected = {"reward": "params", "model": "model", "queries": "queries"}[change]
    assert f"not resuming from {paths.checkpoints / 'step-00000002'}" in printed and f"{expected} changed" in printed
    (kept,) = (paths.checkpoints.parent / f"{paths.checkpoints.name}.set-aside").iterdir()
    assert sorted(p.name for p in kept.iterdir()) == ["REASON.txt", "step-00000001", "step-00000002"]
    assert f"{expected} changed" in (kept / "REASON.txt").read_text()


def fingerprint_of(params: RLParams, paths: RLPaths) -> dict[str, str]:
    """The fingerprint a run of `params` over `paths` gives its checkpoints."""
    from components.training.rl.trainer import input_fingerprint

    return input_fingerprint(params, paths, load_task_source(params, paths))


@pytest.mark.parametrize("knob", [
    {"micro_batch_size": 8}, {"device": "cuda"}, {"eval": {"every": 5, "max_queries": 3}},
    {"rollout": {"max_batch_size": 2, "chunk_tokens": 64, "backend": "vllm", "gpu_memory_utilization": 0.6,
                 "release_engine_memory": False}},
    {"distributed": {"gradient_checkpointing": True}}, {"max_steps": 9, "checkpoint_every": 3},
])
def test_throughput_knobs_keep_the_fingerprint_so_a_checkpoint_still_resumes(knob, rl_paths, tmp_path):
    """Batch sizes of rollouts and micro-batches, the device, gradient checkpointing and the logging evaluation
    change how fast a run goes, not what it learns: its checkpoints stay resumable."""
    paths = rl_paths(tmp_path)
    base = fingerprint_of(RLParams.model_validate(TINY), paths)
    assert fingerprint_of(RLParams.model_validate(tiny_with(knob)), paths) == base


@pytest.mark.parametrize("knob", [{"learning_rate": 1e-6}, {"num_generations": 8}, {"mini_batch_size": 2},
                                  {"rollout": {"temperature": 0.7}}, {"dtype": "bfloat16"}, {"seed": 3}])
def test_what_changes_learning_changes_the_fingerprint(knob, rl_paths, tmp_path):
    paths = rl_paths(tmp_path)
    assert fingerprint_of(RLParams.model_validate(tiny_with(knob)), paths)["params"] != \
        fingerprint_of(RLParams.model_validate(TINY), paths)["params"]


@pytest.mark.slow
def test_a_longer_budget_or_another_time_limit_still_resumes(tiny_run, tmp_path):
    paths = tiny_run.copy_to(tmp_path)
    summary = train(RLParams.model_validate({**TINY, "max_steps": 3, "max_minutes": 60, "keep_checkpoints": 3}),
                    paths, progress_bar=False)
    assert summary["resumed_from_step"] == 2


@pytest.mark.slow
def test_max_queries_trains_on_a_prefix_of_the_query_file(finished_rl_run, rl_paths, tmp_path):
    queries = load_task_source(RLParams.model_validate({**TINY, "max_queries": 2}), rl_paths(tmp_path)).items
    assert [q.idx for q in queries] == [0, 1]
    run = finished_rl_run({**TINY, "max_queries": 2, "max_steps": None, "epochs": 2})
    # 2 queries x 2 epochs at TINY's queries per step; the data cursor counts the 2 queries, not the file's 6
    assert run.summary["steps"] == math.ceil(2 * 2 / TINY["queries_per_step"])
    newest = complete_checkpoints(run.paths.checkpoints)[-1][1]
    assert load_state(newest).cursor["num_queries"] == 2


def test_the_stage_trains_every_weight_of_the_policy(rl_paths, tmp_path, tiny_model_dir):
    """The stage's parts (as `star rl` builds them) hand every weight of the policy to the optimizer."""
    from components.training.rl.trainer import build_parts

    paths = rl_paths(tmp_path)
    params = RLParams.model_validate(TINY)
    parts = build_parts(params, paths, load_task_source(params, paths), tiny_model_dir, total_steps=1, device="cpu")
    model = parts.optimizer.unwrap()
    optimized = {id(p) for group in parts.optimizer.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()}


def test_the_update_moves_the_weights_when_rewards_differ(tiny_model_dir):
    """One update on hand-made rollouts with opposite advantages changes the policy's log-probabilities."""
    from components.models.loading import load_policy_model
    from components.training.rl.optim import TorchOptimizer
    from components.training.rl.update import Rollout, UpdateConfig, fill_logprobs, update_policy

    model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
    good = Rollout(input_ids=[20, 21, 22, 23, 24], loss_mask=[0, 0, 1, 1, 1], advantage=1.0)
    bad = Rollout(input_ids=[20, 21, 30, 31, 32], loss_mask=[0, 0, 1, 1, 1], advantage=-1.0)
    before = fill_logprobs(model, [good, bad], 2, 0, 1.0, overwrite=False)
    optimizer = TorchOptimizer(model, 1e-2, 0.0, 1.0, "constant", 0, 1)
    stats = update_policy(model, optimizer, [good, bad], UpdateConfig(micro_batch_size=1), pad_id=0)
    after = fill_logprobs(model, [good, bad], 2, 0, 1.0, overwrite=False)
    assert stats["optimizer_steps"] == 1 and stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert sum(after[0][2:]) > sum(before[0][2:])  # the rewarded continuation became more likely
    assert sum(after[1][2:]) < sum(before[1][2:])  # the penalised one less likely


def test_a_step_without_an_update_still_measures_a_separate_engines_mismatch(tiny_model_dir):
    """Tied rewards skip the optimizer step; with rollouts from a separate engine (`mismatch_every_step`) the step
    still reports how far the engine's log-probs are from the trainer's."""
    from components.models.loading import load_policy_model
    from components.training.rl.optim import TorchOptimizer
    from components.training.rl.update import Rollout, UpdateConfig, fill_logprobs, update_policy

    model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
    rollouts = [Rollout(input_ids=[20, 21, 22, 23, 24], loss_mask=[0, 0, 1, 1, 1], advantage=0.0),
                Rollout(input_ids=[20, 21, 30, 31], loss_mask=[0, 0, 1, 1], advantage=0.0)]
    for rollout, trainer in zip(rollouts, fill_logprobs(model, rollouts, 2, 0, 1.0, overwrite=False)):
        rollout.sampler_logprobs = [lp - 0.25 * m for lp, m in zip(trainer, rollout.loss_mask)]
    optimizer = TorchOptimizer(model, 1e-2, 0.0, 1.0, "constant", 0, 1)
    assert update_policy(model, optimizer, rollouts, UpdateConfig(), pad_id=0) == {"optimizer_steps": 0}
    stats = update_policy(model, optimizer, rollouts, UpdateConfig(mismatch_every_step=True), pad_id=0)
    assert stats["optimizer_steps"] == 0
    assert stats["logprob_mismatch"] == pytest.approx(0.25, abs=1e-5)
    assert stats["sampler_kl"] == pytest.approx(math.expm1(0.25) - 0.25, abs=1e-5)


def test_a_frozen_control_with_learning_rate_0_keeps_every_weight(tiny_model_dir):
    """`rl.learning_rate: 0` is the frozen control (docs/tiny_preset.md, "The frozen control"): the same rollouts
    and updates, no change."""
    import torch

    from components.models.loading import load_policy_model
    from components.training.rl.optim import TorchOptimizer
    from components.training.rl.update import Rollout, UpdateConfig, update_policy

    assert RLParams.model_validate({**TINY, "learning_rate": 0}).learning_rate == 0
    model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    good = Rollout(input_ids=[20, 21, 22, 23, 24], loss_mask=[0, 0, 1, 1, 1], advantage=1.0)
    bad = Rollout(input_ids=[20, 21, 30, 31, 32], loss_mask=[0, 0, 1, 1, 1], advantage=-1.0)
    stats = update_policy(model, TorchOptimizer(model, 0.0, 0.0, 1.0, "constant", 0, 1), [good, bad],
                          UpdateConfig(micro_batch_size=1), pad_id=0)
    assert stats["optimizer_steps"] == 1
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


@pytest.mark.slow
def test_a_frozen_control_run_draws_the_same_first_step_and_ends_with_the_input_weights(tiny_run, finished_rl_run,
                                                                                       tiny_model_dir):
    import torch
    from safetensors.torch import load_file

    control = finished_rl_run({**TINY, "learning_rate": 0})
    first = [next(csv.DictReader(p.rewards_csv.open())) for p in (tiny_run.paths, control.paths)]
    assert first[0]["reward"] == first[1]["reward"] and first[0]["cs_micro"] == first[1]["cs_micro"]
    assert control.summary["steps"] == 2
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(control.paths.out / "model.safetensors")
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_a_single_step_update_reads_pi_old_from_its_own_forward_pass(tiny_model_dir):
    """One pass, one mini-batch: pi_old is the detached current log-probability, so the update makes one forward
    pass per micro-batch (no separate recompute pass) and lands on the same weights as an update handed the
    recomputed pi_old; with two passes (num_iterations 2) pi_old is recomputed first, once per micro-batch."""
    import torch

    from components.models.loading import load_policy_model
    from components.training.rl.optim import TorchOptimizer
    from components.training.rl.update import Rollout, UpdateConfig, fill_logprobs, is_single_step, update_policy

    def rollouts():
        return [Rollout(input_ids=[20, 21, 22, 23, 24], loss_mask=[0, 0, 1, 1, 1], advantage=1.0),
                Rollout(input_ids=[20, 21, 30, 31, 32], loss_mask=[0, 0, 1, 1, 1], advantage=-1.0)]

    def train(config: UpdateConfig, prefill: bool):
        model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
        batch = rollouts()
        if prefill:
            fill_logprobs(model, batch, 1, 0, 1.0, overwrite=True)
        calls = []
        model.get_decoder().register_forward_hook(lambda *_: calls.append(1))
        stats = update_policy(model, TorchOptimizer(model, 1e-2, 0.0, 1.0, "constant", 0, 1), batch, config, pad_id=0)
        return model, len(calls), stats

    reused, reused_calls, stats = train(UpdateConfig(micro_batch_size=1), prefill=False)
    handed, _, _ = train(UpdateConfig(micro_batch_size=1, recompute_old_logprobs=False), prefill=True)
    assert reused_calls == 2 and stats["processed_tokens"] == 10 and stats["ratio_mean"] == 1.0
    for (name, a), b in zip(reused.named_parameters(), handed.parameters()):
        assert torch.allclose(a, b, atol=1e-7), name
    _, two_pass_calls, two_pass = train(UpdateConfig(micro_batch_size=1, num_iterations=2), prefill=False)
    assert two_pass_calls == 2 + 4 and two_pass["processed_tokens"] == 30
    assert is_single_step(UpdateConfig(mini_batch_size=8), 8) and not is_single_step(UpdateConfig(mini_batch_size=4), 8)


def test_a_step_without_signal_leaves_the_weights_alone_despite_adam_momentum(tiny_model_dir):
    """After a step with signal, a step whose advantages are all zero takes no optimizer step: Adam's first moment
    would otherwise keep moving the weights (zero gradient, non-zero update)."""
    import torch

    from components.models.loading import load_policy_model
    from components.training.rl.optim import TorchOptimizer
    from components.training.rl.update import Rollout, UpdateConfig, update_policy

    model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
    optimizer = TorchOptimizer(model, 1e-2, 0.0, 1.0, "constant", 0, 1)
    signal = [Rollout(input_ids=[20, 21, 22, 23], loss_mask=[0, 0, 1, 1], advantage=a) for a in (1.0, -1.0)]
    signal[1].input_ids = [20, 21, 30, 31]
    update_policy(model, optimizer, signal, UpdateConfig(micro_batch_size=2), pad_id=0)
    weights = [p.detach().clone() for p in model.parameters()]
    tied = [Rollout(input_ids=[20, 21, 22, 23], loss_mask=[0, 0, 1, 1], advantage=0.0) for _ in range(2)]
    stats = update_policy(model, optimizer, tied, UpdateConfig(micro_batch_size=2), pad_id=0)
    assert stats["optimizer_steps"] == 0
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_resumes_and_loses_no_step(rl_paths, tmp_path, tiny_model_dir, tiny_world_dir,
                                                              rl_queries_path):
    """`star rl` killed with SIGKILL after its second checkpoint resumes from it and writes each step once.

    A step of the untrained tiny model takes a fraction of a second (no update when every reward ties), so the run is
    long enough that the kill always lands mid-run.
    """
    import yaml

    total = 30
    params_file = tmp_path / "rl.yaml"
    params_file.write_text(yaml.safe_dump({"rl": {**TINY, "max_steps": total}}))
    paths = rl_paths(tmp_path)
    command = [sys.executable, "-m", "components.cli", "rl", "--params", str(params_file), "--model",
               str(tiny_model_dir), "--world", str(tiny_world_dir), "--queries", str(rl_queries_path), "--out",
               str(paths.out), "--checkpoints", str(paths.checkpoints), "--metrics", str(paths.metrics),
               "--plots", str(paths.plots), "--no-register"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "STAR_EXPERIMENT": "rl-test",
           "STAR_PRESET": "tiny", "STAR_PARENT_RUN_ID": ""}
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 240
    while time.time() < deadline and first.poll() is None:
        if any(step >= 2 for step, _ in complete_checkpoints(paths.checkpoints)):
            break
        time.sleep(0.02)
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = max(step for step, _ in complete_checkpoints(paths.checkpoints))
    assert killed_at < total and not paths.metrics.exists()

    second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resumed from {paths.checkpoints}" in second.stdout + second.stderr
    assert read_steps(paths.rewards_csv) == list(range(1, total + 1))
    summary = json.loads(paths.metrics.read_text())
    assert summary["resumed_from_step"] == killed_at and summary["steps"] == total
    assert (paths.out / "config.json").exists()

    # in MLflow: the killed run is not left RUNNING, and the second run links to it
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("rl-test")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    assert [r.info.status for r in runs] == ["KILLED", "FINISHED"]
    assert runs[1].data.tags["star.resumed_from_run"] == runs[0].info.run_id
    assert runs[1].data.tags["star.resumed_from_step"] == str(killed_at)


def test_grpo_learns_a_one_token_bandit(small_model_factory, smol_tokenizer):
    """Sampling with HFPolicy + group advantages + the clipped update: the share of rewarded samples rises.

    The bandit's arms are the first 64 token ids (the model's vocabulary cut to them): over SmolLM2's 49K tokens, 32
    samples a step would almost never draw the same token twice, and eight steps could not show a trend."""
    from components.agent.hf import HFPolicy
    from components.agent.types import TurnRequest
    from components.training.rl.advantages import group_advantages
    from components.training.rl.optim import TorchOptimizer
    from components.training.rl.update import Rollout, UpdateConfig, update_policy

    import torch

    torch.manual_seed(0)
    model = small_model_factory(seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                intermediate_size=64)
    model.resize_token_embeddings(64)
    policy = HFPolicy(model, smol_tokenizer, temperature=1.0, seed=0)
    optimizer = TorchOptimizer(model, 3e-2, 0.0, 1.0, "constant", 0, 1)
    prompt = [20, 21, 22]

    def rewarded(token: int) -> float:
        return float(token % 2 == 0)  # about half of the vocabulary is rewarded at the start

    rates = []
    for _ in range(8):
        turns = policy.generate([TurnRequest(messages=[], token_ids=prompt, max_new_tokens=1)] * 32)
        rewards = torch.tensor([rewarded(t.token_ids[0]) for t in turns])
        rates.append(rewards.mean().item())
        advantages = group_advantages(rewards, torch.zeros(32, dtype=torch.long), "group").tolist()
        rollouts = [Rollout(prompt + t.token_ids, [0] * 3 + [1] * len(t.token_ids), a, [0.0] * 3 + t.logprobs)
                    for t, a in zip(turns, advantages)]
        update_policy(model, optimizer, rollouts, UpdateConfig(micro_batch_size=32, recompute_old_logprobs=False), 0)
    assert rates[0] < 0.7 and sum(rates[-2:]) / 2 > rates[0] + 0.2, rates


def test_reward_trend_compares_the_first_and_last_fifth_with_pooled_standard_errors():
    from components.training.rl.trainer import reward_trend

    # 10 steps of 4 episodes: the first fifth is steps 0-1, the last fifth steps 8-9.
    history = [{"reward": r, "reward_std": 0.0} for r in (0.0, 0.2, 0.3, 0.3, 0.4, 0.4, 0.5, 0.5, 0.6, 0.8)]
    trend = reward_trend(history, episodes_per_step=4)
    assert trend["steps_per_fifth"] == 2
    assert trend["first_fifth_mean"] == pytest.approx(0.1) and trend["last_fifth_mean"] == pytest.approx(0.7)
    # pooled variance of each window: 0.01 (means 0.1 +- 0.1, no within-step spread), over 8 - 1 episodes
    assert trend["difference_se"] == pytest.approx(math.sqrt(2 * 0.01 / 7))
    assert trend["rising"] is True
    noisy = [{**row, "reward_std": 1.0} for row in history]
    assert reward_trend(noisy, episodes_per_step=4)["rising"] is False  # the same means, too much spread
    assert reward_trend(history[:1], episodes_per_step=4) == {"rising": None}


def test_step_advantages_are_group_relative_in_the_order_of_the_groups():
    from types import SimpleNamespace

    from components.training.rl.trainer import Scored, step_advantages

    def group(*rewards):
        return [Scored({}, SimpleNamespace(total=r)) for r in rewards]

    # group means 0.5 and 0.2; Dr.GRPO scaling ("none") keeps the numbers readable
    scored, adv = step_advantages([group(1.0, 0.0), group(0.1, 0.3)], "none")
    assert [s.reward.total for s in scored] == [1.0, 0.0, 0.1, 0.3]
    assert adv == pytest.approx([0.5, -0.5, -0.1, 0.1])
    assert step_advantages([], "group") == ([], [])


def test_a_negative_entropy_coeff_sharpens_the_policy_even_when_every_advantage_ties(tiny_model_dir):
    """entropy_coeff < 0 minimises the entropy of the distributions that sampled the trained tokens: with tied
    advantages (no reward signal) the step still happens and lowers that entropy; 0 leaves the weights alone."""
    import torch

    from components.models.loading import load_policy_model
    from components.training.rl.optim import TorchOptimizer
    from components.training.rl.update import Rollout, UpdateConfig, sequence_logprobs, update_policy

    model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
    tied = [Rollout(input_ids=[20, 21, 22, 23, 24, 25], loss_mask=[0, 0, 1, 1, 1, 1], advantage=0.0)]
    ids, mask = torch.tensor([tied[0].input_ids]), torch.tensor([tied[0].loss_mask], dtype=torch.float32)

    def mean_entropy() -> float:
        with torch.no_grad():
            _, per_token = sequence_logprobs(model, ids, 1.0, positions=mask, entropy_map=True)
        assert per_token.shape == ids.shape and float(per_token[0, :2].abs().sum()) == 0.0  # prompt: unscored
        return float((per_token * mask).sum() / mask.sum())

    before = mean_entropy()
    optimizer = TorchOptimizer(model, 1e-2, 0.0, 1.0, "constant", 0, 1)
    assert update_policy(model, optimizer, tied, UpdateConfig(micro_batch_size=1), pad_id=0)["optimizer_steps"] == 0
    stats = update_policy(model, optimizer, tied, UpdateConfig(micro_batch_size=1, entropy_coeff=-1.0), pad_id=0)
    assert stats["optimizer_steps"] == 1
    assert stats["entropy"] == pytest.approx(before, rel=1e-4)  # logged: the entropy before this step's update
    assert mean_entropy() < before - 1e-3


def test_the_plain_optimiser_steps_float32_master_weights_when_rl_computes_in_bf16(tiny_model_dir, tiny_world_dir,
                                                                                    rl_queries_path, tmp_path):
    """`dtype: bfloat16` with `strategy: none` (as `dtype: auto` on a GPU): the weights AdamW steps are float32 and
    the update computes in bf16 under autocast. One step at lr 1e-6 then moves every weight that has a gradient;
    bf16 weights would keep ~98% of them (a 1e-6 step is below half a bf16 ulp of most weights)."""
    import torch

    from components.training.rl.trainer import RLPaths, build_parts
    from components.training.rl.update import Rollout, update_policy

    params = RLParams.model_validate({"dtype": "bfloat16", "learning_rate": 1e-6, "device": "cpu",
                                      "rollout": {"backend": "hf"}})
    paths = RLPaths(model=tiny_model_dir, world=tiny_world_dir, queries=rl_queries_path, out=tmp_path / "out",
                    checkpoints=tmp_path / "ckpt", metrics=tmp_path / "rl.json", plots=tmp_path / "plots")
    parts = build_parts(params, paths, load_task_source(params, paths), tiny_model_dir, total_steps=1, device="cpu")
    model = parts.optimizer.unwrap()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert parts.update_config.autocast_dtype == torch.bfloat16
    layers = {name: p.detach().clone() for name, p in model.named_parameters() if ".layers." in name}
    rollouts = [Rollout(input_ids=[20, 21, 22, 23, 24, 25], loss_mask=[0, 0, 1, 1, 1, 1], advantage=1.0),
                Rollout(input_ids=[20, 21, 30, 31, 32, 33], loss_mask=[0, 0, 1, 1, 1, 1], advantage=-1.0)]
    assert update_policy(model, parts.optimizer, rollouts, parts.update_config, parts.pad_id)["optimizer_steps"] == 1
    after = dict(model.named_parameters())
    moved = sum(int((after[n].detach() != before).sum()) for n, before in layers.items())
    total = sum(before.numel() for before in layers.values())
    assert moved / total > 0.9


def test_each_update_logs_how_far_the_samplers_log_probs_are_from_the_trainers(tiny_model_dir):
    """The rollout engine's log-probs of the sampled tokens against the trainer's pi_old, every step: here the
    engine's are the trainer's own shifted by 0.25 on every sampled token."""
    import torch

    from components.models.loading import load_policy_model
    from components.training.rl.optim import TorchOptimizer
    from components.training.rl.update import Rollout, UpdateConfig, fill_logprobs, update_policy

    model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
    rollouts = [Rollout(input_ids=[20, 21, 22, 23, 24, 25], loss_mask=[0, 0, 1, 1, 0, 1], advantage=1.0),
                Rollout(input_ids=[20, 21, 30, 31, 32, 33], loss_mask=[0, 0, 1, 1, 1, 1], advantage=-1.0)]
    trainer = fill_logprobs(model, rollouts, 2, 0, 1.0, overwrite=False)
    for rollout, logprobs in zip(rollouts, trainer):
        rollout.sampler_logprobs = [lp - 0.25 * m for lp, m in zip(logprobs, rollout.loss_mask)]
    optimizer = TorchOptimizer(model, 1e-4, 0.0, 1.0, "constant", 0, 1)
    stats = update_policy(model, optimizer, rollouts, UpdateConfig(micro_batch_size=2, tis_cap=2.0), pad_id=0)
    assert stats["logprob_mismatch"] == pytest.approx(0.25, abs=1e-5)
    assert stats["tis_weight"] == pytest.approx(math.exp(0.25), abs=1e-4)
    assert torch.isfinite(torch.tensor(stats["sampler_kl"]))
