"""DVC's S3 remote on an S3-compatible store (moto): push, lose the local copies, pull them back."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from orchestration.sample_project import make_sample_project

pytestmark = pytest.mark.integration
DVC = str(Path(sys.executable).parent / "dvc")


def dvc(root: Path, *args: str) -> str:
    done = subprocess.run([DVC, *args], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_push_and_pull_round_trip(tmp_path, s3_endpoint):
    root = make_sample_project(tmp_path / "project")
    dvc(root, "repro", "prepare")
    original = (root / "data" / "raw.json").read_text()
    dvc(root, "remote", "add", "-d", "storage", "s3://star-dvc/cache")
    dvc(root, "remote", "modify", "storage", "endpointurl", s3_endpoint)
    assert "1 file pushed" in dvc(root, "push")
    listed = boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(Bucket="star-dvc", Prefix="cache/")
    assert listed["KeyCount"] >= 1

    shutil.rmtree(root / ".dvc" / "cache")
    (root / "data" / "raw.json").unlink()
    dvc(root, "pull", "prepare")
    assert (root / "data" / "raw.json").read_text() == original
