"""Typed stage parameters: load one section of a params YAML file into a pydantic model.

Every stage reads its values from `params/<family>.yaml` (the files DVC tracks). Each stage package defines a
pydantic model for its section; `load_section` validates it when the stage starts and turns any problem into a
`ParamsError` naming the file and the offending key, so a typo never runs a 10-minute stage with a default.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from ruamel.yaml import YAML

from components.errors import UserError

M = TypeVar("M", bound=BaseModel)
ACTIVE_PRESET_FILE = "preset.yaml"  # in params/: the preset `star preset use` last applied


class ParamsError(UserError):
    """A params file is missing, unreadable, or holds a value of the wrong type or name."""


class Params(BaseModel):
    """Base for every stage's params: unknown keys are errors (they are almost always typos)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with an error that says which file is wrong."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"params file {path} does not exist (run `star preset use tiny` to create params/)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParamsError(f"params file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ParamsError(f"params file {path} must hold a mapping at the top level, found {type(data).__name__}")
    return data


def parse_section(data: dict[str, Any], key: str, model: type[M], source: str = "<params>") -> M:
    """Validate `data[key]` as `model`; errors name the source and the dotted key."""
    if key not in data:
        raise ParamsError(f"{source}: missing top-level key '{key}' (expected a '{key}:' section)")
    section = data[key] if data[key] is not None else {}
    try:
        return model.model_validate(section)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            dotted = ".".join([key, *[str(p) for p in err["loc"]]])
            problems.append(f"  {dotted}: {err['msg']} (got {err.get('input')!r})")
        raise ParamsError(f"{source}: invalid params\n" + "\n".join(problems)) from None


def load_section(path: str | Path, key: str, model: type[M]) -> M:
    """Load and validate section `key` of the YAML file at `path`."""
    return parse_section(read_yaml(path), key, model, source=str(path))


def active_preset(params_dir: Path) -> str | None:
    """The preset recorded in `params_dir/preset.yaml` by the last `star preset use`, or None."""
    path = Path(params_dir) / ACTIVE_PRESET_FILE
    if not path.exists():
        return None
    data = YAML(typ="safe").load(path.read_text()) or {}
    return str(data["preset"]) if isinstance(data, dict) and data.get("preset") else None
