"""An offline, seeded task set for the Tool-Star environment: questions that need both tools, and questions that
need only the Python tool.

Two kinds of task:

- `multi_hop_arithmetic`: a question about the generated encyclopedia (`star qa build`'s corpus: invented towns,
  organisations and people, one passage each) whose answer is arithmetic on numbers the passages state: the year a
  town was founded (800-1899) and the year an organisation was established (1700-1999), reached directly or through
  a bridge fact (the town where an organisation has its seat, the town where a person was born). "How many years
  passed between the founding of the town where Velmora Press has its seat and the establishment of Velmora
  Press?" needs two searches and one program. No template needs more than two searches, so the default limit of
  three tool calls (Tool-Star's) leaves room for the program.
- `compute`: arithmetic and number theory that a program solves and mental arithmetic does not (the sum of the
  primes below 17000, a modular power, the divisors of a six-digit number); no search needed.

Facts are read from the corpus passages themselves (the sentences of `FACT_SENTENCES`), not from the generator's
entities, so a task set is a function of the corpus file (`data/qa/corpus.jsonl`), the counts and the seed:
`generate_tasks(passages, num_multi_hop, num_compute, seed)` gives the same tasks on every machine.

The task file is JSONL, one task a line (`write_tasks`, `read_tasks`):

    {"id": "toolstar-00003", "kind": "multi_hop_arithmetic" | "compute", "template": "seat_gap",
     "question": "How many years passed between ...?", "answer": "412",
     "facts": [{"subject": "Velmora Press", "relation": "headquarters", "value": "Dunmere"}, ...]}

`answer` is a string (an integer written in decimal for every template here); `facts` lists, in the order a solver
needs them, the facts the question depends on (empty for `compute` tasks); `template` names the question template.

Tasks from evaluation datasets (`components/toolstar/datasets.py`: GSM8K, MATH-500, HotpotQA, ...) use the
same record with two more kinds and two optional keys, written only when set (so a generated task file is
unchanged):

    {"id": "gsm8k-00000", "kind": "math" | "qa", "template": "", "question": "...", "answer": "18",
     "answers": ["18"], "dataset": "gsm8k", "facts": []}

`answers`: every accepted golden answer (`answer` is the first of them; QA sets list aliases); `dataset`: the
dataset's name. `Task.golden` is the list a scorer compares against. A `math` answer is checked with math_verify, a
`qa` answer with Tool-Star's token F1 (`reward.task_metric`).
"""
from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from components.errors import UserError
from components.jsonl import iter_jsonl

Kind = Literal["multi_hop_arithmetic", "compute", "math", "qa"]
KINDS: tuple[str, ...] = get_args(Kind)
ENTITY_KINDS = ("town", "organisation", "person")

# How the encyclopedia states the facts the templates use, and how a one-hop question asks for each: the sentence
# and question templates of `components/qa/corpus.py`'s RELATIONS (a test keeps the two equal; they are
# repeated here because toolstar sits below the evaluation layer and reads the corpus only as a file).
FACT_SENTENCES: dict[str, str] = {
    "birthplace": "{subject} was born in {value}.",
    "headquarters": "{subject} has its seat in {value}.",
    "town_founded": "{subject} was founded in the year {value}.",
    "org_founded": "{subject} was established in the year {value}.",
}
FACT_QUESTIONS: dict[str, str] = {
    "birthplace": "Where was {subject} born?",
    "headquarters": "Where does {subject} have its seat?",
    "town_founded": "In which year was {subject} founded?",
    "org_founded": "In which year was {subject} established?",
}
NUMERIC_RELATIONS = ("town_founded", "org_founded")
KIND_OF_RELATION = {"birthplace": "person", "headquarters": "organisation", "town_founded": "town",
                    "org_founded": "organisation"}


class TaskError(UserError):
    """A task file or a task set that cannot be read or generated; the message says how to fix it."""


@dataclass(frozen=True)
class Fact:
    """One fact a question depends on: `subject --relation--> value`, as a passage states it."""

    subject: str
    relation: str
    value: str


