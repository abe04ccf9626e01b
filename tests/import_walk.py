"""The modules a piece of Python code imports, read with `ast` at any depth (function-local imports included, which
the stage handlers use to import their stage code lazily), for the tests that check imports against a rule."""
from __future__ import annotations

import ast
from collections.abc import Iterable


def imported_names(nodes: Iterable[ast.AST], package: str) -> set[str]:
    """Every absolute name imported anywhere inside `nodes` (relative imports resolved against `package`): the
    modules, and `module.name` for each `from module import name` (which may be a submodule)."""
    found: set[str] = set()
    for node in (n for top in nodes for n in ast.walk(top)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found
