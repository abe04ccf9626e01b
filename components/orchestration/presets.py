"""Presets: per-scale overlays (`params/presets/<name>.yaml`, keyed by family) deep-merged into `params/`.

`star preset use qwen2.5-7b` rewrites `params/<family>.yaml` for every family the overlay names, keeping the
comments and key order of the files (ruamel round-trip), creating files that do not exist yet, and recording the
active preset in `params/preset.yaml` (read by `components.params.active_preset`; `components.tracking` names the
MLflow experiment after it). The params files stay plain YAML, so `dvc exp run -S params/rl.yaml:rl.reward.kind=macro`
keeps working.
"""
from __future__ import annotations

import importlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from components.errors import UserError
from components.params import ACTIVE_PRESET_FILE, ParamsError, load_section, parse_section

MISSING = object()  # a key the params file did not have
FAMILIES = ("world", "queries", "teacher", "filter", "model", "sft", "rl", "validate", "ood_qa", "report", "toolstar",
            "toolstar_sft", "toolstar_rl")


@dataclass(frozen=True)
class Change:
    """One leaf value a preset sets: `file` and dotted `key`, the value before (MISSING if absent) and after."""

    file: str
    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        before = "(new)" if self.old is MISSING else repr(self.old)
        return f"{self.file}: {self.key}: {before} -> {self.new!r}"


def _yaml() -> YAML:
    yaml = YAML()  # round-trip: keeps comments and key order
    yaml.preserve_quotes = True
    yaml.width = 120
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.representer.add_representer(type(None), _represent_null)
    return yaml


def _represent_null(representer, _value):
    """Write None as `null` (ruamel's default is an empty value, which reads badly in a params file)."""
    return representer.represent_scalar("tag:yaml.org,2002:null", "null")


def available_presets(presets_dir: Path) -> list[str]:
    """Names of the presets in `presets_dir` (file stems)."""
    return sorted(p.stem for p in presets_dir.glob("*.yaml"))


def preset_summary(name: str, presets_dir: Path, width: int = 100) -> str:
    """The first sentence of a preset file's leading comment, without its `name:` prefix ('' when it has none)."""
    lines = []
    for line in (presets_dir / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines).removeprefix(f"{name}:").strip()
    sentence = text.split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= width else sentence[: width - 3].rstrip() + "..."


def load_preset(name: str, presets_dir: Path) -> dict[str, Any]:
    """Read and check one preset overlay: a mapping from known families to mappings."""
    path = presets_dir / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(available_presets(presets_dir)) or "none"
        raise UserError(f"unknown preset '{name}': no {path} (available: {known})")
    overlay = _yaml().load(path.read_text()) or {}
    if not isinstance(overlay, dict):
        raise UserError(f"{path}: a preset must be a mapping of families, found {type(overlay).__name__}")
    for family, section in overlay.items():
        if family not in FAMILIES:
            raise UserError(f"{path}: unknown family '{family}' (families: {', '.join(FAMILIES)})")
        if not isinstance(section, dict):
            raise UserError(f"{path}: '{family}' must be a mapping of params, found {type(section).__name__}")
    return overlay


