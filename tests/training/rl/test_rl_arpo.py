"""ARPO's branching decisions and budget accounting, with a scripted engine and deterministic fake entropies."""
import random

import pytest

from components.training.rl.arpo import TurnInfo, arpo_rollouts, branch_probability, segment_entropy


def test_branch_probability_is_alpha_plus_beta_times_the_entropy_change_clipped():
    assert branch_probability(1.0, 1.0) == pytest.approx(0.5)
    assert branch_probability(2.0, 1.0) == pytest.approx(0.7)
    assert branch_probability(1.0, 2.0) == pytest.approx(0.3)
    assert branch_probability(10.0, 0.0) == 1.0
    assert branch_probability(0.0, 10.0) == 0.0


def test_segment_entropy_averages_the_first_k_tokens():
    assert segment_entropy([1.0, 3.0, 100.0], k=2) == pytest.approx(2.0)
    assert segment_entropy([4.0], k=20) == pytest.approx(4.0)
    assert segment_entropy([], k=20) == 0.0


class ScriptedEngine:
    """Each episode makes `turns` turns: the first sets H_init, every later one follows a tool response.

    The entropy of a turn is `entropy_after_tool` (or `initial_entropy` for the first turn), so with alpha=0.5 and
    beta the branch probability is exactly 0 or 1 and the outcome is deterministic.
    """

    def __init__(self, turns=3, initial_entropy=1.0, entropy_after_tool=1.0):
        self.turns, self.h0, self.h = turns, initial_entropy, entropy_after_tool
        self.started, self.branched, self.calls = [], [], 0

    def start(self, query, n):
        eps = [{"query": query, "turns_done": 0, "id": f"{query}-{len(self.started) + i}", "log": []}
               for i in range(n)]
        self.started += eps
        return eps

    def advance(self, episodes):
        self.calls += 1
        infos = []
        for ep in episodes:
            first = ep["turns_done"] == 0
            ep["turns_done"] += 1
            ep["log"].append(ep["turns_done"])
            infos.append(TurnInfo(after_tool=not first, entropy=self.h0 if first else self.h,
                                  done=ep["turns_done"] >= self.turns))
        return infos

    def branch(self, episode):
        # the branch restarts right after the tool response: one turn less than the source has now
        copy = {**episode, "turns_done": episode["turns_done"] - 1, "log": list(episode["log"][:-1]),
                "id": episode["id"] + "/b"}
        self.branched.append(copy)
        return copy


def test_low_entropy_never_branches_and_the_budget_is_filled_with_fresh_rollouts():
    engine = ScriptedEngine(turns=3, initial_entropy=5.0, entropy_after_tool=0.0)  # p = clip(0.5 - 1.0) = 0
    result = arpo_rollouts(engine, ["q0", "q1"], budget=16, initial_rollouts=8, alpha=0.5, beta=0.2,
                           rng=random.Random(0))
    assert [len(g) for g in result.groups] == [16, 16]
    assert result.stats.branches == 0
    assert result.stats.fills == 16
    assert result.stats.branch_points == 2 * 8 * 2  # two after-tool turns per initial rollout; fills never branch
    assert all(ep["turns_done"] == 3 for g in result.groups for ep in g)


def test_high_entropy_branches_once_per_source_per_round_until_the_budget_is_spent():
    engine = ScriptedEngine(turns=3, initial_entropy=0.0, entropy_after_tool=5.0)  # p = clip(0.5 + 1.0) = 1
    result = arpo_rollouts(engine, ["q0"], budget=16, initial_rollouts=8, alpha=0.5, beta=0.2,
                           rng=random.Random(0))
    (group,) = result.groups
    assert len(group) == 16
    # round 1 sets H_init; round 2: the 8 sources each branch once (budget 8 -> 16); nothing left to fill
    assert result.stats.branches == 8
    assert result.stats.fills == 0
    assert len(engine.branched) == 8
    # a branch is a copy of the prefix right after the tool response and then finishes on its own
    assert all(ep["turns_done"] == 3 for ep in group)
    assert sorted(ep["id"] for ep in group if ep["id"].endswith("/b")) == sorted(f"q0-{i}/b" for i in range(8))


def test_branching_respects_a_small_budget_and_fills_nothing_when_it_is_spent():
    engine = ScriptedEngine(turns=4, initial_entropy=0.0, entropy_after_tool=5.0)
    result = arpo_rollouts(engine, ["q0"], budget=10, initial_rollouts=8, alpha=0.5, beta=0.2,
                           rng=random.Random(0))
    assert len(result.groups[0]) == 10
    assert result.stats.branches == 2
    assert result.stats.fills == 0


def test_initial_entropy_is_per_trajectory_and_per_batch():
    # batch 1 has a high initial entropy; if it leaked into batch 2 (the reference code's bug), batch 2's
    # after-tool entropy of 2.0 would look like a drop (p = 0.5 + 0.2 * (2 - 9) < 0) and never branch
    engine = ScriptedEngine(turns=2, initial_entropy=9.0, entropy_after_tool=9.0)
    arpo_rollouts(engine, ["q0"], budget=4, initial_rollouts=2, alpha=0.5, beta=0.2, rng=random.Random(0))
    engine.h0, engine.h = 0.0, 2.0  # p = clip(0.5 + 0.4) = 0.9
    result = arpo_rollouts(engine, ["q1"], budget=4, initial_rollouts=2, alpha=0.5, beta=0.2,
                           rng=random.Random(0))
    assert result.stats.mean_branch_probability == pytest.approx(0.9)
    assert result.stats.branches >= 1


def test_the_budget_must_hold_the_initial_rollouts():
    with pytest.raises(ValueError, match="initial_rollouts <= budget"):
        arpo_rollouts(ScriptedEngine(), ["q"], budget=4, initial_rollouts=8, rng=random.Random(0))
