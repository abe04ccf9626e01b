"""scripts/compare_evals.py: two greedy evaluations of the same held-out set, paired item by item."""
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("compare_evals", REPO / "scripts/compare_evals.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def toolstar_file(path: Path, rewards: dict[str, float]) -> Path:
    path.write_text("".join(json.dumps({"id": task, "evaluation": {"reward": reward, "correct": reward > 0}}) + "\n"
                            for task, reward in rewards.items()))
    return path


def travel_record(idx: int, delivered: bool, passed_checks: int, final: bool) -> dict:
    checks = {f"check_{i}": {"status": "pass" if i < passed_checks else "fail"} for i in range(8)}
    verdict = {"delivered": delivered, "final_pass": final, "commonsense": checks if delivered else {}}
    return {"idx": idx, "evaluation": {"strict": verdict, "official": verdict}}


def test_tool_star_evaluations_are_paired_by_task_id(tmp_path, capsys):
    script = load_script()
    run = toolstar_file(tmp_path / "rl.jsonl", {"a": 1.1, "b": 1.0, "c": -1.0, "d": 0.0})
    base = toolstar_file(tmp_path / "sft.jsonl", {"d": 0.0, "c": -1.0, "b": 0.0, "a": -1.0, "e": 1.0})
    result = script.compare(script.read_records(run), script.read_records(base))
    assert result["n"] == 4 and result["only_in_base"] == 1  # "e" is in one file only
    reward = result["metrics"]["reward"]
    assert reward["paired"]["mean"] == pytest.approx((2.1 + 1.0) / 4)
    assert result["metrics"]["correct"]["run"] == 0.5 and result["metrics"]["correct"]["base"] == 0.0
    assert result["metrics"]["correct"]["base_ci95"][0] == 0.0  # a Wilson interval, not empty at 0 of 4
    assert script.main([str(run), str(base)]) == 0
    assert "4 items in both files (0 only in run, 1 only in base)" in capsys.readouterr().out


def test_travel_validations_are_paired_by_query_in_the_chosen_mode(tmp_path):
    script = load_script()
    run = [travel_record(0, True, 8, True), travel_record(1, True, 6, False), travel_record(2, False, 0, False)]
    base = [travel_record(0, True, 7, False), travel_record(1, False, 0, False), travel_record(2, False, 0, False)]
    result = script.compare(run, base, mode="strict")
    assert result["metrics"]["delivered"]["paired"]["mean"] == pytest.approx(1 / 3)
    assert result["metrics"]["commonsense_micro"]["run"] == pytest.approx((1 + 0.75) / 3)
    assert result["metrics"]["final_pass"]["paired"]["mean"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("content, message", [
    ("", "no records"),
    ('{"id": "a"}\n', "not an evaluated episode record"),
    ('{"id": "a", "evaluation": {"reward": 1}}\nnot json\n', ":2: not JSON"),
])
def test_a_file_that_is_not_an_evaluation_gets_a_clear_error(tmp_path, content, message):
    script = load_script()
    path = tmp_path / "records.jsonl"
    path.write_text(content)
    with pytest.raises(SystemExit, match=message):
        script.read_records(path)
    with pytest.raises(SystemExit, match="share no item"):
        script.compare([{"id": "a", "evaluation": {"reward": 1}}], [{"id": "b", "evaluation": {"reward": 1}}])
