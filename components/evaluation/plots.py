"""Report figures (matplotlib, Agg backend): reward curves, per-check pass rates, in-domain vs out-of-domain."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import PercentFormatter  # noqa: E402

REWARD_COMPONENT_LABELS = {
    "reward": "reward (used for training)",
    "cs_micro": "commonsense micro",
    "hard_micro": "hard micro",
    "cs_macro": "commonsense macro",
    "hard_macro": "hard macro",
    "success": "success (final pass)",
    "format": "format",
    "task_reward": "task reward (before format shaping)",
    "format_error_rate": "format error rate (share of rollouts)",
}
SPREAD_COLUMN = "reward_std"  # the spread of the training reward within a step: a band around it, not a curve


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what exists so far)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_reward_curves(rows: list[dict], out: str | Path, smoothing: int = 5) -> Path:
    """Every reward column of plots/rl/rewards.csv against `step`: raw values faint, a moving average bold."""
    out = Path(out)
    columns = [c for c in rows[0] if c not in ("step", SPREAD_COLUMN) and _numeric_column(rows, c)]
    columns.sort(key=lambda c: c == "reward")  # the training reward last, drawn on top of the components
    steps = [float(r["step"]) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 5), dpi=120)
    if "reward" in columns and SPREAD_COLUMN in rows[0] and _numeric_column(rows, SPREAD_COLUMN):
        mean = [float(r["reward"]) for r in rows]
        spread = [float(r[SPREAD_COLUMN]) for r in rows]
        ax.fill_between(steps, [m - s for m, s in zip(mean, spread)], [m + s for m, s in zip(mean, spread)],
                        color="black", alpha=0.08, linewidth=0, label="reward ± std within the step")
    for i, column in enumerate(columns):
        values = [float(r[column]) for r in rows]
        color = "black" if column == "reward" else f"C{i % 10}"
        style = {"linewidth": 2.2, "linestyle": (0, (5, 2)), "zorder": 3} if column == "reward" else {"linewidth": 1.6}
        if smoothing > 1 and len(values) > smoothing:
            ax.plot(steps, values, color=color, alpha=0.2, linewidth=1)
            values = moving_average(values, smoothing)
        ax.plot(steps, values, color=color, label=REWARD_COMPONENT_LABELS.get(column, column), **style)
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward over the step's rollouts")
    title = "RL reward per component"
    ax.set_title(title + (f" (moving average over {smoothing} steps; raw values faint)" if smoothing > 1 else ""))
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return _save(fig, out)


EVAL_SET_METRICS = {"delivery_rate": "delivered", "commonsense_micro": "commonsense micro",
                    "final_pass": "final pass"}


def eval_curve_columns(columns: list[str]) -> tuple[list[str], list[str]]:
    """(headline, checks) of eval.csv's `columns`: travel's headline set metrics (`EVAL_SET_METRICS`) and its
    commonsense checks (`is_*`) where the file has them; any other environment's every column but the step."""
    headline = [c for c in EVAL_SET_METRICS if c in columns]
    checks = [c for c in columns if c.startswith("is_")]
    if headline or checks:
        return headline, checks
    return [c for c in columns if c != "step"], []


def plot_eval_curves(rows: list[dict], out: str | Path) -> Path:
    """plots/rl/eval.csv against `step`: the headline set metrics bold, each check's pass rate thin."""
    out = Path(out)
    steps = [float(r["step"]) for r in rows]
    headline, checks = eval_curve_columns(list(rows[0]))
    checks = [c for c in checks if _numeric_column(rows, c)]
    headline = [c for c in headline if _numeric_column(rows, c)]
    fig, ax = plt.subplots(figsize=(9, 5), dpi=120)
    for i, column in enumerate(checks):
        ax.plot(steps, [float(r[column]) for r in rows], color=f"C{i % 10}", linewidth=1, alpha=0.6, marker=".",
                label=column)
    styles = ["-", "--", ":", "-."]
    for i, column in enumerate(headline):
        ax.plot(steps, [float(r[column]) for r in rows], color="black" if checks else f"C{i % 10}", linewidth=2.2,
                linestyle=styles[i % len(styles)], marker="o", label=EVAL_SET_METRICS.get(column, column))
    ax.set_xlabel("RL step (0: the model RL started from)")
    values = [float(r[c]) for r in rows for c in (*headline, *checks)]
    if all(0.0 <= v <= 1.0 for v in values):  # rates (travel's, and any environment's shares)
        ax.set_ylabel("share of held-out records")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylim(-0.02, 1.02)
    ax.set_title("Greedy decoding on held-out records during RL")
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=8)
    return _save(fig, out)


