"""A fresh copy of this checkout for tests that run the pipeline end to end (`dvc repro` on the smoke preset): its
own git repository, without the environment, outputs and caches, and the environment its commands run in."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENGINE_PYTHON = REPO / ".venv-engine" / "bin" / "python"  # the checkout's rollout engine, shared with the copy


# What a copy of the project leaves out: the environment, git, every pipeline output, and caches.
NOT_COPIED = {".venv", ".venv-engine", ".git", "data", "models", "checkpoints", "metrics", "plots", "reports",
              "mlruns", "mlflow.db", "mlflow.db.lock", "mlartifacts", ".prefect", ".star", "dvc.lock", "dvc_plots",
              "build", "dist"}
NOT_COPIED_ANYWHERE = {"__pycache__", ".pytest_cache", ".hypothesis", ".grimp_cache", ".import_linter_cache"}
NOT_COPIED_BELOW = {".dvc": {"cache", "tmp"}, "benchmarks": {"_work"}}


def copy_project(target: Path) -> Path:
    """This working tree (committed or not) without its environment and outputs, as a fresh git repository."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        where = Path(folder).relative_to(REPO).as_posix()
        skipped = NOT_COPIED if where == "." else NOT_COPIED_BELOW.get(where, set())
        return {n for n in names if n in skipped or n in NOT_COPIED_ANYWHERE or n.endswith(".egg-info")}

    shutil.copytree(REPO, target, ignore=ignore)
    for args in (["init", "-q"], ["config", "user.email", "star@example.invalid"], ["config", "user.name", "star"],
                 ["add", "-A"], ["commit", "-qm", "snapshot"]):
        subprocess.run(["git", *args], cwd=target, check=True, capture_output=True)
    return target


def project_environment(root: Path) -> dict[str, str]:
    """The copy's own code first, its own MLflow store, no tracking or Prefect settings of this session; its stages
    use this checkout's rollout engine environment where there is one (`none` otherwise: transformers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "STAR_"))}
    env.update(PYTHONPATH=str(root), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", STAR_ENGINE_PYTHON=str(ENGINE_PYTHON) if ENGINE_PYTHON.exists() else "none")
    return env
