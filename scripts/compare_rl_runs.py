"""Compare an RL run's reward curve with a control rolled out on the same seeded steps, step by step.

A reward curve can "rise" on the order of the queries alone: the tiny preset's rollouts are seeded per step, so a
run and its control (the same params and seed with weights that never move, e.g. `reward.kind: macro` while no plan
passes every check, or `learning_rate: 0`) see the same queries in the same order. A frozen SFT policy's own curve
can pass most of the way to a first-fifth/last-fifth test. This script reads both runs'
`plots/rl/rewards.csv` (the stage's DVC plot; one row per step), rescores every step with one reward kind from the
logged component means, and prints

  * each run's first-fifth and last-fifth means (the trainer's `reward_trend` test, on step means), and
  * the paired difference run - control per step: its mean and standard error over all steps and over the last
    fifth, and its least-squares slope per step with the slope's standard error. Learning shows as a positive
    paired difference that grows over the run (a slope well above 0); query order cancels out.

`--steps` adds the per-step table (both rewards, their difference, both format-error rates).

`--kind logged` compares the reward column the runs logged, as it is: the only choice for a Tool-Star run
(`rl.env.kind: toolstar`, whose curve has no travel components), and for runs whose reward kinds are the same.

Rescoring is exact because every reward kind is linear in the per-episode components and undelivered episodes score
the format reward with all components 0: a step's mean reward = the weighted mean of its component means +
format_reward x format_error_rate.

    python scripts/compare_rl_runs.py runs/sum/plots/rl/rewards.csv runs/frozen/plots/rl/rewards.csv --kind sum
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

KIND_COMPONENTS = {"sum": ("cs_micro", "hard_micro", "cs_macro", "hard_macro", "success"),
                   "macro": ("cs_macro", "hard_macro", "success"), "success": ("success",)}
LOGGED = "logged"  # the curve's own `reward` column (any environment)
KINDS = (*sorted(KIND_COMPONENTS), LOGGED)


def required_columns(kind: str) -> tuple[str, ...]:
    """The columns a curve needs to be scored with `kind`."""
    return ("step", "format_error_rate", *(("reward",) if kind == LOGGED else KIND_COMPONENTS[kind]))


def read_curve(path: Path, kind: str = "sum") -> list[dict[str, float]]:
    """The rows of a run's rewards.csv as floats, in step order; a clear error when it is not one."""
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (the RL stage writes it as <plots>/rewards.csv)")
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise SystemExit(f"{path}: no steps in it")
    required = required_columns(kind)
    missing = [name for name in required if name not in rows[0]]
    if missing:
        hint = " (a Tool-Star run's curve: use --kind logged)" if kind != LOGGED and "reward" in rows[0] else ""
        raise SystemExit(f"{path}: columns {missing} are missing; is it an RL stage's plots/rl/rewards.csv?{hint}")
    try:
        curve = [{key: float(value) for key, value in row.items() if key in required} for row in rows]
    except ValueError as error:
        raise SystemExit(f"{path}: a value is not a number ({error})") from None
    return sorted(curve, key=lambda row: row["step"])


def step_reward(row: dict[str, float], kind: str, format_reward: float = 0.0) -> float:
    """A step's mean reward of `kind` (equal weights) from its component means and format-error rate; `logged`: the
    reward the run logged."""
    if kind == LOGGED:
        return row["reward"]
    names = KIND_COMPONENTS[kind]
    return statistics.fmean(row[name] for name in names) + format_reward * row["format_error_rate"]


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (nan for fewer than two values)."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan"))


def slope_se(values: list[float]) -> tuple[float, float]:
    """Ordinary least-squares slope of `values` against 0, 1, 2, ... and its standard error (nan below 3 points)."""
    n = len(values)
    xs = range(n)
    x_mean, y_mean = (n - 1) / 2, statistics.fmean(values)
    sxx = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, values)) / sxx
    if n < 3:
        return slope, float("nan")
    residual = sum((y - y_mean - slope * (x - x_mean)) ** 2 for x, y in zip(xs, values))
    return slope, math.sqrt(residual / (n - 2) / sxx)


