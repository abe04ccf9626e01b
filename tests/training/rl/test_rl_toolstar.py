"""RL on Tool-Star tasks (`rl.env.kind: toolstar`): the same engine, trainer and checkpoints, with Tool-Star's
environment and reward behind its task source (components/toolstar/source.py, through components/environments.py)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from components.agent import loop
from components.toolstar.sandbox import SandboxResult
from components.toolstar.source import REWARD_COLUMNS as TOOLSTAR_REWARD_COLUMNS
from components.toolstar.source import EVAL_CHECKS, EVAL_METRICS, ToolStarSource
from components.toolstar.tasks import Task, generate_tasks, write_tasks
from components.training.rl.engine import RolloutEngine
from components.training.rl.params import RLParams
from components.training.rl.samplers import score_groups
from components.training.rl.trainer import RLPaths, train

from .test_rl_masks import ScriptedTokenPolicy

REPO = Path(__file__).resolve().parents[3]

SEARCH = "<think> look it up </think>\n<search> two </search>"
PYTHON = "<think> compute </think>\n<python>\nprint(1 + 1)\n</python>"
ANSWER = "<think> done </think>\n<answer> The final answer is \\boxed{2} </answer>"


class OnePassage:
    def search(self, query):
        return [{"title": "Two", "text": "Two is one plus one."}]


class PrintsTwo:
    """A stand-in for the sandbox: every program prints 2."""

    def run(self, code):
        return SandboxResult(stdout="2\n", stderr="", exit_code=0, signal=None, limit=None, truncated=False,
                             seconds=0.0, isolation="none", error=None)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from components.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def toolstar_engine(tokenizer, tasks, script) -> RolloutEngine:
    source = ToolStarSource(tasks, OnePassage(), PrintsTwo())
    limits = loop.Limits(max_turns=len(script), max_tokens_per_turn=64, max_context_tokens=20000)
    return RolloutEngine(ScriptedTokenPolicy(tokenizer, script), tokenizer, source, limits)


def test_toolstar_rollouts_are_scored_by_tool_stars_reward(tokenizer):
    tasks = [Task(id="right", question="What is 1 + 1?", answer="2", kind="compute"),
             Task(id="wrong", question="What is 1 + 2?", answer="3", kind="compute")]
    engine = toolstar_engine(tokenizer, tasks, [SEARCH, PYTHON, ANSWER])
    engine.begin_step(1)
    groups = score_groups(engine.groups(tasks, 2), RLParams(env={"kind": "toolstar"}), 0.0, engine.source)
    rewards = [[s.reward.total for s in group] for group in groups]
    assert rewards == [[1.1, 1.1], [0.0, 0.0]]  # right with both tools: 1 + 0.1; well-formed but wrong: 0
    right = groups[0][0]
    assert right.reward.components["success"] == 1.0 and not right.reward.format_applied
    assert right.record["idx"] == 0 and right.record["level"] == "compute"  # the task's place in the file, its kind
    assert engine.source.checks([s.record for g in groups for s in g]) == {
        "format_ok": 1.0, "answered": 1.0, "correct": 0.5, "multi_tool": 0.5}


def test_a_malformed_answer_gets_tool_stars_format_penalty(tokenizer):
    task = Task(id="t", question="What is 1 + 1?", answer="2", kind="compute")
    engine = toolstar_engine(tokenizer, [task], ["<answer> \\boxed{2} </answer>"])  # no <think>: bad format
    engine.begin_step(1)
    ((scored,),) = score_groups(engine.groups([task], 1), RLParams(env={"kind": "toolstar"}), 0.0,
                                engine.source)
    assert scored.reward.total == -1.0 and scored.reward.format_applied


def test_an_arpo_branch_shares_the_retriever_and_the_sandbox(tokenizer):
    task = Task(id="t", question="What is 1 + 1?", answer="2", kind="compute")
    engine = toolstar_engine(tokenizer, [task], [SEARCH, PYTHON, ANSWER])
    (episode,) = engine.start(task, 1)
    engine.advance([episode])  # the search and its result
    (info,) = engine.advance([episode])  # the turn right after the result
    assert info.after_tool
    branch = engine.branch(episode)
    env = branch.state.episode.env
    assert env is not episode.state.episode.env
    assert env.retriever is engine.source.retriever and env.sandbox is engine.source.sandbox


def test_toolstar_params_keep_the_travel_only_knob_off():
    with pytest.raises(ValueError, match="failure_rate"):
        RLParams(env={"kind": "toolstar", "failure_rate": 0.1})
    assert RLParams(env={"kind": "toolstar"}).reward_kind == "toolstar" and RLParams().reward_kind == "sum"


# ---- end to end through train() -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def toolstar_inputs(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(qa dir with a small generated corpus, a Tool-Star task file drawn from it, params/toolstar.yaml)."""
    from components.qa.corpus import build_encyclopedia
    from components.qa.tasks import dump_jsonl

    root = tmp_path_factory.mktemp("toolstar_rl")
    encyclopedia = build_encyclopedia(num_people=30, num_towns=8, num_organisations=5, questions_per_dataset=1,
                                      seed=0)
    passages = [p.to_dict() for p in encyclopedia.passages]
    dump_jsonl(passages, root / "qa" / "corpus.jsonl")
    write_tasks(root / "tasks.jsonl", generate_tasks(passages, num_multi_hop=2, num_compute=2, seed=0))
    (root / "toolstar.yaml").write_text(yaml.safe_dump({"toolstar": {"max_tool_calls": 2}}))
    return root / "qa", root / "tasks.jsonl", root / "toolstar.yaml"


