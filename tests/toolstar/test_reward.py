"""Tool-Star's hierarchical reward, number by number: -1 for a format error, 0 for a wrong answer, the answer's score
for a right one, and 0.1 more when both tools were used."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from components.toolstar.reward import (
    FORMAT_PENALTY,
    MULTI_TOOL_BONUS,
    RewardBreakdown,
    answer_score,
    calls_from_turns,
    extract_answer,
    f1_score,
    format_problem,
    parse_number,
    response_text,
    task_metric,
    tool_star_reward,
    trajectory_reward,
)

SEARCH = ("<think> Look it up. </think>\n<search> Dunmere founded </search>\n"
          "<result>\nDunmere was founded in 1402.\n</result>")
PYTHON = "<think> Compute. </think>\n<python>\nprint(1814 - 1402)\n</python>\n<result>\n412\n</result>"


def answer(value: str) -> str:
    return f"<think> Done. </think>\n<answer> The final answer is \\[ \\boxed{{{value}}} \\] </answer>"


def test_the_constants_are_tool_stars():
    assert (FORMAT_PENALTY, MULTI_TOOL_BONUS) == (-1.0, 0.1)


def test_right_with_both_tools_is_1_1():
    reward = tool_star_reward("\n".join([SEARCH, PYTHON, answer("412")]), "412")
    assert reward == RewardBreakdown(reward=1.1, format_ok=True, format_error=None, answer="412", score=1.0,
                                     bonus=0.1)


def test_right_with_one_tool_or_none_is_1():
    assert tool_star_reward("\n".join([PYTHON, answer("412")]), "412").reward == 1.0
    assert tool_star_reward("\n".join([SEARCH, answer("412")]), "412").reward == 1.0
    assert tool_star_reward(answer("412"), "412").reward == 1.0


def test_wrong_is_0_even_with_both_tools():
    reward = tool_star_reward("\n".join([SEARCH, PYTHON, answer("411")]), "412")
    assert (reward.reward, reward.score, reward.bonus, reward.format_ok) == (0.0, 0.0, 0.0, True)


@pytest.mark.parametrize("response, problem", [
    ("<answer> \\boxed{412} </answer>", "<think> or </think> not found"),
    ("<think> a </think> <think> b <answer> \\boxed{412} </answer>", "<think> </think> not paired"),
    ("<think> a </think> 412", "<answer> or </answer> not found"),
    (answer("412") + answer("412"), "<answer> or </answer> not found"),
    ("<think> a </think> </answer> \\boxed{412} <answer>", "<answer> must be before </answer>"),
    ("<think> a </think> <answer> 412 </answer>", "missing a complete \\boxed{}"),
    ("<think> a </think> <answer> \\boxed{412 </answer>", "missing a complete \\boxed{}"),
    ("<think> a </think> <search> q </search> " + answer("412"), "search/result tags are incomplete"),
    ("<think> a </think> <python> print(1) " + answer("412"), "python/result tags are incomplete"),
    ("<think> a </think> <result> r </result> <python> x </python> " + answer("412"),
     "python/result tags are incomplete"),
    ("<think> a </think> <search> q <result> r </result> </search> " + answer("412"),
     "search/result tags are nested in the wrong order"),
])
def test_a_format_error_is_minus_1_and_says_what(response, problem):
    reward = tool_star_reward(response, "412")
    assert reward.reward == -1.0 and not reward.format_ok and reward.answer is None
    assert problem in reward.format_error
    assert format_problem(response) == reward.format_error


def test_qa_answers_score_token_f1_as_in_tool_star():
    # "river Talor" against "Talor": precision 1/2, recall 1, F1 2/3; with both tools 2/3 + 0.1
    reward = tool_star_reward("\n".join([SEARCH, PYTHON, answer("river Talor")]), ["Talor"])
    assert reward.score == pytest.approx(2 / 3) and reward.reward == pytest.approx(2 / 3 + 0.1)
    assert f1_score("The Talor", ["talor"]) == 1.0  # articles, case and punctuation do not count
    assert f1_score("yes", ["yes it is"]) == 0.0  # yes/no must match exactly
    assert f1_score("Lima", ["Quito", "lima"]) == 1.0  # the best golden answer counts


def test_the_metric_is_a_choice():
    assert answer_score("-5", "5", metric="f1") == 1.0  # F1 strips the minus sign as punctuation
    assert answer_score("-5", "5") == 0.0  # auto: a numeric golden answer is compared as a number
    assert answer_score("Talor river", "Talor", metric="em") == 0.0
    assert answer_score("the Talor", "Talor", metric="em") == 1.0
    assert answer_score(None, "5") == 0.0
    with pytest.raises(ValueError, match="unknown metric.*math"):
        answer_score("5", "5", metric="bleu")


@pytest.mark.parametrize("text, value", [
    ("412", Fraction(412)), ("-7", Fraction(-7)), ("1,234", Fraction(1234)), ("1{,}234", Fraction(1234)),
    ("1234.0", Fraction(1234)), ("0.75", Fraction(3, 4)), ("3/4", Fraction(3, 4)), ("\\frac{3}{4}", Fraction(3, 4)),
    ("-\\dfrac{1}{2}", Fraction(-1, 2)), ("$412$", Fraction(412)), ("412\\text{ years}", Fraction(412)),
    ("\\text{412}", Fraction(412)), ("1\\,234", Fraction(1234)), ("412.", Fraction(412)),
    ("x", None), ("", None), ("1/0", None), ("1,23", None), (None, None),
])
def test_numbers_are_read_exactly(text, value):
    assert parse_number(text) == value


def test_a_numeric_answer_is_right_in_any_spelling():
    for spelling in ("412", "412.0", "412\\text{ years}", "\\(412\\)"):
        assert tool_star_reward(answer(spelling), "412").score == 1.0, spelling
    assert tool_star_reward(answer("unknown"), "412").reward == 0.0


def test_the_bonus_counts_the_calls_the_environment_ran():
    response = "\n".join([SEARCH, PYTHON, answer("412")])
    assert tool_star_reward(response, "412", calls={"search": 1, "python": 0}).reward == 1.0
    assert tool_star_reward(response, "412", calls={"search": 2, "python": 1}).reward == 1.1
    assert tool_star_reward(response, "412").bonus == 0.1  # no counts: Tool-Star's text test


def test_extract_answer_takes_the_last_box():
    assert extract_answer("<answer> \\boxed{1} or rather \\boxed{\\frac{1}{2}} </answer>") == "\\frac{1}{2}"
    assert extract_answer("no answer") is None


def test_a_trajectory_record_is_scored_from_its_messages_and_turns():
    messages = [
        {"role": "system", "content": "instructions"},
        {"role": "user", "content": "How many years …?"},
        {"role": "assistant", "content": "I think it is 412."},
        {"role": "user", "content": "Error: The turn has no tool call and no <answer>. Call a tool with <search> "
                                    "query </search> … <answer> … \\boxed{answer} </answer>."},
        {"role": "assistant", "content": "<think> Look it up. </think>\n<search> Dunmere founded </search>"},
        {"role": "user", "content": "<result>\nDunmere was founded in 1402.\n</result>"},
        {"role": "assistant", "content": "<think> Compute. </think>\n<python>\nprint(1814 - 1402)\n</python>"},
        {"role": "user", "content": "<result>\n412\n</result>"},
        {"role": "assistant", "content": answer("412")},
    ]
    turns = [{"kind": "protocol_error", "tool": None}, {"kind": "tool", "tool": "search"},
             {"kind": "tool", "tool": "python"}, {"kind": "answer", "tool": None}]
    text = response_text(messages)
    assert text.startswith("I think it is 412.\n<think> Look it up.") and "Error:" not in text
    assert calls_from_turns(turns) == {"search": 1, "python": 1}
    assert trajectory_reward({"messages": messages, "turns": turns}, "412").reward == 1.1


def test_an_answer_after_a_refused_call_still_fails_the_format_as_in_tool_star():
    messages = [
        {"role": "system", "content": "s"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think> a </think><python>print(1)</python>"},
        {"role": "user", "content": "<result>\n1\n</result>"},
        {"role": "assistant", "content": "<think> b </think><search> more </search>"},
        {"role": "user", "content": "Error: the limit of 1 tool calls is reached, so this call was not run."},
        {"role": "assistant", "content": answer("1")},
    ]
    turns = [{"kind": "tool", "tool": "python"}, {"kind": "tool_limit", "tool": "search"}, {"kind": "answer"}]
    reward = trajectory_reward({"messages": messages, "turns": turns}, "1")
    assert reward.reward == -1.0 and reward.format_error == "search/result tags are incomplete"


# --- math answers: math_verify -------------------------------------------------------------------------------------

@pytest.mark.parametrize("prediction, golden, score", [
    ("\\frac{1}{2}", "0.5", 1.0),  # the same number in two spellings, either way round
    ("0.5", "\\frac{1}{2}", 1.0),
    ("\\dfrac{3}{4}", "0.75", 1.0),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", 1.0),  # the same expression
    ("2\\sqrt{3}", "\\sqrt{12}", 1.0),
    ("x^2+1", "1+x^2", 1.0),
    ("x=3", "3", 1.0),  # an equation's right-hand side
    ("1,234", "1234", 1.0),  # thousands commas
    ("72.0", "72", 1.0),
    ("(1,2)", "(1, 2)", 1.0),  # the same interval
    ("\\text{(C)}", "C", 1.0),  # a multiple-choice letter
    ("Evelyn", "\\text{Evelyn}", 1.0),  # a name: the text
    ("-5", "5", 0.0),
    ("3", "4", 0.0),
    ("\\frac{1}{3}", "0.33", 0.0),  # close is not equal
    ("\\sqrt{2}", "\\sqrt{3}", 0.0),
])
def test_math_answers_are_checked_with_math_verify(prediction, golden, score):
    assert answer_score(prediction, golden, metric="math") == score


def test_a_math_answer_scores_against_the_best_golden_answer_and_none_is_wrong():
    assert answer_score("\\frac{1}{2}", ["7", "0.5"], metric="math") == 1.0
    assert answer_score(None, "0.5", metric="math") == 0.0


def test_the_math_metric_gives_tool_stars_reward():
    reward = tool_star_reward("\n".join([SEARCH, PYTHON, answer("\\frac{1}{2}")]), "0.5", metric="math")
    assert (reward.reward, reward.score, reward.bonus, reward.answer) == (1.1, 1.0, 0.1, "\\frac{1}{2}")
    assert tool_star_reward(answer("\\frac{1}{3}"), "0.5", metric="math").reward == 0.0


def test_a_running_interval_timer_survives_math_verify():
    """math_verify times itself with signal.alarm, which cancels any running timer (pytest-timeout's): it is set
    again with the time it had left."""
    import signal

    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 300)
    try:
        assert answer_score("\\frac{1}{2}", "0.5", metric="math") == 1.0
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 290 < remaining <= 300
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_task_kind_chooses_the_metric_under_auto():
    assert [task_metric(kind) for kind in ("math", "qa", "compute", "multi_hop_arithmetic")] == [
        "math", "f1", "auto", "auto"]
    assert task_metric("math", "em") == "em" and task_metric("qa", "numeric") == "numeric"  # an explicit choice wins


def test_importing_the_reward_does_not_import_math_verify():
    import subprocess
    import sys

    code = ("import sys, components.toolstar.reward; "
            "print(sorted(m for m in ('math_verify', 'sympy', 'latex2sympy2_extended') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.strip() == "[]"