def compare(run: list[dict[str, float]], control: list[dict[str, float]], kind: str = "sum",
            format_reward: float = 0.0) -> dict:
    """Trend of each curve and the paired run - control difference over the steps both have."""
    steps = sorted({row["step"] for row in run} & {row["step"] for row in control})
    if len(steps) < 2:
        raise SystemExit(f"the runs share {len(steps)} step(s); a comparison needs at least 2")
    by_step = [{row["step"]: step_reward(row, kind, format_reward) for row in curve} for curve in (run, control)]
    a = [by_step[0][s] for s in steps]
    b = [by_step[1][s] for s in steps]
    k = max(1, len(steps) // 5)

    def trend(values: list[float]) -> dict:
        first, first_se = mean_se(values[:k])
        last, last_se = mean_se(values[-k:])
        return {"first_fifth": first, "last_fifth": last, "difference": last - first,
                "difference_se": math.hypot(first_se, last_se)}

    diff = [x - y for x, y in zip(a, b)]
    all_mean, all_se = mean_se(diff)
    last_mean, last_se = mean_se(diff[-k:])
    slope, slope_error = slope_se(diff)
    errors = [{row["step"]: row["format_error_rate"] for row in curve} for curve in (run, control)]
    return {"kind": kind, "steps": len(steps), "steps_per_fifth": k, "run": trend(a), "control": trend(b),
            "paired": {"mean": all_mean, "se": all_se, "last_fifth_mean": last_mean, "last_fifth_se": last_se,
                       "slope_per_step": slope, "slope_se": slope_error},
            "per_step": [{"step": int(s), "run": x, "control": y, "run_format_errors": errors[0][s],
                          "control_format_errors": errors[1][s]} for s, x, y in zip(steps, a, b)]}


def report(result: dict, per_step: bool = False) -> str:
    def row(name: str, t: dict) -> str:
        return (f"{name:<8} {t['first_fifth']:.4f} -> {t['last_fifth']:.4f}  "
                f"({t['difference']:+.4f} +- {t['difference_se']:.4f} step-mean SE)")

    p = result["paired"]
    return "\n".join([
        f"{result['kind'].upper()} reward over {result['steps']} shared steps ({result['steps_per_fifth']} a fifth)",
        "         first fifth -> last fifth",
        row("run", result["run"]), row("control", result["control"]),
        f"paired run - control: all steps {p['mean']:+.4f} +- {p['se']:.4f}; "
        f"last fifth {p['last_fifth_mean']:+.4f} +- {p['last_fifth_se']:.4f}; "
        f"slope {p['slope_per_step']:+.5f} +- {p['slope_se']:.5f} a step",
    ] + ([" step     run  control     diff  format errors run / control"] + [
        f"{r['step']:5d}  {r['run']:.4f}   {r['control']:.4f}  {r['run'] - r['control']:+.4f}  "
        f"{r['run_format_errors']:.0%} / {r['control_format_errors']:.0%}" for r in result["per_step"]]
        if per_step else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the trained run's plots/rl/rewards.csv")
    parser.add_argument("control", type=Path, help="the control's plots/rl/rewards.csv (same seed, frozen weights)")
    parser.add_argument("--kind", choices=KINDS, default="sum",
                        help="rescore both with it (logged: compare the logged reward as it is)")
    parser.add_argument("--format-reward", type=float, default=0.0, help="rl.reward.format_reward of the runs")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    parser.add_argument("--steps", action="store_true", help="also print the per-step table")
    args = parser.parse_args(argv)
    result = compare(read_curve(args.run, args.kind), read_curve(args.control, args.kind), args.kind,
                     args.format_reward)
    print(report(result, per_step=args.steps))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
