"""RLParams: the `rl:` section of params/rl.yaml (TRL's names where the meaning is the same).

`algorithm` names a registered algorithm (components/training/rl/algorithms.py): its sampler and the defaults of
the knobs that define it. A knob that is absent or null in the file takes the algorithm's value, a knob given a value
keeps it. So `dvc exp run -S params/rl.yaml:rl.algorithm=dapo` switches every DAPO knob on, and
`-S params/rl.yaml:rl.epsilon_high=0.3` still overrides one of them.
"""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, SerializeAsAny, ValidationError, field_validator, model_validator

from components import environments
from components.agent.environment import RewardParams
from components.agent.params import DecoderParams, LimitsParams
from components.params import Params
from components.training.rl.algorithms import Algorithm, get_algorithm, with_defaults

# One name per loss aggregation (verl's). TRL's loss_type names are refused with the name to write instead: its
# "grpo" (seq-mean-token-mean) would read as the aggregation of `algorithm: grpo`, which is token-mean here.
TRL_LOSS_TYPES = {"dapo": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm",
                  "bnpo": "token-mean (normalised over the whole mini-batch on every process)"}

# Switches of earlier params files that `algorithm` replaced: each is refused with what to write instead.
REPLACED_SWITCHES = {
    ("arpo", "enabled"): "rl.algorithm: arpo (or aepo) selects ARPO's branching sampler",
    ("aepo", "enabled"): "rl.algorithm: aepo selects AEPO's sampler, surrogate and token weighting",
    ("dynamic_sampling", "enabled"): "rl.algorithm: dapo selects DAPO's dynamic sampling",
    ("aepo", "entropy_clipping"): "rl.surrogate: entropy_balanced (AEPO's default) or clipped",
}


class DynamicSamplingParams(Params):
    """DAPO's sampler (`algorithm: dapo`)."""

    max_extra_rounds: int = Field(2, ge=0)  # cap on the extra sampling rounds per step


class OverlongParams(Params):
    enabled: bool = False
    max_tokens: int = Field(2048, gt=0)  # L_max, counted in sampled (policy) tokens of the whole episode
    cache_tokens: int = Field(512, ge=0)  # L_cache, the soft zone before L_max
    coefficient: float = 1.0


class ArpoParams(Params):
    """ARPO's branching tree (`algorithm: arpo`, and AEPO's tree)."""

    budget: int = Field(16, gt=0)  # M: samples per query
    initial_rollouts: int = Field(8, gt=0)  # N: full rollouts started per query
    alpha: float = 0.5
    beta: float = 0.2
    entropy_tokens: int = Field(20, gt=0)  # k: tokens after a tool response whose entropy is measured

    @model_validator(mode="after")
    def _n_within_m(self) -> "ArpoParams":
        if self.initial_rollouts > self.budget:
            raise ValueError(f"arpo.initial_rollouts ({self.initial_rollouts}) must be <= arpo.budget ({self.budget})")
        return self


class AepoParams(Params):
    """AEPO (arXiv 2510.14545) on ARPO's tree: arpo.budget is its k, arpo.alpha/beta its branch probability's
    alpha/gamma, arpo.entropy_tokens the head whose entropy is measured. Defaults: the authors' public code (the
    paper's full method; their released scripts turn dynamic_rollouts off)."""

    # dynamic entropy-balanced rollout (components/training/rl/aepo.py). Entropy pre-monitoring: each query starts
    # m = k * sigmoid(allocation_beta * (H_root - mean H_tool)) full rollouts (false: arpo.initial_rollouts, as ARPO)
    dynamic_rollouts: bool = True
    allocation_beta: float = Field(0.5, ge=0)  # beta of that split (the authors' code: 0.5)
    branch_penalty: float = Field(0.05, ge=0)  # P(l) = branch_penalty * l after l consecutive branches (0: none)
    # entropy-aware advantages (`token_weighting: entropy_aware`, advantages.py)
    entropy_advantage_coef: float = Field(0.2, ge=0)  # a in A * (1 + a * (H_t - mean H) / std H) (0: off)