@dataclass(frozen=True)
class Task:
    """One question with its exact answer (a string), its kind and the facts it needs; a dataset's task also has
    every accepted answer (`answers`) and the dataset's name."""

    id: str
    question: str
    answer: str
    kind: Kind
    template: str = ""
    facts: tuple[Fact, ...] = ()
    answers: tuple[str, ...] = ()  # every accepted answer, `answer` first (empty: `answer` alone)
    dataset: str = ""  # the evaluation dataset the task comes from ("" for a generated task)

    @property
    def golden(self) -> list[str]:
        """The answers a prediction is scored against."""
        return list(self.answers) if self.answers else [self.answer]

    def to_dict(self) -> dict:
        """The JSONL record (the schema in the module docstring); `answers` and `dataset` only when set."""
        record = {"id": self.id, "kind": self.kind, "template": self.template, "question": self.question,
                  "answer": self.answer}
        if self.answers:
            record["answers"] = list(self.answers)
        if self.dataset:
            record["dataset"] = self.dataset
        return {**record, "facts": [asdict(fact) for fact in self.facts]}

    @classmethod
    def from_dict(cls, record: Any) -> Task:
        """A task from its JSONL record; a ValueError says which field is wrong."""
        if not isinstance(record, dict):
            raise ValueError(f"a task is a JSON object, got {type(record).__name__}")
        missing = [key for key in ("id", "kind", "question", "answer") if key not in record]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        for key in ("id", "question", "answer"):
            if not isinstance(record[key], str) or not record[key].strip():
                raise ValueError(f"'{key}' must be a non-empty string (got {record[key]!r:.60})")
        if record["kind"] not in KINDS:
            raise ValueError(f"'kind' must be one of {', '.join(KINDS)} (got {record['kind']!r:.60})")
        facts = record.get("facts") or []
        if not isinstance(facts, list) or not all(
                isinstance(f, dict) and set(f) == {"subject", "relation", "value"} for f in facts):
            raise ValueError("'facts' must be a list of {\"subject\", \"relation\", \"value\"} objects")
        answers = record.get("answers") or []
        if not isinstance(answers, list) or not all(isinstance(a, str) and a.strip() for a in answers):
            raise ValueError("'answers' must be a list of non-empty strings")
        if answers and record["answer"] not in answers:
            raise ValueError(f"'answer' {record['answer']!r:.60} must be one of 'answers'")
        dataset = record.get("dataset") or ""
        if not isinstance(dataset, str):
            raise ValueError(f"'dataset' must be a string (got {dataset!r:.60})")
        return cls(id=record["id"], question=record["question"], answer=record["answer"], kind=record["kind"],
                   template=str(record.get("template") or ""),
                   facts=tuple(Fact(str(f["subject"]), str(f["relation"]), str(f["value"])) for f in facts),
                   answers=tuple(answers), dataset=dataset)


# ---- reading facts out of passages ----------------------------------------------------------------------------

def fact_pattern(relation: str, subject: str) -> re.Pattern:
    """The regex that finds `relation`'s value for `subject` in a text: the fact's sentence, starting at the start of
    a line or after a full stop (so "Mira" never matches inside "Almira"), with the value captured as `value`."""
    if relation not in FACT_SENTENCES:
        raise KeyError(f"unknown relation {relation!r}: one of {', '.join(FACT_SENTENCES)}")
    sentence = re.escape(FACT_SENTENCES[relation].format(subject=subject, value="\x00"))
    body = sentence.replace(re.escape("\x00"), r"(?P<value>[^.\n]+?)")
    return re.compile(r"(?:^|(?<=\. )|(?<=\n))" + body, re.MULTILINE)


def find_fact(texts: Iterable[str], subject: str, relation: str) -> str | None:
    """The value of `relation` for `subject` as stated in any of `texts` (the last one that states it), or None."""
    pattern = fact_pattern(relation, subject)
    found = None
    for text in texts:
        match = pattern.search(text)
        if match:
            found = match.group("value").strip()
    return found


def passage_title_text(passage: Any) -> tuple[str, str]:
    """(title, text) of a corpus passage: a dict with title/text (ours) or FlashRAG's contents ('"Title"\\ntext'),
    or an object with `.title` and `.text`."""
    if isinstance(passage, Mapping):
        if "title" in passage and "text" in passage:
            return str(passage["title"]), str(passage["text"])
        if "contents" in passage:
            first, _, rest = str(passage["contents"]).partition("\n")
            return first.strip().strip('"'), rest.strip()
        raise TaskError(f"passage {dict(passage)!r:.80} has neither title/text nor contents: use the corpus JSONL "
                        "of `star qa build` (id, title, text)")
    if hasattr(passage, "title") and hasattr(passage, "text"):
        return str(passage.title), str(passage.text)
    raise TaskError(f"a passage must be a dict or have .title and .text (got {type(passage).__name__})")


