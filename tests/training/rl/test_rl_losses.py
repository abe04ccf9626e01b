"""The clipped objective, KL, entropy and loss aggregation on hand-made tensors (numbers worked out by hand)."""
import math

import pytest
import torch

from components.training.rl.losses import (
    AGGREGATIONS,
    SURROGATES,
    LossSpec,
    aggregate_loss,
    clip_fraction,
    clipped_surrogate_loss,
    entropy_balanced_surrogate_loss,
    k3_kl,
    policy_loss,
    probability_ratio,
    token_entropy,
    token_logprobs,
)


def test_clipped_objective_takes_the_pessimistic_term():
    ratio = torch.tensor([0.5, 0.9, 1.1, 1.5, 1.5, 0.5])
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0])
    # A>0: min(r, clip(r,0.8,1.2)) -> 0.5, 0.9, 1.1, 1.2 ; A<0: min(-r, -clip(r)) -> -1.5, -0.8
    assert clipped_surrogate_loss(ratio, adv, 0.2).tolist() == pytest.approx([-0.5, -0.9, -1.1, -1.2, 1.5, 0.8])


def test_clip_higher_widens_only_the_upper_bound():
    ratio = torch.tensor([1.25, 1.5, 0.7])
    adv = torch.tensor([1.0, 1.0, -1.0])
    # upper bound 1.28 (DAPO): 1.25 unclipped, 1.5 -> 1.28; lower bound still 0.8: -max(0.7, 0.8) = -0.8 -> loss 0.8
    assert clipped_surrogate_loss(ratio, adv, 0.2, 0.28).tolist() == pytest.approx([-1.25, -1.28, 0.8])


def test_aepos_entropy_balanced_clip_keeps_the_value_and_the_gradient_past_the_upper_bound():
    """(1 + eps) / sg(r) * r equals 1 + eps but has the gradient (1 + eps) d log pi: a token past the upper bound with
    A > 0 keeps the gradient -(1 + eps) A instead of 0; the lower bound and A < 0 stay PPO's."""
    old = torch.zeros(4)
    adv = torch.tensor([2.0, -1.0, 3.0, -1.0])
    # r = 1.5 (A > 0: clipped at 1.2), 0.5 (A < 0: clipped at 0.8), 1.0 (inside), 1.5 (A < 0: unclipped r A)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.0, 1.5])).requires_grad_()
    ratio = probability_ratio(logp, old, torch.ones(4))
    ppo = clipped_surrogate_loss(ratio, adv, 0.2)
    aepo = entropy_balanced_surrogate_loss(ratio, adv, 0.2)
    assert ppo.tolist() == pytest.approx([-2.4, 0.8, -3.0, 1.5])
    assert aepo.tolist() == pytest.approx([-2.4, 0.8, -3.0, 1.5])
    (grad_ppo,) = torch.autograd.grad(ppo.sum(), logp, retain_graph=True)
    (grad_aepo,) = torch.autograd.grad(aepo.sum(), logp)
    assert grad_ppo.tolist() == pytest.approx([0.0, 0.0, -3.0, 1.5])  # d(-r A)/d log pi = -r A where unclipped
    assert grad_aepo.tolist() == pytest.approx([-2.4, 0.0, -3.0, 1.5])  # token 0: -(1 + 0.2) * 2


def test_policy_loss_takes_the_entropy_balanced_clip_when_asked():
    logp = torch.tensor([[math.log(1.5), 0.0]], requires_grad=True)
    old, adv, mask = torch.zeros(1, 2), torch.tensor([[2.0, 7.0]]), torch.tensor([[1, 0]])
    loss, stats = policy_loss(logp, old, adv, mask, LossSpec(surrogate="entropy_balanced"))
    loss.backward()
    assert loss.item() == pytest.approx(-2.4) and logp.grad[0].tolist() == pytest.approx([-2.4, 0.0])
    assert stats["clip_fraction_high"] == 1.0  # still counted as past the bound


