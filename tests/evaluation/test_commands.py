"""The evaluation stages as dvc.yaml runs them: `star qa build`, `star ood-qa`, `star validate`, `star report`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from components.cli import main
from components.travel.tasks import dump_queries

SMALL_OOD_QA = {"ood_qa": {
    "mode": "in_context",
    "corpus": {"num_people": 30, "num_towns": 8, "num_organisations": 5},
    "questions_per_dataset": 3,
    "limits": {"max_turns": 3, "max_tokens_per_turn": 8},
}}
SMALL_VALIDATE = {"validate": {"limits": {"max_turns": 1, "max_tokens_per_turn": 8}}}


def write_params(tmp_path: Path) -> Path:
    params = tmp_path / "params"
    params.mkdir()
    (params / "ood_qa.yaml").write_text(yaml.safe_dump(SMALL_OOD_QA))
    (params / "validate.yaml").write_text(yaml.safe_dump(SMALL_VALIDATE))
    (params / "report.yaml").write_text(yaml.safe_dump({"report": {"title": "test report"}}))
    return params


@pytest.mark.slow
def test_the_evaluation_stages_chain_from_qa_data_to_the_report(tiny_checkpoint, tiny_world, tiny_world_dir,
                                                                make_queries, tmp_path: Path, tracking_store,
                                                                capsys):
    params = write_params(tmp_path)
    queries = dump_queries(make_queries(tiny_world), tmp_path / "val.jsonl")
    metrics, qa = tmp_path / "metrics", tmp_path / "data" / "qa"

    assert main(["qa", "build", "--params", str(params / "ood_qa.yaml"), "--out", str(qa),
                 "--metrics", str(metrics / "qa_data.json")]) == 0
    for name in ("base", "sft"):
        assert main(["ood-qa", "--params", str(params / "ood_qa.yaml"), "--model", str(tiny_checkpoint),
                     "--name", name, "--qa", str(qa), "--out", str(metrics / "ood_qa" / f"{name}.json")]) == 0
        assert main(["validate", "--params", str(params / "validate.yaml"), "--model", str(tiny_checkpoint),
                     "--name", name, "--world", str(tiny_world_dir), "--queries", str(queries),
                     "--out", str(tmp_path / "data" / "validate" / f"{name}.jsonl"),
                     "--metrics", str(metrics / "validate" / f"{name}.json"),
                     "--submission", str(tmp_path / f"{name}_submission.jsonl")]) == 0
    assert main(["report", "--params", str(params / "report.yaml"), "--metrics", str(metrics),
                 "--plots", str(tmp_path / "plots"), "--out", str(tmp_path / "reports")]) == 0

    qa_data = json.loads((metrics / "qa_data.json").read_text())
    assert qa_data["expert_em"] == {"single_hop": 1.0, "multi_hop": 1.0} and qa_data["questions"] == {
        "single_hop": 3, "multi_hop": 3}
    assert sorted(p.name for p in qa.iterdir()) == ["corpus.jsonl", "questions"]  # no training data for QA
    sft_ood = json.loads((metrics / "ood_qa" / "sft.json").read_text())
    assert sft_ood["mode"] == "in_context" and sft_ood["alignment_tax_n"] == 6
    assert sft_ood["alignment_tax_abs"] == 0.0 and sft_ood["alignment_tax_ci95"] == [0.0, 0.0]  # the same weights
    assert "alignment_tax_abs" not in json.loads((metrics / "ood_qa" / "base.json").read_text())
    base_questions = (metrics / "ood_qa" / "base.questions.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in base_questions) == [
        *[f"multi_hop-{i}" for i in range(3)], *[f"single_hop-{i}" for i in range(3)]]
    validate = json.loads((metrics / "validate" / "sft.json").read_text())
    assert validate["n"] == 2 and {"strict", "official", "termination", "tool_calls", "by_level"} <= set(validate)
    assert len((tmp_path / "sft_submission.jsonl").read_text().splitlines()) == 2
    report = (tmp_path / "reports" / "report.md").read_text()
    assert "| base | in_context | 6 |" in report and "| sft | in_context | average | 6 |" in report
    assert (tmp_path / "reports" / "alignment_tax.png").exists()
    out = capsys.readouterr().out
    assert "wrote" in out and "final_pass" in out


def test_a_missing_params_file_is_a_user_error_naming_the_file(tmp_path: Path, capsys):
    assert main(["qa", "build", "--params", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "qa")]) == 1
    assert "nope.yaml does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_rollout_writes_trajectories_and_both_modes_metrics(tiny_checkpoint, tiny_world, tiny_world_dir, make_queries,
                                                            tmp_path: Path, capsys):
    queries = dump_queries(make_queries(tiny_world), tmp_path / "q.jsonl")
    params = write_params(tmp_path)

    assert main(["rollout", "--model", str(tiny_checkpoint), "--world", str(tiny_world_dir), "--queries",
                 str(queries), "--out", str(tmp_path / "t.jsonl"), "--params", str(params / "validate.yaml"),
                 "--max-queries", "1", "--metrics", str(tmp_path / "m.json")]) == 0

    trajectory = json.loads((tmp_path / "t.jsonl").read_text())
    assert set(trajectory["evaluation"]) == {"strict", "official"} and trajectory["prompt_ids"]
    assert json.loads((tmp_path / "m.json").read_text())["n"] == 1
    assert "final_pass" in capsys.readouterr().out
