"""The supervised anchor of `rl.sft_anchor` (PPO-ptx with the SFT data): exact gradients, the update, the stage."""
import pytest
import torch

from components.errors import UserError
from components.training.rl.optim import TorchOptimizer
from components.training.rl.params import RLParams
from components.training.rl.update import Rollout, UpdateConfig, anchor_backward, update_policy
from components.training.sft import SFTExample, collate, evaluate_loss, masked_loss_sum

TEACHER = [SFTExample(input_ids=[5, 6, 7, 8, 9], mask=[0, 0, 1, 1, 1]),
           SFTExample(input_ids=[5, 6, 10, 11], mask=[1, 1, 1, 0])]


def model_of(tiny_model_dir):
    from components.models.loading import load_policy_model

    return load_policy_model(tiny_model_dir, dtype="float32", device="cpu")


def test_the_anchor_adds_coef_times_the_gradient_of_the_teachers_mean_nll(tiny_model_dir):
    """The anchor's gradient is exactly coef x the gradient of the SFT loss (token mean over every trained token of
    the batch, not a mean of micro-batch means), and it returns that loss as the SFT stage measures it."""
    model = model_of(tiny_model_dir)
    loss_sum, count = masked_loss_sum(model, collate(TEACHER, pad_id=0))
    assert count == 5  # 3 + 2 trained tokens: position 0 is never a target, even with mask 1
    (loss_sum / count).backward()
    expected = [0.3 * p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    nll = anchor_backward(model, TorchOptimizer(model, 1e-3, 0.0, 1.0, "constant", 0, 1), TEACHER, 0.3,
                          micro_batch_size=1, pad_id=0)
    assert nll == pytest.approx(evaluate_loss(model, TEACHER, pad_id=0, micro_batch_size=2), rel=1e-6)
    for got, want in zip((p.grad for p in model.parameters()), expected):
        assert torch.allclose(got, want, atol=1e-7)


def test_a_tied_step_still_descends_the_anchor_and_raises_the_teachers_likelihood(tiny_model_dir):
    """With every advantage 0 the policy gradient is nothing, but the anchor still takes its optimizer step (the
    anchor-only control of an ablation), and the teacher's tokens become likelier; with coef 0 no step is taken."""
    model = model_of(tiny_model_dir)
    optimizer = TorchOptimizer(model, 1e-2, 0.0, 1.0, "constant", 0, 1)
    tied = [Rollout(input_ids=[20, 21, 22, 23], loss_mask=[0, 0, 1, 1], advantage=0.0) for _ in range(2)]
    before = evaluate_loss(model, TEACHER, pad_id=0, micro_batch_size=2)
    stats = update_policy(model, optimizer, tied, UpdateConfig(micro_batch_size=2, anchor_coef=1.0), pad_id=0,
                          anchor=TEACHER)
    assert stats["optimizer_steps"] == 1 and stats["anchor_nll"] == pytest.approx(before, rel=1e-6)
    assert evaluate_loss(model, TEACHER, pad_id=0, micro_batch_size=2) < before
    off = update_policy(model, optimizer, tied, UpdateConfig(micro_batch_size=2), pad_id=0, anchor=TEACHER)
    assert off["optimizer_steps"] == 0 and "anchor_nll" not in off


def test_the_stage_draws_an_anchor_batch_a_step_and_logs_its_nll(tmp_path, tiny_model_dir, tiny_world_dir,
                                                                 rl_queries_path):
    """`rl.sft_anchor.coef > 0` reads the SFT records (refusing a missing file with the fix), trains on
    `batch_size` of them a step, drawn from (seed, step), and logs `policy/anchor_nll`."""
    import json

    from components.training.rl.trainer import RLPaths, anchor_batch, train

    records = tmp_path / "sft.jsonl"
    chat = [{"role": "system", "content": "Plan."}, {"role": "user", "content": "A trip."},
            {"role": "assistant", "content": "<think>ok</think><answer>[]</answer>"}]
    records.write_text("".join(json.dumps({"idx": i, "messages": chat}) + "\n" for i in range(3)))
    params = {"max_steps": 1, "queries_per_step": 1, "num_generations": 2, "learning_rate": 1e-3,
              "micro_batch_size": 2, "rollout": {"max_turns": 1, "max_tokens_per_turn": 8},
              "sft_anchor": {"coef": 0.5, "batch_size": 2}}
    paths = RLPaths(model=tiny_model_dir, world=tiny_world_dir, queries=rl_queries_path, out=tmp_path / "rl",
                    checkpoints=tmp_path / "ckpt", metrics=tmp_path / "rl.json", plots=tmp_path / "plots",
                    anchor_data=tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match="--anchor-data data/sft/train.jsonl"):
        train(RLParams.model_validate(params), paths, progress_bar=False)
    paths.anchor_data = records
    logged = []
    train(RLParams.model_validate(params), paths, log=lambda metrics, step: logged.append(metrics),
          progress_bar=False)
    assert logged[0]["policy/anchor_nll"] > 0
    pool = list(range(10))
    assert anchor_batch(pool, 4, seed=0, step=3) == anchor_batch(pool, 4, seed=0, step=3)
    assert anchor_batch(pool, 4, seed=0, step=3) != anchor_batch(pool, 4, seed=0, step=4)
    assert anchor_batch(None, 4, 0, 1) is None and len(anchor_batch(pool, 20, 0, 1)) == 10
