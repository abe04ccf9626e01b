"""Compare two greedy evaluations of the same held-out set item by item: the paired difference run - base.

Reads the episode records the evaluation stages write and pairs them by task id (Tool-Star) or query idx (travel):

  * Tool-Star (`star toolstar eval --records`, e.g. data/toolstar/eval/rl.jsonl): `reward` (Tool-Star's: -1 format
    error, the answer's score, +0.1 for both tools) and `correct`;
  * travel (`star validate`, data/validate/<ckpt>.jsonl): `delivered`, `commonsense_micro` (the share of the 8
    commonsense checks a query passes; 0 when no plan was delivered) and `final_pass`, in `--mode` strict or official.

For each metric it prints both means, the 95% Wilson interval of each rate, and the paired difference with its
standard error; `*` marks a difference over twice its standard error. Per-item difficulty cancels in the pairing,
so a small set shows an effect that two separate rates would hide.

    python scripts/compare_evals.py data/toolstar/eval/rl.jsonl data/toolstar/eval/sft.jsonl
    python scripts/compare_evals.py data/validate/rl.jsonl data/validate/sft.jsonl --mode strict
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from components.stats import paired_difference, wilson_interval  # noqa: E402

TRAVEL_RATES = ("delivered", "final_pass")  # per-query pass/fail: these get a Wilson interval
TOOLSTAR_RATES = ("correct",)


def read_records(path: Path) -> list[dict]:
    """The episode records of an evaluation file; a clear error for a missing, empty or malformed one."""
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (an evaluation stage's records, e.g. data/toolstar/eval/sft.jsonl)")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("evaluation"), dict):
            raise SystemExit(f"{path}:{number}: not an evaluated episode record (no 'evaluation' object)")
        records.append(record)
    if not records:
        raise SystemExit(f"{path}: no records in it")
    return records


def item_key(record: dict):
    """A record's item: the Tool-Star task id, else the travel query idx."""
    return record.get("id", record.get("idx"))


def item_scores(record: dict, mode: str) -> dict[str, float]:
    """The per-item metrics of one record (see the module docstring)."""
    evaluation = record["evaluation"]
    if "reward" in evaluation:  # a Tool-Star episode
        return {"reward": float(evaluation["reward"]), "correct": float(bool(evaluation.get("correct")))}
    if mode not in evaluation:
        raise SystemExit(f"record {item_key(record)}: no '{mode}' evaluation (modes: {', '.join(evaluation)})")
    verdict = evaluation[mode]
    checks = verdict.get("commonsense") or {}
    passed = sum(1 for check in checks.values() if check.get("status") == "pass")
    delivered = bool(verdict.get("delivered"))
    return {"delivered": float(delivered), "commonsense_micro": passed / 8 if delivered else 0.0,
            "final_pass": float(bool(verdict.get("final_pass")))}


def compare(run: list[dict], base: list[dict], mode: str = "strict") -> dict:
    """Both means and the paired difference of every metric over the items both files scored."""
    run_by_key = {item_key(r): item_scores(r, mode) for r in run}
    base_by_key = {item_key(r): item_scores(r, mode) for r in base}
    keys = [key for key in run_by_key if key in base_by_key]
    if not keys:
        raise SystemExit("the two files share no item (task id / query idx): were they evaluated on the same set?")
    metrics = list(run_by_key[keys[0]])
    rates = TOOLSTAR_RATES + TRAVEL_RATES
    result: dict = {"n": len(keys), "only_in_run": len(run_by_key) - len(keys),
                    "only_in_base": len(base_by_key) - len(keys), "metrics": {}}
    for metric in metrics:
        a = [run_by_key[k][metric] for k in keys]
        b = [base_by_key[k][metric] for k in keys]
        entry = {"run": sum(a) / len(a), "base": sum(b) / len(b), "paired": paired_difference(a, b)}
        if metric in rates:
            entry["run_ci95"] = list(wilson_interval(sum(a), len(a)))
            entry["base_ci95"] = list(wilson_interval(sum(b), len(b)))
        result["metrics"][metric] = entry
    return result


def report(result: dict) -> str:
    lines = [f"{result['n']} items in both files"
             + (f" ({result['only_in_run']} only in run, {result['only_in_base']} only in base)"
                if result["only_in_run"] or result["only_in_base"] else ""),
             f"{'metric':<18} {'run':>22} {'base':>22} {'paired run - base':>22}"]
    for metric, entry in result["metrics"].items():
        def shown(side: str) -> str:
            interval = entry.get(f"{side}_ci95")
            return f"{entry[side]:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")

        paired = entry["paired"]
        significant = "*" if paired["se"] == paired["se"] and abs(paired["mean"]) > 2 * paired["se"] > 0 else " "
        lines.append(f"{metric:<18} {shown('run'):>22} {shown('base'):>22} "
                     f"{paired['mean']:+.3f} +- {paired['se']:.3f} {significant}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the evaluated checkpoint's records (e.g. the RL model's)")
    parser.add_argument("base", type=Path, help="the records it is compared with, on the same set (e.g. SFT's)")
    parser.add_argument("--mode", choices=("strict", "official"), default="strict", help="travel: evaluator mode")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = compare(read_records(args.run), read_records(args.base), args.mode)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
