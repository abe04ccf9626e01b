"""The endpoint teacher against a local OpenAI-compatible server: retries through 500s and timeouts, and a
`star teach` killed mid-run (SIGKILL) that resumes without redoing any finished query."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.agent.params import EndpointParams
from components.synthesis.teacher import TeacherParams, read_finished, teach
from components.travel.source import TravelSource
from components.travel.synthetic import tiny_world_params, write_synthetic_world
from components.travel.world import World

from .teacher_server import ExpertChatServer

REPO = Path(__file__).resolve().parents[2]


def teacher_source(world, queries) -> TravelSource:
    """The trajectories stage's task source over `queries` (both evaluator modes, as `star teach` loads it)."""
    return TravelSource(world, list(queries), full_evaluation=True)


def endpoint_params(server, **overrides) -> TeacherParams:
    endpoint = EndpointParams(base_url=server.base_url, model="teacher", temperature=0.0, concurrency=4,
                              timeout_s=overrides.pop("timeout_s", 5.0), max_retries=6, backoff_s=0.01)
    return TeacherParams(kind="endpoint", endpoint=endpoint, **overrides)


def test_the_endpoint_teacher_rides_through_server_errors_and_timeouts(tiny_world, tiny_splits, tmp_path):
    queries = tiny_splits[0]["sft"][:8]

    def flaky(n: int) -> tuple[int, float]:
        if n % 7 == 3:
            return 500, 0.0
        if n % 19 == 5:
            return 200, 0.6  # slower than the client's timeout: retried
        return 200, 0.0

    with ExpertChatServer(queries, fail=flaky) as server:
        summary = teach(teacher_source(tiny_world, queries), endpoint_params(server, timeout_s=0.25, batch_size=8),
                        tmp_path / "teacher.jsonl", progress=False)
    assert 500 in server.statuses and len(server.requests) > len(server.replies)
    assert len(server.requests) > 5 + 19  # so request 24 (n % 19 == 5) was slow and timed out at least once
    assert summary["n"] == 8 and summary["generated"] == 8
    assert summary["strict_final_pass"] >= 0.9
    records = read_finished(tmp_path / "teacher.jsonl")
    assert sorted(r["idx"] for r in records) == [q.idx for q in sorted(queries, key=lambda q: q.idx)]


def test_a_torn_last_line_is_cut_off_when_resuming(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"idx": 0}) + "\n" + '{"idx": 1, "mess')
    assert [r["idx"] for r in read_finished(path)] == [0]
    assert path.read_text() == json.dumps({"idx": 0}) + "\n"


@pytest.mark.slow
def test_a_killed_star_teach_resumes_without_redoing_finished_queries(tiny_world_dir, tiny_splits, tmp_path):
    queries = tiny_splits[0]["sft"][:16]
    query_file = tmp_path / "queries.jsonl"
    query_file.write_text("".join(json.dumps(q.to_dict()) + "\n" for q in queries))
    out = tmp_path / "teacher.jsonl"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "STAR_EXPERIMENT": "test"}

    def star_teach(server) -> subprocess.Popen:
        params = tmp_path / "teacher.yaml"
        endpoint = {"base_url": server.base_url, "model": "teacher", "concurrency": 2, "timeout_s": 10,
                    "max_retries": 2, "backoff_s": 0.01}
        params.write_text(json.dumps({"teacher": {"kind": "endpoint", "batch_size": 4, "endpoint": endpoint}}))
        command = [sys.executable, "-m", "components.cli", "teach", "--params", str(params), "--world",
                   str(tiny_world_dir), "--queries", str(query_file), "--out", str(out), "--metrics",
                   str(tmp_path / "teacher_metrics.json")]
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    with ExpertChatServer(queries, fail=lambda n: (200, 0.03)) as server:
        process = star_teach(server)
        deadline = time.time() + 120
        while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 5):
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
    finished_first = {r["idx"] for r in read_finished(out)}
    assert 5 <= len(finished_first) < 16, "the kill came mid-run"

    with ExpertChatServer(queries) as server:
        process = star_teach(server)
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output.decode()[-2000:]
    assert not set(server.first_turns) & finished_first  # no finished query was started again
    records = read_finished(out)
    assert sorted(r["idx"] for r in records) == sorted(q.idx for q in queries)  # each exactly once
    metrics = json.loads((tmp_path / "teacher_metrics.json").read_text())
    assert metrics["resumed"] == len(finished_first) and metrics["generated"] == 16 - len(finished_first)


def test_resuming_with_other_teacher_settings_is_refused(tiny_world, tiny_splits, tmp_path):
    from components.errors import UserError

    queries = tiny_splits[0]["sft"][:2]
    out = tmp_path / "teacher.jsonl"
    teach(teacher_source(tiny_world, queries[:1]), TeacherParams(), out, progress=False)
    summary = teach(teacher_source(tiny_world, queries), TeacherParams(batch_size=1), out, progress=False)
    assert summary["resumed"] == 1 and summary["generated"] == 1  # batch size does not change trajectories
    with pytest.raises(UserError, match="mistake_rate changed.*--fresh"):
        teach(teacher_source(tiny_world, queries), TeacherParams(mistake_rate=0.5), out, progress=False)


def test_resuming_on_another_world_or_changed_queries_is_refused(tiny_world, tiny_splits, tmp_path):
    import dataclasses

    from components.errors import UserError

    write_synthetic_world(tiny_world_params(seed=1), tmp_path / "other_world")
    other_world = World.load(tmp_path / "other_world")
    queries = tiny_splits[0]["sft"][:2]
    out = tmp_path / "teacher.jsonl"
    teach(teacher_source(tiny_world, queries[:1]), TeacherParams(), out, progress=False)
    with pytest.raises(UserError, match=r"\(world changed\).*--fresh"):
        teach(teacher_source(other_world, queries), TeacherParams(), out, progress=False)
    edited = [dataclasses.replace(queries[0], budget=queries[0].budget + 1), queries[1]]
    with pytest.raises(UserError, match=r"\(queries changed\)"):
        teach(teacher_source(tiny_world, edited), TeacherParams(), out, progress=False)
    summary = teach(teacher_source(tiny_world, queries), TeacherParams(), out, progress=False)
    assert summary["resumed"] == 1  # the same ones resume
