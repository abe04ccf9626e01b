"""Hugging Face checkpoints as stage outputs: save a model + tokenizer with a small manifest, snapshot a pretrained
checkpoint (local directory or Hub name) into the pipeline's `models/base`."""
from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

from components.errors import UserError

MANIFEST = "star_checkpoint.json"
SNAPSHOT_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]
"""The files of a causal-LM checkpoint worth copying (weights as safetensors, configs, tokenizer files)."""


def save_checkpoint(model, tokenizer, out_dir: str | Path, state_dict: dict | None = None, **manifest) -> Path:
    """Write `model` and `tokenizer` with `save_pretrained` into `out_dir`, plus `star_checkpoint.json` holding
    `manifest` (stage, source, parameter count, ...) and the creation time. `state_dict`: the weights to write in
    place of the model's own (a sharded model's, gathered)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if state_dict is None:
        model.save_pretrained(out_dir)
    else:
        model.save_pretrained(out_dir, state_dict=state_dict)
    tokenizer.save_pretrained(out_dir)
    write_manifest(out_dir, **manifest)
    return out_dir


def write_manifest(out_dir: str | Path, **manifest) -> Path:
    """Write `star_checkpoint.json` (what produced the checkpoint, and when) into a checkpoint directory."""
    path = Path(out_dir) / MANIFEST
    record = {**manifest, "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return path


def read_manifest(checkpoint_dir: str | Path) -> dict:
    """The `star_checkpoint.json` of a checkpoint, or `{}` for a checkpoint the pipeline did not write."""
    path = Path(checkpoint_dir) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def snapshot_pretrained(name_or_path: str, out_dir: str | Path, revision: str | None = None) -> Path:
    """Copy a pretrained checkpoint into `out_dir`: from a local directory, or downloaded from the Hub by name
    (`revision` pins a commit). The copy then loads through `load_policy_model` like any other checkpoint."""
    out_dir = Path(out_dir)
    source = Path(name_or_path)
    if source.is_dir() and source.resolve() == out_dir.resolve():
        raise UserError(f"model.source {source} is the output directory itself; point it at the original checkpoint")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    if source.is_dir():
        if not (source / "config.json").exists():
            raise UserError(f"{source} has no config.json: it is not a Hugging Face checkpoint directory")
        shutil.copytree(source, out_dir, ignore=shutil.ignore_patterns(".git", ".cache"))
    else:
        try:
            snapshot_download(repo_id=str(name_or_path), revision=revision, local_dir=out_dir,
                              allow_patterns=SNAPSHOT_PATTERNS)
        except HFValidationError as exc:
            raise UserError(f"{name_or_path!r} is neither a checkpoint directory nor a Hugging Face Hub name; set "
                            "model.source to an existing checkpoint directory, a Hub name (org/name), a .gguf file "
                            "or package:NAME") from exc
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
            raise UserError(f"cannot fetch {name_or_path!r} from the Hugging Face Hub ({exc}); set model.source "
                            "to a local checkpoint directory on a machine without network") from exc
        shutil.rmtree(out_dir / ".cache", ignore_errors=True)
    write_manifest(out_dir, stage="base_model", source=str(name_or_path), revision=revision)
    return out_dir
