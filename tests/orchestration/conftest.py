"""Fixtures for the orchestration tests: a pre-migrated MLflow store and a Prefect test harness."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def migrated_mlflow_db(tmp_path_factory) -> Path:
    """An empty, fully migrated MLflow sqlite store (copying it saves the migrations in every test)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def mlflow_db(migrated_mlflow_db, tmp_path) -> Path:
    """A fresh copy of the migrated store for one test."""
    path = tmp_path / "mlflow.db"
    shutil.copy(migrated_mlflow_db, path)
    return path


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """A real Prefect API server on a temporary database for the whole session (PREFECT_HOME per run)."""
    home = tmp_path_factory.mktemp("prefect_home")
    saved = {k: os.environ.get(k) for k in ("PREFECT_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_API_URL")}
    os.environ.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    os.environ.pop("PREFECT_API_URL", None)
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
