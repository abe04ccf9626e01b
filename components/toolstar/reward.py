"""Tool-Star's hierarchical reward, as pure functions of the response text and the golden answer(s).

Tool-Star's released RL code (`Tool_Star_RL/src/verl/verl/utils/reward_score/re_search.py`, `compute_score`; its
mixed training data has the data source `grpo_mix`, which `_default_compute_score` sends to that function, math
questions included) scores one response, the assistant's text with the tool results in it, as:

1. **format**: `validate_format` (here `format_problem`) fails, or no `\\boxed{}` answer can be extracted -> **-1**.
2. **correctness**: otherwise the token F1 of the boxed answer against the golden answers (SQuAD normalisation:
   lower case, punctuation and articles removed; the best golden answer counts; a yes/no/noanswer mismatch is 0).
   F1 = 0 -> **0**.
3. **multi-tool bonus**: F1 > 0 and the response contains both `</search>` and `</python>` -> **F1 + 0.1**;
   F1 > 0 otherwise -> **F1**.

So a correct answer found with both tools scores 1.1, with one tool or none 1.0, a wrong but well-formed one 0, a
malformed one -1. (Tool-Star's `re_search_math.py` holds another scheme, 1 / 0.1 / 0 with `math_verify`, for the
data source `grpo_math`, which its released data does not use.)

The format check (`format_problem`, Tool-Star's `validate_format`): `<think>` and `</think>` occur equally often and
at least once; exactly one `<answer>` and one `</answer>`, in that order; every `<search>` is followed by its
`</search>` and then a `<result>…</result>`, every `<python>` likewise; the answer holds a `\\boxed{…}` (here: a
complete one, which Tool-Star's answer extraction then requires too, else -1).

Where this differs, each a choice the caller makes:

- `metric`: "f1" is Tool-Star's; "em" is exact match after the same normalisation; "numeric" compares numbers
  exactly (`1,234` = `1234` = `1234.0`, `\\frac{3}{4}` = `0.75`; F1 would strip a minus sign and a decimal point
  as punctuation), falling back to normalised string equality; "auto" (the default) is "numeric" when every golden
  answer is a number, else "f1". Every generated task has an integer answer, so "auto" grades them numerically.
- `metric` "math": math_verify (`math_verify.parse` / `verify`, Hugging Face's checker, what Tool-Star's
  `re_search_math.py` uses) decides whether the boxed answer and a golden answer are the same mathematical object
  (`\\frac{1}{2}` = `0.5`, `\\sqrt{2}/2` = `\\frac{\\sqrt{2}}{2}`, `x=3` = `3`); where it cannot read one of the
  two as maths, normalised string equality decides. math_verify (and sympy under it) is imported on the first
  "math" score only, so this module stays free of heavy imports.
- the task's kind (`task_metric`): with "auto", a dataset's `math` task is scored by "math" and a `qa` task by
  "f1" (Tool-Star's, also for a number answer such as a year); the generated kinds keep "auto".
- `calls`: the bonus is decided by the tools the environment actually ran (the episode's `stats["tool_calls"]`, or
  the trajectory record's tool turns), so a call refused at the tool-call limit earns nothing; without `calls` it
  is Tool-Star's text test.

The response: in Tool-Star the results sit inside the assistant's response; here they come back as user messages
(see `env.py`), so `response_text(messages)` joins the assistant turns and the `<result>` blocks after the question,
in order, into the text Tool-Star would score. A call refused at the tool-call limit gets no `<result>`, so such a
response fails the format check (-1), as in Tool-Star, where that call ends the response without an answer.
"""
from __future__ import annotations

import re
import signal
import string
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from components.toolstar.protocol import last_boxed

Metric = Literal["auto", "f1", "em", "numeric", "math"]
FORMAT_PENALTY = -1.0
MULTI_TOOL_BONUS = 0.1
BONUS_TOOLS = frozenset({"search", "python"})


@dataclass(frozen=True)
class RewardBreakdown:
    """One response's reward and its parts."""

    reward: float
    format_ok: bool
    format_error: str | None  # what broke the format (None when it is valid)
    answer: str | None  # the boxed answer (None on a format error)
    score: float  # the answer's correctness in [0, 1] (0 on a format error)
    bonus: float  # the multi-tool bonus added (0 or MULTI_TOOL_BONUS)

    def to_dict(self) -> dict:
        return {"reward": self.reward, "format_ok": self.format_ok, "format_error": self.format_error,
                "answer": self.answer, "score": self.score, "bonus": self.bonus}


# ---- format -----------------------------------------------------------------------------------------------------

def _call_order_problem(text: str, tool: str) -> str | None:
    """Whether every `<tool>` is followed by `</tool>`, then `<result>`, then `</result>` (Tool-Star's scan)."""
    position = 0
    while True:
        start = text.find(f"<{tool}>", position)
        if start == -1:
            return None
        end = text.find(f"</{tool}>", start)
        result = text.find("<result>", start)
        result_end = text.find("</result>", result) if result != -1 else -1
        if -1 in (end, result, result_end):
            return f"{tool}/result tags are incomplete"
        if not start < end < result < result_end:
            return f"{tool}/result tags are nested in the wrong order"
        position = result_end


