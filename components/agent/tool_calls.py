"""The tool-call chat protocol every environment that calls tools by name speaks (Qwen chat format, as Agent-STAR).

An assistant turn is exactly one of
    <think>…</think><tool_call>{"name": …, "arguments": {…}}</tool_call>
    <think>…</think><answer>…</answer>
`parse_turn` reads a turn into a `ToolCall`, an `Answer` or a `ProtocolError` whose message tells the model the
required format; it never raises. Tool results go back as a user message built by `tool_response`, with any chat
special-token text neutralised so an observation can never end a message or open a new one. `system_prompt` lays
out an environment's role, rules, tools and answer format around the turn format.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TURN_FORMAT = (
    "<think>your short reasoning</think><tool_call>{\"name\": \"<tool name>\", \"arguments\": {<JSON object>}}"
    "</tool_call>\nor, to finish:\n<think>your short reasoning</think><answer>your final answer</answer>"
)

GENERIC_ROLE = "You are an agent that answers the user's request by calling the tools below when needed."



@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    text: str


@dataclass(frozen=True)
class ProtocolError:
    message: str


PROMPT_STYLES = ("full", "compact")

COMPACT_TURN_FORMAT = (
    "<think>…</think><tool_call>{\"name\": …, \"arguments\": {…}}</tool_call> or "
    "<think>…</think><answer>…</answer>"
)

def tool_signature(schema: dict) -> str:
    """One line per tool: `Name(arg, arg: a|b)` (an enum's values after the argument name)."""
    function = schema.get("function", schema)
    properties = function.get("parameters", {}).get("properties", {})
    args = [f"{name}: {'|'.join(spec['enum'])}" if spec.get("enum") else name
            for name, spec in properties.items()]
    return f"{function.get('name')}({', '.join(args)})"


def system_prompt(tool_schemas: list[dict], role: str | None = None, rules: str | None = None,
                  answer_format: str | None = None, style: str = "full") -> str:
    """The system message: role, rules, the tools, the turn format, the answer format.

    `style="full"` lists the tools as JSON schemas inside `<tools>`; `style="compact"` (the tiny preset, a few
    hundred characters) keeps the rules, one-line tool signatures and the turn and answer formats. Unset parts
    take a generic role and rules.
    """
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style {style!r} is not one of {list(PROMPT_STYLES)}")
    if style == "compact":
        role = role if role is not None else GENERIC_ROLE
        rules = rules if rules is not None else "One tool call per turn."
        answer_format = answer_format if answer_format is not None else "Answer: a short text."
        tools = "\n".join(tool_signature(schema) for schema in tool_schemas)
        return f"{role}\n{rules}\nTools:\n{tools}\nTurn: {COMPACT_TURN_FORMAT}\n{answer_format}"
    role = role if role is not None else GENERIC_ROLE
    rules = rules if rules is not None else "Make exactly one tool call per turn."
    if answer_format is None:
        answer_format = "The final answer is a short text inside <answer></answer>."
    tools = "\n".join(json.dumps(schema) for schema in tool_schemas)
    return (
        f"{role}\n\n{rules}\n\n# Tools\n\n<tools>\n{tools}\n</tools>\n\n"
        f"# Turn format\n\nEach of your turns is exactly one of:\n{TURN_FORMAT}\n"
        f"A tool result comes back as <tool_response>…</tool_response>.\n\n# Answer\n\n{answer_format}"
    )


def _error(problem: str) -> ProtocolError:
    return ProtocolError(f"{problem} Each turn must be exactly one of:\n{TURN_FORMAT}")


_TRAILING_SPECIAL = re.compile(r"(?:\s*(?:<\|im_end\|>|<\|endoftext\|>))+\s*$")


def _strip_think(text: str) -> str | ProtocolError:
    """The part after the reasoning block (the block itself is optional)."""
    if text.startswith("<think>"):
        end = text.find("</think>")
        if end < 0:
            return _error("The <think> block is not closed with </think>.")
        return text[end + len("</think>"):].strip()
    if "</think>" in text.split("<tool_call>")[0].split("<answer>")[0]:
        # the opening <think> may be part of the prompt (some chat templates add it)
        return text.split("</think>", 1)[1].strip()
    return text


def _parse_call(body: str) -> ToolCall | ProtocolError:
    try:
        call = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        return _error(f"The tool call is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc}).")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"].strip():
        return _error('The tool call must be a JSON object with a string "name" and an "arguments" object.')
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return _error(f'The "arguments" of {call["name"]} must be a JSON object, like {{"city": "Dallas"}}.')
    extra = set(call) - {"name", "arguments"}
    if extra:
        return _error(f"The tool call has unexpected keys {sorted(extra)}; put every argument inside \"arguments\".")
    return ToolCall(call["name"].strip(), arguments)


def parse_turn(text: Any) -> ToolCall | Answer | ProtocolError:
    """Read one assistant turn. Never raises."""
    try:
        return _parse_turn(text)
    except Exception as exc:  # defensive: a malformed turn must never crash an episode
        return _error(f"The turn could not be read ({type(exc).__name__}).")


def _parse_turn(text: Any) -> ToolCall | Answer | ProtocolError:
    if not isinstance(text, str) or not text.strip():
        return _error("The turn is empty.")
    rest = _strip_think(_TRAILING_SPECIAL.sub("", text.strip()))
    if isinstance(rest, ProtocolError):
        return rest
    if rest.startswith("<answer>"):
        if not rest.endswith("</answer>"):
            return _error("The answer must end with </answer> and nothing may follow it.")
        body = rest[len("<answer>"): -len("</answer>")]
        if "<answer>" in body or "</answer>" in body or "<tool_call>" in body:
            return _error("Give one answer and nothing else in the turn.")
        return Answer(body.strip())
    if rest.startswith("<tool_call>"):
        if not rest.endswith("</tool_call>"):
            return _error("The tool call must end with </tool_call> and nothing may follow it.")
        body = rest[len("<tool_call>"): -len("</tool_call>")]
        if "<tool_call>" in body or "</tool_call>" in body:
            return _error("Only one tool call per turn is allowed; wait for its result before the next call.")
        return _parse_call(body.strip())
    if not rest:
        return _error("The turn has reasoning but no <tool_call> or <answer>.")
    return _error("After </think> the turn must continue with <tool_call> or <answer>.")


_SPECIAL_TOKEN = re.compile(r"<\|([^<>|\s]{1,40})\|>")
_RESPONSE_TAG = re.compile(r"<(/?)tool_response>", re.IGNORECASE)


def neutralise(text: str) -> str:
    """Break chat special-token text (`<|im_end|>` -> `<│im_end│>`) and `<tool_response>` tags inside a text."""
    text = _SPECIAL_TOKEN.sub(lambda m: f"<\u2502{m.group(1)}\u2502>", text)
    return _RESPONSE_TAG.sub(lambda m: f"[{m.group(1)}tool_response]", text)


def tool_response(observation: str) -> str:
    """The user-role message that carries a tool result."""
    return f"<tool_response>\n{neutralise(str(observation))}\n</tool_response>"
