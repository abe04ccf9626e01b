"""Every `params/<file>.yaml:<key>=<value>` override shown to users (README, docs, dvc.yaml comments, --help texts)
names a key that exists, so the example runs as written."""
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
OVERRIDE = re.compile(r"params/([\w.-]+)\.yaml:([\w.]+)=([\w.-]+)")


def documented_overrides() -> list[tuple[str, str, str, str]]:
    files = [REPO / "README.md", REPO / "dvc.yaml", *REPO.glob("docs/*.md"), *REPO.glob("components/**/*.py"),
             *REPO.glob("flows/*.py")]
    found = []
    for path in files:
        for match in OVERRIDE.finditer(path.read_text(encoding="utf-8")):
            found.append((str(path.relative_to(REPO)), *match.groups()))
    return found


def test_the_documentation_shows_overrides():
    assert len(documented_overrides()) >= 5


def test_every_documented_override_names_an_existing_key():
    missing = []
    for source, family, key, _ in documented_overrides():
        node = yaml.safe_load((REPO / "params" / f"{family}.yaml").read_text())
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(f"{source}: params/{family}.yaml has no key {key}")
                break
            node = node[part]
        else:
            if isinstance(node, dict):
                missing.append(f"{source}: {key} in params/{family}.yaml is a section, not a value")
    assert not missing, "\n".join(missing)
