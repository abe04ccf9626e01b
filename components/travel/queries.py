"""The queries stage (`star queries`, travel's task generation): sample feasible queries by level into disjoint SFT,
RL and validation sets.

Skeleton -> budget -> feasibility (prechecks, then the expert's solver through the real tools) -> text. Training
sets (SFT, RL) draw from the cities outside `world.holdout_states`; the validation set draws only from held-out
states (origin and destination), so validation never sees a training city or name. Every set is disjoint from
the others (no two queries share origin, destination, dates, group size and constraints).
"""
from __future__ import annotations

import json
import random
import time
from collections import Counter
from typing import Any

from pydantic import Field, model_validator
from tqdm.auto import tqdm

from components.agent.params import EndpointParams
from components.errors import UserError
from components.params import Params
from components.travel.expert import ExpertConfig
from components.travel.feasibility import check_feasible
from components.travel.skeleton import CityPool, budget_for, city_pool, price_pool, sample_skeleton
from components.travel.query_text import back_translate, render_query_text
from components.travel.tasks import LEVELS, Query, level_counts

SPLITS = ("sft", "rl", "val")


class TextParams(Params):
    """How query text is written: `template` (offline) or `llm` back-translation through `endpoint`."""

    mode: str = "template"
    few_shot: int = Field(3, ge=0, le=3)
    endpoint: EndpointParams | None = None

    @model_validator(mode="after")
    def _endpoint_for_llm(self) -> "TextParams":
        if self.mode not in ("template", "llm"):
            raise ValueError("text.mode must be 'template' or 'llm'")
        if self.mode == "llm" and self.endpoint is None:
            raise ValueError("text.mode 'llm' needs text.endpoint (base_url, model)")
        return self


class QueriesParams(Params):
    """`params/queries.yaml`, section `queries`."""

    sizes: dict[str, int] = Field(default_factory=lambda: {"sft": 300, "rl": 200, "val": 50})
    mix: dict[str, float] = Field(default_factory=lambda: {"easy": 4, "medium": 3, "hard": 3})
    days: tuple[int, ...] = (3, 5, 7)
    seed: int = 0
    drive_only_fraction: float = Field(0.1, ge=0, le=1)
    # The share of one-city trips whose destination is in the origin's own state (short drives: "33 mins, 41 km").
    # None: the destination is any other city of the pool, so the share is whatever the pool gives (tiny: 3% of the
    # training pool's destinations, 25% of the 3-state validation pool's).
    same_state_fraction: float | None = Field(None, ge=0, le=1)
    min_flights_each_way: int = Field(3, ge=1)
    max_attempts_per_query: int = Field(300, ge=1)
    max_routes: int = Field(30, ge=1)
    val_source: str | None = None  # an official/Agent-STAR query file used as the validation set instead
    text: TextParams = Field(default_factory=TextParams)

    @model_validator(mode="after")
    def _check(self) -> "QueriesParams":
        if set(self.sizes) - set(SPLITS) or any(v < 0 for v in self.sizes.values()):
            raise ValueError(f"sizes takes non-negative counts for {list(SPLITS)}")
        if set(self.mix) - set(LEVELS) or sum(self.mix.values()) <= 0:
            raise ValueError(f"mix takes positive weights for {list(LEVELS)}")
        if not self.days or set(self.days) - {3, 5, 7}:
            raise ValueError("days must be a non-empty subset of [3, 5, 7]")
        return self


def signature(fields: dict) -> str:
    """What makes two queries the same trip (for disjoint splits)."""
    keys = ("org", "dest", "days", "date", "people_number", "local_constraint")
    return json.dumps({k: fields[k] for k in keys}, sort_keys=True)


def days_for_pool(pool: CityPool, wanted: tuple[int, ...]) -> tuple[int, ...]:
    """The trip lengths a pool supports: multi-city trips need a second state with three cities."""
    supported = tuple(d for d in wanted if d == 3 or any(pool.states_for_multi_city(c, 3 if d == 7 else 2)
                                                         for c in pool.cities))
    return supported or (3,)


