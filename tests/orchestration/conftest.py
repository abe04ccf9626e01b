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


def forget_prefect_services() -> None:
    """Stop Prefect's process-wide services (log and event workers, concurrency-slot acquirers).

    Each keeps the API client it was started with: one left over from another Prefect server would acquire `gpu`
    slots on that server while the flow releases them on this one, and the next GPU stage would wait forever.
    """
    from prefect._internal.concurrency.services import _QueueServiceBase

    _QueueServiceBase.drain_all(timeout=30, at_exit=False)


@pytest.fixture(scope="package")
def prefect_api(tmp_path_factory):
    """A real Prefect API server on a temporary database for this folder's tests (PREFECT_HOME per run).

    Package-scoped (this folder is a package): stopped after the last orchestration test, so that it cannot leak
    into tests that start their own servers (tests/integration).
    """
    home = tmp_path_factory.mktemp("prefect_home")
    saved = {k: os.environ.get(k) for k in ("PREFECT_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_API_URL")}
    os.environ.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    os.environ.pop("PREFECT_API_URL", None)
    from prefect.testing.utilities import prefect_test_harness

    forget_prefect_services()
    try:
        with prefect_test_harness(server_startup_timeout=300):  # a loaded 2-core CI machine is slow to start it
            yield
            forget_prefect_services()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
