"""The RL trainer: a readable loop over steps (TRAINING.md "RL: a lean trainer of our own").

Per step:
  1. sample a batch of queries (the data cursor);
  2. roll out G trajectories per query through the shared agent loop (ARPO: entropy-guided branching; DAPO:
     dynamic sampling until the batch holds informative groups);
  3. score each trajectory with the strict evaluator and the STAR reward (kind from params; progress = step/total);
  4. group-relative advantages;
  5. PPO-style update(s) with gradient accumulation, grad clipping and the LR schedule; push weights to the engine;
  6. append a row to plots/rl/rewards.csv, checkpoint every k steps, then log every metric to MLflow (after the
     checkpoint: a tracking stall or crash never costs a finished step);
  7. with `rl.eval.every`, decode the held-out queries greedily (step 0, every k steps, the last step) and score them
     as the validate stage does (`run_validation`): MLflow `eval/*` and a row of plots/rl/eval.csv.
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

from components.errors import UserError
from components.training.rl import checkpoint as ckpt
from components.training.rl.params import RLParams

REWARD_COLUMNS = ["step", "reward", "reward_std", "task_reward", "cs_micro", "hard_micro", "cs_macro", "hard_macro",
                  "success", "format_error_rate"]
EVAL_METRICS = ["delivery_rate", "commonsense_micro", "commonsense_macro", "hard_micro", "hard_macro", "final_pass"]
LogFn = Callable[[dict, int], None]
TagFn = Callable[[dict], None]
RUN_ID_KEY = "mlflow_run_id"  # in a checkpoint's state: the MLflow run that trained up to it


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

    @property
    def rewards_csv(self) -> Path:
        return self.plots / "rewards.csv"

    @property
    def eval_csv(self) -> Path:
        return self.plots / "eval.csv"


@dataclass
class Scored:
    """A finished rollout and its reward."""

    record: dict
    reward: object  # rewards.TrajectoryReward


@dataclass
class StepBatch:
    groups: list[list[Scored]] = field(default_factory=list)  # what the update trains on
    sampled: list[list[Scored]] = field(default_factory=list)  # everything rolled out (DAPO's dropped groups too)
    rollout_seconds: float = 0.0
    extra: dict = field(default_factory=dict)


# ---- small helpers (pure) ----------------------------------------------------------------------------------------

def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

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


def csv_row(step: int, metrics: dict[str, float]) -> dict[str, float]:
    """The plots/rl/rewards.csv row of a step."""
    row = {"step": step, "reward": metrics.get("reward/mean", 0.0), "reward_std": metrics.get("reward/std", 0.0),
           "task_reward": metrics.get("reward/task_reward", 0.0),
           "format_error_rate": metrics.get("reward/format_error_rate", 0.0)}
    for name in ("cs_micro", "hard_micro", "cs_macro", "hard_macro", "success"):
        row[name] = metrics.get(f"reward/{name}", 0.0)
    return {k: row[k] for k in REWARD_COLUMNS}


def write_rewards_csv(path: Path, rows: list[dict]) -> None:
    """Rewrite the reward curve from the history (the rows of the checkpoint a run resumed from)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=REWARD_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def append_rewards_csv(path: Path, row: dict) -> None:
    with path.open("a", newline="") as handle:
        csv.DictWriter(handle, fieldnames=REWARD_COLUMNS).writerow(row)
        handle.flush()


# ---- greedy evaluation during training ---------------------------------------------------------------------------

def eval_columns() -> list[str]:
    """plots/rl/eval.csv's columns: the step, the strict set metrics and each check's pass rate."""
    from components.travel.evaluator import COMMONSENSE_CHECKS, HARD_CHECKS

    return ["step", *EVAL_METRICS, *COMMONSENSE_CHECKS, *HARD_CHECKS]


def evaluation_due(step: int, every: int | None, last_step: int) -> bool:
    """Whether to evaluate after `step` (0: the start model, before any update): step 0, every `every` steps and the
    last step; never when `every` is None."""
    return every is not None and (step == 0 or step % every == 0 or step == last_step)


def eval_row(step: int, strict: dict) -> dict:
    """The eval.csv row of one evaluation from the validate stage's strict summary."""
    return {"step": step, **{key: strict[key] for key in EVAL_METRICS}, **strict["per_check"]}