def _numeric_column(rows: list[dict], column: str) -> bool:
    try:
        [float(r[column]) for r in rows]
        return True
    except (TypeError, ValueError):
        return False


def plot_per_check(per_check: dict[str, dict[str, float]], out: str | Path, mode: str) -> Path:
    """Horizontal grouped bars: one group per check, one bar per checkpoint (`per_check[checkpoint][check]`)."""
    out = Path(out)
    checkpoints = list(per_check)
    checks = sorted({c for rates in per_check.values() for c in rates}, key=_check_order)
    height = 0.8 / max(1, len(checkpoints))
    fig, ax = plt.subplots(figsize=(10, 0.2 * len(checks) * max(2, len(checkpoints)) + 1.6), dpi=120)
    for i, checkpoint in enumerate(checkpoints):
        positions = [y + (i - (len(checkpoints) - 1) / 2) * height for y in range(len(checks))]
        rates = [per_check[checkpoint].get(check, 0.0) for check in checks]
        bars = ax.barh(positions, rates, height=height, label=checkpoint, color=f"C{i % 10}")
        ax.bar_label(bars, labels=[f"{r:.0%}" for r in rates], padding=2, fontsize=7)
    ax.set_yticks(range(len(checks)), [_pretty_check(c) for c in checks])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.12)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("pass rate on the validation set")
    ax.set_title(f"Per-check pass rates ({mode} evaluator)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(title="checkpoint", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(fig, out)


def _check_order(check: str) -> tuple[int, str]:
    hard = check.startswith("valid_")
    return (1 if hard else 0, check)


def _pretty_check(check: str) -> str:
    kind = "hard" if check.startswith("valid_") else "commonsense"
    return f"{check.removeprefix('is_').replace('_', ' ')} ({kind})"


def shared_labels(points: list[dict], tolerance: float = 0.005) -> list[tuple[float, float, str]]:
    """One (x, y, label) per spot: runs whose points fall within `tolerance` of each other on both axes share one
    label ("sft, rl"), so labels of coinciding points are not printed over each other."""
    spots: list[list] = []
    for point in points:
        x, y = point["in_domain"], point["ood"]
        spot = next((s for s in spots if abs(s[0] - x) <= tolerance and abs(s[1] - y) <= tolerance), None)
        if spot is None:
            spots.append([x, y, [point["label"]]])
        else:
            spot[2].append(point["label"])
    return [(x, y, ", ".join(labels)) for x, y, labels in spots]


def plot_alignment_scatter(points: list[dict], out: str | Path, mode: str) -> Path:
    """One point per run: in-domain final pass (x) vs out-of-domain average EM (y); coinciding runs share a label."""
    out = Path(out)
    fig, ax = plt.subplots(figsize=(7, 5.5), dpi=120)
    for i, point in enumerate(points):
        ax.scatter(point["in_domain"], point["ood"], s=80, color=f"C{i % 10}", zorder=3)
    for x, y, label in shared_labels(points):
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(7, 6), fontsize=10)
    base = next((p for p in points if p["label"] == "base"), None)
    if base is not None:
        ax.axhline(base["ood"], color="grey", linestyle="--", linewidth=1, label="base OOD score (no tax)")
        ax.legend(loc="lower right")
    xs = [p["in_domain"] for p in points] or [0.0]
    ys = [p["ood"] for p in points] or [0.0]
    ax.set_xlim(min(0.0, min(xs)) - 0.02, max(max(xs) * 1.15, 0.1))
    ax.set_ylim(min(0.0, min(ys)) - 0.02, max(max(ys) * 1.15, 0.1))
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(f"in-domain final pass rate (TravelPlanner validation, {mode})")
    ax.set_ylabel("out-of-domain QA exact match (average over datasets)")
    ax.set_title("In-domain gain vs out-of-domain ability\n(lower than base = alignment tax)")
    ax.grid(alpha=0.3)
    return _save(fig, out)


def _save(fig, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out
