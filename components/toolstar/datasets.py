"""Tool-Star's evaluation datasets as Tool-Star tasks: GSM8K, MATH-500, HotpotQA, 2WikiMultihopQA, MuSiQue, Bamboogle.

    star toolstar tasks --dataset gsm8k [--split test] [--limit 200] [--dataset-path DIR] [--out data/toolstar/datasets]
    tasks, summary = dataset_tasks("gsm8k", limit=200)          # the same, as a function

`DATASETS` is the one table of where each dataset lives on the Hugging Face Hub (repository, config, split) and
which columns hold the question and the answer(s); `tasks_from_rows` maps the rows into the task record of
`components/toolstar/tasks.py` (`question`, `answer`, `answers`, `kind` "math" | "qa", `dataset`), so `star
toolstar eval --tasks <file>` and `star rl` read a dataset's tasks like the generated ones. A math task is scored
with math_verify, a QA task with Tool-Star's token F1 (`components/toolstar/reward.py`, `task_metric`).

Where the rows come from (`load_rows`):

- the Hub (`datasets.load_dataset(repo, config, split=split)`), or the datasets cache when `HF_DATASETS_OFFLINE=1`;
  when neither answers, a `UserError` (one line, exit 1) says the dataset could not be reached and how to point at
  a local copy;
- `--dataset-path PATH`, a local copy: a folder written by `save_to_disk` (a Dataset, or a DatasetDict holding the
  split), a clone of the dataset's Hub repository (its `<config>/` sub-folder is used when there is one; splits
  are read from the file names), or one `.json` / `.jsonl` / `.parquet` / `.csv` file (the split itself). The
  columns must be the Hub's (the table below).

Ids are `<name>-<row>` with the row's index in the split (stable when `--limit` changes); rows without a question
or an answer are skipped and counted.

Column names and splits are taken from the datasets' Hub pages and from public code that loads them (FlashRAG's
release keeps `id`, `question`, `golden_answers`, `metadata` for every benchmark, dev splits named "dev"); they
were not checked against a download here (no network), which is why a missing column is an error that lists the
columns the data has.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from components.errors import UserError
from components.toolstar.tasks import Task

FLASHRAG_REPO = "RUC-NLPIR/FlashRAG_datasets"  # the release Search-R1 and Tool-Star evaluate their QA sets on


def text_answers(value: Any) -> list[str]:
    """The golden answers of a cell: a string, or a list of them (FlashRAG's `golden_answers`); stripped, empty
    ones and repeats dropped, order kept."""
    values = [value] if isinstance(value, (str, int, float)) else list(value or [])
    answers: list[str] = []
    for item in values:
        text = str(item).strip()
        if text and text not in answers:
            answers.append(text)
    return answers


_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def gsm8k_answers(value: Any) -> list[str]:
    """GSM8K's answer column is the worked solution ending in `#### <number>`: the number, without thousands
    commas (no `####`: no answer)."""
    text = str(value or "")
    if "####" not in text:
        return []
    return text_answers(_THOUSANDS_COMMA.sub("", text.rsplit("####", 1)[1].strip()))


@dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset lives on the Hub and how its rows become tasks."""

    name: str
    repo: str
    config: str | None
    split: str  # the evaluation split Tool-Star reports
    kind: Literal["math", "qa"]
    question: str  # the question's column
    answer: str  # the answer's column
    answers: Callable[[Any], list[str]] = text_answers  # the answer cell -> the golden answers

    @property
    def location(self) -> str:
        return self.repo + (f" (config {self.config})" if self.config else "")


DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in (
    # openai/gsm8k: question, answer ("... #### 72"); configs main | socratic; splits train, test
    DatasetSpec("gsm8k", "openai/gsm8k", "main", "test", "math", "question", "answer", gsm8k_answers),
    # HuggingFaceH4/MATH-500: problem, solution, answer, subject, level, unique_id; split test
    DatasetSpec("math500", "HuggingFaceH4/MATH-500", None, "test", "math", "problem", "answer"),
    # hotpotqa/hotpot_qa: id, question, answer, type, level, supporting_facts, context; configs distractor | fullwiki
    DatasetSpec("hotpotqa", "hotpotqa/hotpot_qa", "distractor", "validation", "qa", "question", "answer"),
    # FlashRAG: id, question, golden_answers, metadata; 2wikimultihopqa and musique: train, dev; bamboogle: test
    DatasetSpec("2wikimultihopqa", FLASHRAG_REPO, "2wikimultihopqa", "dev", "qa", "question", "golden_answers"),
    DatasetSpec("musique", FLASHRAG_REPO, "musique", "dev", "qa", "question", "golden_answers"),
    DatasetSpec("bamboogle", FLASHRAG_REPO, "bamboogle", "test", "qa", "question", "golden_answers"),
)}
ALIASES = {"math-500": "math500", "math_500": "math500", "2wiki": "2wikimultihopqa", "2wikimqa": "2wikimultihopqa",
           "hotpot_qa": "hotpotqa"}
