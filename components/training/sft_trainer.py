"""The GPU backend of SFT: the transformers `Trainer` (optionally with DeepSpeed ZeRO-2/3) on the same examples, loss
and learning-rate schedule as the torch loop of `sft.py`.

`sft_run.run_sft` imports this module only when it chooses this backend: importing transformers' Trainer takes seconds,
which the CPU loop (and everything else that imports `sft.py`) does not pay.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback, TrainerState, TrainingArguments

from components.errors import UserError
from components.training import schedule
from components.training.launch import is_main_process, launched, require_launcher
from components.training.sft import (
    OnLog,
    SFTExample,
    SFTParams,
    SFTResult,
    collate,
    evaluate_loss,
    masked_loss_sum,
    summarise,
    warmup_steps,
)

DEEPSPEED_CONFIGS = {"zero2": "ds_zero2.json", "zero3": "ds_zero3.json"}  # shipped beside this module
# The Trainer's log keys -> the history rows' (those of the torch loop).
LOGGED = {"loss": "train_loss", "eval_loss": "eval_loss", "learning_rate": "learning_rate", "grad_norm": "grad_norm"}


def deepspeed_config(name: str) -> str | None:
    """Path of the packaged DeepSpeed config for `zero2`/`zero3` (None for `none`); requires deepspeed installed."""
    if name == "none":
        return None
    if importlib.util.find_spec("deepspeed") is None:
        raise UserError(f"sft.distributed.strategy: deepspeed ({name}) needs DeepSpeed: pip install "
                        "'star-pipeline[gpu]' (or set sft.distributed.strategy: none)")
    return str(Path(__file__).with_name(DEEPSPEED_CONFIGS[name]))


def deepspeed_setup(name: str) -> str | None:
    """`deepspeed_config(name)`; DeepSpeed needs a launcher's world (`star sft` starts itself under torchrun)."""
    config = deepspeed_config(name)
    if config is not None:
        require_launcher(f"sft.distributed.strategy: deepspeed ({name})")
    return config


class ExampleDataset:
    """A map-style dataset of encoded examples for the transformers Trainer."""

    def __init__(self, examples: list[SFTExample]):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict:
        e = self.examples[index]
        return {"input_ids": e.input_ids, "mask": e.mask}


def collate_items(items: list[dict], pad_id: int) -> dict:
    """The Trainer's data collator: `ExampleDataset` items padded by `collate`."""
    return collate([SFTExample(i["input_ids"], i["mask"]) for i in items], pad_id)


def history_row(step: int, epoch: float | None, logs: dict) -> dict:
    """The history row of one Trainer log: the step, the epoch and the logged values under the torch loop's names."""
    row = {"step": step, "epoch": round(epoch or 0.0, 4)}
    row.update({ours: logs[theirs] for theirs, ours in LOGGED.items() if theirs in logs})
    return row


class HistoryCallback(TrainerCallback):
    """Collects the Trainer's logs as history rows (one per step: a step's train and eval logs merge) and passes
    each log to `report` (the stage's `on_log`)."""

    def __init__(self, history: list[dict], report: OnLog | None):
        self.history = history
        self.report = report  # not `on_log`: that name is the Trainer's hook

    def on_log(self, args, state, control, logs=None, **kwargs):
        row = history_row(state.global_step, state.epoch, dict(logs or {}))
        if self.history and self.history[-1]["step"] == row["step"]:
            self.history[-1].update(row)
        else:
            self.history.append(row)
        if self.report is not None and len(row) > 2:
            self.report({k: v for k, v in row.items() if k != "step"}, row["step"])


class TimeLimit(TrainerCallback):
    """Stops training after the optimiser step that ends `max_minutes` after `started` (None: no limit)."""

    def __init__(self, max_minutes: float | None, started: float):
        self.max_minutes = max_minutes
        self.started = started

    def on_step_end(self, args, state, control, **kwargs):
        if self.max_minutes is not None and time.perf_counter() - self.started >= 60 * self.max_minutes:
            control.should_training_stop = True


