"""Supervised fine-tuning on chat records: assistant-only loss, length-grouped batches, one readable loop.

A record is `{"messages": [{"role", "content", "train"?}, ...]}` (data/sft/*.jsonl, data/qa/pretrain.jsonl). Its token
ids are built from the agent loop's own segments (`components.agent.tokens`): the prompt, each assistant turn as
`{text}<|im_end|>` and each tool response as a user segment ending with the next generation prompt. The loss mask
is 1 exactly on the tokens of assistant turns flagged for training (their `<|im_end|>` included) and 0 on system,
user and tool tokens and on padding; masked tokens stay in the attention context.

Two backends train the same examples with the same loss and learning-rate schedule (`components.training.schedule`):
a plain torch loop (CPU, the tiny preset: AdamW, token-mean loss over each optimiser step) and the transformers
`Trainer` with an optional DeepSpeed ZeRO config (GPU, real presets; `sft_trainer.py`); `sft_run.run_sft` picks one.
"""
from __future__ import annotations

import contextlib
import csv
import math
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from components.agent import tokens as tok
from components.errors import UserError
from components.jsonl import iter_jsonl
from components.training import schedule
from components.training.sft_params import SFTParams  # also importable from here, as it always was

IGNORE_INDEX = -100

OnLog = Callable[[dict, int], None]
"""Called with (metrics, step) at every logged step; the stage passes its MLflow run's `log_metrics`."""


@dataclass(frozen=True)
class SFTExample:
    """One training sequence: token ids and the loss mask (1 = the policy's own tokens)."""

    input_ids: list[int]
    mask: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class SFTResult:
    """What a training run produced: per-step history rows and the summary for metrics/sft.json."""

    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- records

def load_records(path: str | Path) -> list[dict]:
    """Chat records from a JSONL file, with an error that names the file and line when one is malformed."""
    records = []
    for number, record in iter_jsonl(path, missing_hint="run the stage that writes them, e.g. `dvc repro sft_data`"):
        if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
            raise UserError(f"{path}:{number}: a chat record needs a 'messages' list")
        records.append(record)
    return records


def encode_record(tokenizer, messages: list[dict]) -> SFTExample:
    """Token ids and loss mask of a conversation, built from the agent loop's segments (never by re-rendering).

    The messages before the first assistant turn form the prompt (mask 0); each assistant message is
    `{content}<|im_end|>` with mask 1 if its `train` flag is true (default) and 0 otherwise; each following user
    message (a tool response) is a tool segment (mask 0) whose special-token text is neutralised.
    """
    ids: list[int] = []
    mask: list[int] = []
    for _, segment, trained in encode_segments(tokenizer, messages):
        ids.extend(segment)
        mask.extend([trained] * len(segment))
    return SFTExample(input_ids=ids, mask=mask)


def encode_segments(tokenizer, messages: list[dict]) -> list[tuple[dict | None, list[int], int]]:
    """The segments `encode_record` joins, in order: (message, its ids, mask value). The prompt comes first with
    message None; then each assistant turn and each tool response, so a turn's tokens can be found by position."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None or first == 0:
        raise ValueError("a chat record needs a prompt (system/user messages) followed by an assistant message")
    segments: list[tuple[dict | None, list[int], int]] = [(None, tok.prompt_ids(tokenizer, messages[:first]), 0)]
    previous = "assistant"
    for message in messages[first:]:
        role = message["role"]
        if role == "assistant":
            segments.append((message, tok.assistant_ids(tokenizer, message["content"]),
                             int(bool(message.get("train", True)))))
        elif role == "user" and previous == "assistant":
            segments.append((message, tok.tool_segment_ids(tokenizer, message["content"]), 0))
        else:
            raise ValueError(f"unexpected {role!r} message after {previous!r}: after the prompt, assistant turns and "
                             "user (tool response) messages must alternate")
        previous = role
    return segments


def build_examples(tokenizer, records: list[dict], cutoff_len: int, overlong: str = "drop",
                   source: str = "records") -> tuple[list[SFTExample], int]:
    """Encode every record; a record longer than `cutoff_len` is dropped (and counted) or raises, never truncated
    (a cut multi-turn trajectory would teach the model to stop mid-task). Returns (examples, dropped)."""
    examples, dropped = [], 0
    for number, record in enumerate(records):
        example = encode_record(tokenizer, record["messages"])
        if len(example) > cutoff_len:
            if overlong == "error":
                raise UserError(f"{source}: record {number} has {len(example)} tokens > cutoff_len {cutoff_len}; "
                                "raise sft.cutoff_len or set sft.overlong: drop")
            dropped += 1
            continue
        if sum(example.mask) == 0:
            dropped += 1
            continue
        examples.append(example)
    return examples, dropped


def labels_from_mask(input_ids: list[int], mask: list[int]) -> list[int]:
    """Causal-LM labels: the token id where the mask is 1, IGNORE_INDEX (-100) elsewhere."""
    return [token if keep else IGNORE_INDEX for token, keep in zip(input_ids, mask)]


# ---------------------------------------------------------------------------------------------------- batching

def length_grouped_batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (little padding), batches in a seeded random order.

    Sequences are shuffled, sorted by length within windows of 50 batches, cut into batches, and the batches
    shuffled: every epoch sees every sequence once.
    """
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * 50
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: lengths[i])
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def collate(examples: list[SFTExample], pad_id: int) -> dict:
    """Right-padded tensors `input_ids`, `attention_mask`, `labels` (-100 on masked and padding positions)."""
    width = max(len(e) for e in examples)
    input_ids, attention, labels = [], [], []
    for e in examples:
        pad = width - len(e)
        input_ids.append(e.input_ids + [pad_id] * pad)
        attention.append([1] * len(e) + [0] * pad)
        labels.append(labels_from_mask(e.input_ids, e.mask) + [IGNORE_INDEX] * pad)
    return {"input_ids": torch.tensor(input_ids), "attention_mask": torch.tensor(attention),
            "labels": torch.tensor(labels)}


