"""The RL trainer: a lean loop of our own over steps, readable top to bottom in `train` (docs/architecture.md, "The
RL trainer", places it in the pipeline).

Per step:
  1. sample a batch of queries (the data cursor);
  2. roll out G trajectories per query through the shared agent loop, by the algorithm's sampler
     (components/training/rl/samplers.py; ARPO: entropy-guided branching; AEPO: the same tree with entropy
     pre-monitoring and a consecutive-branch penalty; DAPO: dynamic sampling until the batch holds informative
     groups);
  3. score each trajectory with the task source of `rl.env.kind` (components/environments.py; travel: the strict
     evaluator and the STAR reward kind from params, progress = step/total; toolstar: Tool-Star's reward);
  4. group-relative advantages;
  5. PPO-style update(s) with gradient accumulation, grad clipping and the LR schedule; push weights to the engine;
  6. append a row to plots/rl/rewards.csv, checkpoint every k steps, then log every metric to MLflow (after the
     checkpoint: a tracking stall or crash never costs a finished step);
  7. with `rl.eval.every`, decode the held-out records greedily (step 0, every k steps, the last step) and score them
     with the environment's evaluation and summary (travel: the validate stage's strict metrics and checks): MLflow
     `eval/*` and a row of plots/rl/eval.csv.
On start it resumes from the newest complete checkpoint: a killed run restarts without redoing finished steps, and
its MLflow run links to the one it continues (`star.resumed_from_run`: the run id kept in the checkpoint).
"""
from __future__ import annotations

import csv
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from tqdm.auto import tqdm

from components import environments
from components.agent.environment import SourceInputs, TaskSource
from components.agent.loop import run_episodes
from components.errors import UserError
from components.models.checkpoints import save_checkpoint as save_hf
from components.models.checkpoints import write_manifest
from components.models.loading import load_policy_model, load_tokenizer, resolve_device, resolve_dtype
from components.training.rl import checkpoint as ckpt
from components.training.rl.advantages import group_advantages
from components.training.rl.cursor import QueryCursor
from components.training.rl.distributed import SINGLE, Ranks, init_ranks, shard
from components.training.rl.adamw import Optimizer
from components.training.rl.engine import RolloutEngine
from components.training.rl.lora import attach_lora, merged_model, save_adapters
from components.training.rl.params import RLParams
from components.training.rl.rollout_backends import PolicyInputs, RolloutBackend, rollout_backend, rollout_sampling
from components.training.rl.samplers import SamplerInputs, Scored, StepBatch, collect_rollouts
from components.training.rl.strategies import Strategy, build_optimizer, get_strategy
from components.training.rl.update import Rollout, UpdateConfig, fill_logprobs, rollout_from_record, update_policy
from components.training.rl.weight_sync import WeightSync

if TYPE_CHECKING:  # annotations only
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

LogFn = Callable[[dict, int], None]
TagFn = Callable[[dict], None]
RUN_ID_KEY = "mlflow_run_id"  # in a checkpoint's state: the MLflow run that trained up to it
WORLD_SIZE_KEY = "world_size"  # in a checkpoint's state: the number of data-parallel processes that trained it
THROUGHPUT_TOTALS = ("rollout_tokens", "rollout_seconds", "update_tokens", "update_seconds")
T = TypeVar("T")


@dataclass
class RLPaths:
    model: Path
    world: Path
    queries: Path
    out: Path
    checkpoints: Path
    metrics: Path
    plots: Path
    eval_queries: Path | None = None  # held-out queries for `rl.eval` (the validation queries)
    qa: Path | None = None  # rl.env.kind toolstar: the QA stage's folder (the search tool's corpus.jsonl)
    toolstar_params: Path | None = None  # rl.env.kind toolstar: params/toolstar.yaml (retriever, sandbox, reward)

    @property
    def rewards_csv(self) -> Path:
        return self.plots / "rewards.csv"

    @property
    def eval_csv(self) -> Path:
        return self.plots / "eval.csv"


# ---- small helpers (pure) ----------------------------------------------------------------------------------------

def rank_seed(seed: int, ranks: Ranks) -> int:
    """The seed of this rank's rollouts and generators: rl.seed on rank 0 (a one-process run is unchanged), a
    distinct one on every other rank."""
    return seed + 1_000_033 * ranks.rank


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def progress_of(step: int, total_steps: int) -> float:
    """Training progress in [0, 1) at the start of `step` (1-based): what CURRICULUM's boundaries compare with."""
    return (step - 1) / max(total_steps, 1)


