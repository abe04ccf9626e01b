"""The Tool-Star branch's stages: the task sets (`star toolstar tasks`), the expert's SFT records (`star toolstar
teach`) and a checkpoint's evaluation (`star toolstar eval`, `evaluate_checkpoint`).

Tasks: `generate_tasks` (components/toolstar/tasks.py) draws the SFT and validation tasks in ONE call over the QA
stage's encyclopedia, so no question is in both; `split_tasks` then takes the validation tasks out (the first of
each kind in the drawn order) and leaves the rest to SFT. Ids stay those of the draw, unique across the two files.
The draw depends on the total counts: changing `val` changes the SFT tasks too.

SFT records: the programmatic expert (`ToolStarExpertPolicy`) solves the SFT tasks through the agent loop in
`ToolStarEnv` with the real sandbox (`run_toolstar`, components/toolstar/evaluate.py); an episode is kept when
Tool-Star's reward is positive (the format passes and the answer scores) and its conversation is new. A kept
episode becomes a chat record in the sft_data stage's shape (docs/contracts.md, "SFT record"), so `star sft` reads
it unchanged: its assistant turns are trained unless the environment answered one with an error (a malformed turn,
a call over the limit), and tool results stay user messages (`<result>…</result>`, masked out of the loss).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from components.agent.environment import trained_turn
from components.agent.loop import Limits
from components.evaluation.policy import load_checkpoint_policy
from components.retrieval import load_corpus
from components.synthesis.filter import estimate_counter, fingerprint, split_train_eval, trajectory_tokens
from components.toolstar.evaluate import load_environment, run_toolstar, summarize
from components.toolstar.params import TaskSplits, ToolStarParams
from components.toolstar.expert import ToolStarExpertPolicy
from components.toolstar.tasks import Task, TaskError, generate_tasks, read_tasks, write_tasks

# --- tasks ------------------------------------------------------------------------------------------------------

def split_tasks(tasks: Sequence[Task], val_multi_hop: int, val_compute: int) -> tuple[list[Task], list[Task]]:
    """(sft, val): the first `val_multi_hop` multi-hop and `val_compute` compute tasks go to val, in order; the
    rest stay in sft, in order."""
    wanted = {"multi_hop_arithmetic": val_multi_hop, "compute": val_compute}
    taken: Counter = Counter()
    sft, val = [], []
    for task in tasks:
        if taken[task.kind] < wanted.get(task.kind, 0):
            taken[task.kind] += 1
            val.append(task)
        else:
            sft.append(task)
    short = {kind: n for kind, n in wanted.items() if taken[kind] < n}
    if short:
        raise TaskError(f"the draw holds too few tasks for the validation split {short}: ask for fewer")
    return sft, val


def draw_task_splits(passages: list[dict], splits: TaskSplits, seed: int) -> dict[str, list[Task]]:
    """{"sft": [...], "val": [...]}: the two task sets, drawn together from the corpus passages (disjoint)."""
    tasks = generate_tasks(passages, num_multi_hop=splits.sft.multi_hop + splits.val.multi_hop,
                           num_compute=splits.sft.compute + splits.val.compute, seed=seed)
    sft, val = split_tasks(tasks, splits.val.multi_hop, splits.val.compute)
    return {"sft": sft, "val": val}


def task_summary(tasks: Sequence[Task]) -> dict:
    """How many tasks, by kind and by template."""
    return {"n": len(tasks), "by_kind": dict(sorted(Counter(t.kind for t in tasks).items())),
            "by_template": dict(sorted(Counter(t.template for t in tasks).items()))}


def build_tasks(params: ToolStarParams, qa_dir: str | Path, out_dir: str | Path) -> dict:
    """Write `sft.jsonl` and `val.jsonl` under `out_dir` from `qa_dir/corpus.jsonl`; return the summary metrics."""
    passages = load_corpus(Path(qa_dir) / "corpus.jsonl")
    splits = draw_task_splits(passages, params.tasks, params.seed)
    for name, tasks in splits.items():
        write_tasks(Path(out_dir) / f"{name}.jsonl", tasks)
    shared = {t.question for t in splits["sft"]} & {t.question for t in splits["val"]}
    return {**{name: task_summary(tasks) for name, tasks in splits.items()}, "shared_questions": len(shared)}


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


def teach(params: ToolStarParams, qa_dir: str | Path, tasks_path: str | Path,
          progress: bool = True) -> tuple[list[dict], list[dict], dict]:
    """The expert on every task of `tasks_path`: (train records, eval records, metrics). The metrics are
    `summarize`'s over every episode (`accuracy` is the solve rate, `tool_calls` per episode by tool) plus
    `solve_rate` (reward > 0), `kept`, `dropped`, `train`, `eval` and `mean_tokens`."""
    tasks = read_tasks(tasks_path)
    retriever, sandbox = load_environment(params, qa_dir)
    records = run_toolstar(tasks, retriever, sandbox, ToolStarExpertPolicy(), params,
                           Limits(max_turns=params.teach.max_turns), progress=progress)
    kept, dropped = keep_solved(records, params.teach.chars_per_token)
    train, evaluation = split_train_eval(kept, params.teach.eval_fraction, params.seed)
    summary = summarize(records)
    metrics = {**summary, "solve_rate": summary["reward_positive_rate"], "kept": len(kept), "dropped": dropped,
               "train": len(train), "eval": len(evaluation),
               "mean_tokens": sum(r["num_tokens"] for r in kept) / len(kept) if kept else 0.0}
    return train, evaluation, metrics


def evaluate_checkpoint(model: str | Path, params: ToolStarParams, qa_dir: str | Path, tasks_path: str | Path,
                        records_out: list | None = None) -> dict:
    """The metrics of a checkpoint's greedy (by default) episodes on a task file (`summarize`); the records are
    appended to `records_out` when given."""
    tasks = read_tasks(tasks_path)[:params.eval.max_tasks]
    retriever, sandbox = load_environment(params, qa_dir)
    policy, tokenizer = load_checkpoint_policy(model, params.eval.decoding, params.eval.limits.max_context_tokens)
    records = run_toolstar(tasks, retriever, sandbox, policy, params, params.eval.limits.to_limits(),
                           tokenizer=tokenizer)
    if records_out is not None:
        records_out.extend(records)
    return summarize(records)
