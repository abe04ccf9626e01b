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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from components.training.rl.advantages import (never_reinforce, rejected_turn_credit, reweight_by_probability,
                                               token_advantages)
from components.training.rl.losses import policy_loss, token_entropy, token_logprobs


@dataclass
class Rollout:
    """One trajectory as the update sees it."""

    input_ids: list[int]
    loss_mask: list[int]
    advantage: float
    old_logprobs: list[float] | None = None  # aligned with input_ids (0 on the prompt); None: recompute
    rejected: list[int] | None = None  # aligned with input_ids: 1 on the tokens of turns the environment rejected
    credit: list[float] | None = None  # aligned with input_ids: A_t for these rejected tokens where non-zero
    # (a kind with its own advantage, e.g. rl.repeat_advantage); elsewhere rejected tokens get rejected_turn_advantage

    @property
    def num_trained(self) -> int:
        return int(sum(self.loss_mask))


REJECTED_KINDS = ("protocol_error", "truncated", "loop", "name_slip", "repeat")  # which sampled tokens count as
# rejected: turns of the agent loop's record["turns"] the env did not accept (protocol errors, turns cut at the
# per-turn token limit, or only the repeating tail of a cut turn), the tokens that coined a name
# (name_slips.NameSlipMarker) or that named a restaurant or attraction a second time (repeats.RepeatMarker)
TOKEN_KINDS = ("name_slip", "repeat")  # marked token by token by a marker, not from record["turns"]
LOOP_MIN_TOKENS = 32  # a cut turn's tail is a loop when at least this many tokens repeat an earlier stretch ...
LOOP_MAX_PERIOD = 32  # ... of at most this many tokens


