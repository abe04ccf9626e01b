"""The Tool-Star episode: turns as a model writes them, answered with `<result>` user messages, ended by a boxed
answer or by calling past the tool limit, with the episode's counts in `info["stats"]`.

A small in-test retriever and sandbox stand in for BM25 and bubblewrap here; test_expert.py runs the real ones."""
from __future__ import annotations

import pytest

from components.toolstar.env import Step, ToolStarEnv, question_of, system_prompt
from components.toolstar.protocol import NO_OUTPUT
from components.toolstar.sandbox import SandboxResult
from components.toolstar.tasks import Task

TASK = Task(id="t-1", question="How many years passed between the founding of Dunmere and the establishment of "
                               "Velmora Press?", answer="412", kind="multi_hop_arithmetic")
PASSAGES = [{"id": "0", "title": "Dunmere", "text": "Dunmere was founded in the year 1402."},
            {"id": "1", "title": "Velmora Press", "text": "Velmora Press was established in the year 1814."}]


class TinyRetriever:
    """The passages whose title is in the query."""

    def __init__(self):
        self.queries = []

    def search(self, query):
        self.queries.append(query)
        return [p for p in PASSAGES if p["title"] in query]


class ScriptedSandbox:
    """Answers each program with the next result of a script (print(412) by default)."""

    def __init__(self, *results):
        self.results = list(results)
        self.programs = []

    def run(self, code):
        self.programs.append(code)
        return self.results.pop(0) if self.results else _result("412\n")


def _result(stdout="", stderr="", exit_code=0, error=None, limit=None, signal=None):
    return SandboxResult(stdout=stdout, stderr=stderr, exit_code=exit_code, signal=signal, limit=limit,
                         truncated=False, seconds=0.1, isolation="bubblewrap", error=error)


def _env(*results, max_tool_calls=3):
    return ToolStarEnv(TASK, TinyRetriever(), ScriptedSandbox(*results), max_tool_calls=max_tool_calls)


def test_reset_gives_the_instructions_and_the_question():
    env = _env()
    messages = env.reset()
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == TASK.question
    system = messages[0]["content"]
    assert system == system_prompt(3)
    for text in ("<search>", "<python>", "<result>", "<answer>", "\\boxed{", "at most 3 times"):
        assert text in system


def test_a_whole_episode_search_search_python_answer():
    env = _env()
    env.reset()
    step = env.step("<think> When was Dunmere founded? </think>\n<search> Dunmere founded </search>")
    assert step == Step("<result>\nDunmere\nDunmere was founded in the year 1402.\n</result>", False, step.info)
    assert step.info["kind"] == "tool" and step.info["tool"] == "search"
    assert step.info["arguments"] == {"query": "Dunmere founded"} and not step.info["tool_error"]

    env.step("<think> And Velmora Press? </think>\n<search> Velmora Press </search>")
    step = env.step("<think> Compute. </think>\n<python>\nprint(abs(1402 - 1814))\n</python>")
    assert step.observation == "<result>\n412\n</result>"
    assert step.info["tool"] == "python" and step.info["sandbox"]["exit_code"] == 0
    assert env.sandbox.programs == ["print(abs(1402 - 1814))"]

    step = env.step("<think> It printed 412. </think>\n<answer> The final answer is \\[ \\boxed{412} \\] </answer>")
    assert step.done and step.observation is None
    assert step.info["kind"] == "answer" and step.info["termination"] == "answer"
    assert step.info["answer"] == "412" and step.info["answer_text"] == "The final answer is \\[ \\boxed{412} \\]"
    assert step.info["stats"] == {"tool_calls": {"search": 2, "python": 1}, "tools_used": ["python", "search"],
                                  "code_errors": 0, "sandbox_kills": 0, "format_errors": 0, "refused_calls": 0,
                                  "ignored_tails": 0}
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("<answer> \\boxed{1} </answer>")


def test_an_answer_without_a_box_ends_the_episode_with_no_answer():
    step = _env().step("<think> done </think><answer> 412 </answer>")
    assert step.done and step.info["answer"] is None and step.info["answer_text"] == "412"


