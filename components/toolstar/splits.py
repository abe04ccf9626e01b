"""The toolstar_tasks stage's task sets: `build_tasks` draws the SFT and validation tasks in ONE call of
`generate_tasks` over the QA stage's encyclopedia, so no question is in both; `split_tasks` then takes the validation
tasks out (the first of each kind in the drawn order) and leaves the rest to SFT. Ids stay those of the draw, unique
across the two files. The draw depends on the total counts: changing `val` changes the SFT tasks too.

    metrics = build_tasks(params, "data/qa", "data/toolstar")     # sft.jsonl, val.jsonl and their summary
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from components.retrieval import load_corpus
from components.toolstar.params import TaskSplits, ToolStarParams
from components.toolstar.tasks import Task, TaskError, generate_tasks, write_tasks


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
