"""The programmatic QA expert: a text policy that searches, reads the returned passages, and answers.

It parses the question with the encyclopedia's question templates into a chain of (relation) hops, then for each
hop searches with the hop's sub-question and reads the fact out of the `<tool_response>` passages (never out of
the corpus): a bridge question therefore takes two searches. Its `<think>` restates every fact it read, so a model
trained on its trajectories practises copying answers out of observations. A question that matches no template
gets one search with the question itself, answered with the top passage's title (a retrieve-and-read baseline).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from components.agent.types import TurnPolicy, TurnRequest, TurnResult
from components.qa.corpus import BRIDGES, RELATIONS

_SUBJECT = "(?P<subject>.+?)"
_DOC_TITLE = re.compile(r"^Doc 1\(Title: (?P<title>[^)]*)\)", re.MULTILINE)


@dataclass(frozen=True)
class QuestionPlan:
    """The first subject and the relations to follow from it (one for single-hop, two for a bridge)."""

    subject: str
    relations: tuple[str, ...]


def _template_regex(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(re.escape("{subject}"), _SUBJECT) + "$")


# Bridge templates first: "Where was the founder of X born?" also matches the single-hop "Where was {subject} born?".
_QUESTION_PATTERNS: list[tuple[re.Pattern, tuple[str, ...]]] = (
    [(_template_regex(template), (first, second)) for first, second, template in BRIDGES]
    + [(_template_regex(rel.question), (rel.name,)) for rel in RELATIONS.values()]
)


def plan_question(question: str) -> QuestionPlan | None:
    """Decompose a generated question into hops; None for a question of another kind."""
    question = question.strip()
    for pattern, relations in _QUESTION_PATTERNS:
        match = pattern.match(question)
        if match:
            return QuestionPlan(match.group("subject"), relations)
    return None


def read_fact(observations: list[str], subject: str, relation: str) -> str | None:
    """The value of `relation` for `subject` as stated in any observation (latest first), or None."""
    sentence = re.escape(RELATIONS[relation].sentence.format(subject=subject, value="\x00"))
    pattern = re.compile(sentence.replace(re.escape("\x00"), r"(?P<value>[^.\n]+?)"))
    for text in reversed(observations):
        match = pattern.search(text)
        if match:
            return match.group("value")
    return None


def tool_call(query: str, think: str) -> str:
    """One assistant turn calling `search`."""
    payload = json.dumps({"name": "search", "arguments": {"query": query}}, ensure_ascii=False)
    return f"<think>{think}</think><tool_call>{payload}</tool_call>"


def answer(text: str, think: str) -> str:
    """One assistant turn giving the final answer, written with a space before it (`<answer> Mirathal</answer>`;
    the episode's answer is stripped, so EM is unchanged). A value follows a space in the passage and in the think
    (` Mirathal` = `ĠMi ra thal`), so the spaced answer copies the same tokens; unspaced, its first token is another
    one (`Mi`), and the tiny base copied the rest of the name after a wrong first syllable (`Lunethal`)."""
    return f"<think>{think}</think><answer> {text}</answer>"


def question_of(messages: list[dict]) -> str:
    """The question: the first user message."""
    return next(m["content"] for m in messages if m["role"] == "user")


def observations_of(messages: list[dict]) -> list[str]:
    """Every tool response the episode has seen so far."""
    return [m["content"] for m in messages[2:] if m["role"] in ("user", "tool")]


def searches_made(messages: list[dict]) -> int:
    """How many assistant turns so far (each of the expert's turns before the answer is a search)."""
    return sum(m["role"] == "assistant" for m in messages)


def next_turn(messages: list[dict], max_searches_per_hop: int = 2) -> str:
    """The expert's next assistant turn for an episode's message history."""
    question = question_of(messages)
    observations = observations_of(messages)
    plan = plan_question(question)
    if plan is None:
        return _baseline_turn(question, observations)
    subject, learned = plan.subject, []
    for relation in plan.relations:
        value = read_fact(observations, subject, relation)
        if value is None:
            sub_question = RELATIONS[relation].question.format(subject=subject)
            if searches_made(messages) >= max_searches_per_hop * len(plan.relations):
                return answer("unknown", " ".join(learned) + f" I could not find: {sub_question}".strip())
            query = sub_question if not _searched(messages, sub_question) else subject
            return tool_call(query, " ".join([*learned, f"I need to know: {sub_question}"]))
        learned.append(RELATIONS[relation].sentence.format(subject=subject, value=value))
        subject = value
    return answer(subject, " ".join(learned))


def _searched(messages: list[dict], query: str) -> bool:
    needle = json.dumps(query, ensure_ascii=False)
    return any(m["role"] == "assistant" and needle in m["content"] for m in messages)


def _baseline_turn(question: str, observations: list[str]) -> str:
    if not observations:
        return tool_call(question, "I will search for the question.")
    match = _DOC_TITLE.search(observations[-1])
    guess = match.group("title") if match else "unknown"
    return answer(guess, f"The best matching passage is about {guess}.")


class QAExpertPolicy(TurnPolicy):
    """Policy interface: the expert's next turn for every active episode (text only, no tokens)."""

    def __init__(self, max_searches_per_hop: int = 2):
        self.max_searches_per_hop = max_searches_per_hop

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        return [TurnResult(text=next_turn(r.messages, self.max_searches_per_hop)) for r in requests]