def episode_metrics(records: list[dict]) -> dict[str, float]:
    """Response length, turns, tool calls, tool error rate and termination shares of a step's rollouts."""
    n = max(len(records), 1)
    calls = sum(r.get("num_tool_calls", 0) for r in records)
    out = {
        "episode/sampled_tokens": sum(sum(r.get("response_mask") or []) for r in records) / n,
        "episode/response_tokens": sum(len(r.get("response_ids") or []) for r in records) / n,
        "episode/turns": sum(r.get("num_turns", 0) for r in records) / n,
        "episode/tool_calls": calls / n,
        "episode/tool_error_rate": sum(r.get("num_tool_errors", 0) for r in records) / max(calls, 1),
        "episode/protocol_errors": sum(r.get("num_protocol_errors", 0) for r in records) / n,
        "episode/delivered": sum(r.get("plan") is not None for r in records) / n,
    }
    for reason in ("answer", "turn_limit", "context_limit", "token_limit", "protocol_errors"):
        out[f"termination/{reason}"] = sum(r.get("termination") == reason for r in records) / n
    return out


def reward_metrics(scored: list[Scored]) -> dict[str, float]:
    """Reward mean/std and the mean of each component."""
    rows = [s.reward.row() for s in scored]
    if not rows:
        return {}
    totals = [row["reward"] for row in rows]
    out = {"reward/mean": statistics.fmean(totals), "reward/std": statistics.pstdev(totals)}
    for key in rows[0]:
        if key != "reward":
            out[f"reward/{key}"] = statistics.fmean(row[key] for row in rows)
    out["reward/format_error_rate"] = out.pop("reward/format_error")
    return out


def csv_row(step: int, metrics: dict[str, float], columns: list[str]) -> dict[str, float]:
    """The plots/rl/rewards.csv row of a step: `columns` (the task source's) from the step's `reward/*` metrics."""
    row = {"step": step, "reward": metrics.get("reward/mean", 0.0), "reward_std": metrics.get("reward/std", 0.0)}
    return {k: row[k] if k in row else metrics.get(f"reward/{k}", 0.0) for k in columns}


def write_rewards_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Rewrite the reward curve from the history (the rows of the checkpoint a run resumed from)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def append_rewards_csv(path: Path, row: dict) -> None:
    with path.open("a", newline="") as handle:
        csv.DictWriter(handle, fieldnames=list(row)).writerow(row)
        handle.flush()


# ---- greedy evaluation during training ---------------------------------------------------------------------------

def eval_columns(source: TaskSource) -> list[str]:
    """plots/rl/eval.csv's columns: the step, the environment's set metrics and its checks' pass rates."""
    return ["step", *source.eval_metrics, *source.eval_checks]


def evaluation_due(step: int, every: int | None, last_step: int) -> bool:
    """Whether to evaluate after `step` (0: the start model, before any update): step 0, every `every` steps and the
    last step; never when `every` is None."""
    return every is not None and (step == 0 or step % every == 0 or step == last_step)


def eval_row(step: int, summary: dict) -> dict:
    """The eval.csv row of one evaluation from the task source's summary."""
    return {"step": step, **summary}


def eval_metrics(row: dict, source: TaskSource) -> dict[str, float]:
    """MLflow's `eval/*` metrics of an eval.csv row (checks as `eval/checks/<name>`; a check no record sets is left
    out)."""
    return {f"eval/{key}" if key in source.eval_metrics else f"eval/checks/{key}": value
            for key, value in row.items() if key != "step" and value is not None}


def load_held_out(params: RLParams, paths: RLPaths, source: TaskSource) -> TaskSource | None:
    """`rl.eval`'s held-out records (None when it is off): the run's environment `source` over the records of
    `paths.eval_queries` (the first `rl.eval.max_queries`; travel: at the file's level mix)."""
    if params.eval.every is None:
        return None
    if paths.eval_queries is None or not Path(paths.eval_queries).exists():
        raise UserError(f"rl.eval.every is set but the held-out query file {paths.eval_queries} does not exist: pass "
                        "--eval-queries data/queries/val.jsonl (made by `dvc repro queries`), or set rl.eval.every: "
                        "null")
    return source.held_out(Path(paths.eval_queries), params.eval.max_queries)


def evaluate_greedy(engine: RolloutEngine, backend: RolloutBackend, held_out: TaskSource) -> dict:
    """The summary of the engine's policy decoded greedily on the held-out records (the rollouts' limits)."""
    episodes = [held_out.episode(item, seed=i) for i, item in enumerate(held_out.items)]
    records = run_episodes(episodes, backend.greedy(engine.policy), engine.limits, tokenizer=engine.tokenizer,
                           evaluate=held_out.evaluate, progress=False)
    return held_out.summary(records)


def write_eval_csv(path: Path, rows: list[dict], source: TaskSource) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=eval_columns(source))
        writer.writeheader()
        writer.writerows(rows)


# ---- setting up a run ----------------------------------------------------------------------------------------

def source_inputs(params: RLParams, paths: RLPaths) -> SourceInputs:
    """What the environment of `rl.env.kind` reads: the task file and the environment's other inputs."""
    files = {"world": paths.world, "qa": paths.qa, "params": paths.toolstar_params}
    return SourceInputs(tasks=paths.queries, files=files, max_items=params.max_queries, failure_rate=params.env.failure_rate,
                        reward=params.reward)


