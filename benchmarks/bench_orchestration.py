"""Orchestration overhead: the Prefect pipeline flow vs plain `dvc repro` on the same small DVC project.

Both run the sample project (prepare -> train_a, train_b (gpu) -> report; the train stages log to MLflow) from
scratch, then again with nothing to do (the no-op case: DVC finds every stage up to date). The flow runs against
one Prefect server started beforehand (its start-up is reported separately: `star run` without PREFECT_API_URL
pays it once per run).

    python benchmarks/bench_orchestration.py [--repeats 2] [--results benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the sample project is a test fixture: tests/orchestration/sample_project.py

from orchestration.sample_project import make_sample_project  # noqa: E402

DVC = str(Path(sys.executable).parent / "dvc")


def timed(fn) -> float:
    """Wall seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def dvc_repro(root: Path) -> None:
    subprocess.run([DVC, "repro"], cwd=root, check=True, capture_output=True,
                   env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})


def fresh_project(base: Path, name: str) -> Path:
    root = make_sample_project(base / name)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    return root


def measure(repeats: int) -> dict[str, list[float]]:
    """Seconds per case over `repeats` runs, each on fresh projects."""
    from flows.pipeline import pipeline

    results: dict[str, list[float]] = {"dvc_full": [], "flow_full": [], "dvc_noop": [], "flow_noop": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for rep in range(repeats):
            root = fresh_project(base, f"dvc{rep}")
            results["dvc_full"].append(timed(lambda: dvc_repro(root)))
            results["dvc_noop"].append(timed(lambda: dvc_repro(root)))
            root = fresh_project(base, f"flow{rep}")
            results["flow_full"].append(timed(lambda: pipeline(root=str(root))))
            results["flow_noop"].append(timed(lambda: pipeline(root=str(root))))
            os.chdir(REPO)
    return results


def report(results: dict[str, list[float]], server_start: float, repeats: int) -> str:
    """A Markdown section with the medians and the flow/dvc ratios."""
    med = {k: statistics.median(v) for k, v in results.items()}
    cores = os.cpu_count()
    lines = [
        "",
        f"## Orchestration overhead (bench_orchestration.py; {cores}-core machine, 2026-11-21)",
        "",
        "Sample DVC project: 4 stages (two log to MLflow/sqlite, two are GPU stages behind a `gpu` limit of 1 slot);",
        f"median of {repeats} run(s), wall seconds. Machine shared with other jobs while measuring "
        f"(load average {os.getloadavg()[0]:.1f}); Python {platform.python_version()}.",
        "",
        "| case | plain `dvc repro` | Prefect flow (`star run`) | ratio flow/dvc |",
        "|---|---|---|---|",
        f"| full pipeline (every stage runs) | {med['dvc_full']:.1f} s | {med['flow_full']:.1f} s | "
        f"{med['flow_full'] / med['dvc_full']:.2f}x |",
        f"| no-op (everything up to date) | {med['dvc_noop']:.1f} s | {med['flow_noop']:.1f} s | "
        f"{med['flow_noop'] / med['dvc_noop']:.2f}x |",
        "",
        f"Prefect temporary server start-up (paid once by `star run` without PREFECT_API_URL): {server_start:.1f} s.",
        f"Per-stage overhead of the flow on the full run: "
        f"{(med['flow_full'] - med['dvc_full']) / 4:+.2f} s/stage (one `dvc repro --single-item` process per "
        "stage, the MLflow parent run, Prefect task states).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "RESULTS.md")
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="bench-prefect-")
    os.environ.update(PREFECT_HOME=home, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    os.environ.pop("PREFECT_API_URL", None)
    from prefect.testing.utilities import prefect_test_harness

    start = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=180):
        server_start = time.perf_counter() - start
        results = measure(args.repeats)
    for case, seconds in results.items():
        print(f"{case:<10} " + " ".join(f"{s:.1f}" for s in seconds))
    section = report(results, server_start, args.repeats)
    print(section)
    if not args.no_append:
        with open(args.results, "a") as out:
            out.write(section)
        print(f"appended to {args.results}")


if __name__ == "__main__":
    main()
