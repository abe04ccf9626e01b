"""Tool-Star's turn protocol: read one assistant turn into an action, and render tool results as observations.

The protocol (Tool-Star, arXiv 2505.16410; its rollout and evaluation code): the model reasons in `<think>…</think>`
and, when it needs a tool, writes `<search> query </search>` or `<python> code </python>`. Generation stops at
`</search>` or `</python>` (the rollout's stop strings, `STOP_STRINGS`), the tool runs, and its result is appended as
`<result>\\n…\\n</result>` (`result_block`), after which the model goes on. It finishes with
`<answer> … \\boxed{final answer} … </answer>`; the exact answer is the content of the last `\\boxed{}` inside it.
The python tool shows the program's stdout, or the error when it failed; the search tool shows the passages'
contents separated by blank lines.

`parse_turn(text)` reads a turn the way Tool-Star's stop strings cut it, and never raises:

- the first `</search>` or `</python>` ends the turn: that call is the action, its body is what follows the last
  `<search>` (`<python>`) before it (Tool-Star's rule), and anything after the closing tag is returned as `tail`
  and ignored, since a backend with stop strings would never have generated it. So of two tool calls in one turn
  the first wins; the environment should cut the turn at the call (`text[:len(text) - len(tail)]`).
- the text before the call must be clean: no unclosed `<search>`/`<python>`, no `<answer>` (an answer ends the
  episode, so it cannot come before a call) and no `<result>` (results come only from the tools). Otherwise it is
  a `FormatError`.
- a turn with no tool call is an answer when it holds exactly one `<answer>…</answer>` and no unclosed tool tag;
  `FinalAnswer.boxed` is the last `\\boxed{…}` content or None (Tool-Star's reward counts a missing box as a format
  error; that decision is the reward's).
- anything else (empty turn, missing close tag, empty query or code, stray closing tag) is a `FormatError` whose
  `message` says what was wrong and what the format is.

`<think>` tags are not checked here (Tool-Star checks their pairing over the whole response in its reward). Tags
are matched exactly (lower case). A python block loses a ``` fence around its code and its common indentation. A
consequence of the stop-string rule: neither code nor a query can contain the text `</python>` or `</search>`.

Where this differs from Tool-Star's executor on purpose: a failed program shows the end of its traceback and an
`Error:` line (Tool-Star: the exception message only), a program that printed nothing says so (Tool-Star: "Done"),
and long output keeps its start and end within `max_chars` (Tool-Star: 400 characters).
"""
from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:  # pragma: no cover
    from components.toolstar.sandbox import SandboxResult

TOOLS = ("search", "python")
STOP_STRINGS = ("</search>", "</python>")
TAGS = ("think", "search", "python", "result", "answer")
FORMAT_HINT = ("Call a tool with <search> query </search> or <python> code </python> (the result comes back in "
               "<result> </result>), or finish with <answer> The final answer is \\boxed{answer} </answer>.")
NO_OUTPUT = "(no output: print() the values you need)"

SYSTEM_PROMPT = (
    "You solve the user's question step by step, with the help of a search tool for facts and a Python interpreter "
    "for calculations. Reason inside <think> </think>. To search, write <search> search query </search>; to run "
    "code, write <python> code </python> and print() what you need to see. Each tool's result comes back inside "
    "<result> </result>; then continue. For example: <think> reasoning </think> <search> query </search> <result> "
    "search result </result> <think> reasoning </think> <python> code </python> <result> interpreter output "
    "</result> <think> reasoning </think> <answer> The final answer is \\[ \\boxed{answer here} \\] </answer>. "
    "End with the answer inside <answer> </answer>, the exact final answer inside \\boxed{} in LaTeX."
)


@dataclass(frozen=True)
class SearchCall:
    query: str
    tail: str = ""  # text after </search>, ignored (a backend with stop strings would not have generated it)


@dataclass(frozen=True)
class PythonCall:
    code: str
    tail: str = ""


@dataclass(frozen=True)
class FinalAnswer:
    text: str  # the inside of <answer>…</answer>, stripped
    boxed: str | None  # the content of its last \boxed{…}, or None when it has none
    tail: str = ""

    @property
    def value(self) -> str:
        """The exact answer: the boxed content when there is one, else the whole answer text."""
        return self.boxed if self.boxed is not None else self.text


@dataclass(frozen=True)
class FormatError:
    reason: str

    @property
    def message(self) -> str:
        """What the model is told: the problem, then the format."""
        return f"{self.reason} {FORMAT_HINT}"


Action = Union[SearchCall, PythonCall, FinalAnswer, FormatError]

_TRAILING_SPECIAL = re.compile(r"(?:\s*(?:<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>))+\s*$")
_FENCE = re.compile(r"\A\s*```[ \t]*(?:python3?|py)?[ \t]*\n(?P<code>.*?)\n?[ \t]*```\s*\Z", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r"<(/?)(" + "|".join(TAGS) + r")>", re.IGNORECASE)
_SPECIAL_TOKEN = re.compile(r"<\|([^<>|\s]{1,40})\|>")  # chat control text such as <|im_end|>


def parse_turn(text: Any) -> Action:
    """Read one assistant turn into a SearchCall, PythonCall, FinalAnswer or FormatError. Never raises."""
    try:
        return _parse_turn(text)
    except Exception as exc:  # defensive: a malformed turn must never crash an episode
        return FormatError(f"The turn could not be read ({type(exc).__name__}).")


def _parse_turn(text: Any) -> Action:
    if not isinstance(text, str):
        return FormatError(f"The turn is not text ({type(text).__name__}).")
    if not _TRAILING_SPECIAL.sub("", text).strip():
        return FormatError("The turn is empty.")
    stops = [(text.find(stop), stop) for stop in STOP_STRINGS if stop in text]
    if stops:
        return _tool_call(text, *min(stops))
    return _answer(text)