def load_task_source(params: RLParams, paths: RLPaths) -> TaskSource:
    """The run's task source: the records of `rl.env.kind`'s environment it draws (components/environments.py)."""
    return environments.load_source(params.env.kind, source_inputs(params, paths))


@dataclass
class Parts:
    """What the loop works with, built once per run (from the newest checkpoint when resuming)."""

    tokenizer: PreTrainedTokenizerBase
    optimizer: Optimizer  # holds the trained model (FSDP: its shards)
    engine: RolloutEngine
    backend: RolloutBackend  # builds the rollout policy, its greedy twin and its weight sync
    sync: WeightSync
    ref_model: PreTrainedModel | None  # the frozen reference of the KL term (beta > 0)
    update_config: UpdateConfig
    pad_id: int
    ranks: Ranks = SINGLE  # the data-parallel ranks (rl.distributed.processes)
    adapters: object = None  # rl.lora: the PeftModel owning the adapters (checkpoints hold them alone)


def load_trained_model(params: RLParams, paths: RLPaths, source: Path, strategy: Strategy, device: str):
    """The model to train and, with LoRA, the PeftModel owning its adapters (else None). The plain torch optimiser
    steps float32 master weights and the update computes in rl.dtype under autocast (bf16 weights under plain AdamW
    lose small updates: at lr 1e-6 one step moves ~2% of them); DeepSpeed's bf16 mode keeps its own float32 master
    copy; FSDP2 shards float32 master weights, and a sharded checkpoint holds no Hugging Face weights, so its model
    starts as the input model and the shards are loaded."""
    if params.lora.enabled:  # a frozen base in rl.dtype (always the stage's input model) and float32 adapters
        model = load_policy_model(paths.model, dtype=params.dtype, device=device)
        return attach_lora(model, params.lora, adapter_dir=None if source == paths.model else source)
    model = load_policy_model(paths.model if strategy.sharded else source, dtype=strategy.weights_dtype(params),
                              device=device)
    return model, None


def update_config(params: RLParams, compute_dtype: torch.dtype, strategy: Strategy,
                  backend: RolloutBackend) -> UpdateConfig:
    """The update's settings: the objective's named functions and coefficients, the batch sizes, the autocast of a
    strategy that computes over float32 weights, and the mismatch measurement of a separate rollout engine."""
    return UpdateConfig(epsilon=params.epsilon, epsilon_high=params.epsilon_high, beta=params.beta,
                        loss_type=params.loss_type, max_completion_length=params.max_completion_length,
                        num_iterations=params.num_iterations, mini_batch_size=params.mini_batch_size,
                        micro_batch_size=params.micro_batch_size, temperature=params.rollout.temperature,
                        recompute_old_logprobs=params.old_logprobs == "recompute",
                        entropy_coeff=params.entropy_coeff, surrogate=params.surrogate,
                        token_weighting=params.token_weighting,
                        entropy_advantage_coef=params.aepo.entropy_advantage_coef,
                        autocast_dtype=compute_dtype if strategy.autocast and compute_dtype != torch.float32 else None,
                        tis_cap=params.tis_cap, mismatch_every_step=backend.separate_engine)


def build_parts(params: RLParams, paths: RLPaths, tasks: TaskSource, source: Path, total_steps: int,
                device: str, ranks: Ranks = SINGLE) -> Parts:
    """Load the policy from `source` (the SFT model or a checkpoint), the reference model (beta > 0), the optimiser
    of the training strategy, the rollout policy of the rollout backend and its engine (in the environment of the
    task source `tasks`), and the weight sync between them."""
    strategy = get_strategy(params.distributed.strategy)
    backend = rollout_backend(params.rollout.backend, device)
    compute_dtype = resolve_dtype(params.dtype, device)
    model, adapters = load_trained_model(params, paths, source, strategy, device)
    tokenizer = load_tokenizer(source)
    if params.distributed.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if adapters is not None:
            model.enable_input_require_grads()  # the frozen embeddings would cut the checkpointed graph
    ref_model = None
    if params.beta > 0:  # the reference is the stage's input model, also when resuming
        ref_model = load_policy_model(paths.model, dtype=params.dtype, device=device).eval()
        ref_model.requires_grad_(False)
    optimizer = build_optimizer(model, params, total_steps, ranks)
    seed = rank_seed(params.seed, ranks)  # each rank samples its own episodes
    # a LoRA checkpoint holds adapters only, a sharded one no Hugging Face weights: the engine loads the input model
    # and gets the trained weights by the weight sync. A sharded model samples through a full copy of its own (its
    # forward is a collective, and each rank's episodes differ in length).
    engine_source = paths.model if adapters is not None or strategy.sharded else source
    sampler = load_policy_model(paths.model, dtype=params.dtype, device=device).eval() if strategy.sharded \
        else optimizer.unwrap()
    sampling = rollout_sampling(params.rollout, seed, dtype=str(compute_dtype).removeprefix("torch."))
    policy = backend.build(PolicyInputs(sampler, tokenizer, str(engine_source), sampling, device))
    engine = RolloutEngine(policy, tokenizer, tasks, params.rollout.to_limits(), seed=seed,
                           entropy_tokens=params.arpo.entropy_tokens)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    sync = backend.weight_sync(policy, strategy.sharded)
    if adapters is not None and source != paths.model:
        sync.push(optimizer.unwrap())  # the resumed adapters, merged, before the first rollout
    return Parts(tokenizer, optimizer, engine, backend, sync, ref_model,
                 update_config(params, compute_dtype, strategy, backend), pad_id, ranks, adapters)


