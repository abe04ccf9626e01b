"""The lookup episode: the tool-call protocol of the agent layer with one tool, `lookup(name)`."""
from __future__ import annotations

from components.agent import tool_calls
from components.agent.environment import EpisodeEnded, Step
from fourth_env.tasks import question

LOOKUP_TOOL = {"type": "function", "function": {
    "name": "lookup", "description": "The code of a name in the code book.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}


class LookupEnv:
    """One question about the code book `codes` (name -> code)."""

    def __init__(self, task: dict, codes: dict[str, str]):
        self.task, self.codes, self.done = task, codes, False

    def reset(self) -> list[dict]:
        self.done = False
        prompt = tool_calls.system_prompt([LOOKUP_TOOL], answer_format="Answer with the code: <answer>42</answer>.",
                                          style="compact")
        return [{"role": "system", "content": prompt}, {"role": "user", "content": question(self.task)}]

    def step(self, assistant_text: str) -> Step:
        if self.done:
            raise EpisodeEnded("the lookup episode")
        turn = tool_calls.parse_turn(assistant_text)
        if isinstance(turn, tool_calls.Answer):
            self.done = True
            return Step(None, True, {"kind": "answer", "answer": turn.text.strip(), "termination": "answer"})
        if isinstance(turn, tool_calls.ProtocolError):
            return Step(tool_calls.tool_response(f"Error: {turn.message}"), False,
                        {"kind": "protocol_error", "error": turn.message})
        name = str(turn.arguments.get("name", ""))
        found = turn.name == "lookup" and name in self.codes
        text = f"{name}: {self.codes[name]}" if found else f"Error: no code for {name!r}"
        return Step(tool_calls.tool_response(text), False, {"kind": "tool", "tool": turn.name,
                                                            "arguments": turn.arguments, "tool_error": not found})