class LoraParams(Params):
    """LoRA through peft (components/training/rl/lora.py): adapters on a frozen base, for a model whose full-weight
    training state (16 bytes a parameter) does not fit its GPU (`star rl --plan`)."""

    enabled: bool = False
    r: int = Field(16, gt=0)  # the adapters' rank
    alpha: float = Field(32.0, gt=0)  # scale = alpha / r
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class RolloutParams(LimitsParams, DecoderParams):
    """How RL samples its rollouts: the episode limits and decoding settings every agent-loop family shares, plus
    the sampling distribution."""

    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_batch_size: int | None = None  # split a turn's generate call into batches of at most this many episodes
    gpu_memory_utilization: float = Field(0.4, gt=0, le=1)  # vLLM, colocated with the trainer
    # vLLM: the engine sleeps through each update (KV cache freed, weights offloaded to CPU) and wakes for the weight
    # sync, as verl's hybrid engine does, so that training gets the GPU memory the rollouts used. auto: where vLLM
    # has sleep mode (a GPU); true on a CPU engine is refused (vLLM's CPU worker has no sleep mode)
    release_engine_memory: bool | Literal["auto"] = "auto"


class EnvParams(Params):
    """The environment RL rolls out in: a kind of the registry (components/environments.py)."""

    # travel: TravelPlanner queries (--world, --queries), the strict evaluator and the STAR reward kinds;
    # toolstar: Tool-Star tasks (--queries is the task file, --qa the corpus, --toolstar-params the retriever and
    # sandbox) and Tool-Star's reward (rl.reward is travel's and is not read); qa: questions (--queries) over --qa
    kind: str = "travel"  # checked against the registry when the run loads its task source
    failure_rate: float = Field(0.0, ge=0, le=1)  # injected tool failures (environment-stability ablation; travel)


class EvalParams(Params):
    """Greedy decoding on held-out queries during training (verl's `test_freq`), scored like the validate stage.

    The sampled reward curve and greedy validation can part ways, so this logs the validation metrics at step 0 (the
    start model), every `every` steps, and at the last step. Off when `every` is null. Logging only: nothing is
    selected by these numbers."""

    every: int | None = Field(None, gt=0)  # steps between evaluations (null: off)
    max_queries: int | None = Field(None, gt=0)  # the first N held-out queries (null: all of them)


class DistributedParams(Params):
    """How the update runs: `strategy: none` is data parallel over `processes` replicas (each rolls out its share
    of a step's groups; gradients summed over them; gloo on CPUs, NCCL on GPUs), which `star rl` starts under
    torchrun (components/training/launch.py; several machines: docs/operations.md). `deepspeed` is accelerate +
    DeepSpeed ZeRO in one process (the [gpu] extra). `fsdp2` shards the weights, gradients and optimiser state over
    the `processes` (torch FSDP2; components/training/rl/fsdp.py), with the data-parallel rollouts of `none`."""

    strategy: Literal["none", "deepspeed", "fsdp2"] = "none"
    zero_stage: Literal[2, 3] = 2
    gradient_checkpointing: bool = False
    processes: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _deepspeed_in_one_process(self) -> "DistributedParams":
        if self.processes > 1 and self.strategy == "deepspeed":
            raise ValueError(
                f"processes: {self.processes} with strategy: deepspeed: DeepSpeed RL trains in one process (its "
                "engine averages gradients over its data-parallel ranks, where the RL loss is each rank's share of "
                "the global batch); set strategy: fsdp2 (sharded) or none (replicas) for RL over several processes, or "
                "processes: 1")
        if self.processes == 1 and self.strategy == "fsdp2":
            raise ValueError("strategy: fsdp2 shards the model over several processes and processes is 1: set "
                             "processes: 2 or more (one per GPU), or strategy: none for one process")
        return self


