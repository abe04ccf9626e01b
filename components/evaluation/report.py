"""The report stage: read every run's metrics and write a Markdown + HTML summary with PNG figures.

Inputs (whatever exists): `metrics/validate/<checkpoint>.json`, `metrics/ood_qa/<checkpoint>.json` (and the
per-question results beside it), `metrics/toolstar/<checkpoint>.json`, the stage summaries `metrics/*.json`, and
`plots/rl/rewards.csv`. Tables: base/SFT/RL in domain (both evaluator modes) and out of domain (with the QA mode
that made each number and 95% intervals), the alignment tax per checkpoint and dataset with its paired interval,
the alignment tax next to the in-domain gain, the
Tool-Star branch's tool-integrated reasoning per checkpoint and task kind or dataset (only when metrics/toolstar
exists; also `toolstar.csv`); figures: reward curves, per-check pass rates, and the in-domain vs out-of-domain
scatter.
"""
from __future__ import annotations

import csv
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from components.evaluation import plots
from components.evaluation.question_results import alignment_tax, questions_path, read_question_results, with_tax
from components.params import Params

IN_DOMAIN_COLUMNS = [("delivery_rate", "delivery"), ("commonsense_micro", "CS micro"),
                     ("commonsense_macro", "CS macro"), ("hard_micro", "hard micro"), ("hard_macro", "hard macro"),
                     ("final_pass", "final pass")]


class ReportParams(Params):
    """params/report.yaml, section `report`."""

    title: str = "STAR pipeline report"
    mode: Literal["strict", "official"] = "strict"  # the evaluator mode of the headline figures
    checkpoint_order: list[str] = ["base", "sft", "rl"]  # others follow alphabetically
    reward_smoothing: int = Field(5, ge=1)


@dataclass
class Table:
    """A titled table: header and rows of already-formatted cells."""

    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Report:
    """Everything the report shows."""

    title: str
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (caption, file name)


# --- reading ----------------------------------------------------------------------------------------------------

def read_json_dir(directory: Path) -> dict[str, dict]:
    """`{stem: parsed JSON}` for every `*.json` directly in `directory` (empty when it does not exist)."""
    if not directory.is_dir():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def read_csv_rows(path: Path) -> list[dict]:
    """Rows of a CSV file as dicts (empty when it does not exist)."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def order_checkpoints(names, preferred: list[str]) -> list[str]:
    """The preferred checkpoints first (in that order), then the rest alphabetically."""
    names = set(names)
    return [n for n in preferred if n in names] + sorted(names - set(preferred))


# --- tables -----------------------------------------------------------------------------------------------------

def pct(value) -> str:
    """A fraction as a percentage with one decimal; '-' for missing."""
    return "-" if value is None else f"{100 * float(value):.1f}%"


def signed_points(value) -> str:
    """A difference of fractions in percentage points, with its sign."""
    return "-" if value is None else f"{100 * float(value):+.1f} pp"


def in_domain_table(validate: dict[str, dict], order: list[str], mode: str) -> Table:
    """The six official metrics per checkpoint for one evaluator mode."""
    rows = [[name, str(validate[name].get("n", "-")),
             *[pct(validate[name].get(mode, {}).get(key)) for key, _ in IN_DOMAIN_COLUMNS],
             pct((validate[name].get("grounding") or {}).get("mean"))]
            for name in order if name in validate]
    return Table(f"In domain: TravelPlanner validation ({mode} evaluator)",
                 ["checkpoint", "n", *[label for _, label in IN_DOMAIN_COLUMNS], "grounding"], rows,
                 note="grounding = share of plan entities (names, flights) that the agent read in a tool result.")


def with_alignment_tax(ood: dict[str, dict], questions: dict[str, list[dict]]) -> dict[str, dict]:
    """Each checkpoint's OOD metrics with the paired alignment tax filled in from the base's and its per-question
    results (`questions`, by checkpoint) where the stage could not compute it (its base's results did not exist yet
    when it ran)."""
    base = questions.get("base")
    return {name: m if name == "base" or base is None or name not in questions or "alignment_tax_abs" in m
            else with_tax(m, alignment_tax(base, questions[name]))
            for name, m in ood.items()}


def read_ood_questions(ood_dir: Path, names) -> dict[str, list[dict]]:
    """The per-question results beside each checkpoint's OOD metrics, for those that have them."""
    results = {name: read_question_results(questions_path(ood_dir / f"{name}.json")) for name in names}
    return {name: r for name, r in results.items() if r is not None}


