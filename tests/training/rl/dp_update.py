"""RL updates on a fixed global batch, in a data-parallel world or in one process (tests/training/rl/
test_rl_distributed.py and test_rl_fsdp2.py run it both ways and compare the weights).

    python -m torch.distributed.run --nproc_per_node 2 tests/training/rl/dp_update.py MODEL_DIR OUT_DIR CASES

CASES is a JSON list of [ALGORITHM, KNOBS] pairs, run one after the other in the same world (one world's start-up
for every case); KNOBS is JSON of rl params: its `distributed` entries (e.g. {"strategy": "fsdp2"}) join the world's
process count, and `rank_groups` (a list of query indices per rank) replaces the even split with an uneven one.

The batch: 4 queries x G=4 trajectories of random tokens over a tiny vocabulary, with prompts, tool responses (loss
mask 0) and rewards (one group tied), the same on every rank; rank r trains on queries r, r + N, ... (whole groups),
as `star rl` shards a step. Rank 0 writes case i's updated weights to OUT_DIR/i.safetensors (safetensors), and for
a sharded model what the weight sync puts into a rollout engine's copy to OUT_DIR/i.synced.safetensors.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

QUERIES, G, VOCAB = 4, 4, 256


def global_batch(seed: int = 0) -> list[list[dict]]:
    """4 groups of G trajectory records: prompt, sampled and tool tokens, and a reward per trajectory."""
    rng = random.Random(seed)
    rewards = [[1.0, 0.0, 0.5, 0.25], [0.15] * G, [0.0, 0.0, 1.0, 0.0], [0.3, 0.9, 0.6, 0.1]]
    groups = []
    for q in range(QUERIES):
        prompt = [rng.randrange(3, VOCAB) for _ in range(5 + q)]
        group = []
        for i in range(G):
            response, mask = [], []
            for _ in range(rng.randrange(1, 4)):  # turns: sampled tokens, then a tool response
                sampled = rng.randrange(2, 7)
                response += [rng.randrange(3, VOCAB) for _ in range(sampled)]
                mask += [1] * sampled
                tool = rng.randrange(0, 4)
                response += [rng.randrange(3, VOCAB) for _ in range(tool)]
                mask += [0] * tool
            group.append({"prompt_ids": prompt, "response_ids": response, "response_mask": mask,
                          "reward": rewards[q][i]})
        groups.append(group)
    return groups


def update(model_dir: str, algorithm: str, knobs: dict, ranks) -> torch.nn.Module:
    """The model of `model_dir` after one step of `algorithm` on this rank's share of `global_batch()`."""
    return trained(model_dir, algorithm, knobs, ranks).unwrap()


def trained(model_dir: str, algorithm: str, knobs: dict, ranks):
    """The optimiser (holding the model) after one step of `algorithm` on this rank's share of `global_batch()`."""
    from transformers import AutoModelForCausalLM

    from components.training.rl.distributed import shard
    from components.training.rl.strategies import build_optimizer
    from components.training.rl.params import RLParams
    from components.training.rl.trainer import Scored, step_advantages
    from components.training.rl.update import UpdateConfig, rollout_from_record, update_policy

    torch.manual_seed(0)
    knobs = dict(knobs)
    distributed = {"processes": ranks.size, **knobs.pop("distributed", {})}
    rank_groups = knobs.pop("rank_groups", None)
    params = RLParams.model_validate({"algorithm": algorithm, "learning_rate": 1e-3, "num_generations": G,
                                      "queries_per_step": QUERIES, "arpo": {"budget": G, "initial_rollouts": 2},
                                      "distributed": distributed, **knobs})
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if params.distributed.gradient_checkpointing:  # as the trainer's build_parts
        model.gradient_checkpointing_enable()
    batch = global_batch()
    uneven = rank_groups is not None and ranks.size > 1
    mine = [batch[q] for q in rank_groups[ranks.rank]] if uneven else shard(batch, ranks)
    groups = [[Scored(r, SimpleNamespace(total=r["reward"])) for r in group] for group in mine]
    scored, advantages = step_advantages(groups, params.scale_rewards)
    rollouts = [rollout_from_record(s.record, a) for s, a in zip(scored, advantages)]
    optimizer = build_optimizer(model, params, total_steps=1, ranks=ranks)
    config = UpdateConfig(epsilon=params.epsilon, epsilon_high=params.epsilon_high, loss_type=params.loss_type,
                          max_completion_length=params.max_completion_length, num_iterations=params.num_iterations,
                          mini_batch_size=params.mini_batch_size, micro_batch_size=params.micro_batch_size,
                          entropy_coeff=params.entropy_coeff)
    stats = update_policy(optimizer.model, optimizer, rollouts, config, pad_id=0, ranks=ranks)
    assert stats["optimizer_steps"] >= 1, stats
    return optimizer


def write_case(model_dir: str, algorithm: str, knobs: dict, ranks, out: Path) -> None:
    """One case's update, written by rank 0 (every rank takes part in gathering a sharded model)."""
    from safetensors.torch import save_file

    optimizer = trained(model_dir, algorithm, knobs, ranks)
    names = [name for name, _ in optimizer.unwrap().named_parameters()]
    weights = optimizer.full_state_dict() if optimizer.sharded else dict(optimizer.unwrap().named_parameters())
    if ranks.main:
        save_file({name: weights[name].detach().contiguous() for name in names}, str(out))
    if optimizer.sharded:  # and what the weight sync puts into a rollout engine's own copy
        from transformers import AutoModelForCausalLM

        from components.training.rl.weight_sync import ModuleWeightSync

        engine_copy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        assert ModuleWeightSync(engine_copy).push(optimizer.unwrap()) == len(names)
        if ranks.main:
            save_file({k: v.detach().contiguous() for k, v in engine_copy.named_parameters()},
                      str(out.with_suffix(".synced.safetensors")))


def main() -> None:
    from components.training.rl.distributed import init_ranks, launched_world_size

    torch.set_num_threads(1)
    model_dir, out_dir, cases = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    ranks = init_ranks("cpu", launched_world_size())
    out_dir.mkdir(parents=True, exist_ok=True)
    for i, (algorithm, knobs) in enumerate(cases):
        write_case(model_dir, algorithm, knobs, ranks, out_dir / f"{i}.safetensors")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
