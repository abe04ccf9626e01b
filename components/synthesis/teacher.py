"""The trajectories stage: run a teacher (the environment's programmatic expert, or an OpenAI-compatible endpoint)
through the same agent loop the policy uses, and keep every trajectory with its evaluation.

The environment is reached through the registry (`components.environments`): its task source gives the episodes
(`episode(item, seed + key(item))`) and the evaluation (`evaluate`, every mode: the source is loaded with
`full_evaluation`), its `source` module the expert (`expert_policy(seed, **options)`) and the digests of the inputs
(`input_digests(source, items)`). The stage runs on travel (`TEACHER_ENV`): its items are the queries, keyed by idx.

Output is resumable: each trajectory is appended to the JSONL (flushed and fsynced) the moment its episode ends,
and a rerun skips every idx already there, so a crash loses no finished trajectory and redoes none.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from pydantic import Field, model_validator
from tqdm.auto import tqdm

from components import environments
from components.agent.environment import TaskSource
from components.agent.http import OpenAIChatPolicy
from components.agent.loop import run_episodes
from components.agent.params import EndpointParams, LimitsParams, limits_defaulting_to
from components.errors import UserError
from components.params import Params

TEACHER_ENV = "travel"  # the environment whose queries (data/queries/sft.jsonl) the stage solves

TEACHER_LIMITS = {"max_turns": 60, "max_tokens_per_turn": 4096, "max_context_tokens": 32768}  # Agent-STAR's
TeacherLimits = limits_defaulting_to(**TEACHER_LIMITS)  # a `limits` section's missing keys take these


class TeacherParams(Params):
    """`params/teacher.yaml`, section `teacher`."""

    kind: str = "expert"  # "expert" (offline, programmatic) or "endpoint" (OpenAI-compatible chat)
    seed: int = 0
    mistake_rate: float = Field(0.0, ge=0, le=1)
    max_routes: int = Field(30, ge=1)
    shortlist: int = Field(3, ge=1)
    max_tool_calls: int = Field(55, ge=1)  # the expert answers before this many calls (keep it below max_turns)
    batch_size: int = Field(64, ge=1)  # episodes stepped in lockstep per loop call
    failure_rate: float = Field(0.0, ge=0, le=1)  # injected transient tool failures
    slip_rate: float = Field(0.0, ge=0, le=1)  # expert calls first made with a slipped city name, then recovered
    limit: int | None = Field(None, ge=1)  # teach only the first `limit` queries
    limits: TeacherLimits = LimitsParams(**TEACHER_LIMITS)
    endpoint: EndpointParams | None = None

    @model_validator(mode="after")
    def _kind(self) -> "TeacherParams":
        if self.kind not in ("expert", "endpoint"):
            raise ValueError("kind must be 'expert' or 'endpoint'")
        if self.kind == "endpoint" and self.endpoint is None:
            raise ValueError("kind 'endpoint' needs an endpoint section (base_url, model, api_key_env)")
        return self

    def expert_options(self) -> dict[str, Any]:
        """The expert's settings beside its seed (travel's `ExpertConfig` fields)."""
        return {"mistake_rate": self.mistake_rate, "max_routes": self.max_routes, "shortlist": self.shortlist,
                "max_tool_calls": self.max_tool_calls, "slip_rate": self.slip_rate}


def make_policy(params: TeacherParams, kind: str) -> Any:
    """The teacher's policy backend: the expert of the environment `kind`, or the endpoint."""
    if params.kind == "expert":
        return environments.expert_policy(kind, params.seed, **params.expert_options())
    return OpenAIChatPolicy(params.endpoint.config())


def read_finished(path: Path) -> list[dict]:
    """The trajectories already in `path`; a torn last line (a crash mid-write) is cut off the file."""
    if not path.exists():
        return []
    records, good_bytes = [], 0
    with path.open("rb") as handle:
        for line in handle:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
            good_bytes += len(line)
    if good_bytes != path.stat().st_size:
        with path.open("r+b") as handle:
            handle.truncate(good_bytes)
    return records


