"""Checkpoints are atomic and resumable; the data cursor reproduces the batches; params choose the algorithm."""
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from components.errors import UserError
from components.training.rl import checkpoint as ckpt
from components.training.rl.cursor import QueryCursor
from components.training.rl.optim import TorchOptimizer
from components.training.rl.params import RLParams


def save_dummy(root, step, keep=3):
    def model(d):
        (d / "model.txt").write_text(f"weights {step}")

    def optimizer(d):
        (d / "optimizer.pt").write_text("opt")

    return ckpt.save_checkpoint(root, ckpt.TrainState(step=step, cursor={"position": step * 2},
                                                      history=[{"step": s} for s in range(1, step + 1)]),
                                model, optimizer, keep=keep)


def test_newest_complete_checkpoint_wins_and_partial_ones_are_ignored_then_removed(tmp_path):
    save_dummy(tmp_path, 1)
    save_dummy(tmp_path, 2)
    partial = tmp_path / "step-00000003.tmp-999"  # a run killed while writing step 3
    partial.mkdir()
    (partial / "model.txt").write_text("half")
    incomplete = tmp_path / "step-00000004"  # no state.json: never counted
    incomplete.mkdir()
    assert ckpt.newest_checkpoint(tmp_path).name == "step-00000002"
    state = ckpt.load_state(ckpt.newest_checkpoint(tmp_path))
    assert (state.step, state.cursor, len(state.history)) == (2, {"position": 4}, 2)
    assert ckpt.remove_partial(tmp_path) == [partial] and not partial.exists()


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    for step in range(1, 5):
        save_dummy(tmp_path, step, keep=2)
    assert [p.name for _, p in ckpt.complete_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]


def test_rng_states_round_trip(tmp_path):
    save_dummy(tmp_path, 1)
    expected = (random.random(), torch.rand(1).item())
    ckpt.restore_checkpoint_rng(tmp_path / "step-00000001")
    assert (random.random(), torch.rand(1).item()) == expected


def test_every_generator_state_round_trips_exactly(tmp_path):
    random.seed(1)
    np.random.seed(2)
    np.random.standard_normal()  # leaves a cached gaussian in NumPy's state
    torch.manual_seed(3)
    before = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    ckpt.save_tree(tmp_path, "rng", ckpt.capture_rng())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ckpt.restore_rng(ckpt.load_tree(tmp_path, "rng"))
    python, (name, key, *rest), cpu = before
    assert random.getstate() == python and torch.equal(torch.get_rng_state(), cpu)
    after_name, after_key, *after_rest = np.random.get_state()
    assert (after_name, after_rest) == (name, rest) and np.array_equal(after_key, key)


def test_a_state_tree_keeps_int_keys_tuples_dtypes_and_plain_values(tmp_path):
    tree = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(4, dtype=torch.bfloat16)}},
            "param_groups": [{"betas": (0.9, 0.999), "eps": 1e-8, "foreach": None, "params": [0], "name": "all"}],
            "bytes": torch.tensor([1, 255], dtype=torch.uint8)}
    ckpt.save_tree(tmp_path, "opt", tree)
    again = ckpt.load_tree(tmp_path, "opt")
    assert again["param_groups"] == tree["param_groups"] and list(again["state"]) == [0]
    for name, tensor in [("step", tree["state"][0]["step"]), ("exp_avg", tree["state"][0]["exp_avg"])]:
        assert again["state"][0][name].dtype == tensor.dtype and torch.equal(again["state"][0][name], tensor)
    assert torch.equal(again["bytes"], tree["bytes"])


