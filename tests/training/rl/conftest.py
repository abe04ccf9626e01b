"""Fixtures for the RL tests: a small random Llama model with SmolLM2's tokenizer saved like any checkpoint, RL
queries over the tiny synthetic world (tests/conftest.py's `tiny_world_dir`), and RL runs over them, each trained
once per session."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from components.training.rl.trainer import RLPaths

OUTPUTS = ("out", "checkpoints", "metrics", "plots")  # the RLPaths a run writes (the others are its inputs)


def make_queries(world, count: int = 6) -> list[dict]:
    """Three-day, one-city queries between cities of different states (query records of docs/contracts.md)."""
    cities = world.cities
    queries = []
    for i in range(count):
        org = cities[i % len(cities)]
        dest = next(c for c in cities[(i * 5 + 3) % len(cities):] + cities if world.state_of(c) != world.state_of(org))
        queries.append({
            "idx": i, "org": org, "dest": dest, "days": 3, "visiting_city_number": 1,
            "date": ["2022-03-16", "2022-03-17", "2022-03-18"], "people_number": 1 + i % 2,
            "local_constraint": {"house rule": None, "cuisine": None, "room type": None, "transportation": None},
            "budget": 1500 + 100 * i, "level": "easy",
            "query": f"Please plan a 3-day trip from {org} to {dest} from March 16th to March 18th, 2022, "
                     f"for {1 + i % 2} people with a budget of ${1500 + 100 * i}.",
        })
    return queries


@pytest.fixture(scope="session")
def rl_queries_path(tiny_world, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rl_queries") / "rl.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in make_queries(tiny_world)))
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(small_model_factory, smol_tokenizer, tmp_path_factory) -> Path:
    """A randomly initialised 2-layer Llama (hidden 32) with SmolLM2's tokenizer, saved like any checkpoint."""
    from components.models.checkpoints import save_checkpoint

    model = small_model_factory(seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                intermediate_size=64)
    out = tmp_path_factory.mktemp("tiny_model")
    save_checkpoint(model, smol_tokenizer, out, stage="test")
    return out


@pytest.fixture(scope="session")
def rl_paths(tiny_model_dir, tiny_world_dir, rl_queries_path):
    """`rl_paths(folder)`: the RL stage's paths over the tiny model, world and queries, its outputs laid out under
    `folder` as under the repository (models/rl, checkpoints/rl, metrics/rl.json, plots/rl)."""
    from components.training.rl.trainer import RLPaths

    def under(folder: Path) -> RLPaths:
        return RLPaths(model=tiny_model_dir, world=tiny_world_dir, queries=rl_queries_path, out=folder / "models/rl",
                       checkpoints=folder / "checkpoints/rl", metrics=folder / "metrics/rl.json",
                       plots=folder / "plots/rl")

    return under


@dataclass
class Logged:
    """One `log(metrics, step)` call of a run, with the steps whose checkpoints were complete when it came."""

    step: int
    metrics: dict
    checkpoints: list[int]


@dataclass
class FinishedRun:
    """A finished RL run: what `train` returned and logged, and its paths. Shared by every test of the same params,
    so a test reads them; to resume, change or delete them it works on its own copy (`copy_to`)."""

    folder: Path
    paths: RLPaths
    summary: dict
    logged: list[Logged]

    def copy_to(self, folder: Path) -> RLPaths:
        """The run's outputs and checkpoints copied into `folder`, and its paths there."""
        shutil.copytree(self.folder, folder, dirs_exist_ok=True)
        return replace(self.paths, **{name: folder / getattr(self.paths, name).relative_to(self.folder)
                                      for name in OUTPUTS})


@pytest.fixture(scope="session")
def finished_rl_run(rl_paths, tmp_path_factory):
    """`finished_rl_run(params, run_id=None)`: the `FinishedRun` of the RL params `params` (a dict) over the tiny
    model, world and queries, trained the first time a test asks for it and shared by every later test asking for
    the same params."""
    from components.training.rl.checkpoint import complete_checkpoints
    from components.training.rl.params import RLParams
    from components.training.rl.trainer import train

    runs: dict[str, FinishedRun] = {}

    def finished(params: dict, run_id: str | None = None) -> FinishedRun:
        key = json.dumps([params, run_id], sort_keys=True)
        if key not in runs:
            folder = tmp_path_factory.mktemp("rl_run")
            paths, logged = rl_paths(folder), []
            summary = train(RLParams.model_validate(params), paths, run_id=run_id, progress_bar=False,
                            log=lambda metrics, step: logged.append(
                                Logged(step, metrics, [s for s, _ in complete_checkpoints(paths.checkpoints)])))
            runs[key] = FinishedRun(folder, paths, summary, logged)
        return runs[key]

    return finished
