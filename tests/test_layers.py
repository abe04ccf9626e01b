"""Imports go one way: the layers contract in pyproject.toml ([tool.importlinter]) holds.

CI runs `lint-imports` itself; this test makes the README's `pytest -q` catch an import that goes up a layer too.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is not installed (pip install -e '.[dev]')")

REPO = Path(__file__).resolve().parents[1]


def test_imports_go_one_way_down_the_layers():
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint) if lint.exists() else "lint-imports", "--no-cache"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