def with_interval(value, bounds) -> str:
    """A fraction as a percentage with its 95% interval ('42.0% (35.1-49.2)'); the value alone without one."""
    if value is None or not bounds:
        return pct(value)
    return f"{pct(value)} ({100 * bounds[0]:.1f}-{100 * bounds[1]:.1f})"


def points_with_interval(value, bounds) -> str:
    """A difference in percentage points with its 95% interval ('+7.0 pp (+2.0 to +12.0)')."""
    if value is None or not bounds:
        return signed_points(value)
    return f"{signed_points(value)} ({100 * bounds[0]:+.1f} to {100 * bounds[1]:+.1f})"


def ood_mode(metrics: dict) -> str:
    """The QA mode that made a checkpoint's OOD numbers (files written before in-context mode existed: search)."""
    return metrics.get("mode", "search")


def ood_table(ood: dict[str, dict], order: list[str]) -> Table:
    """EM per dataset and the averages with their 95% intervals, per checkpoint, with the mode that made them."""
    datasets = sorted({d for m in ood.values() for d in m.get("per_dataset", {})})
    rows = []
    for name in order:
        if name not in ood:
            continue
        m = ood[name]
        per = m.get("per_dataset", {})
        in_context = [pct(per[d]["answer_in_context"]) for d in datasets if "answer_in_context" in per.get(d, {})]
        rows.append([name, ood_mode(m), str(m.get("n", "-")),
                     *[with_interval(per.get(d, {}).get("em"), per.get(d, {}).get("em_ci95")) for d in datasets],
                     with_interval(m.get("em"), m.get("em_ci95")), with_interval(m.get("f1"), m.get("f1_ci95")),
                     " / ".join(in_context) or "-"])
    return Table("Out of domain: QA (exact match, 95% intervals)",
                 ["checkpoint", "mode", "n", *[f"{d} EM" for d in datasets], "avg EM", "avg F1",
                  f"answer in passages ({' / '.join(datasets)})"], rows,
                 note="mode search: the model looks the facts up with the search tool; mode in_context: the "
                      "question's retrieved passages are in the conversation and the model answers in one turn, "
                      "and 'answer in passages' is the share of questions whose answer they hold (EM's ceiling). "
                      "Intervals: Wilson for one dataset's EM, a percentile bootstrap over questions otherwise.")


def alignment_tax_table(ood: dict[str, dict], order: list[str]) -> Table:
    """The alignment tax of every trained checkpoint, averaged and per dataset, with its paired 95% interval."""
    rows = []
    for name in order:
        m = ood.get(name, {})
        if name == "base" or "alignment_tax_abs" not in m:
            continue
        groups = [("average", m), *sorted(m.get("per_dataset", {}).items())]
        for label, group in groups:
            if "alignment_tax_abs" not in group:
                continue
            relative = group.get("alignment_tax_rel")
            rows.append([name, ood_mode(m), label, str(group.get("alignment_tax_n", group.get("n", "-"))),
                         pct(group.get("base_em")),
                         points_with_interval(group["alignment_tax_abs"], group.get("alignment_tax_ci95")),
                         "-" if relative is None else f"{100 * relative:+.1f}%",
                         points_with_interval(group.get("alignment_tax_f1_abs"), group.get("alignment_tax_f1_ci95"))])
    return Table("Alignment tax: base - checkpoint on the same questions, paired by question",
                 ["checkpoint", "mode", "dataset", "n", "base EM", "tax EM (95% CI)", "tax EM (rel)",
                  "tax F1 (95% CI)"], rows,
                 note="Positive = ability lost. The interval is a percentile bootstrap of the per-question "
                      "differences (resampled within each dataset, seeded); the average weighs every dataset the same.")


