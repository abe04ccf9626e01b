"""`rl.logit_scale_lr`: a learned inverse temperature, the final norm's weight trained as one scalar (optim.LogitScale).

Every logit is linear in the final norm's weight, so scaling that weight by e^s scales the logits by e^s: the greedy
choices stay, the sampling temperature divides by e^s. The scalar's gradient is <dL/dw, w>.
"""
import json

import pytest
import torch

from components.errors import UserError
from components.training.rl.optim import FINAL_NORM, LogitScale, TorchOptimizer, build_optimizer
from components.training.rl.params import RLParams
from components.training.rl.update import Rollout, UpdateConfig, fill_logprobs, update_policy


def load(tiny_model_dir):
    from components.models.loading import load_policy_model

    return load_policy_model(tiny_model_dir, dtype="float32", device="cpu")


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_scaling_the_final_norm_scales_every_logit_and_keeps_the_greedy_choices(tiny_model_dir):
    model = load(tiny_model_dir)
    ids = [20, 21, 22, 23, 24, 25]
    before = logits_of(model, ids)
    scale = LogitScale(model)
    with torch.no_grad():
        scale.log_scale.fill_(torch.log(torch.tensor(2.0)))
    scale.apply()
    after = logits_of(model, ids)
    assert scale.scale == pytest.approx(2.0)
    assert torch.allclose(after, 2.0 * before, rtol=1e-5, atol=1e-5)
    assert torch.equal(after.argmax(-1), before.argmax(-1))


def test_the_scalar_gradient_is_the_weight_gradient_projected_on_the_weight(tiny_model_dir):
    """d loss / d s at s = 0 is <d loss / d w, w>, checked against a central finite difference of the loss."""
    model = load(tiny_model_dir)
    ids = torch.tensor([[20, 21, 22, 23, 24]])
    weight = dict(model.named_parameters())[FINAL_NORM]

    def loss_at(s: float) -> float:
        original = weight.detach().clone()
        with torch.no_grad():
            weight.mul_(torch.exp(torch.tensor(s)))
            loss = model(input_ids=ids, labels=ids).loss.item()
            weight.copy_(original)
        return loss

    scale = LogitScale(model)
    model(input_ids=ids, labels=ids).loss.backward()
    scale.collect_grad()
    assert weight.grad is None  # moved onto the scalar: the weight itself is never stepped
    h = 1e-3
    numeric = (loss_at(h) - loss_at(-h)) / (2 * h)
    assert scale.log_scale.grad.item() == pytest.approx(numeric, rel=1e-2, abs=1e-4)


def test_rewarding_the_likely_continuation_sharpens_by_exactly_the_learning_rate(tiny_model_dir):
    """Adam's first step moves the scalar by lr in the gradient's sign: up when the episode of the policy's most
    likely tokens is the better one and that of its least likely tokens the worse. Only the final norm moves, by one
    common factor e^lr."""
    model = load(tiny_model_dir)
    prompt = [20, 21, 22]
    logits = logits_of(model, prompt + [23, 24])
    likely = prompt + logits[2:4].argmax(-1).tolist()  # the next two tokens each the model's first choice
    unlikely = prompt + logits[2:4].argmin(-1).tolist()  # ... its last choice
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.requires_grad_(name == FINAL_NORM)  # rl.trainable_parameters: [model.norm.weight]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    lr = 0.05
    optimizer = TorchOptimizer(model, 1e-3, 0.0, 1.0, "constant", 0, 1, logit_scale_lr=lr)
    assert optimizer.params == []  # the scalar replaces the only selected weight
    good = Rollout(input_ids=likely, loss_mask=[0, 0, 0, 1, 1], advantage=1.0)
    bad = Rollout(input_ids=unlikely, loss_mask=[0, 0, 0, 1, 1], advantage=-1.0)
    unlikely_before = fill_logprobs(model, [bad], 1, 0, 1.0, overwrite=False)[0]
    stats = update_policy(model, optimizer, [good, bad], UpdateConfig(micro_batch_size=2), pad_id=0)
    assert stats["optimizer_steps"] == 1
    assert optimizer.logit_scale.log_scale.item() == pytest.approx(lr, rel=1e-4)
    assert optimizer.extra_stats() == {"logit_scale": pytest.approx(torch.e ** lr),
                                       "logit_scale_grad": pytest.approx(optimizer.logit_scale.last_grad)}
    assert optimizer.logit_scale.last_grad < 0  # the loss falls as the scale rises
    after = dict(model.named_parameters())
    assert {name for name in before if not torch.equal(after[name], before[name])} == {FINAL_NORM}
    ratio = after[FINAL_NORM].detach() / before[FINAL_NORM]
    assert torch.allclose(ratio, torch.full_like(ratio, torch.e ** lr), rtol=1e-5)
    # the sharper policy: the penalised least likely tokens lost probability
    assert sum(fill_logprobs(model, [bad], 1, 0, 1.0, overwrite=False)[0]) < sum(unlikely_before)