# a split as the Hub names it and as `datasets` infers it from a local file name (dev.jsonl -> "validation")
SPLIT_ALIASES = {"dev": ("validation", "valid", "val"), "validation": ("dev", "valid", "val")}
LOCAL_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def dataset_spec(name: str) -> DatasetSpec:
    """The table entry of a dataset name (case-insensitive; math-500 and 2wiki are accepted too)."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in DATASETS:
        raise UserError(f"unknown dataset {name!r}: one of {', '.join(DATASETS)}")
    return DATASETS[key]


# --- rows -> tasks ----------------------------------------------------------------------------------------------

def check_columns(spec: DatasetSpec, columns: Sequence[str], source: str) -> None:
    """A clear error when the data lacks the columns the table names for this dataset."""
    missing = [column for column in (spec.question, spec.answer) if column not in columns]
    if missing:
        raise UserError(f"{spec.name} from {source} has no column(s) {', '.join(missing)} (its columns: "
                        f"{', '.join(columns) or 'none'}); a local copy needs the Hub's columns {spec.question!r} "
                        f"and {spec.answer!r}")


def tasks_from_rows(spec: DatasetSpec, rows: Iterable[dict]) -> tuple[list[Task], int]:
    """(tasks, skipped): one task per row with a question and at least one answer, id `<name>-<row index>`."""
    tasks, skipped = [], 0
    for index, row in enumerate(rows):
        question = str(row.get(spec.question) or "").strip()
        answers = spec.answers(row.get(spec.answer))
        if not question or not answers:
            skipped += 1
            continue
        tasks.append(Task(id=f"{spec.name}-{index:05d}", question=question, answer=answers[0], kind=spec.kind,
                          answers=tuple(answers), dataset=spec.name))
    return tasks, skipped


# --- loading ----------------------------------------------------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def pick_split(splits: dict, split: str, source: str):
    """The split `split` of a DatasetDict (or its file-name alias: dev = validation)."""
    for name in (split, *SPLIT_ALIASES.get(split, ())):
        if name in splits:
            return splits[name]
    raise UserError(f"{source} has no split {split!r} (it has {', '.join(splits) or 'none'}): pass --split")


def load_local(spec: DatasetSpec, split: str, path: str | Path):
    """The split's rows from a local copy (the module docstring lists the forms)."""
    import datasets

    path = Path(path)
    if not path.exists():
        raise UserError(f"--dataset-path {path} does not exist")
    try:
        if path.is_file():
            builder = LOCAL_FILE_BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise UserError(f"--dataset-path {path}: a file must be one of "
                                f"{', '.join(LOCAL_FILE_BUILDERS)} (or pass a folder)")
            return datasets.load_dataset(builder, data_files=str(path), split="train")
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():  # save_to_disk
            data = datasets.load_from_disk(str(path))
        else:  # a clone of the Hub repository, or a folder of data files named by split
            folder = path / spec.config if spec.config and (path / spec.config).is_dir() else path
            data = datasets.load_dataset(str(folder))
    except (OSError, ValueError) as exc:
        raise UserError(f"could not read {spec.name} from {path}: {_one_line(exc)}") from exc
    return pick_split(data, split, str(path)) if isinstance(data, datasets.DatasetDict) else data


def load_hub(spec: DatasetSpec, split: str):
    """The split's rows from the Hub (or from the datasets cache with HF_DATASETS_OFFLINE=1)."""
    import datasets

    try:
        return datasets.load_dataset(spec.repo, spec.config, split=split)
    except (ValueError, RuntimeError) as exc:  # reached, but not as asked (an unknown split or config, a script)
        raise UserError(f"could not load {spec.name}: {spec.location} split {split}: {_one_line(exc)}") from exc
    except OSError as exc:  # ConnectionError, offline mode without a cached copy, a repository not found
        raise UserError(
            f"dataset {spec.name} could not be reached: {spec.location} split {split} on the Hugging Face Hub "
            f"({_one_line(exc)}); point at a local copy with --dataset-path PATH (a save_to_disk folder, a clone "
            f"of the dataset repository, or a .jsonl/.parquet file with the columns {spec.question!r} and "
            f"{spec.answer!r}), or set HF_DATASETS_OFFLINE=1 to read a copy in the datasets cache") from exc


def load_rows(spec: DatasetSpec, split: str | None = None, path: str | Path | None = None,
              limit: int | None = None):
    """The first `limit` rows (all: None) of the dataset's split (the table's: None), from `path` or the Hub, as a
    `datasets.Dataset` with the question and answer columns checked."""
    split = split or spec.split
    data = load_hub(spec, split) if path is None else load_local(spec, split, path)
    check_columns(spec, data.column_names, str(path) if path is not None else spec.location)
    if limit is not None:
        data = data.select(range(min(limit, len(data))))
    return data


def dataset_tasks(name: str, split: str | None = None, limit: int | None = None,
                  path: str | Path | None = None) -> tuple[list[Task], dict]:
    """The tasks of a dataset (`DATASETS`) and a summary: `dataset`, `repo`, `config`, `split`, `source` ("hub" or
    the local path), `kind`, `rows` read, `n` tasks, `skipped` rows."""
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1 (got {limit})")
    spec = dataset_spec(name)
    rows = load_rows(spec, split, path, limit)
    tasks, skipped = tasks_from_rows(spec, rows)
    if not tasks:
        raise UserError(f"{spec.name}: none of the {len(rows)} rows has a question and an answer")
    return tasks, {"dataset": spec.name, "repo": spec.repo, "config": spec.config, "split": split or spec.split,
                   "source": "hub" if path is None else str(path), "kind": spec.kind, "rows": len(rows),
                   "n": len(tasks), "skipped": skipped}


def task_file_name(name: str, split: str | None = None) -> str:
    """`<name>.jsonl` for the table's split, `<name>-<split>.jsonl` for another."""
    spec = dataset_spec(name)
    return f"{spec.name}.jsonl" if split in (None, spec.split) else f"{spec.name}-{split}.jsonl"