class RLParams(Params):
    """Everything the `rl` stage reads."""

    algorithm: str = "grpo"  # a registered algorithm (algorithms.ALGORITHMS)
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    # schedule
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, gt=0)  # overrides epochs when set
    max_minutes: float | None = Field(None, gt=0)  # wall-clock budget: stop (checkpointed) after the step crossing it
    queries_per_step: int = Field(4, gt=0)
    # data size: train on the first max_queries RL queries at the file's easy:medium:hard mix (None: all of them)
    max_queries: int | None = Field(None, gt=0)
    num_generations: int = Field(8, gt=1)  # G, trajectories per query (ARPO: arpo.budget instead)
    # optimisation
    # 0 keeps the weights frozen: a control run rolled out on the same seeded draws (scripts/compare_rl_runs.py)
    learning_rate: float = Field(1e-6, ge=0)
    lr_scheduler_type: Literal["constant", "cosine", "linear"] = "constant"
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    adam_epsilon: float = Field(1e-8, gt=0)  # AdamW's eps: far above the gradients' scale, steps follow the gradient
    max_grad_norm: float = Field(1.0, gt=0)
    num_iterations: int = Field(1, gt=0)  # passes over each step's rollouts (TRL's num_iterations; PPO epochs)
    mini_batch_size: int | None = Field(None, gt=0)  # trajectories per optimizer step (None: the whole step)
    micro_batch_size: int = Field(4, gt=0)  # trajectories per forward/backward (gradient accumulation)
    # pi_old: the trainer's (recompute; read off the update's own pass when a step is one optimizer step) or the
    # sampler's (rollout: vLLM's bf16 log-probs on GPU)
    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    # truncated importance sampling (verl's tis_imp_ratio_cap): weight each token's policy loss by
    # min(pi_old / pi_sampler, tis_cap) where the rollout engine returned log-probs (null: off; the mismatch itself is
    # logged every step as policy/logprob_mismatch and policy/sampler_kl)
    tis_cap: float | None = Field(None, gt=0)
    # objective
    epsilon: float = Field(0.2, ge=0)
    epsilon_high: float | None = Field(None, ge=0)  # None: = epsilon; DAPO's clip-higher 0.28
    beta: float = Field(0.0, ge=0)  # KL(pi || ref) coefficient (k3 estimator)
    entropy_coeff: float = 0.0  # loss -= entropy_coeff * H_t on sampled tokens (verl's sign: > 0 bonus, < 0 sharpens)
    # the update's named functions (null in the file: the algorithm's)
    loss_type: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"  # AGGREGATIONS
    scale_rewards: Literal["group", "batch", "none"] = "group"  # advantages.SCALES
    surrogate: Literal["clipped", "entropy_balanced"] = "clipped"  # losses.SURROGATES: PPO's, or AEPO's
    token_weighting: Literal["none", "entropy_aware"] = "none"  # advantages.TOKEN_WEIGHTINGS: AEPO's entropy-aware
    max_completion_length: int = Field(4096, gt=0)  # Dr.GRPO's constant L_max
    # the environment's own reward params (its source module's REWARD_PARAMS; travel: the STAR kinds, weights,
    # curriculum boundaries and format reward), parsed for env.kind
    reward: SerializeAsAny[RewardParams] = Field(default_factory=lambda: environments.reward_params("travel")())
    dynamic_sampling: DynamicSamplingParams = DynamicSamplingParams()
    overlong: OverlongParams = OverlongParams()
    arpo: ArpoParams = ArpoParams()
    aepo: AepoParams = AepoParams()
    rollout: RolloutParams = RolloutParams()
    env: EnvParams = EnvParams()
    eval: EvalParams = EvalParams()
    distributed: DistributedParams = DistributedParams()
    lora: LoraParams = LoraParams()
    # checkpoints
    checkpoint_every: int = Field(1, gt=0)  # steps between checkpoints
    keep_checkpoints: int = Field(2, gt=0)

    @field_validator("algorithm")
    @classmethod
    def _registered(cls, name: str) -> str:
        get_algorithm(name)  # a ValueError that lists the registered algorithms
        return name

    @model_validator(mode="before")
    @classmethod
    def _environment_reward(cls, data: Any) -> Any:
        """`reward` parsed as the reward params of `env.kind`'s environment (one model, one set of defaults)."""
        if not isinstance(data, dict) or isinstance(data.get("reward"), RewardParams):
            return data
        env = data.get("env")
        kind = env.get("kind", "travel") if isinstance(env, dict) else env.kind if isinstance(env, EnvParams) else "travel"
        environments.check_kind(kind)  # a ValueError naming the registered kinds
        try:
            reward = environments.reward_params(kind).model_validate(data.get("reward") or {})
        except ValidationError as exc:
            problems = "; ".join(f"reward.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"{problems} (the rl.reward params of env.kind {kind})") from None
        return {**data, "reward": reward}

    @model_validator(mode="before")
    @classmethod
    def _algorithm_defaults(cls, data: Any) -> Any:
        """Fill the knobs the algorithm defines from its registration unless the file sets them."""
        if not isinstance(data, dict):
            return data
        for (section, key), instead in REPLACED_SWITCHES.items():
            if isinstance(data.get(section), dict) and key in data[section]:
                raise ValueError(f"{section}.{key} is no longer a param: {instead}; delete the key")
        try:
            algorithm = get_algorithm(data.get("algorithm", "grpo"))
        except ValueError:
            return data  # the field validator reports the bad name
        merged = with_defaults(data, algorithm)
        trl_name = merged.get("loss_type")
        if isinstance(trl_name, str) and trl_name in TRL_LOSS_TYPES:
            raise ValueError(f"loss_type: {trl_name!r} is TRL's name; here each aggregation has one name: write "
                             f"loss_type: {TRL_LOSS_TYPES[trl_name].split(' ')[0]} (TRL's {trl_name} = "
                             f"{TRL_LOSS_TYPES[trl_name]}), or null for the algorithm's default")
        return merged

    @model_validator(mode="after")
    def _whole_groups_per_rank(self) -> "RLParams":
        processes = self.distributed.processes
        if self.queries_per_step % processes:
            raise ValueError(f"queries_per_step ({self.queries_per_step}) must be a multiple of "
                             f"distributed.processes ({processes}): each process rolls out whole groups, the same "
                             "number of queries")
        if self.mini_batch_size is not None and self.mini_batch_size % processes:
            raise ValueError(f"mini_batch_size ({self.mini_batch_size}) must be a multiple of distributed.processes "
                             f"({processes}): each process takes an equal share of every mini-batch")
        return self

    @model_validator(mode="after")
    def _lora_with_plain_torch(self) -> "RLParams":
        if self.lora.enabled and self.distributed.strategy != "none":
            raise ValueError(f"lora.enabled trains adapters with the plain torch optimiser and distributed.strategy "
                             f"is {self.distributed.strategy}: set distributed.strategy: none (LoRA's training state "
                             "is small; data parallel over distributed.processes still works), or lora.enabled: false "
                             "to shard full weights")
        return self

    @model_validator(mode="after")
    def _travel_only_knobs(self) -> "RLParams":
        kind = self.env.kind
        if kind != "travel" and self.env.failure_rate > 0:
            raise ValueError(f"env.failure_rate injects travel tool failures; it must be 0 with env.kind: {kind}")
        return self

    @property
    def reward_kind(self) -> str:
        """The reward a run trains on: the environment's reward kind (travel: the STAR kind)."""
        return self.reward.kind

    @property
    def spec(self) -> Algorithm:
        """The registered algorithm of `algorithm`."""
        return get_algorithm(self.algorithm)

    @property
    def group_size(self) -> int:
        """Trajectories per query: arpo.budget for a tree sampler (ARPO, AEPO), num_generations otherwise."""
        return self.arpo.budget if self.spec.tree else self.num_generations

    def total_steps(self, num_queries: int) -> int:
        """max_steps, or enough steps for `epochs` passes over the queries."""
        if self.max_steps is not None:
            return self.max_steps
        return max(1, math.ceil(self.epochs * num_queries / self.queries_per_step))