def alignment_points(validate: dict[str, dict], ood: dict[str, dict], order: list[str], mode: str) -> list[dict]:
    """One point per checkpoint with both in-domain and OOD metrics."""
    return [{"label": name, "in_domain": validate[name][mode]["final_pass"], "ood": ood[name]["em"]}
            for name in order if name in validate and name in ood and mode in validate[name]]


def tax_table(points: list[dict], ood: dict[str, dict], mode: str) -> Table:
    """In-domain gain next to the alignment tax, per trained checkpoint (relative to base)."""
    base = next((p for p in points if p["label"] == "base"), None)
    rows = []
    for p in points:
        if p["label"] == "base":
            continue
        gain = p["in_domain"] - base["in_domain"] if base else None
        m = ood[p["label"]]
        rows.append([p["label"], pct(p["in_domain"]), signed_points(gain), ood_mode(m), pct(p["ood"]),
                     points_with_interval(m.get("alignment_tax_abs"), m.get("alignment_tax_ci95"))])
    return Table(f"In-domain gain vs alignment tax ({mode} final pass; OOD EM average)",
                 ["checkpoint", "final pass", "gain vs base", "OOD mode", "OOD EM", "alignment tax (95% CI)"], rows)


def rl_eval_table(rows: list[dict]) -> Table:
    """plots/rl/eval.csv as a table: the headline set metrics and the checks at each evaluated step (travel: its
    strict delivery, commonsense micro and final pass, and the commonsense checks)."""
    headline, checks = plots.eval_curve_columns(list(rows[0]))
    columns = [*headline, *checks]
    formats = {c: _column_format([_float(row.get(c)) for row in rows]) for c in columns}
    return Table("Greedy evaluation during RL on held-out records (step 0 is the model RL started from)",
                 ["step", *(plots.EVAL_SET_METRICS.get(c, c) for c in headline), *checks],
                 [[row["step"], *(formats[c](_float(row.get(c))) for c in columns)] for row in rows],
                 note="rl.eval in params/rl.yaml; logging only, no checkpoint is chosen by it")


def _column_format(values: list[float | None]):
    """Percentages for a column of rates (every value in [0, 1]); three decimals otherwise (a mean reward)."""
    if all(v is None or 0.0 <= v <= 1.0 for v in values):
        return pct
    return lambda value: "-" if value is None else f"{value:.3f}"


TOOLSTAR_COLUMNS = [  # (CSV column, Markdown header, how a value is read from a metrics group)
    ("n", "n", lambda m: m.get("n")),
    ("accuracy", "accuracy", lambda m: m.get("accuracy")),
    ("em", "EM", lambda m: m.get("em")),
    ("f1", "F1", lambda m: m.get("f1")),
    ("mean_reward", "mean reward", lambda m: m.get("mean_reward")),
    ("search_per_episode", "search / episode", lambda m: (m.get("tool_calls") or {}).get("search")),
    ("python_per_episode", "python / episode", lambda m: (m.get("tool_calls") or {}).get("python")),
    ("code_errors", "code errors", lambda m: m.get("code_errors")),
    ("sandbox_kills", "sandbox kills", lambda m: m.get("sandbox_kills")),
    ("format_errors", "format errors", lambda m: m.get("format_errors")),
]
_TOOLSTAR_FORMATS = {"accuracy": "pct", "em": "pct", "f1": "pct", "mean_reward": "{:.3f}",
                     "search_per_episode": "{:.2f}", "python_per_episode": "{:.2f}"}


def toolstar_groups(metrics: dict) -> list[tuple[str, dict]]:
    """(label, metrics) rows of one `star toolstar eval` metrics file: every task, then each task kind, then each
    dataset, where a breakdown has more than one group (a single one would repeat the first row); a file of one
    kind (and one dataset) is one row labelled by them, e.g. "gsm8k / math"."""
    kinds = metrics.get("by_kind") or {}
    datasets = metrics.get("by_dataset") or {}
    if len(kinds) <= 1 and len(datasets) <= 1:
        return [(" / ".join([*datasets, *kinds]) or "all", metrics)]
    rows = [("all", metrics)]
    if len(kinds) > 1:
        rows += sorted(kinds.items())
    if len(datasets) > 1:
        rows += sorted(datasets.items())
    return rows


