"""`star queries` -> `star teach` -> `star filter` on the tiny world: the three stages' files and metrics."""
import json
import socket

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
    assert code == 1 and "run `star teach`" in capsys.readouterr().err


def test_star_teach_never_shows_the_endpoint_password_in_its_output_or_in_mlflow(tiny_world_dir, tiny_splits,
                                                                                   tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("STAR_EXPERIMENT", "redaction-test")
    monkeypatch.delenv("STAR_PARENT_RUN_ID", raising=False)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "teacher.yaml").write_text(
        f"teacher:\n  kind: endpoint\n  endpoint: {{base_url: 'http://bob:s3cret@127.0.0.1:{port}/v1', "
        "model: teacher, max_retries: 0, timeout_s: 0.5}\n")
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps(q.to_dict()) + "\n" for q in tiny_splits[0]["sft"][:2]))

    code = main(["teach", "--params", str(tmp_path / "teacher.yaml"), "--world", str(tiny_world_dir),
                 "--queries", str(queries), "--out", str(tmp_path / "traj.jsonl"),
                 "--metrics", str(tmp_path / "teacher.json")])
    printed = capsys.readouterr()
    assert code == 1 and f"http://***@127.0.0.1:{port}/v1" in printed.err
    assert "s3cret" not in printed.out + printed.err
    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("redaction-test").experiment_id])
    assert run.data.params["endpoint.base_url"] == f"http://***@127.0.0.1:{port}/v1"


def test_star_filter_names_the_file_and_line_of_a_malformed_trajectory(tmp_path, capsys):
    trajectories = tmp_path / "teacher.jsonl"
    trajectories.write_text('{"idx": 1}\n\n{"idx": 2, "messages": [\n{"idx": 3}\n')
    assert main(["filter", "--params", "params/filter.yaml", "--in", str(trajectories),
                 "--out", str(tmp_path / "sft")]) == 1
    err = capsys.readouterr().err
    assert f"{trajectories}:3: not valid JSON" in err and "Traceback" not in err
    assert not (tmp_path / "sft").exists()
