"""AEPO's rollout half: the budget split of entropy pre-monitoring and the consecutive-branch penalty (numbers worked
out by hand), on ARPO's tree driven by the scripted engine of test_rl_arpo; and its params."""
import random

import pytest

from components.training.rl.aepo import (
    EntropyProfile,
    aepo_rollouts,
    consecutive_branch_penalty,
    global_rollouts,
    monitor_entropies,
    penalised_branch_probability,
)
from components.training.rl.arpo import arpo_rollouts, branch_probability
from components.training.rl.params import RLParams

from .test_rl_arpo import ScriptedEngine


def test_pre_monitoring_gives_an_uncertain_question_more_global_samples():
    # m = ceil(k * sigmoid(beta * (H_root - mean H_tool))), k = 8, beta = 0.5
    assert global_rollouts(8, root_entropy=2.0, tool_entropy=0.0, beta=0.5) == 6  # 8 * sigmoid(1) = 5.85
    assert global_rollouts(8, root_entropy=0.0, tool_entropy=2.0, beta=0.5) == 3  # 8 * sigmoid(-1) = 2.15
    assert global_rollouts(8, root_entropy=1.0, tool_entropy=1.0, beta=0.5) == 4  # 8 * sigmoid(0) = 4 exactly
    assert global_rollouts(8, root_entropy=0.0, tool_entropy=100.0, beta=0.5) == 1  # at least one full rollout
    assert global_rollouts(8, root_entropy=100.0, tool_entropy=0.0, beta=0.5) == 8  # at most the budget


def test_the_branch_penalty_grows_by_its_coefficient_per_consecutive_branch_up_to_one():
    assert consecutive_branch_penalty(0, 0.05) == 0.0
    assert consecutive_branch_penalty(3, 0.05) == pytest.approx(0.15)
    assert consecutive_branch_penalty(30, 0.05) == 1.0


def test_the_penalised_branch_probability_is_arpos_times_one_minus_the_penalty():
    # alpha + beta * (H - H_init) = 0.5 + 0.2 * (2 - 1) = 0.7
    assert penalised_branch_probability(2.0, 1.0, streak=0) == pytest.approx(0.7)
    assert penalised_branch_probability(2.0, 1.0, streak=2) == pytest.approx(0.7 * 0.9)
    assert penalised_branch_probability(2.0, 1.0, streak=20) == 0.0
    # the product is clipped to a probability: (0.5 + 0.2 * 10) * (1 - 0.25 * 2) = 1.25 -> 1
    assert penalised_branch_probability(10.0, 0.0, streak=2, branch_penalty=0.25) == 1.0
    assert penalised_branch_probability(0.0, 10.0, streak=0) == 0.0
    # no penalty: ARPO's branch probability
    for h, h0, l in [(2.0, 1.0, 3), (1.0, 2.0, 1), (1.0, 1.0, 9)]:
        assert penalised_branch_probability(h, h0, l, branch_penalty=0.0) == branch_probability(h, h0)


def test_pre_monitoring_reads_the_first_turn_and_the_turns_after_tool_responses():
    engine = ScriptedEngine(turns=3, initial_entropy=2.0, entropy_after_tool=0.5)
    (profile,) = monitor_entropies(engine, ["q0"])
    assert (profile.root, profile.tool, profile.tool_mean) == (2.0, [0.5, 0.5], 0.5)
    assert len(engine.started) == 1 and engine.branched == []  # one full rollout, never branched
    assert EntropyProfile(root=1.5).tool_mean == 1.5  # no tool call: mean H_tool falls back to H_root


@pytest.mark.parametrize("h_root, h_tool, global_samples", [(2.0, 0.0, 6), (0.0, 2.0, 3)])
def test_aepo_starts_the_global_samples_pre_monitoring_allocates(h_root, h_tool, global_samples):
    engine = ScriptedEngine(turns=2, initial_entropy=h_root, entropy_after_tool=h_tool)
    # alpha = beta = 0: p = 0, nothing branches, so the rest of the budget is filled with fresh full rollouts
    result = aepo_rollouts(engine, ["q0"], budget=8, alpha=0.0, beta=0.0, allocation_beta=0.5,
                           rng=random.Random(0))
    assert [len(g) for g in result.groups] == [8]
    assert (result.stats.initial, result.stats.branches, result.stats.fills) == (global_samples, 0, 8 - global_samples)
    assert len(engine.started) == 1 + 8  # the monitoring rollout is not one of the 8
    assert result.extra == {"aepo/global_rollouts": global_samples, "aepo/monitor_rollouts": 1,
                            "aepo/root_entropy": h_root, "aepo/tool_entropy": h_tool}


