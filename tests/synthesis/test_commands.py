"""`star queries` -> `star teach` -> `star filter` on the tiny world: the three stages' files and metrics."""
import json

from components.cli import main


def test_the_three_synthesis_stages_write_their_outputs(tiny_world_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("STAR_EXPERIMENT", "synthesis-test")
    monkeypatch.delenv("STAR_PARENT_RUN_ID", raising=False)
    (tmp_path / "queries.yaml").write_text(
        "queries:\n  sizes: {sft: 12, rl: 6, val: 4}\n  seed: 5\n")
    (tmp_path / "teacher.yaml").write_text("teacher:\n  mistake_rate: 0.3\n  seed: 1\n")
    (tmp_path / "filter.yaml").write_text("filter:\n  eval_fraction: 0.2\n")
    metrics = tmp_path / "metrics"

    assert main(["queries", "--params", str(tmp_path / "queries.yaml"), "--world", str(tiny_world_dir),
                 "--out", str(tmp_path / "queries"), "--metrics", str(metrics / "queries.json")]) == 0
    lines = (tmp_path / "queries" / "sft.jsonl").read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[0])["query"]
    assert json.loads((metrics / "queries.json").read_text())["sizes"] == {"sft": 12, "rl": 6, "val": 4}

    assert main(["teach", "--params", str(tmp_path / "teacher.yaml"), "--world", str(tiny_world_dir),
                 "--queries", str(tmp_path / "queries" / "sft.jsonl"), "--out", str(tmp_path / "traj.jsonl"),
                 "--metrics", str(metrics / "teacher.json")]) == 0
    teacher = json.loads((metrics / "teacher.json").read_text())
    assert teacher["n"] == 12 and teacher["termination"] == {"answer": 12}

    assert main(["filter", "--params", str(tmp_path / "filter.yaml"), "--in", str(tmp_path / "traj.jsonl"),
                 "--out", str(tmp_path / "sft"), "--metrics", str(metrics / "filter.json")]) == 0
    stats = json.loads((metrics / "filter.json").read_text())
    kept = round(teacher["strict_final_pass"] * 12)
    assert stats["kept"] == kept and stats["dropped"]["failed_strict"] == 12 - kept
    assert stats["train"] + stats["eval"] == kept
    assert len((tmp_path / "sft" / "train.jsonl").read_text().splitlines()) == stats["train"]
    out = capsys.readouterr().out
    assert "wrote" in out and str(tmp_path / "sft") in out


def test_a_missing_input_is_a_clear_user_error(tmp_path, capsys):
    (tmp_path / "filter.yaml").write_text("filter: {}\n")
    code = main(["filter", "--params", str(tmp_path / "filter.yaml"), "--in", str(tmp_path / "none.jsonl"),
                 "--out", str(tmp_path / "sft")])
    assert code == 2 and "run `star teach`" in capsys.readouterr().err


def test_filter_renames_entities_of_a_synthetic_world_and_refuses_an_imported_one(tiny_world_dir, tmp_path,
                                                                                   monkeypatch, capsys):
    import shutil

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("STAR_PARENT_RUN_ID", raising=False)
    (tmp_path / "queries.yaml").write_text("queries:\n  sizes: {sft: 6, rl: 0, val: 0}\n  seed: 5\n")
    (tmp_path / "filter.yaml").write_text("filter:\n  eval_fraction: 0.0\n  rename_entities: true\n")
    (tmp_path / "teacher.yaml").write_text("teacher:\n  mistake_rate: 0.0\n")
    assert main(["queries", "--params", str(tmp_path / "queries.yaml"), "--world", str(tiny_world_dir),
                 "--out", str(tmp_path / "queries"), "--metrics", str(tmp_path / "q.json")]) == 0
    assert main(["teach", "--params", str(tmp_path / "teacher.yaml"), "--world", str(tiny_world_dir),
                 "--queries", str(tmp_path / "queries" / "sft.jsonl"), "--out", str(tmp_path / "traj.jsonl"),
                 "--metrics", str(tmp_path / "t.json")]) == 0
    assert main(["filter", "--params", str(tmp_path / "filter.yaml"), "--in", str(tmp_path / "traj.jsonl"),
                 "--world", str(tiny_world_dir), "--out", str(tmp_path / "sft"),
                 "--metrics", str(tmp_path / "f.json")]) == 0
    assert json.loads((tmp_path / "f.json").read_text())["renamed_entities"] is True
    trained = (tmp_path / "sft" / "train.jsonl").read_text()
    for line in (tmp_path / "queries" / "sft.jsonl").read_text().splitlines():
        query = json.loads(line)
        assert query["org"] not in trained and query["dest"] not in trained

    imported = tmp_path / "imported"
    shutil.copytree(tiny_world_dir, imported)
    manifest = json.loads((imported / "manifest.json").read_text())
    (imported / "manifest.json").write_text(json.dumps({**manifest, "source": "../shared/data/travelplanner"}))
    code = main(["filter", "--params", str(tmp_path / "filter.yaml"), "--in", str(tmp_path / "traj.jsonl"),
                 "--world", str(imported), "--out", str(tmp_path / "sft2")])
    assert code == 2 and "rename_entities: false" in capsys.readouterr().err