def toolstar_rows(toolstar: dict[str, dict], order: list[str]) -> list[dict]:
    """One row per checkpoint and group (`toolstar_groups`): the raw numbers, as `toolstar.csv` holds them."""
    return [{"checkpoint": name, "tasks": label, **{key: read(group) for key, _, read in TOOLSTAR_COLUMNS}}
            for name in order if name in toolstar for label, group in toolstar_groups(toolstar[name])]


def _toolstar_cell(key: str, value) -> str:
    if value is None:
        return "-"
    style = _TOOLSTAR_FORMATS.get(key)
    if style == "pct":
        return pct(value)
    return style.format(float(value)) if style else str(value)


def toolstar_table(rows: list[dict]) -> Table:
    """Tool-Star's tool-integrated reasoning per checkpoint and task kind or dataset (`toolstar_rows`)."""
    return Table("Tool-Star: tool-integrated reasoning (search + python)",
                 ["checkpoint", "tasks", *[label for _, label, _ in TOOLSTAR_COLUMNS]],
                 [[row["checkpoint"], row["tasks"], *[_toolstar_cell(key, row[key]) for key, _, _ in TOOLSTAR_COLUMNS]]
                  for row in rows],
                 note="accuracy: the boxed answer is right (math_verify for math tasks, token F1 = 1 for QA, exact "
                      "numbers for generated ones); EM/F1 against the golden answers; mean reward: Tool-Star's (-1 "
                      "format error, 0 wrong, the score, +0.1 with both tools); tool calls are per episode, errors, "
                      "kills and format errors totals over the n episodes.")


def _float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def stage_summary_table(stage_metrics: dict[str, dict]) -> Table:
    """The scalar numbers of every stage summary (`metrics/*.json`), one row per value."""
    rows = []
    for stage, metrics in stage_metrics.items():
        for key, value in _flat_scalars(metrics):
            rows.append([stage, key, _format_scalar(value)])
    return Table("Stage summaries (metrics/*.json)", ["stage", "metric", "value"], rows)


def _flat_scalars(obj, prefix: str = "", depth: int = 0):
    if isinstance(obj, dict) and depth < 2:
        for key, value in obj.items():
            yield from _flat_scalars(value, f"{prefix}{key}." if not isinstance(value, (int, float, str, bool))
                                     else f"{prefix}{key}", depth + 1)
    elif isinstance(obj, (int, float, bool, str)) and prefix:
        yield prefix.rstrip("."), obj


def _format_scalar(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# --- rendering --------------------------------------------------------------------------------------------------

def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(report: Report) -> str:
    """The report as Markdown (GitHub tables, figures as images next to the file)."""
    lines = [f"# {report.title}", ""]
    for table in report.tables:
        lines += [f"## {table.title}", ""]
        if not table.rows:
            lines += ["(no data)", ""]
            continue
        lines.append("| " + " | ".join(map(_md_cell, table.header)) + " |")
        lines.append("|" + "|".join("---" for _ in table.header) + "|")
        lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in table.rows]
        lines += ["", table.note, ""] if table.note else [""]
    if report.figures:
        lines += ["## Figures", ""]
        for caption, name in report.figures:
            lines += [f"### {caption}", "", f"![{caption}]({name})", ""]
    return "\n".join(lines).rstrip() + "\n"


