"""Algorithms are registered parts: `rl.algorithm` selects a sampler and the update's named functions, and adding
one is one module and one registration (tests/training/rl/toy_algorithm.py)."""
import importlib
import sys

import pytest

from components.params import ParamsError, parse_section
from components.training.rl.algorithms import ALGORITHMS
from components.training.rl.params import RLParams
from components.training.rl.samplers import SAMPLERS, remove_algorithm
from components.training.rl.trainer import RLPaths, train


@pytest.fixture
def toy_algorithm():
    """tests/training/rl/toy_algorithm.py imported (its registration runs), removed again afterwards."""
    sys.modules.pop("tests.training.rl.toy_algorithm", None)
    yield importlib.import_module("tests.training.rl.toy_algorithm")
    remove_algorithm("best_worst")
    sys.modules.pop("tests.training.rl.toy_algorithm", None)


def test_every_shipped_algorithm_names_a_registered_sampler():
    assert {"grpo", "dr_grpo", "dapo", "arpo", "aepo"} <= set(ALGORITHMS)
    assert all(algorithm.sampler in SAMPLERS for algorithm in ALGORITHMS.values())


def test_an_unknown_algorithm_is_refused_with_the_registered_ones():
    with pytest.raises(ParamsError, match="unknown rl.algorithm 'ppo': use one of grpo, dr_grpo, dapo, arpo, aepo"):
        parse_section({"rl": {"algorithm": "ppo"}}, "rl", RLParams)


def test_a_toy_algorithm_is_one_module_and_one_registration(toy_algorithm):
    params = RLParams.model_validate({"algorithm": "best_worst"})
    assert (params.spec.sampler, params.scale_rewards, params.loss_type) == ("best_worst", "none", "token-mean")
    with pytest.raises(ValueError, match="already registered"):
        importlib.reload(toy_algorithm)


def test_a_toy_algorithm_trains_through_the_trainer(toy_algorithm, tmp_path, tiny_model_dir, tiny_world_dir,
                                                    rl_queries_path):
    params = RLParams.model_validate({
        "algorithm": "best_worst", "max_steps": 1, "queries_per_step": 2, "num_generations": 3,
        "learning_rate": 1e-3, "micro_batch_size": 2,
        "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096}})
    paths = RLPaths(model=tiny_model_dir, world=tiny_world_dir, queries=rl_queries_path, out=tmp_path / "out",
                    checkpoints=tmp_path / "ckpt", metrics=tmp_path / "metrics.json", plots=tmp_path / "plots")
    logged = []
    summary = train(params, paths, log=lambda metrics, step: logged.append(metrics), progress_bar=False)
    (metrics,) = logged
    assert summary["algorithm"] == "best_worst" and metrics["best_worst/pairs"] == 2
    assert metrics["batch/trajectories"] == 4  # two per query trained ...
    assert metrics["episode/turns"] > 0 and "reward/mean" in metrics  # ... and all six logged


def test_removing_the_toy_algorithm_leaves_the_shipped_ones(toy_algorithm):
    remove_algorithm("best_worst")
    assert "best_worst" not in ALGORITHMS and "best_worst" not in SAMPLERS and "groups" in SAMPLERS
