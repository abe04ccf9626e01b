"""The DVC graph as data: order, upstream, GPU needs, selection, and DVC's run-cache key."""
from __future__ import annotations

from pathlib import Path

import pytest

from components.errors import UserError
from components.orchestration.graph import StageNode, read_graph, run_cache_key, select
from .sample_project import make_sample_project

REPO = Path(__file__).resolve().parents[2]


def test_the_project_graph_has_every_stage_in_dependency_order():
    nodes = read_graph(REPO)
    names = [n.name for n in nodes]
    assert set(names) == {"world", "queries", "trajectories", "sft_data", "qa_data", "base_model", "sft", "rl",
                          "validate@base", "validate@sft", "validate@rl", "ood_qa_base", "ood_qa@sft",
                          "ood_qa@rl", "toolstar_tasks", "toolstar_sft_data", "toolstar_sft",
                          "toolstar_rl", "toolstar_eval@base", "toolstar_eval@sft", "toolstar_eval@rl", "report"}
    for node in nodes:
        assert all(names.index(dep) < names.index(node.name) for dep in node.upstream), node
    by_name = {n.name: n for n in nodes}
    assert by_name["rl"].upstream == ("queries", "sft", "world")
    assert {n.name for n in nodes if n.gpus} == {"sft", "rl", "validate@base", "validate@sft", "validate@rl",
                                                  "ood_qa_base", "ood_qa@sft", "ood_qa@rl", "toolstar_sft",
                                                  "toolstar_rl", "toolstar_eval@base", "toolstar_eval@sft",
                                                  "toolstar_eval@rl"}
    # the Tool-Star branch: tasks from the QA corpus, the expert's records, its own SFT of the base model
    assert by_name["toolstar_tasks"].upstream == ("qa_data",)
    assert by_name["toolstar_sft"].upstream == ("base_model", "toolstar_sft_data")
    assert "toolstar_sft" in by_name["toolstar_eval@sft"].upstream
    assert set(by_name["toolstar_rl"].upstream) == {"qa_data", "toolstar_sft", "toolstar_tasks"}
    assert "toolstar_rl" in by_name["toolstar_eval@rl"].upstream
    assert "base_model" in by_name["toolstar_eval@base"].upstream
    assert set(by_name["report"].upstream) >= {"rl", "validate@rl", "ood_qa@rl", "queries"}
    assert "ood_qa_base" in by_name["ood_qa@sft"].upstream  # the alignment tax needs the base score first


def test_the_sample_project_graph(tmp_path):
    nodes = read_graph(make_sample_project(tmp_path / "p"))
    assert nodes == [StageNode("prepare", ()), StageNode("train_a", ("prepare",), gpus=1),
                     StageNode("train_b", ("prepare",), gpus=1), StageNode("report", ("train_a", "train_b"))]


NODES = [StageNode("world", ()), StageNode("queries", ("world",)), StageNode("sft", ("queries",), 1),
         StageNode("validate@base", ("world",), 1), StageNode("validate@sft", ("sft",), 1), StageNode("qa", ())]


def test_select_adds_upstream_stages_and_expands_foreach_groups():
    assert [n.name for n in select(NODES, ["sft"])] == ["world", "queries", "sft"]
    assert [n.name for n in select(NODES, ["validate"])] == ["world", "queries", "sft", "validate@base",
                                                             "validate@sft"]
    assert select(NODES, None) == NODES


def test_select_rejects_an_unknown_stage_naming_the_known_ones():
    with pytest.raises(UserError, match="unknown stage 'rll'.*world, queries"):
        select(NODES, ["rll"])


def test_run_cache_key_ignores_output_hashes_and_sizes():
    entry = {"cmd": "star sft", "deps": [{"path": "data/sft", "md5": "abc", "size": 10, "nfiles": 2}],
             "params": {"params/sft.yaml": {"sft": {"epochs": 3}}},
             "outs": [{"path": "models/sft", "md5": "def", "size": 99}]}
    other_output = {**entry, "outs": [{"path": "models/sft", "md5": "zzz", "size": 1}]}
    other_dep_size = {**entry, "deps": [{"path": "data/sft", "md5": "abc", "size": 11, "nfiles": 3}]}
    other_params = {**entry, "params": {"params/sft.yaml": {"sft": {"epochs": 4}}}}
    key = run_cache_key(entry)
    assert len(key) == 64
    assert run_cache_key(other_output) == key == run_cache_key(other_dep_size)
    assert run_cache_key(other_params) != key