def test_clip_fraction_counts_only_tokens_whose_gradient_was_clipped_away():
    ratio = torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.0, 9.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])  # the last token is masked: never counted
    stats = clip_fraction(ratio, adv, mask, 0.2)
    assert stats == pytest.approx({"clip_fraction_low": 0.2, "clip_fraction_high": 0.2, "clip_fraction": 0.4})


def test_k3_kl_matches_the_formula_and_is_zero_on_masked_tokens():
    logp = torch.tensor([[math.log(0.5), math.log(0.2), 0.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.2), -100.0]])
    mask = torch.tensor([[1, 1, 0]])
    # token 0: d = log(0.5) -> exp(d) - d - 1 = 0.5 + log 2 - 1 ; token 1: identical -> 0 ; token 2: masked -> 0
    assert k3_kl(logp, ref, mask)[0].tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0, 0.0])


def test_entropy_of_uniform_and_deterministic_distributions():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    assert token_entropy(logits).tolist() == pytest.approx([math.log(4), 0.0], abs=1e-6)


def test_token_logprobs_pick_the_target_under_log_softmax():
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    targets = torch.tensor([[1, 0]])
    assert token_logprobs(logits, targets)[0].tolist() == pytest.approx([math.log(0.75), math.log(0.5)])


def test_token_mean_divides_by_the_whole_minibatch_token_count_across_micro_batches():
    # mini-batch of two micro-batches: 3 + 1 sampled tokens; token-mean = (1+2+3+10)/4 = 4
    loss_a, mask_a = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1, 1, 1]])
    loss_b, mask_b = torch.tensor([[10.0, 99.0, 99.0]]), torch.tensor([[1, 0, 0]])
    parts = [aggregate_loss(l, m, "token-mean", minibatch_tokens=4, minibatch_sequences=2, max_completion_length=3)
             for l, m in [(loss_a, mask_a), (loss_b, mask_b)]]
    assert sum(parts).item() == pytest.approx(4.0)
    # dividing per micro-batch and averaging would give (2 + 10) / 2 = 6: the bug this guards against
    assert sum(parts).item() != pytest.approx(6.0)


def test_seq_mean_token_mean_and_dr_grpo_constant():
    loss = torch.tensor([[1.0, 2.0, 3.0], [10.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    seq_mean = aggregate_loss(loss, mask, "seq-mean-token-mean", 4, 2, 3)
    assert seq_mean.item() == pytest.approx((2.0 + 10.0) / 2)
    dr = aggregate_loss(loss, mask, "seq-mean-token-sum-norm", 4, 2, 3)
    assert dr.item() == pytest.approx(16.0 / (2 * 3))
    with pytest.raises(ValueError, match="loss_type must be one of"):
        aggregate_loss(loss, mask, "dr_grpo", 4, 2, 3)  # TRL's name: one name per aggregation here


def test_masked_logprobs_never_leak_into_ratios_or_gradients():
    logp = torch.tensor([[-1.0, -2.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-1.0, float("nan"), -3.0]])
    mask = torch.tensor([[1, 0, 0]])
    assert probability_ratio(logp, old, mask).tolist() == [[1.0, 1.0, 1.0]]
    adv = torch.tensor([[1.0, 1.0, 1.0]])
    loss, stats = policy_loss(logp, old, adv, mask)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert logp.grad.tolist() == [[-1.0, 0.0, 0.0]]  # d(-r*A)/dlogp = -r*A = -1 on the sampled token only
    assert stats["ratio_mean"] == pytest.approx(1.0)


def test_k3_kl_is_clamped_as_verl_clamps_it():
    """A token the policy made e^30 times likelier than the reference: the unclamped k3 is ~1e13 (inf in bf16) and
    its gradient as large; clamped, KL_t is 10 and the gradient finite."""
    logp = torch.tensor([[-30.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -1.0]])
    kl = k3_kl(logp, ref, torch.ones(1, 2))
    assert kl.tolist() == [[10.0, 0.0]]
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    # inside the clamp the formula is untouched
    assert k3_kl(torch.tensor([[-1.0]]), torch.tensor([[-3.0]]), torch.ones(1, 1)).item() == pytest.approx(
        math.exp(-2) + 2 - 1)


def test_policy_loss_adds_beta_times_kl():
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]])
    adv = torch.tensor([[0.0]])
    mask = torch.tensor([[1]])
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, LossSpec(beta=0.1), ref_logprobs=ref)
    assert loss.item() == pytest.approx(0.1 * (0.5 + math.log(2) - 1))
    assert stats["kl"] == pytest.approx(0.5 + math.log(2) - 1)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, logp.detach(), adv, mask, LossSpec(beta=0.1))