def render_html(report: Report) -> str:
    """The report as a standalone HTML page (figures referenced by relative path)."""
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(report.title)}</title><style>"
             "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:.3em .7em;"
             "text-align:right}th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}"
             "img{max-width:100%;border:1px solid #eee}</style></head><body>", f"<h1>{e(report.title)}</h1>"]
    for table in report.tables:
        parts.append(f"<h2>{e(table.title)}</h2>")
        if not table.rows:
            parts.append("<p>(no data)</p>")
            continue
        parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in table.header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in table.rows]
        parts.append("</table>")
        if table.note:
            parts.append(f"<p><em>{e(table.note)}</em></p>")
    for caption, name in report.figures:
        parts.append(f"<h2>{e(caption)}</h2><img src='{e(name)}' alt='{e(caption)}'>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_csv(rows: list[dict], path: Path) -> Path:
    """Rows as CSV (the header from the first row); DVC can plot and diff these across experiments."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["empty"])
        writer.writeheader()
        writer.writerows(rows)
    return path


# --- the stage --------------------------------------------------------------------------------------------------

def build_report(metrics_dir: str | Path, plots_dir: str | Path, out_dir: str | Path, params: ReportParams) -> dict:
    """Read the metrics, draw the figures into `out_dir`, write `report.md`, `report.html` and the figures' data
    (`per_check.csv`, `alignment.csv`, for `dvc plots`), and `toolstar.csv` when metrics/toolstar holds metrics;
    return the written paths (`{"markdown", "html", "figures": [...], "tables": [...]}`)."""
    metrics_dir, plots_dir, out_dir = Path(metrics_dir), Path(plots_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    validate = read_json_dir(metrics_dir / "validate")
    ood = read_json_dir(metrics_dir / "ood_qa")
    ood = with_alignment_tax(ood, read_ood_questions(metrics_dir / "ood_qa", ood))
    toolstar = read_json_dir(metrics_dir / "toolstar")
    stages = read_json_dir(metrics_dir)
    rewards = read_csv_rows(plots_dir / "rl" / "rewards.csv")
    evaluations = read_csv_rows(plots_dir / "rl" / "eval.csv")
    order = order_checkpoints([*validate, *ood], params.checkpoint_order)
    points = alignment_points(validate, ood, order, params.mode)

    report = Report(params.title)
    for mode in (params.mode, *[m for m in ("strict", "official") if m != params.mode]):
        report.tables.append(in_domain_table(validate, order, mode))
    report.tables.append(ood_table(ood, order))
    report.tables.append(alignment_tax_table(ood, order))
    report.tables.append(tax_table(points, ood, params.mode))
    toolstar_table_rows = toolstar_rows(toolstar, order_checkpoints(toolstar, params.checkpoint_order))
    if toolstar_table_rows:
        report.tables.append(toolstar_table(toolstar_table_rows))
    report.tables.append(stage_summary_table(stages))
    if evaluations:
        report.tables.append(rl_eval_table(evaluations))

    if rewards:
        plots.plot_reward_curves(rewards, out_dir / "rewards.png", smoothing=params.reward_smoothing)
        report.figures.append(("RL reward curves per component", "rewards.png"))
    if evaluations:
        plots.plot_eval_curves(evaluations, out_dir / "rl_eval.png")
        report.figures.append(("Greedy decoding on held-out queries during RL", "rl_eval.png"))
    per_check = {name: validate[name][params.mode].get("per_check", {})
                 for name in order if name in validate and params.mode in validate[name]}
    if any(per_check.values()):
        plots.plot_per_check(per_check, out_dir / "per_check.png", params.mode)
        report.figures.append((f"Per-check pass rates ({params.mode})", "per_check.png"))
    if points:
        plots.plot_alignment_scatter(points, out_dir / "alignment_tax.png", params.mode)
        report.figures.append(("In-domain final pass vs out-of-domain QA (alignment tax)", "alignment_tax.png"))

    write_csv([{"checkpoint": name, "check": check, "pass_rate": rate}
               for name, rates in per_check.items() for check, rate in rates.items()], out_dir / "per_check.csv")
    write_csv([{"checkpoint": p["label"], "in_domain_final_pass": p["in_domain"], "ood_em": p["ood"]}
               for p in points], out_dir / "alignment.csv")
    tables = [out_dir / "per_check.csv", out_dir / "alignment.csv"]
    if toolstar_table_rows:
        tables.append(write_csv(toolstar_table_rows, out_dir / "toolstar.csv"))
    (out_dir / "report.md").write_text(render_markdown(report))
    (out_dir / "report.html").write_text(render_html(report))
    return {"markdown": out_dir / "report.md", "html": out_dir / "report.html",
            "figures": [out_dir / name for _, name in report.figures], "tables": tables}
