"""The sweep flow: one `dvc exp run -S …` per variant (an ablation) under one MLflow parent run.

Each variant is a DVC experiment (named `<variant>-<timestamp>`, so `dvc exp show` lists them side by side) run in
a temporary copy of the project (`--temp`: the workspace stays as it is), one after the other. MLflow gets one
sweep run, a child run per variant (tagged with its overrides) and, below it, the runs of the stages that ran.

    star sweep --variant sum=params/rl.yaml:rl.reward.kind=sum --variant macro=params/rl.yaml:rl.reward.kind=macro
"""
from __future__ import annotations

import os
import subprocess
import time
from collections import deque

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from components import lifeline, tracking
from components.orchestration.stages import TAIL_LINES, dvc_executable, stage_environment


def exp_run_command(exp_name: str, overrides: list[str], temp: bool = True) -> list[str]:
    """`dvc exp run` of one variant: `overrides` are `-S` values like `params/rl.yaml:rl.reward.kind=macro`."""
    command = [dvc_executable(), "exp", "run", "--name", exp_name]
    command += ["--temp"] if temp else []
    for override in overrides:
        command += ["-S", override]
    return command


@task(cache_policy=NO_CACHE)
def run_variant(variant: str, overrides: list[str], exp_name: str, root: str, sweep_run: tracking.PipelineRun,
                temp: bool = True) -> str:
    """Run one variant as a DVC experiment under its own MLflow run (a child of the sweep's); `dvc exp run` is tied
    to this process, so stopping `star sweep`, even with SIGKILL, stops it and its stages."""
    logger = get_run_logger()
    tags = {"star.variant": variant, "dvc.exp_name": exp_name, "star.overrides": " ".join(overrides)}
    with tracking.pipeline_run(variant, params={"overrides": overrides}, tags=tags, parent=sweep_run) as run:
        env = stage_environment({**run.env(), tracking.VARIANT_ENV: variant})
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        with lifeline.tied(exp_run_command(exp_name, overrides, temp), cwd=root, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, errors="replace") as process:
            assert process.stdout is not None
            for line in process.stdout:
                tail.append(line.rstrip("\n"))
                logger.info(line.rstrip("\n"))
            returncode = process.wait()
        if returncode != 0:
            lifeline.raise_if_stopping()  # stopped by our SIGTERM / Ctrl-C, not failed
            raise RuntimeError(f"variant '{variant}' ({' '.join(overrides)}) failed; last lines:\n" + "\n".join(tail))
    return exp_name


@flow(name="star-sweep")
def sweep(variants: dict[str, list[str]], root: str | None = None, experiment: str | None = None,
          temp: bool = True) -> dict[str, str]:
    """Run each variant (name -> `-S` overrides) as a DVC experiment; return variant -> experiment name."""
    if not variants:
        raise ValueError("a sweep needs at least one variant, e.g. {'macro': ['params/rl.yaml:rl.reward.kind=macro']}")
    root_path = tracking.repo_root(root)
    os.chdir(root_path)
    if experiment:
        os.environ[tracking.EXPERIMENT_ENV] = experiment
    os.environ["MLFLOW_TRACKING_URI"] = tracking.tracking_uri(root_path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, str] = {}
    with tracking.pipeline_run("sweep", params={"variants": variants}) as parent, lifeline.stops_forwarded_first():
        for variant, overrides in variants.items():  # one at a time: experiments share the machine's GPUs
            results[variant] = run_variant.with_options(task_run_name=variant)(
                variant, list(overrides), f"{variant}-{stamp}", str(root_path), parent, temp)
        parent.log_dict(results, "experiments.json")
    return results
