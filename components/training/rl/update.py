"""The policy update of one RL step: rollout records -> padded tensors -> clipped-ratio loss -> optimizer steps.

A rollout's sequence is `prompt_ids + response_ids`; its loss mask is 0 on the prompt and `response_mask` on the
response (1 exactly on tokens the policy sampled, its `<|im_end|>` included; 0 on tool responses and the
generation prompts that follow them). Every token stays in the attention context. Padding is on the right and out of
the loss mask; since attention is causal, no real token ever attends to the padding after it, so no attention mask
is passed (SDPA then takes its fused causal path: 1.5x faster on CPU than with a padding mask, identical logits on
the real tokens). Log-probabilities are aligned with the ids: position t holds
log pi(id_t | ids_<t) (position 0 has none and is never trained).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from components.training.rl.advantages import TOKEN_WEIGHTINGS, entropy_moments, token_advantages
from components.training.rl.distributed import SINGLE, Ranks, local_mini_batch_size
from components.training.rl.losses import LossSpec, masked_mean, policy_loss, token_entropy, token_logprobs


@dataclass
class Rollout:
    """One trajectory as the update sees it."""

    input_ids: list[int]
    loss_mask: list[int]
    advantage: float
    old_logprobs: list[float] | None = None  # aligned with input_ids (0 on the prompt); None: recompute
    sampler_logprobs: list[float] | None = None  # the rollout engine's, aligned likewise (None: not returned)

    @property
    def num_trained(self) -> int:
        return int(sum(self.loss_mask))


def rollout_from_record(record: dict, advantage: float) -> Rollout:
    """The Rollout of a trajectory record (prompt_ids, response_ids, response_mask, response_logprobs)."""
    prompt, response, mask = record["prompt_ids"], record["response_ids"], record["response_mask"]
    if len(response) != len(mask):
        raise ValueError(f"record {record.get('idx')}: {len(response)} response ids but {len(mask)} mask entries")
    logprobs = record.get("response_logprobs")
    old = [0.0] * len(prompt) + list(logprobs) if logprobs is not None and len(logprobs) == len(response) else None
    return Rollout(input_ids=list(prompt) + list(response), loss_mask=[0] * len(prompt) + list(mask),
                   advantage=float(advantage), old_logprobs=old, sampler_logprobs=old)


def pad_batch(rollouts: Sequence[Rollout], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded (B, T) tensors: input_ids, loss_mask, old_logprobs and sampler_logprobs (0 where unknown),
    sampler_known (1 where the engine returned a log-prob), and the (B,) advantages."""
    width = max(len(r.input_ids) for r in rollouts)

    def pad(values: list, fill) -> list:
        return list(values) + [fill] * (width - len(values))

    return {
        "input_ids": torch.tensor([pad(r.input_ids, pad_id) for r in rollouts], dtype=torch.long),
        "loss_mask": torch.tensor([pad(r.loss_mask, 0) for r in rollouts], dtype=torch.float32),
        "old_logprobs": torch.tensor([pad(r.old_logprobs or [0.0] * len(r.input_ids), 0.0) for r in rollouts],
                                     dtype=torch.float32),
        "sampler_logprobs": torch.tensor([pad(r.sampler_logprobs or [0.0] * len(r.input_ids), 0.0)
                                          for r in rollouts], dtype=torch.float32),
        "sampler_known": torch.tensor([pad([float(r.sampler_logprobs is not None)] * len(r.input_ids), 0.0)
                                       for r in rollouts], dtype=torch.float32),
        "advantages": torch.tensor([r.advantage for r in rollouts], dtype=torch.float32),
    }