def test_with_every_weight_trained_the_final_norm_moves_only_through_its_scale(tiny_model_dir):
    model = load(tiny_model_dir)
    before = dict((n, p.detach().clone()) for n, p in model.named_parameters())
    optimizer = TorchOptimizer(model, 1e-2, 0.0, 1.0, "constant", 0, 1, logit_scale_lr=0.1)
    good = Rollout(input_ids=[20, 21, 22, 23, 24], loss_mask=[0, 0, 1, 1, 1], advantage=1.0)
    bad = Rollout(input_ids=[20, 21, 30, 31, 32], loss_mask=[0, 0, 1, 1, 1], advantage=-1.0)
    update_policy(model, optimizer, [good, bad], UpdateConfig(micro_batch_size=1), pad_id=0)
    after = dict(model.named_parameters())
    ratio = after[FINAL_NORM].detach() / before[FINAL_NORM]
    assert torch.allclose(ratio, torch.full_like(ratio, optimizer.logit_scale.scale), rtol=1e-5)
    assert optimizer.logit_scale.scale != 1.0
    assert not torch.equal(after["model.layers.0.mlp.up_proj.weight"], before["model.layers.0.mlp.up_proj.weight"])


def test_the_scale_and_its_adam_state_survive_a_save_and_load(tiny_model_dir, tmp_path):
    from components.models.checkpoints import save_checkpoint
    from components.models.loading import load_tokenizer

    model = load(tiny_model_dir)
    optimizer = TorchOptimizer(model, 1e-2, 0.0, 1.0, "constant", 0, 1, logit_scale_lr=0.1)
    rollouts = [Rollout(input_ids=[20, 21, 22, 23, 24], loss_mask=[0, 0, 1, 1, 1], advantage=1.0),
                Rollout(input_ids=[20, 21, 30, 31, 32], loss_mask=[0, 0, 1, 1, 1], advantage=-1.0)]
    update_policy(model, optimizer, rollouts, UpdateConfig(micro_batch_size=2), pad_id=0)
    save_checkpoint(model, load_tokenizer(tiny_model_dir), tmp_path, stage="test")
    optimizer.save(tmp_path)

    resumed_model = load(tmp_path)  # a plain checkpoint: the scale is folded into the norm's weight
    resumed = TorchOptimizer(resumed_model, 1e-2, 0.0, 1.0, "constant", 0, 1, logit_scale_lr=0.1)
    resumed.load(tmp_path)
    assert resumed.logit_scale.log_scale.item() == pytest.approx(optimizer.logit_scale.log_scale.item())
    assert torch.allclose(resumed.logit_scale.base, optimizer.logit_scale.base, rtol=1e-6)
    for run_model, run_optimizer in ((model, optimizer), (resumed_model, resumed)):
        update_policy(run_model, run_optimizer, rollouts, UpdateConfig(micro_batch_size=2), pad_id=0)
    assert resumed.logit_scale.log_scale.item() == pytest.approx(optimizer.logit_scale.log_scale.item(), rel=1e-5)

    plain = TorchOptimizer(load(tiny_model_dir), 1e-2, 0.0, 1.0, "constant", 0, 1)
    plain.save(tmp_path)
    with pytest.raises(UserError, match="saved without a learned logit scale"):
        TorchOptimizer(load(tmp_path), 1e-2, 0.0, 1.0, "constant", 0, 1, logit_scale_lr=0.1).load(tmp_path)
    optimizer.save(tmp_path)
    with pytest.raises(UserError, match="saved with a learned logit scale"):
        TorchOptimizer(load(tmp_path), 1e-2, 0.0, 1.0, "constant", 0, 1).load(tmp_path)


def test_deepspeed_with_a_logit_scale_is_refused_with_what_to_set(tiny_model_dir):
    params = RLParams.model_validate({"logit_scale_lr": 0.05, "distributed": {"strategy": "deepspeed"}})
    with pytest.raises(UserError, match="rl.logit_scale_lr"):
        build_optimizer(load(tiny_model_dir), params, total_steps=1)
    with pytest.raises(ValueError):
        RLParams.model_validate({"logit_scale_lr": 0})


def test_the_stage_logs_the_scale_every_step_and_resumes_it(tmp_path, tiny_model_dir, tiny_world_dir,
                                                           rl_queries_path):
    from components.training.rl.trainer import RLPaths, train

    paths = RLPaths(model=tiny_model_dir, world=tiny_world_dir, queries=rl_queries_path, out=tmp_path / "models/rl",
                    checkpoints=tmp_path / "checkpoints/rl", metrics=tmp_path / "metrics/rl.json",
                    plots=tmp_path / "plots/rl")
    tiny = {"max_steps": 2, "queries_per_step": 1, "num_generations": 2, "learning_rate": 1e-3, "micro_batch_size": 2,
            "logit_scale_lr": 0.05, "reward": {"format_reward": -1.0},
            "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096}}
    logged = {}
    train(RLParams.model_validate(tiny), paths, log=lambda m, step: logged.setdefault(step, {}).update(m),
          progress_bar=False)
    assert all("policy/logit_scale" in logged[step] for step in (1, 2))
    train(RLParams.model_validate({**tiny, "max_steps": 3}), paths,
          log=lambda m, step: logged.setdefault(step, {}).update(m), progress_bar=False)
    assert "policy/logit_scale" in logged[3]
    summary = json.loads(paths.metrics.read_text())
    assert summary["logit_scale"] == pytest.approx(logged[3]["policy/logit_scale"])
    with pytest.raises(UserError, match="saved with a learned logit scale"):
        train(RLParams.model_validate({**tiny, "max_steps": 4, "logit_scale_lr": None}), paths, progress_bar=False)
