"""The shared smoke project (conftest.py: `smoke_project`, `star preset use smoke && dvc repro` once per session):
a second `dvc repro` skips every stage, and every runnable documented example runs on it
(`scripts/check_examples.py --run`)."""
from __future__ import annotations

import subprocess
import sys

import pytest

# the shared smoke `dvc repro` may start here (~6 minutes), the examples take ~2.5 more: over the suite's 600 s
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(60 * 60)]


def run(project, *command: str, timeout: float, **env: str) -> str:
    root, environment = project
    result = subprocess.run(list(command), cwd=root, env={**environment, **env}, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def test_a_second_repro_skips_every_stage_and_the_report_is_written(smoke_project):
    root, _ = smoke_project
    assert "Running stage" not in run(smoke_project, "dvc", "repro", timeout=600)
    assert "final_pass" in run(smoke_project, "dvc", "metrics", "show", timeout=120)
    assert (root / "reports" / "report.md").stat().st_size > 0


def test_the_runnable_examples_run_on_the_smoke_project(smoke_project):
    """`scripts/check_examples.py --run` (~2.5 minutes on 2 cores, 1.5 of them the `dvc exp run` ablation); its
    stages log to an experiment of their own, so the MLflow-UI checks read the smoke pipeline's runs alone."""
    output = run(smoke_project, sys.executable, "scripts/check_examples.py", "--run", timeout=2400,
                 STAR_EXPERIMENT="documented-examples")
    assert "FAILED" not in output
    assert "ok" in output and "dvc exp run -S params/rl.yaml:rl.reward.kind=macro" in output
    assert "Running stage" not in run(smoke_project, "dvc", "repro", timeout=600)  # the workspace is put back
