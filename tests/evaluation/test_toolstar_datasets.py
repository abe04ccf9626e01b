"""Tool-Star's evaluation datasets as tasks (`star toolstar tasks --dataset`), read from small local copies with the
Hub's column names through the loader the Hub path uses, and scored by kind: math_verify for math, F1 for QA.
Nothing here downloads: the Hub path is only exercised offline, for its error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.cli import main
from components.errors import UserError
from components.toolstar.datasets import (
    DATASETS,
    dataset_spec,
    dataset_tasks,
    gsm8k_answers,
    task_file_name,
)
from components.toolstar.tasks import Task, read_tasks
from components.agent.types import TurnPolicy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def offline_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No network and a throw-away datasets cache (what `load_dataset` builds from local files goes there)."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# Rows with each dataset's real columns (openai/gsm8k, HuggingFaceH4/MATH-500, hotpotqa/hotpot_qa, FlashRAG).
GSM8K_ROWS = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How "
                 "many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
               "altogether in April and May.\n#### 72"},
    {"question": "A shop sells 1,000 pens a day. How many in 2 days?", "answer": "1000*2=2000\n#### 2,000"},
]
MATH500_ROWS = [
    {"problem": "Compute $\\dbinom{4}{2}/12$.", "solution": "... $\\boxed{\\frac{1}{2}}$.", "answer": "\\frac{1}{2}",
     "subject": "Counting & Probability", "level": 2, "unique_id": "test/counting_and_probability/1.json"},
]
HOTPOT_ROWS = [
    {"id": "5a8b57f25542995d1e6f1371", "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
     "answer": "yes", "type": "comparison", "level": "hard",
     "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood"], "sent_id": [0, 0]},
     "context": {"title": ["Ed Wood"], "sentences": [["Edward Davis Wood Jr. was an American filmmaker."]]}},
]
FLASHRAG_ROWS = [
    {"id": "dev_0", "question": "Who was born first, Ann or Bob?", "golden_answers": ["Ann", "Ann Smith"],
     "metadata": {"type": "comparison"}},
    {"id": "dev_1", "question": "", "golden_answers": ["x"], "metadata": {}},  # no question: skipped
    {"id": "dev_2", "question": "Where is the seat of Velmora Press?", "golden_answers": [], "metadata": {}},
    {"id": "dev_3", "question": "When was Dunmere founded?", "golden_answers": ["1402"], "metadata": {}},
]


def save_to_disk(path: Path, rows: list[dict], split: str | None = None) -> Path:
    """A `save_to_disk` folder: a Dataset, or (split given) a DatasetDict holding it and a train split."""
    import datasets

    data = datasets.Dataset.from_list(rows)
    if split is None:
        data.save_to_disk(str(path))
    else:
        datasets.DatasetDict({"train": data, split: data}).save_to_disk(str(path))
    return path


def hub_clone(path: Path, config: str, file_name: str, rows: list[dict]) -> Path:
    """The layout of a clone of the dataset's Hub repository: <config>/<split file>."""
    target = path / config / file_name
    target.parent.mkdir(parents=True, exist_ok=True)
    if file_name.endswith(".parquet"):
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(target))
    else:
        write_jsonl(target, rows)
    return path


# --- the table --------------------------------------------------------------------------------------------------

def test_the_table_names_each_datasets_hub_id_config_split_columns_and_kind():
    table = {name: (s.repo, s.config, s.split, s.question, s.answer, s.kind) for name, s in DATASETS.items()}
    assert table == {
        "gsm8k": ("openai/gsm8k", "main", "test", "question", "answer", "math"),
        "math500": ("HuggingFaceH4/MATH-500", None, "test", "problem", "answer", "math"),
        "hotpotqa": ("hotpotqa/hotpot_qa", "distractor", "validation", "question", "answer", "qa"),
        "2wikimultihopqa": ("RUC-NLPIR/FlashRAG_datasets", "2wikimultihopqa", "dev", "question", "golden_answers",
                            "qa"),
        "musique": ("RUC-NLPIR/FlashRAG_datasets", "musique", "dev", "question", "golden_answers", "qa"),
        "bamboogle": ("RUC-NLPIR/FlashRAG_datasets", "bamboogle", "test", "question", "golden_answers", "qa"),
    }
    assert dataset_spec("MATH-500").name == "math500" and dataset_spec("2wiki").name == "2wikimultihopqa"
    with pytest.raises(UserError, match="unknown dataset 'squad': one of gsm8k, math500"):
        dataset_spec("squad")


@pytest.mark.parametrize("solution, answers", [
    ("48+24 = <<48+24=72>>72\n#### 72", ["72"]),
    ("#### 2,000", ["2000"]),
    ("#### -3.5", ["-3.5"]),
    ("#### 1,234,567", ["1234567"]),
    ("no final line", []),
])
def test_the_gsm8k_answer_is_the_number_after_the_hashes(solution, answers):
    assert gsm8k_answers(solution) == answers