class JsonlAppender:
    """Appends one JSON object a line and makes it durable before returning (flush + fsync)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("a", encoding="utf-8")

    def __call__(self, record: dict) -> None:
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


def settings_path(out: Path) -> Path:
    """The sidecar recording which teacher settings produced `out` (a resume must not mix settings)."""
    return out.with_name(out.name + ".settings.json")


def check_resumable(out: Path, params: TeacherParams, inputs: dict[str, Any] | None = None) -> None:
    """Refuse to resume an output written with other teacher settings, another world or other queries under the
    same idx (`inputs`: the environment's `input_digests`; more queries is fine); record them for the next run."""
    # what shapes the trajectories; where the endpoint lives and how it is called (URL, retries...) does not
    settings = params.model_dump(mode="json", exclude={"limit", "batch_size", "endpoint"})
    if params.endpoint is not None:
        settings["endpoint"] = {"model": params.endpoint.model, "temperature": params.endpoint.temperature}
    inputs = dict(inputs or {})
    query_hashes = inputs.pop("queries", {})
    settings.update(inputs)
    sidecar = settings_path(out)
    if out.exists() and out.stat().st_size and sidecar.exists():
        previous = json.loads(sidecar.read_text())
        previous_queries = previous.pop("queries", {})
        changed = sorted(k for k in set(previous) | set(settings) if previous.get(k) != settings.get(k))
        if any(previous_queries.get(idx, h) != h for idx, h in query_hashes.items()):
            changed.append("queries")
        if changed:
            raise UserError(f"{out} was written with other teacher settings or inputs ({', '.join(changed)} "
                            "changed); rerun with --fresh to start over, or restore the old ones to resume it")
        query_hashes = {**previous_queries, **query_hashes}
    settings["queries"] = query_hashes
    out.parent.mkdir(parents=True, exist_ok=True)
    sidecar.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def batches(items: list, size: int) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def teach(source: TaskSource, params: TeacherParams, out: Path, progress: bool = True) -> dict:
    """Roll the teacher out on every item of `source` not yet in `out` (records are keyed by `source.key(item)`,
    their idx); returns the stage summary over the whole file."""
    started = time.perf_counter()
    items = source.items[: params.limit] if params.limit else source.items
    check_resumable(out, params, environments.input_digests(source.kind, source, items))
    done = {r["idx"] for r in read_finished(out)}
    todo = [item for item in items if source.key(item) not in done]
    policy = make_policy(params, source.kind)
    append = JsonlAppender(out)
    limits = params.limits.to_limits()
    try:
        with tqdm(total=len(todo), desc="teacher", unit="traj", disable=not progress) as bar:
            for chunk in batches(todo, params.batch_size):
                episodes = [source.episode(item, params.seed + source.key(item)) for item in chunk]

                def finished(record: dict) -> None:
                    append(record)
                    bar.update(1)

                run_episodes(episodes, policy, limits, evaluate=source.evaluate, on_finished=finished,
                             progress=False)
    finally:
        append.close()
        if hasattr(policy, "close"):
            policy.close()
    wall = time.perf_counter() - started
    wanted = {source.key(item) for item in items}
    records = [r for r in read_finished(out) if r["idx"] in wanted]
    summary = summarize_trajectories(records)
    summary.update({"resumed": len(done & wanted), "generated": len(todo), "wall_s": round(wall, 3),
                    "trajectories_per_s": round(len(todo) / wall, 3) if wall > 0 and todo else 0.0,
                    "kind": params.kind, "mistake_rate": params.mistake_rate})
    return summary


def _rate(values: list[bool]) -> float:
    return sum(values) / len(values) if values else 0.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize_trajectories(records: list[dict]) -> dict:
    """Counts and rates over trajectory records (`metrics/teacher.json`)."""
    def passed(r: dict, mode: str) -> bool:
        return bool((r.get("evaluation") or {}).get(mode, {}).get("final_pass"))

    by_level: dict[str, dict] = {}
    for level in sorted({str(r.get("level")) for r in records}):
        group = [r for r in records if str(r.get("level")) == level]
        by_level[level] = {"n": len(group), "strict_final_pass": _rate([passed(r, "strict") for r in group])}
    return {
        "n": len(records),
        "strict_final_pass": _rate([passed(r, "strict") for r in records]),
        "official_final_pass": _rate([passed(r, "official") for r in records]),
        "delivery_rate": _rate([bool(r.get("plan")) for r in records]),
        "mean_turns": _mean([r["num_turns"] for r in records]),
        "mean_tool_calls": _mean([r["num_tool_calls"] for r in records]),
        "tool_error_rate": (sum(r["num_tool_errors"] for r in records)
                            / max(1, sum(r["num_tool_calls"] for r in records))),
        "protocol_error_rate": _rate([r["num_protocol_errors"] > 0 for r in records]),
        "mean_chars": _mean([sum(len(m["content"]) for m in r["messages"]) for r in records]),
        "termination": dict(Counter(r["termination"] for r in records)),
        "by_level": by_level,
    }
