"""The SFT entry point: choose a backend (the torch loop on CPU, transformers' Trainer on GPU), train, save."""
from __future__ import annotations

from pathlib import Path

import torch

from components.models.checkpoints import save_checkpoint, write_manifest
from components.training.launch import is_main_process, sft_backend
from components.training.sft import OnLog, SFTExample, SFTResult, train_torch
from components.training.sft_params import SFTParams


def choose_backend(params: SFTParams) -> str:
    """`torch` on CPU, `trainer` on GPU, unless params say otherwise."""
    return sft_backend(params, torch.cuda.is_available)


def run_sft(model, tokenizer, train: list[SFTExample], eval_examples: list[SFTExample], params: SFTParams,
            out_dir: str | Path, on_log: OnLog | None = None, manifest: dict | None = None,
            progress: bool = True) -> SFTResult:
    """Train with the chosen backend and write a Hugging Face checkpoint (model + tokenizer) into `out_dir` (rank 0
    of a multi-process Trainer world writes it; the other ranks train only)."""
    backend = choose_backend(params)
    if backend == "trainer":
        from components.training.sft_trainer import train_trainer  # transformers' Trainer: seconds to import

        result = train_trainer(model, tokenizer, train, eval_examples, params, out_dir, on_log)
        if is_main_process():
            tokenizer.save_pretrained(out_dir)
            write_manifest(out_dir, **(manifest or {}), backend=backend)
    else:
        result = train_torch(model, tokenizer, train, eval_examples, params, on_log, progress=progress)
        save_checkpoint(model, tokenizer, out_dir, **(manifest or {}), backend=backend)
    result.summary["backend"] = backend
    return result
