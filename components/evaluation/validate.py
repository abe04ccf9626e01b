"""The validate stage: a checkpoint on the TravelPlanner validation queries, every plan scored with both evaluator
modes. The travel environment's validation (its params `ValidateParams`, the episodes, the metrics, the prose-plan
formatter, the leaderboard submission: components/travel/validation.py) is reached through the environment
registry; this module loads the checkpoint and writes the outputs.

    queries, records, metrics = validate_checkpoint("models/sft", "data/world", "data/queries/val.jsonl", params)
"""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from components import environments
from components.evaluation.policy import load_checkpoint_policy

KIND = "travel"  # the environment the validate stage evaluates on


def validation() -> ModuleType:
    """The travel environment's validation module (components/travel/validation.py)."""
    return environments.package_module(KIND, "validation")


def validate_checkpoint(model: str | Path, world_dir: str | Path, queries_path: str | Path, params,
                        formatter=None) -> tuple[list, list[dict], dict]:
    """Load the checkpoint, world and queries, run the validation with `params` (`ValidateParams`); return
    (queries, records, metrics)."""
    travel = validation()
    world, queries = travel.load_validation_set(world_dir, queries_path, params.max_queries)
    policy, tokenizer = load_checkpoint_policy(model, params.decoding, params.limits.max_context_tokens)
    if formatter is None and params.answer_format == "prose":
        formatter = travel.ProsePlanFormatter(params.formatter)
    records, metrics = travel.run_validation(world, queries, policy, params.limits.to_limits(),
                                             tokenizer=tokenizer, failure_rate=params.failure_rate,
                                             seed=params.decoding.seed, formatter=formatter)
    return queries, records, metrics


def write_jsonl(lines: list[dict], path: str | Path) -> Path:
    """Write JSONL (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
    return path