def toolstar_paths(tmp_path: Path, model: Path, inputs: tuple[Path, Path, Path], **more) -> RLPaths:
    """A Tool-Star run's paths under `tmp_path` (no travel world) over `toolstar_inputs`."""
    qa, tasks, toolstar_params = inputs
    return RLPaths(model=model, world=tmp_path / "no-world", queries=tasks, out=tmp_path / "models/rl",
                   checkpoints=tmp_path / "checkpoints/rl", metrics=tmp_path / "metrics/rl.json",
                   plots=tmp_path / "plots/rl", qa=qa, toolstar_params=toolstar_params, **more)


TINY_TOOLSTAR = {"env": {"kind": "toolstar"}, "max_steps": 2, "queries_per_step": 2, "num_generations": 2,
                 "learning_rate": 1e-3, "micro_batch_size": 2,
                 "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096}}


@pytest.mark.slow
def test_grpo_trains_on_toolstar_tasks_writes_its_outputs_and_resumes(tmp_path, tiny_model_dir, toolstar_inputs,
                                                                       bubblewrap):
    paths = toolstar_paths(tmp_path, tiny_model_dir, toolstar_inputs)
    logged = []
    summary = train(RLParams.model_validate(TINY_TOOLSTAR), paths, progress_bar=False,
                    log=lambda metrics, step: logged.append(metrics))
    assert (paths.out / "config.json").exists() and json.loads(paths.metrics.read_text()) == summary
    assert summary["reward_kind"] == "toolstar" and summary["steps_completed"] == 2
    with paths.rewards_csv.open() as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    assert reader.fieldnames == TOOLSTAR_REWARD_COLUMNS and [int(r["step"]) for r in rows] == [1, 2]
    # 8 tokens a turn cannot hold Tool-Star's format: every untrained rollout scores its format penalty, -1
    assert all(float(r["reward"]) == -1.0 and float(r["format_error_rate"]) == 1.0 for r in rows)
    assert {"checks/format_ok", "checks/correct", "reward/success", "episode/tool_calls"} <= set(logged[0])

    resumed = train(RLParams.model_validate({**TINY_TOOLSTAR, "max_steps": 3}), paths, progress_bar=False)
    assert resumed["resumed_from_step"] == 2 and resumed["steps_completed"] == 3


@pytest.mark.slow
def test_greedy_evaluation_during_rl_scores_held_out_toolstar_tasks(tmp_path, tiny_model_dir, toolstar_inputs,
                                                                    bubblewrap):
    tasks = toolstar_inputs[1]
    paths = toolstar_paths(tmp_path, tiny_model_dir, toolstar_inputs, eval_queries=tasks)
    logged = []
    params = RLParams.model_validate({**TINY_TOOLSTAR, "max_steps": 1, "eval": {"every": 1, "max_queries": 3}})
    train(params, paths, progress_bar=False, log=lambda metrics, step: logged.append((step, metrics)))
    with paths.eval_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["step", *EVAL_METRICS, *EVAL_CHECKS] and [int(r["step"]) for r in rows] == [0, 1]
    # 8 tokens a turn cannot hold Tool-Star's format: no greedy episode answers, each scores the format penalty
    assert all(float(r["accuracy"]) == 0.0 and float(r["mean_reward"]) == -1.0 and float(r["format_ok"]) == 0.0
               for r in rows)
    evaluated = [step for step, metrics in logged if "eval/accuracy" in metrics and "eval/checks/correct" in metrics]
    assert evaluated == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["dr_grpo", "dapo", "aepo"])
def test_the_other_algorithms_run_on_toolstar_tasks(algorithm, tmp_path, tiny_model_dir, toolstar_inputs,
                                                    bubblewrap):
    paths = toolstar_paths(tmp_path, tiny_model_dir, toolstar_inputs)
    params = RLParams.model_validate({**TINY_TOOLSTAR, "algorithm": algorithm, "max_steps": 1,
                                      "queries_per_step": 1, "dynamic_sampling": {"max_extra_rounds": 0},
                                      "arpo": {"budget": 3, "initial_rollouts": 2, "entropy_tokens": 4}})
    summary = train(params, paths, progress_bar=False)
    assert summary["steps_completed"] == 1 and summary["reward_last"] == -1.0


def test_the_toolstar_rl_stage_reads_its_own_params_section():
    """dvc.yaml's toolstar_rl stage: `star rl --params params/toolstar_rl.yaml --section toolstar_rl` trains on
    Tool-Star tasks, logs the MLflow stage run `toolstar_rl` and registers `star-toolstar-rl`."""
    import argparse

    from components.params import load_section
    from components.training.commands import registered_name
    from components.training.commands import register_rl as register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["rl", "--params", "params/toolstar_rl.yaml", "--section", "toolstar_rl"])
    params = load_section(REPO / args.params, args.section, RLParams)
    assert params.env.kind == "toolstar" and params.reward_kind == "toolstar"
    assert registered_name(args.section) == "star-toolstar-rl" and registered_name("rl") == "star-rl"
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["toolstar_rl"]
    assert "--section toolstar_rl" in stage["cmd"] and "--model models/toolstar_sft" in stage["cmd"]
