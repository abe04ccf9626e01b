"""Out-of-domain QA: datasets, per-dataset and averaged scores, the alignment tax."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.errors import UserError
from components.evaluation import ood_qa
from components.evaluation.ood_qa import (
    DatasetParams, OODQAParams, alignment_tax, evaluate_checkpoint, load_datasets, summarize_datasets,
)


def test_alignment_tax_is_base_minus_trained_in_absolute_and_relative_terms():
    tax = alignment_tax(base={"em": 0.40, "f1": 0.50}, trained={"em": 0.30, "f1": 0.45})

    assert tax["alignment_tax_abs"] == pytest.approx(0.10)
    assert tax["alignment_tax_rel"] == pytest.approx(0.25)
    assert tax["alignment_tax_f1_abs"] == pytest.approx(0.05)
    assert alignment_tax({"em": 0.0, "f1": 0.0}, {"em": 0.1, "f1": 0.1})["alignment_tax_rel"] is None
    assert alignment_tax({"em": 0.2, "f1": 0.3}, {"em": 0.3, "f1": 0.3})["alignment_tax_abs"] == pytest.approx(-0.1)


def test_the_average_weighs_every_dataset_the_same():
    summary = summarize_datasets({"nq": {"n": 1000, "em": 0.5, "f1": 0.6},
                                  "bamboogle": {"n": 125, "em": 0.1, "f1": 0.2}})
    assert summary["em"] == pytest.approx(0.3) and summary["f1"] == pytest.approx(0.4)
    assert summary["n"] == 1125


def test_local_jsonl_and_hugging_face_datasets_load_into_one_shape(tmp_path: Path, monkeypatch):
    path = tmp_path / "my_qa.jsonl"
    path.write_text(json.dumps({"question": "Who?", "golden_answers": ["Ann", "Anne"]}) + "\n"
                    + json.dumps({"id": "q2", "question": "When?", "golden_answers": "1999"}) + "\n")

    def fake_load_dataset(repo, name, split):  # stands in for the Hub: tests never download
        from datasets import Dataset

        assert (repo, name, split) == ("RUC-NLPIR/FlashRAG_datasets", "bamboogle", "test")
        return Dataset.from_list([{"id": "test_0", "question": "Who founded X?", "golden_answers": ["Y"]}] * 3)

    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    params = OODQAParams(datasets=[DatasetParams(name="mine", source="jsonl", path=str(path)),
                                   DatasetParams(name="bamboogle", source="hf", limit=2)])

    datasets = load_datasets(params, tmp_path)

    assert datasets["mine"][1] == {"id": "q2", "dataset": "mine", "question": "When?", "golden_answers": ["1999"]}
    assert datasets["mine"][0]["id"] == "mine-0"
    assert [e["golden_answers"] for e in datasets["bamboogle"]] == [["Y"], ["Y"]]


def test_a_missing_dataset_file_says_how_to_build_it(tmp_path: Path):
    with pytest.raises(UserError, match="star qa build"):
        load_datasets(OODQAParams(), tmp_path)


def test_a_checkpoint_is_scored_per_dataset_with_its_tax_against_base(tiny_checkpoint, tmp_path: Path):
    params = OODQAParams(corpus={"num_people": 30, "num_towns": 8, "num_organisations": 5},
                         questions_per_dataset=3,
                         limits={"max_turns": 2, "max_tokens_per_turn": 12}, decoding={"temperature": 0.0})
    ood_qa.build_qa_data(params, tmp_path / "qa")
    records: list[dict] = []

    metrics = evaluate_checkpoint(tiny_checkpoint, params, tmp_path / "qa", base_metrics={"em": 0.5, "f1": 0.5},
                                  records_out=records)

    assert set(metrics["per_dataset"]) == {"single_hop", "multi_hop"} and metrics["n"] == 6
    assert metrics["em"] == 0.0  # an untrained model answers nothing right
    assert metrics["alignment_tax_abs"] == pytest.approx(0.5) and metrics["alignment_tax_rel"] == pytest.approx(1.0)
    assert len(records) == 6 and all("response_ids" in r for r in records)


def test_a_base_file_that_is_not_ood_metrics_is_refused_with_how_to_fix(tmp_path: Path):
    read_base_metrics = ood_qa.read_base_metrics
    assert read_base_metrics(tmp_path / "absent.json") is None
    (tmp_path / "base.json").write_text(json.dumps({"em": 0.3, "f1": 0.4}))
    assert read_base_metrics(tmp_path / "base.json")["em"] == 0.3
    (tmp_path / "base.json").write_text(json.dumps({"kind": "tiny", "parameters": 2116608}))  # base_model's metrics
    with pytest.raises(UserError, match="not an OOD QA metrics file"):
        read_base_metrics(tmp_path / "base.json")
    (tmp_path / "base.json").write_text("{truncated")
    with pytest.raises(UserError, match="is not JSON"):
        read_base_metrics(tmp_path / "base.json")