def read_facts(passages: Iterable[Any]) -> dict[str, dict[str, str]]:
    """Every fact of `FACT_SENTENCES` the passages state about their own subject: {title: {relation: value}}."""
    facts: dict[str, dict[str, str]] = {}
    for passage in passages:
        title, text = passage_title_text(passage)
        found = {relation: value for relation in FACT_SENTENCES
                 if (value := find_fact([text], title, relation)) is not None}
        if found:
            facts.setdefault(title, {}).update(found)
    return facts


def entities_by_kind(facts: Mapping[str, Mapping[str, str]]) -> dict[str, list[str]]:
    """Titles grouped by entity kind (a town states when it was founded, an organisation when it was established,
    a person where they were born), each list sorted so sampling does not depend on passage order."""
    kinds: dict[str, list[str]] = {kind: [] for kind in ENTITY_KINDS}
    for title, relations in facts.items():
        for relation in relations:
            kind = KIND_OF_RELATION[relation]
            if title not in kinds[kind]:
                kinds[kind].append(title)
    return {kind: sorted(titles) for kind, titles in kinds.items()}


# ---- templates ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lookup:
    """One fact a multi-hop question needs: bind `relation`'s value for `subject` (a question slot, or the variable
    of an earlier lookup: the bridge) to the variable `var`."""

    var: str
    subject: str
    relation: str