def schedule_position(step: int, total_steps: int, elapsed_s: float, max_minutes: float | None) -> float:
    """Where training is on the LR schedule, in optimiser steps: `step` (0-based), or further when a time limit will
    end training sooner (a fraction of `total_steps` as large as the fraction of `max_minutes` gone, so that the
    schedule decays fully within the time)."""
    if not max_minutes:
        return step
    return min(total_steps, max(step, total_steps * elapsed_s / (60 * max_minutes)))


# ---------------------------------------------------------------------------------------------------- loss

def masked_loss_sum(model, batch: dict):
    """(summed next-token cross-entropy over positions whose label is not -100, number of such positions).

    The output layer runs only at positions where some sequence of the batch is trained (`logits_to_keep` with
    those positions): most of a trajectory is prompt and tool text, and the vocabulary projection is a large share
    of a small model's compute (and of a large vocabulary's memory). The model is called as a whole, so wrappers
    (DDP, DeepSpeed) see a normal forward.
    """
    targets = batch["labels"][:, 1:]
    positions = (targets != IGNORE_INDEX).any(dim=0).nonzero().squeeze(-1)
    # No attention mask: padding is on the right, so under the causal mask no real token ever sees a pad, and the
    # loss ignores pad positions. Without a mask SDPA takes its fused causal kernel instead of materialising an
    # L x L mask per head (orders of magnitude slower and larger at the thousands of tokens of a trajectory).
    logits = model(input_ids=batch["input_ids"], logits_to_keep=positions).logits
    kept = targets[:, positions]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), kept.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, int((kept != IGNORE_INDEX).sum())


def evaluate_loss(model, examples: list[SFTExample], pad_id: int, micro_batch_size: int) -> float | None:
    """Token-mean loss on the trained (mask 1) tokens of `examples`; None when there are none."""
    total, count = _sum_over_batches(model, examples, pad_id, micro_batch_size, masked_loss_sum)
    return total / count if count else None


def masked_correct_sum(model, batch: dict):
    """(number of trained positions whose greedy next-token prediction is the target, number of trained positions)."""
    targets = batch["labels"][:, 1:]
    positions = (targets != IGNORE_INDEX).any(dim=0).nonzero().squeeze(-1)
    predicted = model(input_ids=batch["input_ids"], logits_to_keep=positions).logits.argmax(-1)
    kept = targets[:, positions]
    trained = kept != IGNORE_INDEX
    return int(((predicted == kept) & trained).sum()), int(trained.sum())


def evaluate_token_accuracy(model, examples: list[SFTExample], pad_id: int, micro_batch_size: int) -> float | None:
    """Teacher-forced greedy accuracy on the trained tokens of `examples` (e.g. how often a copied name is exact)."""
    correct, count = _sum_over_batches(model, examples, pad_id, micro_batch_size, masked_correct_sum)
    return correct / count if count else None


def _sum_over_batches(model, examples: list[SFTExample], pad_id: int, micro_batch_size: int, measure) -> tuple:
    """Sum `measure(model, batch) -> (value, count)` over `examples` in eval mode, without gradients."""
    if not examples:
        return 0.0, 0
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
    with torch.no_grad():
        for start in range(0, len(order), micro_batch_size):
            batch = collate([examples[i] for i in order[start:start + micro_batch_size]], pad_id)
            value, n = measure(model, {k: v.to(device) for k, v in batch.items()})
            total, count = total + float(value), count + n
    model.train(was_training)
    return total, count


