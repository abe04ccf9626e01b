"""The RL algorithms, registered by the name `rl.algorithm` takes.

An algorithm is a rollout sampler (by its name in `samplers.SAMPLERS`) and the defaults of the knobs that define it,
the update's named functions among them: the per-token surrogate (`losses.SURROGATES`), the loss aggregation
(`losses.AGGREGATIONS`), the advantage scale (`advantages.SCALES`) and the token weighting of the advantage
(`advantages.TOKEN_WEIGHTINGS`). A knob that is absent or null in params/rl.yaml takes the algorithm's value; one given
a value keeps it, so `dvc exp run -S params/rl.yaml:rl.algorithm=dapo` switches every DAPO knob on and
`-S params/rl.yaml:rl.epsilon_high=0.3` still overrides one of them.

Adding an algorithm is one module that registers it (and, if it samples differently, its sampler):

    from components.training.rl.algorithms import Algorithm, register_algorithm

    register_algorithm(Algorithm(name="my_grpo", sampler="groups", defaults={"epsilon_high": 0.3}))

(docs/architecture.md, "Adding an algorithm").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.training.rl.registry import add, lookup

ALGORITHMS: dict[str, "Algorithm"] = {}


# What every algorithm starts from; its own `defaults` overlay these.
BASE_DEFAULTS: dict[str, Any] = {"scale_rewards": "group", "loss_type": "token-mean", "surrogate": "clipped",
                                 "token_weighting": "none", "overlong": {"enabled": False}}


@dataclass(frozen=True)
class Algorithm:
    """One RL algorithm: the sampler of a step's groups and the defaults of the knobs that define it (the update's
    named functions among them: `surrogate`, `token_weighting`, `loss_type`, `scale_rewards`)."""

    name: str
    sampler: str  # samplers.SAMPLERS key: groups | dapo | arpo | aepo (or a registered one)
    defaults: dict[str, Any] = field(default_factory=dict)  # knob -> value where the params file leaves it null
    tree: bool = False  # samples a branching tree of `arpo.budget` trajectories per query (else num_generations)
    summary: str = ""

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"an algorithm's name is a params value and an identifier: got {self.name!r}")

    def all_defaults(self) -> dict[str, Any]:
        """BASE_DEFAULTS overlaid with this algorithm's own (sections merged key by key)."""
        merged = dict(BASE_DEFAULTS)
        for key, value in self.defaults.items():
            base = merged.get(key)
            merged[key] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
        return merged


def register_algorithm(algorithm: Algorithm) -> Algorithm:
    """Add `algorithm` under its name (a name already registered is refused: unregister it first)."""
    return add(ALGORITHMS, algorithm.name, algorithm, "algorithm")


def unregister_algorithm(name: str) -> None:
    ALGORITHMS.pop(name, None)


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm `name`, or a ValueError that lists the registered ones."""
    return lookup(ALGORITHMS, name, "rl.algorithm")


def with_defaults(data: dict[str, Any], algorithm: Algorithm) -> dict[str, Any]:
    """`data` (the `rl:` mapping) with the algorithm's defaults filled in where a knob is absent or null (one level
    into a section: `overlong: {enabled: null}` takes the algorithm's `overlong.enabled`)."""
    merged = dict(data)
    for key, value in algorithm.all_defaults().items():
        given = merged.get(key)
        if isinstance(value, dict) and isinstance(given, dict):
            merged[key] = {**given, **{k: v for k, v in value.items() if given.get(k) is None}}
        elif given is None:
            merged[key] = value
    return merged


# GRPO: group-normalised advantages, symmetric clip, token-mean over the mini-batch.
register_algorithm(Algorithm(
    name="grpo", sampler="groups",
    summary="GRPO: G samples per query, group-normalised advantages, PPO's clipped ratio"))
# Dr.GRPO: no std normalisation; token sum divided by a constant (sequences x max_completion_length).
register_algorithm(Algorithm(
    name="dr_grpo", sampler="groups", defaults={"scale_rewards": "none", "loss_type": "seq-mean-token-sum-norm"},
    summary="Dr.GRPO: GRPO without the std normalisation or the length bias"))
# DAPO: clip-higher, dynamic sampling, token-level loss, overlong shaping.
register_algorithm(Algorithm(
    name="dapo", sampler="dapo", defaults={"epsilon_high": 0.28, "overlong": {"enabled": True}},
    summary="DAPO: clip-higher, dynamic sampling of informative groups, overlong shaping"))
# ARPO: entropy-guided branching; plain GRPO advantages over each query's M samples.
register_algorithm(Algorithm(
    name="arpo", sampler="arpo", tree=True,
    summary="ARPO: a tree of rollouts that branches after high-entropy tool responses"))
# AEPO: ARPO's tree with entropy pre-monitoring and the consecutive-branch penalty; entropy-balanced clipping and
# entropy-aware advantages in the update (the `aepo:` knobs).
register_algorithm(Algorithm(
    name="aepo", sampler="aepo", tree=True, defaults={"surrogate": "entropy_balanced", "token_weighting": "entropy_aware"},
    summary="AEPO: ARPO's tree balanced by entropy, entropy-balanced clipping and entropy-aware advantages"))
