"""The QA episodes: the tool-call protocol (`components/agent/tool_calls.py`), in two modes.

`QAEnv` (mode `search`) has one tool, `search`: `reset()` gives [system, user(question)]; `step(assistant_text)`
runs a `search(query)` call against the retriever and answers with the top-k passages inside `<tool_response>`, or
ends the episode on `<answer>…</answer>`.

`InContextQAEnv` (mode `in_context`, for a base model that does not call tools) has no tool: the question's top-k
passages are in the user message and the episode is one turn, whose `<answer>…</answer>` is read as in `QAEnv`.
Worked examples (`IN_CONTEXT_EXAMPLES`) come first as earlier exchanges of the conversation, so that a model that has
never seen the protocol answers with the short span in the answer tags rather than a sentence.
"""
from __future__ import annotations

from components.agent import tool_calls as protocol
from components.agent.environment import EpisodeEnded, Step
from components.answer_match import normalize_answer
from components.retrieval import Retriever, format_passages

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the encyclopedia; returns the top passages for the query.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to look up"}},
            "required": ["query"],
        },
    },
}


QA_ROLE = ("You answer the user's question. You know none of the facts: find them with the search tool, "
           "reading the passages it returns, then answer.")
QA_ANSWER_FORMAT = "The final answer is the shortest exact answer (a name, a place or a year) inside <answer></answer>."
IN_CONTEXT_ROLE = "You answer the user's question from the passages given with it."

# (passage, question, answer) about invented entities, one answer of each kind: a place, a year, a profession. No
# example answer can be an answer of a generated encyclopedia: its names are made of
# `components.syllables.NAME_SYLLABLES`, its years are 800-1999 and its professions are `corpus.PROFESSIONS`.
IN_CONTEXT_EXAMPLES: tuple[tuple[dict, str, str], ...] = (
    ({"title": "Orsi Keldup", "text": "Orsi Keldup was born in Brevik. The profession of Orsi Keldup was baker. "
                                      "Orsi Keldup was a member of Tumsek Press."},
     "Where was Orsi Keldup born?", "Brevik"),
    ({"title": "Tumsek Press", "text": "Tumsek Press has its seat in Ulbik. Tumsek Press was established in the year "
                                       "612. Tumsek Press was founded by Idgu Moss."},
     "In which year was Tumsek Press established?", "612"),
    ({"title": "Idgu Moss", "text": "Idgu Moss was born in Ulbik. The profession of Idgu Moss was glazier. Idgu Moss "
                                    "was a member of Sube Academy."},
     "What was the profession of Idgu Moss?", "glazier"),
)


class QAEnv:
    """One question answered with a search tool."""

    def __init__(self, question: str, retriever: Retriever):
        self.question = question
        self.retriever = retriever
        self.done = False

    def reset(self) -> list[dict]:
        """The opening messages: the protocol's system prompt with the search tool, then the question."""
        self.done = False
        return [{"role": "system", "content": protocol.system_prompt([SEARCH_TOOL], role=QA_ROLE,
                                                                         answer_format=QA_ANSWER_FORMAT)},
                {"role": "user", "content": self.question}]

    def step(self, assistant_text: str) -> Step:
        """Apply one assistant turn."""
        if self.done:
            raise EpisodeEnded("the QA episode")
        turn = protocol.parse_turn(assistant_text)
        if isinstance(turn, protocol.Answer):
            answer = turn.text.strip()
            self.done = True
            return Step(None, True, {"kind": "answer", "answer": answer, "termination": "answer"})
        if isinstance(turn, protocol.ProtocolError):
            return Step(protocol.tool_response(f"Error: {turn.message}"), False,
                    {"kind": "protocol_error", "error": turn.message})
        return self._call_tool(turn)

    def _call_tool(self, call) -> Step:
        info = {"kind": "tool", "tool": call.name, "arguments": call.arguments, "tool_error": True}
        if call.name != "search":
            message = f"Error: unknown tool '{call.name}'. The only tool is search(query)."
            return Step(protocol.tool_response(message), False, info)
        query = call.arguments.get("query") if isinstance(call.arguments, dict) else None
        if not isinstance(query, str) or not query.strip():
            message = 'Error: search needs a non-empty string argument "query".'
            return Step(protocol.tool_response(message), False, info)
        info["tool_error"] = False
        return Step(protocol.tool_response(format_passages(self.retriever.search(query))), False, info)


def in_context_question(question: str, passages: list[dict]) -> str:
    """The user message of an in-context episode: the passages as the search tool shows them, then the question."""
    return f"{format_passages(passages)}\n\nQuestion: {question}"


def in_context_messages(question: str, passages: list[dict], examples: int = len(IN_CONTEXT_EXAMPLES)) -> list[dict]:
    """The opening messages of an in-context episode: the system prompt, the first `examples` worked examples as
    earlier exchanges, then the passages and the question."""
    if not 0 <= examples <= len(IN_CONTEXT_EXAMPLES):
        raise ValueError(f"examples must be between 0 and {len(IN_CONTEXT_EXAMPLES)}, got {examples}")
    messages = [{"role": "system", "content": f"{IN_CONTEXT_ROLE}\n{QA_ANSWER_FORMAT}"}]
    for passage, example_question, example_answer in IN_CONTEXT_EXAMPLES[:examples]:
        messages += [{"role": "user", "content": in_context_question(example_question, [passage])},
                     {"role": "assistant", "content": f"<answer>{example_answer}</answer>"}]
    return messages + [{"role": "user", "content": in_context_question(question, passages)}]


class InContextQAEnv:
    """One question answered from the passages placed in the conversation: a one-turn episode, no tools."""

    def __init__(self, question: str, passages: list[dict], examples: int = len(IN_CONTEXT_EXAMPLES)):
        self.question = question
        self.passages = passages
        self.examples = examples
        self.done = False

    def reset(self) -> list[dict]:
        """The system prompt, the worked examples, then the passages and the question."""
        self.done = False
        return in_context_messages(self.question, self.passages, self.examples)

    def step(self, assistant_text: str) -> Step:
        """The one turn: its answer, or no answer (a protocol error) when it is not `<answer>…</answer>`."""
        if self.done:
            raise EpisodeEnded("the in-context QA episode")
        self.done = True
        turn = protocol.parse_turn(assistant_text)
        if isinstance(turn, protocol.Answer):
            return Step(None, True, {"kind": "answer", "answer": turn.text.strip(), "termination": "answer"})
        error = turn.message if isinstance(turn, protocol.ProtocolError) else (
            "There are no tools here: the answer is in the passages, inside <answer></answer>.")
        return Step(None, True, {"kind": "protocol_error", "error": error, "termination": "protocol_errors"})


def answer_in_passages(passages: list[dict], golden_answers: list[str]) -> bool:
    """Whether some golden answer appears, as whole words after the EM normalisation, in a passage's title or text:
    the ceiling of in-context reading (a bridge question's answer is in a passage the question does not retrieve)."""
    texts = [f" {normalize_answer(p['title'] + ' ' + p['text'])} " for p in passages]
    answers = [normalize_answer(gold) for gold in golden_answers]
    return any(f" {answer} " in text for answer in answers if answer for text in texts)

