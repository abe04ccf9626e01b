"""The report stage on hand-made metrics files: tables, HTML, and readable figures."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.evaluation.report import ReportParams, build_report, order_checkpoints


@pytest.mark.slow
def test_report_writes_tables_for_every_checkpoint_and_the_three_figures(metrics_tree, tmp_path: Path):
    metrics, plots = metrics_tree
    written = build_report(metrics, plots, tmp_path / "reports", ReportParams())

    markdown = written["markdown"].read_text()
    assert "| rl | 40 | 140.0%" not in markdown  # fractions are shown as percentages of 1, not re-scaled
    assert "| rl | 40 | 100.0% | 72.0% | 45.0% | 63.0% | 36.0% | 27.0% | 81.0% |" in markdown  # strict row for rl
    assert ("| sft | in_context | 200 | 25.0% (17.5-34.3) | 45.0% (35.6-54.8) | 35.0% (29.0-41.5) "
            "| 37.5% (31.2-44.0) | 30.0% / 50.0% |") in markdown  # the mode, n, EM and F1 with their intervals
    # sft lost 7 of 100 questions in each dataset: 7 pp, paired, with a bootstrap interval about that of 7/100
    assert "| sft | in_context | single_hop | 100 | 52.0% | +7.0 pp (+3.0 to +12.0) | +13.5% |" in markdown
    assert "| rl | 27.0% | +27.0 pp | in_context | 31.0% | +11.0 pp (+7.0 to +15.5) |" in markdown  # gain vs tax
    assert "| sft | final_train_loss | 0.812 |" in markdown
    assert [p.name for p in written["figures"]] == ["rewards.png", "per_check.png", "alignment_tax.png"]
    for figure in written["figures"]:
        assert figure.stat().st_size > 10_000
        assert "![" in markdown and figure.name in markdown
    alignment = written["tables"][1].read_text().splitlines()
    assert alignment[0] == "checkpoint,in_domain_final_pass,ood_em"
    rows = [line.split(",") for line in alignment[1:]]
    assert [(name, float(final_pass), float(em)) for name, final_pass, em in rows] == [
        ("base", 0.0, pytest.approx(0.42)), ("sft", 0.18, pytest.approx(0.35)), ("rl", 0.27, pytest.approx(0.31))]
    page = written["html"].read_text()
    assert page.count("<table>") == 6 and "<img src='alignment_tax.png'" in page


def test_report_without_any_metrics_says_so_instead_of_failing(tmp_path: Path):
    written = build_report(tmp_path / "metrics", tmp_path / "plots", tmp_path / "reports", ReportParams())

    assert written["figures"] == []
    assert "(no data)" in written["markdown"].read_text()


def test_checkpoints_are_ordered_base_sft_rl_then_alphabetically():
    assert order_checkpoints({"rl", "agent-star-1.5b", "base", "sft", "arpo"}, ["base", "sft", "rl"]) == [
        "base", "sft", "rl", "agent-star-1.5b", "arpo"]


def test_the_report_pairs_an_alignment_tax_the_ood_stage_could_not_compute(metrics_tree, tmp_path: Path):
    metrics, plots = metrics_tree
    rl = json.loads((metrics / "ood_qa" / "rl.json").read_text())
    without_tax = {key: value for key, value in rl.items() if not key.startswith(("alignment_tax", "base_"))}
    (metrics / "ood_qa" / "rl.json").write_text(json.dumps(without_tax))  # ood_qa@rl ran before ood_qa@base

    markdown = build_report(metrics, plots, tmp_path / "reports", ReportParams())["markdown"].read_text()

    assert "| rl | in_context | average | 200 | 42.0% | +11.0 pp (+7.0 to +15.5) | +26.2% |" in markdown
    assert "| rl | in_context | multi_hop | 100 | 32.0% | +11.0 pp (+5.0 to +17.0) |" in markdown


def test_the_reward_plot_draws_the_spread_as_a_band_not_as_a_reward_component(tmp_path: Path):
    from matplotlib import pyplot

    from components.evaluation import plots

    rows = [{"step": str(i), "reward": str(0.1 * i), "reward_std": "0.05", "cs_micro": str(0.2 * i)}
            for i in range(1, 9)]
    captured = []
    original = pyplot.close
    pyplot.close = lambda fig=None: captured.append(fig)  # keep the figure for inspection
    try:
        plots.plot_reward_curves(rows, tmp_path / "rewards.png", smoothing=1)
    finally:
        pyplot.close = original
    (figure,) = [f for f in captured if f is not None]
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert legend == ["reward ± std within the step", "commonsense micro", "reward (used for training)"]
    assert (tmp_path / "rewards.png").stat().st_size > 10_000


def test_runs_at_the_same_spot_of_the_scatter_share_one_label_instead_of_overprinting():
    from components.evaluation.plots import shared_labels

    points = [{"label": "base", "in_domain": 0.0, "ood": 0.24}, {"label": "sft", "in_domain": 0.0, "ood": 0.0},
              {"label": "rl", "in_domain": 0.001, "ood": 0.0}, {"label": "rl-macro", "in_domain": 0.1, "ood": 0.0}]
    assert shared_labels(points) == [(0.0, 0.24, "base"), (0.0, 0.0, "sft, rl"), (0.1, 0.0, "rl-macro")]


def test_the_greedy_evaluations_during_rl_get_a_table_and_a_figure(metrics_tree, tmp_path: Path):
    """plots/rl/eval.csv (rl.eval): a row per evaluated step in the report, and their curves."""
    import csv
    import shutil

    metrics, plots = metrics_tree
    plots = Path(shutil.copytree(plots, tmp_path / "with_eval"))
    with (plots / "rl" / "eval.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "delivery_rate", "commonsense_micro", "final_pass", "is_valid_restaurants",
                         "valid_cost"])
        writer.writerows([[0, 0.95, 0.644, 0.0, 0.825, ""], [6, 1.0, 0.6, 0.05, 0.5, 0.25]])
    written = build_report(metrics, plots, tmp_path / "reports", ReportParams())
    markdown = written["markdown"].read_text()
    assert "| step | delivered | commonsense micro | final pass | is_valid_restaurants |" in markdown
    assert "| 0 | 95.0% | 64.4% | 0.0% | 82.5% |" in markdown and "| 6 | 100.0% | 60.0% | 5.0% | 50.0% |" in markdown
    figure = tmp_path / "reports" / "rl_eval.png"
    assert figure in written["figures"] and figure.stat().st_size > 10_000


def test_another_environments_greedy_evaluations_show_every_column(metrics_tree, tmp_path: Path):
    """A Tool-Star run's eval.csv (its set metrics and check rates): every column, rates as percentages and the
    mean reward as a number."""
    import csv
    import shutil

    metrics, plots = metrics_tree
    plots = Path(shutil.copytree(plots, tmp_path / "toolstar_eval"))
    with (plots / "rl" / "eval.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "accuracy", "mean_reward", "format_ok"])
        writer.writerows([[0, 0.2, -0.085, 0.9], [8, 0.3, 0.32, 1.0]])
    written = build_report(metrics, plots, tmp_path / "reports", ReportParams())
    markdown = written["markdown"].read_text()
    assert "| step | accuracy | mean_reward | format_ok |" in markdown
    assert "| 0 | 20.0% | -0.085 | 90.0% |" in markdown and "| 8 | 30.0% | 0.320 | 100.0% |" in markdown
    assert (tmp_path / "reports" / "rl_eval.png") in written["figures"]


def test_every_plot_dvc_yaml_declares_on_a_report_table_names_its_columns(metrics_tree, tmp_path: Path):
    """`dvc plots show/diff` read the x and y fields dvc.yaml declares from the tables the report writes."""
    import csv

    import yaml

    metrics, plots = metrics_tree
    written = build_report(metrics, plots, tmp_path / "reports", ReportParams())
    tables = {f"reports/{table.name}": table for table in written["tables"]}
    declared = yaml.safe_load((Path(__file__).resolve().parents[2] / "dvc.yaml").read_text())["plots"]
    checked = 0
    for entry in declared:
        if not isinstance(entry, dict):
            continue
        (path, fields), = entry.items()
        if path in tables:
            columns = next(csv.reader(tables[path].open()))
            assert {fields["x"], fields["y"]} <= set(columns), (path, fields, columns)
            checked += 1
    assert checked == len(tables) == 2


# --- the Tool-Star table ----------------------------------------------------------------------------------------

def toolstar_group(n, accuracy, em, f1, reward, search, python, code_errors=0, kills=0, format_errors=0) -> dict:
    """One group of a `star toolstar eval` metrics file (components.toolstar.evaluate.summarize_group's keys)."""
    return {"n": n, "accuracy": accuracy, "mean_reward": reward, "reward_positive_rate": accuracy,
            "format_ok_rate": 1.0, "answer_rate": 1.0, "em": em, "f1": f1,
            "tool_calls": {"search": search, "python": python, "total": search + python},
            "code_errors": code_errors, "sandbox_kills": kills, "format_errors": format_errors, "refused_calls": 0,
            "termination": {"answer": n}}


def write_toolstar_metrics(metrics: Path) -> None:
    """metrics/toolstar/: base and sft on the generated tasks, sft on GSM8K alone, rl on two QA datasets."""
    (metrics / "toolstar").mkdir(parents=True)
    files = {
        "base": {**toolstar_group(20, 0.1, 0.05, 0.125, -0.45, 0.25, 0.5, code_errors=3, kills=1, format_errors=12),
                 "by_kind": {"compute": toolstar_group(8, 0.25, 0.125, 0.125, 0.0, 0.0, 1.0, 2, 1, 4),
                             "multi_hop_arithmetic": toolstar_group(12, 0.0, 0.0, 0.125, -0.75, 0.4167, 0.1667,
                                                                    1, 0, 8)}},
        "sft": {**toolstar_group(20, 0.85, 0.8, 0.9, 0.98, 1.2, 1.0, code_errors=1),
                "by_kind": {"compute": toolstar_group(8, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0),
                            "multi_hop_arithmetic": toolstar_group(12, 0.75, 0.6667, 0.8333, 0.9667, 2.0, 1.0, 1)}},
        "sft-gsm8k": {**toolstar_group(50, 0.62, 0.58, 0.6, 0.6, 0.0, 1.34, code_errors=7, kills=2,
                                       format_errors=3),
                      "by_kind": {"math": toolstar_group(50, 0.62, 0.58, 0.6, 0.6, 0.0, 1.34, 7, 2, 3)},
                      "by_dataset": {"gsm8k": toolstar_group(50, 0.62, 0.58, 0.6, 0.6, 0.0, 1.34, 7, 2, 3)}},
        "rl": {**toolstar_group(30, 0.4, 0.3667, 0.4512, 0.4783, 1.9, 0.2),
               "by_kind": {"qa": toolstar_group(30, 0.4, 0.3667, 0.4512, 0.4783, 1.9, 0.2)},
               "by_dataset": {"bamboogle": toolstar_group(10, 0.5, 0.5, 0.55, 0.6, 1.8, 0.3),
                              "hotpotqa": toolstar_group(20, 0.35, 0.3, 0.4018, 0.4175, 1.95, 0.15)}},
    }
    for name, data in files.items():
        (metrics / "toolstar" / f"{name}.json").write_text(json.dumps({**data, "checkpoint": name, "model": "m"}))


def test_the_toolstar_table_shows_each_checkpoint_by_task_kind_and_dataset(metrics_tree, tmp_path: Path):
    metrics, plots = metrics_tree
    write_toolstar_metrics(metrics)
    written = build_report(metrics, plots, tmp_path / "reports", ReportParams())

    markdown = written["markdown"].read_text()
    start = markdown.index("## Tool-Star: tool-integrated reasoning (search + python)")
    table = markdown[start:].split("\n\n")[1].splitlines()
    assert table == [
        "| checkpoint | tasks | n | accuracy | EM | F1 | mean reward | search / episode | python / episode | "
        "code errors | sandbox kills | format errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        "| base | all | 20 | 10.0% | 5.0% | 12.5% | -0.450 | 0.25 | 0.50 | 3 | 1 | 12 |",
        "| base | compute | 8 | 25.0% | 12.5% | 12.5% | 0.000 | 0.00 | 1.00 | 2 | 1 | 4 |",
        "| base | multi_hop_arithmetic | 12 | 0.0% | 0.0% | 12.5% | -0.750 | 0.42 | 0.17 | 1 | 0 | 8 |",
        "| sft | all | 20 | 85.0% | 80.0% | 90.0% | 0.980 | 1.20 | 1.00 | 1 | 0 | 0 |",
        "| sft | compute | 8 | 100.0% | 100.0% | 100.0% | 1.000 | 0.00 | 1.00 | 0 | 0 | 0 |",
        "| sft | multi_hop_arithmetic | 12 | 75.0% | 66.7% | 83.3% | 0.967 | 2.00 | 1.00 | 1 | 0 | 0 |",
        "| rl | all | 30 | 40.0% | 36.7% | 45.1% | 0.478 | 1.90 | 0.20 | 0 | 0 | 0 |",
        "| rl | bamboogle | 10 | 50.0% | 50.0% | 55.0% | 0.600 | 1.80 | 0.30 | 0 | 0 | 0 |",
        "| rl | hotpotqa | 20 | 35.0% | 30.0% | 40.2% | 0.417 | 1.95 | 0.15 | 0 | 0 | 0 |",
        "| sft-gsm8k | gsm8k / math | 50 | 62.0% | 58.0% | 60.0% | 0.600 | 0.00 | 1.34 | 7 | 2 | 3 |",
    ]
    csv_path = tmp_path / "reports" / "toolstar.csv"
    assert csv_path in written["tables"]
    lines = csv_path.read_text().splitlines()
    assert lines[0] == ("checkpoint,tasks,n,accuracy,em,f1,mean_reward,search_per_episode,python_per_episode,"
                        "code_errors,sandbox_kills,format_errors")
    assert lines[1] == "base,all,20,0.1,0.05,0.125,-0.45,0.25,0.5,3,1,12"
    assert lines[-1] == "sft-gsm8k,gsm8k / math,50,0.62,0.58,0.6,0.6,0.0,1.34,7,2,3"
    assert len(lines) == 11
    assert written["html"].read_text().count("<table>") == 7


def test_without_toolstar_metrics_the_table_and_its_csv_are_absent(metrics_tree, tmp_path: Path):
    metrics, plots = metrics_tree
    written = build_report(metrics, plots, tmp_path / "reports", ReportParams())
    assert "Tool-Star" not in written["markdown"].read_text()
    assert not (tmp_path / "reports" / "toolstar.csv").exists() and len(written["tables"]) == 2