def repeating_tail(ids: Sequence[int], min_tokens: int = LOOP_MIN_TOKENS, max_period: int = LOOP_MAX_PERIOD,
                   slack: int = 2) -> int | None:
    """Where the loop that runs to the end of `ids` starts repeating: the index of the first token that copies the
    token `period` places before it, for the period (1 to `max_period` tokens) whose repetition reaches furthest
    back; None unless at least `min_tokens` tokens repeat. Up to `slack` tokens at the very end may break the pattern
    (a turn cut mid-unit). `a b c d e f e f e f` -> 6 (the second `e`): the first `e f` is the loop's first copy,
    written before the policy started repeating itself."""
    for cut in range(min(slack, len(ids)) + 1):
        n = len(ids) - cut
        best_start, best_repeated = None, 0
        for period in range(1, min(max_period, n // 2) + 1):
            start = n  # the repeated stretch [start, n): ids[j] == ids[j - period] for every j in it
            while start - 1 >= period and ids[start - 1] == ids[start - 1 - period]:
                start -= 1
            if n - start > best_repeated:
                best_start, best_repeated = start, n - start
        if best_repeated >= min_tokens:
            return best_start
    return None


def rejected_turn_tokens(record: dict, kinds: Sequence[str] = REJECTED_KINDS) -> list[int]:
    """Per response token, 1 where it belongs to a turn of one of `kinds` the environment did not accept: a protocol
    error (answered with the format reminder), a turn cut at the per-turn token limit (`truncated`: never parsed,
    mostly loops), or only the repeating tail of such a cut turn (`loop`, see `repeating_tail`: the tokens that copy
    the ones just before them; the plan the turn was writing before it looped is left alone).

    Every sampled turn is one run of 1s in `response_mask` (its observation, a run of 0s, separates it from the
    next), and `turns` lists the turns in the same order, so the i-th run is `turns[i]`.
    """
    mask, turns = record["response_mask"], record.get("turns") or []
    unknown = set(kinds) - set(REJECTED_KINDS)
    if unknown:
        raise ValueError(f"unknown rejected turn kinds {sorted(unknown)}; choose from {list(REJECTED_KINDS)}")
    whole = {kind for kind in kinds if kind != "loop" and kind not in TOKEN_KINDS}  # markers: TOKEN_KINDS
    looping = "loop" in kinds
    if not any(turn.get("kind") in whole or (looping and turn.get("kind") == "truncated") for turn in turns):
        return [0] * len(mask)
    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    if len(starts) != len(turns):
        raise ValueError(f"record {record.get('idx')}: {len(starts)} sampled segments but {len(turns)} turns; "
                         "was it written by this version of the agent loop?")
    out = [0] * len(mask)
    for start, turn in zip(starts, turns):
        end = start
        while end < len(mask) and mask[end]:
            end += 1
        if turn.get("kind") in whole:
            first = start
        elif looping and turn.get("kind") == "truncated":
            tail = repeating_tail(record["response_ids"][start:end])
            if tail is None:
                continue
            first = start + tail
        else:
            continue
        out[first:end] = [1] * (end - first)
    return out


def rollout_from_record(record: dict, advantage: float, rejected_kinds: Sequence[str] = (),
                        marks: Sequence[int] | None = None, only_rejected: bool = False,
                        credit: Sequence[float] | None = None) -> Rollout:
    """The Rollout of a trajectory record (prompt_ids, response_ids, response_mask, response_logprobs; with
    `rejected_kinds`, also `turns`: which tokens belong to turns of those kinds the environment rejected; with
    `marks` (per response token, from the TOKEN_KINDS markers, e.g. `NameSlipMarker.marks`) those tokens count as
    rejected too). With `only_rejected` (a greedy probe) the loss mask keeps only the rejected tokens: nothing else
    of the episode is trained. `credit` (per response token, 0 = none) gives marked tokens an advantage of their
    own in place of `rejected_turn_advantage`."""
    prompt, response, mask = record["prompt_ids"], record["response_ids"], record["response_mask"]
    if len(response) != len(mask):
        raise ValueError(f"record {record.get('idx')}: {len(response)} response ids but {len(mask)} mask entries")
    logprobs = record.get("response_logprobs")
    old = [0.0] * len(prompt) + list(logprobs) if logprobs is not None and len(logprobs) == len(response) else None
    rejected = None
    if rejected_kinds or marks is not None:
        rejected = rejected_turn_tokens(record, rejected_kinds) if rejected_kinds else [0] * len(response)
        if marks is not None:
            if len(marks) != len(response):
                raise ValueError(f"record {record.get('idx')}: {len(marks)} token marks for "
                                 f"{len(response)} response ids")
            rejected = [int(a or b) for a, b in zip(rejected, marks)]
        rejected = [0] * len(prompt) + rejected
    elif only_rejected:
        raise ValueError("only_rejected needs rejected_kinds or marks: which tokens of the probe to train")
    loss_mask = [0] * len(prompt) + list(mask)
    if only_rejected:
        loss_mask = [int(m and r) for m, r in zip(loss_mask, rejected)]
    if credit is not None:
        if len(credit) != len(response) or rejected is None:
            raise ValueError(f"record {record.get('idx')}: {len(credit)} credit values for {len(response)} response "
                             "ids (credit goes with the marks of the tokens it is for)")
        credit = [0.0] * len(prompt) + [float(c) if r else 0.0 for c, r in zip(credit, rejected[len(prompt):])]
    return Rollout(input_ids=list(prompt) + list(response), loss_mask=loss_mask,
                   advantage=float(advantage), old_logprobs=old, rejected=rejected, credit=credit)


def pad_batch(rollouts: Sequence[Rollout], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded (B, T) tensors: input_ids, loss_mask, old_logprobs (0 where unknown), and the (B,) advantages."""
    width = max(len(r.input_ids) for r in rollouts)

    def pad(values: list, fill) -> list:
        return list(values) + [fill] * (width - len(values))

    return {
        "input_ids": torch.tensor([pad(r.input_ids, pad_id) for r in rollouts], dtype=torch.long),
        "loss_mask": torch.tensor([pad(r.loss_mask, 0) for r in rollouts], dtype=torch.float32),
        "old_logprobs": torch.tensor([pad(r.old_logprobs or [0.0] * len(r.input_ids), 0.0) for r in rollouts],
                                     dtype=torch.float32),
        "advantages": torch.tensor([r.advantage for r in rollouts], dtype=torch.float32),
        "rejected": torch.tensor([pad(r.rejected or [0] * len(r.input_ids), 0) for r in rollouts], dtype=torch.bool),
        "credit": torch.tensor([pad(r.credit or [0.0] * len(r.input_ids), 0.0) for r in rollouts],
                               dtype=torch.float32),
    }


def sequence_logprobs(model, input_ids: torch.Tensor, temperature: float = 1.0,
                      positions: torch.Tensor | None = None,
                      with_entropy: bool = False,
                      entropy_map: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T) log pi(id_t | ids_<t) of right-padded sequences under logits / temperature (0 at t = 0), and with
    `with_entropy` the mean entropy of the next-token distributions scored (no gradient). With `entropy_map` the
    second value is instead the (B, T) entropy H_t of the distribution that predicted id_t, aligned like the
    log-probs (0 at t = 0 and at unscored positions) and with its gradient, for an entropy term in the loss.

    With `positions` (a (B, T) 0/1 mask, e.g. the loss mask), the output layer runs only on the hidden states that
    predict those tokens and every other position holds 0: the (tokens x vocabulary) logits of the tool responses and
    prompts, which nothing reads, are never built (a real model's vocabulary is 152K wide).
    """
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    targets = input_ids[:, 1:]
    base = getattr(model, "module", model)  # DeepSpeed/accelerate wrap the model
    if positions is None:
        logits = model(input_ids=input_ids).logits[:, :-1].float() / temperature
        scored = token_logprobs(logits, targets)
    else:
        keep = positions[:, 1:].to(device).bool()
        hidden = base.get_decoder()(input_ids=input_ids).last_hidden_state[:, :-1]
        logits = base.get_output_embeddings()(hidden[keep]).float() / temperature  # (N, V)
        picked = token_logprobs(logits.unsqueeze(0), targets[keep].unsqueeze(0)).squeeze(0)
        scored = torch.zeros(targets.shape, device=device, dtype=picked.dtype).masked_scatter(keep, picked)
    logprobs = torch.cat([torch.zeros(input_ids.shape[0], 1, device=device, dtype=scored.dtype), scored], dim=1)
    if entropy_map:
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


def by_length(indices: Sequence[int], rollouts: Sequence[Rollout]) -> list[int]:
    """`indices` sorted by sequence length, so micro-batches hold sequences of similar length (less padding)."""
    return sorted(indices, key=lambda i: len(rollouts[i].input_ids))


def chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


@torch.no_grad()
def fill_logprobs(model, rollouts: Sequence[Rollout], micro_batch_size: int, pad_id: int, temperature: float,
                  overwrite: bool) -> list[list[float]]:
    """Log-probabilities of the trained tokens of every rollout under `model` (no gradient; 0 at untrained
    positions, which nothing reads), e.g. pi_old before the update or pi_ref. With `overwrite`, they also become
    the rollouts' `old_logprobs`."""
    out: list[list[float]] = [[] for _ in rollouts]
    for positions in chunks(by_length(range(len(rollouts)), rollouts), micro_batch_size):
        batch = pad_batch([rollouts[p] for p in positions], pad_id)
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
    advantage_reweight_alpha: float = 0.0
    reinforce_rejected_turns: bool = True
    rejected_turn_advantage: float | None = None
    entropy_coeff: float = 0.0
    anchor_coef: float = 0.0  # rl.sft_anchor.coef: weight of the teacher trajectories' NLL in every optimizer step


def is_single_step(config: UpdateConfig, n_rollouts: int) -> bool:
    """Whether an update is exactly one optimizer step over all `n_rollouts` (one pass, one mini-batch): then no
    weight changes between the forward passes of its micro-batches, and each pass's log-probabilities are pi_old's."""
    return config.num_iterations == 1 and (config.mini_batch_size or n_rollouts) >= n_rollouts


def anchor_backward(model, optimizer, examples: Sequence, coef: float, micro_batch_size: int, pad_id: int) -> float:
    """Accumulate coef * (mean NLL over the assistant tokens of `examples`, sft.SFTExample teacher trajectories) into
    the gradients, micro-batch by micro-batch; returns that mean NLL (the SFT stage's loss on them)."""
    from components.training.sft import collate, masked_loss_sum

    total = sum(sum(e.mask[1:]) for e in examples)  # position 0 predicts nothing
    if not examples or total == 0:
        return 0.0
    nll = 0.0
    for micro in chunks(sorted(examples, key=len), micro_batch_size):
        batch = collate(list(micro), pad_id)
        device = next(model.parameters()).device
        loss_sum, _ = masked_loss_sum(model, {k: v.to(device) for k, v in batch.items()})
        optimizer.backward(coef * loss_sum / total, sync=False)
        nll += loss_sum.item()
    return nll / total


def update_policy(model, optimizer, rollouts: list[Rollout], config: UpdateConfig, pad_id: int,
                  ref_logprobs: list[list[float]] | None = None, anchor: Sequence | None = None) -> dict[str, float]:
    """PPO-style update(s) over the step's rollouts: `num_iterations` passes, one optimizer step per mini-batch,
    gradients accumulated over micro-batches (the loss of each micro-batch is its share of the mini-batch loss).
    With `anchor` (teacher trajectories) and `config.anchor_coef` > 0, each optimizer step also descends
    anchor_coef * their mean NLL (`anchor_backward`)."""
    turn_credit = bool(config.rejected_turn_advantage) and any(any(r.rejected or ()) for r in rollouts)
    anchored = bool(config.anchor_coef) and bool(anchor)
    if not rollouts or (config.beta == 0 and config.entropy_coeff == 0 and not turn_credit and not anchored
                        and all(r.advantage == 0 for r in rollouts)):
        # Every group tied (e.g. MACRO or SUCCESS rewards that no rollout earns): the policy gradient is exactly zero,
        # and an optimizer step would still move the weights on Adam's momentum from earlier steps (measured: a
        # CURRICULUM run whose reward turned all-zero kept drifting and lost a fifth of its delivered plans).
        return {"optimizer_steps": 0}
    needs_old = config.recompute_old_logprobs or any(r.old_logprobs is None for r in rollouts)
    # One optimizer step over all rollouts: every micro-batch's forward runs on the weights that define pi_old, so
    # pi_old is the detached current log-probability (r_t = 1 exactly, the gradient A_t grad log pi) and the extra
    # no-grad pass over the step's sequences is skipped (TRL does the same when num_iterations is 1).
    current_is_old = needs_old and is_single_step(config, len(rollouts))
    recompute = needs_old and not current_is_old
    if recompute:
        fill_logprobs(model, rollouts, config.micro_batch_size, pad_id, config.temperature, overwrite=True)
    totals: dict[str, float] = {}
    weight = 0.0
    grad_norms, anchor_nll = [], []
    model.train()
    mini_size = config.mini_batch_size or len(rollouts)
    for _ in range(config.num_iterations):
        for mini_start in range(0, len(rollouts), mini_size):
            if anchored:
                anchor_nll.append(anchor_backward(model, optimizer, anchor, config.anchor_coef,
                                                  config.micro_batch_size, pad_id))
            minibatch = rollouts[mini_start:mini_start + mini_size]
            tokens = sum(r.num_trained for r in minibatch)
            order = by_length(range(mini_start, mini_start + len(minibatch)), rollouts)
            micros = list(chunks(order, config.micro_batch_size))
            for j, positions in enumerate(micros):
                micro = [rollouts[p] for p in positions]
                batch = pad_batch(micro, pad_id)
                logprobs, entropy = sequence_logprobs(model, batch["input_ids"], config.temperature,
                                                      positions=batch["loss_mask"], with_entropy=True,
                                                      entropy_map=bool(config.entropy_coeff))
                device = logprobs.device
                mask = batch["loss_mask"].to(device)
                old_logprobs = logprobs.detach() if current_is_old else batch["old_logprobs"].to(device)
                entropies = None
                if config.entropy_coeff:
                    entropies = entropy
                    with torch.no_grad():
                        entropy = (entropies * mask).sum() / mask.sum().clamp(min=1)
                ref = None
                if ref_logprobs is not None:
                    width = mask.shape[1]
                    ref = torch.tensor([ref_logprobs[p] + [0.0] * (width - len(ref_logprobs[p])) for p in positions],
                                       device=device)
                advantages = token_advantages(batch["advantages"].to(device), mask)
                if config.advantage_reweight_alpha:
                    advantages = reweight_by_probability(advantages, old_logprobs, mask,
                                                         config.advantage_reweight_alpha)
                if not config.reinforce_rejected_turns:
                    advantages = never_reinforce(advantages, batch["rejected"].to(device))
                if config.rejected_turn_advantage is not None:
                    advantages = rejected_turn_credit(advantages, batch["rejected"].to(device) & mask.bool(),
                                                      config.rejected_turn_advantage)
                    credit = batch["credit"].to(device)
                    advantages = torch.where((credit != 0) & mask.bool(), credit, advantages)
                loss, stats = policy_loss(
                    logprobs, old_logprobs, advantages, mask, epsilon=config.epsilon,
                    epsilon_high=config.epsilon_high, beta=config.beta, ref_logprobs=ref, loss_type=config.loss_type,
                    minibatch_tokens=tokens, minibatch_sequences=len(minibatch),
                    max_completion_length=config.max_completion_length, entropy_coeff=config.entropy_coeff,
                    entropy=entropies)
                optimizer.backward(loss, sync=j == len(micros) - 1)
                n = float(mask.sum().item())
                stats["entropy"] = entropy.item()
                stats["loss"] = loss.item()
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + (value if key == "loss" else value * n)
                weight += n
            grad_norms.append(optimizer.step())
    steps = max(1, len(grad_norms))
    out = {key: (value / steps if key == "loss" else value / max(weight, 1.0)) for key, value in totals.items()}
    out["grad_norm"] = sum(grad_norms) / steps
    if anchor_nll:
        out["anchor_nll"] = sum(anchor_nll) / len(anchor_nll)
    out["optimizer_steps"] = len(grad_norms)
    out["trained_tokens"] = sum(r.num_trained for r in rollouts) * config.num_iterations
    passes = config.num_iterations + int(recompute)  # forward(+backward) passes over every sequence
    out["processed_tokens"] = sum(len(r.input_ids) for r in rollouts) * passes
    return out