@dataclass(frozen=True)
class Template:
    """A question template: how to sample its slots, which facts it needs, and how its answer follows.

    `entities`: slot -> entity kind (multi-hop); `numbers`: slot -> inclusive range, or `sample(rng)` for slots
    sampled together (compute); `answer(values)` maps the slot and lookup values (numbers as ints) to the answer.
    """

    name: str
    kind: Kind
    question: str
    answer: Callable[[dict], int]
    entities: Mapping[str, str] = field(default_factory=dict)
    numbers: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    lookups: tuple[Lookup, ...] = ()
    sample: Callable[[random.Random], dict[str, int]] | None = None
    distinct: tuple[str, ...] = ()  # entity slots that must name different entities

    def slots(self, rng: random.Random, kinds: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        """One draw of the question's slots."""
        values: dict[str, Any] = {slot: rng.randint(low, high) for slot, (low, high) in self.numbers.items()}
        if self.sample is not None:
            values.update(self.sample(rng))
        for slot, kind in self.entities.items():
            values[slot] = rng.choice(kinds[kind])
        return values


def _gap(values: dict) -> int:
    return abs(values["a"] - values["b"])


MULTI_HOP_TEMPLATES: tuple[Template, ...] = (
    Template("town_org_gap", "multi_hop_arithmetic",
             "How many years passed between the founding of {town} and the establishment of {org}?", _gap,
             entities={"town": "town", "org": "organisation"},
             lookups=(Lookup("a", "town", "town_founded"), Lookup("b", "org", "org_founded"))),
    Template("town_gap", "multi_hop_arithmetic",
             "How many years passed between the founding of {town_a} and the founding of {town_b}?", _gap,
             entities={"town_a": "town", "town_b": "town"}, distinct=("town_a", "town_b"),
             lookups=(Lookup("a", "town_a", "town_founded"), Lookup("b", "town_b", "town_founded"))),
    Template("org_gap", "multi_hop_arithmetic",
             "How many years passed between the establishment of {org_a} and the establishment of {org_b}?", _gap,
             entities={"org_a": "organisation", "org_b": "organisation"}, distinct=("org_a", "org_b"),
             lookups=(Lookup("a", "org_a", "org_founded"), Lookup("b", "org_b", "org_founded"))),
    Template("seat_gap", "multi_hop_arithmetic",
             "How many years passed between the founding of the town where {org} has its seat and the "
             "establishment of {org}?", _gap,
             entities={"org": "organisation"},
             lookups=(Lookup("seat", "org", "headquarters"), Lookup("b", "org", "org_founded"),
                      Lookup("a", "seat", "town_founded"))),
    Template("birthplace_age", "multi_hop_arithmetic",
             "How many years before the year {year} was the town where {person} was born founded?",
             lambda v: v["year"] - v["a"],
             entities={"person": "person"}, numbers={"year": (1900, 2025)},
             lookups=(Lookup("town", "person", "birthplace"), Lookup("a", "town", "town_founded"))),
    Template("year_sum", "multi_hop_arithmetic",
             "What is the sum of the year in which {town} was founded and the year in which {org} was "
             "established?", lambda v: v["a"] + v["b"],
             entities={"town": "town", "org": "organisation"},
             lookups=(Lookup("a", "town", "town_founded"), Lookup("b", "org", "org_founded"))),
    Template("year_remainder", "multi_hop_arithmetic",
             "What is the remainder when the year in which {org} was established is divided by {m}?",
             lambda v: v["b"] % v["m"],
             entities={"org": "organisation"}, numbers={"m": (3, 97)},
             lookups=(Lookup("b", "org", "org_founded"),)),
)


def _primes_below(n: int) -> list[int]:
    return [k for k in range(2, n) if all(k % p for p in range(2, math.isqrt(k) + 1))]


def _divisor_count(n: int) -> int:
    count, p = 1, 2
    while p * p <= n:
        power = 0
        while n % p == 0:
            n //= p
            power += 1
        count *= power + 1
        p += 1
    return count * (2 if n > 1 else 1)


def _fibonacci_mod(n: int, m: int) -> int:
    a, b = 1, 1  # F(1), F(2)
    for _ in range(n - 1):
        a, b = b, (a + b) % m
    return a % m


def _gcd_slots(rng: random.Random) -> dict[str, int]:
    g = rng.randint(2, 500)
    return {"a": g * rng.randint(2, 2000), "b": g * rng.randint(2, 2000)}


COMPUTE_TEMPLATES: tuple[Template, ...] = (
    Template("prime_sum", "compute", "What is the sum of all prime numbers less than {n}?",
             lambda v: sum(_primes_below(v["n"])), numbers={"n": (100, 20000)}),
    Template("gcd", "compute", "What is the greatest common divisor of {a} and {b}?",
             lambda v: math.gcd(v["a"], v["b"]), sample=_gcd_slots),
    Template("modpow", "compute", "What is the remainder when {a} to the power of {b} is divided by {m}?",
             lambda v: pow(v["a"], v["b"], v["m"]), numbers={"a": (2, 999), "b": (10, 1_000_000), "m": (7, 9999)}),
    Template("divisor_count", "compute", "How many positive divisors does {n} have?",
             lambda v: _divisor_count(v["n"]), numbers={"n": (1000, 1_000_000)}),
    Template("fibonacci_mod", "compute",
             "What is the remainder when the {n}-th Fibonacci number is divided by {m}, counting the first two "
             "Fibonacci numbers as 1 and 1?",
             lambda v: _fibonacci_mod(v["n"], v["m"]), numbers={"n": (50, 5000), "m": (10, 1000)}),
    Template("coprime_count", "compute", "How many integers from 1 to {n} are coprime to {k}?",
             lambda v: sum(math.gcd(i, v["k"]) == 1 for i in range(1, v["n"] + 1)),
             numbers={"n": (100, 100_000), "k": (6, 1000)}),
    Template("power_digit_sum", "compute", "What is the sum of the digits of {a} to the power of {b}?",
             lambda v: sum(map(int, str(v["a"] ** v["b"]))), numbers={"a": (2, 9), "b": (50, 500)}),
    Template("lcm_range", "compute", "What is the least common multiple of the integers from 1 to {n}?",
             lambda v: math.lcm(*range(1, v["n"] + 1)), numbers={"n": (10, 40)}),
)

TEMPLATES: dict[str, Template] = {t.name: t for t in MULTI_HOP_TEMPLATES + COMPUTE_TEMPLATES}


def resolve_lookups(template: Template, slots: Mapping[str, Any],
                    facts: Mapping[str, Mapping[str, str]]) -> tuple[dict[str, Any], list[Fact]] | None:
    """The values of every lookup of `template` for these slots, from `facts` (numbers as ints), with the facts
    used; None when the corpus does not state one of them."""
    values: dict[str, Any] = dict(slots)
    used: list[Fact] = []
    for lookup in template.lookups:
        subject = values.get(lookup.subject)
        value = facts.get(str(subject), {}).get(lookup.relation)
        if value is None:
            return None
        used.append(Fact(str(subject), lookup.relation, value))
        if lookup.relation in NUMERIC_RELATIONS:
            if not value.isdigit():
                return None
            values[lookup.var] = int(value)
        else:
            values[lookup.var] = value
    return values, used


def make_task(template: Template, slots: Mapping[str, Any], facts: Mapping[str, Mapping[str, str]],
              task_id: str) -> Task | None:
    """The task of `template` with these slots (None when the corpus lacks a fact it needs)."""
    resolved = resolve_lookups(template, slots, facts)
    if resolved is None:
        return None
    values, used = resolved
    return Task(id=task_id, question=template.question.format(**slots), answer=str(template.answer(values)),
                kind=template.kind, template=template.name, facts=tuple(used))


def _draw(templates: Sequence[Template], count: int, rng: random.Random, facts: Mapping[str, Mapping[str, str]],
          kinds: Mapping[str, Sequence[str]], seen: set[str]) -> list[Task]:
    """`count` tasks, the templates taken in turn, each question new."""
    tasks: list[Task] = []
    for index in range(count):
        template = templates[index % len(templates)]
        for _ in range(200):
            slots = template.slots(rng, kinds)
            if len({slots[s] for s in template.distinct}) < len(template.distinct):
                continue
            task = make_task(template, slots, facts, task_id="")
            if task is not None and task.question not in seen:
                seen.add(task.question)
                tasks.append(task)
                break
        else:
            raise TaskError(f"could not draw a new '{template.name}' question after 200 tries: the corpus is too small "
                            f"for {count} tasks of this kind (ask for fewer, or build a larger corpus)")
    return tasks


def generate_tasks(passages: Iterable[Any], num_multi_hop: int, num_compute: int, seed: int = 0) -> list[Task]:
    """`num_multi_hop` questions over the corpus `passages` and `num_compute` computation problems, the templates of
    each kind in turn, shuffled together with `seed`; ids `toolstar-00000`… in the returned order. Deterministic:
    the same passages, counts and seed give the same tasks."""
    if num_multi_hop < 0 or num_compute < 0:
        raise TaskError(f"task counts must be >= 0 (got num_multi_hop={num_multi_hop}, num_compute={num_compute})")
    rng = random.Random(seed)
    facts = read_facts(passages) if num_multi_hop else {}
    kinds = entities_by_kind(facts)
    if num_multi_hop:
        empty = [kind for kind in ENTITY_KINDS if not kinds[kind]]
        if empty:
            raise TaskError(f"the corpus states no facts about any {' or '.join(empty)}: multi-hop tasks need the "
                            "generated encyclopedia (`star qa build` writes data/qa/corpus.jsonl); for another corpus "
                            "set num_multi_hop to 0")
    seen: set[str] = set()
    tasks = (_draw(MULTI_HOP_TEMPLATES, num_multi_hop, rng, facts, kinds, seen)
             + _draw(COMPUTE_TEMPLATES, num_compute, rng, facts, kinds, seen))
    rng.shuffle(tasks)
    return [Task(id=f"toolstar-{i:05d}", question=t.question, answer=t.answer, kind=t.kind, template=t.template,
                 facts=t.facts) for i, t in enumerate(tasks)]


# ---- files ----------------------------------------------------------------------------------------------------

def write_tasks(path: str | Path, tasks: Iterable[Task]) -> int:
    """Write tasks as JSONL (one record a line, the module docstring's schema); returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for task in tasks:
            handle.write(json.dumps(task.to_dict(), ensure_ascii=False) + "\n")
            count += 1
    return count


def read_tasks(path: str | Path) -> list[Task]:
    """Read a task JSONL file; an error names the file, the line and the field, and ids must be unique."""
    tasks: list[Task] = []
    ids: set[str] = set()
    for line_no, record in iter_jsonl(path, error=TaskError, missing_hint="generate it with `generate_tasks` and "
                                                                          "`write_tasks`"):
        try:
            task = Task.from_dict(record)
        except ValueError as exc:
            raise TaskError(f"{path}:{line_no}: {exc}") from None
        if task.id in ids:
            raise TaskError(f"{path}:{line_no}: duplicate task id {task.id!r} (ids must be unique)")
        ids.add(task.id)
        tasks.append(task)
    return tasks
