"""The package import graph of components/, read with `ast` (function-local imports included, which the stage
handlers use to import their stage code lazily): environments stay behind the protocol and the registry, and no two
packages import each other, even through others.

`lint-imports` checks the contracts in pyproject.toml; this walk is the same rule in plain Python, and also sees the
imports inside functions that a stage makes only when it runs.
"""
from __future__ import annotations

import ast
from pathlib import Path

from import_walk import imported_names

REPO = Path(__file__).resolve().parents[1]
ENVIRONMENTS = {"travel", "toolstar", "qa"}


def unit_of(module: str) -> str | None:
    """`components.travel.env` -> "travel" (a package or top module of components/); None outside components."""
    parts = module.split(".")
    return parts[1] if parts[0] == "components" and len(parts) > 1 else None


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name `path` imports, at any depth of its code."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return imported_names([tree], ".".join(path.relative_to(REPO).with_suffix("").parts[:-1]))


def package_graph(root: Path = REPO / "components") -> dict[str, set[str]]:
    """unit -> the other units of components/ it imports."""
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        source = unit_of(".".join(path.relative_to(REPO).with_suffix("").parts))
        if source is None or source == "__init__":
            continue
        targets = {unit_of(name) for name in imported_modules(path)}
        graph.setdefault(source, set()).update(t for t in targets if t and t != source)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle of the graph once, as the path that closes it (a depth-first search)."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_walk_sees_imports_inside_functions():
    graph = package_graph()
    # components/environments.py imports each environment's `source` module inside a loader function only
    assert ENVIRONMENTS <= graph["environments"]


def test_the_agent_layer_and_the_trainers_import_no_environment():
    graph = package_graph()
    assert graph["agent"] & ENVIRONMENTS == set()
    assert graph["training"] & ENVIRONMENTS == set()


def test_the_evaluation_and_synthesis_stages_import_no_environment():
    graph = package_graph()
    assert graph["evaluation"] & ENVIRONMENTS == set()
    assert graph["synthesis"] & ENVIRONMENTS == set()


def test_environments_import_no_other_environment():
    graph = package_graph()
    assert {env: graph[env] & (ENVIRONMENTS - {env}) for env in ENVIRONMENTS} == {env: set() for env in ENVIRONMENTS}


def test_no_two_packages_import_each_other_even_through_others():
    assert cycles(package_graph()) == []


def test_a_cycle_is_found_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
