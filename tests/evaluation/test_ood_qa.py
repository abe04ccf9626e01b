"""Out-of-domain QA: datasets, per-dataset and averaged scores, the modes, the paired alignment tax."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from components.errors import UserError
from components.evaluation.ood_qa import evaluate_checkpoint, summarize, summarize_datasets
from components.evaluation.question_results import alignment_tax, questions_path, read_question_results
from components.qa.ood import DatasetParams, OODQAParams, build_qa_data, load_datasets
from components.params import ParamsError, parse_section


def test_the_tax_is_base_minus_trained_paired_by_question_with_its_interval(make_question_results):
    base = make_question_results("nq", right=40) + make_question_results("hotpotqa", right=20)
    trained = make_question_results("nq", right=30) + make_question_results("hotpotqa", right=20)  # lost nq-30..nq-39

    tax = alignment_tax(base, trained)

    assert tax["alignment_tax_abs"] == pytest.approx((0.10 + 0.0) / 2)  # every dataset weighs the same
    assert tax["alignment_tax_rel"] == pytest.approx(0.05 / 0.30) and tax["alignment_tax_n"] == 200
    nq = tax["per_dataset"]["nq"]
    assert nq["alignment_tax_abs"] == pytest.approx(0.10) and nq["base_em"] == pytest.approx(0.40)
    # ten of 100 paired differences are 1, the rest 0: about 0.10 +- 1.96 * sqrt(0.1 * 0.9 / 100)
    assert nq["alignment_tax_ci95"][0] == pytest.approx(0.04, abs=0.011)
    assert nq["alignment_tax_ci95"][1] == pytest.approx(0.16, abs=0.011)
    assert tax["per_dataset"]["hotpotqa"]["alignment_tax_ci95"] == [0.0, 0.0]  # the same answers: no tax, no doubt
    assert tax["alignment_tax_ci95"][0] > 0  # nq's loss shows through the average
    assert tax["alignment_tax_f1_abs"] == pytest.approx(0.05)  # the half-right questions moved with the right ones


def test_pairing_is_by_question_id_not_by_position_or_by_totals(make_question_results):
    base = make_question_results("nq", right=50)
    reordered = random.Random(0).sample(base, len(base))
    assert alignment_tax(base, reordered)["alignment_tax_ci95"] == [0.0, 0.0]  # the same answers, shuffled
    # the same EM (50%) on the other half of the questions: no tax on average, but every question changed
    swapped = [{**r, "em": 1.0 - r["em"], "f1": 1.0 - r["f1"]} for r in base]
    tax = alignment_tax(base, swapped)
    assert tax["alignment_tax_abs"] == pytest.approx(0.0)
    low, high = tax["alignment_tax_ci95"]
    assert low < -0.15 and high > 0.15  # +-1 per question: about 0 +- 1.96 / sqrt(100)


def test_a_tax_between_different_questions_or_modes_is_refused_with_how_to_fix(make_question_results):
    base = make_question_results("nq", right=5, n=10)
    with pytest.raises(UserError, match="different questions .*same ood_qa datasets and max_questions"):
        alignment_tax(base, make_question_results("nq", right=5, n=8))
    with pytest.raises(UserError, match="same ood_qa.mode"):
        alignment_tax(base, make_question_results("nq", right=5, n=10, mode="search"))
    with pytest.raises(UserError, match="repeat question ids"):
        alignment_tax(base + base[:1], base)
    assert alignment_tax(make_question_results("nq", right=0, n=10), base)["alignment_tax_rel"] is None  # base scores 0


def test_the_metrics_of_per_question_results_carry_their_intervals(make_question_results):
    metrics = summarize(make_question_results("single_hop", right=79) + make_question_results("multi_hop", right=1))

    assert metrics["em"] == pytest.approx(0.40) and metrics["n"] == 200
    assert metrics["per_dataset"]["single_hop"]["em_ci95"] == [0.7002, 0.8583]  # Wilson, 79 of 100
    low, high = metrics["em_ci95"]  # bootstrap within each dataset: sqrt(.79 * .21 + .01 * .99) / 20 = 0.021
    assert low == pytest.approx(0.40 - 1.96 * 0.021, abs=0.01) and high == pytest.approx(0.40 + 1.96 * 0.021, abs=0.01)


def test_the_mode_is_a_checked_param():
    assert parse_section({"ood_qa": {"mode": "in_context"}}, "ood_qa", OODQAParams).mode == "in_context"
    assert OODQAParams().mode == "search"  # the paper's protocol unless a preset says otherwise
    expected = r"params/ood_qa.yaml: invalid params\n  ood_qa\.mode: Input should be 'search' or 'in_context'"
    with pytest.raises(ParamsError, match=expected):
        parse_section({"ood_qa": {"mode": "incontext"}}, "ood_qa", OODQAParams, source="params/ood_qa.yaml")
    with pytest.raises(ParamsError, match="ood_qa.in_context_examples"):
        parse_section({"ood_qa": {"in_context_examples": 4}}, "ood_qa", OODQAParams)


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


def test_a_local_clone_of_flashrags_release_is_read_through_datasets(tmp_path: Path):
    """The rows as FlashRAG publishes them (`<config>/<split>.jsonl`: id, question, golden_answers, metadata), read
    by `datasets` itself, as a user's offline copy is."""
    clone = tmp_path / "FlashRAG_datasets"
    (clone / "bamboogle").mkdir(parents=True)
    rows = [{"id": f"test_{i}", "question": f"Who founded company {i}?", "golden_answers": [f"Founder {i}", "F"],
             "metadata": {"source": "bamboogle"}} for i in range(3)]
    (clone / "bamboogle" / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (clone / "bamboogle" / "dev.jsonl").write_text(json.dumps({**rows[0], "id": "dev_0"}) + "\n")
    params = OODQAParams(datasets=[DatasetParams(name="bamboogle", source="hf", path=str(clone), limit=2)])

    examples = load_datasets(params, tmp_path)["bamboogle"]

    assert [e["id"] for e in examples] == ["test_0", "test_1"]
    assert examples[1]["golden_answers"] == ["Founder 1", "F"] and examples[0]["dataset"] == "bamboogle"
    with pytest.raises(UserError, match="is not a folder holding nq/<split>.jsonl"):
        load_datasets(OODQAParams(datasets=[DatasetParams(name="nq", source="hf", path=str(tmp_path / "no"))]),
                      tmp_path)


def test_a_missing_dataset_file_says_how_to_build_it(tmp_path: Path):
    with pytest.raises(UserError, match="star qa build"):
        load_datasets(OODQAParams(), tmp_path)


@pytest.mark.parametrize("mode", ["search", "in_context"])
def test_a_checkpoint_is_scored_per_question_with_its_tax_paired_against_base(mode, tiny_checkpoint, tmp_path: Path):
    params = OODQAParams(mode=mode, corpus={"num_people": 30, "num_towns": 8, "num_organisations": 5},
                         questions_per_dataset=3,
                         limits={"max_turns": 2, "max_tokens_per_turn": 12}, decoding={"temperature": 0.0})
    build_qa_data(params, tmp_path / "qa")
    records: list[dict] = []
    ids = [f"{d}-{i}" for d in ("single_hop", "multi_hop") for i in range(3)]
    base = [{"id": i, "dataset": i.rpartition("-")[0], "mode": mode, "em": 1.0, "f1": 1.0} for i in ids]

    metrics, questions = evaluate_checkpoint(tiny_checkpoint, params, tmp_path / "qa", base_questions=base,
                                             records_out=records)

    assert metrics["mode"] == mode and set(metrics["per_dataset"]) == {"single_hop", "multi_hop"}
    assert metrics["em"] == 0.0 and metrics["n"] == 6  # an untrained model answers nothing right
    assert sorted(q["id"] for q in questions) == sorted(ids) and {q["mode"] for q in questions} == {mode}
    assert metrics["alignment_tax_abs"] == pytest.approx(1.0) and metrics["alignment_tax_ci95"] == [1.0, 1.0]
    assert metrics["per_dataset"]["multi_hop"]["alignment_tax_abs"] == pytest.approx(1.0)
    assert len(records) == 6 and all("response_ids" in r for r in records)
    if mode == "in_context":
        assert all(r["num_turns"] == 1 for r in records)
        assert metrics["per_dataset"]["single_hop"]["answer_in_context"] == 1.0  # top-1 BM25 finds its passage


def test_per_question_results_sit_beside_the_metrics_and_are_checked_when_read(tmp_path: Path):
    assert questions_path("metrics/ood_qa/rl.json") == Path("metrics/ood_qa/rl.questions.jsonl")
    path = tmp_path / "base.questions.jsonl"
    assert read_question_results(path) is None
    path.write_text(json.dumps({"id": "nq-0", "dataset": "nq", "mode": "search", "em": 1.0, "f1": 1.0}) + "\n")
    assert read_question_results(path)[0]["id"] == "nq-0"
    path.write_text(json.dumps({"em": 0.3, "f1": 0.4}) + "\n")  # a summary, not per-question lines
    with pytest.raises(UserError, match="cannot be paired by question"):
        read_question_results(path)
    path.write_text("{truncated")
    with pytest.raises(UserError, match="is not JSONL"):
        read_question_results(path)
