"""Deployments of the pipeline flow: a cron schedule on a process work pool, or served from this process.

    star deploy --cron "0 2 * * *" --preset tiny          # register; run `prefect worker start --pool star`
    star deploy --serve                                     # or: this process polls the schedule and runs it

Scheduling needs a running Prefect server (`prefect server start`; `PREFECT_API_URL` points at it). `prefect.yaml`
at the project root describes the same deployment for `prefect deploy --all`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import Flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.schedules import Cron

from flows.pipeline import pipeline

DEFAULT_CRON = "0 2 * * *"  # nightly at 02:00
DEFAULT_POOL = "star"
ENTRYPOINT = "flows/pipeline.py:pipeline"


def deployment_parameters(preset: str | None, stages: list[str] | None, experiment: str | None,
                          root: Path) -> dict[str, Any]:
    """The pipeline flow's parameters for a scheduled run (only the ones given)."""
    params: dict[str, Any] = {"root": str(root)}
    if preset:
        params["preset"] = preset
    if stages:
        params["stages"] = stages
    if experiment:
        params["experiment"] = experiment
    return params


def ensure_process_pool(name: str) -> None:
    """Create a `process` work pool (runs flows as subprocesses on the worker's machine) unless it exists."""
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            try:
                client.create_work_pool(WorkPoolCreate(name=name, type="process"))
            except ObjectAlreadyExists:
                pass


def register(root: Path, name: str = "nightly", cron: str = DEFAULT_CRON, work_pool: str = DEFAULT_POOL,
             preset: str | None = None, stages: list[str] | None = None, experiment: str | None = None,
             timezone: str = "UTC") -> str:
    """Register the scheduled pipeline deployment on `work_pool`; return the deployment id."""
    ensure_process_pool(work_pool)
    flow = Flow.from_source(source=str(root), entrypoint=ENTRYPOINT)
    deployment_id = flow.deploy(
        name=name, work_pool_name=work_pool, schedules=[Cron(cron, timezone=timezone)],
        parameters=deployment_parameters(preset, stages, experiment, root),
        description="The STAR pipeline (DVC stages as Prefect tasks) on a schedule.",
        tags=["star"], print_next_steps=False, build=False, push=False,
    )
    return str(deployment_id)


def serve(root: Path, name: str = "nightly", cron: str = DEFAULT_CRON, preset: str | None = None,
          stages: list[str] | None = None, experiment: str | None = None) -> None:
    """Serve the scheduled deployment from this process (blocks; Ctrl-C stops it)."""
    pipeline.serve(name=name, cron=cron, parameters=deployment_parameters(preset, stages, experiment, root))
