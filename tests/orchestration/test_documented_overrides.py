"""Every `params/<file>.yaml:<key>=<value>` override shown to users (README, docs, dvc.yaml comments, --help texts)
names a key that exists, so the example runs as written."""
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_checker():
    """scripts/check_examples.py, whose override check (the same one the documented-examples runner uses) this reuses."""
    if "check_examples" in sys.modules:
        return sys.modules["check_examples"]
    spec = importlib.util.spec_from_file_location("check_examples", REPO / "scripts" / "check_examples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_examples"] = module
    spec.loader.exec_module(module)
    return module


check_examples = load_checker()
OVERRIDE = check_examples.OVERRIDE


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
    missing = [f"{source}: {problem}" for source, family, key, value in documented_overrides()
               for problem in check_examples.override_problems(f"params/{family}.yaml:{key}={value}", REPO)]
    assert not missing, "\n".join(missing)
