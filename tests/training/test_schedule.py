"""The one learning-rate schedule of SFT and RL (transformers' schedules, warmup in whole steps)."""
import pytest
import torch

from components.training.schedule import lr_multiplier, lr_schedule, warmup_steps


def test_warmup_then_cosine_decay_to_zero_at_the_last_step():
    cosine = lr_multiplier("cosine", warmup=2, total_steps=6)
    assert [round(cosine(s), 3) for s in range(7)] == [0.0, 0.5, 1.0, 0.854, 0.5, 0.146, 0.0]


def test_linear_and_constant_schedules():
    assert [lr_multiplier("linear", 0, 4)(s) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert [lr_multiplier("linear", 1, 5)(s) for s in range(6)] == [0.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert [lr_multiplier("constant", 2, 6)(s) for s in range(4)] == [0.0, 0.5, 1.0, 1.0]  # constant keeps its warmup
    assert lr_multiplier("constant", 0, 4)(3) == 1.0


def test_a_fraction_of_a_step_lies_between_its_neighbours():
    """What a schedule that follows the clock reads: 2.5 of 6 steps is half way between steps 2 and 3 in warmup."""
    linear = lr_multiplier("linear", warmup=4, total_steps=8)
    assert linear(2.5) == pytest.approx(2.5 / 4)
    assert linear(6.0) == pytest.approx(0.5)


def test_the_warmup_ratio_is_rounded_up_to_whole_steps():
    assert warmup_steps(0.1, 500) == 50
    assert warmup_steps(0.05, 80) == 4
    assert warmup_steps(0.25, 10) == 3
    assert warmup_steps(0.0, 10) == 0


def test_the_scheduler_sets_the_optimizer_learning_rate_each_step():
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.2)
    scheduler = lr_schedule(optimizer, "cosine", warmup=1, total_steps=3)
    rates = []
    for _ in range(4):
        rates.append(round(optimizer.param_groups[0]["lr"], 4))
        optimizer.step()
        scheduler.step()
    assert rates == [0.0, 0.2, 0.1, 0.0]


def test_an_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="cosine"):
        lr_multiplier("polynomial", 0, 4)
