"""Greedy evaluation on held-out queries during RL (`rl.eval`): when it runs, what it writes, that it is the
validate stage's scoring on travel, that a resumed run keeps its rows, and that it leaves training untouched
(Tool-Star's held-out evaluation: test_rl_toolstar.py)."""
import csv
import hashlib
from dataclasses import replace
from types import SimpleNamespace

import pytest

from components.errors import UserError
from components.training.rl.checkpoint import complete_checkpoints
from components.training.rl.params import RLParams
from components.training.rl.trainer import (RLPaths, eval_columns, evaluation_due, load_held_out, load_task_source,
                                            train)
from components.travel.source import EVAL_CHECKS, EVAL_METRICS

TINY = {"max_steps": 3, "queries_per_step": 1, "num_generations": 2, "learning_rate": 1e-3, "micro_batch_size": 2,
        "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096},
        "eval": {"every": 2, "max_queries": 3}}


def paths_in(tmp_path, tiny_model_dir, tiny_world_dir, queries) -> RLPaths:
    return RLPaths(model=tiny_model_dir, world=tiny_world_dir, queries=queries, out=tmp_path / "models/rl",
                   checkpoints=tmp_path / "checkpoints/rl", metrics=tmp_path / "metrics/rl.json",
                   plots=tmp_path / "plots/rl", eval_queries=queries)


def rows_of(path) -> list[dict]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def weights_md5(model_dir) -> str:
    return hashlib.md5((model_dir / "model.safetensors").read_bytes()).hexdigest()


def test_evaluations_fall_on_step_0_every_k_steps_and_the_last_step():
    assert [s for s in range(0, 8) if evaluation_due(s, 3, last_step=7)] == [0, 3, 6, 7]
    assert [s for s in range(0, 7) if evaluation_due(s, 3, last_step=6)] == [0, 3, 6]
    assert [s for s in range(0, 5) if evaluation_due(s, 10, last_step=2)] == [0, 2]  # a run cut short: its last step
    assert not any(evaluation_due(s, None, last_step=4) for s in range(0, 5))


def test_an_evaluation_without_its_query_file_is_refused_with_the_fix(tmp_path, tiny_world_dir, rl_queries_path):
    params = RLParams.model_validate(TINY)
    paths = paths_in(tmp_path, tmp_path / "no-model", tiny_world_dir, rl_queries_path)
    source = load_task_source(params, paths)
    with pytest.raises(UserError, match=r"--eval-queries data/queries/val.jsonl .* rl.eval.every: null"):
        load_held_out(params, replace(paths, eval_queries=tmp_path / "missing.jsonl"), source)
    assert load_held_out(RLParams.model_validate({**TINY, "eval": {"every": None}}),
                         replace(paths, eval_queries=None), source) is None
    held_out = load_held_out(params, paths, source)
    assert len(held_out.items) == 3 and held_out.world is source.world  # the run's world, loaded once


@pytest.mark.slow
def test_greedy_evaluation_logs_the_validate_stage_metrics_and_leaves_training_untouched(
        tmp_path, tiny_model_dir, tiny_world_dir, rl_queries_path):
    from components.evaluation.policy import DecodingParams, LimitsParams
    from components.evaluation.validate import validate_checkpoint
    from components.travel.validation import ValidateParams

    paths = paths_in(tmp_path / "eval", tiny_model_dir, tiny_world_dir, rl_queries_path)
    logged = []
    summary = train(RLParams.model_validate(TINY), paths, log=lambda metrics, step: logged.append((step, metrics)),
                    progress_bar=False)
    rows = rows_of(paths.eval_csv)
    assert list(rows[0]) == ["step", *EVAL_METRICS, *EVAL_CHECKS] == eval_columns(load_task_source(
        RLParams.model_validate(TINY), paths)) and [int(r["step"]) for r in rows] == [0, 2, 3]
    evaluated = [(step, m) for step, m in logged if "eval/commonsense_micro" in m]
    assert [step for step, _ in evaluated] == [0, 2, 3]
    assert {f"eval/{key}" for key in EVAL_METRICS} <= set(evaluated[0][1])
    assert "eval/checks/is_valid_restaurants" in evaluated[0][1]
    assert summary["eval"]["first"]["step"] == 0 and summary["eval"]["last"]["step"] == 3

    # step 0 is the start model scored exactly as `star validate` scores it (greedy, same limits and queries)
    limits = LimitsParams(**TINY["rollout"])
    _, _, metrics = validate_checkpoint(tiny_model_dir, tiny_world_dir, rl_queries_path,
                                        ValidateParams(limits=limits, decoding=DecodingParams(), max_queries=3))
    start = {key: float(value) for key, value in rows[0].items() if key != "step" and value != ""}  # "": n/a
    assert start == pytest.approx({**{k: metrics["strict"][k] for k in EVAL_METRICS}, **metrics["strict"]["per_check"]})

    # the same run without evaluation trains the very same weights
    quiet = paths_in(tmp_path / "quiet", tiny_model_dir, tiny_world_dir, rl_queries_path)
    train(RLParams.model_validate({**TINY, "eval": {"every": None}}), quiet, progress_bar=False)
    assert weights_md5(quiet.out) == weights_md5(paths.out)
    assert rows_of(quiet.eval_csv) == []  # the header only: DVC finds the output it declares