def format_problem(response: str) -> str | None:
    """Why `response` fails Tool-Star's format check, or None when it passes (the module docstring has the rules)."""
    if not isinstance(response, str):
        return f"the response is not text ({type(response).__name__})"
    if response.count("<think>") != response.count("</think>"):
        return "<think> </think> not paired"
    if response.count("<think>") == 0:
        return "<think> or </think> not found"
    if response.count("<answer>") != 1 or response.count("</answer>") != 1:
        return "<answer> or </answer> not found (exactly one of each is needed)"
    for tool in ("search", "python"):
        problem = _call_order_problem(response, tool)
        if problem:
            return problem
    start, end = response.find("<answer>"), response.find("</answer>")
    if start > end:
        return "<answer> must be before </answer>"
    if last_boxed(response[start + len("<answer>"):end]) is None:
        return "the answer is missing a complete \\boxed{} (the exact answer goes inside it)"
    return None


def extract_answer(response: str) -> str | None:
    """The content of the last `\\boxed{}` in the (first) `<answer>…</answer>` of `response`, or None."""
    match = re.search(r"<answer>(.*?)</answer>", response, re.DOTALL) if isinstance(response, str) else None
    return last_boxed(match.group(1)) if match else None


# ---- correctness ------------------------------------------------------------------------------------------------

def normalize_answer(text: str) -> str:
    """SQuAD normalisation (Tool-Star's): lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in str(text).lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1_score(prediction: str, golden: Sequence[str]) -> float:
    """Tool-Star's token F1: the best over the golden answers; yes/no/noanswer must match exactly."""
    best = 0.0
    predicted = normalize_answer(prediction)
    for gold in golden:
        expected = normalize_answer(gold)
        if predicted != expected and (predicted in ("yes", "no", "noanswer") or expected in ("yes", "no", "noanswer")):
            continue
        common = Counter(predicted.split()) & Counter(expected.split())
        same = sum(common.values())
        if same == 0:
            continue
        precision, recall = same / len(predicted.split()), same / len(expected.split())
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


_LATEX_NOISE = re.compile(r"\\[,!;: ]|\\left|\\right|\$|\\\(|\\\)|\\\[|\\\]")
_TEXT = re.compile(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)$")
_THOUSANDS = re.compile(r"^([+-]?\d{1,3})((?:,\d{3})+)(\.\d+)?$")


def parse_number(text: Any) -> Fraction | None:
    """The exact number `text` writes (an integer, a decimal, `a/b`, `\\frac{a}{b}`, with thousands commas, LaTeX
    spacing or a unit in `\\text{}` after it), or None."""
    if not isinstance(text, str):
        return None
    text = _LATEX_NOISE.sub("", text)
    number = _plain_number(_TEXT.sub(r"\1", text))
    return number if number is not None or not _TEXT.search(text) else _plain_number(_TEXT.sub("", text))


def _plain_number(text: str) -> Fraction | None:
    text = text.replace("{,}", ",").replace(" ", "").rstrip(".")
    thousands = _THOUSANDS.match(text)
    if thousands:
        text = thousands.group(1) + thousands.group(2).replace(",", "") + (thousands.group(3) or "")
    frac = _FRAC.match(text)
    try:
        if frac:
            value = Fraction(int(frac.group(2)), int(frac.group(3)))
            return -value if frac.group(1) else value
        if "/" in text:
            numerator, _, denominator = text.partition("/")
            if _DECIMAL.match(numerator) and _DECIMAL.match(denominator):
                return Fraction(numerator) / Fraction(denominator)
            return None
        return Fraction(text) if _DECIMAL.match(text) else None
    except (ValueError, ZeroDivisionError):
        return None


def numeric_score(prediction: str, golden: Sequence[str]) -> float:
    """1.0 when the prediction is the same number as a golden answer (or, for a non-number, the same text after
    normalisation and without spaces), else 0.0."""
    number = parse_number(prediction)
    for gold in golden:
        expected = parse_number(gold)
        if number is not None and expected is not None:
            if number == expected:
                return 1.0
        elif normalize_answer(prediction).replace(" ", "") == normalize_answer(gold).replace(" ", ""):
            return 1.0
    return 0.0


MATH_VERIFY_TIMEOUT_S = 5  # math_verify's own limit per parse and per comparison (signal.alarm: main thread only)


def _math_parse(text: str) -> list:
    """math_verify's reading of a bare answer: as LaTeX (wrapped in `$…$`, as its extraction expects), else as a
    plain expression; [] when it reads neither."""
    from math_verify import parse

    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    for form in (f"${text}$", text):
        parsed = parse(form, parsing_timeout=timeout)
        if parsed:
            return parsed
    return []