@dataclass
class TrainingRun:
    """What `train` carries from step to step: the data, the parts, where it resumed and the curves so far."""

    queries: list  # the task source's records (travel: Query; toolstar: Task)
    held_out: TaskSource | None  # the held-out records of `rl.eval` (None: off)
    total_steps: int
    fingerprint: dict[str, str]  # the inputs' hashes that every checkpoint of the run records
    parts: Parts
    cursor: QueryCursor
    resumed_from: int  # the step of the checkpoint the run resumed from (0: a fresh run)
    run_id: str | None  # the tracking run the checkpoints name
    history: list[dict]  # the rows of rewards.csv
    eval_history: list[dict]  # the rows of eval.csv
    started: float  # time.perf_counter() when the run started (rl.max_minutes counts from it)
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(THROUGHPUT_TOTALS, 0.0))

    def next_queries(self, n: int) -> list:
        """The next `n` queries of the data cursor."""
        return [self.queries[i] for i in self.cursor.next_batch(n)]

    def out_of_time(self, max_minutes: float | None) -> bool:
        return max_minutes is not None and time.perf_counter() - self.started > max_minutes * 60


def input_fingerprint(params: RLParams, paths: RLPaths, tasks: TaskSource) -> dict[str, str]:
    """What a run trains from, hashed: the params (less the throughput knobs and budgets of
    `ckpt.RESUMABLE_PARAM_CHANGES`) as the task source keys them, the input model and the source's input files (travel:
    the world and the RL queries; Tool-Star: the task file and the search corpus). A run resumes only from a checkpoint
    with the same fingerprint; the held-out queries of rl.eval only log, so turning the evaluation on or off keeps
    the checkpoints."""
    dump = get_strategy(params.distributed.strategy).fingerprint(params.model_dump(mode="json"))
    keyed, files = tasks.fingerprint(dump)
    return ckpt.fingerprint(keyed, {"model": paths.model, **files})


def start_run(params: RLParams, paths: RLPaths, tag: TagFn, run_id: str | None) -> TrainingRun:
    """Load the data and build the parts; when the newest checkpoint was trained from the same inputs, resume from
    it (weights, optimizer, RNG, data cursor, curves) and tag the tracking run with the run it continues. Rewrites
    both curves' files from the history it starts with."""
    started = time.perf_counter()
    device = resolve_device(params.device)
    ranks = init_ranks(device, params.distributed.processes)
    tasks = load_task_source(params, paths)
    queries = tasks.items
    held_out = load_held_out(params, paths, tasks) if ranks.main else None  # rank 0 evaluates and logs
    total_steps = params.total_steps(len(queries))
    seed_everything(rank_seed(params.seed, ranks))
    inputs = input_fingerprint(params, paths, tasks=tasks)
    resume_dir, state = agreed_checkpoint(paths.checkpoints, inputs, ranks,
                                          reshardable=get_strategy(params.distributed.strategy).reshardable)
    parts = build_parts(params, paths, tasks, resume_dir or paths.model, total_steps, device, ranks=ranks)
    if resume_dir is not None:
        parts.optimizer.load(resume_dir)
        if int(state.extra.get(WORLD_SIZE_KEY, 1)) == ranks.size:
            ckpt.restore_checkpoint_rng(resume_dir, ranks.rank)
        elif ranks.main:  # resharded (fsdp2): the ranks keep the generators seeded for them at the start
            print(f"[rl] {resume_dir} was trained by {state.extra[WORLD_SIZE_KEY]} processes and this run has "
                  f"{ranks.size}: its shards are resharded; each rank's generator states start fresh")
        if ranks.main:
            print(f"[rl] resumed from {resume_dir} (step {state.step} of {total_steps})")
        tag(resume_tags(state))
    if parts.optimizer.sharded:
        parts.sync.push(parts.optimizer.unwrap())  # the (loaded) shards to the engine's copy, before the first rollout
    run = TrainingRun(
        queries=queries, held_out=held_out, total_steps=total_steps, fingerprint=inputs, parts=parts,
        cursor=QueryCursor.from_state(state.cursor, len(queries), params.seed), resumed_from=state.step,
        run_id=run_id or state.extra.get(RUN_ID_KEY),  # an untracked part links the next one to the last tracked one
        history=list(state.history), eval_history=list(state.extra.get("eval_history", [])), started=started)
    if ranks.main:
        write_rewards_csv(paths.rewards_csv, run.history, tasks.reward_columns)  # `dvc repro` deleted it; the
        # checkpoint's rows come back
        write_eval_csv(paths.eval_csv, run.eval_history, tasks)  # header only when rl.eval is off: DVC expects it
    return run


