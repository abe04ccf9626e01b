"""Every dvc.yaml stage lists the code it runs in its deps, so a code change reruns the stages it changes.

Which code: `star <command>` resolved through components/cli.py's parser to its handler, then every module the
handler imports, transitively (an ast walk over components/ that counts function-local imports too, since the
handlers import their stage code lazily). A stage's deps must cover each package of that closure
(`components/travel`) and each shared top module (`components/params.py`), so the lists in dvc.yaml cannot rot.
A stage that reaches an environment through the registry (components/environments.py) runs the packages of the
kinds it names (every registered one where the kind comes from params, as in RL).
Then a sample git + DVC repo with the real dvc.yaml, params and components tree, locked up to date with placeholder
outputs: appending a comment to components/travel/reward.py makes `dvc status` name rl, validate@rl and report.
"""
from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from import_walk import imported_names

REPO = Path(__file__).resolve().parents[2]
CODE_ROOTS = ("components", "flows")  # the project's own importable packages


# --- the ast walk -------------------------------------------------------------------------------------------------

def _module_file(name: str) -> Path | None:
    """components.travel.reward -> components/travel/reward.py (a package -> its __init__.py); None if not ours."""
    if name.split(".")[0] not in CODE_ROOTS:
        return None
    base = REPO.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@cache
def _tree(name: str) -> ast.Module:
    return ast.parse(_module_file(name).read_text(), filename=str(_module_file(name)))


def _imports(nodes: list[ast.AST], module: str) -> set[str]:
    """The project modules imported anywhere inside `nodes` (function bodies included), with their parent packages."""
    package = module if _module_file(module).name == "__init__.py" else module.rpartition(".")[0]
    found = imported_names(nodes, package)
    modules = {name for name in found if _module_file(name)}
    return modules | {".".join(m.split(".")[:i]) for m in modules for i in range(1, m.count(".") + 1)}


def _handler_imports(module: str, function: str) -> set[str]:
    """What running `module.function` imports: the module's top-level imports, and those inside the function and
    inside every module-level definition it reaches by name (helpers, classes, constants), transitively."""
    tree = _tree(module)
    defined: dict[str, ast.AST] = {}
    top_level: list[ast.AST] = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined[stmt.name] = stmt
        else:
            top_level.append(stmt)
            for target in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
                if isinstance(target, ast.Name):
                    defined[target.id] = stmt
    reached, todo = set(), [function]
    while todo:
        name = todo.pop()
        if name in reached or name not in defined:
            continue
        reached.add(name)
        todo.extend(n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name))
    # top-level statements run on import; the unreached definitions (other sub-commands' handlers) do not
    return _imports(top_level + [defined[n] for n in reached], module)


REGISTRY = "components.environments"
REGISTRY_CALLS = {"source_module", "package_module", "load_source", "reward_columns", "expert_policy"}


def _registry_packages() -> dict[str, str]:
    """kind -> the package of its `source` module, as components/environments.py registers them."""
    from components import environments

    return {kind: load().__package__ for kind, load in environments.ENVIRONMENTS.items()}


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """The module's top-level string constants (`KIND = "travel"`)."""
    return {target.id: stmt.value.value for stmt in tree.body if isinstance(stmt, ast.Assign)
            and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
            for target in stmt.targets if isinstance(target, ast.Name)}


def _registry_imports(tree: ast.Module) -> set[str]:
    """The environment packages a module reaches through the registry (`environments.package_module(KIND, ...)` and
    the other calls of REGISTRY_CALLS on the `environments` module; any of their modules): the packages of the kinds it names (a string, or a module constant holding one); every registered package where a
    call's kind is only known at run time (`env.kind` from params)."""
    packages, strings = _registry_packages(), _module_strings(tree)
    reached: set[str] = set()
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args):
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr in REGISTRY_CALLS
                and getattr(func.value, "id", None) == "environments"):
            continue
        kind = call.args[0]
        kind = kind.value if isinstance(kind, ast.Constant) else strings.get(getattr(kind, "id", None))
        reached |= {packages[kind]} if kind in packages else set(packages.values())
    return reached


def _module_imports(module: str) -> set[str]:
    """What a module imports, with the registry's environment loaders replaced by the environments its callers name
    (`_registry_imports`): a stage that reaches only travel through the registry does not run toolstar's code."""
    found = _imports([_tree(module)], module)
    if module == REGISTRY:
        found = {m for m in found if not any(m == p or m.startswith(p + ".") for p in _registry_packages().values())}
    return found | {m for package in _registry_imports(_tree(module)) for m in _package_modules(package)}


def _package_modules(package: str) -> set[str]:
    """Every module of a package (`components.qa` -> components.qa.env, components.qa.ood, ...)."""
    directory = _module_file(package).parent
    return {package} | {f"{package}.{path.stem}" for path in directory.glob("*.py") if path.stem != "__init__"}


def _closure(modules: set[str]) -> set[str]:
    """`modules` and every project module they import (anywhere in their source), transitively."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(_module_imports(module) - seen)
    return seen


def _code_dep(module: str) -> str | None:
    """The dvc.yaml dep that covers a module: its top package's directory (`components/travel`), or the shared top
    module's file (`components/params.py`); None for the empty `components/__init__.py`."""
    parts = module.split(".")
    if len(parts) == 1:
        path = _module_file(module)
        return None if not path.read_text().strip() else str(path.relative_to(REPO))
    if len(parts) == 2 and _module_file(module).name != "__init__.py":
        return f"{parts[0]}/{parts[1]}.py"
    return f"{parts[0]}/{parts[1]}"