def eval_metrics(row: dict) -> dict[str, float]:
    """MLflow's `eval/*` metrics of an eval.csv row (checks as `eval/checks/<name>`; a check no query sets is left
    out)."""
    return {f"eval/{key}" if key in EVAL_METRICS else f"eval/checks/{key}": value
            for key, value in row.items() if key != "step" and value is not None}


def load_eval_queries(params: RLParams, paths: RLPaths) -> list | None:
    """The held-out queries of `rl.eval` (None when it is off), level-stratified to `rl.eval.max_queries`."""
    from components.travel.queries import level_stratified_prefix, load_queries

    if params.eval.every is None:
        return None
    if paths.eval_queries is None or not Path(paths.eval_queries).exists():
        raise UserError(f"rl.eval.every is {params.eval.every} but the held-out query file {paths.eval_queries} does "
                        "not exist: pass --eval-queries data/queries/val.jsonl (made by `dvc repro queries`), or "
                        "set rl.eval.every: null")
    queries = load_queries(paths.eval_queries)
    if not queries:
        raise UserError(f"held-out query file {paths.eval_queries} holds no queries (rl.eval)")
    return level_stratified_prefix(queries, params.eval.max_queries) if params.eval.max_queries else queries


def evaluate_greedy(engine, queries: list) -> dict:
    """The strict validation summary of the engine's policy decoded greedily on `queries` (the validate stage's
    episodes, limits of the rollouts)."""
    from components.evaluation.validate import run_validation
    from components.training.rl.engine import greedy_policy

    _, metrics = run_validation(engine.world, queries, greedy_policy(engine.policy), engine.limits,
                                tokenizer=engine.tokenizer, progress=False)
    return metrics["strict"]


def write_eval_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=eval_columns())
        writer.writeheader()
        writer.writerows(rows)


# ---- rollouts ------------------------------------------------------------------------------------------------

def score_groups(groups: list[list[dict]], params: RLParams, progress: float) -> list[list[Scored]]:
    from components.training.rl.rewards import trajectory_reward

    return [[Scored(r, trajectory_reward(r, params, progress)) for r in group] for group in groups]


def collect_rollouts(engine, queries: list, next_queries: Callable[[int], list], params: RLParams,
                     progress: float, rng: random.Random) -> StepBatch:
    """The step's scored groups, by the algorithm's sampling rule."""
    from components.training.rl.arpo import arpo_rollouts
    from components.training.rl.dapo import dynamic_sampling

    batch = StepBatch()
    start = time.perf_counter()
    if params.arpo.enabled:
        result = arpo_rollouts(engine, queries, budget=params.arpo.budget,
                               initial_rollouts=params.arpo.initial_rollouts, alpha=params.arpo.alpha,
                               beta=params.arpo.beta, rng=rng)
        records = [[ep.record for ep in group] for group in result.groups]
        batch.groups = score_groups(records, params, progress)
        batch.extra.update(result.stats.as_metrics())
    elif params.dynamic_sampling.enabled:
        pending = [list(queries)]

        def sample(n: int) -> list[list[Scored]]:
            chosen = pending.pop() if pending else next_queries(n)
            groups = score_groups(engine.groups(chosen[:n], params.num_generations), params, progress)
            batch.sampled.extend(groups)
            return groups

        result = dynamic_sampling(sample, lambda g: [s.reward.total for s in g], len(queries),
                                  params.dynamic_sampling.max_extra_rounds)
        batch.groups = result.groups
        batch.extra.update({"dapo/rounds": result.rounds, "dapo/sampled_groups": result.sampled_groups,
                            "dapo/dropped_groups": result.dropped_groups, "dapo/kept_groups": len(result.groups)})
    else:
        batch.groups = score_groups(engine.groups(queries, params.num_generations), params, progress)
    if not params.dynamic_sampling.enabled:
        batch.sampled = batch.groups
    batch.rollout_seconds = time.perf_counter() - start
    return batch


# ---- the loop ------------------------------------------------------------------------------------------------

def load_world_and_queries(paths: RLPaths, max_queries: int | None = None):
    """The world and the RL queries (the first `max_queries` of them at the file's level mix, when set)."""
    from components.travel.queries import level_stratified_prefix, load_queries
    from components.travel.world import World

    if not paths.queries.exists():
        raise UserError(f"RL query file {paths.queries} does not exist (run the `queries` stage: dvc repro queries)")
    if not paths.world.exists():
        raise UserError(f"world directory {paths.world} does not exist (run the `world` stage: dvc repro world)")
    queries = load_queries(paths.queries)
    if not queries:
        raise UserError(f"RL query file {paths.queries} holds no queries")
    if max_queries is not None:
        queries = level_stratified_prefix(queries, max_queries)
    return World.load(paths.world), queries


