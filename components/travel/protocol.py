"""The chat protocol between the agent and the sandbox (Qwen chat format, as Agent-STAR).

An assistant turn is exactly one of
    <think>…</think><tool_call>{"name": …, "arguments": {…}}</tool_call>
    <think>…</think><answer>…</answer>
`parse_turn` reads a turn into a `ToolCall`, an `Answer` or a `ProtocolError` whose message tells the model the
required format; it never raises. Tool results go back as a user message built by `tool_response`, with any chat
special-token text neutralised so an observation can never end a message or open a new one.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from components.travel.tools import TOOL_NAMES

TURN_FORMAT = (
    "<think>your short reasoning</think><tool_call>{\"name\": \"<tool name>\", \"arguments\": {<JSON object>}}"
    "</tool_call>\nor, to finish:\n<think>your short reasoning</think><answer>your final answer</answer>"
)

PLAN_EXAMPLE = [
    {"days": 1, "current_city": "from Ithaca to Charlotte",
     "transportation": "Flight Number: F3633413, from Ithaca to Charlotte, Departure Time: 05:38, Arrival Time: 07:46",
     "breakfast": "Nagaland's Kitchen, Charlotte", "attraction": "The Charlotte Museum of History, Charlotte;",
     "lunch": "Cafe Maple Street, Charlotte", "dinner": "Bombay Vada Pav, Charlotte",
     "accommodation": "Affordable Spacious Refurbished Room in Bushwick!, Charlotte"},
    {"days": 2, "current_city": "Charlotte", "transportation": "-",
     "breakfast": "Olive Tree Cafe, Charlotte",
     "attraction": "The Mint Museum, Charlotte;Romare Bearden Park, Charlotte;",
     "lunch": "Birbal Ji Dhaba, Charlotte", "dinner": "Pind Balluchi, Charlotte",
     "accommodation": "Affordable Spacious Refurbished Room in Bushwick!, Charlotte"},
    {"days": 3, "current_city": "from Charlotte to Ithaca",
     "transportation": "Flight Number: F3786167, from Charlotte to Ithaca, Departure Time: 21:42, Arrival Time: 23:26",
     "breakfast": "Subway, Charlotte", "attraction": "Books Monument, Charlotte;",
     "lunch": "Olive Tree Cafe, Charlotte", "dinner": "Kylin Skybar, Charlotte", "accommodation": "-"},
]

TRAVEL_ROLE = (
    "You are a travel planning agent. Plan the trip the user asks for by calling the tools below to gather "
    "information, then give the complete plan."
)
TRAVEL_RULES = (
    "Rules:\n"
    "- Use only facts returned by the tools: every flight, route, restaurant, attraction and accommodation in the "
    "plan must come from a tool result, with its exact name and city.\n"
    "- Respect every constraint of the query: the budget (flights and meals are paid per person, rooms per night), "
    "house rules, room type, cuisines, transportation, and each accommodation's minimum nights.\n"
    "- Give a complete plan: one entry per day, transportation on travel days, meals and attractions, an "
    "accommodation every night but the last; no restaurant or attraction twice; do not mix self-driving with "
    "flights or taxis.\n"
    "- Make exactly one tool call per turn."
)
PLAN_FORMAT = (
    "The final answer is the plan as a JSON list with one object per day, with the keys days, current_city, "
    "transportation, breakfast, attraction, lunch, dinner, accommodation. current_city is \"A\", or \"from A to B\" "
    "on a day you travel; transportation is \"Flight Number: F…, from A to B, Departure Time: hh:mm, Arrival Time: "
    "hh:mm\", \"Self-driving, from A to B, duration: …, distance: …, cost: …\", \"Taxi, from A to B, duration: …, "
    "distance: …, cost: …\" or \"-\"; meals and accommodation are \"Name, City\" or \"-\"; attraction is "
    "\"Name, City;Name, City;\" or \"-\". Example:\n"
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

COMPACT_TRAVEL_ROLE = "Plan the trip with the tools, then answer with the plan."
COMPACT_TRAVEL_RULES = (
    "Rules: use only tool results (exact names, cities, flight numbers); respect the budget, house rule, room "
    "type, cuisines, transportation and minimum nights; one tool call per turn."
)
COMPACT_TURN_FORMAT = (
    "<think>…</think><tool_call>{\"name\": …, \"arguments\": {…}}</tool_call> or "
    "<think>…</think><answer>…</answer>"
)
COMPACT_PLAN_FORMAT = (
    "Plan: a JSON list, one object per day with days, current_city, transportation, breakfast, attraction, "
    "lunch, dinner, accommodation (\"Name, City\" or \"-\")."
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

    With the travel tools the role, rules and plan format default to TravelPlanner's; other tool sets (the QA
    episode) get a generic role unless given one. `style="full"` (real presets) lists the tools as JSON schemas
    inside `<tools>` and shows an example plan; `style="compact"` (the tiny preset, a few hundred characters)
    keeps the rules, one-line tool signatures and the turn and answer formats.
    """
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style {style!r} is not one of {list(PROMPT_STYLES)}")
    names = {schema.get("function", schema).get("name") for schema in tool_schemas}
    travel = bool(names & set(TOOL_NAMES))
    if style == "compact":
        return _compact_prompt(tool_schemas, travel, role, rules, answer_format)
    role = role if role is not None else (TRAVEL_ROLE if travel else GENERIC_ROLE)
    rules = rules if rules is not None else (TRAVEL_RULES if travel else "Make exactly one tool call per turn.")
    if answer_format is None:
        answer_format = (PLAN_FORMAT + "<answer>" + json.dumps(PLAN_EXAMPLE) + "</answer>") if travel else (
            "The final answer is a short text inside <answer></answer>.")
    tools = "\n".join(json.dumps(schema) for schema in tool_schemas)
    return (
        f"{role}\n\n{rules}\n\n# Tools\n\n<tools>\n{tools}\n</tools>\n\n"
        f"# Turn format\n\nEach of your turns is exactly one of:\n{TURN_FORMAT}\n"
        f"A tool result comes back as <tool_response>…</tool_response>.\n\n# Answer\n\n{answer_format}"
    )


def _compact_prompt(tool_schemas: list[dict], travel: bool, role: str | None, rules: str | None,
                    answer_format: str | None) -> str:
    """The short system message of `style="compact"`."""
    role = role if role is not None else (COMPACT_TRAVEL_ROLE if travel else GENERIC_ROLE)
    rules = rules if rules is not None else (COMPACT_TRAVEL_RULES if travel else "One tool call per turn.")
    if answer_format is None:
        answer_format = COMPACT_PLAN_FORMAT if travel else "Answer: a short text."
    tools = "\n".join(tool_signature(schema) for schema in tool_schemas)
    return f"{role}\n{rules}\nTools:\n{tools}\nTurn: {COMPACT_TURN_FORMAT}\n{answer_format}"


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
