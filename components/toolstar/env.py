"""The Tool-Star episode: one question, a search tool and a Python interpreter, a boxed answer.

    env = ToolStarEnv(task, retriever, sandbox, max_tool_calls=3)
    messages = env.reset()          # [system (the two tools, the answer format, the limit), user (the question)]
    step = env.step(assistant_text) # Step(observation, done, info)

`step` reads the turn with `protocol.parse_turn` and:

- `<search> q </search>`: the retriever's passages for `q` (`retriever.search(q)`, any object with that method:
  the QA stage's BM25 or HTTP retriever) rendered by `search_observation`;
- `<python> code </python>`: the code run by the sandbox (`sandbox.run(code) -> SandboxResult`), rendered by
  `python_observation` (its stdout, or the end of the traceback and the error);
- `<answer> … \\boxed{x} … </answer>`: the episode ends; `info["answer"]` is `x` (None when the answer has no
  box: Tool-Star's reward scores that as a format error), `info["answer_text"]` the whole answer;
- a malformed turn: an error message saying what was wrong and what the format is (`error_observation`),
  counted in `format_errors`; the episode goes on (the agent loop's `max_protocol_errors` ends it).

Where results go: every observation is the next **user-role message**, the agent loop's convention (its token
bookkeeping masks user segments out of the loss). A tool's result is `<result>\\n…\\n</result>` (`result_block`, its
text neutralised so that it holds no protocol tag); the environment's own messages (a format error, the tool-call
limit) are plain `Error: …` text, not results, so their format hints keep their real tags. Tool-Star instead
appends the result inside the same assistant response and lets the model go on writing it; here each tool call
ends the assistant turn, and the model's next turn is a new assistant message after the result. Calls and results
come in the same order either way, so `reward.response_text(messages)` rebuilds Tool-Star's response (the
assistant turns and the `<result>` blocks) for its format check. Text a turn holds after its call (which a backend
with the stop strings `</search>`, `</python>` never generates) is ignored and counted in `ignored_tails`.

The tool-call limit (`max_tool_calls`; Tool-Star's rollout allows 3, searches and programs together): the first call
over it is not run, and a message says the limit is reached and asks for the answer. If another call comes all
the same, the episode ends without an answer (`termination` "tool_limit"). Tool-Star ends the response at the first
call over the limit (no answer: reward -1); the one warning here lets a model still answer, which evaluation
(EM, accuracy) counts, while the reward stays Tool-Star's: the refused call has no `<result>`, so the response fails
the format check (-1) all the same.

`info` of every step: `kind` ("tool" | "answer" | "protocol_error" | "tool_limit": the agent loop's turn kinds, plus
the refused call, which the loop counts as neither a tool call nor a protocol error), `tool`, `arguments`,
`tool_error` (True for a program that did not exit cleanly and for a refused call; a search without results is not
an error), and `stats`, the episode's running counts: `tool_calls` ({"search": n, "python": m}, calls actually
run), `tools_used` (sorted names), `code_errors` (programs that did not exit cleanly), `sandbox_kills` (programs
stopped by a limit or a signal; a subset of code_errors), `format_errors`, `refused_calls`, `ignored_tails`. The
last step also has `termination` ("answer" | "tool_limit").
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from components.agent.environment import EpisodeEnded, Step
from components.toolstar.protocol import (
    SYSTEM_PROMPT,
    FinalAnswer,
    FormatError,
    PythonCall,
    SearchCall,
    error_observation,
    parse_turn,
    python_observation,
    result_block,
    search_observation,
)
from components.toolstar.sandbox import SandboxResult

DEFAULT_MAX_TOOL_CALLS = 3  # Tool-Star's rollout: three calls of either tool per response


class Searcher(Protocol):
    """The search tool's backend: passages for a query, best first (strings, or dicts with title/text or
    FlashRAG's contents). The QA stage's `BM25Retriever` and `HTTPRetriever` fit."""

    def search(self, query: str) -> Sequence[Any]: ...


class CodeRunner(Protocol):
    """The python tool's backend: `Sandbox` (components/toolstar/sandbox.py)."""

    def run(self, code: str) -> SandboxResult: ...


def system_prompt(max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS) -> str:
    """The system message: Tool-Star's instructions for the two tools and the answer, and the call limit."""
    return (f"{SYSTEM_PROMPT} You can call the tools at most {max_tool_calls} times in all (searches and programs "
            "together).")


def limit_message(max_tool_calls: int) -> str:
    """What the model is told when it calls a tool over the limit."""
    return (f"Error: the limit of {max_tool_calls} tool calls is reached, so this call was not run. Answer now "
            "with <answer> The final answer is \\boxed{answer} </answer>; another tool call ends the episode "
            "without an answer.")


