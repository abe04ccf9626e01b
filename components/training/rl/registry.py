"""What every registry of the RL trainer shares (algorithms, samplers, strategies): a name is registered once, and
an unknown name is refused with the registered ones."""
from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def add(registry: dict[str, T], name: str, item: T, what: str) -> T:
    """Put `item` in `registry` under `name`; a name already there is refused (unregister it first)."""
    if name in registry:
        raise ValueError(f"{what} {name!r} is already registered")
    registry[name] = item
    return item


def lookup(registry: dict[str, T], name: str, param: str) -> T:
    """The item `name` of `registry`, or a ValueError naming the params key `param` and the registered names."""
    if name not in registry:
        raise ValueError(f"unknown {param} {name!r}: use one of {', '.join(registry)}")
    return registry[name]
