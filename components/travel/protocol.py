"""The travel episode's prompt: TravelPlanner's role, rules and plan format around the tool-call protocol.

The turn grammar, its parser and the tool-result message are the agent layer's (`components/agent/tool_calls.py`);
with the travel tools `system_prompt` fills in the travel role, rules and plan format (with an example plan in the
"full" style).
"""
from __future__ import annotations

import json

from components.agent import tool_calls
from components.agent.tool_calls import (  # noqa: F401  (the travel episode's turn grammar, used as protocol.*)
    PROMPT_STYLES,
    TURN_FORMAT,
    Answer,
    ProtocolError,
    ToolCall,
    neutralise,
    parse_turn,
    tool_response,
)
from components.travel.tools import TOOL_NAMES

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
COMPACT_TRAVEL_ROLE = "Plan the trip with the tools, then answer with the plan."
COMPACT_TRAVEL_RULES = (
    "Rules: use only tool results (exact names, cities, flight numbers); respect the budget, house rule, room "
    "type, cuisines, transportation and minimum nights; one tool call per turn."
)
COMPACT_PLAN_FORMAT = (
    "Plan: a JSON list, one object per day with days, current_city, transportation, breakfast, attraction, "
    "lunch, dinner, accommodation (\"Name, City\" or \"-\")."
)


def system_prompt(tool_schemas: list[dict], role: str | None = None, rules: str | None = None,
                  answer_format: str | None = None, style: str = "full") -> str:
    """The system message of `tool_calls.system_prompt`; with the travel tools the role, rules and plan format
    default to TravelPlanner's, and the full style shows an example plan."""
    names = {schema.get("function", schema).get("name") for schema in tool_schemas}
    if names & set(TOOL_NAMES):
        compact = style == "compact"
        role = role if role is not None else (COMPACT_TRAVEL_ROLE if compact else TRAVEL_ROLE)
        rules = rules if rules is not None else (COMPACT_TRAVEL_RULES if compact else TRAVEL_RULES)
        if answer_format is None:
            answer_format = COMPACT_PLAN_FORMAT if compact else (
                PLAN_FORMAT + "<answer>" + json.dumps(PLAN_EXAMPLE) + "</answer>")
    return tool_calls.system_prompt(tool_schemas, role=role, rules=rules, answer_format=answer_format, style=style)