def test_policy_loss_subtracts_entropy_coeff_times_entropy_on_sampled_tokens_only():
    # zero advantages: the loss is the entropy term alone. Token-mean over the 2 sampled tokens of
    # H = [ln 2, 0, 9.9 (masked: a tool response)]: -c * (ln 2 + 0) / 2.
    logp = torch.tensor([[math.log(0.5), 0.0, -1.0]], requires_grad=True)
    entropy = torch.tensor([[math.log(2), 0.0, 9.9]], requires_grad=True)
    adv = torch.zeros(1, 3)
    mask = torch.tensor([[1, 1, 0]])
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, LossSpec(entropy_coeff=-0.1), entropy=entropy)
    assert loss.item() == pytest.approx(0.1 * math.log(2) / 2)
    loss.backward()
    assert entropy.grad[0].tolist() == pytest.approx([0.05, 0.05, 0.0])  # d loss / d H_t = -c / tokens, masked: 0
    with pytest.raises(ValueError, match="per-token entropy"):
        policy_loss(logp, logp.detach(), adv, mask, LossSpec(entropy_coeff=0.1))


def test_sampler_mismatch_and_truncated_importance_weights_on_hand_made_log_probs():
    from components.training.rl.update import sampler_mismatch, truncated_importance_weights

    trainer = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    sampler = torch.tensor([[-1.5, -2.0, 0.0, -9.0]])
    known = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token: no sampler log-prob (or not sampled)
    stats = sampler_mismatch(trainer, sampler, known)
    assert stats["logprob_mismatch"] == pytest.approx((0.5 + 0.0 + 0.5) / 3)
    k3 = [math.exp(d) - d - 1 for d in (0.5, 0.0, -0.5)]
    assert stats["sampler_kl"] == pytest.approx(sum(k3) / 3)
    # w = min(pi_old / pi_sampler, cap): e^0.5 = 1.65 capped at 1.5, 1, e^-0.5; 1 where unknown
    weights = truncated_importance_weights(trainer, sampler, known, cap=1.5)
    assert weights.tolist()[0] == pytest.approx([1.5, 1.0, math.exp(-0.5), 1.0])
    assert sampler_mismatch(trainer, sampler, torch.zeros_like(known)) == {}


def test_importance_weights_scale_each_tokens_policy_loss():
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    plain, _ = policy_loss(logp, logp.detach(), adv, mask, LossSpec(loss_type="token-mean"))
    weighted, _ = policy_loss(logp, logp.detach(), adv, mask, LossSpec(loss_type="token-mean"),
                              importance_weights=torch.tensor([[0.5, 2.0]]))
    assert plain.item() == pytest.approx(-1.0) and weighted.item() == pytest.approx(-(0.5 + 2.0) / 2)


def test_the_params_name_exactly_the_registered_surrogates_and_aggregations():
    """`rl.surrogate` and `rl.loss_type` select functions by name: every name the params accept has one."""
    from typing import get_args

    from components.training.rl.params import RLParams

    fields = RLParams.model_fields
    assert set(get_args(fields["surrogate"].annotation)) == set(SURROGATES)
    assert set(get_args(fields["loss_type"].annotation)) == set(AGGREGATIONS)


def test_an_unknown_surrogate_is_refused_with_the_registered_ones():
    logp = torch.zeros(1, 2, requires_grad=True)
    with pytest.raises(ValueError, match="surrogate must be one of clipped, entropy_balanced"):
        policy_loss(logp, logp.detach(), torch.ones(1, 2), torch.ones(1, 2), LossSpec(surrogate="ppo2"))
