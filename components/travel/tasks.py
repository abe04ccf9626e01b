"""TravelPlanner queries: one typed record for every source (our JSONL, the official CSV/HF rows, Agent-STAR's JSONL).

The official dataset stores `date` and `local_constraint` as Python-literal strings
(`"['2022-03-16', '2022-03-17']"`, `"{'house rule': None, 'cuisine': None, ...}"`); `Query.from_dict` accepts both
the typed and the string-encoded forms so every loader goes through the same schema and the same errors.
"""
from __future__ import annotations

import ast
import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from components.errors import UserError
from components.jsonl import iter_jsonl

LEVELS = ("easy", "medium", "hard")
LOCAL_CONSTRAINT_KEYS = ("house rule", "cuisine", "room type", "transportation")
HOUSE_RULES = ("parties", "smoking", "children under 10", "pets", "visitors")
ROOM_TYPES = ("entire room", "private room", "shared room", "not shared room")
TRANSPORTATION_RULES = ("no flight", "no self-driving")
REQUIRED_FIELDS = ("org", "dest", "days", "date", "people_number", "budget")


class QueryError(UserError):
    """A query record is missing a field or holds a value of the wrong type."""


@dataclass(frozen=True)
class Query:
    """One TravelPlanner query with the official fields, typed."""

    idx: int
    org: str
    dest: str
    days: int
    visiting_city_number: int
    date: tuple[str, ...]
    people_number: int
    local_constraint: dict[str, Any] = field(default_factory=dict)
    budget: int = 0
    query: str = ""
    level: str = "easy"

    def __hash__(self) -> int:  # local_constraint is a dict; hash the identifying fields only
        return hash((self.idx, self.org, self.dest, self.date, self.budget))

    @property
    def house_rule(self) -> str | None:
        return self.local_constraint.get("house rule")

    @property
    def cuisine(self) -> list[str] | None:
        return self.local_constraint.get("cuisine")

    @property
    def room_type(self) -> str | None:
        return self.local_constraint.get("room type")

    @property
    def transportation(self) -> str | None:
        return self.local_constraint.get("transportation")

    def set_constraints(self) -> list[str]:
        """The local constraint keys this query sets (not None), in the official order."""
        return [key for key in LOCAL_CONSTRAINT_KEYS if self.local_constraint.get(key) is not None]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of contracts.md "Query record" (typed, not string-encoded)."""
        out = asdict(self)
        out["date"] = list(self.date)
        out["local_constraint"] = {
            key: (list(value) if isinstance(value, (list, tuple)) else value)
            for key, value in self.local_constraint.items()
        }
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], idx: int | None = None) -> "Query":
        """Build a query from a typed or string-encoded record; errors name the bad field and what it should be."""
        if not isinstance(data, dict):
            raise QueryError(f"a query record must be a JSON object, got {type(data).__name__}")
        missing = [name for name in REQUIRED_FIELDS if name not in data or data[name] in (None, "")]
        if missing:
            raise QueryError(f"query record {data.get('idx', idx)!r} lacks field(s) {missing}; "
                             f"every query needs {list(REQUIRED_FIELDS)}")
        record_idx = data.get("idx", idx)
        if record_idx is None:
            raise QueryError("query record has no 'idx' (pass idx= or add an integer 'idx' field)")
        days = _as_int(data["days"], "days", record_idx)
        dates = _parse_dates(data["date"], record_idx)
        if len(dates) != days:
            raise QueryError(f"query {record_idx}: 'date' has {len(dates)} entries but 'days' is {days}; "
                             "give one YYYY-MM-DD date per day")
        level = str(data.get("level") or "easy").strip().lower()
        if level not in LEVELS:
            raise QueryError(f"query {record_idx}: level {level!r} is not one of {list(LEVELS)}")
        visiting = data.get("visiting_city_number")
        return cls(
            idx=_as_int(record_idx, "idx", record_idx),
            org=str(data["org"]).strip(),
            dest=str(data["dest"]).strip(),
            days=days,
            visiting_city_number=_as_int(visiting, "visiting_city_number", record_idx)
            if visiting not in (None, "") else {3: 1, 5: 2, 7: 3}.get(days, 1),
            date=dates,
            people_number=_as_int(data["people_number"], "people_number", record_idx),
            local_constraint=parse_local_constraint(data.get("local_constraint"), record_idx),
            budget=_as_int(data["budget"], "budget", record_idx),
            query=str(data.get("query") or ""),
            level=level,
        )


def _as_int(value: Any, name: str, idx: Any) -> int:
    """An integer field that may arrive as int, float-with-no-fraction or digit string ('1,700' allowed)."""
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, str):
            value = value.replace(",", "").replace("$", "").strip()
            number = float(value)
        else:
            number = float(value)
        if number != int(number):
            raise ValueError
        return int(number)
    except (TypeError, ValueError):
        raise QueryError(f"query {idx}: field '{name}' must be an integer, got {value!r}") from None


def _literal(value: Any, name: str, idx: Any) -> Any:
    """Decode a string-encoded field (official CSV/HF rows) with JSON first, then Python-literal syntax."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    for decode in (json.loads, ast.literal_eval):
        try:
            return decode(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    raise QueryError(f"query {idx}: field '{name}' is not a list/dict literal: {value[:80]!r}")


def _parse_dates(value: Any, idx: Any) -> tuple[str, ...]:
    dates = _literal(value, "date", idx)
    if isinstance(dates, str):
        dates = [dates]
    if not isinstance(dates, (list, tuple)) or not all(isinstance(d, str) for d in dates):
        raise QueryError(f"query {idx}: 'date' must be a list of 'YYYY-MM-DD' strings, got {value!r}")
    return tuple(d.strip() for d in dates)


def parse_local_constraint(value: Any, idx: Any = None) -> dict[str, Any]:
    """Normalise `local_constraint` to the four official keys; cuisine becomes a list, empty values None."""
    raw = _literal(value, "local_constraint", idx) if value not in (None, "") else {}
    if not isinstance(raw, dict):
        raise QueryError(f"query {idx}: 'local_constraint' must be a mapping with keys "
                         f"{list(LOCAL_CONSTRAINT_KEYS)}, got {value!r}")
    unknown = set(raw) - set(LOCAL_CONSTRAINT_KEYS)
    if unknown:
        raise QueryError(f"query {idx}: unknown local_constraint key(s) {sorted(unknown)}; "
                         f"allowed: {list(LOCAL_CONSTRAINT_KEYS)}")
    out: dict[str, Any] = {}
    for key in LOCAL_CONSTRAINT_KEYS:
        item = raw.get(key)
        if item in ("", [], "None", "null"):
            item = None
        if key == "cuisine" and item is not None:
            item = [item] if isinstance(item, str) else [str(c).strip() for c in item]
        elif item is not None:
            item = str(item).strip()
        out[key] = item
    _check_constraint_values(out, idx)
    return out


def _check_constraint_values(constraint: dict[str, Any], idx: Any) -> None:
    allowed = {"house rule": HOUSE_RULES, "room type": ROOM_TYPES, "transportation": TRANSPORTATION_RULES}
    for key, values in allowed.items():
        if constraint[key] is not None and constraint[key] not in values:
            raise QueryError(f"query {idx}: local_constraint['{key}'] = {constraint[key]!r} is not one of "
                             f"{list(values)}")


def level_counts(total: int, mix: dict[str, float]) -> dict[str, int]:
    """Split `total` by the level weights with the largest-remainder rule (counts sum to `total`)."""
    weight = sum(mix.get(level, 0) for level in LEVELS)
    exact = {level: total * mix.get(level, 0) / weight for level in LEVELS}
    counts = {level: int(value) for level, value in exact.items()}
    for level in sorted(LEVELS, key=lambda l: exact[l] - counts[l], reverse=True)[: total - sum(counts.values())]:
        counts[level] += 1
    return counts


def level_stratified_prefix(queries: list[Query], n: int) -> list[Query]:
    """The first `n` queries of a split that keep its easy:medium:hard proportions (largest remainder), in file order.

    The queries stage shuffles levels together, so a plain prefix of a small `n` can skew the mix; this takes the first
    queries of each level instead. `n` at or above the split's size returns every query.
    """
    if n >= len(queries):
        return list(queries)
    present = {level: sum(q.level == level for q in queries) for level in LEVELS}
    wanted = level_counts(n, present)
    kept = []
    for query in queries:
        if wanted.get(query.level, 0) > 0:
            wanted[query.level] -= 1
            kept.append(query)
    return kept


def load_queries(path: str | Path) -> list[Query]:
    """Load a query JSONL file (our schema, the official JSONL or Agent-STAR's release: same decoder)."""
    queries = []
    hint = "run the `queries` stage or pass the right --queries"
    for line_no, record in iter_jsonl(path, error=QueryError, missing_hint=hint):
        try:
            queries.append(Query.from_dict(record, idx=len(queries)))
        except QueryError as exc:
            raise QueryError(f"{path}:{line_no}: {exc}") from None
    _check_unique_idx(queries, path)
    return queries


def load_official_csv(path: str | Path) -> list[Query]:
    """Load the official TravelPlanner CSV (string-encoded `date` / `local_constraint`); idx is the row order."""
    path = Path(path)
    if not path.exists():
        raise QueryError(f"query file {path} does not exist")
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [Query.from_dict({k: v for k, v in row.items() if k}, idx=i) for i, row in enumerate(rows)]


def load_agent_star_jsonl(path: str | Path) -> list[Query]:
    """Load Agent-STAR's released query JSONL: official fields, string- or typed-encoded, optional idx."""
    return load_queries(path)


def load_any(path: str | Path) -> list[Query]:
    """Load queries by extension: `.csv` is the official CSV, anything else JSONL."""
    return load_official_csv(path) if str(path).endswith(".csv") else load_queries(path)


def dump_queries(queries: Iterable[Query], path: str | Path) -> Path:
    """Write queries as JSONL (typed fields, one object a line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for query in queries:
            handle.write(json.dumps(query.to_dict(), ensure_ascii=False) + "\n")
    return path


def _check_unique_idx(queries: list[Query], path: Path) -> None:
    seen: set[int] = set()
    for query in queries:
        if query.idx in seen:
            raise QueryError(f"{path}: idx {query.idx} appears twice; idx must be unique within a file")
        seen.add(query.idx)
