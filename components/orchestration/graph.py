"""The DVC stage graph as plain data: stage addresses, upstream stages, GPU needs, and dvc.lock hashes.

Read from DVC itself (`dvc.repo.Repo(...).index.graph`), never kept as a second copy, so `dvc.yaml` stays the
single description of the pipeline.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
import yaml
from dvc.exceptions import DvcException
from dvc.repo import Repo
from dvc.utils import dict_sha256

from components.errors import UserError


@dataclass(frozen=True)
class StageNode:
    """One DVC stage: its address (`rl`, `validate@sft`), the stages it depends on, and GPUs it needs."""

    name: str
    upstream: tuple[str, ...]
    gpus: int = 0


def read_graph(root: str | Path) -> list[StageNode]:
    """The stages of the DVC project at `root`, upstream first (a topological order of DVC's own graph)."""
    previous = os.getcwd()
    os.chdir(root)  # stage addresses (`validate@sft`, `sub/dvc.yaml:stage`) are relative to the cwd
    try:
        repo = Repo(str(root))
    except DvcException as exc:
        os.chdir(previous)
        raise UserError(f"{root} is not a DVC project ({exc}); run `dvc init` there") from exc
    try:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        nodes = {stage: stage.addressing for stage in graph.nodes}
        order = list(nx.lexicographical_topological_sort(graph.reverse(copy=True), key=lambda s: nodes[s]))
        return [StageNode(name=nodes[stage],
                          upstream=tuple(sorted(nodes[dep] for dep in graph.successors(stage))),
                          gpus=gpu_need((stage.meta or {}).get("gpu", 0), Path(root), nodes[stage]))
                for stage in order if stage.cmd]
    except DvcException as exc:
        raise UserError(f"cannot read the DVC pipeline in {root}: {exc}") from exc
    finally:
        repo.close()
        os.chdir(previous)


def gpu_need(value: Any, root: Path, stage: str = "?") -> int:
    """The GPUs a stage's `meta: {gpu: ...}` asks for: a number, or `FILE:KEY`, a params key holding the stage's
    process count (`params/rl.yaml:rl.distributed.processes`), so the slots it takes and the processes its
    torchrun starts come from the same value."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if ":" not in text:
        raise UserError(f"stage {stage}: meta gpu must be a number or FILE:KEY (a params key), got {value!r}")
    file, key = text.split(":", 1)
    node: Any = yaml.safe_load((root / file).read_text()) if (root / file).is_file() else None
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return 1  # the key is unset: the params' default, one process
    if not isinstance(node, int) or node < 0:
        raise UserError(f"stage {stage}: meta gpu names {text}, which holds {node!r}, not a process count")
    return node


def select(nodes: list[StageNode], targets: list[str] | None) -> list[StageNode]:
    """The targets and everything upstream of them, in graph order (all stages when `targets` is empty).

    A target may name a `foreach` group (`validate` selects `validate@base`, `validate@sft`, ...).
    """
    if not targets:
        return list(nodes)
    by_name = {node.name: node for node in nodes}
    wanted: set[str] = set()
    for target in targets:
        matches = [n for n in by_name if n == target or n.split("@")[0] == target]
        if not matches:
            raise UserError(f"unknown stage '{target}' (stages: {', '.join(by_name)})")
        wanted.update(matches)
    frontier = list(wanted)
    while frontier:
        for dep in by_name[frontier.pop()].upstream:
            if dep not in wanted:
                wanted.add(dep)
                frontier.append(dep)
    return [node for node in nodes if node.name in wanted]


def lock_entry(root: str | Path, stage: str) -> dict[str, Any] | None:
    """The stage's entry in dvc.lock (`validate@sft` is stored under its full address), or None."""
    path = Path(root) / "dvc.lock"
    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text()) or {}
    return (data.get("stages") or {}).get(stage)


def run_cache_key(entry: dict[str, Any]) -> str:
    """DVC's run-cache key of a dvc.lock entry: sha256 of the entry with outputs reduced to their paths.

    It names the folder `.dvc/cache/runs/<key[:2]>/<key>/` where DVC keeps the stage's cached runs, so the
    same key identifies a stage restored from the run cache.
    """
    keyed = dict(entry)
    keyed["outs"] = [out["path"] for out in entry.get("outs", [])]
    return dict_sha256(keyed, exclude=["size", "nfiles"])  # as dvc.stage.cache._get_cache_hash


def lock_hash(root: str | Path, stage: str) -> str | None:
    """The run-cache key of the stage's current dvc.lock entry, or None when the stage is not locked yet."""
    entry = lock_entry(root, stage)
    return run_cache_key(entry) if entry else None
