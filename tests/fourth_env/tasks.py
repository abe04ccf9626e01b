"""The lookup game's tasks: names with their codes, one JSON object per line."""
from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ("amber", "birch", "cedar", "dune", "ember", "fjord", "grove", "heath", "iris", "juniper", "kelp", "larch")


def make_tasks(count: int, seed: int = 0) -> list[dict]:
    """`count` tasks {"id", "name", "code"} over distinct names, codes drawn from 10..99."""
    rng = random.Random(seed)
    return [{"id": f"t{i}", "name": name, "code": str(rng.randint(10, 99))}
            for i, name in enumerate(rng.sample(NAMES, count))]


def write_tasks(tasks: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


def read_tasks(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def question(task: dict) -> str:
    return f"What is the code of {task['name']}?"
