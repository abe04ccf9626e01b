"""Running one DVC stage in a subprocess: DVC's verdict, and failures that carry the log tail."""
from __future__ import annotations

import pytest

from .sample_project import make_sample_project
from components.orchestration.stages import StageFailed, classify, repro_command, run_stage


def test_classify_reads_dvc_verdicts():
    assert classify("sft", "Stage 'sft' didn't change, skipping") == "unchanged"
    assert classify("sft", "Stage 'sft' is cached - skipping run, checking out outputs") == "restored"
    assert classify("sft", "Running stage 'sft':\n> star sft --params params/sft.yaml") == "ran"


def test_repro_command_runs_exactly_one_stage_and_waits_for_the_lock():
    command = repro_command("validate@sft")
    assert command[1:] == ["--wait-for-lock", "repro", "--single-item", "validate@sft"]
    assert repro_command("rl", force=True)[-1] == "--force"


def test_user_errors_are_not_transient():
    assert not StageFailed("sft", 2, "star sft: error: params/sft.yaml: invalid params").transient
    assert StageFailed("sft", -9, "Killed").transient


@pytest.mark.slow
def test_a_stage_with_a_bad_param_fails_with_the_file_and_key_in_the_message(tmp_path):
    root = make_sample_project(tmp_path / "p")
    (root / "params" / "prepare.yaml").write_text("prepare:\n  n: five\n")
    with pytest.raises(StageFailed) as failure:
        run_stage("prepare", root, {})
    assert "params/prepare.yaml: prepare.n must be an integer" in str(failure.value)
    assert not failure.value.transient


def test_a_stage_log_never_shows_a_url_password_it_printed(tmp_path):
    root = make_sample_project(tmp_path / "p")
    (root / "params" / "prepare.yaml").write_text("prepare:\n  n: http://bob:s3cret@llm.example.com/v1\n")
    lines = []
    with pytest.raises(StageFailed) as failure:
        run_stage("prepare", root, {}, on_line=lines.append)
    assert "got 'http://***@llm.example.com/v1'" in str(failure.value)
    assert "s3cret" not in str(failure.value) + "\n".join(lines)


@pytest.mark.slow
def test_run_stage_reports_ran_then_unchanged(tmp_path):
    root = make_sample_project(tmp_path / "p")
    lines = []
    first = run_stage("prepare", root, {}, on_line=lines.append)
    second = run_stage("prepare", root, {})
    assert (first.status, second.status) == ("ran", "unchanged")
    assert any("Running stage 'prepare'" in line for line in lines)
    assert (root / "data" / "raw.json").read_text().count(",") == 4
