"""The Tool-Star branch's stages: the expert's SFT records (`star toolstar teach`) and a checkpoint's evaluation
(`star toolstar eval`, `evaluate_checkpoint`). The toolstar environment's code (its params `ToolStarParams`, the task
sets `build_tasks`, the episodes and their metrics: components/toolstar/) is reached through the environment
registry (`toolstar(module)`).

SFT records: the programmatic expert (`ToolStarExpertPolicy`) solves the SFT tasks through the agent loop in
`ToolStarEnv` with the real sandbox (`run_toolstar`, components/toolstar/evaluate.py); an episode is kept when
Tool-Star's reward is positive (the format passes and the answer scores) and its conversation is new. A kept
episode becomes a chat record in the sft_data stage's shape (docs/contracts.md, "SFT record"), so `star sft` reads
it unchanged: its assistant turns are trained unless the environment answered one with an error (a malformed turn,
a call over the limit), and tool results stay user messages (`<result>…</result>`, masked out of the loss).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import ModuleType

from components import environments
from components.agent.environment import trained_turn
from components.agent.loop import Limits
from components.evaluation.policy import load_checkpoint_policy
from components.synthesis.filter import estimate_counter, fingerprint, split_train_eval, trajectory_tokens

KIND = "toolstar"  # the environment of the Tool-Star branch's stages


def toolstar(module: str) -> ModuleType:
    """The toolstar environment package's `module` (e.g. "params", "splits", "datasets", "evaluate")."""
    return environments.package_module(KIND, module)


# --- SFT records ------------------------------------------------------------------------------------------------

def sft_record(record: dict, tokens: int) -> dict:
    """The chat-format SFT record of a scored episode (the sft_data stage's fields, the task kind as the level)."""
    messages = record["messages"]
    return {
        "idx": record["idx"],
        "id": record["id"],
        "level": record["kind"],
        "template": record.get("template"),
        "messages": [{"role": m["role"], "content": m["content"], "train": trained_turn(messages, i)}
                     for i, m in enumerate(messages)],
        "num_tokens": tokens,
        "num_turns": record.get("num_turns"),
        "num_tool_calls": record.get("num_tool_calls"),
    }


def keep_solved(records: list[dict], chars_per_token: float) -> tuple[list[dict], dict]:
    """The SFT records of the episodes with a positive reward, each conversation once, and the drop counts
    (`unsolved`, `duplicate`)."""
    count = estimate_counter(chars_per_token)
    kept, seen, dropped = [], set(), Counter()
    for record in records:
        if record["evaluation"]["reward"] <= 0:
            dropped["unsolved"] += 1
            continue
        key = fingerprint(record)
        if key in seen:
            dropped["duplicate"] += 1
            continue
        seen.add(key)
        kept.append(sft_record(record, trajectory_tokens(record, count)))
    return kept, {"unsolved": dropped["unsolved"], "duplicate": dropped["duplicate"]}


def teach(params, qa_dir: str | Path, tasks_path: str | Path,
          progress: bool = True) -> tuple[list[dict], list[dict], dict]:
    """The expert on every task of `tasks_path` with `params` (`ToolStarParams`): (train records, eval records,
    metrics). The metrics are `summarize`'s over every episode (`accuracy` is the solve rate, `tool_calls` per
    episode by tool) plus `solve_rate` (reward > 0), `kept`, `dropped`, `train`, `eval` and `mean_tokens`."""
    evaluate = toolstar("evaluate")
    tasks, retriever, sandbox = evaluate.load_task_set(params, qa_dir, tasks_path)
    records = evaluate.run_toolstar(tasks, retriever, sandbox, environments.expert_policy(KIND), params,
                                    Limits(max_turns=params.teach.max_turns), progress=progress)
    kept, dropped = keep_solved(records, params.teach.chars_per_token)
    train, evaluation = split_train_eval(kept, params.teach.eval_fraction, params.seed)
    summary = evaluate.summarize(records)
    metrics = {**summary, "solve_rate": summary["reward_positive_rate"], "kept": len(kept), "dropped": dropped,
               "train": len(train), "eval": len(evaluation),
               "mean_tokens": sum(r["num_tokens"] for r in kept) / len(kept) if kept else 0.0}
    return train, evaluation, metrics


def evaluate_checkpoint(model: str | Path, params, qa_dir: str | Path, tasks_path: str | Path,
                        records_out: list | None = None) -> dict:
    """The metrics of a checkpoint's greedy (by default) episodes on a task file with `params` (`ToolStarParams`;
    `summarize`); the records are appended to `records_out` when given."""
    evaluate = toolstar("evaluate")
    tasks, retriever, sandbox = evaluate.load_task_set(params, qa_dir, tasks_path, params.eval.max_tasks)
    policy, tokenizer = load_checkpoint_policy(model, params.eval.decoding, params.eval.limits.max_context_tokens)
    records = evaluate.run_toolstar(tasks, retriever, sandbox, policy, params, params.eval.limits.to_limits(),
                                    tokenizer=tokenizer)
    if records_out is not None:
        records_out.extend(records)
    return evaluate.summarize(records)