def agreed_checkpoint(root: Path, inputs: dict[str, str], ranks: Ranks,
                      reshardable: bool = False) -> tuple[Path | None, ckpt.TrainState]:
    """The checkpoint every rank resumes from: rank 0 clears partial ones and picks (`resumable_checkpoint`), the
    others take its choice; a checkpoint written by another number of processes is refused unless it is
    `reshardable` (sharded fsdp2 state, which DCP loads onto any number of processes)."""
    chosen = None
    if ranks.main:
        ckpt.remove_partial(root)
        chosen, _ = resumable_checkpoint(root, inputs)
    chosen = ranks.gather(None if chosen is None else str(chosen))[0]
    if chosen is None:
        return None, ckpt.TrainState()
    state = ckpt.load_state(chosen)
    trained_with = int(state.extra.get(WORLD_SIZE_KEY, 1))
    if trained_with != ranks.size and not reshardable:
        raise UserError(f"checkpoint {chosen} was trained by {trained_with} process(es) and this run has "
                        f"{ranks.size}: each rank's sampling state cannot be mapped onto another number of ranks. "
                        f"Set rl.distributed.processes: {trained_with} to resume it, or move {root} away to start "
                        "over")
    return Path(chosen), state


# ---- one step ------------------------------------------------------------------------------------------------

def timed(fn: Callable[..., T], *args) -> tuple[T, float]:
    """`fn(*args)` and the seconds it took."""
    start = time.perf_counter()
    return fn(*args), time.perf_counter() - start


def rollout_step(run: TrainingRun, params: RLParams, step: int, progress: float) -> StepBatch:
    """Steps 1-3: the cursor's next queries rolled out through the agent loop and scored by the strict evaluator,
    seeded by (seed, step) so that a resumed run redraws the same step."""
    engine, ranks = run.parts.engine, run.parts.ranks
    engine.begin_step(step)
    engine.evaluation_seconds = 0.0
    draw = lambda n: shard(run.next_queries(n), ranks)  # noqa: E731 (every rank draws alike, then takes its share)
    return collect_rollouts(SamplerInputs(engine, draw(params.queries_per_step), draw, params, progress,
                                          random.Random(rank_seed(params.seed, ranks) * 1_000_003 + step), ranks))


def step_advantages(groups: list[list[Scored]], scale_rewards: str) -> tuple[list[Scored], list[float]]:
    """Step 4: the trained trajectories in order and their group-relative advantages."""
    scored = [s for group in groups for s in group]
    if not scored:
        return scored, []
    group_ids = torch.tensor([g for g, group in enumerate(groups) for _ in group])
    rewards = torch.tensor([s.reward.total for s in scored], dtype=torch.float64)
    return scored, group_advantages(rewards, group_ids, scale_rewards).tolist()


def update_step(parts: Parts, params: RLParams, scored: list[Scored], advantages: list[float]) -> dict[str, float]:
    """Step 5: the PPO-style update(s) of the policy, one step of the LR schedule, and the new weights pushed to the
    rollout engine. `learning_rate: 0` is a frozen control (the same seeded rollouts, weights that never move): no
    update pass at all."""
    optimizer = parts.optimizer
    rollouts = [rollout_from_record(s.record, a) for s, a in zip(scored, advantages)]
    parts.sync.release()  # a sleeping vLLM engine leaves the update its GPU memory; the push below wakes it
    if params.learning_rate > 0:
        stats = update_policy(optimizer.model, optimizer, rollouts, parts.update_config, parts.pad_id,
                              ref_logprobs=reference_logprobs(parts, rollouts), ranks=parts.ranks)
    else:
        stats = {"optimizer_steps": 0}
    stats["lr"] = optimizer.lr
    optimizer.schedule_step()
    tensors, stats["weight_sync_s"] = timed(parts.sync.push, optimizer.unwrap())  # vLLM: parameter by parameter
    stats["weight_sync_tensors"] = tensors
    return stats


def reference_logprobs(parts: Parts, rollouts: list[Rollout]) -> list[list[float]] | None:
    """The reference model's log-probabilities of the rollouts' tokens (for the KL term); None without one."""
    if parts.ref_model is None or not rollouts:
        return None
    return fill_logprobs(parts.ref_model, rollouts, parts.update_config.micro_batch_size, parts.pad_id,
                         parts.update_config.temperature, overwrite=False)  # stored in rl.dtype: no autocast


