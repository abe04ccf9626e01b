"""QA datasets: local JSONL files (`question`, `golden_answers`) or Hugging Face datasets when online.

The Hugging Face path follows FlashRAG's release (`RUC-NLPIR/FlashRAG_datasets`, one config per benchmark: nq,
triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle), which is what Search-R1 evaluates on.
"""
from __future__ import annotations

import json
from pathlib import Path

import datasets as hf_datasets

from components.errors import UserError

FLASHRAG_REPO = "RUC-NLPIR/FlashRAG_datasets"


def normalise_example(example: dict, dataset: str, index: int) -> dict:
    """One QA example as {"id", "dataset", "question", "golden_answers": [str, ...]} (extra fields kept)."""
    question = example.get("question")
    golden = example.get("golden_answers", example.get("answers", example.get("answer")))
    if not isinstance(question, str) or golden is None:
        raise UserError(f"{dataset} example {index} needs 'question' and 'golden_answers' fields, "
                        f"found keys {sorted(example)}")
    golden_answers = [golden] if isinstance(golden, str) else [str(g) for g in golden]
    return {**example, "id": str(example.get("id", f"{dataset}-{index}")), "dataset": dataset,
            "question": question, "golden_answers": golden_answers}


def load_jsonl_dataset(path: str | Path, dataset: str | None = None, limit: int | None = None) -> list[dict]:
    """Read a local JSONL QA set; `dataset` defaults to the file's stem."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"QA dataset {path} does not exist (build the offline sets with `star qa build`)")
    name = dataset or path.stem
    examples = []
    with path.open() as f:
        for line in f:
            if line.strip():
                examples.append(normalise_example(json.loads(line), name, len(examples)))
            if limit is not None and len(examples) >= limit:
                break
    return examples


def load_hf_dataset(name: str, split: str = "test", repo: str = FLASHRAG_REPO,
                    limit: int | None = None, path: str | Path | None = None) -> list[dict]:
    """Load one benchmark of FlashRAG's release from the Hugging Face Hub (needs network or a warm HF cache), or,
    with `path`, from a local clone of that repository (`<path>/<name>/<split>.jsonl`) read by `datasets` the same
    way."""
    try:
        if path is not None:
            folder = Path(path) / name if (Path(path) / name).is_dir() else Path(path)
            if not folder.is_dir():
                raise UserError(f"{name}: {path} is not a folder holding {name}/<split>.jsonl (a clone of {repo})")
            data = hf_datasets.load_dataset(str(folder), split=split)
        else:
            data = hf_datasets.load_dataset(repo, name, split=split)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - any hub/cache/file failure is the same problem for the user
        where = path if path is not None else f"{repo}:{name}"
        raise UserError(f"could not load {where} split {split} ({exc}); without network, use a local clone of "
                        f"{repo} (`path:`) or local JSONL datasets in params/ood_qa.yaml") from exc
    rows = data if limit is None else data.select(range(min(limit, len(data))))
    return [normalise_example(dict(row), name, i) for i, row in enumerate(rows)]


def dump_jsonl(records: list[dict], path: str | Path) -> Path:
    """Write records as JSONL (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path
