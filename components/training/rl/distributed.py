"""Data-parallel RL over the processes of a torch.distributed world (torchrun; one process per GPU, or gloo
processes on a CPU).

Every rank holds the whole model and draws the same queries from the data cursor; each takes whole groups of them
(`shard`), rolls them out and computes their group-relative advantages itself, so advantages are exact. The loss of
a mini-batch is normalised by the global batch (token and sequence counts summed over the ranks), each rank's loss
is its share of that global loss, and the optimiser sums the gradients over the ranks before it steps: N processes
make the update one process makes on the same batch. Rank 0 gathers the step's rollouts for the metrics and alone
writes metrics, plots, checkpoints, the final model and the MLflow run.

`Ranks` is what the trainer and the optimiser see: rank, size and the few collectives they need. `SINGLE` is the
world of one process, in which every collective is the identity, so the one-process path runs the same code.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from components.errors import UserError

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the data-parallel world."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes the run's outputs."""
        return self.rank == 0

    def sum(self, values: Sequence[float]) -> list[float]:
        """`values` summed element-wise over the ranks (float64)."""
        if self.size == 1:
            return [float(v) for v in values]
        tensor = torch.tensor(list(values), dtype=torch.float64, device=collective_device())
        torch.distributed.all_reduce(tensor)
        return tensor.cpu().tolist()

    def max(self, value: float) -> float:
        """The largest `value` of any rank."""
        if self.size == 1:
            return float(value)
        tensor = torch.tensor([float(value)], dtype=torch.float64, device=collective_device())
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return float(tensor.item())

    def gather(self, item: T) -> list[T]:
        """Every rank's `item`, in rank order, on every rank (Python objects between this run's own processes)."""
        if self.size == 1:
            return [item]
        out: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(out, item)
        return out

    def sum_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Sum the accumulated gradients over the ranks, in one flat buffer per dtype. A parameter that has a
        gradient on some rank gets one on every rank (zeros where its share of the batch gave none); one that has
        none anywhere keeps none, so AdamW skips it as one process would."""
        if self.size == 1:
            return
        parameters = list(parameters)
        flags = torch.tensor([float(p.grad is not None) for p in parameters], device=collective_device())
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for param, anywhere in zip(parameters, flags.tolist()):
            if not anywhere:
                continue
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            by_dtype.setdefault(param.grad.dtype, []).append(param)
        for params in by_dtype.values():
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            torch.distributed.all_reduce(flat)
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.grad.numel()].view_as(p.grad))
                offset += p.grad.numel()

    def barrier(self) -> None:
        if self.size > 1:
            torch.distributed.barrier()


SINGLE = Ranks()


def collective_device() -> torch.device:
    """Where collective tensors live: the process's GPU under NCCL, the CPU under gloo."""
    if torch.distributed.is_initialized() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def launched_world_size(environ: dict[str, str] | None = None) -> int:
    """WORLD_SIZE as a launcher set it (1 when none did)."""
    environ = os.environ if environ is None else environ
    value = environ.get("WORLD_SIZE", "1").strip() or "1"
    return int(value) if value.isdigit() else 1


def init_ranks(device: str, expected: int) -> Ranks:
    """Join the launcher's world (gloo on a CPU, NCCL on GPUs; this process's GPU is LOCAL_RANK) and return it;
    SINGLE when this process runs alone. `expected` is rl.distributed.processes: a launcher that started another
    number of processes is refused, so the params always say how a run was made."""
    size = launched_world_size()
    if size != expected:
        raise UserError(f"rl.distributed.processes is {expected} but the launcher started {size} process(es) "
                        f"(WORLD_SIZE): set rl.distributed.processes: {size}, or launch {expected} (`star rl` starts "
                        "torchrun itself; by hand: torchrun --nproc_per_node N, --nnodes for several machines)")
    if size == 1:
        return SINGLE
    if not torch.distributed.is_initialized():
        on_gpu = device.startswith("cuda")
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl" if on_gpu else "gloo")
    return Ranks(rank=torch.distributed.get_rank(), size=torch.distributed.get_world_size())


def shard(items: Sequence[T], ranks: Ranks) -> list[T]:
    """This rank's whole items of a step's batch: rank r takes items r, r + N, r + 2N, ... (queries_per_step is a
    multiple of the world size, checked with the params)."""
    return list(items[ranks.rank::ranks.size])


def local_mini_batch_size(mini_batch_size: int | None, ranks: Ranks) -> int | None:
    """Trajectories per optimizer step on this rank: the global mini-batch spread over the ranks."""
    return None if mini_batch_size is None else max(1, mini_batch_size // ranks.size)
