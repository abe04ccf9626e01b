"""The QA episode: the tool-call protocol (`components/agent/tool_calls.py`) with one tool, `search`.

`reset()` gives [system, user(question)]; `step(assistant_text)` runs a `search(query)` call against the retriever
and answers with the top-k passages inside `<tool_response>`, or ends the episode on `<answer>…</answer>`.
"""
from __future__ import annotations

from components.agent import tool_calls as protocol
from components.agent.environment import EpisodeEnded, Step
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