def new_stats() -> dict:
    """The episode's counts before its first turn."""
    return {"tool_calls": {"search": 0, "python": 0}, "tools_used": [], "code_errors": 0, "sandbox_kills": 0,
            "format_errors": 0, "refused_calls": 0, "ignored_tails": 0}


def was_killed(result: SandboxResult) -> bool:
    """Whether the sandbox stopped the program (a limit: time, CPU, memory, output, processes) or a signal ended it."""
    return result.limit is not None or result.signal is not None


def question_of(task: Any) -> str:
    """The question of a task: a `Task` (or anything with `.question`), a dict with "question", or the text."""
    question = task if isinstance(task, str) else (
        task.get("question") if isinstance(task, dict) else getattr(task, "question", None))
    if not isinstance(question, str) or not question.strip():
        raise ValueError("the task has no question text: pass a Task, a {\"question\": ...} record or a string")
    return question


class ToolStarEnv:
    """One question answered with a search tool and a Python interpreter (Tool-Star's protocol)."""

    def __init__(self, task: Any, retriever: Searcher, sandbox: CodeRunner,
                 max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS, max_result_chars: int = 2000):
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0 (got {max_tool_calls})")
        self.task = task
        self.question = question_of(task)
        self.retriever = retriever
        self.sandbox = sandbox
        self.max_tool_calls = max_tool_calls
        self.max_result_chars = max_result_chars
        self.reset()

    def reset(self) -> list[dict]:
        """Start the episode: [system, user(question)]."""
        self.stats = new_stats()
        self.calls = 0
        self.warned = False
        self.done = False
        return [{"role": "system", "content": system_prompt(self.max_tool_calls)},
                {"role": "user", "content": self.question}]

    def step(self, assistant_text: str) -> Step:
        """Apply one assistant turn (see the module docstring)."""
        if self.done:
            raise EpisodeEnded("the Tool-Star episode")
        action = parse_turn(assistant_text)
        if isinstance(action, FormatError):
            self.stats["format_errors"] += 1
            return self._observe(error_observation(action), {"kind": "protocol_error", "error": action.reason},
                                 result=False)
        if action.tail.strip():
            self.stats["ignored_tails"] += 1
        if isinstance(action, FinalAnswer):
            return self._end({"kind": "answer", "answer": action.boxed, "answer_text": action.text,
                              "termination": "answer"})
        tool, arguments = (("search", {"query": action.query}) if isinstance(action, SearchCall)
                           else ("python", {"code": action.code}))
        if self.calls >= self.max_tool_calls:
            return self._refuse(tool, arguments)
        self.calls += 1
        self.stats["tool_calls"][tool] += 1
        self.stats["tools_used"] = sorted(name for name, n in self.stats["tool_calls"].items() if n)
        if isinstance(action, PythonCall):
            return self._run_python(action.code, arguments)
        return self._search(action.query, arguments)

    def _search(self, query: str, arguments: dict) -> Step:
        passages = self.retriever.search(query)
        observation = search_observation(passages, self.max_result_chars)
        return self._observe(observation, {"kind": "tool", "tool": "search", "arguments": arguments,
                                           "tool_error": False, "num_passages": len(passages)})

    def _run_python(self, code: str, arguments: dict) -> Step:
        result = self.sandbox.run(code)
        killed = was_killed(result)
        self.stats["code_errors"] += int(not result.ok)
        self.stats["sandbox_kills"] += int(killed)
        observation = python_observation(result, self.max_result_chars)
        return self._observe(observation, {
            "kind": "tool", "tool": "python", "arguments": arguments, "tool_error": not result.ok,
            "sandbox": {"exit_code": result.exit_code, "signal": result.signal, "limit": result.limit,
                        "killed": killed, "seconds": result.seconds, "error": result.error}})

    def _refuse(self, tool: str, arguments: dict) -> Step:
        self.stats["refused_calls"] += 1
        info = {"kind": "tool_limit", "tool": tool, "arguments": arguments, "tool_error": True}
        if self.warned:
            return self._end({**info, "answer": None, "termination": "tool_limit"})
        self.warned = True
        return self._observe(limit_message(self.max_tool_calls), info, result=False)

    def _observe(self, observation: str, info: dict, result: bool = True) -> Step:
        """Go on, with `observation` as the next user message: a tool's inside a `<result>` block, the
        environment's own as it is."""
        return Step(result_block(observation) if result else observation, False, {**info, "stats": self._stats()})

    def _end(self, info: dict) -> Step:
        self.done = True
        return Step(None, True, {**info, "stats": self._stats()})

    def _stats(self) -> dict:
        return {**self.stats, "tool_calls": dict(self.stats["tool_calls"]),
                "tools_used": list(self.stats["tools_used"])}