class PlantedCode:
    """A pickle that, when loaded, creates `marker`: what a malicious checkpoint file could do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def real_checkpoint(root: Path) -> tuple[Path, TorchOptimizer]:
    model = torch.nn.Linear(2, 1)
    optimizer = TorchOptimizer(model, 0.1, 0.0, 1.0, "constant", warmup_steps=0, total_steps=4)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    saved = ckpt.save_checkpoint(root, ckpt.TrainState(step=1), lambda d: None, optimizer.save, keep=1)
    return saved, optimizer


def resume(checkpoint: Path, optimizer: TorchOptimizer) -> None:
    """What `train` reads from a checkpoint besides the weights."""
    ckpt.load_state(checkpoint)
    optimizer.load(checkpoint)
    ckpt.restore_checkpoint_rng(checkpoint)


def test_the_planted_pickle_would_run_code_if_it_were_unpickled(tmp_path):
    pickle.loads(pickle.dumps(PlantedCode(tmp_path / "marker")))
    assert (tmp_path / "marker").exists()


@pytest.mark.parametrize("name", ["optimizer.json", "optimizer.safetensors", "rng.json", "rng.safetensors",
                                  "state.json"])
def test_a_pickle_planted_as_a_checkpoint_file_is_refused_not_run(tmp_path, name):
    checkpoint, optimizer = real_checkpoint(tmp_path / "checkpoints")
    resume(checkpoint, optimizer)  # the checkpoint as written loads
    marker = tmp_path / "marker"
    (checkpoint / name).write_bytes(pickle.dumps(PlantedCode(marker)))
    with pytest.raises(UserError, match=f"checkpoint {checkpoint}: .*Delete {checkpoint}"):
        resume(checkpoint, optimizer)
    assert not marker.exists()


@pytest.mark.parametrize("stem", ["optimizer", "rng"])
def test_a_pickled_pt_file_of_an_older_version_is_refused_not_run(tmp_path, stem):
    checkpoint, optimizer = real_checkpoint(tmp_path / "checkpoints")
    for suffix in (".json", ".safetensors"):
        (checkpoint / f"{stem}{suffix}").unlink()
    marker = tmp_path / "marker"
    torch.save({"planted": PlantedCode(marker)}, checkpoint / f"{stem}.pt")
    with pytest.raises(UserError, match=f"{stem}.pt is a pickle .* not loaded"):
        resume(checkpoint, optimizer)
    assert not marker.exists()


def test_the_cursor_resumes_exactly_where_it_stopped_across_epochs():
    full = QueryCursor(num_queries=5, seed=3)
    uninterrupted = [full.next_batch(2) for _ in range(6)]
    first = QueryCursor(num_queries=5, seed=3)
    before = [first.next_batch(2) for _ in range(3)]
    resumed = QueryCursor.from_state(json.loads(json.dumps(first.state())), num_queries=5, seed=3)
    after = [resumed.next_batch(2) for _ in range(3)]
    assert before + after == uninterrupted
    assert sorted(sum(uninterrupted[:2], []) + uninterrupted[2][:1]) == [0, 1, 2, 3, 4]  # an epoch covers every query


def test_a_cursor_from_another_query_set_is_refused():
    with pytest.raises(ValueError, match="same --queries"):
        QueryCursor.from_state({"position": 3, "num_queries": 10}, num_queries=7, seed=0)


def test_optimizer_and_schedule_state_round_trip(tmp_path):
    model = torch.nn.Linear(2, 1)
    opt = TorchOptimizer(model, 0.1, 0.0, 1.0, "cosine", warmup_steps=1, total_steps=4)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    opt.schedule_step()
    opt.save(tmp_path)
    again = TorchOptimizer(model, 0.1, 0.0, 1.0, "cosine", warmup_steps=1, total_steps=4)
    again.load(tmp_path)
    assert again.lr == pytest.approx(opt.lr) and again.scheduler.last_epoch == 1


def test_adamw_state_round_trips_exactly(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = TorchOptimizer(model, 0.1, 0.01, 1.0, "cosine", warmup_steps=1, total_steps=4)
    for _ in range(2):
        model(torch.randn(5, 3)).pow(2).sum().backward()
        opt.step()
        opt.schedule_step()
    opt.save(tmp_path)
    again = TorchOptimizer(model, 0.5, 0.0, 1.0, "cosine", warmup_steps=1, total_steps=4)
    again.load(tmp_path)
    saved, loaded = opt.optimizer.state_dict(), again.optimizer.state_dict()
    assert loaded["param_groups"] == saved["param_groups"]
    for index, state in saved["state"].items():
        assert set(loaded["state"][index]) == set(state)
        assert all(torch.equal(loaded["state"][index][name], value) for name, value in state.items())
    assert again.scheduler.state_dict() == opt.scheduler.state_dict()


def test_a_large_adam_epsilon_makes_the_first_step_follow_the_gradient_not_its_sign():
    """AdamW's first step is lr * g / (|g| + eps): with eps 1e-8 every weight moves by ~lr (the sign of its gradient,
    however small); with eps far above |g| the step is ~(lr / eps) * g, proportional to the gradient."""
    from components.training.rl.strategies import build_optimizer
    from components.training.rl.params import RLParams

    def first_step(adam_epsilon: float) -> list[float]:
        model = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.zero_()
        params = RLParams.model_validate({"learning_rate": 1e-3, "adam_epsilon": adam_epsilon, "max_grad_norm": 10.0})
        optimizer = build_optimizer(model, params, total_steps=1)
        (model(torch.tensor([[1.0, 0.001]])).sum()).backward()  # gradients 1 and 0.001
        optimizer.step()
        return model.weight.detach().flatten().tolist()

    assert first_step(1e-8) == pytest.approx([-1e-3, -1e-3], rel=1e-4)
    assert first_step(10.0) == pytest.approx([-1e-3 * 1 / 11, -1e-3 * 0.001 / 10.001], rel=1e-4)


def test_the_optimizer_follows_the_learning_rate_schedule_step_by_step():
    """The LR the update uses at RL steps 1..6 (scheduler steps 0..5): 2 warmup steps of 6, then the cosine."""
    opt = TorchOptimizer(torch.nn.Linear(2, 1), 0.1, 0.0, 1.0, "cosine", warmup_steps=2, total_steps=6)
    used = []
    for _ in range(6):
        used.append(round(opt.lr, 4))
        opt.schedule_step()
    assert used == [0.0, 0.05, 0.1, 0.0854, 0.05, 0.0146]


def test_warmup_ratio_becomes_whole_warmup_steps_of_the_run():
    from components.training.rl.strategies import build_optimizer
    from components.training.rl.params import RLParams

    params = RLParams.model_validate({"learning_rate": 0.1, "lr_scheduler_type": "constant", "warmup_ratio": 0.25})
    opt = build_optimizer(torch.nn.Linear(2, 1), params, total_steps=10)  # 2.5 steps -> 3
    used = []
    for _ in range(5):
        used.append(round(opt.lr, 4))
        opt.schedule_step()
    assert used == [0.0, 0.0333, 0.0667, 0.1, 0.1]


@pytest.mark.parametrize("algorithm, expected", [
    ("grpo", ("group", "token-mean", None, "groups", "clipped", "none", False)),
    ("dr_grpo", ("none", "seq-mean-token-sum-norm", None, "groups", "clipped", "none", False)),
    ("dapo", ("group", "token-mean", 0.28, "dapo", "clipped", "none", True)),
    ("arpo", ("group", "token-mean", None, "arpo", "clipped", "none", False)),
    ("aepo", ("group", "token-mean", None, "aepo", "entropy_balanced", "entropy_aware", False)),
])
def test_the_algorithm_sets_its_sampler_and_the_defaults_of_its_knobs(algorithm, expected):
    p = RLParams.model_validate({"algorithm": algorithm})
    assert (p.scale_rewards, p.loss_type, p.epsilon_high, p.spec.sampler, p.surrogate, p.token_weighting,
            p.overlong.enabled) == expected


def test_explicit_knobs_win_over_the_algorithm_defaults():
    p = RLParams.model_validate({"algorithm": "dapo", "epsilon_high": 0.3, "dynamic_sampling": {"max_extra_rounds": 5},
                                 "loss_type": "seq-mean-token-mean", "overlong": {"enabled": False}})
    assert (p.epsilon_high, p.spec.sampler, p.dynamic_sampling.max_extra_rounds, p.loss_type, p.overlong.enabled) \
        == (0.3, "dapo", 5, "seq-mean-token-mean", False)


@pytest.mark.parametrize("trl_name, ours", [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean"),
                                             ("dr_grpo", "seq-mean-token-sum-norm"), ("bnpo", "token-mean")])
def test_a_loss_aggregation_has_one_name(trl_name, ours):
    """`algorithm: grpo` aggregates by token-mean; TRL's loss_type "grpo" is seq-mean-token-mean. Accepting both
    would give "grpo" two meanings, so TRL's names are refused with the name to write."""
    with pytest.raises(ValueError, match=f"write loss_type: {ours}"):
        RLParams.model_validate({"loss_type": trl_name})


