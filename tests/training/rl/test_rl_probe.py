"""scripts/probe_rl_update.py: the probe runs on the stage's own parts and reports the sampler/trainer agreement."""
import importlib.util
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]


def load_probe():
    spec = importlib.util.spec_from_file_location("probe_rl_update", REPO / "scripts/probe_rl_update.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_reports_sampler_trainer_agreement_and_one_row_per_update(tmp_path, capsys, tiny_model_dir,
                                                                            tiny_world_dir, rl_queries_path):
    params = tmp_path / "rl.yaml"
    params.write_text(yaml.safe_dump({"rl": {
        "num_generations": 2, "learning_rate": 1e-3, "micro_batch_size": 2,
        "rollout": {"max_turns": 2, "max_tokens_per_turn": 8, "max_context_tokens": 4096}}}))
    probe = load_probe()
    assert probe.main(["--params", str(params), "--model", str(tiny_model_dir), "--world", str(tiny_world_dir),
                       "--queries", str(rl_queries_path), "--train-queries", "1", "--held-out-queries", "1",
                       "--updates", "2", "--set", "negative_advantage_weight=0.5"]) == 0
    out = capsys.readouterr().out
    median = float(re.search(r"\|diff\| per token: median (\S+),", out).group(1))
    assert median < 1e-4  # the trainer recomputes the log-probabilities the sampler drew with
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s", line)]
    assert [row[0] for row in rows] == ["1", "2"]


def test_a_malformed_override_says_how_to_write_one(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        load_probe().main(["--params", str(REPO / "params/rl.yaml"), "--set", "learning_rate"])
    assert "use KEY=VALUE" in capsys.readouterr().err


def test_override_values_are_read_as_yaml_scalars():
    probe = load_probe()
    assert probe.parse_value("2e-4") == 2e-4 and probe.parse_value("0") == 0
    assert probe.parse_value("seq-mean-token-mean") == "seq-mean-token-mean"