class QuerySampler:
    """Draws feasible queries, counting attempts and rejection reasons."""

    def __init__(self, world: Any, params: QueriesParams, text_client: Any = None):
        self.world = world
        self.params = params
        self.rng = random.Random(params.seed)
        self.text_client = text_client
        self.seen: set[str] = set()
        self.rejected: Counter = Counter()
        self.attempts = 0
        self.text_fallbacks = 0
        self.expert = ExpertConfig(max_routes=params.max_routes)

    def draw(self, pool: CityPool, level: str, days: tuple[int, ...]) -> dict:
        """One feasible query's fields (text included); UserError after too many rejected attempts."""
        for _ in range(self.params.max_attempts_per_query):
            self.attempts += 1
            drive_only = self.rng.random() < self.params.drive_only_fraction
            skeleton = sample_skeleton(self.world, pool, level, self.rng, days, drive_only,
                                       self.params.same_state_fraction)
            if skeleton is None:
                self.rejected["no_destination"] += 1
                continue
            if signature(skeleton) in self.seen:
                self.rejected["duplicate"] += 1
                continue
            skeleton["budget"] = budget_for(skeleton, price_pool(self.world, skeleton))
            query = Query.from_dict({**skeleton, "idx": 0})
            verdict = check_feasible(self.world, query, self.expert, self.params.min_flights_each_way,
                                     seed=self.rng.randrange(2**31))
            if not verdict.feasible:
                self.rejected[verdict.reason] += 1
                continue
            self.seen.add(signature(skeleton))
            skeleton["query"] = self.text(skeleton)
            return skeleton
        raise UserError(f"no feasible {level} query found in {self.params.max_attempts_per_query} attempts "
                        f"(rejections so far: {dict(self.rejected)}); use a bigger world, fewer constraints, or "
                        "raise queries.max_attempts_per_query")

    def text(self, fields: dict) -> str:
        if self.params.text.mode == "llm" and self.text_client is not None:
            text = back_translate(self.text_client, fields, self.params.text.few_shot)
            if text:
                return text
            self.text_fallbacks += 1
        return render_query_text(fields, self.rng)

    def split(self, pool: CityPool, size: int, progress: Any = None) -> list[Query]:
        """`size` queries mixed by level, shuffled, with idx 0..size-1."""
        days = days_for_pool(pool, self.params.days)
        records = []
        for level, count in level_counts(size, self.params.mix).items():
            for _ in range(count):
                records.append(self.draw(pool, level, days))
                if progress is not None:
                    progress.update(1)
        self.rng.shuffle(records)
        return [Query.from_dict({**r, "idx": i}) for i, r in enumerate(records)]


def synthesize_splits(world: Any, params: QueriesParams, text_client: Any = None, progress: bool = True,
                      val_queries: list[Query] | None = None) -> tuple[dict[str, list[Query]], dict]:
    """Every split and the stage summary (`metrics/queries.json`)."""
    started = time.perf_counter()
    sampler = QuerySampler(world, params, text_client)
    train_pool, val_pool = city_pool(world, holdout=False), city_pool(world, holdout=True)
    total = sum(params.sizes.get(s, 0) for s in SPLITS if not (s == "val" and val_queries is not None))
    splits: dict[str, list[Query]] = {}
    with tqdm(total=total, desc="queries", unit="q", disable=not progress) as bar:
        for name in SPLITS:
            if name == "val" and val_queries is not None:
                splits[name] = val_queries
                continue
            pool = val_pool if name == "val" and world.holdout_states else train_pool
            splits[name] = sampler.split(pool, params.sizes.get(name, 0), bar)
    accepted = sum(len(v) for k, v in splits.items() if not (k == "val" and val_queries is not None))
    summary = {
        "sizes": {k: len(v) for k, v in splits.items()},
        "by_level": {k: dict(Counter(q.level for q in v)) for k, v in splits.items()},
        "by_days": {k: {str(d): n for d, n in sorted(Counter(q.days for q in v).items())} for k, v in splits.items()},
        "attempts": sampler.attempts,
        "acceptance_rate": accepted / sampler.attempts if sampler.attempts else 0.0,
        "rejected": dict(sorted(sampler.rejected.items())),
        "mean_budget": {k: (sum(q.budget for q in v) / len(v) if v else 0.0) for k, v in splits.items()},
        "text_mode": params.text.mode,
        "text_fallbacks": sampler.text_fallbacks,
        "holdout_states": list(world.holdout_states),
        "val_source": params.val_source or "synthesized",
        "wall_s": round(time.perf_counter() - started, 3),
    }
    return splits, summary