def _tool_call(text: str, close_at: int, close: str) -> Action:
    tool = close[2:-1]
    opening = f"<{tool}>"
    start = text.rfind(opening, 0, close_at)
    if start < 0:
        return FormatError(f"{close} has no opening {opening}.")
    before, body, tail = text[:start], text[start + len(opening):close_at], text[close_at + len(close):]
    problem = _unclean(before, call=opening)
    if problem:
        return FormatError(problem)
    if tool == "search":
        query = body.strip()
        return SearchCall(query, tail) if query else FormatError("The <search> query is empty.")
    code = unfence(body)
    return PythonCall(code, tail) if code.strip() else FormatError("The <python> block has no code.")


def _answer(text: str) -> Action:
    problem = _unclean(text)
    if problem:
        return FormatError(problem)
    opens, closes = text.count("<answer>"), text.count("</answer>")
    if opens == 0 and closes == 0:
        return FormatError("The turn has no tool call and no <answer>.")
    if opens == 1 and closes == 0:
        return FormatError("The <answer> is not closed with </answer>.")
    if opens != 1 or closes != 1:
        return FormatError(f"The turn must hold exactly one <answer> … </answer> (found {opens} <answer> and "
                           f"{closes} </answer>).")
    start, end = text.find("<answer>"), text.find("</answer>")
    if end < start:
        return FormatError("</answer> comes before <answer>.")
    body = text[start + len("<answer>"):end].strip()
    if not body:
        return FormatError("The answer is empty.")
    return FinalAnswer(body, last_boxed(body), text[end + len("</answer>"):])


def _unclean(text: str, call: str | None = None) -> str | None:
    """Why `text` breaks the protocol, or None. `text` is the part of a turn before its tool call `call` (where an
    opening tool tag is one never closed), or the whole of a turn without a call."""
    where = f"before the {call} call" if call else "in the turn"
    for tool in TOOLS:
        if f"<{tool}>" in text:
            return f"<{tool}> is not closed with </{tool}> {where}." + (" Close each block before the next one."
                                                                          if call else "")
    if "<result>" in text or "</result>" in text:
        return "Do not write <result> yourself: results come from the tools after </search> or </python>."
    if call and ("<answer>" in text or "</answer>" in text):
        return "The answer comes before a tool call; answer only after your last tool call."
    return None


def unfence(body: str) -> str:
    """The code of a <python> block: a ``` fence (```python, ```py) around it removed, common indentation removed,
    blank lines at the ends dropped."""
    match = _FENCE.match(body)
    code = match.group("code") if match else body
    return textwrap.dedent(code).strip("\n").rstrip()


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{…}` (or `\\fbox{…}`) in `text` with balanced braces, or None."""
    if not isinstance(text, str):
        return None
    for command in ("\\boxed{", "\\fbox{"):
        start = text.rfind(command)
        while start >= 0:
            content = _balanced(text, start + len(command))
            if content is not None:
                return content.strip()
            start = text.rfind(command, 0, start)
    return None


def _balanced(text: str, at: int) -> str | None:
    """The text from `at` up to the `}` that closes the brace opened just before `at`, or None if never closed."""
    depth = 1
    for index in range(at, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[at:index]
    return None


def neutralise(text: str) -> str:
    """Make tool output inert: protocol tags become `[tag]` and chat special tokens are broken, so a result can
    never close its <result> block, fake an answer or end the message."""
    text = _TAG.sub(lambda m: f"[{m.group(1)}{m.group(2)}]", str(text))
    return _SPECIAL_TOKEN.sub(lambda m: f"<\u2502{m.group(1)}\u2502>", text)  # <|im_end|> -> <│im_end│>


def result_block(observation: str) -> str:
    """A tool result as the model sees it: `<result>\\n…\\n</result>` (Tool-Star's format)."""
    return f"<result>\n{neutralise(observation)}\n</result>"


def clip(text: str, max_chars: int) -> str:
    """`text` kept within `max_chars` (Tool-Star keeps the start and the end of a long output), saying what was cut."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    half = max(1, max_chars // 2)
    return f"{text[:half]}\n…[{len(text) - 2 * half} characters cut]…\n{text[-half:]}"


def python_observation(result: SandboxResult, max_chars: int = 2000) -> str:
    """What the python tool shows: the program's stdout; when it failed, also the end of its stderr (the
    traceback) and one `Error:` line saying what happened (a limit, a signal, an exit status)."""
    stdout = result.stdout.strip()
    if result.ok:
        return clip(stdout, max_chars) if stdout else NO_OUTPUT
    parts = [clip(stdout, max_chars // 2)] if stdout else []
    stderr_tail = "\n".join(result.stderr.strip().splitlines()[-6:])
    if stderr_tail:
        parts.append(clip(stderr_tail, max_chars // 2))
    parts.append(f"Error: {result.error}.")
    return "\n".join(parts)


def search_observation(passages: Sequence[Any], max_chars: int = 0) -> str:
    """What the search tool shows: each passage's text (strings, or dicts with title/text or FlashRAG's contents),
    separated by blank lines; "No results." when there are none."""
    texts = []
    for passage in passages:
        if isinstance(passage, dict):
            if "contents" in passage:
                passage = passage["contents"]
            else:
                passage = "\n".join(str(passage[key]) for key in ("title", "text") if passage.get(key))
        if str(passage).strip():
            texts.append(str(passage).strip())
    return clip("\n\n".join(texts), max_chars) if texts else "No results."


def error_observation(error: FormatError) -> str:
    """What the model is told after a malformed turn."""
    return f"Error: {error.message}"
