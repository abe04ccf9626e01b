"""The RolloutEngine: G multi-turn rollouts per query through THE agent loop (components/agent/loop.py).

Two ways to roll out, one loop:
- `groups(queries, G)`: every episode of the step runs in lockstep through `run_episodes` (one batched generate
  call per turn over all active episodes).
- ARPO (`start` / `advance` / `branch`, the `BranchingEngine` that `arpo.arpo_rollouts` drives): the same loop
  steps (`loop._start/_request/_advance/_finish`), one turn per round, so that an episode can be copied right after
  a tool response (prefix ids, masks, logprobs, counters, messages and environment state) and branch.

Backends: transformers (`HFPolicy`, CPU and small GPU runs; the engine samples with the very model being trained,
so no weight sync is needed) or vLLM on a GPU (`components.agent.vllm_backend.VLLMPolicy` on a colocated engine, weights
pushed after every update by `weight_sync.VLLMWeightSync`).
Token-in/token-out: ids are never re-derived from the rendered chat.
"""
from __future__ import annotations

import copy
import importlib.util
import math
import time
from dataclasses import dataclass, field
from typing import Any

from components.agent import loop
from components.agent.types import TurnResult
from components.training.rl.arpo import TurnInfo, segment_entropy
from components.training.rl.rewards import strict_evaluation


def turn_entropies(result: TurnResult) -> list[float]:
    """Per-token entropies of a sampled turn: the backend's own when it reports them, else the Monte-Carlo
    estimate -log p(sampled token) (its expectation under the sampling distribution is the entropy)."""
    own = getattr(result, "entropies", None)
    if own is not None:
        return list(own)
    return [-lp for lp in (result.logprobs or []) if math.isfinite(lp)]


@dataclass
class BranchableEpisode:
    """An episode stepped turn by turn for ARPO: the loop's running state plus the copy taken at the last tool
    response (the branch point)."""

    state: Any  # loop._Running
    branch_point: Any = None  # copy of `state` just before the turn generated after the last tool response
    record: dict | None = None  # the finished trajectory record
    branches: int = 0
    meta: dict = field(default_factory=dict)


def copy_running(state, world) -> Any:
    """A deep copy of a running episode that shares the (immutable, large) world instead of copying it."""
    return copy.deepcopy(state, memo={id(world): world})


