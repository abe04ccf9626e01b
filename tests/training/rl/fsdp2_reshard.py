"""One FSDP2 optimiser step saved by one world and loaded by another (test_rl_fsdp2.py runs it with 2 then 3
processes and compares what each holds).

    python -m torch.distributed.run --nproc_per_node N tests/training/rl/fsdp2_reshard.py MODEL_DIR save|load CKPT OUT

`save`: one AdamW step on a fixed batch of random tokens, then the sharded checkpoint into CKPT; `load`: a fresh
sharded model and optimiser loaded from CKPT. Both write (rank 0) the gathered weights and AdamW's moments to OUT.
"""
from __future__ import annotations

import sys

import torch


def main() -> None:
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from components.training.rl.distributed import init_ranks, launched_world_size
    from components.training.rl.fsdp import FSDPOptimizer

    torch.set_num_threads(1)
    model_dir, mode, checkpoint, out = sys.argv[1:5]
    ranks = init_ranks("cpu", launched_world_size())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = FSDPOptimizer(model, learning_rate=1e-3, weight_decay=0.0, max_grad_norm=1.0, scheduler="constant",
                              warmup_steps=0, total_steps=4, ranks=ranks)
    if mode == "save":
        tokens = torch.randint(3, 256, (2, 9), generator=torch.Generator().manual_seed(0))
        optimizer.backward(optimizer.model(tokens).float().logsumexp(-1).mean())
        optimizer.step()
        optimizer.save(checkpoint)
    else:
        optimizer.load(checkpoint)
    names = {param: name for name, param in optimizer.model.named_parameters()}
    moments = {}
    for param, state in optimizer.optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            value = state[key]
            moments[f"{key}/{names[param]}"] = value.full_tensor() if isinstance(value, DTensor) else value
    weights = optimizer.full_state_dict()
    if ranks.main:
        save_file({**{k: v.contiguous() for k, v in weights.items()},
                   **{k: v.detach().contiguous() for k, v in moments.items()}}, out)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