def kept_logits(model, input_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The (N, V) output-layer logits of the hidden states that predict the N tokens `keep` marks ((B, T - 1), one
    per next token): the decoder runs on every position, the output layer only on those."""
    hidden = model.get_decoder()(input_ids=input_ids).last_hidden_state[:, :-1]
    return model.get_output_embeddings()(hidden[keep])


class PolicyLogits(torch.nn.Module):
    """A causal LM whose forward is the log-prob computation's model work: the (B, T - 1, V) next-token logits, or
    with `keep` the (N, V) logits at the kept positions only (`kept_logits`). `sequence_logprobs` calls it once per
    micro-batch; as the root of a sharded model (FSDP2, components/training/rl/fsdp.py) its forward is where the root's
    parameters (embeddings, final norm, output layer) are gathered and, in the backward, their gradients reduced.

    `collective` marks a forward that is a collective of the world: every rank must run as many passes as the others
    (`in_lockstep`)."""

    collective = True

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        if keep is None:
            return self.model(input_ids=input_ids).logits[:, :-1]
        return kept_logits(self.model, input_ids, keep)


def in_lockstep(micros: list, model, ranks: Ranks) -> list:
    """`micros` followed by None up to the most micro-batches any rank has, when `model`'s forward is a collective
    (`PolicyLogits.collective`): each None is an idle pass (`idle_pass`) that keeps this rank's collectives matched
    with the others'. Unchanged otherwise."""
    if ranks.size == 1 or not getattr(model, "collective", False):
        return micros
    return micros + [None] * (int(ranks.max(len(micros))) - len(micros))


def idle_pass(model, pad_id: int, optimizer=None) -> None:
    """A forward pass over one padding token that contributes nothing (and with `optimizer`, a backward of zero
    gradients): what a rank with fewer micro-batches than the others runs for each one it lacks."""
    device = next(model.parameters()).device
    logits = model(torch.full((1, 2), pad_id, dtype=torch.long, device=device))
    if optimizer is not None:
        optimizer.backward(logits.float().sum() * 0.0)


def sequence_logprobs(model, input_ids: torch.Tensor, temperature: float = 1.0,
                      positions: torch.Tensor | None = None,
                      with_entropy: bool = False,
                      entropy_map: bool = False,
                      entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T) log pi(id_t | ids_<t) of right-padded sequences under logits / temperature (0 at t = 0), and with
    `with_entropy` the mean entropy of the next-token distributions scored (no gradient). With `entropy_map` the
    second value is instead the (B, T) entropy H_t of the distribution that predicted id_t, aligned like the
    log-probs (0 at t = 0 and at unscored positions) and with its gradient, for an entropy term in the loss (without
    it when `entropy_grad` is false: AEPO's entropy-aware advantage only reads the values).

    With `positions` (a (B, T) 0/1 mask, e.g. the loss mask), the output layer runs only on the hidden states that
    predict those tokens and every other position holds 0: the (tokens x vocabulary) logits of the tool responses and
    prompts, which nothing reads, are never built (a real model's vocabulary is 152K wide).
    """
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    targets = input_ids[:, 1:]
    keep = None if positions is None else positions[:, 1:].to(device).bool()
    if isinstance(model, PolicyLogits):  # one call of the module, so that FSDP's hooks around its forward run
        raw = model(input_ids, keep)
    elif keep is None:
        raw = model(input_ids=input_ids).logits[:, :-1]
    else:
        raw = kept_logits(getattr(model, "module", model), input_ids, keep)  # DeepSpeed/accelerate wrap the model
    logits = raw.float() / temperature  # (B, T - 1, V), or (N, V) at the kept positions
    if keep is None:
        scored = token_logprobs(logits, targets)
    else:
        picked = token_logprobs(logits.unsqueeze(0), targets[keep].unsqueeze(0)).squeeze(0)
        scored = torch.zeros(targets.shape, device=device, dtype=picked.dtype).masked_scatter(keep, picked)
    logprobs = torch.cat([torch.zeros(input_ids.shape[0], 1, device=device, dtype=scored.dtype), scored], dim=1)
    if entropy_map:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            if positions is None:
                per_position = token_entropy(logits)
            else:
                rows = token_entropy(logits)
                per_position = torch.zeros(targets.shape, device=device, dtype=rows.dtype).masked_scatter(keep, rows)
        zero = torch.zeros(input_ids.shape[0], 1, device=device, dtype=per_position.dtype)
        return logprobs, torch.cat([zero, per_position], dim=1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            rows = logits.detach().reshape(-1, logits.shape[-1])
            entropy = token_entropy(rows).mean() if rows.numel() else torch.zeros((), device=device)
    return logprobs, entropy


def autocast(model, dtype: torch.dtype | None):
    """Mixed precision for a forward pass: autocast to `dtype` on the model's device, over its float32 master
    weights (None: compute in the weights' own dtype)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=next(model.parameters()).device.type, dtype=dtype)


def by_length(indices: Sequence[int], rollouts: Sequence[Rollout]) -> list[int]:
    """`indices` sorted by sequence length, so micro-batches hold sequences of similar length (less padding)."""
    return sorted(indices, key=lambda i: len(rollouts[i].input_ids))


def chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


@torch.no_grad()
def fill_logprobs(model, rollouts: Sequence[Rollout], micro_batch_size: int, pad_id: int, temperature: float,
                  overwrite: bool, autocast_dtype: torch.dtype | None = None,
                  ranks: Ranks = SINGLE) -> list[list[float]]:
    """Log-probabilities of the trained tokens of every rollout under `model` (no gradient; 0 at untrained
    positions, which nothing reads), e.g. pi_old before the update or pi_ref. With `overwrite`, they also become
    the rollouts' `old_logprobs`."""
    out: list[list[float]] = [[] for _ in rollouts]
    micros = list(chunks(by_length(range(len(rollouts)), rollouts), micro_batch_size))
    for positions in in_lockstep(micros, model, ranks):
        if positions is None:
            idle_pass(model, pad_id)
            continue
        batch = pad_batch([rollouts[p] for p in positions], pad_id)
        with autocast(model, autocast_dtype):
            logprobs, _ = sequence_logprobs(model, batch["input_ids"], temperature, positions=batch["loss_mask"])
        for position, row in zip(positions, logprobs.cpu()):
            out[position] = row[: len(rollouts[position].input_ids)].tolist()
            if overwrite:
                rollouts[position].old_logprobs = out[position]
    return out


@dataclass
class UpdateConfig:
    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    loss_type: str = "token-mean"
    max_completion_length: int = 4096
    num_iterations: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int = 4
    temperature: float = 1.0
    recompute_old_logprobs: bool = True
    entropy_coeff: float = 0.0
    surrogate: str = "clipped"  # losses.SURROGATES (AEPO: entropy_balanced, whose upper clip bound keeps a gradient)
    token_weighting: str = "none"  # advantages.TOKEN_WEIGHTINGS (AEPO: entropy_aware)
    entropy_advantage_coef: float = 0.0  # a of the entropy-aware token weighting (0: plain advantages)
    autocast_dtype: torch.dtype | None = None  # compute in bf16/fp16 over float32 master weights (None: as stored)
    tis_cap: float | None = None  # truncated importance sampling of the sampler/trainer mismatch (None: off)
    mismatch_every_step: bool = False  # also measure the sampler/trainer mismatch on a step with no optimizer step
    # (rollouts from a separate engine, vLLM's: its log-probs can drift from the trainer's; an extra no-grad pass)


    def loss_spec(self) -> LossSpec:
        return LossSpec(epsilon=self.epsilon, epsilon_high=self.epsilon_high, beta=self.beta,
                        entropy_coeff=self.entropy_coeff, surrogate=self.surrogate, loss_type=self.loss_type,
                        max_completion_length=self.max_completion_length)

    @property
    def weights_by_entropy(self) -> bool:
        """Whether the token weighting reads the entropies (an extra no-grad pass per mini-batch for their
        moments)."""
        return TOKEN_WEIGHTINGS[self.token_weighting].needs_entropy and self.entropy_advantage_coef != 0


def is_single_step(config: UpdateConfig, n_rollouts: int) -> bool:
    """Whether an update is exactly one optimizer step over all `n_rollouts` (one pass, one mini-batch): then no
    weight changes between the forward passes of its micro-batches, and each pass's log-probabilities are pi_old's."""
    return config.num_iterations == 1 and (config.mini_batch_size or n_rollouts) >= n_rollouts


def padded_reference(ref_logprobs: list[list[float]], positions: Sequence[int], width: int,
                     device: torch.device) -> torch.Tensor:
    """The (B, width) reference log-probabilities of the rollouts at `positions`, right-padded with 0."""
    return torch.tensor([ref_logprobs[p] + [0.0] * (width - len(ref_logprobs[p])) for p in positions], device=device)


@torch.no_grad()
def sampler_mismatch(trainer: torch.Tensor, sampler: torch.Tensor, known: torch.Tensor) -> dict[str, float]:
    """How far the rollout engine's log-probabilities of the sampled tokens are from the trainer's pi_old, over the
    tokens where the engine returned one: mean |log pi_trainer - log pi_sampler| and the k3 KL(sampler || trainer)
    estimate (vLLM's bf16 kernels against the trainer's, or the decoder's cache against a full forward)."""
    if known.sum() == 0:
        return {}
    delta = (trainer.detach() - sampler) * known
    return {"logprob_mismatch": masked_mean(delta.abs(), known).item(),
            "sampler_kl": masked_mean(torch.exp(delta) - delta - 1.0, known).item()}


@torch.no_grad()
def idle_mismatch(model, rollouts: Sequence[Rollout], config: UpdateConfig, pad_id: int,
                  ranks: Ranks = SINGLE) -> dict[str, float]:
    """`sampler_mismatch` of a step that takes no optimizer step, from a no-grad pass of the trainer over the
    step's rollouts (every rank's trained tokens with a sampler log-prob)."""
    trainer = fill_logprobs(model, rollouts, config.micro_batch_size, pad_id, config.temperature, overwrite=False,
                            autocast_dtype=config.autocast_dtype, ranks=ranks)
    absolute = kl = count = 0.0
    for rollout, row in zip(rollouts, trainer):
        if rollout.sampler_logprobs is None:
            continue
        for trained, ours, theirs in zip(rollout.loss_mask, row, rollout.sampler_logprobs):
            if trained:
                delta = ours - theirs
                absolute, kl, count = absolute + abs(delta), kl + math.expm1(delta) - delta, count + 1
    absolute, kl, count = (sum(values) for values in zip(*ranks.gather((absolute, kl, count))))
    return {"logprob_mismatch": absolute / count, "sampler_kl": kl / count} if count else {}


def truncated_importance_weights(trainer: torch.Tensor, sampler: torch.Tensor, known: torch.Tensor,
                                 cap: float) -> torch.Tensor:
    """Truncated importance sampling (TIS) of the sampler/trainer mismatch: w_t = min(pi_old(o_t) / pi_sampler(o_t),
    cap) on tokens with a sampler log-prob, 1 elsewhere; no gradient. The rollouts were drawn from the engine's
    distribution, the objective's ratios are taken against the trainer's pi_old: w_t reweights each token's policy
    loss towards the trainer's distribution, capped so one token cannot dominate."""
    capped = torch.exp((trainer.detach() - sampler).clamp(max=math.log(cap)))
    return torch.where(known.bool(), capped, torch.ones_like(capped))


def micro_batch_loss(model, rollouts: Sequence[Rollout], positions: Sequence[int], config: UpdateConfig, pad_id: int,
                     current_is_old: bool, ref_logprobs: list[list[float]] | None, minibatch: tuple[float, int],
                     entropy_stats: tuple[float, float] | None = None,
                     ) -> tuple[torch.Tensor, dict[str, float], float]:
    """The loss of the micro-batch of rollouts at `positions` (its share of its mini-batch's loss), its statistics
    (the entropy included) and its number of trained tokens. `entropy_stats` are the mini-batch's entropy (mean, std)
    that AEPO's entropy-aware advantage standardises by."""
    batch = pad_batch([rollouts[p] for p in positions], pad_id)
    entropy_map = bool(config.entropy_coeff or config.weights_by_entropy)
    with autocast(model, config.autocast_dtype):
        logprobs, entropy = sequence_logprobs(model, batch["input_ids"], config.temperature,
                                              positions=batch["loss_mask"], with_entropy=True,
                                              entropy_map=entropy_map, entropy_grad=bool(config.entropy_coeff))
    device = logprobs.device
    mask = batch["loss_mask"].to(device)
    old_logprobs = logprobs.detach() if current_is_old else batch["old_logprobs"].to(device)
    entropies = None
    if entropy_map:  # `entropy` is then the (B, T) map: the loss uses it, the statistics its mean
        entropies = entropy
        with torch.no_grad():
            entropy = (entropies * mask).sum() / mask.sum().clamp(min=1)
    ref = None if ref_logprobs is None else padded_reference(ref_logprobs, positions, mask.shape[1], device)
    advantages = token_advantages(batch["advantages"].to(device), mask)
    known = mask * batch["sampler_known"].to(device)
    mismatch = sampler_mismatch(old_logprobs, batch["sampler_logprobs"].to(device), known)
    weights = None
    if config.tis_cap is not None:
        weights = truncated_importance_weights(old_logprobs, batch["sampler_logprobs"].to(device), known,
                                               config.tis_cap)
    if config.weights_by_entropy:
        advantages = TOKEN_WEIGHTINGS[config.token_weighting].apply(advantages, entropies, mask,
                                                                    config.entropy_advantage_coef, entropy_stats)
    loss, stats = policy_loss(logprobs, old_logprobs, advantages, mask, config.loss_spec(), ref_logprobs=ref,
                              entropy=entropies, importance_weights=weights, minibatch=minibatch)
    stats["entropy"] = entropy.item()
    stats.update(mismatch)
    if weights is not None:
        stats["tis_weight"] = masked_mean(weights, known).item()
    return loss, stats, float(mask.sum().item())


@torch.no_grad()
def minibatch_entropy_stats(model, rollouts: Sequence[Rollout], positions: Sequence[int], config: UpdateConfig,
                            pad_id: int, ranks: Ranks = SINGLE) -> tuple[float, float]:
    """(mean, std) of the entropies of the trained tokens of the rollouts at `positions` under `model`, one no-grad
    pass per micro-batch: what AEPO's entropy-aware advantage standardises by. Taken over the whole mini-batch (the
    authors' code takes each micro-batch's), every rank's share of it included, so that how a mini-batch is split
    never changes its loss."""
    values = []
    for chunk in in_lockstep(list(chunks(by_length(positions, rollouts), config.micro_batch_size)), model, ranks):
        if chunk is None:
            idle_pass(model, pad_id)
            continue
        batch = pad_batch([rollouts[p] for p in chunk], pad_id)
        with autocast(model, config.autocast_dtype):
            _, entropy = sequence_logprobs(model, batch["input_ids"], config.temperature,
                                           positions=batch["loss_mask"], entropy_map=True)
        values.append(entropy[batch["loss_mask"].to(entropy.device).bool()].double().cpu())
    flat = torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
    if ranks.size == 1:
        return entropy_moments(flat, torch.ones_like(flat))
    n, total, squares = ranks.sum([flat.numel(), flat.sum().item(), (flat ** 2).sum().item()])
    if n == 0:
        return 0.0, 1.0
    mean = total / n
    variance = (squares - n * mean ** 2) / (n - 1) if n > 1 else 0.0
    std = math.sqrt(max(variance, 0.0))
    return mean, (std if std > 0 else 1.0)


def has_signal(rollouts: Sequence[Rollout], config: UpdateConfig) -> bool:
    """Whether these rollouts give the loss a gradient: a non-zero advantage, or a KL or entropy term."""
    return bool(rollouts) and bool(config.beta or config.entropy_coeff or any(r.advantage != 0 for r in rollouts))


def update_policy(model, optimizer, rollouts: list[Rollout], config: UpdateConfig, pad_id: int,
                  ref_logprobs: list[list[float]] | None = None, ranks: Ranks = SINGLE) -> dict[str, float]:
    """PPO-style update(s) over the step's rollouts: `num_iterations` passes, one optimizer step per mini-batch,
    gradients accumulated over micro-batches (the loss of each micro-batch is its share of the mini-batch loss).

    In a world of N ranks, `rollouts` are this rank's share of the step (whole groups): each global mini-batch is
    every rank's `mini_batch_size / N` next rollouts, its loss normalised by the token and sequence counts summed
    over the ranks, and the optimizer sums the ranks' gradients (`Ranks.sum_gradients`) before it steps. Every rank
    takes the same number of optimizer steps, a rank with fewer rollouts contributing empty mini-batches."""
    if ranks.max(float(has_signal(rollouts, config))) == 0.0:
        # Every group tied (e.g. MACRO or SUCCESS rewards that no rollout earns): the policy gradient is exactly zero,
        # and an optimizer step would still move the weights on Adam's momentum from earlier steps (measured: a
        # CURRICULUM run whose reward turned all-zero kept drifting and lost a fifth of its delivered plans).
        return {"optimizer_steps": 0, **(idle_mismatch(model, rollouts, config, pad_id, ranks)
                                         if config.mismatch_every_step else {})}
    needs_old = config.recompute_old_logprobs or any(r.old_logprobs is None for r in rollouts)
    # One optimizer step over all rollouts: every micro-batch's forward runs on the weights that define pi_old, so
    # pi_old is the detached current log-probability (r_t = 1 exactly, the gradient A_t grad log pi) and the extra
    # no-grad pass over the step's sequences is skipped (TRL does the same when num_iterations is 1).
    current_is_old = needs_old and is_single_step(config, int(ranks.sum([len(rollouts)])[0]))
    recompute = needs_old and not current_is_old
    if recompute:
        fill_logprobs(model, rollouts, config.micro_batch_size, pad_id, config.temperature, overwrite=True,
                      autocast_dtype=config.autocast_dtype, ranks=ranks)
    totals: dict[str, float] = {}
    weight = 0.0
    grad_norms = []
    model.train()
    mini_size = local_mini_batch_size(config.mini_batch_size, ranks) or max(len(rollouts), 1)
    mini_batches = int(ranks.max(math.ceil(len(rollouts) / mini_size)))
    for _ in range(config.num_iterations):
        for mini_start in range(0, mini_batches * mini_size, mini_size):
            minibatch = rollouts[mini_start:mini_start + mini_size]
            tokens, sequences = ranks.sum([sum(r.num_trained for r in minibatch), len(minibatch)])
            order = by_length(range(mini_start, mini_start + len(minibatch)), rollouts)
            micros = list(chunks(order, config.micro_batch_size))
            entropy_stats = (minibatch_entropy_stats(model, rollouts, order, config, pad_id, ranks)
                             if config.weights_by_entropy else None)
            for j, positions in enumerate(in_lockstep(micros, model, ranks)):
                if positions is None:
                    idle_pass(model, pad_id, optimizer)
                    continue
                loss, stats, n = micro_batch_loss(model, rollouts, positions, config, pad_id, current_is_old,
                                                  ref_logprobs, (tokens, int(sequences)), entropy_stats)
                optimizer.backward(loss, sync=j == len(micros) - 1)
                stats["loss"] = loss.item()
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + (value if key == "loss" else value * n)
                weight += n
            grad_norms.append(optimizer.step())
    # every rank's statistics: token-weighted means over the whole step, the loss summed over the ranks' shares
    shares = ranks.gather((totals, weight, sum(r.num_trained for r in rollouts),
                           sum(len(r.input_ids) for r in rollouts)))
    totals = {key: sum(part[0].get(key, 0.0) for part in shares) for key in sorted({k for p in shares for k in p[0]})}
    weight = sum(part[1] for part in shares)
    steps = max(1, len(grad_norms))
    out = {key: (value / steps if key == "loss" else value / max(weight, 1.0)) for key, value in totals.items()}
    out["grad_norm"] = sum(grad_norms) / steps
    out["optimizer_steps"] = len(grad_norms)
    out["trained_tokens"] = sum(part[2] for part in shares) * config.num_iterations
    # forward(+backward) passes over every sequence; AEPO's entropy statistics add a forward pass per iteration
    passes = config.num_iterations * (1 + int(config.weights_by_entropy)) + int(recompute)
    out["processed_tokens"] = sum(part[3] for part in shares) * passes
    return out