@pytest.mark.slow
def test_a_resumed_run_keeps_its_evaluations_and_adds_the_rest(tmp_path, tiny_model_dir, tiny_world_dir,
                                                               rl_queries_path):
    import shutil

    paths = paths_in(tmp_path, tiny_model_dir, tiny_world_dir, rl_queries_path)
    params = RLParams.model_validate({**TINY, "max_steps": 4})
    train(params, paths, progress_bar=False)
    before = rows_of(paths.eval_csv)
    assert [int(r["step"]) for r in before] == [0, 2, 4]
    shutil.rmtree(complete_checkpoints(paths.checkpoints)[-1][1])  # killed before step 4's checkpoint
    paths.eval_csv.unlink()  # `dvc repro` deletes the stage's outputs
    seen = []
    train(params, paths, log=lambda metrics, step: seen.append(step), progress_bar=False)
    assert 0 not in seen and rows_of(paths.eval_csv) == before


def test_the_greedy_twin_decodes_with_the_rollout_policys_own_model(tiny_model_dir):
    from components.agent.hf import HFPolicy
    from components.models.loading import load_policy_model, load_tokenizer
    from components.training.rl.rollout_backends import ROLLOUT_BACKENDS

    model = load_policy_model(tiny_model_dir, device="cpu")
    sampler = HFPolicy(model, load_tokenizer(tiny_model_dir), temperature=0.6, chunk_tokens=32, max_batch_size=8)
    twin = ROLLOUT_BACKENDS["hf"].greedy(sampler)
    assert twin.model is model and twin.greedy and not sampler.greedy
    assert (twin.chunk_tokens, twin.max_batch_size) == (32, 8)
    assert twin.caches is not sampler.caches  # its key/value caches are its own


def test_the_greedy_twin_of_vllm_rollouts_decodes_on_the_same_weight_synced_engine(tiny_model_dir):
    from types import SimpleNamespace

    from components.agent.engine_client import EngineOptions
    from components.agent.vllm_backend import VLLMPolicy
    from components.models.loading import load_tokenizer
    from components.training.rl.rollout_backends import ROLLOUT_BACKENDS

    engine = SimpleNamespace(options=EngineOptions())  # passed in: no engine process is started
    sampler = VLLMPolicy("models/sft", tokenizer=load_tokenizer(tiny_model_dir), temperature=1.0, engine=engine)
    twin = ROLLOUT_BACKENDS["vllm"].greedy(sampler)
    assert twin.engine is engine and twin.temperature == 0.0 and sampler.temperature == 1.0
    assert twin.end_ids == sampler.end_ids


def test_mlflow_gets_the_set_metrics_and_every_check_a_query_sets():
    from components.training.rl.trainer import eval_metrics

    row = {"step": 6, "delivery_rate": 1.0, "commonsense_micro": 0.6, "is_valid_restaurants": 0.5,
           "valid_room_rule": None}
    assert eval_metrics(row, SimpleNamespace(eval_metrics=EVAL_METRICS)) == {"eval/delivery_rate": 1.0, "eval/commonsense_micro": 0.6,
                                 "eval/checks/is_valid_restaurants": 0.5}
