"""The `star preset`, `star ui` (components/orchestration/commands.py) and `star run`, `star sweep`
(flows/commands.py) commands as a user calls them."""
from __future__ import annotations

import argparse
import os

import pytest
import yaml

from components.errors import UserError
from components.orchestration import commands
from flows import commands as flow_commands


def star(*argv: str) -> int:
    """Parse and run one orchestration or flow command, the way `star` does."""
    parser = argparse.ArgumentParser(prog="star")
    subparsers = parser.add_subparsers(dest="command")
    commands.register(subparsers)
    flow_commands.register(subparsers)
    args = parser.parse_args(argv)
    return args.handler(args)


def test_preset_use_writes_the_overlay_and_prints_the_changes(tmp_path, capsys):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "big.yaml").write_text("sft:\n  epochs: 6\n  learning_rate: 5.0e-6\n")
    (tmp_path / "sft.yaml").write_text("# SFT\nsft:\n  epochs: 3\n  learning_rate: 0.002\n  seed: 0\n")
    assert star("preset", "use", "big", "--params-dir", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "sft.epochs: 3 -> 6" in out and "2 value(s) changed" in out
    assert yaml.safe_load((tmp_path / "sft.yaml").read_text()) == {"sft": {"epochs": 6, "learning_rate": 5e-6,
                                                                           "seed": 0}}
    assert star("preset", "list", "--params-dir", str(tmp_path)) == 0
    assert capsys.readouterr().out.strip() == "* big"


def test_preset_list_marks_the_active_preset_and_says_what_each_is(tmp_path, capsys):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "small.yaml").write_text("# small: a quick check. Not a training run.\nsft:\n  epochs: 1\n")
    (tmp_path / "presets" / "large.yaml").write_text("# large: the paper's recipe on\n# eight GPUs\nsft:\n  epochs: 6\n")
    assert star("preset", "use", "small", "--params-dir", str(tmp_path)) == 0
    capsys.readouterr()
    assert star("preset", "list", "--params-dir", str(tmp_path)) == 0
    assert capsys.readouterr().out.splitlines() == ["  large  the paper's recipe on eight GPUs",
                                                    "* small  a quick check"]


def test_sweep_variants_parse_into_dvc_overrides():
    assert flow_commands.parse_variants(["macro=params/rl.yaml:rl.reward.kind=macro",
                                    "big=params/rl.yaml:rl.epochs=5,params/sft.yaml:sft.epochs=6"]) == {
        "macro": ["params/rl.yaml:rl.reward.kind=macro"],
        "big": ["params/rl.yaml:rl.epochs=5", "params/sft.yaml:sft.epochs=6"]}
    with pytest.raises(UserError, match="expected NAME=FILE:KEY=VALUE"):
        flow_commands.parse_variants(["macro"])


def test_ui_prints_both_servers_on_localhost(tmp_path, monkeypatch, capsys):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT"):
        monkeypatch.delenv(name, raising=False)
    assert star("ui") == 0
    out = capsys.readouterr().out
    assert f"ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db --host 127.0.0.1 --port 5000" in out
    assert "server start --host 127.0.0.1 --port 4200" in out
    assert "PREFECT_API_URL=http://127.0.0.1:4200/api" in out
    # no store yet: the experiments list, in the model-training view (MLflow 3.17 opens GenAI's at first)
    assert "in the model-training view: http://127.0.0.1:5000/#/experiments?workflowType=machine_learning" in out
    assert not (tmp_path / "mlflow.db").exists()  # printing the link creates no store


def test_ui_links_an_existing_experiment_in_the_model_training_view(tmp_path, monkeypatch, capsys):
    from components import tracking

    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "STAR_PRESET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STAR_EXPERIMENT", "star-linked")
    experiment_id = tracking.ensure_experiment("star-linked")
    assert star("ui") == 0
    assert (f"experiment 'star-linked' in the model-training view: "
            f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            in capsys.readouterr().out)


def test_run_outside_a_project_says_where_to_run_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    with pytest.raises(UserError, match="no dvc.yaml"):
        star("run", "--stages", "world")


def test_star_run_gives_prefects_temporary_server_time_to_start_unless_told_otherwise(monkeypatch):
    key = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv(key, raising=False)
    flow_commands._patient_ephemeral_server()
    assert int(os.environ[key]) >= 120  # Prefect's 20 s default timed out on a loaded 2-core laptop

    monkeypatch.setenv(key, "45")  # the user's own setting wins
    flow_commands._patient_ephemeral_server()
    assert os.environ[key] == "45"

    monkeypatch.delenv(key)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")  # a real server: nothing to start
    flow_commands._patient_ephemeral_server()
    assert key not in os.environ
