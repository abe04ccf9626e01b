"""scripts/compare_rl_runs.py: a run's reward curve against a control rolled out on the same seeded steps."""
import csv
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
COLUMNS = ["step", "reward", "reward_std", "task_reward", "cs_micro", "hard_micro", "cs_macro", "hard_macro",
           "success", "format_error_rate"]


def load_script():
    spec = importlib.util.spec_from_file_location("compare_rl_runs", REPO / "scripts/compare_rl_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_curve(path: Path, cs_micro: list[float], reward: float = 0.0) -> Path:
    """A rewards.csv whose steps differ only in cs_micro (the other components 0, a quarter format errors)."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        for step, value in enumerate(cs_micro, start=1):
            writer.writerow({"step": step, "reward": reward, "reward_std": 0.1, "task_reward": reward,
                             "cs_micro": value, "hard_micro": 0, "cs_macro": 0, "hard_macro": 0, "success": 0,
                             "format_error_rate": 0.25})
    return path


def test_a_step_reward_is_rescored_exactly_from_its_component_means():
    script = load_script()
    row = {"cs_micro": 0.5, "hard_micro": 0.25, "cs_macro": 0.0, "hard_macro": 0.25, "success": 0.0,
           "format_error_rate": 0.5}
    assert script.step_reward(row, "sum") == pytest.approx(0.2)  # (0.5 + 0.25 + 0 + 0.25 + 0) / 5
    assert script.step_reward(row, "macro") == pytest.approx(0.25 / 3)
    assert script.step_reward(row, "success") == 0.0
    assert script.step_reward(row, "sum", format_reward=-0.1) == pytest.approx(0.15)  # 0.2 - 0.1 x 0.5


def test_query_order_cancels_in_the_paired_difference(tmp_path):
    """Both curves rise by the same query order; the run learns +0.05 cs_micro a step on top from step 6."""
    script = load_script()
    order = [0.2, 0.3, 0.2, 0.4, 0.3, 0.5, 0.4, 0.6, 0.5, 0.7]
    learned = [value + (0.05 * (step - 5) if step > 5 else 0) for step, value in enumerate(order, start=1)]
    run = script.read_curve(write_curve(tmp_path / "run.csv", learned, reward=0.1))
    control = script.read_curve(write_curve(tmp_path / "frozen.csv", order))  # a MACRO run: its reward column is 0
    result = script.compare(run, control, "sum")
    assert result["steps"] == 10 and result["steps_per_fifth"] == 2
    assert result["control"]["first_fifth"] == pytest.approx(0.05)  # (0.2 + 0.3) / 2 / 5
    assert result["control"]["last_fifth"] == pytest.approx(0.12)  # (0.5 + 0.7) / 2 / 5
    assert result["run"]["last_fifth"] == pytest.approx(0.165)  # (0.5 + 0.20 + 0.7 + 0.25) / 2 / 5
    assert result["paired"]["last_fifth_mean"] == pytest.approx(0.045)
    assert result["paired"]["last_fifth_se"] == pytest.approx(0.005)  # stdev(0.04, 0.05) / sqrt 2
    assert result["paired"]["mean"] == pytest.approx(0.015)  # (0.01 + ... + 0.05) / 10
    # the differences 0 x 5 then 0.01 ... 0.05: least-squares slope sxy / sxx = 0.475 / 82.5 a step
    assert result["paired"]["slope_per_step"] == pytest.approx(0.475 / 82.5)


def test_the_slope_of_the_paired_difference_and_its_standard_error():
    script = load_script()
    assert script.slope_se([0.0, 0.1, 0.2, 0.3]) == (pytest.approx(0.1), pytest.approx(0.0))  # a straight line
    slope, se = script.slope_se([0.0, 0.2, 0.0, 0.2])  # zig-zag: slope 0.2 / 5, residuals -0.04 0.12 -0.12 0.04
    assert slope == pytest.approx(0.04)
    assert se == pytest.approx((0.032 / 2 / 5) ** 0.5)  # sqrt(SSR / (n - 2) / sxx), SSR 0.032, sxx 5
    assert script.slope_se([0.1, 0.3])[1] != script.slope_se([0.1, 0.3])[1]  # two points: no error estimate (nan)


def test_the_command_prints_the_table_and_writes_json(tmp_path, capsys):
    script = load_script()
    run = write_curve(tmp_path / "run.csv", [0.1, 0.2, 0.3])
    control = write_curve(tmp_path / "control.csv", [0.1, 0.1, 0.1, 0.1])  # one step longer: only shared steps count
    assert script.main([str(run), str(control), "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "over 3 shared steps" in out and "paired run - control" in out and "slope +0.02000" in out  # differences 0, 0.02, 0.04
    assert "format errors" not in out  # the per-step table only with --steps
    assert script.main([str(run), str(control), "--steps"]) == 0
    table = capsys.readouterr().out.splitlines()[-3:]
    assert table[-1].split() == ["3", "0.0600", "0.0200", "+0.0400", "25%", "/", "25%"]
    assert json.loads((tmp_path / "out.json").read_text())["paired"]["mean"] == pytest.approx(0.02)


@pytest.mark.parametrize("content, message", [
    ("", "no steps"),
    ("step,reward\n1,0.1\n", "columns"),
    (",".join(COLUMNS) + "\n1,x,0,0,0,0,0,0,0,0\n", None),
])
def test_a_file_that_is_not_a_reward_curve_gets_a_clear_error(tmp_path, content, message):
    script = load_script()
    path = tmp_path / "rewards.csv"
    path.write_text(content)
    if message is None:  # a non-number in a column the script does not read is fine; one it reads is not
        path.write_text(",".join(COLUMNS) + "\n1,0,0,0,x,0,0,0,0,0\n")
        message = "not a number"
    with pytest.raises(SystemExit, match=message):
        script.read_curve(path)
    with pytest.raises(SystemExit, match="no such file"):
        script.read_curve(tmp_path / "missing.csv")


TOOLSTAR_COLUMNS = ["step", "reward", "reward_std", "task_reward", "success", "score", "bonus", "em", "f1",
                    "format_error_rate"]


def write_toolstar_curve(path: Path, rewards: list[float]) -> Path:
    """A Tool-Star run's rewards.csv (rl.env.kind toolstar): no travel components, its own reward column."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, TOOLSTAR_COLUMNS)
        writer.writeheader()
        for step, reward in enumerate(rewards, start=1):
            writer.writerow({"step": step, "reward": reward, "reward_std": 0.5, "task_reward": reward,
                             "success": 0.5, "score": 0.5, "bonus": 0.1, "em": 0.5, "f1": 0.5,
                             "format_error_rate": 0.1})
    return path


def test_a_tool_star_curve_is_compared_on_the_reward_it_logged(tmp_path, capsys):
    script = load_script()
    run = write_toolstar_curve(tmp_path / "run.csv", [-0.3, 0.0, 0.2])
    control = write_toolstar_curve(tmp_path / "control.csv", [-0.3, -0.2, -0.1])
    with pytest.raises(SystemExit, match="use --kind logged"):  # no travel components to rescore
        script.read_curve(run)
    assert script.main([str(run), str(control), "--kind", "logged", "--steps"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("LOGGED reward over 3 shared steps")
    assert out.splitlines()[-1].split() == ["3", "0.2000", "-0.1000", "+0.3000", "10%", "/", "10%"]
    result = script.compare(script.read_curve(run, "logged"), script.read_curve(control, "logged"), "logged")
    assert result["paired"]["mean"] == pytest.approx(0.5 / 3)  # differences 0, 0.2, 0.3
