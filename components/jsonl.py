"""Reading the pipeline's JSONL files: one JSON object a line, errors that name the file and the line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from components.errors import UserError


def iter_jsonl(path: str | Path, error: type[UserError] = UserError, missing_hint: str = "") -> Iterator[tuple[int, object]]:
    """Yield `(line_number, value)` for each non-blank line of `path`.

    A missing file or a line that is not JSON raises `error` with the path, the line number and `missing_hint`.
    """
    path = Path(path)
    if not path.exists():
        raise error(f"{path} does not exist" + (f" ({missing_hint})" if missing_hint else ""))
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