def deep_merge(base: dict, overlay: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Merge `overlay` into `base` in place (mappings recursively, everything else replaced).

    Returns the leaves that changed as (dotted key, old value or MISSING, new value).
    """
    changes: list[tuple[str, Any, Any]] = []
    for key, new in overlay.items():
        dotted = f"{prefix}{key}"
        old = base.get(key, MISSING)
        if isinstance(new, dict):
            if not isinstance(old, dict):  # a new block: report its leaves one by one
                base[key] = old = CommentedMap()
            changes += deep_merge(old, new, prefix=f"{dotted}.")
            continue
        plain_new = _plain(new)
        if old is MISSING or _plain(old) != plain_new:
            base[key] = _copy(new)
            changes.append((dotted, _plain(old), plain_new))
    return changes


def _plain(value: Any) -> Any:
    """ruamel containers as plain dicts/lists, for comparing and printing."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _copy(value: Any) -> Any:
    """A fresh ruamel container (so a merged-in block does not alias the overlay), in the overlay's style: a list
    written `[3, 5, 7]` in the preset stays a flow list in the params file."""
    if isinstance(value, dict):
        copy = CommentedMap()
        for k, v in value.items():
            copy[k] = _copy(v)
        return copy
    if isinstance(value, list):
        seq = CommentedSeq(_copy(v) for v in value)
        if isinstance(value, CommentedSeq) and value.fa.flow_style():
            seq.fa.set_flow_style()
        return seq
    return value


def merged_document(path: Path, family: str, section: dict) -> tuple[CommentedMap, list[Change]]:
    """The YAML document at `path` (empty if missing) with `section` deep-merged into `family:`, and the changes;
    nothing is written."""
    document = _yaml().load(path.read_text()) if path.exists() else None
    if document is None:
        document = CommentedMap()
    if not isinstance(document, dict):
        raise UserError(f"{path}: expected a mapping at the top level, found {type(document).__name__}")
    if not isinstance(document.get(family), dict):
        document[family] = CommentedMap()
    changes = [Change(str(path), f"{family}.{key}", old, new)
               for key, old, new in deep_merge(document[family], section)]
    return document, changes


def write_document(path: Path, document: CommentedMap) -> None:
    buffer = io.StringIO()
    _yaml().dump(document, buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buffer.getvalue())


def merge_into_file(path: Path, family: str, section: dict) -> list[Change]:
    """Deep-merge `section` into `family:` of the YAML file at `path` (created if missing); return the changes."""
    document, changes = merged_document(path, family, section)
    if changes or not path.exists():
        write_document(path, document)
    return changes


def invalid_sections(documents: dict[str, CommentedMap], sources: dict[str, Path]) -> list[str]:
    """What each family's typed params model rejects in the merged documents (empty: all valid)."""
    problems = []
    for family, document in documents.items():
        model = params_model(family)
        if model is None:
            continue
        try:
            parse_section(_plain(document), family, model, source=str(sources[family]))
        except ParamsError as exc:
            problems.append(str(exc))
    return problems


def apply_preset(name: str, params_dir: Path) -> list[Change]:
    """Write preset `name` (from `params_dir/presets`) into `params_dir/<family>.yaml`; record it as active."""
    overlay = load_preset(name, params_dir / "presets")
    paths = {family: params_dir / f"{family}.yaml" for family in overlay}
    merged = {family: merged_document(paths[family], family, section) for family, section in overlay.items()}
    problems = invalid_sections({family: document for family, (document, _) in merged.items()}, paths)
    if problems:
        raise UserError(f"preset '{name}' would write invalid params, so nothing was written; fix "
                        f"{params_dir / 'presets' / (name + '.yaml')}:\n" + "\n".join(problems))
    changes: list[Change] = []
    for family, (document, family_changes) in merged.items():
        if family_changes or not paths[family].exists():
            write_document(paths[family], document)
        changes += family_changes
    (params_dir / ACTIVE_PRESET_FILE).write_text(
        "# Written by `star preset use`: the preset the params/ files were last set from (names the MLflow experiment).\n"
        f"preset: {name}\n"
    )
    return changes


# Where each family's typed params live (the stage packages own them); `check_params` validates all of them
# before a pipeline run, so a typo fails in a second instead of after an hour of upstream stages.
PARAMS_MODELS = {
    "world": "components.travel.synthetic:WorldParams",
    "queries": "components.travel.queries:QueriesParams",
    "teacher": "components.synthesis.teacher:TeacherParams",
    "filter": "components.synthesis.filter:FilterParams",
    "model": "components.models.params:ModelParams",
    "sft": "components.training.sft_params:SFTParams",
    "rl": "components.training.rl.params:RLParams",
    "validate": "components.travel.validation:ValidateParams",
    "ood_qa": "components.qa.ood:OODQAParams",
    "report": "components.evaluation.report:ReportParams",
    "toolstar": "components.toolstar.params:ToolStarParams",
    "toolstar_sft": "components.training.sft_params:SFTParams",  # star sft --section toolstar_sft
    "toolstar_rl": "components.training.rl.params:RLParams",  # star rl --section toolstar_rl
}


def params_model(family: str) -> type | None:
    """The pydantic model of a family's params, or None when its stage package does not define one (yet)."""
    spec = PARAMS_MODELS.get(family)
    if spec is None:
        return None
    module_name, _, class_name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        return None


def check_params(params_dir: Path, families: tuple[str, ...] = FAMILIES) -> list[str]:
    """Validate every existing `params/<family>.yaml` with its model; return the problems (file, key, reason)."""
    problems = []
    for family in families:
        path = params_dir / f"{family}.yaml"
        model = params_model(family) if path.exists() else None  # importing a stage package costs seconds
        if model is None:
            continue
        try:
            load_section(path, family, model)
        except ParamsError as exc:
            problems.append(str(exc))
    return problems
