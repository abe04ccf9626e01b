"""A small DVC project with the pipeline's shape, for the orchestration and integration tests and
benchmarks/bench_orchestration.py.

    prepare ─┬─> train_a (gpu) ─┬─> report
             └─> train_b (gpu) ─┘

Each stage is a tiny Python step that reads its params, logs through `components.tracking.stage_run` (params,
stepped metrics, an artifact), and records its start/end time and `CUDA_VISIBLE_DEVICES` in its output, so tests
can check ordering, GPU-slot exclusivity and what reached MLflow. `make_sample_project` writes it (git + dvc init).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

STEPS = '''\
"""Steps of the sample project: python steps.py <stage>."""
import json, os, sys, time
from pathlib import Path

import yaml

from components import tracking


def params(section):
    return yaml.safe_load(Path("params/train.yaml").read_text())["train"][section] if section != "prepare" \\
        else yaml.safe_load(Path("params/prepare.yaml").read_text())["prepare"]


def write(path, data):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1))


def main(stage):
    started = time.time()
    if stage == "prepare":
        p = params("prepare")
        if not isinstance(p["n"], int):
            print(f"star prepare: error: params/prepare.yaml: prepare.n must be an integer, got {p['n']!r}")
            sys.exit(2)
        write("data/raw.json", list(range(p["n"])))
        return
    if stage == "report":
        a, b = (json.loads(Path(f"metrics/{m}.json").read_text()) for m in ("a", "b"))
        write("reports/summary.json", {"a": a, "b": b})
        return
    p = params(stage[-1])
    raw = json.loads(Path("data/raw.json").read_text())
    with tracking.stage_run(stage, params=p) as run:
        loss = 1.0
        for step in range(3):
            loss *= 1 - p["lr"]
            run.log_metrics({"loss": loss}, step=step)
        time.sleep(p.get("seconds", 0))
        metrics = {"loss": loss, "n": len(raw)}
        write(f"metrics/{stage[-1]}.json", metrics)
        run.log_artifact(f"metrics/{stage[-1]}.json")
    write(f"models/{stage[-1]}.json", {"started": started, "finished": time.time(),
                                        "devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    print(f"{stage}: wrote models/{stage[-1]}.json")


if __name__ == "__main__":
    main(sys.argv[1])
'''

DVC_YAML = """\
stages:
  prepare:
    cmd: {python} steps.py prepare
    deps: [steps.py]
    params:
      - params/prepare.yaml:
          - prepare
    outs: [data/raw.json]
  train_a:
    cmd: {python} steps.py train_a
    deps: [steps.py, data/raw.json]
    params:
      - params/train.yaml:
          - train.a
    outs: [models/a.json]
    metrics:
      - metrics/a.json:
          cache: false
    meta: {{gpu: 1}}
  train_b:
    cmd: {python} steps.py train_b
    deps: [steps.py, data/raw.json]
    params:
      - params/train.yaml:
          - train.b
    outs: [models/b.json]
    metrics:
      - metrics/b.json:
          cache: false
    meta: {{gpu: 1}}
  report:
    cmd: {python} steps.py report
    deps: [steps.py, metrics/a.json, metrics/b.json]
    outs: [reports/summary.json]
"""

PARAMS = {
    "prepare.yaml": "prepare:\n  n: 5\n",
    "train.yaml": textwrap.dedent("""\
        # two GPU stages with their own params sections
        train:
          a:
            lr: 0.1
            seconds: {seconds}
            api_key: sk-sample-secret-a1b2c3
          b:
            lr: 0.2
            seconds: {seconds}
        """),
}


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def make_sample_project(root: Path, stage_seconds: float = 0.0, commit: bool = True) -> Path:
    """Write the sample project into `root` (git init, dvc init, first commit); return `root`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "steps.py").write_text(STEPS)
    (root / "dvc.yaml").write_text(DVC_YAML.format(python=sys.executable))
    (root / "params").mkdir(exist_ok=True)
    for name, text in PARAMS.items():
        (root / "params" / name).write_text(text.format(seconds=stage_seconds))
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "star@example.invalid")
    _git(root, "config", "user.name", "star tests")
    dvc = Path(sys.executable).parent / "dvc"
    subprocess.run([str(dvc) if dvc.exists() else "dvc", "init", "-q"], cwd=root, check=True, capture_output=True)
    subprocess.run([str(dvc) if dvc.exists() else "dvc", "config", "core.analytics", "false"], cwd=root, check=True)
    (root / ".gitignore").write_text("mlflow.db\nmlruns/\n")
    if commit:
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", "sample project")
    return root
