"""Deployments with a cron schedule, registered against a real `prefect server start`."""
from __future__ import annotations

import shutil
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from flows import commands

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def read_deployment(name: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_deployment_by_name(name)


def test_star_deploy_registers_the_nightly_schedule(prefect_server, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    args = Namespace(name="it-nightly", cron="0 3 * * *", timezone="UTC", work_pool="star-it", preset="tiny",
                     stages=["world", "queries"], experiment="nightly", serve=False)
    assert commands.deploy_pipeline(args) == 0
    assert "scheduled '0 3 * * *'" in capsys.readouterr().out
    deployment = read_deployment("star-pipeline/it-nightly")
    assert deployment.work_pool_name == "star-it"
    assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
    assert deployment.parameters == {"root": str(REPO), "preset": "tiny", "stages": ["world", "queries"],
                                     "experiment": "nightly"}


def test_prefect_yaml_deploys_the_pipeline_and_the_reward_sweep(prefect_server, tmp_path):
    from flows.deploy import ensure_process_pool

    shutil.copy(REPO / "prefect.yaml", tmp_path / "prefect.yaml")
    shutil.copytree(REPO / "flows", tmp_path / "flows", ignore=shutil.ignore_patterns("__pycache__"))
    ensure_process_pool("star")
    done = subprocess.run([str(Path(sys.executable).parent / "prefect"), "--no-prompt", "deploy", "--all"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    nightly = read_deployment("star-pipeline/nightly")
    sweep = read_deployment("star-sweep/reward-sweep")
    assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
    assert set(sweep.parameters["variants"]) == {"sum", "macro", "success", "curriculum"}


def test_deploy_without_a_server_says_how_to_start_one(monkeypatch):
    from components.errors import UserError

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.chdir(REPO)
    args = Namespace(name="x", cron="0 3 * * *", timezone="UTC", work_pool="p", preset=None, stages=None,
                     experiment=None, serve=False)
    with pytest.raises(UserError, match="prefect server start"):
        commands.deploy_pipeline(args)
