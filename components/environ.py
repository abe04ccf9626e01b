"""A consistent copy of the process environment while other threads may be changing it.

Iterating `os.environ` reads the names first and each value after; when another thread removes a variable in
between (MLflow's telemetry thread sets and deletes `_MLFLOW_TELEMETRY_SESSION_ID` at run start), the read raises
`KeyError` (or `RuntimeError` when the set of names changes mid-iteration). A `dvc repro` lost its SFT
stage to exactly that in `tracking.redact`. `snapshot` retries the copy, and its last pass skips the names that vanished.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def snapshot(environ: Mapping[str, str] | None = None, attempts: int = 8) -> dict[str, str]:
    """A plain dict copy of `environ` (default `os.environ`) that survives concurrent changes to it."""
    environ = os.environ if environ is None else environ
    for _ in range(max(attempts - 1, 0)):
        try:
            return dict(environ.items())
        except (KeyError, RuntimeError):  # a variable was removed or added while we read
            continue
    copy: dict[str, str] = {}
    for name in tuple(environ.keys()):
        value = environ.get(name)
        if value is not None:
            copy[name] = value
    return copy