def test_a_full_penalty_vetoes_every_branch_right_after_a_branch_on_the_same_path():
    """alpha = 1, beta = 0, branch_penalty = 1: p = 1 - l, so a path branches at a tool call only when it did not
    branch at the one before. One rollout of 4 turns (3 after a tool response), budget 16:
    round 2: s0 branches (b1 copies s0 after its 1st turn, streak 1) | round 3: s0 and b1 are vetoed |
    round 4: s0 branches (b2), b1 branches (b3) | round 5: b1, b2, b3 vetoed | round 6: b3 branches (b4) |
    round 7: b4 vetoed. 4 branches, 10 branch points; the other 11 samples are fresh full rollouts."""
    engine = ScriptedEngine(turns=4, initial_entropy=0.0, entropy_after_tool=5.0)
    result = aepo_rollouts(engine, ["q0"], budget=16, initial_rollouts=1, alpha=1.0, beta=0.0, branch_penalty=1.0,
                           dynamic_rollouts=False, rng=random.Random(0))
    assert (result.stats.branches, result.stats.branch_points, result.stats.fills) == (4, 10, 11)
    assert result.stats.mean_branch_probability == pytest.approx(4 / 10)
    assert sorted(ep["id"] for ep in engine.branched) == ["q0-0/b", "q0-0/b", "q0-0/b/b", "q0-0/b/b/b"]
    assert result.extra == {"aepo/global_rollouts": 1}
    # ARPO's rule on the same tree (no penalty) branches at every tool call until the budget is spent
    arpo = arpo_rollouts(ScriptedEngine(turns=4, initial_entropy=0.0, entropy_after_tool=5.0), ["q0"], budget=16,
                         initial_rollouts=1, alpha=1.0, beta=0.0, rng=random.Random(0))
    assert (arpo.stats.branches, arpo.stats.fills) == (15, 0)


def test_the_aepo_algorithm_runs_a_tree_of_arpo_budget_with_its_own_objective():
    p = RLParams.model_validate({"algorithm": "aepo"})
    assert (p.spec.sampler, p.spec.tree, p.group_size, p.scale_rewards, p.epsilon_high) == \
        ("aepo", True, p.arpo.budget, "group", None)
    assert (p.aepo.dynamic_rollouts, p.aepo.allocation_beta, p.aepo.branch_penalty, p.surrogate,
            p.token_weighting, p.aepo.entropy_advantage_coef) == (True, 0.5, 0.05, "entropy_balanced",
                                                                 "entropy_aware", 0.2)
    arpo = RLParams.model_validate({"algorithm": "arpo"})
    assert (arpo.spec.sampler, arpo.surrogate, arpo.token_weighting) == ("arpo", "clipped", "none")


def test_the_update_config_turns_on_aepos_objective_only_under_aepo(tmp_path, tiny_model_dir, tiny_world_dir,
                                                                   rl_queries_path):
    from components.training.rl.trainer import RLPaths, build_parts, load_task_source

    paths = RLPaths(model=tiny_model_dir, world=tiny_world_dir, queries=rl_queries_path, out=tmp_path / "out",
                    checkpoints=tmp_path / "ckpt", metrics=tmp_path / "m.json", plots=tmp_path / "plots")
    tasks = load_task_source(RLParams(), paths)
    configs = {algorithm: build_parts(RLParams.model_validate({"algorithm": algorithm}), paths, tasks, tiny_model_dir,
                                      total_steps=1, device="cpu").update_config for algorithm in ("arpo", "aepo")}
    assert (configs["arpo"].surrogate, configs["arpo"].token_weighting) == ("clipped", "none")
    assert (configs["aepo"].surrogate, configs["aepo"].token_weighting, configs["aepo"].entropy_advantage_coef) == \
        ("entropy_balanced", "entropy_aware", 0.2)


class GradientRecorder:
    """The optimizer interface `update_policy` uses, keeping each step's gradients instead of applying them."""

    lr = 0.0

    def __init__(self, model):
        self.params, self.steps = list(model.parameters()), []

    def backward(self, loss, sync: bool = True) -> None:
        loss.backward()

    def step(self) -> float:
        self.steps.append([p.grad.detach().clone() for p in self.params])
        for p in self.params:
            p.grad = None
        return 0.0


def test_entropy_aware_advantages_use_the_mini_batch_so_micro_batching_never_changes_the_gradient(tiny_model_dir):
    """The entropies are standardised over the whole mini-batch (one no-grad pass first), so one micro-batch of two
    rollouts and two micro-batches of one give the same gradient; it differs from plain advantages' gradient, and
    the extra pass counts as processed tokens."""
    import torch

    from components.models.loading import load_policy_model
    from components.training.rl.update import Rollout, UpdateConfig, update_policy

    model = load_policy_model(tiny_model_dir, dtype="float32", device="cpu")
    with torch.no_grad():  # a random model's entropies all sit at log |V| (std 3e-5, float32 noise): sharpen them
        model.get_output_embeddings().weight.mul_(30.0)

    def gradient(micro_batch_size: int, coef: float):
        rollouts = [Rollout(input_ids=[20, 21, 22, 23, 24], loss_mask=[0, 0, 1, 1, 1], advantage=1.0),
                    Rollout(input_ids=[20, 21, 30, 31, 32], loss_mask=[0, 0, 1, 1, 1], advantage=-1.0)]
        config = UpdateConfig(micro_batch_size=micro_batch_size, surrogate="entropy_balanced",
                              token_weighting="entropy_aware", entropy_advantage_coef=coef)
        recorder = GradientRecorder(model)
        stats = update_policy(model, recorder, rollouts, config, pad_id=0)
        (grads,) = recorder.steps
        return grads, stats

    whole, stats = gradient(2, 0.2)
    split, _ = gradient(1, 0.2)
    plain, plain_stats = gradient(2, 0.0)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(whole, split))  # float32 noise: ~3e-5
    assert not all(torch.allclose(a, b, atol=1e-2) for a, b in zip(whole, plain))
    assert (stats["processed_tokens"], plain_stats["processed_tokens"]) == (2 * 10, 10)
