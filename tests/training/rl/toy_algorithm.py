"""A toy algorithm, as a user adds one: one module and one registration.

`best_worst` samples num_generations rollouts per query like GRPO and trains on two of them, the best and the worst
of each group (a contrastive pair); the rest are still logged with the step's rewards.
"""
from components.training.rl.algorithms import Algorithm
from components.training.rl.samplers import SamplerInputs, StepBatch, add_algorithm, sample_groups


def sample_best_worst(inputs: SamplerInputs) -> StepBatch:
    batch = sample_groups(inputs)
    pairs = [[min(group, key=lambda s: s.reward.total), max(group, key=lambda s: s.reward.total)]
             for group in batch.groups]
    return StepBatch(groups=pairs, sampled=batch.groups, extra={"best_worst/pairs": len(pairs)})


add_algorithm(Algorithm(name="best_worst", sampler="best_worst", defaults={"scale_rewards": "none"},
                        summary="the best and the worst rollout of each group"), sample_best_worst)
