"""Every command example shown to users (README, dvc.yaml comments, `star <command> --help`) is classified in
scripts/check_examples.py and parses with the real parsers; tests/integration/test_smoke_project.py runs the runnable
ones on the shared smoke-reproduced copy of the project."""
from __future__ import annotations

import importlib.util
import io
import logging
import sys
import textwrap
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]


def load_checker():
    spec = importlib.util.spec_from_file_location("check_examples", REPO / "scripts" / "check_examples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_examples", module)
    spec.loader.exec_module(module)
    return module


check_examples = load_checker()


@pytest.fixture(scope="module")
def parsers():
    return check_examples.Parsers()


@pytest.fixture(scope="module")
def examples(parsers):
    return {example.text: example for example in check_examples.extract(REPO, parsers.star)}


def test_the_extraction_finds_the_readme_dvc_yaml_and_help_examples(examples):
    for text in ["dvc repro",
                 "dvc exp run -S params/rl.yaml:rl.reward.kind=macro",
                 "dvc exp show && dvc metrics diff && dvc plots diff",
                 "star run --preset qwen2.5-7b --stages rl validate",
                 "star tool --world data/world SearchFlight "
                 "'{\"departure\": \"Palavi\", \"destination\": \"Gorvibri\", \"date\": \"2022-03-01\"}'",
                 "star evaluate --world DIR --queries Q.jsonl --plans P.jsonl --mode both --out M.json",
                 "star rollout --model DIR --world DIR --queries Q.jsonl --out T.jsonl"]:
        assert text in examples and any(s.startswith("README.md:") for s in examples[text].sources), text
    assert "dvc.yaml:3" in examples["dvc repro"].sources  # a dvc.yaml comment
    assert any(s == "star evaluate --help" for e in examples.values() for s in e.sources)  # a --help example
    assert "star" not in examples and "dvc" not in examples  # a program's bare name is no example


def test_every_example_is_classified_and_parses(parsers):
    report = check_examples.Report()
    classified = check_examples.check_static(report, REPO, parsers)
    assert not report.failures, "\n".join(report.failures)
    assert {check.how for _, check in classified} == {"run", "parse", "covered"}


def test_every_runnable_and_parse_only_star_example_parses_with_the_real_parser(examples, parsers):
    checked = 0
    for text, example in examples.items():
        check = check_examples.EXAMPLES[text]
        if check.how in ("run", "parse"):
            for argv in check_examples.segments(check.command or text):
                if argv[0] == "star":
                    assert check_examples.parse_error(parsers.star, argv[1:]) is None, (text, argv)
                    checked += 1
    assert checked >= 10


def test_a_bad_command_or_override_is_reported(parsers):
    assert parsers.problems("star evaluate --wrld data/world") != []
    assert parsers.problems("star no-such-command") != []
    assert "invalid choice" in parsers.problems("dvc exp rnu")[0]
    assert "unrecognized arguments: --nope" in parsers.problems("dvc exp run --nope")[0]
    assert parsers.problems("dvc exp run -S params/rl.yaml:rl.reward.kind=macro") == []
    [problem] = parsers.problems("dvc exp run -S params/rl.yaml:rl.no_such_key=1")
    assert "no key rl.no_such_key" in problem
    [problem] = parsers.problems("dvc exp run -S params/rl.yaml:rl=1")
    assert "section" in problem
    assert parsers.problems("star rollout --help") == []  # a help request parses


def test_a_broken_root_log_handler_does_not_hide_dvcs_parser_error(parsers):
    closed = io.StringIO()
    closed.close()
    broken = logging.StreamHandler(closed)  # what a library can leave on the root logger after its stream closed
    logging.getLogger().addHandler(broken)
    try:
        assert "invalid choice" in parsers.problems("dvc exp rnu")[0]
    finally:
        logging.getLogger().removeHandler(broken)


def test_shell_lines_split_into_commands():
    assert check_examples.segments("dvc exp show && dvc metrics diff | tee x; star ui") == [
        ["dvc", "exp", "show"], ["dvc", "metrics", "diff"], ["tee", "x"], ["star", "ui"]]
    assert check_examples.segments("star tool X '{\"a\": \"b c\"}'") == [["star", "tool", "X", '{"a": "b c"}']]
    assert check_examples.strip_comment("dvc repro   # the pipeline") == "dvc repro   "
    assert check_examples.strip_comment("star tool X '{\"a\": \"#1\"}'  # call") == "star tool X '{\"a\": \"#1\"}'  "


def test_an_unclassified_example_fails_and_a_stale_entry_too(tmp_path, parsers):
    (tmp_path / "README.md").write_text(textwrap.dedent("""\
        Run `star ui` or `star frobnicate --now`.

        ```bash
        dvc repro \\
          --force          # a continued line
        ```
        """))
    (tmp_path / "dvc.yaml").write_text("# `dvc plots show`\nstages:\n  a:\n    cmd: star ui\n")
    report = check_examples.Report()
    check_examples.check_static(report, tmp_path, parsers)
    failures = "\n".join(report.failures)
    assert "UNCLASSIFIED star frobnicate --now  [README.md:1]" in failures
    assert "UNCLASSIFIED dvc repro --force  [README.md:4]" in failures  # the continued line, comment stripped
    assert "STALE dvc exp run -S params/rl.yaml:rl.reward.kind=macro" in failures
    assert "UNCLASSIFIED star ui" not in failures and "UNCLASSIFIED dvc plots show" not in failures