class RolloutEngine:
    """Multi-turn rollouts of RL queries in the travel environment with one policy backend."""

    def __init__(self, policy, tokenizer, world, limits: loop.Limits, failure_rate: float = 0.0, seed: int = 0,
                 entropy_tokens: int = 20, env_factory=None):
        self.policy = policy
        self.tokenizer = tokenizer
        self.world = world
        self.limits = limits
        self.failure_rate = failure_rate
        self.seed = seed
        self.entropy_tokens = entropy_tokens
        self.env_factory = env_factory or default_env_factory
        self.step = 0
        self._counter = 0
        self.evaluation_seconds = 0.0  # time spent in the strict evaluator (the reward share of rollout time)

    # ---- episodes ------------------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Seed this step's environments and sampling from (seed, step): a resumed run redraws the same step."""
        self.step = step
        self._counter = 0
        if hasattr(self.policy, "seed") and hasattr(self.policy, "calls"):
            self.policy.seed = self.seed * 1_000_003 + step * 10_007
            self.policy.calls = 0

    def episode(self, query) -> loop.Episode:
        """A fresh episode of `query` with its own environment seed."""
        self._counter += 1
        env_seed = (self.seed * 1_000_003 + self.step * 10_007 + self._counter) % (2**31)
        env = self.env_factory(self.world, query, self.failure_rate, env_seed)
        return loop.Episode(idx=query.idx, env=env, meta={"level": query.level, "query": query},
                            episode_id=f"s{self.step}-q{query.idx}-e{self._counter}")

    def evaluate(self, episode: loop.Episode, record: dict) -> dict:
        """The loop's evaluate callback: the strict evaluation (the reward reads it from the record)."""
        start = time.perf_counter()
        try:
            return strict_evaluation(self.world, episode.meta["query"], record)
        finally:
            self.evaluation_seconds += time.perf_counter() - start

    # ---- plain GRPO / DAPO: lockstep through run_episodes ---------------------------------------------------
    def groups(self, queries, n: int) -> list[list[dict]]:
        """n finished trajectory records per query, grouped per query in order."""
        episodes = [self.episode(q) for q in queries for _ in range(n)]
        records = loop.run_episodes(episodes, self.policy, self.limits, tokenizer=self.tokenizer,
                                    evaluate=self.evaluate, progress=False)
        return [records[i * n:(i + 1) * n] for i in range(len(queries))]

    # ---- ARPO: the BranchingEngine protocol -----------------------------------------------------------------
    def start(self, query, n: int) -> list[BranchableEpisode]:
        out = []
        for _ in range(n):
            state = loop._start(self.episode(query), self.tokenizer)
            out.append(BranchableEpisode(state=state))
        return out

    def advance(self, episodes: list[BranchableEpisode]) -> list[TurnInfo]:
        """One turn for every episode in one batched generate call, through the loop's own step function."""
        infos: list[TurnInfo | None] = [None] * len(episodes)
        live = []
        for i, ep in enumerate(episodes):
            if ep.record is not None:
                infos[i] = TurnInfo(after_tool=False, entropy=0.0, done=True)
            elif ep.state.context_length() >= self.limits.max_context_tokens:
                ep.record = loop._finish(ep.state, "context_limit", self.tokenizer, self.evaluate)
                infos[i] = TurnInfo(after_tool=False, entropy=0.0, done=True)
            else:
                live.append(i)
        requests = [loop._request(episodes[i].state, self.limits, self.tokenizer) for i in live]
        results = self.policy.generate(requests) if requests else []
        for i, result in zip(live, results):
            ep = episodes[i]
            after_tool = bool(ep.state.record["turns"]) and ep.state.record["turns"][-1]["kind"] == "tool"
            ep.branch_point = copy_running(ep.state, self.world) if after_tool else None
            reason = loop._advance(ep.state, result, self.limits, self.tokenizer)
            if reason is not None:
                ep.record = loop._finish(ep.state, reason, self.tokenizer, self.evaluate)
            infos[i] = TurnInfo(after_tool=after_tool, done=reason is not None,
                                entropy=segment_entropy(turn_entropies(result), self.entropy_tokens))
        return infos  # type: ignore[return-value]

    def branch(self, episode: BranchableEpisode) -> BranchableEpisode:
        """A new episode continuing from `episode`'s last branch point (right after its last tool response)."""
        if episode.branch_point is None:
            raise ValueError("branch() needs an episode whose last turn followed a tool response")
        episode.branches += 1
        state = copy_running(episode.branch_point, self.world)
        state.episode = copy.copy(state.episode)
        state.episode.episode_id = f"{episode.state.episode.episode_id}.b{episode.branches}"
        state.record["branch_of"] = episode.state.episode.episode_id
        return BranchableEpisode(state=state)


def default_env_factory(world, query, failure_rate: float, seed: int):
    """The travel episode of docs/contracts.md."""
    from components.travel.env import TravelEnv

    return TravelEnv(world, query, failure_rate=failure_rate, seed=seed)


# ---- backends ------------------------------------------------------------------------------------------------

def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(backend: str, device: str) -> str:
    """`auto` is vLLM on a GPU when vLLM is installed, transformers otherwise."""
    if backend != "auto":
        return backend
    return "vllm" if device.startswith("cuda") and vllm_available() else "hf"


def build_policy(model, tokenizer, model_dir, rollout, seed: int, device: str):
    """The rollout policy for `rollout.backend` (RolloutParams): HFPolicy sampling from `model` itself, or a
    colocated vLLM engine loaded from `model_dir` whose weights the trainer pushes after each update."""
    backend = resolve_backend(rollout.backend, device)
    if backend == "vllm":
        from components.training.rl.optim import require_gpu_extra

        require_gpu_extra("vllm", "rl.rollout.backend: vllm")
        from components.agent.vllm_backend import VLLMPolicy

        return VLLMPolicy(str(model_dir), tokenizer, temperature=rollout.temperature, top_p=rollout.top_p, seed=seed,
                          gpu_memory_utilization=rollout.gpu_memory_utilization,
                          max_model_len=rollout.max_context_tokens, dtype="bfloat16")
    from components.agent.hf import HFPolicy

    return HFPolicy(model, tokenizer, temperature=rollout.temperature, top_p=rollout.top_p, seed=seed,
                    max_batch_size=rollout.max_batch_size)