# --- local copies through the loader ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, make, first, n, skipped", [
    ("gsm8k", lambda d: save_to_disk(d / "gsm8k", GSM8K_ROWS),
     ("gsm8k-00000", "math", ["72"]), 2, 0),
    ("math500", lambda d: write_jsonl(d / "MATH-500" / "test.jsonl", MATH500_ROWS),
     ("math500-00000", "math", ["\\frac{1}{2}"]), 1, 0),
    ("hotpotqa", lambda d: hub_clone(d / "hotpot_qa", "distractor", "validation-00000-of-00001.parquet",
                                     HOTPOT_ROWS),
     ("hotpotqa-00000", "qa", ["yes"]), 1, 0),
    ("2wikimultihopqa", lambda d: hub_clone(d / "FlashRAG_datasets", "2wikimultihopqa", "dev.jsonl", FLASHRAG_ROWS),
     ("2wikimultihopqa-00000", "qa", ["Ann", "Ann Smith"]), 2, 2),
    ("musique", lambda d: save_to_disk(d / "musique", FLASHRAG_ROWS, split="dev"),
     ("musique-00000", "qa", ["Ann", "Ann Smith"]), 2, 2),
    ("bamboogle", lambda d: hub_clone(d / "FlashRAG_datasets", "bamboogle", "test.jsonl", FLASHRAG_ROWS[:1]),
     ("bamboogle-00000", "qa", ["Ann", "Ann Smith"]), 1, 0),
])
def test_each_dataset_is_read_from_a_local_copy_into_tasks(tmp_path, name, make, first, n, skipped):
    path = make(tmp_path)
    tasks, summary = dataset_tasks(name, path=path)

    assert (tasks[0].id, tasks[0].kind, list(tasks[0].answers)) == first
    assert tasks[0].answer == first[2][0] and tasks[0].dataset == name and tasks[0].template == ""
    assert tasks[0].question and all(t.golden == list(t.answers) for t in tasks)
    assert (summary["n"], summary["skipped"], summary["rows"]) == (n, skipped, n + skipped)
    assert summary["source"] == str(path) and summary["split"] == DATASETS[name].split


def test_ids_keep_the_row_index_and_limit_takes_the_first_rows(tmp_path):
    path = write_jsonl(tmp_path / "dev.jsonl", FLASHRAG_ROWS)
    tasks, _ = dataset_tasks("musique", path=path)
    assert [t.id for t in tasks] == ["musique-00000", "musique-00003"]  # rows 1 and 2 lack a question / an answer
    assert tasks[1].golden == ["1402"]
    limited, summary = dataset_tasks("musique", path=path, limit=1)
    assert [t.id for t in limited] == ["musique-00000"] and summary["rows"] == 1


def test_a_copy_without_the_hubs_columns_says_which_it_has(tmp_path):
    path = write_jsonl(tmp_path / "test.jsonl", [{"query": "Who?", "answers": ["Ann"]}])
    with pytest.raises(UserError, match=r"bamboogle from .*test.jsonl has no column\(s\) question, golden_answers "
                                        r"\(its columns: query, answers\)"):
        dataset_tasks("bamboogle", path=path)


def test_a_split_the_copy_lacks_is_named_with_the_ones_it_has(tmp_path):
    path = save_to_disk(tmp_path / "musique", FLASHRAG_ROWS, split="dev")
    with pytest.raises(UserError, match="has no split 'test' \\(it has train, dev\\): pass --split"):
        dataset_tasks("musique", split="test", path=path)
    tasks, summary = dataset_tasks("musique", split="train", path=path)
    assert summary["split"] == "train" and len(tasks) == 2


def test_a_missing_path_and_an_unknown_file_type_are_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        dataset_tasks("gsm8k", path=tmp_path / "nowhere")
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(UserError, match="a file must be one of .json, .jsonl, .parquet, .csv"):
        dataset_tasks("gsm8k", path=tmp_path / "data.txt")


def test_the_hub_is_asked_for_the_tables_repository_config_and_split(monkeypatch):
    """The Hub call itself, with `load_dataset` answering from memory (the real one would download)."""
    import datasets

    asked = []

    def load_dataset(repo, config=None, split=None):
        asked.append((repo, config, split))
        return datasets.Dataset.from_list(FLASHRAG_ROWS if repo.startswith("RUC") else GSM8K_ROWS)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    tasks, summary = dataset_tasks("2wiki", limit=1)
    assert asked == [("RUC-NLPIR/FlashRAG_datasets", "2wikimultihopqa", "dev")]
    assert [t.id for t in tasks] == ["2wikimultihopqa-00000"] and summary["source"] == "hub"
    dataset_tasks("gsm8k", split="train")
    assert asked[-1] == ("openai/gsm8k", "main", "train")


# --- the command ------------------------------------------------------------------------------------------------

