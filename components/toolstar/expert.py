"""The programmatic Tool-Star expert: a text policy that solves the generated tasks through the environment.

It reads the question with the task templates (`tasks.TEMPLATES`), then, one turn at a time:

- a multi-hop question: for each fact the template needs (`Template.lookups`, bridges in order), it searches with
  the fact's one-hop question ("In which year was Dunmere founded?") unless an earlier result already states it, and
  reads the value out of the `<result>` observations (never out of the corpus or the task); when every fact is read
  it writes a program that binds each number to a variable and prints the answer; then it answers with what the
  program printed, inside `\\boxed{}`;
- a compute question: it writes the program, then answers with its output.

Every turn opens with a `<think>` that says what it knows and what it does next, as Tool-Star's trajectories do,
so the format check of `reward.format_problem` passes. A fact that two searches (the question, then the bare name)
did not find, a program that failed, or a question of no template gets the answer "unknown".

`ToolStarExpertPolicy` has the agent Policy interface (`generate(requests) -> list[turn]`, each request with
`messages`), returning `ExpertTurn`s with the fields of `components.agent.types.TurnResult` (toolstar sits below the
agent layer, so it does not import that class; the agent loop reads the fields).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from components.agent.types import TurnPolicy
from components.toolstar.protocol import NO_OUTPUT
from components.toolstar.tasks import FACT_QUESTIONS, FACT_SENTENCES, NUMERIC_RELATIONS, TEMPLATES, Template, find_fact

UNKNOWN = "unknown"

# The expression each multi-hop template's program prints (over its lookup variables and number slots).
EXPRESSIONS: dict[str, str] = {
    "town_org_gap": "abs(a - b)",
    "town_gap": "abs(a - b)",
    "org_gap": "abs(a - b)",
    "seat_gap": "abs(a - b)",
    "birthplace_age": "year - a",
    "year_sum": "a + b",
    "year_remainder": "b % m",
}

# The program for each compute template (str.format slots; the code itself has no braces).
PROGRAMS: dict[str, str] = {
    "prime_sum": """\
n = {n}
is_prime = [True] * n
is_prime[0] = is_prime[1] = False
for i in range(2, int(n ** 0.5) + 1):
    if is_prime[i]:
        for j in range(i * i, n, i):
            is_prime[j] = False
print(sum(i for i in range(n) if is_prime[i]))""",
    "gcd": "import math\n\nprint(math.gcd({a}, {b}))",
    "modpow": "print(pow({a}, {b}, {m}))",
    "divisor_count": """\
n = {n}
count = 0
i = 1
while i * i <= n:
    if n % i == 0:
        count += 1 if i * i == n else 2
    i += 1
print(count)""",
    "fibonacci_mod": """\
n, m = {n}, {m}
a, b = 1, 1  # the first two Fibonacci numbers
for _ in range(n - 1):
    a, b = b, a + b
print(a % m)""",
    "coprime_count": "import math\n\nn, k = {n}, {k}\nprint(sum(1 for i in range(1, n + 1) if math.gcd(i, k) == 1))",
    "power_digit_sum": "print(sum(int(digit) for digit in str({a} ** {b})))",
    "lcm_range": """\
import math

result = 1
for i in range(1, {n} + 1):
    result = result * i // math.gcd(result, i)
print(result)""",
}


@dataclass(frozen=True)
class ExpertTurn:
    """One generated turn: the fields of the agent layer's TurnResult (text only, no tokens)."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finished: bool = True
    entropies: list[float] | None = None


# ---- reading the question and the history ---------------------------------------------------------------------

def _template_regex(template: Template) -> re.Pattern:
    """The question template as a regex: entity slots match names, number slots digits; a slot that appears twice
    must repeat the same text."""
    pattern, seen, position = "", set(), 0
    for match in re.finditer(r"\{(\w+)\}", template.question):
        pattern += re.escape(template.question[position:match.start()])
        slot = match.group(1)
        if slot in seen:
            pattern += f"(?P={slot})"
        else:
            seen.add(slot)
            pattern += f"(?P<{slot}>.+?)" if slot in template.entities else f"(?P<{slot}>\\d+)"
        position = match.end()
    return re.compile("^" + pattern + re.escape(template.question[position:]) + "$")


def _literal_length(template: Template) -> int:
    return len(re.sub(r"\{\w+\}", "", template.question))


# The most specific templates first: "…the founding of the town where X has its seat and…" also fits "…the
# founding of {town} and…" with a town named "the town where X has its seat".
_PATTERNS: list[tuple[re.Pattern, Template]] = [
    (_template_regex(t), t) for t in sorted(TEMPLATES.values(), key=_literal_length, reverse=True)]


def match_question(question: str) -> tuple[Template, dict[str, Any]] | None:
    """The template a question was written from and its slot values (numbers as ints), or None."""
    question = question.strip()
    for pattern, template in _PATTERNS:
        match = pattern.match(question)
        if match:
            slots = {slot: int(value) if value.isdigit() and slot not in template.entities else value
                     for slot, value in match.groupdict().items()}
            return template, slots
    return None