@pytest.mark.parametrize("switch, instead", [
    ({"arpo": {"enabled": True}}, "rl.algorithm: arpo"),
    ({"aepo": {"enabled": True}}, "rl.algorithm: aepo"),
    ({"dynamic_sampling": {"enabled": True}}, "rl.algorithm: dapo"),
    ({"aepo": {"entropy_clipping": False}}, "rl.surrogate"),
])
def test_an_old_sampling_switch_is_refused_with_the_algorithm_that_replaced_it(switch, instead):
    """One sampler per algorithm: ARPO's tree and DAPO's filter can no longer be asked for together, and a params
    file with the switches that did so says what to write."""
    with pytest.raises(ValueError, match=f"no longer a param: {instead}"):
        RLParams.model_validate({"algorithm": "arpo", **switch})


def test_bad_params_name_the_key(tmp_path):
    from components.params import ParamsError, load_section

    path = tmp_path / "rl.yaml"
    path.write_text("rl:\n  algorithm: ppo\n")
    with pytest.raises(ParamsError, match="rl.algorithm"):
        load_section(path, "rl", RLParams)
    path.write_text("rl:\n  arpo: {budget: 4, initial_rollouts: 8}\n")
    with pytest.raises(ParamsError, match="initial_rollouts"):
        load_section(path, "rl", RLParams)


def test_switching_the_algorithm_in_the_shipped_params_file_switches_its_knobs():
    import yaml

    from components.params import parse_section

    from pathlib import Path

    data = yaml.safe_load((Path(__file__).resolve().parents[3] / "params" / "rl.yaml").read_text())
    assert parse_section(data, "rl", RLParams).algorithm == "grpo"
    data["rl"]["algorithm"] = "dapo"
    dapo = parse_section(data, "rl", RLParams)
    assert (dapo.epsilon_high, dapo.spec.sampler, dapo.overlong.enabled) == (0.28, "dapo", True)
    data["rl"]["algorithm"] = "dr_grpo"
    assert parse_section(data, "rl", RLParams).scale_rewards == "none"