def step_metrics(batch: StepBatch, stats: dict, seconds: dict[str, float], trained: int,
                 checks: Callable[[list[dict]], dict[str, float]]) -> dict[str, float]:
    """Every metric logged per step: rewards over every sampled trajectory (DAPO's dropped groups included),
    episodes, check pass rates, the update's statistics, times, throughput and batch sizes."""
    everything = [s for group in batch.sampled for s in group]
    records = [s.record for s in everything]
    sampled = sum(sum(r.get("response_mask") or []) for r in records)
    return {
        **reward_metrics(everything), **episode_metrics(records), **batch.extra,
        **{f"checks/{k}": v for k, v in checks(records).items()},
        **{f"policy/{k}": v for k, v in stats.items()},
        **{f"time/{k}_s": v for k, v in seconds.items()},
        "throughput/rollout_tokens_per_s": sampled / max(batch.rollout_seconds, 1e-9),
        "throughput/update_tokens_per_s": stats.get("processed_tokens", 0) / max(seconds["update"], 1e-9),
        "batch/trajectories": trained, "batch/sampled_tokens": sampled,
    }


COUNTED_EXTRAS = ("dapo/sampled_groups", "dapo/dropped_groups", "dapo/kept_groups", "arpo/initial_rollouts",
                  "arpo/branch_points", "arpo/branches", "arpo/fill_rollouts", "aepo/monitor_rollouts")
ROUND_EXTRAS = ("dapo/rounds", "arpo/rounds")


def combined_extras(extras: list[dict[str, float]]) -> dict[str, float]:
    """The ranks' sampling statistics as one step's: counts summed, rounds the most any rank ran, averages
    averaged."""
    out = {}
    for key in extras[0]:
        values = [extra.get(key, 0.0) for extra in extras]
        out[key] = sum(values) if key in COUNTED_EXTRAS else max(values) if key in ROUND_EXTRAS else \
            sum(values) / len(values)
    return out


def gathered_batch(batch: StepBatch, trained: int, ranks: Ranks) -> tuple[StepBatch, int]:
    """Rank 0's view of the step for its metrics: every rank's sampled groups (in rank order), their trajectory
    count, the slowest rank's rollout time and the ranks' sampling statistics (`combined_extras`); other ranks get
    their own batch back."""
    if ranks.size == 1:
        return batch, trained
    parts = ranks.gather((batch.sampled, batch.extra, batch.rollout_seconds, trained))
    if not ranks.main:
        return batch, trained
    merged = StepBatch(groups=[], sampled=[group for part in parts for group in part[0]],
                       rollout_seconds=max(part[2] for part in parts),
                       extra=combined_extras([part[1] for part in parts]))
    return merged, sum(part[3] for part in parts)


def record_step(run: TrainingRun, paths: RLPaths, step: int, metrics: dict[str, float],
                rollout_seconds: float) -> dict:
    """Add the step's row to the reward curve (the history and rewards.csv) and its tokens and seconds to the
    throughput totals; return the row."""
    row = csv_row(step, metrics, run.parts.engine.source.reward_columns)
    run.history.append(row)
    append_rewards_csv(paths.rewards_csv, row)
    run.totals["rollout_tokens"] += metrics["batch/sampled_tokens"]
    run.totals["rollout_seconds"] += rollout_seconds
    run.totals["update_tokens"] += metrics.get("policy/processed_tokens", 0)
    run.totals["update_seconds"] += metrics["time/update_s"]
    return row


def evaluate_step(run: TrainingRun, paths: RLPaths, step: int) -> dict[str, float]:
    """Step 7: greedy evaluation on the held-out queries after `step` (0: the start model); adds its row to
    eval.csv and returns its `eval/*` metrics and the seconds it took."""
    start = time.perf_counter()
    row = eval_row(step, evaluate_greedy(run.parts.engine, run.parts.backend, run.held_out))
    run.eval_history.append(row)
    write_eval_csv(paths.eval_csv, run.eval_history, run.held_out)
    return {**eval_metrics(row, run.held_out), "time/eval_s": time.perf_counter() - start}


def save_step(run: TrainingRun, paths: RLPaths, params: RLParams, step: int) -> None:
    """Checkpoint after `step`: weights, optimizer, RNG, data cursor, both curves, the inputs' fingerprint and the
    tracking run (keeping the newest `rl.keep_checkpoints`)."""
    optimizer, tokenizer, ranks = run.parts.optimizer, run.parts.tokenizer, run.parts.ranks
    rng_states = ranks.gather(ckpt.capture_rng())  # every rank's; rank 0 writes the checkpoint
    if optimizer.sharded:  # every rank writes its shards into the folder rank 0 prepares; rank 0 completes it
        tmp = ranks.gather(str(ckpt.begin_checkpoint(paths.checkpoints, step)) if ranks.main else None)[0]
        optimizer.save(Path(tmp))
    if not ranks.main:
        return
    state = ckpt.TrainState(step=step, cursor=run.cursor.state(), history=run.history,
                            extra={"eval_history": run.eval_history, "fingerprint": run.fingerprint,
                                   RUN_ID_KEY: run.run_id, WORLD_SIZE_KEY: ranks.size})
    if optimizer.sharded:
        save_weights(run.parts, Path(tmp), step=step)
        ckpt.finish_checkpoint(paths.checkpoints, Path(tmp), state, keep=params.keep_checkpoints,
                               rng_states=rng_states)
        return
    ckpt.save_checkpoint(paths.checkpoints, state, save_model=lambda d: save_weights(run.parts, d, step=step),
                         save_optimizer=optimizer.save, keep=params.keep_checkpoints, rng_states=rng_states)