def test_the_command_writes_the_datasets_tasks_where_eval_reads_them(tmp_path, capsys):
    path = save_to_disk(tmp_path / "gsm8k", GSM8K_ROWS)
    out = tmp_path / "data" / "toolstar" / "datasets"
    assert main(["toolstar", "tasks", "--dataset", "gsm8k", "--dataset-path", str(path), "--out", str(out),
                 "--metrics", str(tmp_path / "gsm8k.json")]) == 0

    tasks = read_tasks(out / "gsm8k.jsonl")
    assert [(t.id, t.answer, t.kind, t.dataset) for t in tasks] == [("gsm8k-00000", "72", "math", "gsm8k"),
                                                                     ("gsm8k-00001", "2000", "math", "gsm8k")]
    assert json.loads((tmp_path / "gsm8k.json").read_text())["n"] == 2
    assert f"wrote {out / 'gsm8k.jsonl'}: 2 math tasks from gsm8k split test" in capsys.readouterr().out
    assert task_file_name("gsm8k", "train") == "gsm8k-train.jsonl" and task_file_name("gsm8k", "test") == "gsm8k.jsonl"


def test_dataset_options_without_a_dataset_are_refused(tmp_path, capsys):
    assert main(["toolstar", "tasks", "--limit", "5", "--out", str(tmp_path)]) == 1
    assert "--limit: only with --dataset NAME" in capsys.readouterr().err


def test_an_unreachable_hub_is_one_line_that_says_how_to_use_a_local_copy(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "components.cli", "toolstar", "tasks", "--dataset", "bamboogle",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("star toolstar: error:")]
    assert len(errors) == 1, done.stderr
    assert "dataset bamboogle could not be reached: RUC-NLPIR/FlashRAG_datasets (config bamboogle) split test" in \
        errors[0]
    assert "--dataset-path" in errors[0] and "HF_DATASETS_OFFLINE=1" in errors[0]
    assert not (tmp_path / "out").exists()


# --- scoring by kind --------------------------------------------------------------------------------------------

class Answering(TurnPolicy):
    """Answers every episode with its boxed value at once (no tool call, so no retriever or sandbox is used)."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers

    def generate(self, requests):
        from components.agent.types import TurnResult

        return [TurnResult(text=f"<think> t </think>\n<answer> \\boxed{{{self.answers[r.messages[1]['content']]}}} "
                                "</answer>") for r in requests]


def test_math_tasks_are_scored_with_math_verify_and_qa_tasks_with_f1_against_every_answer(tmp_path):
    from components.agent.loop import Limits
    from components.toolstar.params import ToolStarParams
    from components.toolstar.evaluate import run_toolstar, summarize

    tasks = [Task(id="math500-00000", question="Half?", answer="0.5", kind="math", answers=("0.5",),
                  dataset="math500"),
             Task(id="gsm8k-00000", question="Clips?", answer="72", kind="math", answers=("72",), dataset="gsm8k"),
             Task(id="bamboogle-00000", question="Who?", answer="Ann", kind="qa", answers=("Ann", "Ann Smith"),
                  dataset="bamboogle"),
             Task(id="bamboogle-00001", question="When?", answer="1402", kind="qa", answers=("1402",),
                  dataset="bamboogle")]
    policy = Answering({"Half?": "\\frac{1}{2}", "Clips?": "71", "Who?": "ann smith", "When?": "in 1402"})
    records = run_toolstar(tasks, None, None, policy, ToolStarParams(), Limits(max_turns=2), progress=False)

    scores = {r["id"]: (r["evaluation"]["correct"], round(r["evaluation"]["reward"], 4), r["evaluation"]["em"],
                        round(r["evaluation"]["f1"], 4)) for r in records}
    assert scores == {"math500-00000": (True, 1.0, 0.0, 0.0),  # math_verify: 1/2 = 0.5 (the strings differ)
                      "gsm8k-00000": (False, 0.0, 0.0, 0.0),
                      "bamboogle-00000": (True, 1.0, 1.0, 1.0),  # the second golden answer
                      "bamboogle-00001": (False, 0.6667, 0.0, 0.6667)}  # F1, not numeric, for a QA task
    assert records[2]["golden_answers"] == ["Ann", "Ann Smith"] and records[2]["dataset"] == "bamboogle"

    metrics = summarize(records)
    assert set(metrics["by_kind"]) == {"math", "qa"}
    assert {name: (m["n"], m["accuracy"]) for name, m in metrics["by_dataset"].items()} == {
        "bamboogle": (2, 0.5), "gsm8k": (1, 0.0), "math500": (1, 1.0)}
    assert "by_dataset" not in summarize([{**r, "dataset": None} for r in records])

    # the metrics file `star toolstar eval` writes from these records, in the report's Tool-Star table
    from components.evaluation.commands import write_json
    from components.evaluation.report import ReportParams, build_report

    write_json({**metrics, "checkpoint": "sft"}, tmp_path / "metrics" / "toolstar" / "sft.json")
    written = build_report(tmp_path / "metrics", tmp_path / "plots", tmp_path / "reports", ReportParams())
    rows = [line for line in written["markdown"].read_text().splitlines() if line.startswith("| sft |")]
    assert [row.split(" | ")[1] for row in rows] == ["all", "math", "qa", "bamboogle", "gsm8k", "math500"]
    assert rows[0] == "| sft | all | 4 | 50.0% | 25.0% | 41.7% | 0.667 | 0.00 | 0.00 | 0 | 0 | 0 |"