@dataclass
class Parts:
    """What the loop works with, built once per run (from the newest checkpoint when resuming)."""

    tokenizer: object
    optimizer: object  # optim.TorchOptimizer | optim.AccelerateOptimizer (holds the trained model)
    engine: object  # engine.RolloutEngine
    sync: object  # weight_sync.NoWeightSync | weight_sync.VLLMWeightSync
    ref_model: object | None
    update_config: object  # update.UpdateConfig
    pad_id: int


def build_parts(params: RLParams, paths: RLPaths, world, source: Path, total_steps: int, device: str) -> Parts:
    """Load the policy from `source` (the SFT model or a checkpoint), the reference model (beta > 0), the optimiser,
    the rollout policy and engine, and the weight sync between them."""
    from components.agent.loop import Limits
    from components.models.loading import load_policy_model, load_tokenizer
    from components.training.rl.engine import RolloutEngine, build_policy
    from components.training.rl.optim import build_optimizer
    from components.training.rl.update import UpdateConfig
    from components.training.rl.weight_sync import build_weight_sync

    model = load_policy_model(source, dtype=params.dtype, device=device)
    tokenizer = load_tokenizer(source)
    if params.distributed.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    ref_model = None
    if params.beta > 0:  # the reference is the stage's input model, also when resuming
        ref_model = load_policy_model(paths.model, dtype=params.dtype, device=device).eval()
        ref_model.requires_grad_(False)
    optimizer = build_optimizer(model, params, total_steps)
    policy = build_policy(optimizer.unwrap(), tokenizer, source, params.rollout, params.seed, device)
    limits = Limits(max_turns=params.rollout.max_turns, max_tokens_per_turn=params.rollout.max_tokens_per_turn,
                    max_context_tokens=params.rollout.max_context_tokens,
                    max_protocol_errors=params.rollout.max_protocol_errors)
    engine = RolloutEngine(policy, tokenizer, world, limits, failure_rate=params.env.failure_rate, seed=params.seed,
                           entropy_tokens=params.arpo.entropy_tokens)
    config = UpdateConfig(epsilon=params.epsilon, epsilon_high=params.epsilon_high, beta=params.beta,
                          loss_type=params.loss_type, max_completion_length=params.max_completion_length,
                          num_iterations=params.num_iterations, mini_batch_size=params.mini_batch_size,
                          micro_batch_size=params.micro_batch_size, temperature=params.rollout.temperature,
                          recompute_old_logprobs=params.old_logprobs == "recompute",
                          entropy_coeff=params.entropy_coeff)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return Parts(tokenizer, optimizer, engine, build_weight_sync(policy), ref_model, config, pad_id)


def step_advantages(groups: list[list[Scored]], scale_rewards: str):
    """The trained trajectories in order and their group-relative advantages."""
    import torch

    from components.training.rl.advantages import group_advantages

    scored = [s for group in groups for s in group]
    if not scored:
        return scored, []
    group_ids = torch.tensor([g for g, group in enumerate(groups) for _ in group])
    rewards = torch.tensor([s.reward.total for s in scored], dtype=torch.float32)
    return scored, group_advantages(rewards, group_ids, scale_rewards).tolist()


def step_metrics(batch: StepBatch, stats: dict, seconds: dict[str, float], trained: int) -> dict[str, float]:
    """Everything TRAINING.md asks to log per step (rewards over every sampled trajectory, DAPO's dropped included)."""
    from components.training.rl.rewards import check_pass_rates

    everything = [s for group in batch.sampled for s in group]
    records = [s.record for s in everything]
    sampled = sum(sum(r.get("response_mask") or []) for r in records)
    return {
        **reward_metrics(everything), **episode_metrics(records), **batch.extra,
        **{f"checks/{k}": v for k, v in check_pass_rates(records).items()},
        **{f"policy/{k}": v for k, v in stats.items()},
        **{f"time/{k}_s": v for k, v in seconds.items()},
        "throughput/rollout_tokens_per_s": sampled / max(batch.rollout_seconds, 1e-9),
        "throughput/update_tokens_per_s": stats.get("processed_tokens", 0) / max(seconds["update"], 1e-9),
        "batch/trajectories": trained, "batch/sampled_tokens": sampled,
    }