def save_weights(parts: Parts, directory: Path, **manifest) -> None:
    """A checkpoint's weights: the model (or, with LoRA, its adapters alone, resumed onto the input model; sharded,
    none here: the shards are the optimiser's `save`) and the tokenizer."""
    if parts.optimizer.sharded:
        parts.tokenizer.save_pretrained(directory)
        write_manifest(directory, stage="rl", sharded=True, **manifest)
        return
    if parts.adapters is None:
        save_hf(parts.optimizer.unwrap(), parts.tokenizer, directory, stage="rl", **manifest)
        return
    directory.mkdir(parents=True, exist_ok=True)
    save_adapters(parts.adapters, directory)
    parts.tokenizer.save_pretrained(directory)
    write_manifest(directory, stage="rl", lora=True, **manifest)


def resume_tags(state: ckpt.TrainState) -> dict:
    """Tags of a run that resumes from `state`: the run it continues (when that one was tracked) and the step."""
    tags = {"star.resumed_from_step": state.step}
    if state.extra.get(RUN_ID_KEY):
        tags["star.resumed_from_run"] = state.extra[RUN_ID_KEY]
    return tags


# ---- the loop ------------------------------------------------------------------------------------------------

def train(params: RLParams, paths: RLPaths, log: LogFn = lambda metrics, step: None,
          progress_bar: bool = True, tag: TagFn = lambda tags: None, run_id: str | None = None) -> dict:
    """Run (or resume) RL training; write the final model, metrics/rl.json and plots/rl/rewards.csv; return the
    summary written to metrics/rl.json.

    `log(metrics, step)` and `tag(tags)` report to the tracking run `run_id`, which the checkpoints remember so that
    a resumed run is tagged with the run it continues.
    """
    run = start_run(params, paths, tag, run_id)
    try:
        return run_steps(run, params, paths, log, progress_bar)
    finally:
        run.parts.engine.policy.close()  # the vLLM engine process (the transformers backend has nothing to stop)


def run_steps(run: TrainingRun, params: RLParams, paths: RLPaths, log: LogFn, progress_bar: bool) -> dict:
    """`train`'s steps from where `run` starts, then the end of the run (`finish_run`)."""
    engine, ranks = run.parts.engine, run.parts.ranks
    if run.held_out is not None and run.resumed_from == 0:
        log(evaluate_step(run, paths, 0), 0)  # the start model
    bar = tqdm(range(run.resumed_from + 1, run.total_steps + 1), desc="rl", unit="step",
               disable=not (progress_bar and ranks.main), initial=run.resumed_from, total=run.total_steps)
    for step in bar:
        step_start = time.perf_counter()
        progress = progress_of(step, run.total_steps)
        # 1-3. queries -> rollouts through the agent loop -> strict-evaluator rewards
        batch = rollout_step(run, params, step, progress)
        # 4. group-relative advantages
        (scored, advantages), advantage_seconds = timed(step_advantages, batch.groups, params.scale_rewards)
        # 5. PPO-style update(s), LR schedule, weights to the rollout engine
        stats, update_seconds = timed(update_step, run.parts, params, scored, advantages)
        # 6. reward curve, checkpoint, then log (after the checkpoint: a tracking outage never costs a finished step)
        seconds = {"rollout": batch.rollout_seconds - engine.evaluation_seconds,  # the evaluator's share is reward
                   "reward": advantage_seconds + engine.evaluation_seconds, "update": update_seconds,
                   "step": time.perf_counter() - step_start}
        batch, trained = gathered_batch(batch, len(scored), ranks)  # every rank's rollouts, on rank 0
        out_of_time = bool(ranks.max(float(run.out_of_time(params.max_minutes))))  # all ranks stop together
        if ranks.main:
            metrics = {**step_metrics(batch, stats, seconds, trained, engine.source.checks),
                       "progress/epoch": run.cursor.epoch, "progress/fraction": progress}
            row = record_step(run, paths, step, metrics, batch.rollout_seconds)
            bar.set_postfix(reward=f"{row['reward']:.3f}", success=f"{row['success']:.2f}")
        to_log = [metrics] if ranks.main else []
        if run.held_out is not None and evaluation_due(step, params.eval.every,
                                                       last_step=step if out_of_time else run.total_steps):
            to_log.append(evaluate_step(run, paths, step))  # 7. greedy evaluation on the held-out queries
        if step % params.checkpoint_every == 0 or step == run.total_steps or out_of_time:
            save_step(run, paths, params, step)
        for logged in to_log:
            log(logged, step)
        if out_of_time:
            if ranks.main:
                print(f"[rl] stopping after step {step} of {run.total_steps}: rl.max_minutes={params.max_minutes} "
                      "reached")
            break
    bar.close()
    return finish_run(run, params, paths)


