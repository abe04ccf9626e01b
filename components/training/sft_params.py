"""SFTParams: the `sft:` section of params/sft.yaml.

Its own module, free of torch, so that reading or checking params (`star preset use`, the pipeline's params check)
need not import the training code (`components.training.sft`, which imports torch and re-exports SFTParams).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from components.params import Params


class SFTDistributedParams(Params):
    """How SFT spreads over GPUs, with rl.distributed's names: `processes` Trainer processes, one per GPU, that `star
    sft` starts with torchrun (components/training/launch.py; the torch loop trains in one), sharded by DeepSpeed
    ZeRO at `zero_stage` (`strategy: deepspeed`, the [gpu] extra) or plain data parallel (`strategy: none`)."""

    strategy: Literal["none", "deepspeed"] = "none"
    zero_stage: Literal[2, 3] = 2
    processes: int = Field(1, ge=1)
    gradient_checkpointing: bool = False

    @property
    def deepspeed_config(self) -> str:
        """The packaged DeepSpeed config's name: none, zero2 or zero3."""
        return f"zero{self.zero_stage}" if self.strategy == "deepspeed" else "none"


class SFTParams(Params):
    """`sft:` in params/sft.yaml."""

    epochs: float = Field(3.0, gt=0, description="passes over the training records (fractions allowed)")
    learning_rate: float = Field(1e-3, gt=0)
    lr_scheduler_type: Literal["cosine", "linear", "constant"] = "cosine"  # TRL's (and rl's) name
    warmup_ratio: float = Field(0.05, ge=0, lt=1, description="share of optimiser steps spent warming up")
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    batch_size: int = Field(8, ge=1, description="sequences per optimiser step (the effective batch)")
    micro_batch_size: int = Field(8, ge=1, description="sequences per forward pass (gradient accumulation below)")
    cutoff_len: int = Field(20480, ge=16, description="longest record in tokens")
    overlong: Literal["drop", "error"] = Field(
        "drop", description="a record over cutoff_len is dropped and counted, or stops the stage; never truncated")
    eval_every: int = Field(50, ge=1, description="optimiser steps between eval-loss measurements")
    eval_records: int | None = Field(
        None, ge=1, description="the first N held-out records scored for the eval loss (null: all of them); each "
                                "measurement is a forward pass over every one")
    max_steps: int | None = Field(
        None, ge=1, description="stop after this many optimiser steps; the LR schedule then follows steps alone, so "
                                "the same params, data and thread count give bit-identical weights")
    max_minutes: float | None = Field(
        None, gt=0, description="stop training after this much wall time; without max_steps the LR schedule decays "
                                "over this time (a run then depends on the machine's speed: not reproducible)")
    seed: int = 0
    backend: Literal["auto", "torch", "trainer"] = Field(
        "auto", description="auto: plain torch loop on CPU, transformers Trainer on GPU")

    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="compute precision (weights stay float32). GPU: auto = bf16 where supported. CPU: auto = "
                            "bf16 autocast of the training forward/backward where the CPU computes bf16 natively "
                            "(AVX512-BF16 or AMX: about 1.4x the tokens/s of float32), float32 elsewhere (emulated "
                            "bf16 measured 16x slower than float32 on an AVX2-only CPU); eval loss is float32")
    cpu_threads: int | None = Field(
        None, ge=1, description="torch CPU threads for the torch loop (null: torch's default, one per core)")
    distributed: SFTDistributedParams = SFTDistributedParams()

    @model_validator(mode="after")
    def _processes_need_the_trainer(self) -> "SFTParams":
        processes = self.distributed.processes
        if processes > 1 and self.backend == "torch":
            raise ValueError(f"distributed.processes: {processes} needs the transformers Trainer (backend: trainer, "
                             "with distributed.strategy: deepspeed to shard over the GPUs); backend: torch, the plain "
                             "torch loop, trains in one process")
        return self