def question_of(messages: Sequence[dict]) -> str:
    """The question: the first user message."""
    return next(m["content"] for m in messages if m["role"] == "user")


def result_body(content: str) -> str:
    """The inside of a `<result>` observation (the text itself when it is not one)."""
    text = content.strip()
    if text.startswith("<result>") and text.endswith("</result>"):
        text = text[len("<result>"):-len("</result>")]
    return text.strip("\n")


def observations_of(messages: Sequence[dict]) -> list[str]:
    """Every observation so far: the user messages after the question, unwrapped."""
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    return [result_body(m["content"]) for m in messages[first_user + 1:] if m["role"] in ("user", "tool")]


def searches_of(messages: Sequence[dict]) -> list[str]:
    """The queries of the searches made so far."""
    return [q.strip() for m in messages if m["role"] == "assistant"
            for q in re.findall(r"<search>(.*?)</search>", m["content"], re.DOTALL)]


def program_output(messages: Sequence[dict]) -> str | None:
    """The observation that followed the last `<python>` turn, or None when no program has run yet."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message["role"] == "assistant" and "</python>" in message["content"]:
            following = messages[index + 1] if index + 1 < len(messages) else None
            return result_body(following["content"]) if following and following["role"] != "assistant" else None
    return None


def printed_value(output: str) -> str | None:
    """The value a program printed (its last line), or None when it failed or printed nothing."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    if not lines or output.strip() == NO_OUTPUT or any(line.startswith("Error:") for line in lines):
        return None
    return lines[-1]


# ---- the turns ------------------------------------------------------------------------------------------------

def search_turn(query: str, think: str) -> str:
    return f"<think> {think} </think>\n<search> {query} </search>"


def python_turn(code: str, think: str) -> str:
    return f"<think> {think} </think>\n<python>\n{code}\n</python>"


def answer_turn(value: str, think: str) -> str:
    return f"<think> {think} </think>\n<answer> The final answer is \\[ \\boxed{{{value}}} \\] </answer>"


def fact_sentence(subject: str, relation: str, value: str) -> str:
    return FACT_SENTENCES[relation].format(subject=subject, value=value)


def multi_hop_program(template: Template, values: dict[str, Any], facts: list[tuple[str, str, str]]) -> str:
    """The program for a multi-hop question: one line per number (the fact it comes from as a comment), then the
    printed expression."""
    lines = []
    for slot in template.numbers:
        lines.append(f"{slot} = {values[slot]}")
    for (subject, relation, value), lookup in zip(facts, template.lookups):
        if lookup.relation in NUMERIC_RELATIONS:
            lines.append(f"{lookup.var} = {value}  # {fact_sentence(subject, relation, value)[:-1]}")
    lines.append(f"print({EXPRESSIONS[template.name]})")
    return "\n".join(lines)


def _multi_hop_turn(template: Template, slots: dict[str, Any], messages: Sequence[dict]) -> str:
    observations, searched = observations_of(messages), searches_of(messages)
    values, facts = dict(slots), []
    for lookup in template.lookups:
        subject = str(values[lookup.subject])
        value = find_fact(observations, subject, lookup.relation)
        if value is None:
            known = " ".join(fact_sentence(*fact) for fact in facts)
            for query in (FACT_QUESTIONS[lookup.relation].format(subject=subject), subject):
                if query not in searched:
                    return search_turn(query, f"{known} I need to know: "
                                              f"{FACT_QUESTIONS[lookup.relation].format(subject=subject)}".strip())
            return answer_turn(UNKNOWN, f"{known} I could not find: "
                                        f"{FACT_QUESTIONS[lookup.relation].format(subject=subject)}".strip())
        facts.append((subject, lookup.relation, value))
        values[lookup.var] = value
    known = " ".join(fact_sentence(*fact) for fact in facts)
    output = program_output(messages)
    if output is None:
        return python_turn(multi_hop_program(template, values, facts), f"{known} Now I compute the answer.")
    return _answer_from(output, known)


def _compute_turn(template: Template, slots: dict[str, Any], messages: Sequence[dict]) -> str:
    output = program_output(messages)
    if output is None:
        return python_turn(PROGRAMS[template.name].format(**slots),
                           "This needs exact computation, so I write a program.")
    return _answer_from(output, "")


def _answer_from(output: str, known: str) -> str:
    value = printed_value(output)
    if value is None:
        return answer_turn(UNKNOWN, f"{known} The program did not give a result.".strip())
    return answer_turn(value, f"{known} The program printed {value}.".strip())


def next_turn(messages: Sequence[dict]) -> str:
    """The expert's next assistant turn for an episode's messages so far."""
    matched = match_question(question_of(messages))
    if matched is None:
        return answer_turn(UNKNOWN, "The question is not one I know how to solve.")
    template, slots = matched
    if template.kind == "compute":
        return _compute_turn(template, slots, messages)
    return _multi_hop_turn(template, slots, messages)


class ToolStarExpertPolicy(TurnPolicy):
    """Policy interface: the expert's next turn for every active episode (text only, no tokens)."""

    def generate(self, requests: Sequence[Any]) -> list[ExpertTurn]:
        return [ExpertTurn(text=next_turn(request.messages)) for request in requests]