class MaskedLossTrainer(Trainer):
    """The Trainer with the torch loop's loss: summed cross-entropy on the trained tokens over the step's count of
    them (`num_items_in_batch`, which the Trainer counts over the whole accumulated step)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss_sum, count = masked_loss_sum(model, inputs)
        denominator = num_items_in_batch if num_items_in_batch is not None else max(1, count)
        loss = loss_sum / denominator
        if num_items_in_batch is not None and self.args.average_tokens_across_devices:
            # The count is over every process's tokens and DDP/DeepSpeed average the gradients over the processes:
            # scale back up by their number, as the Trainer's own compute_loss does (without this, N processes
            # would train and log at 1/N of the loss).
            loss = loss * (self.accelerator.num_processes if self.args.n_gpu <= 1 else self.args.n_gpu)
        return (loss, {}) if return_outputs else loss


def training_arguments(params: SFTParams, out_dir: str | Path, num_examples: int, evaluate: bool,
                       ds_config: str | None) -> TrainingArguments:
    """The Trainer's arguments for `params`: the effective batch as micro-batches x accumulation x processes, the
    shared LR schedule with its warmup in whole steps, bf16 where the GPU has it, no checkpoints of its own."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    accumulation = max(1, params.batch_size // (params.micro_batch_size * world_size))
    bf16 = torch.cuda.is_available() and params.dtype in ("auto", "bfloat16") and torch.cuda.is_bf16_supported()
    return TrainingArguments(
        output_dir=str(Path(out_dir) / "_trainer"),
        num_train_epochs=params.epochs,
        max_steps=params.max_steps or -1,
        learning_rate=params.learning_rate,
        lr_scheduler_type=schedule.TRANSFORMERS_SCHEDULES[params.lr_scheduler_type],
        warmup_steps=warmup_steps(num_examples, params),
        weight_decay=params.weight_decay,
        max_grad_norm=params.max_grad_norm,
        per_device_train_batch_size=params.micro_batch_size,
        per_device_eval_batch_size=params.micro_batch_size,
        gradient_accumulation_steps=accumulation,
        bf16=bf16,
        deepspeed=ds_config,
        prediction_loss_only=True,
        eval_strategy="steps" if evaluate else "no",
        eval_steps=params.eval_every,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        remove_unused_columns=False,
        train_sampling_strategy="group_by_length",
        seed=params.seed,
        use_cpu=not torch.cuda.is_available(),
    )


def trainer_summary(state: TrainerState, history: list[dict], train: list[SFTExample], params: SFTParams,
                    initial_eval: float | None, wall: float) -> dict:
    """metrics/sft.json's summary of a Trainer run. Token counts are estimated from the mean example: the Trainer
    does not report them."""
    sequences = state.global_step * params.batch_size
    seen = int(sequences * sum(len(e) for e in train) / len(train))
    trained = int(sequences * sum(sum(e.mask) for e in train) / len(train))
    rows = [r for r in history if "train_loss" in r]
    stopped = "completed" if state.global_step >= state.max_steps else "max_minutes"
    summary = summarise(rows, initial_eval, wall, seen, trained, state.max_steps, stopped)
    summary["final_eval_loss"] = next((r["eval_loss"] for r in reversed(history) if "eval_loss" in r), None)
    return summary


def remove_trainer_files(out_dir: str | Path) -> None:
    """Remove what the Trainer leaves beside the model: its scratch folder and training_args.bin (a pickle)."""
    shutil.rmtree(Path(out_dir) / "_trainer", ignore_errors=True)
    (Path(out_dir) / "training_args.bin").unlink(missing_ok=True)


def train_trainer(model, tokenizer, train: list[SFTExample], eval_examples: list[SFTExample], params: SFTParams,
                  out_dir: str | Path, on_log: OnLog | None = None) -> SFTResult:
    """The GPU trainer: transformers `Trainer` (optionally DeepSpeed ZeRO-2/3) on the same examples and loss; saves
    the final weights into `out_dir` itself (ZeRO-3 shards must be gathered by the Trainer)."""
    ds_config = deepspeed_setup(params.distributed.deepspeed_config)
    if params.distributed.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    history: list[dict] = []
    trainer = MaskedLossTrainer(
        model=model, args=training_arguments(params, out_dir, len(train), bool(eval_examples), ds_config),
        train_dataset=ExampleDataset(train), eval_dataset=ExampleDataset(eval_examples) if eval_examples else None,
        data_collator=functools.partial(collate_items, pad_id=tokenizer.pad_token_id),
        callbacks=[HistoryCallback(history, on_log)])
    initial_eval = (evaluate_loss(model, eval_examples, tokenizer.pad_token_id, params.micro_batch_size)
                    if eval_examples else None)
    started = time.perf_counter()
    trainer.add_callback(TimeLimit(params.max_minutes, started))
    trainer.train()
    wall = time.perf_counter() - started
    if eval_examples:
        trainer.evaluate()
    trainer.save_model(str(out_dir))
    summary = trainer_summary(trainer.state, history, train, params, initial_eval, wall)
    summary["processes"] = trainer.args.world_size
    summary["launched"] = launched()  # under torchrun / accelerate launch (star sft starts itself under torchrun)
    if is_main_process():
        remove_trainer_files(out_dir)
    return SFTResult(history=history, summary=summary)