@cache
def _stages() -> dict[str, tuple[str, set[str]]]:
    """dvc.yaml's stages as DVC resolves them (foreach expanded): address -> (cmd, dep paths)."""
    from dvc.repo import Repo

    previous = os.getcwd()
    os.chdir(REPO)
    try:
        with Repo(str(REPO)) as repo:
            return {stage.addressing: (stage.cmd, {dep.def_path.rstrip("/") for dep in stage.deps})
                    for stage in repo.index.stages if stage.cmd}
    finally:
        os.chdir(previous)


@cache
def code_deps(cmd: str) -> set[str]:
    """The components/ paths a `star ...` stage command runs: the deps its dvc.yaml stage must list."""
    from components.cli import build_parser

    argv = shlex.split(cmd)
    assert argv[0] == "star", cmd
    handler = build_parser().parse_args(argv[1:]).handler
    modules = _closure(_handler_imports(handler.__module__, handler.__name__)) | {handler.__module__}
    return {dep for dep in map(_code_dep, modules) if dep}


# --- dvc.yaml lists the code ----------------------------------------------------------------------------------

def test_the_ast_walk_follows_function_local_imports_to_the_stage_code():
    rl = code_deps("star rl --params params/rl.yaml --model m --world w --queries q --out o --checkpoints c")
    assert {"components/training", "components/travel", "components/agent", "components/params.py"} <= rl
    world = code_deps("star world build --params params/world.yaml --out data/world")
    assert "components/travel" in world and "components/training" not in world and "components/toolstar" not in world


def test_every_stage_lists_the_components_code_its_command_imports():
    stages = _stages()
    assert len(stages) > 20
    missing = {}
    for name, (cmd, deps) in stages.items():
        needed = code_deps(cmd)
        assert needed, name
        if needed - deps:
            missing[name] = sorted(needed - deps)
    assert not missing, f"stages whose deps miss code they run (add these to dvc.yaml): {missing}"


def test_stages_list_no_tests_or_docs_and_only_code_they_run():
    for name, (cmd, deps) in _stages().items():
        listed = {d for d in deps if d.split("/")[0] in CODE_ROOTS}
        assert listed <= code_deps(cmd), f"{name} lists code it does not import: {sorted(listed - code_deps(cmd))}"
        assert not {d for d in deps if d.split("/")[0] in ("tests", "docs")}, name
    assert "components/toolstar" not in _stages()["validate@rl"][1]  # a sandbox edit leaves the validation alone


def test_dvcignore_leaves_byte_compiled_files_out_of_the_code_hashes():
    patterns = (REPO / ".dvcignore").read_text().splitlines()
    assert "__pycache__/" in patterns and "*.pyc" in patterns


# --- on a sample repo: a code change shows in `dvc status` ------------------------------------------------------

def _run(root: Path, *args: str) -> str:
    done = subprocess.run(args, cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _dvc(root: Path, *args: str) -> str:
    dvc = Path(sys.executable).parent / "dvc"
    return _run(root, str(dvc) if dvc.exists() else "dvc", *args)


def _placeholder(root: Path, path: str) -> None:
    """A stand-in for a stage's output or data dep: a small file, or a directory holding one."""
    target = root / path
    if target.suffix in (".json", ".jsonl", ".csv"):
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.write_text("{}\n")
    else:
        target.mkdir(parents=True, exist_ok=True)
        if not any(target.iterdir()):
            (target / "placeholder.txt").write_text(path + "\n")


@pytest.fixture
def locked_sample_repo(tmp_path) -> Path:
    """The project's dvc.yaml, params and code in a fresh git + DVC repo, every stage locked as up to date (placeholder
    outputs, `dvc commit`: no stage runs), with byte-compiled files beside the code as a real checkout has."""
    root = tmp_path / "sample"
    root.mkdir()
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "params", root / "params")
    for package in CODE_ROOTS:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run(root, "git", "init", "-q")
    _run(root, "git", "config", "user.email", "star@example.invalid")
    _run(root, "git", "config", "user.name", "star tests")
    _dvc(root, "init", "-q")
    _dvc(root, "config", "core.analytics", "false")
    for _, deps in _stages().values():
        for dep in deps:
            if dep.split("/")[0] not in CODE_ROOTS + ("params",):
                _placeholder(root, dep)
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        for stage in repo.index.stages:
            for out in stage.outs:
                _placeholder(root, out.def_path)
    _dvc(root, "commit", "-f", "-q")
    (root / "components/travel/__pycache__").mkdir()
    (root / "components/travel/__pycache__/rewards.cpython-311.pyc").write_bytes(b"\x00compiled")
    (root / "components/travel/stray.pyc").write_bytes(b"\x00compiled")
    assert json.loads(_dvc(root, "status", "--json")) == {}, "byte-compiled files changed a code dep's hash"
    return root


def test_editing_the_rewards_makes_dvc_status_show_rl_and_what_follows(locked_sample_repo: Path):
    root = locked_sample_repo
    with (root / "components/travel/reward.py").open("a") as f:
        f.write("# a change to the reward code\n")
    changed = json.loads(_dvc(root, "status", "--json"))
    print(_dvc(root, "status"))
    assert {"rl", "validate@rl", "validate@sft", "queries", "world"} <= set(changed)
    assert changed["rl"] == [{"changed deps": {"components/travel": "modified"}}]
    # the base model's resolution and the report run no travel code: their own deps are unchanged ...
    assert not {"base_model", "report"} & set(changed)
    # ... but the report reads rl's metrics and plots, so reproducing the pipeline reruns it after rl
    dry = _dvc(root, "repro", "--dry", "--force-downstream", "report")
    print(dry)
    running = {line.split("'")[1] for line in dry.splitlines() if line.startswith("Running stage")}
    assert {"rl", "validate@rl", "report"} <= running and "base_model" not in running