# ---------------------------------------------------------------------------------------------------- torch loop

def plan_steps(num_examples: int, params: SFTParams) -> int:
    """Number of optimiser steps: epochs x batches per epoch, capped by `max_steps`."""
    per_epoch = math.ceil(num_examples / params.batch_size)
    steps = max(1, math.ceil(per_epoch * params.epochs))
    return min(steps, params.max_steps) if params.max_steps else steps


def warmup_steps(num_examples: int, params: SFTParams) -> int:
    """`warmup_ratio` as a whole number of optimiser steps (both backends; transformers before 5 reads a float
    `warmup_steps` as a step count, not a ratio)."""
    return schedule.warmup_steps(params.warmup_ratio, plan_steps(num_examples, params))


def batch_schedule(lengths: list[int], params: SFTParams, total_steps: int) -> list[tuple[float, list[int]]]:
    """(epoch position, example indices) for every optimiser step, epochs reshuffled with seed + epoch."""
    steps: list[tuple[float, list[int]]] = []
    epoch = 0
    while len(steps) < total_steps:
        batches = length_grouped_batches(lengths, params.batch_size, params.seed + epoch)
        steps.extend((epoch + (i + 1) / len(batches), b) for i, b in enumerate(batches))
        epoch += 1
    return steps[:total_steps]


def accumulate_gradients(model, examples: list[SFTExample], pad_id: int,
                         micro_batch_size: int) -> tuple[float, int, int]:
    """Backpropagate one optimiser step's loss, micro-batch by micro-batch: every micro-batch's summed loss is
    divided by the trained-token count of the WHOLE step, so the gradient is the step's token mean whatever the
    micro-batch size. Returns (summed loss, trained tokens, non-pad tokens)."""
    device = next(model.parameters()).device
    step_tokens = sum(sum(e.mask[1:]) for e in examples)
    step_loss, seen = 0.0, 0
    for start in range(0, len(examples), micro_batch_size):
        micro = collate(examples[start:start + micro_batch_size], pad_id)
        loss_sum, _ = masked_loss_sum(model, {k: v.to(device) for k, v in micro.items()})
        (loss_sum / max(1, step_tokens)).backward()
        step_loss += float(loss_sum.detach())
        seen += int(micro["attention_mask"].sum())
    return step_loss, step_tokens, seen


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX512-BF16 or AMX-BF16). Without it torch emulates bf16 matmuls,
    which measured 16x slower than float32 on an AVX2-only CPU."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is not None:
        found = capabilities()
        return bool(found.get("avx512_bf16") or found.get("amx_bf16"))
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_compute_dtype(dtype: str, native_bf16: bool) -> str:
    """The precision the CPU loop trains in for `dtype`: auto = bfloat16 where the CPU has native bf16, else float32.
    An explicit choice is kept (bfloat16 without native support is slow: a warning says so)."""
    if dtype == "auto":
        return "bfloat16" if native_bf16 else "float32"
    if dtype == "bfloat16" and not native_bf16:
        warnings.warn("sft dtype bfloat16 on a CPU without AVX512-BF16/AMX: torch emulates bf16, measured 16x slower "
                      "than float32 on an AVX2 CPU; set dtype: auto (or float32) unless bit-identity with a bf16 run "
                      "matters more than time", stacklevel=2)
    return dtype


