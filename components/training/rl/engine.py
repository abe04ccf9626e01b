"""The RolloutEngine: G multi-turn rollouts per query through THE agent loop (components/agent/loop.py).

Two ways to roll out, one loop:
- `groups(queries, G)`: every episode of the step runs in one batch through `run_episodes` (one batched generate
  call per turn, or per decoding round with transformers, over all active episodes).
- ARPO and AEPO (`start` / `advance` / `branch`, the `BranchingEngine` that `arpo.branching_rollouts` drives): the
  loop's public stepping API (`loop.start_episode/generate_turns/advance_episode/finish_episode`), one turn per
  round, so that an episode can be copied right after a tool response (prefix ids, masks, logprobs, counters,
  messages and environment state) and branch.

Backends (rollout_backends.py): transformers (`HFPolicy`; the engine samples with the very model being trained, so
no weight sync is needed) or vLLM (`components.agent.vllm_backend.VLLMPolicy`: the rollout engine process, on CPU or
GPU, its weights pushed after every update by `weight_sync.EngineWeightSync`).
Token-in/token-out: ids are never re-derived from the rendered chat.

What an episode is, how it is evaluated and which large objects its copies share come from the task source
(`components.agent.environment.TaskSource`, one per environment kind: components/environments.py).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field

from components.agent import loop
from components.agent.environment import TaskSource
from components.agent.types import Policy, TurnResult
from components.training.rl.arpo import TurnInfo, segment_entropy


def turn_entropies(result: TurnResult) -> list[float]:
    """Per-token entropies of a sampled turn: the backend's own when it reports them, else the Monte-Carlo
    estimate -log p(sampled token) (its expectation under the sampling distribution is the entropy)."""
    if result.entropies is not None:
        return list(result.entropies)
    return [-lp for lp in (result.logprobs or []) if math.isfinite(lp)]


@dataclass
class BranchableEpisode:
    """An episode stepped turn by turn for ARPO: the loop's running state plus the copy taken at the last tool
    response (the branch point)."""

    state: loop.EpisodeState
    branch_point: loop.EpisodeState | None = None  # copy of `state` just before the turn after the last tool response
    record: dict | None = None  # the finished trajectory record
    branches: int = 0
    meta: dict = field(default_factory=dict)


def copy_running(state: loop.EpisodeState, *shared) -> loop.EpisodeState:
    """A deep copy of a running episode that shares the (immutable, large) `shared` objects (the world, a
    retriever, a sandbox) instead of copying them."""
    return copy.deepcopy(state, memo={id(obj): obj for obj in shared})


class RolloutEngine:
    """Multi-turn rollouts of a task source's records (`source`: an environment's, from components/environments.py)
    with one policy backend."""

    def __init__(self, policy: Policy, tokenizer, source: TaskSource, limits: loop.Limits, seed: int = 0,
                 entropy_tokens: int = 20):
        self.policy = policy
        self.tokenizer = tokenizer
        self.limits = limits
        self.seed = seed
        self.entropy_tokens = entropy_tokens
        self.source = source
        self.step = 0
        self._counter = 0
        self.evaluation_seconds = 0.0  # time spent in the evaluator (the reward share of rollout time)

    # ---- episodes ------------------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Seed this step's environments and sampling from (seed, step): a resumed run redraws the same step."""
        self.step = step
        self._counter = 0
        self.policy.reseed(self.seed * 1_000_003 + step * 10_007)

    def episode(self, query) -> loop.Episode:
        """A fresh episode of `query` with its own environment seed."""
        self._counter += 1
        env_seed = (self.seed * 1_000_003 + self.step * 10_007 + self._counter) % (2**31)
        episode = self.source.episode(query, env_seed)
        episode.episode_id = f"s{self.step}-q{self.source.key(query)}-e{self._counter}"
        return episode

    def evaluate(self, episode: loop.Episode, record: dict) -> dict:
        """The loop's evaluate callback: the source's evaluation (travel: the strict evaluation; the reward reads it
        from the record)."""
        start = time.perf_counter()
        try:
            return self.source.evaluate(episode, record)
        finally:
            self.evaluation_seconds += time.perf_counter() - start

    # ---- plain GRPO / DAPO: one batch through run_episodes ----------------------------------------------------
    def groups(self, queries, n: int) -> list[list[dict]]:
        """n finished trajectory records per query, grouped per query in order."""
        episodes = [self.episode(q) for q in queries for _ in range(n)]
        records = loop.run_episodes(episodes, self.policy, self.limits, tokenizer=self.tokenizer,
                                    evaluate=self.evaluate, progress=False)
        return [records[i * n:(i + 1) * n] for i in range(len(queries))]

    # ---- ARPO: the BranchingEngine protocol -----------------------------------------------------------------
    def start(self, query, n: int) -> list[BranchableEpisode]:
        """n fresh episodes of `query` (one that cannot take a single turn is finished at once)."""
        out = []
        for _ in range(n):
            episode = BranchableEpisode(state=loop.start_episode(self.episode(query), self.tokenizer))
            reason = loop.limit_at_start(episode.state, self.limits, self.tokenizer)
            if reason is not None:
                episode.record = self.finish(episode.state, reason)
            out.append(episode)
        return out

    def finish(self, state: loop.EpisodeState, reason: str) -> dict:
        """The finished, evaluated trajectory record of `state`."""
        return loop.finish_episode(state, reason, self.tokenizer, self.evaluate)

    def advance(self, episodes: list[BranchableEpisode]) -> list[TurnInfo]:
        """One turn for every unfinished episode in one batched generate call, through the loop's stepping API."""
        infos = [TurnInfo(after_tool=False, entropy=0.0, done=True) for _ in episodes]  # finished ones stay so
        live = [i for i, ep in enumerate(episodes) if ep.record is None]
        results = loop.generate_turns(self.policy, [episodes[i].state for i in live], self.limits, self.tokenizer)
        for i, result in zip(live, results):
            ep = episodes[i]
            after_tool = ep.state.after_tool_response()
            ep.branch_point = copy_running(ep.state, *self.source.shared) if after_tool else None
            reason = loop.advance_episode(ep.state, result, self.limits, self.tokenizer)
            if reason is not None:
                ep.record = self.finish(ep.state, reason)
            infos[i] = TurnInfo(after_tool=after_tool, done=reason is not None,
                                entropy=segment_entropy(turn_entropies(result), self.entropy_tokens))
        return infos

    def branch(self, episode: BranchableEpisode) -> BranchableEpisode:
        """A new episode continuing from `episode`'s last branch point (right after its last tool response)."""
        if episode.branch_point is None:
            raise ValueError("branch() needs an episode whose last turn followed a tool response")
        episode.branches += 1
        state = copy_running(episode.branch_point, *self.source.shared)
        state.episode = copy.copy(state.episode)
        state.episode.episode_id = f"{episode.state.episode.episode_id}.b{episode.branches}"
        state.record["branch_of"] = episode.state.episode.episode_id
        return BranchableEpisode(state=state)