def _keeping_outer_timer(function):
    """Run `function()` so that an interval timer (SIGALRM) already running, such as pytest-timeout's, survives
    math_verify's `signal.alarm` (which cancels it): the timer is set again with its remaining time."""
    if threading.current_thread() is not threading.main_thread():
        return function()
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    try:
        return function()
    finally:
        if remaining > 0:
            signal.setitimer(signal.ITIMER_REAL, max(remaining - (time.monotonic() - started), 0.001), interval)


def math_score(prediction: str, golden: Sequence[str]) -> float:
    """1.0 when math_verify finds the prediction equal to a golden answer (or, where it cannot read one of the two
    as maths, they are the same text after normalisation and without spaces), else 0.0."""
    try:
        from math_verify import verify
    except ImportError as exc:  # a dependency of the project; a broken install should say what to do
        raise ImportError("scoring math answers needs math-verify: pip install 'math-verify==0.9.0'") from exc

    def score() -> float:
        predicted = _math_parse(prediction)
        timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
        for gold in golden:
            expected = _math_parse(gold)
            if predicted and expected:
                if verify(expected, predicted, timeout_seconds=timeout):
                    return 1.0
            elif normalize_answer(prediction).replace(" ", "") == normalize_answer(gold).replace(" ", ""):
                return 1.0
        return 0.0

    return _keeping_outer_timer(score)


def task_metric(kind: str, metric: Metric = "auto") -> Metric:
    """The metric a task of `kind` is scored by: with "auto", "math" for a dataset's math task and "f1" for a
    dataset's QA task; otherwise `metric` itself (a generated task's "auto" stays "auto")."""
    if metric != "auto":
        return metric
    return {"math": "math", "qa": "f1"}.get(kind, "auto")


def answer_score(prediction: str | None, golden: str | Sequence[str], metric: Metric = "auto") -> float:
    """The correctness of `prediction` in [0, 1] by `metric` (see the module docstring); 0 without a prediction."""
    golden = [golden] if isinstance(golden, str) else list(golden)
    if prediction is None or not golden:
        return 0.0
    if metric == "auto":
        metric = "numeric" if all(parse_number(gold) is not None for gold in golden) else "f1"
    if metric == "f1":
        return f1_score(prediction, golden)
    if metric == "em":
        return float(any(normalize_answer(prediction) == normalize_answer(gold) for gold in golden))
    if metric == "numeric":
        return numeric_score(prediction, golden)
    if metric == "math":
        return math_score(prediction, golden)
    raise ValueError(f"unknown metric {metric!r}: one of auto, f1, em, numeric, math")


# ---- the reward -------------------------------------------------------------------------------------------------

def tools_in_text(response: str) -> set[str]:
    """The tools a response called, by Tool-Star's test: `</search>` / `</python>` appear in it."""
    return {tool for tool in BONUS_TOOLS if f"</{tool}>" in response}


def tool_star_reward(response: str, golden: str | Sequence[str], calls: Mapping[str, int] | None = None,
                     metric: Metric = "auto") -> RewardBreakdown:
    """Tool-Star's hierarchical reward of one response: -1 for a format error, else the answer's score, plus
    MULTI_TOOL_BONUS when the score is positive and both tools were used (`calls`: tool -> calls run; None: the
    text test)."""
    problem = format_problem(response)
    if problem is not None:
        return RewardBreakdown(FORMAT_PENALTY, False, problem, None, 0.0, 0.0)
    answer = extract_answer(response)
    score = answer_score(answer, golden, metric)
    used = tools_in_text(response) if calls is None else {tool for tool, n in calls.items() if n > 0}
    bonus = MULTI_TOOL_BONUS if score > 0 and BONUS_TOOLS <= used else 0.0
    return RewardBreakdown(score + bonus, True, None, answer, score, bonus)


def response_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """The Tool-Star response of an episode: after the question, the assistant turns and the tool results (the
    user messages that are `<result>` blocks) in order, joined by newlines. The environment's own messages (format
    errors, the tool-call limit) are not part of a Tool-Star response and are left out."""
    messages = list(messages)
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if first_user is None:
        return ""
    parts = []
    for message in messages[first_user + 1:]:
        content = str(message.get("content", ""))
        if message.get("role") == "assistant" or content.lstrip().startswith("<result>"):
            parts.append(content)
    return "\n".join(parts)


def calls_from_turns(turns: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Tool calls run per tool, from a trajectory record's `turns` (kind "tool"; a refused call has kind
    "tool_limit" and does not count)."""
    counts: dict[str, int] = {}
    for turn in turns:
        if turn.get("kind") == "tool" and turn.get("tool"):
            counts[turn["tool"]] = counts.get(turn["tool"], 0) + 1
    return counts


def trajectory_reward(record: Mapping[str, Any], golden: str | Sequence[str],
                      metric: Metric = "auto") -> RewardBreakdown:
    """The reward of a finished trajectory record of the agent loop (its `messages` and `turns`)."""
    return tool_star_reward(response_text(record.get("messages") or []), golden,
                            calls=calls_from_turns(record.get("turns") or []), metric=metric)
