"""The environment registry: `env.kind` -> the package that implements it, one entry per environment.

Every environment package has the same modules: `env` (the episode, `components.agent.environment`'s protocol),
`tasks` (its task records), `expert` (a scripted policy that solves them), `reward` (the score of a finished
episode), `evaluate` (episodes through the agent loop and their metrics) and `source` (what the stages draw from:
`KIND`, `REWARD_COLUMNS`, `load_source(SourceInputs)`, `expert_policy(seed, **options)`; and, for an environment
the trajectories stage runs on, `input_digests(source, items)`), and an environment's own stage code (its params,
data building, a checkpoint's evaluation) in modules beside them. The stages (RL, SFT data, trajectories,
evaluation) reach an environment through this module and that protocol only.

    source = load_source("travel", SourceInputs(tasks=Path("data/queries/rl.jsonl"), files={"world": world_dir}))
    validation = package_module("travel", "validation")    # components/travel/validation.py

Adding an environment: write its package, then a loader function and its entry in `ENVIRONMENTS` here (or, from
a test or a plugin, `register("counting", lambda: counting_source_module)`).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from components.agent.environment import SourceInputs, TaskSource
from components.errors import UserError


def _travel() -> ModuleType:
    from components.travel import source
    return source


def _toolstar() -> ModuleType:
    from components.toolstar import source
    return source


def _qa() -> ModuleType:
    from components.qa import source
    return source


# kind -> a function returning the environment's `source` module (imported when a stage asks for it)
ENVIRONMENTS: dict[str, Callable[[], ModuleType]] = {"travel": _travel, "toolstar": _toolstar, "qa": _qa}


def kinds() -> list[str]:
    """The registered environment kinds."""
    return sorted(ENVIRONMENTS)


def register(kind: str, source: Callable[[], ModuleType]) -> None:
    """Register (or replace) the environment `kind`; `source()` returns its package's `source` module."""
    ENVIRONMENTS[kind] = source


def check_kind(kind: str) -> str:
    """`kind` when it is registered, else an error naming the kinds there are."""
    if kind not in ENVIRONMENTS:
        raise ValueError(f"env.kind {kind!r} is not a registered environment: use one of {kinds()} (or register "
                         "yours in components/environments.py)")
    return kind


def source_module(kind: str) -> ModuleType:
    """The `source` module of the environment `kind`."""
    try:
        return ENVIRONMENTS[check_kind(kind)]()
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def package_module(kind: str, name: str) -> ModuleType:
    """The module `name` of the environment `kind`'s package (the package its `source` module is in), e.g.
    `package_module("qa", "ood")` -> components.qa.ood."""
    package = source_module(kind).__package__
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.{name}":
            raise
        raise UserError(f"environment {kind!r} has no module {name!r}: add {package}.{name} (its package is "
                        f"{package})") from exc


def load_source(kind: str, inputs: SourceInputs) -> TaskSource:
    """The task source of the environment `kind` over `inputs`."""
    return source_module(kind).load_source(inputs)


def reward_params(kind: str) -> type:
    """The `rl.reward` params model of the environment `kind` (its source module's `REWARD_PARAMS`, a subclass of
    `components.agent.environment.RewardParams`)."""
    module = source_module(kind)
    if not hasattr(module, "REWARD_PARAMS"):
        raise UserError(f"the {kind} environment's {module.__name__} has no REWARD_PARAMS: define its rl.reward params "
                        "there (a subclass of components.agent.environment.RewardParams with its `kind`)")
    return module.REWARD_PARAMS


def reward_columns(kind: str) -> list[str]:
    """plots/rl/rewards.csv's columns for the environment `kind`."""
    return list(source_module(kind).REWARD_COLUMNS)


def expert_policy(kind: str, seed: int = 0, **options):
    """The programmatic expert of the environment `kind` (a `Policy`: the SFT data's teacher); `options` are its
    settings beside the seed (travel: mistake_rate, max_routes, shortlist, max_tool_calls, slip_rate)."""
    return source_module(kind).expert_policy(seed, **options)


def input_digests(kind: str, source: TaskSource, items: Sequence) -> dict[str, Any]:
    """The digests of `source`'s inputs and of each of `items` (under "queries", by key) that a resumed
    trajectories stage must find unchanged."""
    module = source_module(kind)
    if not hasattr(module, "input_digests"):
        raise UserError(f"the {kind} environment's {module.__name__} has no input_digests(source, items): the "
                        "trajectories stage needs it to resume its output safely; add it there")
    return module.input_digests(source, items)