def resume_tags(state: ckpt.TrainState) -> dict:
    """Tags of a run that resumes from `state`: the run it continues (when that one was tracked) and the step."""
    tags = {"star.resumed_from_step": state.step}
    if state.extra.get(RUN_ID_KEY):
        tags["star.resumed_from_run"] = state.extra[RUN_ID_KEY]
    return tags


def train(params: RLParams, paths: RLPaths, log: LogFn = lambda metrics, step: None,
          progress_bar: bool = True, tag: TagFn = lambda tags: None, run_id: str | None = None) -> dict:
    """Run (or resume) RL training; write the final model, metrics/rl.json and plots/rl/rewards.csv; return the
    summary written to metrics/rl.json.

    `log(metrics, step)` and `tag(tags)` report to the tracking run `run_id`, which the checkpoints remember so that
    a resumed run is tagged with the run it continues.
    """
    from tqdm.auto import tqdm

    from components.models.checkpoints import save_checkpoint as save_hf
    from components.models.loading import resolve_device
    from components.training.rl.cursor import QueryCursor
    from components.training.rl.update import fill_logprobs, rollout_from_record, update_policy

    wall_start = time.perf_counter()
    world, queries = load_world_and_queries(paths, params.max_queries)
    held_out = load_eval_queries(params, paths)
    total_steps = params.total_steps(len(queries))
    seed_everything(params.seed)

    ckpt.remove_partial(paths.checkpoints)
    inputs = ckpt.fingerprint(params.model_dump(mode="json"), {"model": paths.model, "world": paths.world,
                                                                "queries": paths.queries,
                                                                "eval_queries": paths.eval_queries if held_out else None})
    resume_dir, state = resumable_checkpoint(paths.checkpoints, inputs)
    parts = build_parts(params, paths, world, resume_dir or paths.model, total_steps, resolve_device(params.device))
    optimizer, engine = parts.optimizer, parts.engine
    if resume_dir is not None:
        optimizer.load(resume_dir)
        ckpt.restore_checkpoint_rng(resume_dir)
        print(f"[rl] resumed from {resume_dir} (step {state.step} of {total_steps})")
        tag(resume_tags(state))
    run_id = run_id or state.extra.get(RUN_ID_KEY)  # an untracked part links the next one to the last tracked one
    cursor = QueryCursor.from_state(state.cursor, len(queries), params.seed)
    history = list(state.history)
    write_rewards_csv(paths.rewards_csv, history)  # `dvc repro` deleted it; the checkpoint's rows come back
    eval_history = list(state.extra.get("eval_history", []))

    def evaluate(step: int) -> dict[str, float]:
        """Greedy evaluation after `step`: add its row to eval.csv; returns its metrics and the seconds it took."""
        start = time.perf_counter()
        row = eval_row(step, evaluate_greedy(engine, held_out))
        eval_history.append(row)
        write_eval_csv(paths.eval_csv, eval_history)
        return {**eval_metrics(row), "time/eval_s": time.perf_counter() - start}

    write_eval_csv(paths.eval_csv, eval_history)  # header only when rl.eval is off: DVC expects the file
    if held_out is not None:
        if state.step == 0:
            log(evaluate(0), 0)

    totals = {"rollout_tokens": 0.0, "rollout_seconds": 0.0, "update_tokens": 0.0, "update_seconds": 0.0}
    bar = tqdm(range(state.step + 1, total_steps + 1), desc="rl", unit="step", disable=not progress_bar,
               initial=state.step, total=total_steps)
    for step in bar:
        step_start = time.perf_counter()
        progress = progress_of(step, total_steps)

        # 1-3. queries -> rollouts through the agent loop -> strict-evaluator rewards
        engine.begin_step(step)
        engine.evaluation_seconds = 0.0
        batch = collect_rollouts(engine, [queries[i] for i in cursor.next_batch(params.queries_per_step)],
                                 lambda n: [queries[i] for i in cursor.next_batch(n)], params, progress,
                                 random.Random(params.seed * 1_000_003 + step))

        # 4. group-relative advantages
        reward_start = time.perf_counter()
        scored, advantages = step_advantages(batch.groups, params.scale_rewards)
        reward_seconds = time.perf_counter() - reward_start + engine.evaluation_seconds

        # 5. PPO-style update(s), LR schedule, weights to the rollout engine
        update_start = time.perf_counter()
        rollouts = [rollout_from_record(s.record, a) for s, a in zip(scored, advantages)]
        ref = None
        if parts.ref_model is not None and rollouts and params.learning_rate > 0:
            ref = fill_logprobs(parts.ref_model, rollouts, params.micro_batch_size, parts.pad_id,
                                parts.update_config.temperature, overwrite=False)
        # learning_rate 0 is a frozen control (the same seeded rollouts, weights that never move): no update pass
        stats = update_policy(optimizer.model, optimizer, rollouts, parts.update_config, parts.pad_id,
                              ref_logprobs=ref) if params.learning_rate > 0 else {"optimizer_steps": 0}
        stats["lr"] = optimizer.lr
        optimizer.schedule_step()
        parts.sync.push(optimizer.unwrap())
        update_seconds = time.perf_counter() - update_start

        # 6. reward curve, checkpoint, then log
        seconds = {"rollout": batch.rollout_seconds - engine.evaluation_seconds, "reward": reward_seconds,
                   "update": update_seconds, "step": time.perf_counter() - step_start}
        metrics = step_metrics(batch, stats, seconds, len(scored))
        metrics.update({"progress/epoch": cursor.epoch, "progress/fraction": progress})
        to_log = [metrics]
        row = csv_row(step, metrics)
        history.append(row)
        append_rewards_csv(paths.rewards_csv, row)
        totals["rollout_tokens"] += metrics["batch/sampled_tokens"]
        totals["rollout_seconds"] += batch.rollout_seconds
        totals["update_tokens"] += stats.get("processed_tokens", 0)
        totals["update_seconds"] += update_seconds
        bar.set_postfix(reward=f"{row['reward']:.3f}", success=f"{row['success']:.2f}")
        out_of_time = params.max_minutes is not None and time.perf_counter() - wall_start > params.max_minutes * 60
        if held_out is not None and evaluation_due(step, params.eval.every, step if out_of_time else total_steps):
            to_log.append(evaluate(step))
        if step % params.checkpoint_every == 0 or step == total_steps or out_of_time:
            ckpt.save_checkpoint(
                paths.checkpoints, ckpt.TrainState(step=step, cursor=cursor.state(), history=history,
                                                   extra={"eval_history": eval_history, "fingerprint": inputs,
                                                          RUN_ID_KEY: run_id}),
                save_model=lambda d: save_hf(optimizer.unwrap(), parts.tokenizer, d, stage="rl", step=step),
                save_optimizer=optimizer.save, keep=params.keep_checkpoints)
        for logged in to_log:  # after the checkpoint: a tracking outage never costs a finished step
            log(logged, step)
        if out_of_time:
            print(f"[rl] stopping after step {step} of {total_steps}: rl.max_minutes={params.max_minutes} reached")
            break
    bar.close()

    save_hf(optimizer.unwrap(), parts.tokenizer, paths.out, stage="rl", steps=total_steps, algorithm=params.algorithm,
            reward=params.reward.kind)
    summary = summarize(history, total_steps, state.step, totals, time.perf_counter() - wall_start, params)
    if eval_history:
        summary["eval"] = {"first": eval_history[0], "last": eval_history[-1]}
    paths.metrics.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_json_atomic(paths.metrics, summary)
    print(f"[rl] model -> {paths.out}; metrics -> {paths.metrics}; reward curve -> {paths.rewards_csv}; "
          f"checkpoints -> {paths.checkpoints}")
    return summary


def resumable_checkpoint(root: Path, inputs: dict[str, str]) -> tuple[Path | None, ckpt.TrainState]:
    """The newest checkpoint under `root` and its state when it was trained from `inputs`; else (None, a fresh
    state), after removing the other run's checkpoints and saying why."""
    newest = ckpt.newest_checkpoint(root)
    if newest is None:
        return None, ckpt.TrainState()
    state = ckpt.load_state(newest)
    changed = ckpt.changed_inputs(state.extra.get("fingerprint"), inputs)
    if not changed:
        return newest, state
    removed = ckpt.remove_checkpoints(root)
    print(f"[rl] not resuming from {newest}: it was trained from other inputs ({', '.join(changed)} changed); "
          f"removed {len(removed)} checkpoint(s) and starting from step 0")
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
        "reward_kind": params.reward.kind,
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

