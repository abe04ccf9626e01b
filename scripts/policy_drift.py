"""Where an RL checkpoint moved from its reference (the SFT checkpoint, or a frozen control's), on episodes it sampled.

    star rollout --model models/rl --params runs/sampled.yaml --world data/world --queries data/queries/rl.jsonl \
      --max-queries 16 --out runs/drift/rl.jsonl          # runs/sampled.yaml: params/validate.yaml at temperature 1
    python scripts/policy_drift.py --run models/rl --reference models/sft --records runs/drift/rl.jsonl

Every assistant turn of the records is teacher-forced through both checkpoints (float32, temperature 1), and each of
its tokens gets the log-ratio log pi_run(token) - log pi_ref(token) and both models' entropies. It prints, by the kind
of turn the agent loop recorded (a tool call, a protocol error, the answer, ...):

  * the tokens, the mean log-ratio (over tokens the run sampled, an estimate of KL(run || ref)), the share of tokens
    whose probability rose or fell more than e-fold, and both entropies;
  * for the broken turns (protocol errors), where they broke: the first token whose log-ratio exceeds 1, and the
    tokens whose probability rose most, as text;
  * how far the weights moved: the root mean square change per weight, in units of `--learning-rate` (Adam moves
    each weight by about the learning rate per step whatever the gradient's size, so after k steps of consistent
    sign it reads about k), and the largest changes by tensor.

`--json FILE` also writes the numbers. Nothing is executed from the records: they are read as text.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BIG = 1.0  # a log-ratio above this: the token's probability rose more than e-fold


def read_records(path: Path) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (write it with `star rollout --out {path}`)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        raise SystemExit(f"{path}: no records in it")
    return records


def turn_spans(tokenizer, record: dict) -> tuple[list[int], list[tuple[str, int, int]]]:
    """The record's token ids as the trainer builds them, and (turn kind, start, end) of each assistant turn."""
    from components.training.sft import encode_segments

    kinds = [turn["kind"] for turn in record["turns"]]
    ids: list[int] = []
    spans = []
    assistant = 0
    for message, segment, _ in encode_segments(tokenizer, record["messages"]):
        if message is not None and message["role"] == "assistant":
            kind = kinds[assistant] if assistant < len(kinds) else "unrecorded"
            spans.append((kind, len(ids), len(ids) + len(segment)))
            assistant += 1
        ids.extend(segment)
    return ids, spans


def token_stats(model, ids: list[int]):
    """(log-prob of each token given the ones before, entropy of that next-token distribution), for positions 1.."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(ids[1:])
        chosen = logp.gather(1, target[:, None])[:, 0]
        entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy


def drift(run, reference, tokenizer, records: list[dict]) -> tuple[dict, list[dict], Counter]:
    """Per turn kind: token counts and sums; the broken turns' first big rise; the risen tokens' texts."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    breaks: list[dict] = []
    risen: Counter = Counter()
    for record in records:
        ids, spans = turn_spans(tokenizer, record)
        run_logp, run_entropy = token_stats(run, ids)
        ref_logp, ref_entropy = token_stats(reference, ids)
        for kind, start, end in spans:
            positions = slice(start - 1, end - 1)  # position p predicts token p + 1
            ratio = run_logp[positions] - ref_logp[positions]
            row = sums[kind]
            row["turns"] += 1
            row["tokens"] += len(ratio)
            row["log_ratio"] += float(ratio.sum())
            row["rose"] += int((ratio > BIG).sum())
            row["fell"] += int((ratio < -BIG).sum())
            row["run_entropy"] += float(run_entropy[positions].sum())
            row["ref_entropy"] += float(ref_entropy[positions].sum())
            if kind == "protocol_error":
                big = [i for i, value in enumerate(ratio.tolist()) if value > BIG]
                breaks.append({"idx": record["idx"], "tokens": len(ratio), "first_big_rise": big[0] if big else None,
                               "max_log_ratio": float(ratio.max()) if len(ratio) else 0.0})
                for i in big:
                    risen[tokenizer.decode([ids[start + i]])] += 1
    return {kind: dict(row) for kind, row in sums.items()}, breaks, risen


def weight_change(run, reference, learning_rate: float, top: int = 5) -> dict:
    """Root mean square change per weight (in learning rates), and the tensors that moved most."""
    import torch

    ref = dict(reference.named_parameters())
    squares, count, per_tensor = 0.0, 0, []
    with torch.no_grad():
        for name, weight in run.named_parameters():
            delta = (weight.float() - ref[name].float())
            squares += float((delta ** 2).sum())
            count += delta.numel()
            per_tensor.append((float(delta.pow(2).mean().sqrt()) / learning_rate, name))
    per_tensor.sort(reverse=True)
    return {"rms_change_in_lr": math.sqrt(squares / max(count, 1)) / learning_rate, "weights": count,
            "largest": [{"tensor": name, "rms_change_in_lr": value} for value, name in per_tensor[:top]]}


def print_report(sums: dict, breaks: list[dict], risen: Counter, weights: dict) -> None:
    print(f"{'turn kind':<16}{'turns':>6}{'tokens':>8}{'mean log-ratio':>16}{'rose e-fold':>13}{'fell e-fold':>13}"
          f"{'H run':>8}{'H ref':>8}")
    for kind, row in sorted(sums.items(), key=lambda item: -item[1]["tokens"]):
        n = max(row["tokens"], 1)
        print(f"{kind:<16}{int(row['turns']):>6}{int(row['tokens']):>8}{row['log_ratio'] / n:>16.4f}"
              f"{row['rose'] / n:>13.2%}{row['fell'] / n:>13.2%}{row['run_entropy'] / n:>8.3f}"
              f"{row['ref_entropy'] / n:>8.3f}")
    if breaks:
        firsts = [b["first_big_rise"] for b in breaks if b["first_big_rise"] is not None]
        print(f"\nbroken turns: {len(breaks)}; with a token risen e-fold: {len(firsts)}; the first such token at "
              f"position {sorted(firsts)} of turns of {sorted(b['tokens'] for b in breaks)} tokens")
        print("tokens risen e-fold in broken turns: "
              + ", ".join(f"{text!r} x{count}" for text, count in risen.most_common(15)))
    print(f"\nweights: RMS change {weights['rms_change_in_lr']:.3f} learning rates over {weights['weights']:,} "
          "weights; most moved: " + ", ".join(f"{t['tensor']} {t['rms_change_in_lr']:.2f}"
                                             for t in weights["largest"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the trained checkpoint (it sampled the records)")
    parser.add_argument("--reference", required=True, help="the checkpoint it started from (models/sft)")
    parser.add_argument("--records", required=True, type=Path, help="`star rollout` trajectories of --run")
    parser.add_argument("--learning-rate", type=float, default=5e-5, help="the run's rl.learning_rate")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    from components.models.loading import load_policy_model, load_tokenizer

    records = read_records(args.records)
    tokenizer = load_tokenizer(args.run)
    run = load_policy_model(args.run, dtype="float32", device="cpu").eval()
    reference = load_policy_model(args.reference, dtype="float32", device="cpu").eval()
    sums, breaks, risen = drift(run, reference, tokenizer, records)
    weights = weight_change(run, reference, args.learning_rate)
    print_report(sums, breaks, risen, weights)
    if args.json:
        args.json.write_text(json.dumps({"by_turn_kind": sums, "broken_turns": breaks,
                                         "risen_in_broken_turns": dict(risen.most_common(50)), "weights": weights},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