# ---- the end of a run ----------------------------------------------------------------------------------------

def finish_run(run: TrainingRun, params: RLParams, paths: RLPaths) -> dict:
    """Save the final model and write metrics/rl.json (rank 0); return its summary (empty on other ranks). A
    sharded model is first gathered, whole, onto rank 0's CPU."""
    gathered = run.parts.optimizer.full_state_dict()  # a sharded model: gathered by every rank, onto rank 0
    if not run.parts.ranks.main:
        return {}
    final = run.parts.optimizer.unwrap() if run.parts.adapters is None else merged_model(run.parts.adapters)
    save_hf(final, run.parts.tokenizer, paths.out, state_dict=gathered, stage="rl", steps=run.total_steps,
            algorithm=params.algorithm, reward=params.reward_kind, lora=run.parts.adapters is not None)
    summary = summarize(run.history, run.total_steps, run.resumed_from, run.totals,
                        time.perf_counter() - run.started, params)
    if run.eval_history:
        summary["eval"] = {"first": run.eval_history[0], "last": run.eval_history[-1]}
    paths.metrics.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_json_atomic(paths.metrics, summary)
    print(f"[rl] model -> {paths.out}; metrics -> {paths.metrics}; reward curve -> {paths.rewards_csv}; "
          f"checkpoints -> {paths.checkpoints}")
    return summary


def resumable_checkpoint(root: Path, inputs: dict[str, str]) -> tuple[Path | None, ckpt.TrainState]:
    """The newest checkpoint under `root` and its state when it was trained from `inputs`; else (None, a fresh
    state), after moving the other run's checkpoints aside (`ckpt.set_aside`, with the reason) and saying so."""
    newest = ckpt.newest_checkpoint(root)
    if newest is None:
        return None, ckpt.TrainState()
    state = ckpt.load_state(newest)
    changed = ckpt.changed_inputs(state.extra.get("fingerprint"), inputs)
    if not changed:
        return newest, state
    reason = (f"not resuming from {newest} (step {state.step}): it was trained from other inputs "
              f"({', '.join(changed)} changed)")
    kept = ckpt.set_aside(root, reason)
    print(f"[rl] {reason}; moved its checkpoints to {kept} (delete that folder when they are no longer needed) "
          "and starting from step 0")
    return None, ckpt.TrainState()


def window_stats(rows: list[dict], episodes_per_step: int) -> tuple[float, float]:
    """(mean, standard error) of the episode rewards of `rows` (steps), pooled from each step's mean and std."""
    n = len(rows) * episodes_per_step
    mean = statistics.fmean(row["reward"] for row in rows)
    variance = sum(row.get("reward_std", 0.0) ** 2 + (row["reward"] - mean) ** 2 for row in rows) / len(rows)
    return mean, math.sqrt(variance / max(1, n - 1))


def reward_trend(history: list[dict], episodes_per_step: int) -> dict:
    """The reward curve's first fifth of steps against its last fifth: means, the standard error of their
    difference, and `rising` = (last - first) > 2 x that error (the tiny preset's acceptance test)."""
    if len(history) < 2:
        return {"rising": None}
    k = max(1, len(history) // 5)
    first, first_se = window_stats(history[:k], episodes_per_step)
    last, last_se = window_stats(history[-k:], episodes_per_step)
    se = math.sqrt(first_se ** 2 + last_se ** 2)
    return {"first_fifth_mean": first, "last_fifth_mean": last, "difference": last - first,
            "difference_se": se, "steps_per_fifth": k, "rising": bool(last - first > 2 * se)}


def summarize(history: list[dict], total_steps: int, resumed_from: int, totals: dict, wall_seconds: float,
              params: RLParams) -> dict:
    """metrics/rl.json: steps, first/last/best reward, success, throughput, wall time."""
    rewards = [row["reward"] for row in history]
    tail = history[-max(1, len(history) // 5):] if history else []
    return {
        "algorithm": params.algorithm,
        "reward_kind": params.reward_kind,
        "steps": total_steps,
        "steps_completed": len(history),  # fewer than `steps` when rl.max_minutes stopped the run
        "resumed_from_step": resumed_from,
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "reward_best": max(rewards) if rewards else None,
        "reward_last_20pct_mean": statistics.fmean(r["reward"] for r in tail) if tail else None,
        "success_last_20pct_mean": statistics.fmean(r["success"] for r in tail) if tail else None,
        "format_error_rate_last": history[-1]["format_error_rate"] if history else None,
        "rollout_tokens_per_s": totals["rollout_tokens"] / max(totals["rollout_seconds"], 1e-9),
        "update_tokens_per_s": totals["update_tokens"] / max(totals["update_seconds"], 1e-9),
        "wall_seconds_this_run": wall_seconds,
        "reward_trend": reward_trend(history, params.queries_per_step * params.group_size),
    }