def test_failed_and_killed_programs_are_counted():
    env = _env(_result("", "Traceback (most recent call last):\nZeroDivisionError: division by zero\n", 1,
                       "the program exited with status 1"),
               _result("", "", None, "the program was stopped after the 10 s time limit", limit="wall", signal=9),
               _result(""))
    failed = env.step("<python>print(1 / 0)</python>")
    assert "ZeroDivisionError: division by zero" in failed.observation and failed.info["tool_error"]
    killed = env.step("<python>while True: pass</python>")
    assert killed.observation.endswith("Error: the program was stopped after the 10 s time limit.\n</result>")
    assert killed.info["sandbox"]["killed"] and killed.info["sandbox"]["limit"] == "wall"
    silent = env.step("<python>x = 1</python>")
    assert silent.observation == f"<result>\n{NO_OUTPUT}\n</result>" and not silent.info["tool_error"]
    stats = silent.info["stats"]
    assert (stats["tool_calls"]["python"], stats["code_errors"], stats["sandbox_kills"]) == (3, 2, 1)


def test_a_malformed_turn_is_told_the_format_and_counted():
    env = _env()
    step = env.step("I think the answer is 412.")
    assert not step.done
    # the environment's own message, not a tool result: plain text, its format hint with the real tags
    assert step.observation.startswith("Error: The turn has no tool call and no <answer>. Call a tool with "
                                       "<search> query </search> or <python> code </python>")
    assert step.info["kind"] == "protocol_error" and step.info["error"] == "The turn has no tool call and no <answer>."
    assert step.info["stats"]["format_errors"] == 1 and step.info["stats"]["tool_calls"] == {"search": 0, "python": 0}


def test_text_after_a_call_is_ignored_and_counted():
    env = _env()
    step = env.step("<search> Dunmere </search><python>print(2)</python>")
    assert step.info["tool"] == "search" and env.sandbox.programs == []
    assert step.info["stats"]["ignored_tails"] == 1


def test_a_call_over_the_limit_is_refused_once_then_ends_the_episode():
    env = _env(max_tool_calls=2)
    env.step("<search> Dunmere </search>")
    env.step("<python>print(1)</python>")
    refused = env.step("<python>print(2)</python>")
    assert not refused.done and refused.info["kind"] == "tool_limit"
    assert refused.observation.startswith("Error: the limit of 2 tool calls is reached, so this call was not run.")
    assert env.sandbox.programs == ["print(1)"]  # the refused program never ran
    ended = env.step("<search> Velmora Press </search>")
    assert ended.done and ended.observation is None
    assert ended.info["termination"] == "tool_limit" and ended.info["answer"] is None
    assert ended.info["stats"]["refused_calls"] == 2 and ended.info["stats"]["tool_calls"] == {"search": 1,
                                                                                              "python": 1}
    assert env.retriever.queries == ["Dunmere"]


def test_after_the_refusal_an_answer_still_counts():
    env = _env(max_tool_calls=0)
    assert env.step("<search> Dunmere </search>").info["kind"] == "tool_limit"
    step = env.step("<think> I know it. </think><answer> \\boxed{412} </answer>")
    assert step.done and step.info["answer"] == "412" and step.info["stats"]["tools_used"] == []


def test_reset_starts_a_fresh_episode():
    env = _env()
    env.step("<search> Dunmere </search>")
    env.step("<answer> \\boxed{1} </answer>")
    env.reset()
    step = env.step("<search> Dunmere </search>")
    assert step.info["stats"]["tool_calls"] == {"search": 1, "python": 0}


def test_the_question_comes_from_a_task_a_record_or_text():
    assert question_of(TASK) == TASK.question
    assert question_of({"question": "Why?"}) == "Why?" and question_of("Why?") == "Why?"
    with pytest.raises(ValueError, match="no question text"):
        ToolStarEnv({"q": 1}, TinyRetriever(), ScriptedSandbox())
