"""The pipeline flow: one Prefect task per DVC stage, in the order of DVC's own graph.

Each task runs `dvc repro --single-item <stage>` in a subprocess (so DVC decides whether the stage is up to date,
restores it from the run cache, or runs it, and writes dvc.lock). Stages whose upstream stages are done run
concurrently; stages with `meta: {gpu: n}` first take n slots of the global concurrency limit `gpu` (sized to the
visible GPUs, created if absent) and get `CUDA_VISIBLE_DEVICES` for the devices they hold. One MLflow parent run
covers the pipeline run: stage processes open their child runs under it (`STAR_PARENT_RUN_ID`), and the parent
records every stage's status (ran / unchanged / restored from the run cache / failed) and dvc.lock hash, the main
params (`tracking.pipeline_params`) and, as it ends, every checkpoint's headline metrics (`validate/sft/final_pass`).

    python -m flows.pipeline                  # or: star run [--preset P] [--stages rl validate]
"""
from __future__ import annotations

import os
import threading

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.task_runners import ThreadPoolTaskRunner

from components import lifeline, tracking
from components.errors import UserError
from components.orchestration import gpus as gpu_slots
from components.orchestration.graph import StageNode, lock_hash, read_graph, select
from components.orchestration.presets import apply_preset, check_params
from components.orchestration.stages import StageFailed, StageOutcome, run_stage


def ensure_gpu_limit(slots: int, name: str = gpu_slots.GPU_LIMIT) -> int:
    """Create the global concurrency limit `name` with `slots` slots unless it exists; return its size."""
    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(name).limit
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots))
            except ObjectAlreadyExists:
                pass  # another flow created it meanwhile
            return client.read_global_concurrency_limit_by_name(name).limit


_LOCAL_SLOTS: dict[int, gpu_slots.LocalSlots] = {}
_LOCAL_SLOTS_LOCK = threading.Lock()


def _local_slots(size: int) -> gpu_slots.LocalSlots:
    """This process's queue in front of the `gpu` limit (one per limit size)."""
    with _LOCAL_SLOTS_LOCK:
        return _LOCAL_SLOTS.setdefault(size, gpu_slots.LocalSlots(size))


def _retry_unless_user_error(task, task_run, state) -> bool:
    """Retry transient failures only: a stage that reported a user error (bad params) fails at once, and nothing is
    retried once `star run` is stopping (SIGTERM, Ctrl-C)."""
    error = state.result(raise_on_failure=False)
    return not (isinstance(error, StageFailed) and not error.transient) and not lifeline.stopping()


@task(cache_policy=NO_CACHE, retry_condition_fn=_retry_unless_user_error, retry_delay_seconds=5)
def reproduce(node: StageNode, root: str, parent: tracking.PipelineRun, force: bool = False,
              slots: int = 1) -> StageOutcome:
    """Reproduce one DVC stage (taking GPU slots first when it needs GPUs) and record it on the parent run.

    The stage's environment is read from the parent when the stage starts, not when it was submitted: once the
    parent has lost MLflow, it tells its stages to spool beside it instead of each waiting for MLflow again."""
    logger = get_run_logger()
    env = parent.env()
    try:
        if node.gpus:
            need = gpu_slots.slots_needed(node.name, node.gpus, gpu_slots.visible_gpus())
            with _local_slots(slots).hold(need), concurrency(gpu_slots.GPU_LIMIT, occupy=need):
                with gpu_slots.claim_devices(need, gpu_slots.visible_gpus()) as devices:
                    logger.info("stage %s holds %d gpu slot(s), devices %s", node.name, need, devices or "cpu")
                    outcome = run_stage(node.name, root, {**env, **gpu_slots.cuda_env(devices)}, force,
                                        on_line=logger.info, devices=tuple(devices))
        else:
            outcome = run_stage(node.name, root, env, force, on_line=logger.info)
    except StageFailed:
        parent.record_stage(node.name, "failed")
        raise
    parent.record_stage(node.name, outcome.status, lock_hash(root, node.name), outcome.seconds)
    logger.info("stage %s: %s in %.1f s", node.name, outcome.status, outcome.seconds)
    return outcome


@flow(name="star-pipeline", task_runner=ThreadPoolTaskRunner(max_workers=4))
def pipeline(stages: list[str] | None = None, preset: str | None = None, experiment: str | None = None,
             root: str | None = None, retries: int = 1, force: bool = False) -> dict[str, str]:
    """Run the DVC pipeline (all stages, or `stages` and their upstream) as Prefect tasks; return each status."""
    logger = get_run_logger()
    root_path = tracking.repo_root(root)
    os.chdir(root_path)
    if preset:
        for change in apply_preset(preset, root_path / "params"):
            logger.info("preset %s: %s", preset, change)
    problems = check_params(root_path / "params")  # fail in a second, not after an hour of upstream stages
    if problems:
        raise UserError("\n".join(problems))
    if experiment:
        os.environ[tracking.EXPERIMENT_ENV] = experiment
    os.environ["MLFLOW_TRACKING_URI"] = tracking.tracking_uri(root_path)  # absolute, for threads and subprocesses
    nodes = select(read_graph(root_path), stages)
    slots = ensure_gpu_limit(gpu_slots.slot_count(gpu_slots.visible_gpus()))
    logger.info("%d stage(s) in DVC order: %s; gpu limit: %d slot(s)", len(nodes),
                ", ".join(n.name for n in nodes), slots)
    run_params = {**tracking.pipeline_params(root_path),  # the knobs to compare runs by, from params/*.yaml
                  "stages": [n.name for n in nodes], "preset": preset or tracking.active_preset(root_path) or "",
                  "force": force, "retries": retries}
    # as it ends, the parent also gets the headline metrics of every checkpoint in metrics/ (validate, ood_qa, ...)
    with tracking.pipeline_run("pipeline", params=run_params, summary_root=root_path) as parent, \
            lifeline.stops_forwarded_first():
        futures = {}
        for node in nodes:
            upstream = [futures[name] for name in node.upstream if name in futures]
            futures[node.name] = reproduce.with_options(task_run_name=node.name, retries=retries).submit(
                node, str(root_path), parent, force, slots, wait_for=upstream)
        statuses, failures = _collect(futures)
        parent.log_dict(statuses, "stages.json")
        lifeline.raise_if_stopping()  # stages stopped by our SIGTERM / Ctrl-C did not fail
        if failures:
            raise RuntimeError("pipeline failed:\n" + "\n".join(failures))
    return statuses


def _collect(futures: dict) -> tuple[dict[str, str], list[str]]:
    """Wait for every task: statuses by stage (`not run` below a failure) and the failure messages."""
    statuses: dict[str, str] = {}
    failures: list[str] = []
    for name, future in futures.items():
        future.wait()
        state = future.state
        if state.is_completed():
            statuses[name] = future.result().status
            continue
        if not (state.is_failed() or state.is_crashed()):
            statuses[name] = "not run"  # an upstream stage failed
            continue
        statuses[name] = "failed"
        error = state.result(raise_on_failure=False)
        failures.append(str(error) if isinstance(error, StageFailed) else f"stage '{name}': {state.message}")
    return statuses, failures


if __name__ == "__main__":
    print(pipeline())