def cpu_autocast(dtype: str, device):
    """The context the torch loop trains in: bf16 autocast on CPU when `dtype` is bfloat16, else a no-op.

    Weights, gradients and optimizer state stay float32; only the matmuls of the forward/backward run in bf16."""
    if dtype == "bfloat16" and torch.device(device).type == "cpu":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def prepare_torch_run(model, params: SFTParams) -> str:
    """Seed torch, set its CPU threads and gradient checkpointing as `params` say; return the compute dtype."""
    torch.manual_seed(params.seed)
    if params.cpu_threads:
        torch.set_num_threads(params.cpu_threads)
    if params.distributed.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    device = next(model.parameters()).device
    return cpu_compute_dtype(params.dtype, cpu_has_native_bf16()) if device.type == "cpu" else params.dtype


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> float:
    """Give every parameter group the learning rate `lr`; return it."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def optimizer_step(model, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> float:
    """Clip the accumulated gradients, apply and clear them; return their norm before clipping."""
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def train_torch(model, tokenizer, train: list[SFTExample], eval_examples: list[SFTExample], params: SFTParams,
                on_log: OnLog | None = None, progress: bool = True) -> SFTResult:
    """The CPU trainer: AdamW, the shared LR schedule, gradient clipping, loss = token mean over each optimiser
    step's trained tokens (gradient accumulation over micro-batches divides by the whole step's count)."""
    if not train:
        raise UserError("no SFT examples to train on (every record was empty or over cutoff_len)")
    compute_dtype = prepare_torch_run(model, params)
    device, pad_id = next(model.parameters()).device, tokenizer.pad_token_id
    total_steps = plan_steps(len(train), params)
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.learning_rate, weight_decay=params.weight_decay,
                                  betas=(0.9, 0.95))
    lr_factor = schedule.lr_multiplier(params.lr_scheduler_type, warmup_steps(len(train), params), total_steps)
    schedule_minutes = None if params.max_steps else params.max_minutes  # a step budget keeps the run deterministic
    result = SFTResult()
    initial_eval = evaluate_loss(model, eval_examples, pad_id, params.micro_batch_size)
    model.train()
    started = time.perf_counter()
    seen_tokens = trained_tokens = 0
    stopped = "completed"
    bar = tqdm(batch_schedule([len(e) for e in train], params, total_steps), desc="sft", unit="step",
               disable=not progress)
    for step, (epoch, indices) in enumerate(bar, start=1):
        position = schedule_position(step - 1, total_steps, time.perf_counter() - started, schedule_minutes)
        lr = set_learning_rate(optimizer, params.learning_rate * lr_factor(position))
        with cpu_autocast(compute_dtype, device):
            step_loss, step_tokens, step_seen = accumulate_gradients(model, [train[i] for i in indices], pad_id,
                                                                     params.micro_batch_size)
        grad_norm = optimizer_step(model, optimizer, params.max_grad_norm)
        seen_tokens, trained_tokens = seen_tokens + step_seen, trained_tokens + step_tokens
        row = {"step": step, "epoch": round(epoch, 4), "train_loss": step_loss / max(1, step_tokens),
               "learning_rate": lr, "grad_norm": grad_norm,
               "tokens_per_second": seen_tokens / max(1e-9, time.perf_counter() - started)}
        out_of_time = params.max_minutes is not None and (time.perf_counter() - started) / 60 >= params.max_minutes
        if step % params.eval_every == 0 or step == total_steps or out_of_time:
            row["eval_loss"] = evaluate_loss(model, eval_examples, pad_id, params.micro_batch_size)
        result.history.append(row)
        if on_log is not None:
            on_log({k: v for k, v in row.items() if k != "step" and v is not None}, step)
        bar.set_postfix(loss=f"{row['train_loss']:.3f}", tok_s=f"{row['tokens_per_second']:.0f}")
        if out_of_time:
            stopped = "max_minutes"
            break
    bar.close()
    wall = time.perf_counter() - started
    result.summary = summarise(result.history, initial_eval, wall, seen_tokens, trained_tokens, total_steps, stopped)
    result.summary["compute_dtype"] = compute_dtype
    model.eval()
    return result


def summarise(history: list[dict], initial_eval: float | None, wall: float, seen_tokens: int, trained_tokens: int,
              planned_steps: int, stopped: str) -> dict:
    """The metrics/sft.json summary of a run's history."""
    tail = history[-max(1, min(20, len(history))):]
    eval_rows = [r["eval_loss"] for r in history if r.get("eval_loss") is not None]
    return {
        "steps": len(history),
        "planned_steps": planned_steps,
        "epochs": history[-1]["epoch"] if history else 0.0,
        "stopped": stopped,
        "first_train_loss": history[0]["train_loss"] if history else None,
        "final_train_loss": sum(r["train_loss"] for r in tail) / len(tail) if history else None,
        "initial_eval_loss": initial_eval,
        "final_eval_loss": eval_rows[-1] if eval_rows else None,
        "wall_seconds": round(wall, 2),
        "tokens": seen_tokens,
        "trained_tokens": trained_tokens,
        "tokens_per_second": round(seen_tokens / max(1e-9, wall), 1),
        "minutes_per_epoch": round(wall / 60 / history[-1]["epoch"], 3) if history and history[-1]["epoch"] else None,
    }


def write_loss_csv(history: list[dict], path: str | Path) -> Path:
    """plots/sft/loss.csv: one row per step with `step, epoch, train_loss, eval_loss, learning_rate`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = ["step", "epoch", "train_loss", "eval_loss", "learning_rate"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in history:
            writer.writerow({c: row.get(c, "") for c in columns})
    return path
